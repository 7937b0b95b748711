//! Command line: `nodeguard [--config FILE]` runs the agent; `nodeguard check-config FILE` checks.

use crate::config::Config;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit code for a bad configuration (sysexits EX_USAGE).
pub const EXIT_USAGE: u8 = 64;

#[derive(Debug, Parser)]
#[command(
    name = "nodeguard",
    version,
    about = "Guards a node's shared kernel resources"
)]
pub struct Cli {
    /// YAML configuration; the embedded defaults (config/nodeguard.yaml) when omitted.
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a configuration file and exit 0 (valid) or 64 (invalid).
    CheckConfig { file: PathBuf },
    /// Print the embedded default configuration.
    DefaultConfig,
}

/// Loads a config file, or the defaults. Errors are printed with every bad field.
pub fn load(path: Option<&PathBuf>) -> Result<Config, String> {
    match path {
        None => Config::default_config().map_err(|e| e.to_string()),
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            Config::from_yaml(&text).map_err(|e| format!("{}: {e}", p.display()))
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::CheckConfig { file }) => match load(Some(&file)) {
            Ok(_) => {
                println!("{}: ok", file.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprint!("{e}");
                ExitCode::from(EXIT_USAGE)
            }
        },
        Some(Command::DefaultConfig) => {
            print!("{}", crate::config::DEFAULT_YAML);
            ExitCode::SUCCESS
        }
        None => {
            let config = match load(cli.config.as_ref()) {
                Ok(c) => c,
                Err(e) => {
                    eprint!("{e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            init_tracing();
            raise_fd_limit();
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .max_blocking_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(crate::agent::run(config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "nodeguard stopped");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The log tailer keeps one descriptor per container log (about 660 on a 110-pod node), above the
/// common soft limit of 1024 once sockets and /proc reads are added: use the hard limit.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::warn!(error = %e, soft, hard, "cannot raise the open file limit");
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot read the open file limit"),
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("NODEGUARD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
