//! The root of every binary's cancellation tree: SIGTERM or SIGINT cancels it.

use tokio_util::sync::CancellationToken;

/// Returns a token cancelled on the first SIGTERM/SIGINT.
pub fn on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(
            tokio::signal::unix::SignalKind::terminate(),
        ) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops this process");
                let _ = tokio::signal::ctrl_c().await;
                t.cancel();
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        }
        t.cancel();
    });
    token
}
