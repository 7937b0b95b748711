//! Command line: `nodeguard [--config FILE]` runs the agent; `nodeguard check-config FILE` checks.
//! The global flags are honoured by every subcommand that reads a config, and refused by those
//! that do not ([`refused_flags`]): a flag is never silently ignored.

mod release;
mod term;

use crate::config::overrides::{self, Override};
use crate::config::Config;
use clap::{CommandFactory, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit code for a bad configuration or bad arguments (sysexits EX_USAGE).
pub const EXIT_USAGE: u8 = 64;

/// The environment variables read: `--help` lists them, and the man page's ENVIRONMENT section.
pub const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "NODEGUARD_LOG",
        "The agent's log filter, in tracing-subscriber's EnvFilter syntax: a level (error, warn, \
         info, debug, trace) or directives per module, e.g. `info,nodeguard::action=debug`. \
         Default: info. Logs are JSON lines on stderr. A filter that does not parse is ignored \
         (info).",
    ),
    (
        "NO_COLOR",
        "status prints no colour when it is set and not empty (colour is only ever used on a \
         terminal).",
    ),
    (
        "COLUMNS, LINES",
        "status fits its screen to this many columns (and --watch to this many rows) on a \
         terminal; default: the terminal's size. Piped output is never cut.",
    ),
];

fn environment_help() -> String {
    let mut s = String::from("Environment:\n");
    for (name, what) in ENVIRONMENT {
        s.push_str(&format!("  {name}\n      {what}\n"));
    }
    s
}

#[derive(Debug, Parser)]
#[command(
    name = "nodeguard",
    version,
    about = "Guards a node's shared kernel resources",
    after_help = environment_help()
)]
pub struct Cli {
    /// YAML configuration; the embedded defaults (config/nodeguard.yaml) when omitted. Read by
    /// the agent, check-config, breakers, release and status; refused by the others.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Set one config field on top of the file or the defaults, at start and at every reload
    /// (`--set samplers.kmsg.enabled=true`; the value is YAML). Repeatable. Honoured by every
    /// subcommand that reads a config (default-config prints the result); refused by completions.
    #[arg(long = "set", global = true, value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// How often the agent checks the config file for a change (`0s`: only on SIGHUP); 2s when
    /// omitted. The agent's alone: refused with a subcommand.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub config_poll: Option<std::time::Duration>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a configuration file (FILE, or --config FILE): exit 0 (valid) or 64 (invalid).
    CheckConfig { file: Option<PathBuf> },
    /// Print the embedded default configuration.
    ///
    /// With --set, the defaults with the overrides applied, as YAML without the comments.
    DefaultConfig,
    /// List this node's breakers from the state file (the config's guard.state_file).
    Breakers,
    /// Release a breaker by hand, and wait for the agent's outcome.
    ///
    /// The target is checked against what the agent holds (its state file), applied by the running
    /// agent at its next tick, and the outcome reported. Exit 0: released; 1: not held (or
    /// refused); 2: no agent answered in time (the request is withdrawn); 64: usage.
    Release {
        /// `namespace/pod/container` (pod or its owner, e.g. the Deployment name), or a unit name.
        workload: String,
        /// Only this rule's breaker (all of the workload's by default).
        #[arg(long)]
        rule: Option<String>,
        /// How long to wait for the agent's outcome (default: 3 agent intervals, at least 10s).
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, conflicts_with = "no_wait")]
        wait: Option<std::time::Duration>,
        /// Only queue the request; do not wait for its outcome.
        #[arg(long)]
        no_wait: bool,
    },
    /// The running agent at a glance, from its /api/state.
    ///
    /// Exit 0: quiet; 1: a breaker is open or a rule pending; 2: the agent cannot be reached. On a
    /// terminal the screen fits its width, and --watch redraws it in place.
    Status(StatusArgs),
    /// Print the shell completion script for SHELL (see docs/operate.md for where it goes).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// The global flags `command` does not take, with why: given to it, they are refused rather than
/// ignored.
pub(crate) fn refused_flags(cli: &Cli) -> Option<String> {
    let cmd = cli.command.as_ref()?;
    let name = match cmd {
        Command::CheckConfig { .. } => "check-config",
        Command::DefaultConfig => "default-config",
        Command::Breakers => "breakers",
        Command::Release { .. } => "release",
        Command::Status(_) => "status",
        Command::Completions { .. } => "completions",
    };
    if cli.config_poll.is_some() {
        return Some(format!(
            "--config-poll is the agent's (it sets how often the running agent reads its file); {name} does not take it"
        ));
    }
    match cmd {
        Command::CheckConfig { file: Some(f) }
            if cli.config.as_ref().is_some_and(|c| !same_file(c, f)) =>
        {
            Some(format!(
                "check-config checks one file: give it as FILE ({}) or as --config, not two different ones",
                f.display()
            ))
        }
        Command::DefaultConfig if cli.config.is_some() => Some(
            "default-config prints the embedded defaults and reads no file: drop --config (check-config --config FILE checks one)".into(),
        ),
        Command::Completions { .. } if cli.config.is_some() || !cli.set.is_empty() => Some(
            "completions reads no config: drop --config and --set".into(),
        ),
        _ => None,
    }
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
    if let Some(why) = refused_flags(&cli) {
        eprintln!("nodeguard: {why}");
        return ExitCode::from(EXIT_USAGE);
    }
    let overrides = match Override::parse_all(&cli.set) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let config = cli.config.as_ref();
    match cli.command {
        Some(Command::CheckConfig { file }) => {
            let Some(file) = file.or_else(|| cli.config.clone()) else {
                eprintln!("nodeguard: check-config needs a FILE (or --config FILE)");
                return ExitCode::from(EXIT_USAGE);
            };
            check_config(&file, &overrides)
        }
        Some(Command::DefaultConfig) => default_config(&overrides),
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
                            esc(&b.id.namespace), esc(&b.pod), esc(&b.id.container), esc(&b.rule),
                            b.state, b.action.as_str(), fmt_unix(b.since), hold, b.trips,
                            esc(&b.reason)
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
        Some(Command::Release {
            workload,
            rule,
            wait,
            no_wait,
        }) => with_config(config, &overrides, |c| {
            let req = match release::parse_target(&workload, rule) {
                Ok(r) => r,
                Err(e) => return release::usage(&e),
            };
            let wait =
                (!no_wait).then(|| wait.unwrap_or_else(|| release::default_wait(c.interval)));
            release::run(c, req, wait)
        }),
        Some(Command::Completions { shell }) => {
            let mut cmd = Cli::command();
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut cmd, "nodeguard", &mut out);
            match emit(std::io::stdout(), &String::from_utf8_lossy(&out)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(_) => ExitCode::FAILURE,
            }
        }
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
                poll: Some(cli.config_poll.unwrap_or(DEFAULT_CONFIG_POLL)).filter(|p| !p.is_zero()),
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

/// The same path, or two paths to one file.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    a == b
        || matches!(
            (std::fs::canonicalize(a), std::fs::canonicalize(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// How often the agent reads its config file for a change, unless `--config-poll` says.
const DEFAULT_CONFIG_POLL: std::time::Duration = std::time::Duration::from_secs(2);

fn check_config(file: &PathBuf, overrides: &[Override]) -> ExitCode {
    match load(Some(file), overrides) {
        Ok(_) => {
            println!("{}: ok", file.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprint!("{e}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// The embedded defaults as shipped (with their comments); with `--set`, validated and printed
/// as the YAML they make (comments cannot survive the edit).
fn default_config(overrides: &[Override]) -> ExitCode {
    if overrides.is_empty() {
        print!("{}", crate::config::DEFAULT_YAML);
        return ExitCode::SUCCESS;
    }
    if let Err(e) = Config::from_yaml_with(crate::config::DEFAULT_YAML, overrides) {
        eprint!("{e}");
        return ExitCode::from(EXIT_USAGE);
    }
    let merged = serde_norway::from_str::<serde_norway::Value>(crate::config::DEFAULT_YAML)
        .map_err(|e| e.to_string())
        .and_then(|mut v| {
            for o in overrides {
                o.apply(&mut v)?;
            }
            serde_norway::to_string(&v).map_err(|e| e.to_string())
        });
    match merged {
        Ok(text) => {
            let sets: Vec<String> = overrides.iter().map(ToString::to_string).collect();
            println!(
                "# nodeguard's embedded defaults with --set {} (comments dropped)",
                sets.join(" --set ")
            );
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cannot apply --set to the defaults: {e}");
            ExitCode::from(EXIT_USAGE)
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
    let colour = tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    // On a terminal the watch draws on the alternate screen, given back on exit and on SIGINT.
    let in_place = args.watch.is_some() && tty;
    if in_place {
        if let Err(e) = term::catch_stop() {
            eprintln!("cannot catch SIGINT: {e}");
            return ExitCode::FAILURE;
        }
        if emit(std::io::stdout(), term::ENTER).is_err() {
            return ExitCode::FAILURE;
        }
    }
    let code = loop {
        // Read at every frame: a resized terminal is fitted at the next redraw.
        let size = term::size();
        let style = render::Style {
            colour,
            wide: args.output == Some(StatusOutput::Wide),
            width: size.map(|(cols, _)| cols),
        };
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
        let frame = if in_place {
            term::frame(&screen, size.map_or(usize::MAX, |(_, rows)| rows))
        } else {
            format!("{screen}---\n")
        };
        // A closed terminal or pipe ends the watch.
        if emit(std::io::stdout(), &frame).is_err() {
            break ExitCode::FAILURE;
        }
        // Slept in steps, so SIGINT ends the watch at once.
        let until = std::time::Instant::now() + every.max(std::time::Duration::from_millis(200));
        while std::time::Instant::now() < until && !term::stopped() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        if term::stopped() {
            break ExitCode::from(code);
        }
    };
    if in_place {
        let _ = emit(std::io::stdout(), term::LEAVE);
    }
    code
}

/// Writes and flushes; an error (a closed pipe, as in `status | head`) is returned, not a panic.
fn emit(mut to: impl std::io::Write, text: &str) -> std::io::Result<()> {
    to.write_all(text.as_bytes())?;
    to.flush()
}

/// Names from workloads reach the terminal escaped, as in `status`.
fn esc(s: &str) -> std::borrow::Cow<'_, str> {
    crate::status::render::escape(s)
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
