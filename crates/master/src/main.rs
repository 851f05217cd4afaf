use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = strata_master::MasterArgs::parse();
    let telemetry = args.telemetry.clone();
    strata_common::service::main(
        "strata-master",
        &telemetry,
        args.check_config,
        args.resolve(),
        strata_master::run,
    )
    .await
}
