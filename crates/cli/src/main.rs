// Allocation-heavy metadata paths run ~15% faster than on glibc's malloc
// (docs/benchmarks.md); `strata up` and the benchmarks run the servers here.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    strata_cli::main()
}
