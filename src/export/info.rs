//! Which configuration and build are live, and how the config reloads went: series read from
//! the snapshot's `config` (republished at once after a reload, not at the next tick).

use super::metrics::{family, latest, Labels, SharedSnapshot};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::fmt;

/// The source revision stamped at build time (`build.rs`), `unknown` without one.
pub const REVISION: &str = match option_env!("NODEGUARD_REVISION") {
    Some(r) if !r.is_empty() => r,
    _ => "unknown",
};

pub fn register(r: &mut Registry, shared: SharedSnapshot) {
    r.register_collector(Box::new(ConfigCollector { shared }));
}

#[derive(Debug)]
struct ConfigCollector {
    shared: SharedSnapshot,
}

impl Collector for ConfigCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        use MetricType::{Counter, Gauge};
        let s = latest(&self.shared);
        let c = &s.config;
        let node: Labels = if s.node.is_empty() {
            vec![]
        } else {
            vec![("node", s.node.clone())]
        };
        let mut info = node.clone();
        info.push(("hash", c.hash.clone()));
        family(
            &mut enc,
            "config_info",
            "The configuration in force: the first 16 hex digits of the SHA-256 of its text.",
            Gauge,
            [(info, 1u64)],
        )?;
        family(
            &mut enc,
            "config_reloads",
            "Reloads that changed the configuration in force (SIGHUP or a change of the file).",
            Counter,
            [(node.clone(), c.reloads_total)],
        )?;
        family(
            &mut enc,
            "config_reload_failures",
            "Reloads refused (invalid or unreadable file); the running configuration is kept.",
            Counter,
            [(node.clone(), c.reload_failures_total)],
        )?;
        family(
            &mut enc,
            "config_last_reload_success",
            "1 when the last reload attempt succeeded (or none was made), 0 when it was refused.",
            Gauge,
            [(node.clone(), u64::from(c.last_reload_ok))],
        )?;
        family(
            &mut enc,
            "config_last_reload_success_timestamp_seconds",
            "Unix time the configuration in force was loaded (the start, or the last reload).",
            Gauge,
            [(node.clone(), c.loaded_at)],
        )?;
        family(
            &mut enc,
            "config_restart_required",
            "1 when the file changes keys that apply only at a restart (listen, http, paths, ...).",
            Gauge,
            [(node, u64::from(!c.restart_required.is_empty()))],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::metrics::{registry, render};
    use crate::model::{ConfigStatus, Snapshot};
    use std::sync::{Arc, RwLock};

    #[test]
    fn config_and_reload_series() {
        let snap = Snapshot {
            node: "n1".into(),
            config: ConfigStatus {
                hash: "0123456789abcdef".into(),
                loaded_at: 1.5,
                reloads_total: 2,
                reload_failures_total: 1,
                last_reload_ok: false,
                restart_required: vec!["listen"],
                ..ConfigStatus::default()
            },
            ..Snapshot::default()
        };
        let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(snap.into())));
        let mut r = registry(shared.clone());
        register(&mut r, shared);
        let text = render(&r).unwrap();
        for line in [
            "nodeguard_config_info{node=\"n1\",hash=\"0123456789abcdef\"} 1\n",
            "nodeguard_config_reloads_total{node=\"n1\"} 2\n",
            "nodeguard_config_reload_failures_total{node=\"n1\"} 1\n",
            "nodeguard_config_last_reload_success{node=\"n1\"} 0\n",
            "nodeguard_config_last_reload_success_timestamp_seconds{node=\"n1\"} 1.5\n",
            "nodeguard_config_restart_required{node=\"n1\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(text.contains(&format!("revision=\"{REVISION}\"")), "{text}");
    }
}
