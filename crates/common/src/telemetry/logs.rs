//! Logs: `tracing` events to stderr, as text or JSON lines.

use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{fmt, EnvFilter, Layer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("unknown log format {s:?}; use text or json")),
        }
    }
}

/// Colour codes only for a person at a terminal: `kubectl logs` and log
/// pipelines read stderr from a pipe or a file, and `NO_COLOR` turns them
/// off anywhere (<https://no-color.org>).
fn colour(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The log layer: stderr, `default_level` unless `RUST_LOG` says otherwise.
///
/// JSON lines carry stable field names that alerts and runbooks rely on:
/// `timestamp`, `level`, `target`, `fields.message` and each event's own
/// fields under `fields`, and the enclosing spans under `spans`.
pub(super) fn layer<S>(format: LogFormat, default_level: &str) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    use std::io::IsTerminal;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    let ansi = colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR"),
    );
    let base = fmt::layer().with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => base.with_filter(filter).boxed(),
        LogFormat::Json => base.json().with_span_list(true).with_filter(filter).boxed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(!colour(false, None), "a pipe or a file gets no escapes");
        assert!(!colour(true, Some("1".into())), "NO_COLOR");
        assert!(colour(true, Some("".into())), "an empty NO_COLOR is unset");
    }
}
