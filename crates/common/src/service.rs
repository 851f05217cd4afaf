//! The shared `main` of every service binary: parse, set up logging, run
//! until SIGTERM/SIGINT, map failures to the documented exit codes
//! (2 for bad flags or config, 1 for any other failure).

use crate::telemetry::TelemetryArgs;
use std::future::Future;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

/// With `check_config`, only validates the configuration (flags,
/// environment, config file, token files) and exits: 0 valid, 2 not. The
/// Helm chart's tests run every rendered container's flags through it.
pub async fn main<C, F, Fut>(
    name: &'static str,
    telemetry: &TelemetryArgs,
    check_config: bool,
    cfg: crate::Result<C>,
    run: F,
) -> ExitCode
where
    F: FnOnce(C, CancellationToken) -> Fut,
    Fut: Future<Output = crate::Result<()>>,
{
    crate::files::private_by_default();
    let telemetry = match telemetry.resolve() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}", e.message);
            return ExitCode::from(2);
        }
    };
    let cfg = match cfg {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {}", e.message);
            return ExitCode::from(2);
        }
    };
    if check_config {
        println!("{name}: configuration OK");
        return ExitCode::SUCCESS;
    }
    let telemetry = match crate::telemetry::init(&telemetry, name, "info") {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {}", e.message);
            return ExitCode::FAILURE;
        }
    };
    let code = match run(cfg, crate::shutdown::on_signals()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "{name} failed");
            eprintln!("error: {}", e.message);
            ExitCode::FAILURE
        }
    };
    // Export the last spans; bounded, off the runtime's worker threads.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    code
}
