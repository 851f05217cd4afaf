use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = strata_ssd_agent::SsdAgentArgs::parse();
    let format = args.log_format.clone();
    strata_common::service::main(
        "strata-ssd-agent",
        format.as_deref(),
        args.resolve(),
        strata_ssd_agent::run,
    )
    .await
}
