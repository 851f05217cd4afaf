//! Generates the UCP bindings against the UCX that pkg-config finds. The
//! published UCX crates vendor other UCX versions (BUILD-NOTES), so a binary
//! would load a different libucp at run time than it was built against.

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    let ucx = pkg_config::Config::new()
        .atleast_version("1.12")
        .probe("ucx")
        .unwrap_or_else(|e| {
            panic!(
                "UCX (pkg-config `ucx`, 1.12 or later) not found: install libucx-dev \
                 (scripts/install-deps.sh does), or build without the `ucx` feature: {e}"
            )
        });
    let mut b = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("ucp_.*|ucs_status_string")
        .allowlist_type("ucp_.*|ucs_status_t|ucs_status_ptr_t|ucs_thread_mode_t")
        .allowlist_var("UCP_.*|UCS_.*")
        // Plain constants, never Rust enums: a value UCX adds later must not
        // be undefined behaviour here.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false);
    for p in &ucx.include_paths {
        b = b.clang_arg(format!("-I{}", p.display()));
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    b.generate()
        .expect("generating the UCP bindings")
        .write_to_file(out.join("bindings.rs"))
        .expect("writing the UCP bindings");
}
