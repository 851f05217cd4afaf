use clap::Parser;

// Allocation-heavy metadata paths run ~15% faster than on glibc's malloc
// (docs/benchmarks.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = strata_store_node::StoreNodeArgs::parse();
    let telemetry = args.telemetry.clone();
    strata_common::service::main(
        "strata-store-node",
        &telemetry,
        args.check_config,
        args.resolve(),
        strata_store_node::run,
    )
    .await
}
