//! Which workloads a breaker's identity names, and which rule targets it covers.

use super::super::breaker::{Breaker, BreakerId};
use super::super::owner::owner_of;
use crate::model::{Kind, Snapshot, WorkloadSignals};
use crate::rule::observe::Target;

/// Simple `*`/`?` glob; protection lists are short and patterns trivial.
pub fn glob(pattern: &str, text: &str) -> bool {
    fn m(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some(b'*'), _) => m(&p[1..], t) || (!t.is_empty() && m(p, &t[1..])),
            (Some(b'?'), Some(_)) => m(&p[1..], &t[1..]),
            (Some(a), Some(b)) if a == b => m(&p[1..], &t[1..]),
            _ => false,
        }
    }
    m(pattern.as_bytes(), text.as_bytes())
}

/// A workload's breaker identity and revision.
pub fn identity(w: &WorkloadSignals) -> (BreakerId, String) {
    if w.kind == Kind::Unit {
        return (
            BreakerId {
                namespace: String::new(),
                owner: w.id.container.clone(),
                container: w.id.container.clone(),
            },
            String::new(),
        );
    }
    let o = owner_of(&w.id.pod, w.pod_uid.as_deref().unwrap_or(""));
    (
        BreakerId {
            namespace: w.id.namespace.clone(),
            owner: o.name,
            container: w.id.container.clone(),
        },
        o.revision,
    )
}

/// A rule target that belongs to what a breaker holds (its owner, one container or all).
pub(super) fn covers(id: &BreakerId, k: &Target) -> bool {
    match k {
        Target::Workload(w) => {
            w.namespace == id.namespace
                && owner_of(&w.pod, "").name == id.owner
                && (id.container.is_empty() || w.container == id.container)
        }
        Target::Pod { namespace, pod } => {
            *namespace == id.namespace
                && owner_of(pod, "").name == id.owner
                && id.container.is_empty()
        }
        Target::Node => false,
    }
}

pub(super) fn matches_id(id: &BreakerId, w: &WorkloadSignals) -> bool {
    let (wid, _) = identity(w);
    wid.namespace == id.namespace
        && wid.owner == id.owner
        && (id.container.is_empty() || wid.container == id.container)
}

/// The workloads a breaker holds now: its identity, minus replicas it spared.
pub(super) fn held_by<'a>(b: &Breaker, snap: &'a Snapshot) -> Vec<&'a WorkloadSignals> {
    snap.workloads
        .iter()
        .filter(|w| {
            w.cgroup.is_some() && matches_id(&b.id, w) && !b.spared_pods.contains(&w.id.pod)
        })
        .collect()
}
