//! Which configuration and build are live, and how the config reloads went: the catalog's
//! `config` families, read from the snapshot's `config` (republished at once after a reload, not
//! at the next tick).

use super::catalog;
use super::metrics::{encode, latest, SharedSnapshot};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use std::fmt;

/// The source revision, declared with the `build_info` family that exports it.
pub use super::catalog::agent::REVISION;

pub fn register(r: &mut Registry, shared: SharedSnapshot) {
    r.register_collector(Box::new(ConfigCollector { shared }));
}

#[derive(Debug)]
struct ConfigCollector {
    shared: SharedSnapshot,
}

impl Collector for ConfigCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let s = latest(&self.shared);
        for f in catalog::CONFIG {
            encode(&mut enc, f, &s, &s.node)?;
        }
        Ok(())
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
