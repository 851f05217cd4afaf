//! The deployment artefacts under `deploy/`, checked with the real tools:
//! `helm` (lint, template), the Kubernetes schemas (kubernetes-validate),
//! `promtool` (Debian's prometheus package) and the Strata binaries' own
//! `--check-config` and `--help`. The checks are Python scripts
//! under `deploy/tests/` (YAML is Python's home ground); these tests run
//! them so that one command runs everything. `scripts/install-deps.sh`
//! installs the tools into `$STRATA_TOOLS` (default
//! `~/.cache/strata-tools`); a missing tool fails the test, never skips it.

use std::path::PathBuf;
use std::process::Command;

fn tools() -> PathBuf {
    std::env::var_os("STRATA_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/strata-tools")
        })
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Runs `deploy/tests/{script}`; panics with its output if it fails.
fn run_check(script: &str) {
    let (python, helm) = (tools().join("venv/bin/python"), tools().join("bin/helm"));
    for t in [&python, &helm] {
        assert!(
            t.exists(),
            "{} is missing: run scripts/install-deps.sh",
            t.display()
        );
    }
    let bin_dir = strata_tests::bin("strata-master")
        .parent()
        .unwrap()
        .to_path_buf();
    let out = Command::new(&python)
        .arg(repo().join("deploy/tests").join(script))
        .env("HELM", &helm)
        .env("BIN_DIR", &bin_dir)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("{stdout}");
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
}

/// `helm lint` and `helm template` for the default and the HA example
/// values; every manifest valid for Kubernetes 1.30 and 1.35; every flag
/// the chart passes accepted by its binary; bad values refused at install.
#[test]
fn helm_chart_renders_valid_manifests_with_flags_the_binaries_accept() {
    run_check("check_chart.py");
}

/// The image builds and copies every binary the chart runs, runs as a
/// non-root user, exposes the chart's ports and checks /health.
#[test]
fn dockerfile_ships_what_the_chart_runs() {
    run_check("check_dockerfile.py");
}

/// `promtool check rules` and `promtool test rules` (every alert fired from
/// synthetic series and quiet below its threshold); every alert's
/// runbook_url resolves to a runbook; every metric, admin path, command and
/// flag a runbook names exists.
#[test]
fn alerts_fire_in_promtool_and_every_runbook_names_real_things() {
    run_check("check_alerts.py");
}

/// `scripts/prune-target.sh`, which keeps CI's shared target dir from
/// filling the disk: a dir within bounds is left alone; one over its size
/// loses its incremental caches first and keeps its artifacts when that is
/// enough, and is emptied when it is not; a dir without Cargo's
/// CACHEDIR.TAG is never emptied; with too little free space for emptying to
/// help, nothing is removed and the script refuses to go on, saying why.
#[test]
fn prune_target_drops_caches_before_artifacts_and_refuses_a_full_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (tag, incr, deps) = (
        dir.path().join("CACHEDIR.TAG"),
        dir.path().join("debug/incremental/x"),
        dir.path().join("debug/deps"),
    );
    std::fs::write(&tag, b"Signature: 8a477f597d28d172789f06886806bc55").unwrap();
    std::fs::create_dir_all(&incr).unwrap();
    std::fs::create_dir_all(&deps).unwrap();
    std::fs::write(deps.join("artifact"), b"kept").unwrap();
    // 1100 MiB, allocated rather than sparse (`du` counts blocks): over a
    // 1 GiB limit on its own.
    let big = |path: &std::path::Path| {
        let status = Command::new("fallocate")
            .args(["-l", "1100M"])
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "fallocate {} failed", path.display());
    };
    big(&incr.join("cache"));
    let run = |env: &[(&str, &str)]| {
        let out = Command::new(repo().join("scripts/prune-target.sh"))
            .arg(dir.path())
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let over_1gib = [("STRATA_MAX_TARGET_GB", "1"), ("STRATA_MIN_FREE_GB", "0")];

    // Within bounds: nothing goes.
    let (code, text) = run(&[("STRATA_MAX_TARGET_GB", "2"), ("STRATA_MIN_FREE_GB", "0")]);
    assert_eq!(code, Some(0), "{text}");
    assert!(incr.join("cache").exists(), "{text}");

    // Over its size by its caches: the caches go, the artifacts stay.
    let (code, text) = run(&over_1gib);
    assert_eq!(code, Some(0), "{text}");
    assert!(!incr.exists(), "{text}");
    assert!(deps.join("artifact").exists(), "{text}");

    // Over its size by its artifacts: emptied, the dir itself kept.
    big(&deps.join("huge"));
    let (code, text) = run(&over_1gib);
    assert_eq!(code, Some(0), "{text}");
    assert!(!deps.exists() && !tag.exists(), "{text}");
    assert!(dir.path().exists(), "{text}");

    // The same without CACHEDIR.TAG: not Cargo's, left alone.
    std::fs::create_dir_all(&deps).unwrap();
    big(&deps.join("huge"));
    let (code, text) = run(&over_1gib);
    assert_eq!(code, Some(0), "{text}");
    assert!(deps.join("huge").exists(), "{text}");
    assert!(text.contains("no CACHEDIR.TAG"), "{text}");

    // Less free than emptying could give: nothing goes, a clear refusal.
    std::fs::write(&tag, b"Signature: 8a477f597d28d172789f06886806bc55").unwrap();
    let (code, text) = run(&[("STRATA_MIN_FREE_GB", "1000000000")]);
    assert_eq!(code, Some(1), "{text}");
    assert!(deps.join("huge").exists(), "{text}");
    assert!(text.contains("Free some space"), "{text}");

    // A threshold that is not a number is refused before anything is removed.
    let (code, text) = run(&[
        ("STRATA_MAX_TARGET_GB", "0"),
        ("STRATA_MIN_FREE_GB", "lots"),
    ]);
    assert_eq!(code, Some(2), "{text}");
    assert!(deps.join("huge").exists(), "{text}");
}
