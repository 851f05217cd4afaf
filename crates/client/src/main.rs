fn main() -> std::process::ExitCode {
    strata_client::cli::main()
}
