//! Lookups and assertions on a snapshot, shared by the real-kernel tests.

use nodeguard::export::metrics::{registry, render, SharedSnapshot};
use nodeguard::model::WorkloadId;
use nodeguard::model::{PodSignals, Published, Snapshot, WorkloadSignals};
use std::sync::{Arc, RwLock};

pub fn find<'a>(s: &'a Snapshot, ns: &str, pod: &str, c: &str) -> &'a WorkloadSignals {
    let id = WorkloadId::container(ns, pod, c);
    s.workloads.iter().find(|w| w.id == id).unwrap_or_else(|| {
        panic!(
            "{id} not in {:#?}",
            s.workloads.iter().map(|w| &w.id).collect::<Vec<_>>()
        )
    })
}

pub fn pod<'a>(s: &'a Snapshot, ns: &str, name: &str) -> &'a PodSignals {
    s.pods
        .iter()
        .find(|p| p.namespace == ns && p.pod == name)
        .unwrap_or_else(|| panic!("pod {ns}/{name} not in {:#?}", s.pods))
}

/// The `/metrics` text a scrape of this publication returns.
pub fn metrics_text(s: &Published) -> String {
    let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(s.clone())));
    render(&registry(shared)).expect("render")
}

pub fn assert_line(text: &str, line: &str) {
    assert!(
        text.contains(&format!("{line}\n")),
        "missing {line:?} in:\n{text}"
    );
}
