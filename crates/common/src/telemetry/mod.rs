//! Telemetry shared by every binary: `tracing` logs to stderr (text or JSON)
//! and, with `--otlp-endpoint`, trace spans exported over OTLP/gRPC.
//!
//! Traces cross processes in two ways: gRPC calls carry a W3C `traceparent`
//! header ([`inject_grpc`], and the server side in [`crate::grpc`]), and
//! data-plane requests carry the same context in a frame extension
//! ([`TraceParent`], used by `strata-transport`). Both are sent only when the
//! caller is inside a span of a sampled trace, so with tracing off nothing
//! changes on the wire and servers create no span per request.

mod context;
mod logs;
mod otlp;

pub use context::{grpc_server_span, inject_grpc, TraceParent};
pub use logs::LogFormat;

use crate::{Error, Result};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// The telemetry flags every binary takes.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TelemetryArgs {
    /// Log format on stderr: text | json [default: text]
    #[arg(long, env = "STRATA_LOG_FORMAT", global = true)]
    pub log_format: Option<String>,
    /// Export trace spans over OTLP/gRPC to this collector (http://HOST:PORT); off when unset [default: off]
    #[arg(long, env = "STRATA_OTLP_ENDPOINT", global = true)]
    pub otlp_endpoint: Option<String>,
}

/// Validated telemetry settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TelemetryConfig {
    pub log_format: LogFormat,
    pub otlp: Option<OtlpConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OtlpConfig {
    /// `http://HOST:PORT` of an OTLP/gRPC collector.
    pub endpoint: String,
    /// The fraction of new traces to record where traces start (clients);
    /// `None` for services, which only continue their callers' traces.
    pub sample_ratio: Option<f64>,
}

impl TelemetryArgs {
    /// The settings of a service: it records the traces its callers
    /// sampled and starts none.
    pub fn resolve(&self) -> Result<TelemetryConfig> {
        let log_format = match &self.log_format {
            Some(f) => f
                .parse()
                .map_err(|e| Error::invalid(format!("--log-format: {e}")))?,
            None => LogFormat::Text,
        };
        let otlp = match self.otlp_endpoint.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(e) => Some(OtlpConfig {
                endpoint: otlp::check_endpoint(e)?,
                sample_ratio: None,
            }),
        };
        Ok(TelemetryConfig { log_format, otlp })
    }

    /// The settings of a client, where traces start: `ratio` of them are
    /// recorded (`--trace-sample-ratio`, default 1).
    pub fn resolve_client(&self, ratio: Option<f64>) -> Result<TelemetryConfig> {
        let ratio = ratio.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&ratio) {
            return Err(Error::invalid(format!(
                "--trace-sample-ratio {ratio} is out of range; use a fraction from 0 to 1"
            )));
        }
        let mut cfg = self.resolve()?;
        if let Some(o) = &mut cfg.otlp {
            o.sample_ratio = Some(ratio);
        }
        Ok(cfg)
    }
}

/// What [`init`] set up; [`Telemetry::shutdown`] flushes the spans not yet
/// exported (call it once the service has stopped).
#[must_use = "shut telemetry down at exit, or the last spans are lost"]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Exports what is queued, waiting at most a few seconds (a collector
    /// that is down must not hold up the exit). Blocks: call it outside the
    /// async runtime or through `spawn_blocking`.
    pub fn shutdown(self) {
        if let Some(p) = self.provider {
            if let Err(e) = p.shutdown_with_timeout(otlp::SHUTDOWN_TIMEOUT) {
                tracing::warn!(error = %e, "could not export the last trace spans");
            }
        }
    }
}

/// Installs the process-wide subscriber: logs at `default_level` (`RUST_LOG`
/// overrides it) and, when configured, OTLP export of `info` and higher
/// spans, independent of the log level. Calling it again (tests that run
/// several services in one process) changes nothing.
pub fn init(
    cfg: &TelemetryConfig,
    service: &'static str,
    default_level: &str,
) -> Result<Telemetry> {
    type Boxed = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;
    let mut layers: Vec<Boxed> = vec![logs::layer(cfg.log_format, default_level)];
    let provider = match &cfg.otlp {
        Some(o) => Some(otlp::provider(o, service)?),
        None => None,
    };
    if let Some(p) = &provider {
        use opentelemetry::trace::TracerProvider as _;
        let spans = tracing_opentelemetry::layer()
            .with_tracer(p.tracer("strata"))
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
        layers.push(Box::new(spans));
    }
    if tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .is_err()
    {
        // Already installed: this provider has no layer to feed.
        if let Some(p) = provider {
            let _ = p.shutdown();
        }
        return Ok(Telemetry { provider: None });
    }
    if let Some(o) = &cfg.otlp {
        tracing::info!(
            endpoint = %o.endpoint,
            sample_ratio = ?o.sample_ratio,
            "exporting trace spans over OTLP"
        );
    }
    Ok(Telemetry { provider })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(endpoint: Option<&str>) -> TelemetryArgs {
        TelemetryArgs {
            log_format: None,
            otlp_endpoint: endpoint.map(str::to_string),
        }
    }

    #[test]
    fn otlp_off_unless_an_endpoint_is_given() {
        assert_eq!(args(None).resolve().unwrap().otlp, None);
        assert_eq!(args(Some("")).resolve().unwrap().otlp, None);
        let on = args(Some("http://127.0.0.1:4317")).resolve().unwrap();
        assert_eq!(
            on.otlp,
            Some(OtlpConfig {
                endpoint: "http://127.0.0.1:4317".into(),
                sample_ratio: None
            })
        );
        let client = args(Some("http://127.0.0.1:4317"))
            .resolve_client(None)
            .unwrap();
        assert_eq!(client.otlp.unwrap().sample_ratio, Some(1.0));
    }

    #[test]
    fn sample_ratio_bounds() {
        let ok = |r| args(Some("http://c:4317")).resolve_client(Some(r)).is_ok();
        assert!(ok(0.0) && ok(1.0) && ok(0.25));
        assert!(!ok(-0.01) && !ok(1.01) && !ok(f64::NAN));
    }

    #[test]
    fn bad_log_format_is_refused() {
        let mut a = args(None);
        a.log_format = Some("yaml".into());
        assert!(a.resolve().unwrap_err().message.contains("--log-format"));
        a.log_format = Some("JSON".into());
        assert_eq!(a.resolve().unwrap().log_format, LogFormat::Json);
    }
}
