//! Command line: `nodeguard [--config FILE]` runs the agent; `nodeguard check-config FILE` checks.

use crate::config::overrides::{self, Override};
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
    /// Set one config field on top of the file or the defaults, at start and at every reload
    /// (`--set samplers.kmsg.enabled=true`; the value is YAML). Repeatable.
    #[arg(long = "set", global = true, value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// How often the agent checks the config file for a change (`0s`: only on SIGHUP).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub config_poll: std::time::Duration,
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
    /// The running agent at a glance, from its /api/state. Exit 0: quiet; 1: a breaker is open
    /// or a rule pending; 2: the agent cannot be reached.
    Status(StatusArgs),
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The agent's address; default: the config's `listen`, with 0.0.0.0 read as 127.0.0.1.
    #[arg(long)]
    pub url: Option<String>,
    /// Order of the workloads (largest first, except `name`).
    #[arg(long, value_enum, default_value_t)]
    pub sort: crate::status::SortKey,
    /// Only the first N workloads.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Only this namespace.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// `json`: the same view for scripts; `wide`: more columns.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<StatusOutput>,
    /// Redraw every DURATION (2s without a value) until interrupted.
    #[arg(long, value_name = "DURATION", num_args = 0..=1, default_missing_value = "2s", value_parser = humantime::parse_duration)]
    pub watch: Option<std::time::Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusOutput {
    Json,
    Wide,
}

/// Loads a config file, or the defaults, with the `--set` overrides, and the text it hashes.
/// Errors are printed with every bad field.
pub fn load(path: Option<&PathBuf>, overrides: &[Override]) -> Result<(Config, String), String> {
    match path {
        None => Config::from_yaml_with(crate::config::DEFAULT_YAML, overrides)
            .map(|c| {
                let text = overrides::hashed_text(crate::config::DEFAULT_YAML, overrides);
                (c, text)
            })
            .map_err(|e| e.to_string()),
        Some(p) => Config::load_file_with(p, overrides).map_err(|e| e.to_string()),
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let overrides = match Override::parse_all(&cli.set) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let config = cli.config.as_ref();
    match cli.command {
        Some(Command::CheckConfig { file }) => match load(Some(&file), &overrides) {
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
        Some(Command::Breakers) => with_config(config, &overrides, |c| {
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
                        // Workload-chosen text (comms, log lines): escaped by the capture.
                        if let Some(e) = &b.evidence {
                            println!("    evidence: {}", e.summary());
                            for l in &e.log_tail {
                                println!("    log: {l}");
                            }
                        }
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
        Some(Command::Release { workload, rule }) => with_config(config, &overrides, |c| {
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
                    let dir = crate::action::state::release_dir(&c.guard.state_file);
                    eprintln!(
                        "cannot write the release request into {}: {e}; nothing was released. \
                         The agent reads releases from that directory only. Free it (or stop the \
                         agent: on SIGTERM it thaws everything it holds).",
                        dir.display()
                    );
                    ExitCode::FAILURE
                }
            }
        }),
        Some(Command::Status(args)) => with_config(config, &overrides, |c| status(&args, c.listen)),
        None => {
            let (config, text) = match load(config, &overrides) {
                Ok(c) => c,
                Err(e) => {
                    eprint!("{e}");
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            let source = crate::agent::ConfigSource {
                file: cli.config.clone(),
                text,
                overrides,
                poll: (!cli.config_poll.is_zero()).then_some(cli.config_poll),
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
            let result = rt.block_on(crate::agent::run(config, source));
            // A stuck tick's thread must not keep the process alive after the fail-open thaw.
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
            match result {
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

/// The agent's URL for a `listen` address: an unspecified address is reached on loopback.
pub fn local_url(listen: std::net::SocketAddr) -> String {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let ip = match listen.ip() {
        IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, listen.port()))
}

fn status(args: &StatusArgs, listen: std::net::SocketAddr) -> ExitCode {
    use crate::status::{client, render, Options, State, View, EXIT_UNREACHABLE};
    use std::io::IsTerminal;
    let url = args.url.clone().unwrap_or_else(|| local_url(listen));
    let opts = Options {
        sort: args.sort,
        top: args.top,
        namespace: args.namespace.clone(),
    };
    let tty = std::io::stdout().is_terminal();
    let style = render::Style {
        colour: tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        wide: args.output == Some(StatusOutput::Wide),
    };
    loop {
        let fetched = client::get(&url, "/api/state").and_then(|body| {
            serde_json::from_slice::<State>(&body)
                .map_err(|_| client::FetchError::Malformed { url: url.clone() })
        });
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let (screen, code) = match fetched {
            Ok(state) => {
                let v = View::build(&state, now, &opts);
                let screen = if args.output == Some(StatusOutput::Json) {
                    serde_json::to_string_pretty(&v).map(|mut s| {
                        s.push('\n');
                        s
                    })
                } else {
                    Ok(render::text(&v, style))
                };
                match screen {
                    Ok(s) => (s, v.exit_code),
                    Err(e) => (format!("cannot encode the view: {e}\n"), EXIT_UNREACHABLE),
                }
            }
            Err(e) => (
                format!("{}\n", render::escape(&e.to_string())),
                EXIT_UNREACHABLE,
            ),
        };
        let Some(every) = args.watch else {
            let out = if code == EXIT_UNREACHABLE {
                emit(std::io::stderr(), &screen)
            } else {
                emit(std::io::stdout(), &screen)
            };
            return match out {
                Ok(()) => ExitCode::from(code),
                Err(_) => ExitCode::FAILURE,
            };
        };
        // Home and clear, then the screen: one redraw per round.
        let frame = if tty {
            format!("\x1b[H\x1b[2J{screen}")
        } else {
            format!("{screen}---\n")
        };
        // A closed terminal or pipe ends the watch.
        if emit(std::io::stdout(), &frame).is_err() {
            return ExitCode::FAILURE;
        }
        std::thread::sleep(every.max(std::time::Duration::from_millis(200)));
    }
}

/// Writes and flushes; an error (a closed pipe, as in `status | head`) is returned, not a panic.
fn emit(mut to: impl std::io::Write, text: &str) -> std::io::Result<()> {
    to.write_all(text.as_bytes())?;
    to.flush()
}

fn with_config(
    path: Option<&PathBuf>,
    overrides: &[Override],
    f: impl FnOnce(&Config) -> ExitCode,
) -> ExitCode {
    match load(path, overrides) {
        Ok((c, _)) => f(&c),
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
