//! Logs fit for a cluster: a service whose stderr is a pipe (as under
//! Kubernetes) writes no colour codes, and `--log-format json` writes one
//! JSON object per line with the stable field names runbooks cite.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use strata_tests::procs::free_port;

/// Runs `strata-master` with `extra` flags until it logs that it started;
/// returns its stderr lines up to that one.
fn master_log(extra: &[&str]) -> Vec<String> {
    let mut child = Command::new(strata_tests::bin("strata-master"))
        .args([
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--admin-addr",
            &format!("127.0.0.1:{}", free_port()),
        ])
        .args(extra)
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    // Read on a thread so the deadline holds even if the process goes quiet.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let t0 = Instant::now();
    let mut lines = Vec::new();
    while t0.elapsed() < Duration::from_secs(30) {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                let done = line.contains("strata-master started");
                lines.push(line);
                if done {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        lines.iter().any(|l| l.contains("strata-master started")),
        "no start line within 30 s: {lines:?}"
    );
    lines
}

#[test]
fn text_logs_to_a_pipe_carry_no_colour_codes() {
    let lines = master_log(&[]);
    for l in &lines {
        assert!(!l.contains('\x1b'), "escape codes in {l:?}");
    }
}

#[test]
fn json_logs_are_one_object_per_line_with_stable_fields() {
    let lines = master_log(&["--log-format", "json"]);
    for l in &lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}"));
        for field in ["timestamp", "level", "target"] {
            assert!(v.get(field).is_some(), "no {field} in {l}");
        }
        assert!(
            v["fields"]["message"].is_string(),
            "no fields.message in {l}"
        );
    }
    let started: serde_json::Value = serde_json::from_str(lines.last().unwrap()).unwrap();
    assert_eq!(started["level"], "INFO", "{started}");
    assert_eq!(started["fields"]["message"], "strata-master started");
    assert!(
        started["fields"]["grpc_addr"].is_string(),
        "the event's own fields under fields: {started}"
    );
}
