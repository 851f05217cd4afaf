fn main() -> std::process::ExitCode {
    strata_cli::main()
}
