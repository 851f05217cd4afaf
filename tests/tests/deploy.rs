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
