use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = strata_store_node::StoreNodeArgs::parse();
    let format = args.log_format.clone();
    strata_common::service::main(
        "strata-store-node",
        format.as_deref(),
        args.check_config,
        args.resolve(),
        strata_store_node::run,
    )
    .await
}
