//! `docs/configuration.md` is generated from the binaries' own flag
//! definitions (clap), so it cannot drift: this test regenerates it and fails
//! on any difference. After changing a flag, rewrite it with
//! `STRATA_BLESS=1 cargo nextest run -p strata-tests --test config_doc`.

use clap::CommandFactory;
use std::fmt::Write;

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// One table row per flag: flag, environment variable, default, meaning.
fn table(cmd: &clap::Command, out: &mut String) {
    out.push_str("| flag | environment | default | meaning |\n|---|---|---|---|\n");
    for a in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
        let Some(long) = a.get_long() else { continue };
        if long == "help" || long == "version" {
            continue;
        }
        let value = match a.get_value_names() {
            Some(v) if a.get_action().takes_values() => format!(" {}", v[0]),
            _ => String::new(),
        };
        let env = a
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
        // Defaults live in the help text as "[default: …]" (most flags are
        // optional so a config file can fill them) or in clap itself.
        let (help, default) = match help.rsplit_once(" [default: ") {
            Some((h, d)) => (h.to_string(), d.trim_end_matches(']').to_string()),
            None => (
                help.clone(),
                a.get_default_values()
                    .iter()
                    .map(|v| v.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        };
        let _ = writeln!(
            out,
            "| `--{long}{}` | {env} | {} | {} |",
            cell(&value),
            cell(&default),
            cell(&help)
        );
    }
}

/// A subcommand's own options (the global ones are listed once, above).
fn rows_of(sub: &clap::Command, out: &mut String) {
    let own = sub
        .clone()
        .mut_args(|a| if a.is_global_set() { a.hide(true) } else { a });
    if own
        .get_arguments()
        .any(|a| !a.is_hide_set() && a.get_long().is_some_and(|l| l != "help"))
    {
        table(&own, out);
    } else {
        out.push_str("No options of its own.\n");
    }
}

fn generate() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the binaries' flag definitions by `tests/tests/config_doc.rs`\n\
         (which fails when this file and the flags differ; regenerate with\n\
         `STRATA_BLESS=1 cargo nextest run -p strata-tests --test config_doc`).\n\n\
         Every service flag can also be set through its environment variable or a\n\
         `--config FILE.toml` (kebab-case keys, e.g. `lease-ttl = \"10s\"`).\n\
         Precedence: flag > environment > config file > default. Sizes take `512MiB`,\n\
         `16GiB`, `1.5GB` or plain bytes; durations `500ms`, `10s`, `2m`.\n\
         `--check-config` validates everything (including token files) and exits\n\
         without starting: 0 valid, 2 not. What the flags mean in practice:\n\
         [operations.md](operations.md), [ssd-offload.md](ssd-offload.md),\n\
         [security.md](security.md); their Helm values: [kubernetes.md](kubernetes.md).\n",
    );
    let services: [(&str, clap::Command); 3] = [
        ("strata-master", strata_master::MasterArgs::command()),
        (
            "strata-store-node",
            strata_store_node::StoreNodeArgs::command(),
        ),
        (
            "strata-ssd-agent",
            strata_ssd_agent::SsdAgentArgs::command(),
        ),
    ];
    for (name, cmd) in services {
        let _ = writeln!(out, "\n## `{name}`\n");
        table(&cmd, &mut out);
    }
    let cli = strata_cli::Cli::command();
    out.push_str("\n## `strata` (CLI)\n\nGlobal options (before or after the subcommand):\n\n");
    table(&cli, &mut out);
    for sub in cli.get_subcommands() {
        let _ = writeln!(
            out,
            "\n### `strata {}`\n\n{}\n",
            sub.get_name(),
            sub.get_about().map(|a| a.to_string()).unwrap_or_default()
        );
        rows_of(sub, &mut out);
        for nested in sub.get_subcommands() {
            let _ = writeln!(
                out,
                "\n#### `strata {} {}`\n\n{}\n",
                sub.get_name(),
                nested.get_name(),
                nested
                    .get_about()
                    .map(|a| a.to_string())
                    .unwrap_or_default()
            );
            rows_of(nested, &mut out);
        }
    }
    out
}

#[test]
fn configuration_reference_matches_the_flags() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let want = generate();
    if std::env::var_os("STRATA_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let first = have
            .lines()
            .zip(want.lines())
            .find(|(a, b)| a != b)
            .map(|(a, b)| format!("docs has:\n  {a}\nflags say:\n  {b}"))
            .unwrap_or_else(|| "lengths differ".into());
        panic!(
            "docs/configuration.md is out of date with the flags ({first}); regenerate it: STRATA_BLESS=1 cargo nextest run -p strata-tests --test config_doc"
        );
    }
}
