//! Configuration: YAML -> typed sections -> validated `Config`. Every problem is reported with its
//! field path, all in one run; only `main` turns them into an exit code.

pub mod bounds;
mod collect;
pub mod guard;
pub mod limits;
pub mod live;
pub mod overrides;

use bounds::{Bounds, MAX_DURATION};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The commented example shipped with the agent; `nodeguard` with no `--config` runs on it.
pub const DEFAULT_YAML: &str = include_str!("../../config/nodeguard.yaml");

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<FieldError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} configuration error(s):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  {}: {}", e.path, e.message)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Paths {
    pub proc: PathBuf,
    pub cgroup: PathBuf,
    pub pod_logs: PathBuf,
    pub container_logs: PathBuf,
    /// The kernel log device (OOM kills, `samplers.kmsg`).
    pub kmsg: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            proc: "/proc".into(),
            cgroup: "/sys/fs/cgroup".into(),
            pod_logs: "/var/log/pods".into(),
            container_logs: "/var/log/containers".into(),
            kmsg: "/dev/kmsg".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Discovery {
    pub scopes: Vec<String>,
    pub host_workloads: bool,
}

impl Default for Discovery {
    fn default() -> Self {
        Discovery {
            scopes: vec!["/".into()],
            host_workloads: true,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Toggle {
    pub enabled: bool,
}

impl Default for Toggle {
    fn default() -> Self {
        Toggle { enabled: true }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogsSampler {
    pub enabled: bool,
    /// Upper bound of log bytes read in one tick; the rest is read at the next ticks.
    pub max_bytes_per_tick: u64,
    /// Log files held open at once (current files, and older ones until drained).
    pub max_open_files: usize,
}

impl Default for LogsSampler {
    fn default() -> Self {
        LogsSampler {
            enabled: true,
            max_bytes_per_tick: 256 << 20,
            max_open_files: DEFAULT_MAX_OPEN_FILES,
        }
    }
}

/// Default cap on open log files: a 110-pod node has about 660 container logs; 4096 leaves room
/// for 500-pod nodes. The tailer lowers it to half the fd limit, keeping the other half for the
/// samplers and the HTTP server.
pub const DEFAULT_MAX_OPEN_FILES: usize = 4096;

/// Default of `samplers.sockets.full_walk_every`: every pod re-walked at least once a minute at
/// the 5 s interval, for ~1/12 of a full pass per tick.
pub const DEFAULT_FULL_WALK_EVERY: u32 = 12;

/// Largest `samplers.sockets.full_walk_every`: a day of 5 s ticks.
pub const MAX_FULL_WALK_EVERY: u64 = 17_280;

/// Largest `samplers.logs.max_open_files`; the agent lowers it further to a quarter of its fd limit (`fsio::FdHolder`).
pub const MAX_LOG_OPEN_FILES: usize = 1 << 20;

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SocketsSampler {
    pub enabled: bool,
    /// TCP sockets by state: needs each pod netns's TCP table, and reading one walks the whole
    /// TCP hash table the namespaces share. Off by default for that cost.
    pub tcp_states: bool,
    /// Each pod's fd tables are walked in full at least once every this many ticks; between,
    /// only pids whose fd count changed are. The staleness bound of a count-preserving swap.
    pub full_walk_every: u32,
}

impl Default for SocketsSampler {
    fn default() -> Self {
        SocketsSampler {
            enabled: true,
            tcp_states: false,
            full_walk_every: DEFAULT_FULL_WALK_EVERY,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ConntrackSampler {
    pub enabled: bool,
    /// Host-scope attribution (a dump of the node's table) runs only at or above this fraction
    /// of `nf_conntrack_max`; below it, only O(1) counters are read.
    pub dump_trigger: f64,
    /// Minimum time between two dumps; a dump never overlaps the previous one.
    #[serde(with = "humantime_serde")]
    pub dump_interval: Duration,
    /// Network namespace file whose table is dumped; empty: the agent's own.
    pub host_netns: PathBuf,
}

impl Default for ConntrackSampler {
    fn default() -> Self {
        ConntrackSampler {
            enabled: true,
            dump_trigger: 0.5,
            dump_interval: Duration::from_secs(30),
            host_netns: PathBuf::new(),
        }
    }
}

/// Ephemeral ports per pod netns (needs the conntrack sampler's pod pass, and CAP_SYS_ADMIN to
/// read each namespace's port range).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PortsSampler {
    pub enabled: bool,
    /// Ports are counted (a sock_diag dump of the pod netns) only while the pod's TCP sockets
    /// are at least this fraction of its available ports.
    pub trigger: f64,
}

impl Default for PortsSampler {
    fn default() -> Self {
        PortsSampler {
            enabled: true,
            trigger: 0.5,
        }
    }
}

/// OOM kills from the kernel log (`paths.kmsg`): needs CAP_SYSLOG, else it reports itself off.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KmsgSampler {
    pub enabled: bool,
    /// Records read per tick at most; the rest waits for the next tick (a log flood costs a
    /// bounded share of each tick).
    pub max_records_per_tick: usize,
    /// How long the cgroup path of a workload that disappeared still attributes its OOM kills.
    #[serde(with = "humantime_serde")]
    pub remember: Duration,
}

impl Default for KmsgSampler {
    fn default() -> Self {
        KmsgSampler {
            enabled: true,
            max_records_per_tick: 10_000,
            remember: Duration::from_secs(15 * 60),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Samplers {
    pub memory: Toggle,
    pub processes: Toggle,
    pub logs: LogsSampler,
    pub sockets: SocketsSampler,
    pub conntrack: ConntrackSampler,
    pub ports: PortsSampler,
    pub kmsg: KmsgSampler,
}

/// Bounds of the HTTP server: no number of peers, idle or slow, can hold more than
/// `max_connections` descriptors, nor any of them for long.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Http {
    /// Connections served at once; beyond it a new connection is accepted and closed at once.
    pub max_connections: usize,
    /// A request head must be complete within this, counted from the accept or the end of the
    /// previous response (hyper starts its timer as soon as it waits for a head).
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// A connection that receives no byte for this long (before or during a request) is closed.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// A response must be handed to the kernel within this from its first byte.
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// Bodies of `/metrics` and of `/api/state` alive at once, each rendered once per published
    /// snapshot and shared by its readers; a new one cuts the readers of the oldest.
    pub response_generations: usize,
}

impl Default for Http {
    fn default() -> Self {
        Http {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
            response_generations: 3,
        }
    }
}

/// Upper bound of `http.response_generations`.
pub const MAX_RESPONSE_GENERATIONS: usize = 16;

/// Upper bound of `http.max_connections`; the agent lowers it further to keep an fd reserve.
pub const MAX_HTTP_CONNECTIONS: usize = 4096;

/// What the agent takes from its process environment, read once at start
/// ([`Environment::from_process`], in `agent::run`) and never again: the DaemonSet sets both
/// through the downward API. Not part of the file: a reload keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    /// `$NODE_NAME`: the `node` label when `node_name` is empty.
    pub node_name: Option<String>,
    /// `$POD_NAMESPACE`: the agent's own namespace, never acted on.
    pub pod_namespace: Option<String>,
}

impl Environment {
    pub fn from_process() -> Environment {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Environment {
            node_name: var("NODE_NAME"),
            pod_namespace: var("POD_NAMESPACE"),
        }
    }
}

/// The validated configuration. Serialized only to compare two of them key by key
/// ([`live::restart_only_changes`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Config {
    pub listen: SocketAddr,
    pub http: Http,
    pub interval: Duration,
    /// Empty: taken from `$NODE_NAME` at start, else no `node` label.
    pub node_name: String,
    pub paths: Paths,
    pub discovery: Discovery,
    pub samplers: Samplers,
    pub guard: guard::GuardConfig,
    /// Empty from a file; set at start by `agent::run`, kept by a reload.
    #[serde(skip)]
    pub environment: Environment,
}

/// Top-level keys and how to read each; unknown keys are errors too.
const SECTIONS: &[&str] = &[
    "listen",
    "http",
    "interval",
    "node_name",
    "paths",
    "discovery",
    "samplers",
    "guard",
];

impl Config {
    /// The `node` label: `node_name`, else `$NODE_NAME`, else none (empty).
    pub fn node(&self) -> String {
        if self.node_name.is_empty() {
            self.environment.node_name.clone().unwrap_or_default()
        } else {
            self.node_name.clone()
        }
    }

    pub fn default_config() -> Result<Config, ConfigErrors> {
        Config::from_yaml(DEFAULT_YAML)
    }

    /// Reads and checks a config file, refusing files over [`limits::MAX_FILE_BYTES`] without
    /// reading them whole. Used by the agent and by `check-config` alike.
    pub fn from_file(path: &Path) -> Result<Config, LoadError> {
        Config::load_file(path).map(|(c, _)| c)
    }

    /// [`Config::from_file`], also returning the text it was read from (the agent hashes it).
    pub fn load_file(path: &Path) -> Result<(Config, String), LoadError> {
        Config::load_file_with(path, &[])
    }

    /// [`Config::load_file`] with `--set` overrides applied on top of the file; the text
    /// returned names them (see [`overrides::hashed_text`]).
    pub fn load_file_with(
        path: &Path,
        overrides: &[overrides::Override],
    ) -> Result<(Config, String), LoadError> {
        let text = read_text(path)?;
        match Config::from_yaml_with(&text, overrides) {
            Ok(c) => Ok((c, overrides::hashed_text(&text, overrides))),
            Err(errors) => Err(LoadError::Invalid {
                path: path.to_path_buf(),
                errors,
            }),
        }
    }

    pub fn from_yaml(text: &str) -> Result<Config, ConfigErrors> {
        Config::from_yaml_with(text, &[])
    }

    /// [`Config::from_yaml`] with `--set` overrides applied to the parsed document first.
    pub fn from_yaml_with(
        text: &str,
        overrides: &[overrides::Override],
    ) -> Result<Config, ConfigErrors> {
        let document = |message: String| {
            ConfigErrors(vec![FieldError {
                path: "(document)".into(),
                message,
            }])
        };
        limits::check_text(text).map_err(document)?;
        limits::check_nodes(text).map_err(|e| document(e.to_string()))?;
        let mut root: serde_norway::Value = match serde_norway::from_str(text) {
            Ok(serde_norway::Value::Null) => serde_norway::Value::Mapping(Default::default()),
            Ok(v) => v,
            Err(e) => return Err(document(e.to_string())),
        };
        if root.is_mapping() {
            let failed: Vec<FieldError> = overrides
                .iter()
                .filter_map(|o| {
                    o.apply(&mut root).err().map(|message| FieldError {
                        path: o.field(),
                        message,
                    })
                })
                .collect();
            if !failed.is_empty() {
                return Err(ConfigErrors(failed));
            }
        }
        let Some(map) = root.as_mapping() else {
            return Err(document("expected a mapping of sections".into()));
        };
        // Type errors (paths as written) and validation errors (paths into the pruned tree,
        // translated at the end).
        let mut type_errs = Vec::new();
        let mut pruned = collect::Pruned::default();
        for key in map.keys() {
            match key.as_str() {
                Some(k) if SECTIONS.contains(&k) => {}
                _ => type_errs.push(FieldError {
                    path: yaml_key(key),
                    message: format!("unknown field, expected one of: {}", SECTIONS.join(", ")),
                }),
            }
        }
        macro_rules! read {
            ($key:literal) => {
                map.get($key)
                    .and_then(|v| collect::section($key, v, &mut type_errs, &mut pruned))
            };
        }
        let listen: String = read!("listen").unwrap_or_else(|| "0.0.0.0:9913".into());
        let http: Http = read!("http").unwrap_or_default();
        let interval: Option<HumanDuration> = read!("interval");
        let node_name: String = read!("node_name").unwrap_or_default();
        let paths: Paths = read!("paths").unwrap_or_default();
        let discovery: Discovery = read!("discovery").unwrap_or_default();
        let samplers: Samplers = read!("samplers").unwrap_or_default();
        let raw_guard: guard::RawGuard = read!("guard").unwrap_or_default();

        let mut errs = Vec::new();
        let guard = guard::compile(raw_guard, &mut errs);
        let mut b = Bounds::new(&mut errs);
        let listen = match listen.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(e) => {
                b.error("listen", format!("{listen:?} is not host:port ({e})"));
                None
            }
        };
        let interval = interval.map(|d| d.0).unwrap_or(Duration::from_secs(5));
        b.duration(
            "interval",
            interval,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        );
        for (name, p) in [
            ("paths.proc", &paths.proc),
            ("paths.cgroup", &paths.cgroup),
            ("paths.pod_logs", &paths.pod_logs),
            ("paths.container_logs", &paths.container_logs),
            ("paths.kmsg", &paths.kmsg),
        ] {
            if !p.is_absolute() {
                b.error(name, format!("{} must be an absolute path", p.display()));
            }
        }
        if discovery.scopes.is_empty() {
            b.error(
                "discovery.scopes",
                "needs at least one cgroup path (\"/\" for the whole tree)",
            );
        }
        for (i, s) in discovery.scopes.iter().enumerate() {
            if !s.starts_with('/') || s.split('/').any(|c| c == "..") {
                b.error(
                    &format!("discovery.scopes[{i}]"),
                    format!("{s:?} must be an absolute cgroup path without '..'"),
                );
            }
        }
        let ct = &samplers.conntrack;
        b.float("samplers.conntrack.dump_trigger", ct.dump_trigger, 0.0, 1.0);
        b.float("samplers.ports.trigger", samplers.ports.trigger, 0.0, 1.0);
        b.duration(
            "samplers.conntrack.dump_interval",
            ct.dump_interval,
            Duration::from_secs(1),
            MAX_DURATION,
        );
        if !ct.host_netns.as_os_str().is_empty() && !ct.host_netns.is_absolute() {
            b.error(
                "samplers.conntrack.host_netns",
                format!("{} must be an absolute path", ct.host_netns.display()),
            );
        }
        b.int(
            "samplers.sockets.full_walk_every",
            u64::from(samplers.sockets.full_walk_every),
            1,
            MAX_FULL_WALK_EVERY,
        );
        b.int(
            "samplers.logs.max_bytes_per_tick",
            samplers.logs.max_bytes_per_tick,
            1,
            MAX_LOG_BYTES_PER_TICK,
        );
        b.int(
            "samplers.logs.max_open_files",
            samplers.logs.max_open_files as u64,
            1,
            MAX_LOG_OPEN_FILES as u64,
        );
        b.int(
            "samplers.kmsg.max_records_per_tick",
            samplers.kmsg.max_records_per_tick as u64,
            1,
            1_000_000,
        );
        b.duration(
            "samplers.kmsg.remember",
            samplers.kmsg.remember,
            Duration::from_secs(1),
            Duration::from_secs(24 * 3600),
        );
        check_http(&http, &mut b);
        type_errs.extend(errs.into_iter().filter_map(|e| {
            pruned
                .translate(&e.path)
                .map(|path| FieldError { path, ..e })
        }));
        if pruned.capped || type_errs.len() > collect::MAX_ERRORS {
            type_errs.truncate(collect::MAX_ERRORS);
            type_errs.push(FieldError {
                path: "(document)".into(),
                message: format!(
                    "more than {} errors; the rest are not reported",
                    collect::MAX_ERRORS
                ),
            });
        }
        match (type_errs.is_empty(), listen) {
            (true, Some(listen)) => Ok(Config {
                listen,
                http,
                interval,
                node_name,
                paths,
                discovery,
                samplers,
                guard,
                environment: Environment::default(),
            }),
            _ => Err(ConfigErrors(type_errs)),
        }
    }
}

fn check_http(h: &Http, b: &mut Bounds) {
    b.int(
        "http.max_connections",
        h.max_connections as u64,
        1,
        MAX_HTTP_CONNECTIONS as u64,
    );
    let (lo, hi) = (Duration::from_millis(100), Duration::from_secs(600));
    b.duration("http.header_read_timeout", h.header_read_timeout, lo, hi);
    b.duration("http.idle_timeout", h.idle_timeout, lo, hi);
    b.duration("http.write_timeout", h.write_timeout, lo, hi);
    b.int(
        "http.response_generations",
        h.response_generations as u64,
        1,
        MAX_RESPONSE_GENERATIONS as u64,
    );
    // Both timers start when the server waits for a request: a longer idle one never fires.
    if h.idle_timeout > h.header_read_timeout {
        b.error(
            "http.idle_timeout",
            format!(
                "{:?} exceeds http.header_read_timeout ({:?}), which would close an idle connection first",
                h.idle_timeout, h.header_read_timeout
            ),
        );
    }
}

/// Largest `samplers.logs.max_bytes_per_tick` (a read budget, not a buffer): 16 GiB.
pub const MAX_LOG_BYTES_PER_TICK: u64 = 16 << 30;

/// The text of a config file: a regular file (symlinks followed, as a ConfigMap mounts it) of
/// at most [`limits::MAX_FILE_BYTES`]; a FIFO or device in its place is refused at once, never
/// opened blocking ([`crate::fsio::read_regular_text`]).
fn read_text(path: &Path) -> Result<String, LoadError> {
    use crate::fsio::{read_regular_text, Reader};
    Ok(read_regular_text(
        path,
        limits::MAX_FILE_BYTES as u64,
        Reader::Config,
    )?)
}

/// Why a config file could not be loaded; both name the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Not read: missing, unreadable, not a regular file, too large or not UTF-8.
    #[error(transparent)]
    File(#[from] crate::fsio::RegularFileError),
    #[error("{}: {errors}", path.display())]
    Invalid { path: PathBuf, errors: ConfigErrors },
}

fn yaml_key(k: &serde_norway::Value) -> String {
    match k {
        serde_norway::Value::String(s) => s.clone(),
        other => serde_norway::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_owned(),
    }
}

/// `5s`, `1m30s`, `250ms`.
#[derive(Debug, Clone, Copy)]
struct HumanDuration(Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        humantime_serde::deserialize(d).map(HumanDuration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_example_is_the_default() {
        let c = Config::default_config().unwrap();
        assert_eq!(c.listen, "0.0.0.0:9913".parse().unwrap());
        assert_eq!(c.interval, Duration::from_secs(5));
        assert_eq!(c.paths, Paths::default());
        assert_eq!(c.discovery, Discovery::default());
        assert_eq!(c.samplers, Samplers::default());
        assert_eq!(c.http, Http::default());
        assert_eq!(Config::from_yaml("").unwrap(), c);
    }

    #[test]
    fn http_bounds_are_checked_with_their_paths() {
        let text = "http:\n  max_connections: 0\n  header_read_timeout: 1ms\n  write_timeout: 2h\n  idle_timeout: 30s\n";
        let errs = Config::from_yaml(text).unwrap_err().0;
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "http.max_connections",
                "http.header_read_timeout",
                "http.write_timeout",
                "http.idle_timeout",
            ],
            "{errs:?}"
        );
        let ok = Config::from_yaml("http:\n  max_connections: 8\n  idle_timeout: 2s\n").unwrap();
        assert_eq!(ok.http.max_connections, 8);
        assert_eq!(ok.http.idle_timeout, Duration::from_secs(2));
        assert_eq!(ok.http.header_read_timeout, Duration::from_secs(10));
    }

    #[test]
    fn every_bad_field_is_named_at_once() {
        let text = "listen: nowhere\ninterval: 5 parsecs\npaths:\n  proc: relative/proc\n  cgroups: /x\nsamplers:\n  logs:\n    max_bytes_per_tick: 0\ndiscovery:\n  scopes: [\"a\"]\nbogus: 1\n";
        let errs = Config::from_yaml(text).unwrap_err().0;
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        assert!(paths.contains(&"bogus"), "{paths:?}");
        assert!(paths.contains(&"interval"), "{paths:?}");
        assert!(paths.contains(&"paths.cgroups"), "{paths:?}");
        assert!(paths.contains(&"listen"), "{paths:?}");
        assert!(
            paths.contains(&"samplers.logs.max_bytes_per_tick"),
            "{paths:?}"
        );
        assert!(paths.contains(&"discovery.scopes[0]"), "{paths:?}");
        let unknown = errs.iter().find(|e| e.path == "paths.cgroups").unwrap();
        assert!(
            unknown.message.contains("unknown field"),
            "{}",
            unknown.message
        );
    }

    #[test]
    fn type_errors_carry_the_nested_path() {
        let errs = Config::from_yaml("samplers:\n  memory:\n    enabled: maybe\n")
            .unwrap_err()
            .0;
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].path, "samplers.memory.enabled");
    }

    #[test]
    fn syntax_errors_are_reported() {
        let errs = Config::from_yaml("listen: [\n").unwrap_err().0;
        assert_eq!(errs[0].path, "(document)");
    }

    /// Every leaf of `yaml` with its path, as the errors name them.
    fn leaves(v: &serde_norway::Value, path: String, out: &mut Vec<(String, serde_norway::Value)>) {
        match v {
            serde_norway::Value::Mapping(m) => {
                for (k, v) in m {
                    let k = yaml_key(k);
                    let p = if path.is_empty() {
                        k
                    } else {
                        format!("{path}.{k}")
                    };
                    leaves(v, p, out);
                }
            }
            serde_norway::Value::Sequence(s) => {
                for (i, v) in s.iter().enumerate() {
                    leaves(v, format!("{path}[{i}]"), out);
                }
            }
            other => out.push((path, other.clone())),
        }
    }

    fn set(root: &mut serde_norway::Value, path: &str, to: serde_norway::Value) {
        let mut node = root;
        for part in path.split('.') {
            let (name, idx) = part.split_once('[').unwrap_or((part, ""));
            node = &mut node[name];
            for i in idx.split('[').filter(|s| !s.is_empty()) {
                node = &mut node[i.trim_end_matches(']').parse::<usize>().unwrap()];
            }
        }
        *node = to;
    }

    /// The shipped config plus the optional rule fields it does not spell out.
    fn every_field() -> serde_norway::Value {
        let mut root: serde_norway::Value = serde_norway::from_str(DEFAULT_YAML).unwrap();
        set(&mut root, "guard.rules[0].clear_below", 500.into());
        set(&mut root, "guard.rules[3].clear_below", 0.8.into());
        set(&mut root, "guard.rules[2].clear_for", "1m".into());
        assert!(Config::from_yaml(&serde_norway::to_string(&root).unwrap()).is_ok());
        root
    }

    #[test]
    fn every_duration_and_number_is_bounded() {
        let root = every_field();
        let mut all = Vec::new();
        leaves(&root, String::new(), &mut all);
        let mut checked = 0;
        for (path, v) in all {
            let huge: &[serde_norway::Value] = match &v {
                serde_norway::Value::String(s) if humantime::parse_duration(s).is_ok() => {
                    &["400000000000y".into(), "367d".into()]
                }
                serde_norway::Value::Number(_) => &[
                    f64::NAN.into(),
                    f64::INFINITY.into(),
                    f64::NEG_INFINITY.into(),
                    1e300.into(),
                    (-1).into(),
                    u64::MAX.into(),
                ],
                _ => continue,
            };
            for bad in huge {
                let mut r = root.clone();
                set(&mut r, &path, bad.clone());
                let text = serde_norway::to_string(&r).unwrap();
                let errs = Config::from_yaml(&text)
                    .expect_err(&format!("{path}: {bad:?}"))
                    .0;
                assert!(
                    errs.iter().any(|e| e.path == path),
                    "{path} = {bad:?} reported as {errs:?}"
                );
                checked += 1;
            }
        }
        // 11 durations and 9 numbers in the shipped config plus the three above.
        assert!(checked >= 80, "{checked}");
    }

    #[test]
    fn overflowing_durations_and_nan_thresholds_are_rejected() {
        let text = "interval: 1h\nguard:\n  freeze_timeout: 400000000000y\n  rules:\n    - {name: a, signal: tcp_sockets, above: .nan, action: report}\n    - {name: b, signal: tcp_sockets, above: 5, clear_below: .inf, action: report}\n    - {name: c, signal: node_zombies, above: 5, contributor_floor: -.inf, for: 999999999d, action: report}\n";
        let errs = Config::from_yaml(text).unwrap_err().0;
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "guard.freeze_timeout",
                "guard.rules[0].above",
                "guard.rules[1].clear_below",
                "guard.rules[2].contributor_floor",
                "guard.rules[2].for",
            ]
        );
        assert!(
            errs[1].message.contains("not a finite number"),
            "{}",
            errs[1].message
        );
    }

    #[test]
    fn all_type_errors_of_all_sections_in_one_run() {
        let text = "interval: soon\nsamplers:\n  memory:\n    enabled: maybe\n  logs:\n    enabled: 3\n    max_bytes_per_tick: lots\n  colour: red\nguard:\n  dry_run: perhaps\n  rules:\n    - {name: a, signal: tcp_sockets, above: 1, action: explode}\n    - {name: b, signal: tcp_sockets, above: x, for: soon, action: report}\n    - {name: '', signal: tcp_sockets, above: 1, action: report}\n";
        let errs = Config::from_yaml(text).unwrap_err().0;
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "interval",
                "samplers.memory.enabled",
                "samplers.logs.enabled",
                "samplers.logs.max_bytes_per_tick",
                "samplers.colour",
                "guard.dry_run",
                "guard.rules[0].action",
                "guard.rules[1].above",
                "guard.rules[1].for",
                // Validation still runs, on the user's own index after rule 0 was dropped.
                "guard.rules[2].name",
            ]
        );
        assert!(
            errs[4].message.contains("unknown field"),
            "{}",
            errs[4].message
        );
    }

    #[test]
    fn oversized_and_deeply_nested_text_is_rejected_before_parsing() {
        for text in [
            "[".repeat(100_000),
            "{a: ".repeat(25_000),
            format!("node_name: x\n#{}\n", " ".repeat(limits::MAX_FILE_BYTES)),
        ] {
            let errs = Config::from_yaml(&text).unwrap_err().0;
            assert_eq!(errs.len(), 1, "{errs:?}");
            assert_eq!(errs[0].path, "(document)");
            assert!(errs[0].message.contains("more than"), "{}", errs[0].message);
        }
        // Block nesting is cut by the YAML parser's own recursion limit (serde_norway, as serde_yaml).
        let mut deep = String::new();
        for d in 0..500 {
            deep.push_str(&format!("{}a:\n", " ".repeat(d)));
        }
        let errs = Config::from_yaml(&deep).unwrap_err().0;
        assert!(errs[0].message.contains("recursion limit"), "{errs:?}");
    }

    #[test]
    fn from_file_reads_no_more_than_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, "#".repeat(limits::MAX_FILE_BYTES * 4)).unwrap();
        let e = Config::from_file(&big).unwrap_err().to_string();
        assert!(e.contains("big.yaml") && e.contains("limit"), "{e}");
        let ok = dir.path().join("ok.yaml");
        std::fs::write(&ok, DEFAULT_YAML).unwrap();
        assert_eq!(
            Config::from_file(&ok).unwrap(),
            Config::default_config().unwrap()
        );
        let e = Config::from_file(&dir.path().join("none.yaml"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cannot read"), "{e}");
    }

    /// A FIFO put in place of the config file (behind the ConfigMap's symlink) is refused at
    /// once, not opened blocking: a reload is rejected with a clear error and the tick goes on.
    #[test]
    fn a_fifo_config_is_rejected_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let link = dir.path().join("nodeguard.yaml");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = link.clone();
        std::thread::spawn(move || {
            let _ = tx.send(Config::load_file_with(&path, &[]).map(drop));
        });
        let e = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("loading a FIFO config blocked")
            .unwrap_err();
        assert!(
            matches!(
                &e,
                LoadError::File(crate::fsio::RegularFileError::NotRegular {
                    kind: crate::fsio::NotRegular::Fifo,
                    ..
                })
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            format!("cannot read {}: not a regular file (fifo)", link.display())
        );
        assert_eq!(live::failed_fields(&e), "(file)");
    }

    #[test]
    fn errors_are_capped_with_one_notice() {
        let rules: String = (0..300)
            .map(|i| format!("    - name: r{i}\n      signal: tcp_sockets\n      above: x\n      action: report\n"))
            .collect();
        let bogus: String = (0..300).map(|i| format!("bogus{i}: 1\n")).collect();
        let errs = Config::from_yaml(&format!("{bogus}guard:\n  rules:\n{rules}"))
            .unwrap_err()
            .0;
        assert_eq!(errs.len(), collect::MAX_ERRORS + 1);
        let notices = errs.iter().filter(|e| e.message.contains("not reported"));
        assert_eq!(notices.count(), 1);
    }
}
