use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Failpoints from FAILPOINTS (a no-op unless built with `failpoints`).
    let _failpoints = fail::FailScenario::setup();
    let args = strata_ssd_agent::SsdAgentArgs::parse();
    let format = args.log_format.clone();
    strata_common::service::main(
        "strata-ssd-agent",
        format.as_deref(),
        args.check_config,
        args.resolve(),
        strata_ssd_agent::run,
    )
    .await
}
