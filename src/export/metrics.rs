//! Prometheus exposition of the last snapshot through prometheus-client `Collector`s that walk
//! the metric catalog (`export::catalog`): series exist only for what the snapshot holds, so
//! vanished containers disappear with their cgroups.

use super::catalog::{self, Family, Num, Rows, Type};
use crate::model::Published;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::fmt::Error;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// The snapshot shared between the tick loop (writer) and scrapes (readers).
pub type SharedSnapshot = Arc<RwLock<Arc<Published>>>;

pub fn latest(shared: &SharedSnapshot) -> Arc<Published> {
    shared.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Builds the registry: every metric comes from the snapshot collector under `nodeguard_`.
pub fn registry(shared: SharedSnapshot) -> Registry {
    let mut r = Registry::with_prefix(catalog::PREFIX);
    r.register_collector(Box::new(SnapshotCollector { shared }));
    r
}

/// The length of the last rendering: the next one is allocated at its size once, not grown by
/// doubling from 64 KiB (430 KB at 110 pods: three reallocations and copies).
static LAST_LEN: AtomicUsize = AtomicUsize::new(64 * 1024);

pub fn render(registry: &Registry) -> Result<String, Error> {
    let mut out = render_part(registry)?;
    prometheus_client::encoding::text::encode_eof(&mut out)?;
    Ok(out)
}

/// The families of `registry` without the closing `# EOF`: the part of `/metrics` the server
/// renders once per snapshot and shares, before the per-request part ([`render_live`]).
pub fn render_part(registry: &Registry) -> Result<String, Error> {
    let hint = LAST_LEN.load(Ordering::Relaxed);
    let mut out = String::with_capacity(hint + hint / 16);
    prometheus_client::encoding::text::encode_registry(&mut out, registry)?;
    LAST_LEN.store(out.len(), Ordering::Relaxed);
    Ok(out)
}

/// The end of `/metrics`: the families read at scrape time, then `# EOF`.
pub fn render_live(registry: &Registry) -> Result<String, Error> {
    let mut out = String::with_capacity(4096);
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

/// An empty registry under the agent's prefix, for the families read at scrape time.
pub fn live_registry() -> Registry {
    Registry::with_prefix(catalog::PREFIX)
}

#[derive(Debug)]
struct SnapshotCollector {
    shared: SharedSnapshot,
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), Error> {
        let s = latest(&self.shared);
        for f in catalog::SNAPSHOT.iter().flat_map(|part| part.iter()) {
            encode(&mut enc, f, &s, &s.node)?;
        }
        Ok(())
    }
}

/// Writes one family: its descriptor, then one sample per row, `node` (when known) after the
/// identity labels. Label values go through the encoder, which escapes them: comm, cgroup and
/// pod names are the workload's to choose.
pub(crate) fn encode<S>(
    enc: &mut DescriptorEncoder,
    f: &Family<S>,
    src: &S,
    node: &str,
) -> Result<(), Error> {
    let meta = &f.meta;
    let mut rows = Rows::new(meta.labels.len());
    (f.rows)(src, &mut rows);
    let ty = match meta.ty {
        Type::Gauge => MetricType::Gauge,
        Type::Counter => MetricType::Counter,
    };
    let mut m = enc.encode_descriptor(meta.name, meta.help, None, ty)?;
    let at = meta.node_at();
    let last = rows.len().saturating_sub(1);
    let mut labels: Vec<(&str, &str)> = Vec::with_capacity(meta.labels.len() + 1);
    for (i, (values, v)) in rows.iter().enumerate() {
        labels.clear();
        labels.extend(
            meta.labels[..at]
                .iter()
                .map(|l| l.name)
                .zip(&values[..at])
                .map(|(k, v)| (k, *v)),
        );
        if !node.is_empty() {
            labels.push(("node", node));
        }
        labels.extend(
            meta.labels[at..]
                .iter()
                .map(|l| l.name)
                .zip(&values[at..])
                .map(|(k, v)| (k, *v)),
        );
        // A node-level series without labels is written bare, not as `name{}`.
        if labels.is_empty() && i == last {
            return encode_value(meta.ty, v, m);
        }
        encode_value(meta.ty, v, m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn encode_value(ty: Type, v: Num, m: MetricEncoder) -> Result<(), Error> {
    match (ty, v) {
        (Type::Counter, Num::U(v)) => ConstCounter::new(v).encode(m),
        (Type::Counter, Num::F(v)) => ConstCounter::new(v).encode(m),
        (Type::Gauge, Num::U(v)) => ConstGauge::new(v).encode(m),
        (Type::Gauge, Num::F(v)) => ConstGauge::new(v).encode(m),
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
