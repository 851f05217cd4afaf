//! Distributed tracing across the real binaries: a master, a store node and
//! an SSD agent export spans over OTLP to a receiver in this test, and the
//! `strata` CLI puts and reads with `--otlp-endpoint`. One put and one SSD
//! read must each be a single connected trace spanning the client and every
//! process that served it (trace context in gRPC metadata and in data-plane
//! frames).

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strata_common::telemetry::TraceParent;
use strata_common::Code;
use strata_tests::procs::{start_agent, start_master, start_node_with};
use strata_tests::{bin, make_ssd_only, payload};
use strata_transport::frame::{Op, Request, Response, RESP_LEN};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Clone)]
struct Span {
    service: String,
    name: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    /// The `server.address` attribute (client data-plane spans).
    server: Option<String>,
}

/// An OTLP/gRPC collector that keeps every span it is sent.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = Vec::new();
        for rs in req.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(s) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for s in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                let server = s
                    .attributes
                    .iter()
                    .find(|a| a.key == "server.address")
                    .and_then(|a| match a.value.as_ref()?.value.as_ref()? {
                        Value::StringValue(v) => Some(v.clone()),
                        _ => None,
                    });
                got.push(Span {
                    service: service.clone(),
                    name: s.name,
                    trace: s.trace_id,
                    id: s.span_id,
                    parent: s.parent_span_id,
                    server,
                });
            }
        }
        self.0.lock().unwrap().extend(got);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Receiver {
    async fn start() -> (Receiver, String) {
        let rx = Receiver::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let svc = TraceServiceServer::new(rx.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tokio_stream_of(listener)),
        );
        (rx, url)
    }

    /// The spans of the trace whose root is the `nth` CLI span named
    /// `root`, once it holds every `(service, span)` of `want` (spans of one
    /// trace arrive from each process in batches of their own) and forms
    /// one tree.
    async fn trace_of(&self, root: &str, nth: usize, want: &[(&str, &str)]) -> Vec<Span> {
        let t0 = Instant::now();
        loop {
            let spans = self.0.lock().unwrap().clone();
            let trace = spans
                .iter()
                .filter(|s| s.name == root && s.service == "strata")
                .nth(nth)
                .map(|r| {
                    spans
                        .iter()
                        .filter(|s| s.trace == r.trace)
                        .cloned()
                        .collect::<Vec<_>>()
                });
            if let Some(t) = &trace {
                let have: BTreeSet<(&str, &str)> = t
                    .iter()
                    .map(|s| (s.service.as_str(), s.name.as_str()))
                    .collect();
                if want.iter().all(|w| have.contains(w)) && connected(t).is_ok() {
                    return t.clone();
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "no connected trace of {root} with {want:?}: {:#?} (tree: {:?})",
                trace,
                trace.as_deref().map(connected)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn tokio_stream_of(
    l: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(l, |l| async move {
        let r = l.accept().await.map(|(s, _)| s);
        Some((r, l))
    })
}

/// One root, and every other span's parent in the trace.
fn connected(t: &[Span]) -> Result<(), String> {
    let ids: HashMap<&[u8], &Span> = t.iter().map(|s| (s.id.as_slice(), s)).collect();
    let roots: Vec<&Span> = t.iter().filter(|s| s.parent.is_empty()).collect();
    if roots.len() != 1 {
        return Err(format!("{} roots", roots.len()));
    }
    for s in t {
        if !s.parent.is_empty() && !ids.contains_key(s.parent.as_slice()) {
            return Err(format!(
                "{}/{} has a parent outside the trace",
                s.service, s.name
            ));
        }
    }
    Ok(())
}

fn cli(master: &str, endpoint: &str, args: &[&str]) {
    let out = std::process::Command::new(bin("strata"))
        .args(["--master", master, "--otlp-endpoint", endpoint])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "strata {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_and_an_ssd_read_are_each_one_trace_across_processes() {
    let (rx, endpoint) = Receiver::start().await;
    // Inherited by every process started below: export within 100 ms
    // instead of the SDK's 5 s. (nextest runs each test in a process of its
    // own, so no other test reads the environment meanwhile.)
    std::env::set_var("OTEL_BSP_SCHEDULE_DELAY", "100");
    let m = start_master(&["--otlp-endpoint", &endpoint, "--offload-policy", "eager"]).await;
    let (_node, _) = start_node_with(&m.addr, "n1", &["--otlp-endpoint", &endpoint]).await;
    let dir = tempfile::tempdir().unwrap();
    let (_agent, _) = start_agent(
        &m.addr,
        "a1",
        &dir.path().join("ssd"),
        &[("STRATA_OTLP_ENDPOINT", endpoint.as_str())],
        true,
    )
    .await;

    let data = payload(7, 300 << 10);
    let file = dir.path().join("obj");
    std::fs::write(&file, &data).unwrap();
    cli(
        &m.addr,
        &endpoint,
        &["put", "traced", file.to_str().unwrap()],
    );
    // The client's calls, the master's handlers, the node's write.
    const PUT: &[(&str, &str)] = &[
        ("strata", "data.write"),
        ("strata-master", "strata.v1.Master/PutStart"),
        ("strata-master", "strata.v1.Master/PutEnd"),
        ("strata-store-node", "data.write"),
    ];
    let put = rx.trace_of("strata.put", 0, PUT).await;

    // A traced request that proves no grant leaves no span: strangers
    // cannot fill the node's export queue.
    let node_addr = put
        .iter()
        .find(|s| s.service == "strata" && s.name == "data.write")
        .and_then(|s| s.server.clone())
        .expect("the client span names the node");
    let forged = Request {
        op: Op::Read,
        req_id: 1,
        grant: strata_common::grant::GrantScope {
            perm: strata_common::grant::PERM_READ,
            segment_id: 1,
            offset: 0,
            length: 16,
            expires_unix_ms: u64::MAX,
            generation: 0,
        },
        mac: [0; 16],
        offset: 0,
        length: 16,
        flags: 0,
        trace: Some(TraceParent {
            trace_id: [0x5a; 16],
            span_id: [0x5b; 8],
            flags: 1,
        }),
        record: None,
    };
    let mut s = tokio::net::TcpStream::connect(&node_addr).await.unwrap();
    s.write_all(&forged.encode()).await.unwrap();
    let mut h = [0u8; RESP_LEN];
    s.read_exact(&mut h).await.unwrap();
    assert_ne!(Response::decode(&h).unwrap().status, Code::Ok);
    drop(s);
    // A second put's node spans arrive after anything the forged request
    // could have produced.
    cli(
        &m.addr,
        &endpoint,
        &["put", "second", file.to_str().unwrap()],
    );
    rx.trace_of("strata.put", 1, PUT).await;
    let spans = rx.0.lock().unwrap().clone();
    assert!(
        !spans.iter().any(|s| s.trace == vec![0x5a; 16]),
        "a request without a valid grant was traced"
    );
    // Services start no traces: every span they record continues a client's.
    let roots: Vec<&Span> = spans
        .iter()
        .filter(|s| s.service != "strata" && s.parent.is_empty())
        .collect();
    assert!(roots.is_empty(), "services started traces: {roots:#?}");

    // Read it back from SSD only.
    let cl = strata_client::Client::connect(strata_client::ClientConfig::new(m.addr.clone()))
        .await
        .unwrap();
    make_ssd_only(&cl, "traced").await;
    let back = dir.path().join("back");
    cli(
        &m.addr,
        &endpoint,
        &["get", "traced", back.to_str().unwrap()],
    );
    assert_eq!(std::fs::read(&back).unwrap(), data);
    let get = rx
        .trace_of(
            "strata.get",
            0,
            &[
                ("strata", "data.read"),
                ("strata-master", "strata.v1.Master/GetReplicas"),
                ("strata-ssd-agent", "data.read"),
            ],
        )
        .await;
    assert!(
        !get.iter().any(|s| s.service == "strata-store-node"),
        "an SSD-only read does not touch the store node: {get:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_nothing_but_the_spans() {
    // Nothing listens on this port: every export fails.
    let dead = format!("http://127.0.0.1:{}", strata_tests::procs::free_port());
    let m = start_master(&["--otlp-endpoint", &dead]).await;
    let (_node, _) = start_node_with(&m.addr, "n1", &["--otlp-endpoint", &dead]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("obj");
    std::fs::write(&file, payload(3, 4096)).unwrap();
    cli(&m.addr, &dead, &["put", "k", file.to_str().unwrap()]);
    let back = dir.path().join("back");
    cli(&m.addr, &dead, &["get", "k", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), payload(3, 4096));
}
