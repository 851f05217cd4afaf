//! A real Prometheus (Debian's `prometheus`) scrapes a live local cluster
//! under a put/get load, loads `deploy/prometheus/rules.yaml`, and evaluates
//! every query of the Grafana dashboard (`deploy/grafana/strata.json`) and
//! every alert expression through its HTTP API: no query errors, no rule
//! errors, and data for every panel the load exercises (panels that stay
//! empty on a healthy cluster say so in their description).

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use strata_client::PutOptions;
use strata_master::config::OffloadPolicy;
use strata_tests::payload;
use strata_tests::procs::{free_port, Proc};
use strata_tests::ClusterBuilder;

const EMPTY_OK: &str = "(Empty on a healthy cluster.)";

fn repo() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

struct Prometheus {
    _proc: Proc,
    base: String,
    http: reqwest::Client,
}

impl Prometheus {
    fn start(dir: &std::path::Path, targets: &[SocketAddr]) -> Prometheus {
        let rules = repo().join("deploy/prometheus/rules.yaml");
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: strata\n    static_configs:\n      - targets: [{}]\n",
            rules.display(),
            targets.join(", ")
        );
        let file = dir.join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        let port = free_port();
        let proc = Proc(
            Command::new("prometheus")
                .arg(format!("--config.file={}", file.display()))
                .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("prometheus (Debian package `prometheus`, installed by scripts/install-deps.sh)"),
        );
        Prometheus {
            _proc: proc,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        }
    }

    /// An instant query: Ok(result vector) or Err(Prometheus's error).
    async fn query(&self, q: &str) -> Result<Vec<serde_json::Value>, String> {
        let r = self
            .http
            .get(format!("{}/api/v1/query", self.base))
            .query(&[("query", q)])
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let v: serde_json::Value = r.json().await.map_err(|e| e.to_string())?;
        if v["status"] != "success" {
            return Err(format!("{}: {}", v["errorType"], v["error"]));
        }
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    async fn value(&self, q: &str) -> Option<f64> {
        let r = self.query(q).await.ok()?;
        r.first()?["value"][1].as_str()?.parse().ok()
    }

    /// Waits (bounded) until `q` is at least `want`.
    async fn wait_for(&self, q: &str, want: f64) {
        let t0 = Instant::now();
        loop {
            if self.value(q).await.is_some_and(|v| v >= want) {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{q} never reached {want}: {:?}",
                self.query(q).await
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Every (panel title, may it be empty, expr) of the dashboard, with
/// Grafana's `$__rate_interval` replaced by a window the test has data for.
fn dashboard_queries() -> Vec<(String, bool, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/grafana/strata.json")).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        if p["type"] == "row" {
            continue;
        }
        let title = p["title"].as_str().unwrap().to_string();
        let empty_ok = p["description"].as_str().unwrap_or("").contains(EMPTY_OK);
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {title} has no query");
        for t in targets {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "10s");
            out.push((title.clone(), empty_ok, expr));
        }
    }
    out
}

fn alert_exprs() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("deploy/prometheus/rules.yaml")).unwrap();
    // The rules file's `- alert:` / `expr:` pairs (a YAML parser is not
    // among this crate's dependencies; the file's layout is regular and
    // promtool checks it).
    let mut out = Vec::new();
    let mut name = None;
    for line in text.lines() {
        let l = line.trim();
        if let Some(n) = l.strip_prefix("- alert: ") {
            name = Some(n.to_string());
        } else if let Some(e) = l.strip_prefix("expr: ") {
            if let Some(n) = name.take() {
                out.push((n, e.to_string()));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_evaluates_every_dashboard_query_and_alert_on_a_live_cluster() {
    let c = ClusterBuilder::new()
        .master(|m| m.offload_policy = OffloadPolicy::Eager)
        .store_nodes(2)
        .ssd_agents(1)
        .build()
        .await
        .unwrap();
    let cl = c.client().await.unwrap();
    let mut targets = vec![c.master_admin];
    targets.extend(c.nodes.iter().map(|n| n.admin_addr));
    targets.extend(c.agents.iter().map(|a| a.admin_addr));
    let dir = tempfile::tempdir().unwrap();
    let prom = Prometheus::start(dir.path(), &targets);
    // Load: puts, DRAM hits, SSD hits and misses, for long enough that
    // every rate window has samples.
    let t0 = Instant::now();
    let mut i = 0u64;
    let mut ssd_only = Vec::new();
    while t0.elapsed() < Duration::from_secs(12) || ssd_only.len() < 2 {
        let k = format!("mon-{i}");
        cl.put(&k, &payload(i, 64 << 10), &PutOptions::default())
            .await
            .unwrap();
        assert!(cl.get(&k).await.unwrap() == payload(i, 64 << 10));
        // Read again: served from the client's location cache (reported).
        assert!(cl.get(&k).await.unwrap() == payload(i, 64 << 10));
        assert!(cl.get(&format!("absent-{i}")).await.is_err());
        if i % 40 == 5 {
            // An object nobody read yet (a read's lease would keep it in
            // DRAM), copied to SSD and dropped from DRAM.
            let s = format!("ssd-{i}");
            cl.put(&s, &payload(i, 64 << 10), &PutOptions::default())
                .await
                .unwrap();
            strata_tests::make_ssd_only(&cl, &s).await;
            ssd_only.push((s, i));
        }
        for (k, seed) in &ssd_only {
            assert!(cl.get(k).await.unwrap() == payload(*seed, 64 << 10));
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    prom.wait_for("sum(up)", targets.len() as f64).await;
    prom.wait_for("count_over_time(strata_master_keys[20s])", 10.0)
        .await;
    let mut failures = Vec::new();
    let queries = dashboard_queries();
    assert!(queries.len() >= 30, "{} dashboard queries", queries.len());
    for (title, empty_ok, expr) in &queries {
        match prom.query(expr).await {
            Err(e) => failures.push(format!("panel {title:?}: {expr}: {e}")),
            Ok(r) if r.is_empty() && !empty_ok => {
                failures.push(format!("panel {title:?}: no data for {expr}"))
            }
            Ok(_) => {}
        }
    }
    let alerts = alert_exprs();
    assert!(alerts.len() >= 10, "{} alerts parsed", alerts.len());
    for (name, expr) in &alerts {
        if let Err(e) = prom.query(expr).await {
            failures.push(format!("alert {name}: {expr}: {e}"));
        }
    }
    // The rules as Prometheus runs them: loaded, evaluated, healthy.
    let rules: serde_json::Value = prom
        .http
        .get(format!("{}/api/v1/rules", prom.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut loaded = 0;
    for g in rules["data"]["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            loaded += 1;
            if r["health"] != "ok" {
                failures.push(format!(
                    "rule {}: {} {}",
                    r["name"], r["health"], r["lastError"]
                ));
            }
        }
    }
    assert_eq!(loaded, alerts.len(), "every alert loaded");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    c.shutdown().await;
}
