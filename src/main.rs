fn main() -> std::process::ExitCode {
    nodeguard::cli::main()
}
