//! Configuration: YAML -> typed sections -> validated `Config`. Every problem is reported with its
//! field path, all in one run; only `main` turns them into an exit code.

pub mod guard;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
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

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Paths {
    pub proc: PathBuf,
    pub cgroup: PathBuf,
    pub pod_logs: PathBuf,
    pub container_logs: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            proc: "/proc".into(),
            cgroup: "/sys/fs/cgroup".into(),
            pod_logs: "/var/log/pods".into(),
            container_logs: "/var/log/containers".into(),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
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

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Toggle {
    pub enabled: bool,
}

impl Default for Toggle {
    fn default() -> Self {
        Toggle { enabled: true }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogsSampler {
    pub enabled: bool,
    /// Upper bound of log bytes read in one tick; the rest is read at the next ticks.
    pub max_bytes_per_tick: u64,
}

impl Default for LogsSampler {
    fn default() -> Self {
        LogsSampler {
            enabled: true,
            max_bytes_per_tick: 256 << 20,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SocketsSampler {
    pub enabled: bool,
    /// TCP sockets by state: needs each pod netns's TCP table, and reading one walks the whole
    /// TCP hash table the namespaces share. Off by default for that cost.
    pub tcp_states: bool,
}

impl Default for SocketsSampler {
    fn default() -> Self {
        SocketsSampler {
            enabled: true,
            tcp_states: false,
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
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

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Samplers {
    pub memory: Toggle,
    pub processes: Toggle,
    pub logs: LogsSampler,
    pub sockets: SocketsSampler,
    pub conntrack: ConntrackSampler,
}

/// Bounds of the HTTP server: no number of peers, idle or slow, can hold more than
/// `max_connections` descriptors, nor any of them for long.
#[derive(Debug, Clone, Deserialize, PartialEq)]
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
}

impl Default for Http {
    fn default() -> Self {
        Http {
            max_connections: 64,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// Upper bound of `http.max_connections`; the agent lowers it further to keep an fd reserve.
pub const MAX_HTTP_CONNECTIONS: usize = 4096;

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
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
    pub fn default_config() -> Result<Config, ConfigErrors> {
        Config::from_yaml(DEFAULT_YAML)
    }

    pub fn from_yaml(text: &str) -> Result<Config, ConfigErrors> {
        let mut errs = Vec::new();
        let root: serde_yaml::Value = match serde_yaml::from_str(text) {
            Ok(serde_yaml::Value::Null) => serde_yaml::Value::Mapping(Default::default()),
            Ok(v) => v,
            Err(e) => {
                return Err(ConfigErrors(vec![FieldError {
                    path: "(document)".into(),
                    message: e.to_string(),
                }]))
            }
        };
        let Some(map) = root.as_mapping() else {
            return Err(ConfigErrors(vec![FieldError {
                path: "(document)".into(),
                message: "expected a mapping of sections".into(),
            }]));
        };
        for key in map.keys() {
            match key.as_str() {
                Some(k) if SECTIONS.contains(&k) => {}
                _ => errs.push(FieldError {
                    path: yaml_key(key),
                    message: format!("unknown field, expected one of: {}", SECTIONS.join(", ")),
                }),
            }
        }
        let listen: String =
            section(map, "listen", &mut errs).unwrap_or_else(|| "0.0.0.0:9913".into());
        let http: Http = section(map, "http", &mut errs).unwrap_or_default();
        let interval: Option<HumanDuration> = section(map, "interval", &mut errs);
        let node_name: String = section(map, "node_name", &mut errs).unwrap_or_default();
        let paths: Paths = section(map, "paths", &mut errs).unwrap_or_default();
        let discovery: Discovery = section(map, "discovery", &mut errs).unwrap_or_default();
        let samplers: Samplers = section(map, "samplers", &mut errs).unwrap_or_default();
        let raw_guard: guard::RawGuard = section(map, "guard", &mut errs).unwrap_or_default();
        let guard = guard::compile(raw_guard, &mut errs);

        let listen = match listen.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(e) => {
                errs.push(FieldError {
                    path: "listen".into(),
                    message: format!("{listen:?} is not host:port ({e})"),
                });
                None
            }
        };
        let interval = interval.map(|d| d.0).unwrap_or(Duration::from_secs(5));
        if interval < Duration::from_millis(100) || interval > Duration::from_secs(3600) {
            errs.push(FieldError {
                path: "interval".into(),
                message: format!("{interval:?} is outside 100ms..1h"),
            });
        }
        for (name, p) in [
            ("paths.proc", &paths.proc),
            ("paths.cgroup", &paths.cgroup),
            ("paths.pod_logs", &paths.pod_logs),
            ("paths.container_logs", &paths.container_logs),
        ] {
            if !p.is_absolute() {
                errs.push(FieldError {
                    path: name.into(),
                    message: format!("{} must be an absolute path", p.display()),
                });
            }
        }
        if discovery.scopes.is_empty() {
            errs.push(FieldError {
                path: "discovery.scopes".into(),
                message: "needs at least one cgroup path (\"/\" for the whole tree)".into(),
            });
        }
        for (i, s) in discovery.scopes.iter().enumerate() {
            if !s.starts_with('/') || s.split('/').any(|c| c == "..") {
                errs.push(FieldError {
                    path: format!("discovery.scopes[{i}]"),
                    message: format!("{s:?} must be an absolute cgroup path without '..'"),
                });
            }
        }
        let ct = &samplers.conntrack;
        if !(0.0..=1.0).contains(&ct.dump_trigger) {
            errs.push(FieldError {
                path: "samplers.conntrack.dump_trigger".into(),
                message: format!("{} is not a fraction in 0..=1", ct.dump_trigger),
            });
        }
        if ct.dump_interval < Duration::from_secs(1) {
            errs.push(FieldError {
                path: "samplers.conntrack.dump_interval".into(),
                message: format!("{:?} is below 1s", ct.dump_interval),
            });
        }
        if !ct.host_netns.as_os_str().is_empty() && !ct.host_netns.is_absolute() {
            errs.push(FieldError {
                path: "samplers.conntrack.host_netns".into(),
                message: format!("{} must be an absolute path", ct.host_netns.display()),
            });
        }
        if samplers.logs.max_bytes_per_tick == 0 {
            errs.push(FieldError {
                path: "samplers.logs.max_bytes_per_tick".into(),
                message: "must be greater than 0".into(),
            });
        }
        check_http(&http, &mut errs);
        match (errs.is_empty(), listen) {
            (true, Some(listen)) => Ok(Config {
                listen,
                http,
                interval,
                node_name,
                paths,
                discovery,
                samplers,
                guard,
            }),
            _ => Err(ConfigErrors(errs)),
        }
    }
}

fn check_http(h: &Http, errs: &mut Vec<FieldError>) {
    if !(1..=MAX_HTTP_CONNECTIONS).contains(&h.max_connections) {
        errs.push(FieldError {
            path: "http.max_connections".into(),
            message: format!(
                "{} is outside 1..={MAX_HTTP_CONNECTIONS}",
                h.max_connections
            ),
        });
    }
    let (lo, hi) = (Duration::from_millis(100), Duration::from_secs(600));
    for (path, d) in [
        ("http.header_read_timeout", h.header_read_timeout),
        ("http.idle_timeout", h.idle_timeout),
        ("http.write_timeout", h.write_timeout),
    ] {
        if d < lo || d > hi {
            errs.push(FieldError {
                path: path.into(),
                message: format!("{d:?} is outside 100ms..10m"),
            });
        }
    }
    // Both timers start when the server waits for a request: a longer idle one never fires.
    if h.idle_timeout > h.header_read_timeout {
        errs.push(FieldError {
            path: "http.idle_timeout".into(),
            message: format!(
                "{:?} exceeds http.header_read_timeout ({:?}), which would close an idle connection first",
                h.idle_timeout, h.header_read_timeout
            ),
        });
    }
}

fn yaml_key(k: &serde_yaml::Value) -> String {
    match k {
        serde_yaml::Value::String(s) => s.clone(),
        other => serde_yaml::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_owned(),
    }
}

/// Deserializes one section, recording a type error with its full field path.
fn section<T: DeserializeOwned>(
    map: &serde_yaml::Mapping,
    key: &str,
    errs: &mut Vec<FieldError>,
) -> Option<T> {
    let v = map.get(key)?;
    match serde_path_to_error::deserialize::<_, T>(v.clone()) {
        Ok(t) => Some(t),
        Err(e) => {
            let inner = e.path().to_string();
            let path = if inner == "." || inner.is_empty() {
                key.to_owned()
            } else {
                format!("{key}.{inner}")
            };
            errs.push(FieldError {
                path,
                message: e.into_inner().to_string(),
            });
            None
        }
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
}
