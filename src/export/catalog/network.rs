//! The node's tables (conntrack, tasks) and each pod's network namespace (`sample/net`,
//! `sample/pids`, `signal/full`), the host-scope conntrack dump, and the features that depend on
//! capabilities.

use super::workloads::pod_id;
use super::{Family, Label, Meta, Rows, Section, Type, Unit, NAMESPACE, POD, POD_ID};
use crate::model::{PodSignals, Published};

use Section::Network as S;
use Type::Gauge;

/// Where a pod's conntrack entries were counted.
pub const CONNTRACK_SCOPES: [&str; 2] = ["pod_netns", "host"];
/// The protocols of a pod netns's `sockstat`.
pub const NETNS_PROTOCOLS: [&str; 4] = ["tcp", "udp", "tcp6", "udp6"];
/// Features that switch themselves off when a capability or kernel feature is missing.
pub const FEATURES: [&str; 5] = [
    "sockets",
    "pod_conntrack",
    "conntrack_dump",
    "ephemeral_ports",
    "oom_kmsg",
];

const SCOPE: [Label; 3] = [
    NAMESPACE,
    POD,
    Label::of("scope", || CONNTRACK_SCOPES.to_vec()),
];
const PROTOCOL: [Label; 3] = [
    NAMESPACE,
    POD,
    Label::of("protocol", || NETNS_PROTOCOLS.to_vec()),
];

/// The node's single series, when the value is known.
fn node<'a>(out: &mut Rows<'a>, v: Option<impl Into<super::Num>>) {
    if let Some(v) = v {
        out.add(&[], v);
    }
}

/// One row per pod that has a value.
fn each<'a, V: Into<super::Num>>(
    s: &'a Published,
    out: &mut Rows<'a>,
    value: impl Fn(&PodSignals) -> Option<V>,
) {
    for p in &s.pods {
        if let Some(v) = value(p) {
            out.add(&pod_id(p), v);
        }
    }
}

pub const FAMILIES: &[Family<Published>] = &[
    Meta {
        name: "node_conntrack_entries",
        ty: Gauge,
        unit: None,
        help: "Entries in the node's conntrack table.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(out, s.node_conntrack.map(|c| c.entries))),
    Meta {
        name: "node_conntrack_limit",
        ty: Gauge,
        unit: None,
        help: "nf_conntrack_max.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(out, s.node_conntrack.map(|c| c.limit))),
    Meta {
        name: "node_conntrack_full_in_seconds",
        ty: Gauge,
        unit: Some(Unit::Seconds),
        help: "Seconds until the node's conntrack table is full at the recent trend; no series while not growing.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(out, s.node_conntrack_full_in_seconds)),
    Meta {
        name: "node_pids",
        ty: Gauge,
        unit: None,
        help: "Tasks in the node's table (nr_threads): threads, kernel threads and zombies.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(out, s.node_pids.map(|p| p.current))),
    Meta {
        name: "node_pids_limit",
        ty: Gauge,
        unit: None,
        help: "The smaller of kernel.pid_max and kernel.threads-max.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(out, s.node_pids.map(|p| p.limit))),
    Meta {
        name: "node_pids_full_in_seconds",
        ty: Gauge,
        unit: Some(Unit::Seconds),
        help: "Seconds until the node's task table is full at the recent trend; no series while not growing.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(out, s.node_pids_full_in_seconds)),
    Meta {
        name: "pod_conntrack_entries",
        ty: Gauge,
        unit: None,
        help: "Conntrack entries of a pod: in its own netns (scope=pod_netns), and in the node's table by pod address (scope=host, only while a dump is fresh).",
        labels: &SCOPE,
        section: S,
    }
    .with_rows(|s, out| {
            for p in &s.pods {
                let [ns, pod] = pod_id(p);
                let by = [p.netns_conntrack_entries, p.host_conntrack_entries];
                for (scope, v) in CONNTRACK_SCOPES.into_iter().zip(by) {
                    if let Some(v) = v {
                        out.add(&[ns, pod, scope], v);
                    }
                }
            }
        }),
    Meta {
        name: "pod_netns_sockets",
        ty: Gauge,
        unit: None,
        help: "Sockets in use in the pod's network namespace (sockstat), whoever holds them.",
        labels: &PROTOCOL,
        section: S,
    }
    .with_rows(|s, out| {
            for p in &s.pods {
                let [ns, pod] = pod_id(p);
                if let Some(n) = &p.netns_sockets {
                    let by = [n.tcp_inuse, n.udp_inuse, n.tcp6_inuse, n.udp6_inuse];
                    for (proto, v) in NETNS_PROTOCOLS.into_iter().zip(by) {
                        out.add(&[ns, pod, proto], v);
                    }
                }
            }
        }),
    Meta {
        name: "pod_ephemeral_ports_available",
        ty: Gauge,
        unit: None,
        help: "Ports of the pod netns's ip_local_port_range minus ip_local_reserved_ports.",
        labels: &POD_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |p| Some(p.ephemeral_ports?.available))),
    Meta {
        name: "pod_ephemeral_ports_used",
        ty: Gauge,
        unit: None,
        help: "Distinct ephemeral ports held by the pod netns's TCP sockets (TIME_WAIT included); only while its sockets reach samplers.ports.trigger of the available ports.",
        labels: &POD_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |p| p.ephemeral_ports?.used)),
    Meta {
        name: "pod_ephemeral_ports_used_top_destination",
        ty: Gauge,
        unit: None,
        help: "Ephemeral ports a connect to the pod's busiest destination cannot take: used towards it, or held by listening and bound-only sockets.",
        labels: &POD_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |p| p.ephemeral_ports?.used_top_destination)),
    Meta {
        name: "pod_netns_tcp_time_wait",
        ty: Gauge,
        unit: None,
        help: "TCP sockets in TIME_WAIT in the pod's network namespace.",
        labels: &POD_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |p| Some(p.netns_sockets?.tcp_time_wait))),
    Meta {
        name: "pod_host_network",
        ty: Gauge,
        unit: None,
        help: "1 for pods sharing the node's network namespace (hostNetwork).",
        labels: &POD_ID,
        section: S,
    }
    .with_rows(|s, out| each(s, out, |p| (p.host_network == Some(true)).then_some(1u64))),
    Meta {
        name: "conntrack_dump_entries",
        ty: Gauge,
        unit: None,
        help: "Entries in the last host-scope conntrack dump.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(out, s.conntrack_dump.as_ref().map(|d| d.entries))),
    Meta {
        name: "conntrack_dump_attributed_entries",
        ty: Gauge,
        unit: None,
        help: "Entries of the last dump matched to a pod address.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(out, s.conntrack_dump.as_ref().map(|d| d.attributed))),
    Meta {
        name: "conntrack_dump_duration_seconds",
        ty: Gauge,
        unit: Some(Unit::Seconds),
        help: "Duration of the last dump.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(out, s.conntrack_dump.as_ref().map(|d| d.duration_seconds))),
    Meta {
        name: "conntrack_dump_age_seconds",
        ty: Gauge,
        unit: Some(Unit::Seconds),
        help: "Seconds since the last dump finished.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(out, s.conntrack_dump.as_ref().map(|d| d.age_seconds))),
    Meta {
        name: "feature_available",
        ty: Gauge,
        unit: None,
        help: "1 when a capability-dependent feature works, 0 when it switched itself off.",
        labels: &[Label::of("feature", || FEATURES.to_vec())],
        section: S,
    }
    .with_rows(|s, out| {
            for f in &s.features {
                out.add(&[f.name], f.available);
            }
        }),
];
