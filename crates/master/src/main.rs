use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = strata_master::MasterArgs::parse();
    let format = args.log_format.clone();
    strata_common::service::main(
        "strata-master",
        format.as_deref(),
        args.check_config,
        args.resolve(),
        strata_master::run,
    )
    .await
}
