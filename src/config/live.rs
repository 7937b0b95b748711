//! Which keys a running agent takes from a reloaded file, and which need a restart.
//!
//! Live: [`LIVE`] (`interval`, and `guard.*` but `guard.state_file`: rules, thresholds, dry_run,
//! pacing, protections, webhook). Everything else needs a restart: what the server, the readers
//! and the state file were built on. The list is derived, not kept by hand: both configs are
//! serialized and compared leaf by leaf, and a changed leaf outside [`LIVE`] is named by its
//! section ([`section_of`]), so a new section or sampler is restart-only until it is made live
//! here. A reload that changes one applies the live keys, keeps the running values of the rest,
//! and says which sections wait for a restart.

use super::{Config, LoadError};
use sha2::{Digest, Sha256};

/// Keys a reload applies, with everything under them but [`NOT_LIVE`]. [`effective`] copies
/// exactly these.
pub const LIVE: &[&str] = &["interval", "guard"];

/// Keys under a [`LIVE`] one that still need a restart (the enforcer was built on them).
pub const NOT_LIVE: &[&str] = &["guard.state_file"];

/// The first 16 hex digits of the SHA-256 of the config text: what `nodeguard_config_info{hash}`
/// shows, the prefix `sha256sum nodeguard.yaml` prints.
pub fn hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The sections of `new` that differ from `running` and need a restart, by their config path
/// (`listen`, `http`, `samplers.ports`, `guard.state_file`), sorted, each once.
pub fn restart_only_changes(running: &Config, new: &Config) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for path in changed_leaves(running, new) {
        if is_live(&path) {
            continue;
        }
        let section = intern(section_of(&path));
        if !out.contains(&section) {
            out.push(section);
        }
    }
    out
}

/// What the agent runs after a reload: the live keys of `new`, every other key as running.
pub fn effective(running: &Config, new: Config) -> Config {
    let mut guard = new.guard;
    guard.state_file = running.guard.state_file.clone();
    Config {
        interval: new.interval,
        guard,
        ..running.clone()
    }
}

/// Whether a reload applies the key at `path` (a leaf path, `guard.rules.0`).
pub fn is_live(path: &str) -> bool {
    let under = |key: &str| path == key || path.starts_with(&format!("{key}."));
    LIVE.iter().any(|k| under(k)) && !NOT_LIVE.iter().any(|k| under(k))
}

/// The section a leaf path is reported by: its top-level key, the sampler under `samplers`,
/// and the [`NOT_LIVE`] key it is under.
pub fn section_of(path: &str) -> &str {
    if let Some(k) = NOT_LIVE
        .iter()
        .find(|k| path == **k || path.starts_with(&format!("{k}.")))
    {
        return k;
    }
    let depth = if path.starts_with("samplers.") { 2 } else { 1 };
    match path.match_indices('.').nth(depth - 1) {
        Some((i, _)) => &path[..i],
        None => path,
    }
}

/// Dotted paths of the leaves that differ between `a` and `b`, sorted (a list is one leaf).
fn changed_leaves(a: &Config, b: &Config) -> Vec<String> {
    // Config serializes plain fields only: a failure would be a bug, and then every section
    // is reported as changed rather than none.
    let (Ok(a), Ok(b)) = (serde_json::to_value(a), serde_json::to_value(b)) else {
        return vec!["(config)".to_owned()];
    };
    let mut out = Vec::new();
    diff(&a, &b, String::new(), &mut out);
    out
}

fn diff(a: &serde_json::Value, b: &serde_json::Value, path: String, out: &mut Vec<String>) {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys = x.keys().chain(y.keys().filter(|k| !x.contains_key(*k)));
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                match (x.get(k), y.get(k)) {
                    (Some(v), Some(w)) => diff(v, w, p, out),
                    _ => out.push(p),
                }
            }
        }
        _ if a != b => out.push(path),
        _ => {}
    }
}

/// Section names as `&'static str`: they come from the config's field names (never from the
/// file's values), so the set is small and fixed, each leaked once.
fn intern(name: &str) -> &'static str {
    use std::collections::BTreeSet;
    use std::sync::{Mutex, OnceLock};
    static NAMES: OnceLock<Mutex<BTreeSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(n) = names.get(name) {
        return n;
    }
    let n: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(n);
    n
}

/// The field paths named by a failed load, for a one-line log (`(document)` for the file as a
/// whole, `(file)` when it could not be read).
pub fn failed_fields(e: &LoadError) -> String {
    match e {
        LoadError::File(_) => "(file)".to_owned(),
        LoadError::Invalid { errors, .. } => {
            let mut paths: Vec<&str> = errors.0.iter().map(|f| f.path.as_str()).collect();
            paths.dedup();
            paths.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_hash_is_the_sha256_prefix() {
        // `printf 'a: 1\n' | sha256sum`
        assert_eq!(hash("a: 1\n"), "37b128c59f1f5097");
        assert_ne!(hash("a: 1\n"), hash("a: 2\n"));
    }

    #[test]
    fn live_keys_apply_and_restart_keys_are_kept_and_named() {
        let running = Config::default_config().unwrap();
        let new = Config::from_yaml(
            "listen: 127.0.0.1:1\ninterval: 2s\npaths:\n  proc: /elsewhere\nguard:\n  dry_run: false\n  state_file: /tmp/other.json\n  cooldown: 1m\n",
        )
        .unwrap();
        assert_eq!(
            restart_only_changes(&running, &new),
            ["guard.state_file", "listen", "paths"]
        );
        let eff = effective(&running, new);
        assert_eq!(eff.listen, running.listen);
        assert_eq!(eff.paths, running.paths);
        assert_eq!(eff.guard.state_file, running.guard.state_file);
        assert_eq!(eff.interval, Duration::from_secs(2));
        assert!(!eff.guard.dry_run);
        assert_eq!(eff.guard.cooldown, Duration::from_secs(60));
        assert!(restart_only_changes(&running, &eff).is_empty());
    }

    /// One change in every restart-only section, each named once by its section; with the live
    /// keys changed too, which are not named. `effective` takes exactly the live ones.
    #[test]
    fn every_restart_only_section_is_named_and_live_keys_are_not() {
        let running = Config::default_config().unwrap();
        let changed = [
            ("listen", "listen: 127.0.0.1:1\n"),
            ("http", "http:\n  max_connections: 8\n"),
            ("node_name", "node_name: other\n"),
            ("paths", "paths:\n  kmsg: /dev/null\n"),
            ("discovery", "discovery:\n  host_workloads: false\n"),
            (
                "samplers.memory",
                "samplers:\n  memory:\n    enabled: false\n",
            ),
            (
                "samplers.processes",
                "samplers:\n  processes:\n    enabled: false\n",
            ),
            (
                "samplers.logs",
                "samplers:\n  logs:\n    max_open_files: 7\n",
            ),
            (
                "samplers.sockets",
                "samplers:\n  sockets:\n    tcp_states: true\n",
            ),
            (
                "samplers.conntrack",
                "samplers:\n  conntrack:\n    dump_interval: 1m\n",
            ),
            (
                "samplers.ports",
                "samplers:\n  ports:\n    enabled: false\n",
            ),
            ("samplers.kmsg", "samplers:\n  kmsg:\n    remember: 1m\n"),
            (
                "guard.state_file",
                "guard:\n  state_file: /tmp/other.json\n",
            ),
        ];
        for (section, yaml) in changed {
            let new = Config::from_yaml(yaml).unwrap();
            assert_eq!(restart_only_changes(&running, &new), [section], "{yaml}");
            assert_eq!(effective(&running, new), running, "{section} applied live");
        }
        let live = "interval: 2s\nguard:\n  dry_run: false\n  cooldown: 1m\n  protect:\n    namespaces: []\n  rules: []\n";
        let new = Config::from_yaml(live).unwrap();
        assert!(restart_only_changes(&running, &new).is_empty());
        assert_eq!(effective(&running, new.clone()), new);
        // Every top-level key of the file is a section the comparison sees.
        let value = serde_json::to_value(&running).unwrap();
        let keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut sections = super::super::SECTIONS.to_vec();
        sections.sort_unstable();
        assert_eq!(keys, sections);
    }

    #[test]
    fn sections_and_live_keys_of_a_path() {
        assert_eq!(section_of("samplers.ports.enabled"), "samplers.ports");
        assert_eq!(section_of("http.idle_timeout.secs"), "http");
        assert_eq!(section_of("listen"), "listen");
        assert_eq!(section_of("guard.state_file"), "guard.state_file");
        assert!(is_live("interval.secs") && is_live("guard.rules") && is_live("guard"));
        assert!(!is_live("guard.state_file") && !is_live("intervals") && !is_live("http.x"));
    }

    #[test]
    fn a_failed_load_names_its_fields_on_one_line() {
        let errors = Config::from_yaml("interval: soon\nguard:\n  dry_run: maybe\n").unwrap_err();
        let e = LoadError::Invalid {
            path: "/x".into(),
            errors,
        };
        assert_eq!(failed_fields(&e), "interval, guard.dry_run");
    }
}
