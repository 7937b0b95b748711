//! Per-workload and per-pod signals (`signal` over `sample`): memory, OOM kills, processes, pids,
//! zombies, log lines, restarts, staleness, sockets.

use super::{names, Family, Label, Meta, Rows, Section, Type, Unit, CONTAINER_ID, POD_ID};
use crate::model::{Kind, PodSignals, Published, WorkloadSignals};
use crate::model::{LineCounts, Stream};
use std::collections::BTreeMap;

use Section::Workloads as S;
use Type::{Counter, Gauge};

/// The signals whose last good value a failed read keeps (`container_signal_stale`).
pub const STALE_SIGNALS: [&str; 4] = ["memory", "processes", "pids", "sockets"];
/// Protocols of the sockets a container's own fds hold.
pub const SOCKET_PROTOCOLS: [&str; 2] = ["tcp", "udp"];

const fn with<const N: usize>(extra: Label) -> [Label; N] {
    let mut out = [extra; N];
    let mut i = 0;
    while i < 3 {
        out[i] = CONTAINER_ID[i];
        i += 1;
    }
    out
}

const STREAM: [Label; 4] = with(Label::of("stream", || names(&Stream::ALL, |s| s.as_str())));
const PARENT_COMM: [Label; 4] = with(Label::free("parent_comm"));
const SIGNAL: [Label; 4] = with(Label::of("signal", || STALE_SIGNALS.to_vec()));
const PROTOCOL: [Label; 4] = with(Label::of("protocol", || SOCKET_PROTOCOLS.to_vec()));
const STATE: [Label; 4] = with(Label::free("state"));

pub(crate) fn id(w: &WorkloadSignals) -> [&str; 3] {
    [&w.id.namespace, &w.id.pod, &w.id.container]
}

pub(crate) fn pod_id(p: &PodSignals) -> [&str; 2] {
    [&p.namespace, &p.pod]
}

/// One row per workload that has a value.
fn each<'a, V: Into<super::Num>>(
    s: &'a Published,
    out: &mut Rows<'a>,
    value: impl Fn(&WorkloadSignals) -> Option<V>,
) {
    for w in &s.workloads {
        if let Some(v) = value(w) {
            out.add(&id(w), v);
        }
    }
}

/// Zombies by parent comm: a parent pid changes with every restart and would make a new series
/// each time (and two parents of one name a duplicate); the pids are in `/api/state`.
fn zombies_by_parent_comm(w: &WorkloadSignals) -> BTreeMap<&str, u64> {
    let mut by = BTreeMap::new();
    for p in &w.zombie_parents {
        *by.entry(p.comm.as_str()).or_default() += p.zombies;
    }
    by
}

fn log_lines<'a>(
    s: &'a Published,
    out: &mut Rows<'a>,
    counts: fn(&WorkloadSignals) -> &LineCounts,
) {
    for w in s.workloads.iter().filter(|w| w.pod_uid.is_some()) {
        let [ns, pod, c] = id(w);
        for st in Stream::ALL {
            out.add(&[ns, pod, c, st.as_str()], counts(w).get(st));
        }
    }
}

pub const FAMILIES: &[Family<Published>] = &[
    Meta {
        name: "container_memory_working_set_bytes",
        ty: Gauge,
        unit: Some(Unit::Bytes),
        help: "Memory usage minus inactive file cache (cAdvisor's working set).",
        labels: &CONTAINER_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |w| Some(w.memory?.value.working_set_bytes))),
    Meta {
        name: "container_memory_usage_bytes",
        ty: Gauge,
        unit: Some(Unit::Bytes),
        help: "Memory charged to the cgroup, page cache included.",
        labels: &CONTAINER_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |w| Some(w.memory?.value.usage_bytes))),
    Meta {
        name: "container_memory_limit_bytes",
        ty: Gauge,
        unit: Some(Unit::Bytes),
        help: "Memory limit of the cgroup; no series when unlimited.",
        labels: &CONTAINER_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |w| w.memory?.value.limit_bytes)),
    Meta {
        name: "container_oom_kills",
        ty: Counter,
        unit: None,
        help: "OOM kills in the workload, kept across container restarts.",
        labels: &CONTAINER_ID,
        section: S,
    }
    .with_rows(|s, out| {
            each(s, out, |w| {
                (w.cgroup.is_some() || w.oom_kills_total > 0).then_some(w.oom_kills_total)
            })
        }),
    Meta {
        name: "container_processes",
        ty: Gauge,
        unit: None,
        help: "Processes in the workload's cgroup(s).",
        labels: &CONTAINER_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |w| Some(w.processes?.value))),
    Meta {
        name: "container_pids",
        ty: Gauge,
        unit: None,
        help: "Tasks in the workload's pids controller (pids.current): threads and zombies.",
        labels: &CONTAINER_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |w| Some(w.pids?.value.current))),
    Meta {
        name: "container_pids_limit",
        ty: Gauge,
        unit: None,
        help: "pids.max of the workload; no series when unlimited.",
        labels: &CONTAINER_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |w| w.pids?.value.limit)),
    Meta {
        name: "container_memory_full_in_seconds",
        ty: Gauge,
        unit: Some(Unit::Seconds),
        help: "Seconds until the working set reaches the limit at the recent trend; no series while not growing.",
        labels: &CONTAINER_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |w| w.memory_full_in_seconds)),
    Meta {
        name: "container_zombies",
        ty: Gauge,
        unit: None,
        help: "Zombie processes whose parent is in the workload.",
        labels: &CONTAINER_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |w| Some(w.zombies?.value))),
    Meta {
        name: "container_zombie_parent_zombies",
        ty: Gauge,
        unit: None,
        help: "Zombies held by the workload's non-reaping parents of this comm.",
        labels: &PARENT_COMM,
        section: S,
    }
    .with_rows(|s, out| {
            for w in &s.workloads {
                let [ns, pod, c] = id(w);
                for (comm, n) in zombies_by_parent_comm(w) {
                    out.add(&[ns, pod, c, comm], n);
                }
            }
        }),
    Meta {
        name: "container_log_lines",
        ty: Counter,
        unit: None,
        help: "Log lines written by the container, by stream, from the CRI log files.",
        labels: &STREAM,
        section: S,
    }
    .with_rows(|s, out| log_lines(s, out, |w| &w.log_lines_total)),
    Meta {
        name: "container_log_lines_per_minute",
        ty: Gauge,
        unit: None,
        help: "Log lines written in the trailing 60 seconds, by stream.",
        labels: &STREAM,
        section: S,
    }
    .with_rows(|s, out| log_lines(s, out, |w| &w.log_lines_per_minute)),
    Meta {
        name: "container_restarts",
        ty: Counter,
        unit: None,
        help: "Container restarts seen from new container ids and kubelet log numbers.",
        labels: &CONTAINER_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |w| (w.kind == Kind::Container).then_some(w.restarts_total))),
    Meta {
        name: "container_signal_stale",
        ty: Gauge,
        unit: None,
        help: "1 when the signal's last read failed and the exported value is the last good one.",
        labels: &SIGNAL,
        section: S,
    }
    .with_rows(|s, out| {
            for w in &s.workloads {
                let [ns, pod, c] = id(w);
                let stale = [
                    w.memory.is_some_and(|m| m.stale),
                    w.processes.is_some_and(|m| m.stale),
                    w.pids.is_some_and(|m| m.stale),
                    w.sockets.as_ref().is_some_and(|m| m.stale),
                ];
                for (signal, _) in STALE_SIGNALS.into_iter().zip(stale).filter(|x| x.1) {
                    out.add(&[ns, pod, c, signal], 1u64);
                }
            }
        }),
    Meta {
        name: "pod_oom_kills",
        ty: Counter,
        unit: None,
        help: "OOM kills in the pod cgroup, counted hierarchically (v2 only).",
        labels: &POD_ID,
        section: S,
    }
    .with_rows(|s, out| {
            for p in &s.pods {
                if let Some(v) = p.oom_kills_total {
                    out.add(&pod_id(p), v);
                }
            }
        }),
    Meta {
        name: "container_sockets",
        ty: Gauge,
        unit: None,
        help: "TCP/UDP sockets held by the container's own file descriptors.",
        labels: &PROTOCOL,
        section: S,
    }
    .with_rows(|s, out| {
            for w in &s.workloads {
                let [ns, pod, c] = id(w);
                if let Some(h) = &w.sockets {
                    let by = [h.value.tcp, h.value.udp];
                    for (proto, n) in SOCKET_PROTOCOLS.into_iter().zip(by) {
                        out.add(&[ns, pod, c, proto], n);
                    }
                }
            }
        }),
    Meta {
        name: "container_tcp_sockets",
        ty: Gauge,
        unit: None,
        help: "TCP sockets held by the container, by state.",
        labels: &STATE,
        section: S,
    }
    .with_rows(|s, out| {
            for w in &s.workloads {
                let [ns, pod, c] = id(w);
                if let Some(h) = &w.sockets {
                    for (st, n) in &h.value.tcp_states {
                        out.add(&[ns, pod, c, st], *n);
                    }
                }
            }
        }),
];
