use clap::Parser;
use strata_store_node::StoreNodeArgs;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = StoreNodeArgs::parse();
    let format = args.log_format.as_deref().unwrap_or("text").parse();
    let cfg = match (format, args.resolve()) {
        (Ok(f), Ok(cfg)) => {
            strata_common::telemetry::init(f, "info");
            cfg
        }
        (Err(e), _) => {
            eprintln!("error: --log-format: {e}");
            return std::process::ExitCode::from(2);
        }
        (_, Err(e)) => {
            eprintln!("error: {}", e.message);
            return std::process::ExitCode::from(2);
        }
    };
    let shutdown = strata_common::shutdown::on_signals();
    match strata_store_node::run(cfg, shutdown).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            std::process::ExitCode::FAILURE
        }
    }
}
