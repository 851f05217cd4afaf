//! OTLP/gRPC span export.
//!
//! The SDK's batch processor exports from its own OS thread, which has no
//! Tokio runtime, while the tonic exporter needs one (its channel and
//! timeouts live on a reactor). So the exporter owns a one-thread runtime of
//! its own and runs each export there: the services' runtimes never block on
//! a slow collector, and a collector that is down costs a warning, not a
//! stalled request.

use super::OtlpConfig;
use crate::{Error, Result};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanExporter,
};
use opentelemetry_sdk::Resource;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// One export gives up after this long (the batch is dropped).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the last export at exit may take.
pub(super) const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Checks `--otlp-endpoint`: `http://HOST:PORT` (plain HOST:PORT gets
/// `http://`). TLS to the collector is not built in: run a collector or
/// agent next to the service (the usual sidecar or DaemonSet) instead.
pub(super) fn check_endpoint(e: &str) -> Result<String> {
    let url = if e.contains("://") {
        e.to_string()
    } else {
        format!("http://{e}")
    };
    let bad = |why: &str| {
        Error::invalid(format!(
            "--otlp-endpoint {e:?}: {why}; use http://HOST:PORT of an OTLP/gRPC collector (port 4317 by default)"
        ))
    };
    let uri: http::Uri = url.parse().map_err(|_| bad("not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err(bad("TLS to the collector is not supported")),
        _ => return Err(bad("the scheme must be http")),
    }
    let authority = uri.authority().ok_or_else(|| bad("no host"))?;
    if authority.host().is_empty() {
        return Err(bad("no host"));
    }
    if authority.port_u16().is_none() {
        return Err(bad("no port"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(bad("OTLP/gRPC takes no path"));
    }
    Ok(format!("http://{authority}"))
}

pub(super) fn provider(cfg: &OtlpConfig, service: &'static str) -> Result<SdkTracerProvider> {
    let exporter = OwnRuntime::new(&cfg.endpoint)?;
    // `Resource::builder` also reads OTEL_RESOURCE_ATTRIBUTES, so a
    // deployment can add the pod, node and cluster names.
    let resource = Resource::builder()
        .with_service_name(service)
        .with_attribute(opentelemetry::KeyValue::new(
            "service.version",
            env!("CARGO_PKG_VERSION"),
        ))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(exporter).build())
        // Follow the caller's choice; start traces only where configured
        // (clients), never in services.
        .with_sampler(Sampler::ParentBased(Box::new(match cfg.sample_ratio {
            Some(r) => Sampler::TraceIdRatioBased(r),
            None => Sampler::AlwaysOff,
        })))
        .with_resource(resource)
        .build())
}

/// The tonic exporter, run on a runtime it owns.
#[derive(Debug)]
struct OwnRuntime {
    rt: Option<tokio::runtime::Runtime>,
    inner: opentelemetry_otlp::SpanExporter,
    endpoint: String,
    failing: AtomicBool,
}

impl OwnRuntime {
    fn new(endpoint: &str) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("strata-otlp")
            .enable_all()
            .build()
            .map_err(|e| Error::internal(format!("cannot start the OTLP export thread: {e}")))?;
        // The channel is created lazily but binds to the runtime it is
        // built in.
        let inner = {
            let _in = rt.enter();
            use opentelemetry_otlp::WithExportConfig;
            opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .with_timeout(EXPORT_TIMEOUT)
                .build()
                .map_err(|e| Error::invalid(format!("--otlp-endpoint {endpoint}: {e}")))?
        };
        Ok(OwnRuntime {
            rt: Some(rt),
            inner,
            endpoint: endpoint.to_string(),
            failing: AtomicBool::new(false),
        })
    }

    /// Logs when export starts and stops failing, not on every batch.
    fn note(&self, res: &OTelSdkResult) {
        let was = self.failing.swap(res.is_err(), Ordering::Relaxed);
        match res {
            Err(e) if !was => tracing::warn!(
                endpoint = %self.endpoint,
                error = %e,
                "trace export failed; spans are dropped until the collector answers"
            ),
            Ok(()) if was => {
                tracing::info!(endpoint = %self.endpoint, "trace export works again")
            }
            _ => {}
        }
    }
}

impl SpanExporter for OwnRuntime {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let res = match &self.rt {
            Some(rt) => rt.block_on(self.inner.export(batch)),
            None => Err(OTelSdkError::AlreadyShutdown),
        };
        self.note(&res);
        std::future::ready(res)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        // May be dropped on a runtime thread: never block there.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_forms() {
        assert_eq!(
            check_endpoint("http://otel:4317").unwrap(),
            "http://otel:4317"
        );
        assert_eq!(
            check_endpoint("http://otel:4317/").unwrap(),
            "http://otel:4317"
        );
        assert_eq!(
            check_endpoint("127.0.0.1:4317").unwrap(),
            "http://127.0.0.1:4317"
        );
        for bad in [
            "https://otel:4317",
            "grpc://otel:4317",
            "http://otel",
            "http://:4317",
            "http://otel:4317/v1/traces",
            "not a url",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }
}
