//! Which keys a running agent takes from a reloaded file, and which need a restart.
//!
//! Live: `interval` and `guard.*` but `guard.state_file` (rules, thresholds, dry_run, pacing,
//! protections, webhook). Restart: what the server, the readers and the state file were built on
//! (`listen`, `http`, `node_name`, `paths`, `discovery`, `samplers`, `guard.state_file`); a
//! reload that changes one of these applies the live keys, keeps the running values of the rest,
//! and says which fields wait for a restart.

use super::{Config, LoadError};
use sha2::{Digest, Sha256};

/// The first 16 hex digits of the SHA-256 of the config text: what `nodeguard_config_info{hash}`
/// shows, the prefix `sha256sum nodeguard.yaml` prints.
pub fn hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// The fields of `new` that differ from `running` and need a restart, by their config path.
pub fn restart_only_changes(running: &Config, new: &Config) -> Vec<&'static str> {
    let (a, b) = (running, new);
    let mut out = Vec::new();
    let mut diff = |changed: bool, name: &'static str| {
        if changed {
            out.push(name);
        }
    };
    diff(a.listen != b.listen, "listen");
    diff(a.http != b.http, "http");
    diff(a.node_name != b.node_name, "node_name");
    diff(a.paths != b.paths, "paths");
    diff(a.discovery != b.discovery, "discovery");
    diff(a.samplers.memory != b.samplers.memory, "samplers.memory");
    diff(
        a.samplers.processes != b.samplers.processes,
        "samplers.processes",
    );
    diff(a.samplers.logs != b.samplers.logs, "samplers.logs");
    diff(a.samplers.sockets != b.samplers.sockets, "samplers.sockets");
    diff(
        a.samplers.conntrack != b.samplers.conntrack,
        "samplers.conntrack",
    );
    diff(a.samplers.kmsg != b.samplers.kmsg, "samplers.kmsg");
    diff(a.guard.state_file != b.guard.state_file, "guard.state_file");
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
            ["listen", "paths", "guard.state_file"]
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
