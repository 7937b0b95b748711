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
    /// List this node's breakers from the state file (the config's guard.state_file).
    Breakers,
    /// Release a breaker by hand: the running agent thaws the workload at its next tick.
    Release {
        /// `namespace/pod/container` (pod or its owner, e.g. the Deployment name), or a unit name.
        workload: String,
        /// Only this rule's breaker (all of the workload's by default).
        #[arg(long)]
        rule: Option<String>,
    },
}

/// Loads a config file, or the defaults. Errors are printed with every bad field.
pub fn load(path: Option<&PathBuf>) -> Result<Config, String> {
    match path {
        None => Config::default_config().map_err(|e| e.to_string()),
        Some(p) => Config::from_file(p).map_err(|e| e.to_string()),
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
        Some(Command::Breakers) => with_config(cli.config.as_ref(), |c| {
            match crate::action::state::load(&c.guard.state_file) {
                Ok(Some(f)) if !f.breakers.is_empty() => {
                    for b in f.breakers {
                        let hold = match b.hold_until {
                            Some(t) => format!("until {}", fmt_unix(t)),
                            None => "until a new revision".into(),
                        };
                        println!(
                            "{}/{}/{}  rule={} state={:?} action={} since={} hold {}  trips={}\n    {}",
                            b.id.namespace, b.pod, b.id.container, b.rule, b.state,
                            b.action.as_str(), fmt_unix(b.since), hold, b.trips, b.reason
                        );
                    }
                    ExitCode::SUCCESS
                }
                Ok(_) => {
                    println!("no breakers");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }),
        Some(Command::Release { workload, rule }) => with_config(cli.config.as_ref(), |c| {
            let parts: Vec<&str> = workload.split('/').collect();
            let (namespace, pod, container) = match parts.as_slice() {
                [ns, pod, c] => (*ns, *pod, *c),
                [unit] => ("", *unit, *unit),
                _ => {
                    eprintln!("expected namespace/pod/container or a unit name, got {workload:?}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let req = crate::action::state::ReleaseRequest {
                namespace: namespace.into(),
                pod: pod.into(),
                container: container.into(),
                rule,
            };
            match crate::action::state::request_release(&c.guard.state_file, &req) {
                Ok(p) => {
                    println!(
                        "release requested ({}); the agent applies it at its next tick",
                        p.display()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("cannot write the release request: {e}");
                    ExitCode::FAILURE
                }
            }
        }),
        None => {
            let loaded = match cli.config.as_ref() {
                None => Config::default_config()
                    .map(|c| (c, crate::config::DEFAULT_YAML.to_owned()))
                    .map_err(|e| e.to_string()),
                Some(p) => Config::load_file(p).map_err(|e| e.to_string()),
            };
            let (config, text) = match loaded {
                Ok(c) => c,
                Err(e) => {
                    eprint!("{e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let source = crate::agent::ConfigSource {
                file: cli.config.clone(),
                text,
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
            match rt.block_on(crate::agent::run(config, source)) {
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

fn with_config(path: Option<&PathBuf>, f: impl FnOnce(&Config) -> ExitCode) -> ExitCode {
    match load(path) {
        Ok(c) => f(&c),
        Err(e) => {
            eprint!("{e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn fmt_unix(t: f64) -> String {
    // State files are range-checked when read; this stays total on any number even so.
    std::time::Duration::try_from_secs_f64(t)
        .ok()
        .filter(|d| d.as_secs() < 253_402_300_800) // humantime stops at year 9999
        .and_then(|d| std::time::UNIX_EPOCH.checked_add(d))
        .map(|st| humantime::format_rfc3339_seconds(st).to_string())
        .unwrap_or_else(|| format!("{t} (unix seconds)"))
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
