use clap::Parser;

// Allocation-heavy metadata paths run ~15% faster than on glibc's malloc
// (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Failpoints from FAILPOINTS (a no-op unless built with `failpoints`).
    let _failpoints = fail::FailScenario::setup();
    let args = strata_ssd_agent::SsdAgentArgs::parse();
    let telemetry = args.telemetry.clone();
    strata_common::service::main(
        "strata-ssd-agent",
        &telemetry,
        args.check_config,
        args.resolve(),
        strata_ssd_agent::run,
    )
    .await
}
