//! Prometheus exposition of the last snapshot through a prometheus-client `Collector`: series
//! exist only for what the snapshot holds, so vanished containers disappear with their cgroups.

use crate::snapshot::{Kind, Snapshot, WorkloadSignals};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::fmt::Error;
use std::sync::{Arc, RwLock};

/// The snapshot shared between the tick loop (writer) and scrapes (readers).
pub type SharedSnapshot = Arc<RwLock<Arc<Snapshot>>>;

pub fn latest(shared: &SharedSnapshot) -> Arc<Snapshot> {
    shared.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Builds the registry: every metric comes from the snapshot collector under `nodeguard_`.
pub fn registry(shared: SharedSnapshot) -> Registry {
    let mut r = Registry::with_prefix("nodeguard");
    r.register_collector(Box::new(SnapshotCollector { shared }));
    r
}

pub fn render(registry: &Registry) -> Result<String, Error> {
    let mut out = String::with_capacity(64 * 1024);
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

#[derive(Debug)]
struct SnapshotCollector {
    shared: SharedSnapshot,
}

pub(crate) type Labels = Vec<(&'static str, String)>;

fn container_labels(snap: &Snapshot, w: &WorkloadSignals) -> Labels {
    let mut l = vec![
        ("namespace", w.id.namespace.clone()),
        ("pod", w.id.pod.clone()),
        ("container", w.id.container.clone()),
    ];
    if !snap.node.is_empty() {
        l.push(("node", snap.node.clone()));
    }
    l
}

fn with(mut l: Labels, k: &'static str, v: impl Into<String>) -> Labels {
    l.push((k, v.into()));
    l
}

/// One metric family: a descriptor, then one sample per label set. Label values go through the
/// encoder, which escapes them: comm, cgroup and pod names are the workload's to choose.
pub(crate) fn family<V>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    ty: MetricType,
    rows: impl IntoIterator<Item = (Labels, V)>,
) -> Result<(), Error>
where
    ConstGauge<V>: EncodeMetric,
    ConstCounter<V>: EncodeMetric,
{
    let mut m = enc.encode_descriptor(name, help, None, ty)?;
    let mut rows = rows.into_iter().peekable();
    while let Some((labels, v)) = rows.next() {
        // A node-level series without labels is written bare, not as `name{}`.
        if labels.is_empty() && rows.peek().is_none() {
            return encode_value(ty, v, m);
        }
        encode_value(ty, v, m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn encode_value<V>(ty: MetricType, v: V, m: MetricEncoder) -> Result<(), Error>
where
    ConstGauge<V>: EncodeMetric,
    ConstCounter<V>: EncodeMetric,
{
    match ty {
        MetricType::Counter => ConstCounter::new(v).encode(m),
        _ => ConstGauge::new(v).encode(m),
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

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), Error> {
        let s = latest(&self.shared);
        let ws = &s.workloads;
        let l = |w: &WorkloadSignals| container_labels(&s, w);
        let node: Labels = if s.node.is_empty() {
            vec![]
        } else {
            vec![("node", s.node.clone())]
        };
        use MetricType::{Counter, Gauge};

        family(
            &mut enc,
            "container_memory_working_set_bytes",
            "Memory usage minus inactive file cache (cAdvisor's working set).",
            Gauge,
            ws.iter()
                .filter_map(|w| Some((l(w), w.memory?.value.working_set_bytes))),
        )?;
        family(
            &mut enc,
            "container_memory_usage_bytes",
            "Memory charged to the cgroup, page cache included.",
            Gauge,
            ws.iter()
                .filter_map(|w| Some((l(w), w.memory?.value.usage_bytes))),
        )?;
        family(
            &mut enc,
            "container_memory_limit_bytes",
            "Memory limit of the cgroup; no series when unlimited.",
            Gauge,
            ws.iter()
                .filter_map(|w| Some((l(w), w.memory?.value.limit_bytes?))),
        )?;
        family(
            &mut enc,
            "container_oom_kills",
            "OOM kills in the workload, kept across container restarts.",
            Counter,
            ws.iter()
                .filter(|w| w.cgroup.is_some() || w.oom_kills_total > 0)
                .map(|w| (l(w), w.oom_kills_total)),
        )?;
        family(
            &mut enc,
            "container_processes",
            "Processes in the workload's cgroup(s).",
            Gauge,
            ws.iter().filter_map(|w| Some((l(w), w.processes?.value))),
        )?;
        family(
            &mut enc,
            "container_pids",
            "Tasks in the workload's pids controller (pids.current): threads and zombies.",
            Gauge,
            ws.iter()
                .filter_map(|w| Some((l(w), w.pids?.value.current))),
        )?;
        family(
            &mut enc,
            "container_pids_limit",
            "pids.max of the workload; no series when unlimited.",
            Gauge,
            ws.iter().filter_map(|w| Some((l(w), w.pids?.value.limit?))),
        )?;
        family(
            &mut enc,
            "container_memory_full_in_seconds",
            "Seconds until the working set reaches the limit at the recent trend; no series while not growing.",
            Gauge,
            ws.iter()
                .filter_map(|w| Some((l(w), w.memory_full_in_seconds?))),
        )?;
        family(
            &mut enc,
            "container_zombies",
            "Zombie processes whose parent is in the workload.",
            Gauge,
            ws.iter().filter_map(|w| Some((l(w), w.zombies?.value))),
        )?;
        family(
            &mut enc,
            "container_zombie_parent_zombies",
            "Zombies held by the workload's non-reaping parents of this comm.",
            Gauge,
            ws.iter().flat_map(|w| {
                zombies_by_parent_comm(w)
                    .into_iter()
                    .map(move |(comm, n)| (with(l(w), "parent_comm", comm), n))
            }),
        )?;
        family(
            &mut enc,
            "container_log_lines",
            "Log lines written by the container, by stream, from the CRI log files.",
            Counter,
            ws.iter().filter(|w| w.pod_uid.is_some()).flat_map(|w| {
                [
                    (with(l(w), "stream", "stdout"), w.log_lines_total.stdout),
                    (with(l(w), "stream", "stderr"), w.log_lines_total.stderr),
                ]
            }),
        )?;
        family(
            &mut enc,
            "container_log_lines_per_minute",
            "Log lines written in the trailing 60 seconds, by stream.",
            Gauge,
            ws.iter().filter(|w| w.pod_uid.is_some()).flat_map(|w| {
                [
                    (
                        with(l(w), "stream", "stdout"),
                        w.log_lines_per_minute.stdout,
                    ),
                    (
                        with(l(w), "stream", "stderr"),
                        w.log_lines_per_minute.stderr,
                    ),
                ]
            }),
        )?;
        family(
            &mut enc,
            "container_restarts",
            "Container restarts seen from new container ids and kubelet log numbers.",
            Counter,
            ws.iter()
                .filter(|w| w.kind == Kind::Container)
                .map(|w| (l(w), w.restarts_total)),
        )?;
        family(
            &mut enc,
            "container_signal_stale",
            "1 when the signal's last read failed and the exported value is the last good one.",
            Gauge,
            ws.iter().flat_map(|w| {
                let mut v = Vec::new();
                if w.memory.is_some_and(|m| m.stale) {
                    v.push((with(l(w), "signal", "memory"), 1u64));
                }
                if w.processes.is_some_and(|m| m.stale) {
                    v.push((with(l(w), "signal", "processes"), 1u64));
                }
                if w.pids.is_some_and(|m| m.stale) {
                    v.push((with(l(w), "signal", "pids"), 1u64));
                }
                v
            }),
        )?;
        family(
            &mut enc,
            "pod_oom_kills",
            "OOM kills in the pod cgroup, counted hierarchically (v2 only).",
            Counter,
            s.pods.iter().filter_map(|p| {
                let mut lb = vec![("namespace", p.namespace.clone()), ("pod", p.pod.clone())];
                lb.extend(node.iter().cloned());
                Some((lb, p.oom_kills_total?))
            }),
        )?;
        let pl = |p: &crate::snapshot::PodSignals| {
            let mut lb: Labels = vec![("namespace", p.namespace.clone()), ("pod", p.pod.clone())];
            lb.extend(node.iter().cloned());
            lb
        };
        family(
            &mut enc,
            "container_sockets",
            "TCP/UDP sockets held by the container's own file descriptors.",
            Gauge,
            ws.iter().flat_map(|w| {
                w.sockets.iter().flat_map(move |s| {
                    [
                        (with(l(w), "protocol", "tcp"), s.value.tcp),
                        (with(l(w), "protocol", "udp"), s.value.udp),
                    ]
                })
            }),
        )?;
        family(
            &mut enc,
            "container_tcp_sockets",
            "TCP sockets held by the container, by state.",
            Gauge,
            ws.iter().flat_map(|w| {
                w.sockets.iter().flat_map(move |s| {
                    s.value
                        .tcp_states
                        .iter()
                        .map(move |(st, n)| (with(l(w), "state", *st), *n))
                })
            }),
        )?;
        family(
            &mut enc,
            "node_conntrack_entries",
            "Entries in the node's conntrack table.",
            Gauge,
            s.node_conntrack.iter().map(|c| (node.clone(), c.entries)),
        )?;
        family(
            &mut enc,
            "node_conntrack_limit",
            "nf_conntrack_max.",
            Gauge,
            s.node_conntrack.iter().map(|c| (node.clone(), c.limit)),
        )?;
        family(
            &mut enc,
            "node_conntrack_full_in_seconds",
            "Seconds until the node's conntrack table is full at the recent trend; no series while not growing.",
            Gauge,
            s.node_conntrack_full_in_seconds
                .map(|v| (node.clone(), v)),
        )?;
        family(
            &mut enc,
            "node_pids",
            "Tasks in the node's table (nr_threads): threads, kernel threads and zombies.",
            Gauge,
            s.node_pids.iter().map(|p| (node.clone(), p.current)),
        )?;
        family(
            &mut enc,
            "node_pids_limit",
            "The smaller of kernel.pid_max and kernel.threads-max.",
            Gauge,
            s.node_pids.iter().map(|p| (node.clone(), p.limit)),
        )?;
        family(
            &mut enc,
            "node_pids_full_in_seconds",
            "Seconds until the node's task table is full at the recent trend; no series while not growing.",
            Gauge,
            s.node_pids_full_in_seconds.map(|v| (node.clone(), v)),
        )?;
        family(&mut enc, "pod_conntrack_entries",
            "Conntrack entries of a pod: in its own netns (scope=pod_netns), and in the node's table by pod address (scope=host, only while a dump is fresh).", Gauge,
            s.pods.iter().flat_map(|p| {
                let own = p.netns_conntrack_entries.map(|v| (with(pl(p), "scope", "pod_netns"), v));
                let host = p.host_conntrack_entries.map(|v| (with(pl(p), "scope", "host"), v));
                own.into_iter().chain(host)
            }))?;
        family(
            &mut enc,
            "pod_netns_sockets",
            "Sockets in use in the pod's network namespace (sockstat), whoever holds them.",
            Gauge,
            s.pods.iter().flat_map(|p| {
                p.netns_sockets.iter().flat_map(move |n| {
                    [
                        (with(pl(p), "protocol", "tcp"), n.tcp_inuse),
                        (with(pl(p), "protocol", "udp"), n.udp_inuse),
                        (with(pl(p), "protocol", "tcp6"), n.tcp6_inuse),
                        (with(pl(p), "protocol", "udp6"), n.udp6_inuse),
                    ]
                })
            }),
        )?;
        family(
            &mut enc,
            "pod_ephemeral_ports_available",
            "Ports of the pod netns's ip_local_port_range minus ip_local_reserved_ports.",
            Gauge,
            s.pods
                .iter()
                .filter_map(|p| Some((pl(p), p.ephemeral_ports?.available))),
        )?;
        family(
            &mut enc,
            "pod_ephemeral_ports_used",
            "Distinct ephemeral ports held by the pod netns's TCP sockets (TIME_WAIT included); only while its sockets reach samplers.ports.trigger of the available ports.",
            Gauge,
            s.pods
                .iter()
                .filter_map(|p| Some((pl(p), p.ephemeral_ports?.used?))),
        )?;
        family(
            &mut enc,
            "pod_ephemeral_ports_used_top_destination",
            "Ephemeral ports a connect to the pod's busiest destination cannot take: used towards it, or held by listening and bound-only sockets.",
            Gauge,
            s.pods
                .iter()
                .filter_map(|p| Some((pl(p), p.ephemeral_ports?.used_top_destination?))),
        )?;
        family(
            &mut enc,
            "pod_netns_tcp_time_wait",
            "TCP sockets in TIME_WAIT in the pod's network namespace.",
            Gauge,
            s.pods
                .iter()
                .filter_map(|p| Some((pl(p), p.netns_sockets?.tcp_time_wait))),
        )?;
        family(
            &mut enc,
            "pod_host_network",
            "1 for pods sharing the node's network namespace (hostNetwork).",
            Gauge,
            s.pods
                .iter()
                .filter(|p| p.host_network == Some(true))
                .map(|p| (pl(p), 1u64)),
        )?;
        family(
            &mut enc,
            "conntrack_dump_entries",
            "Entries in the last host-scope conntrack dump.",
            Gauge,
            s.conntrack_dump.iter().map(|d| (node.clone(), d.entries)),
        )?;
        family(
            &mut enc,
            "conntrack_dump_attributed_entries",
            "Entries of the last dump matched to a pod address.",
            Gauge,
            s.conntrack_dump
                .iter()
                .map(|d| (node.clone(), d.attributed)),
        )?;
        family(
            &mut enc,
            "conntrack_dump_duration_seconds",
            "Duration of the last dump.",
            Gauge,
            s.conntrack_dump
                .iter()
                .map(|d| (node.clone(), d.duration_seconds)),
        )?;
        family(
            &mut enc,
            "conntrack_dump_age_seconds",
            "Seconds since the last dump finished.",
            Gauge,
            s.conntrack_dump
                .iter()
                .map(|d| (node.clone(), d.age_seconds)),
        )?;
        family(
            &mut enc,
            "feature_available",
            "1 when a capability-dependent feature works, 0 when it switched itself off.",
            Gauge,
            s.features.iter().map(|f| {
                (
                    with(node.clone(), "feature", f.name),
                    u64::from(f.available),
                )
            }),
        )?;
        let k = s.kmsg.as_ref();
        family(
            &mut enc,
            "kmsg_records",
            "Kernel log records read (samplers.kmsg).",
            Counter,
            k.map(|k| (node.clone(), k.records_total)),
        )?;
        family(
            &mut enc,
            "kmsg_oom_records",
            "Kernel oom-kill: records in the discovery scopes: credited to a workload (container), naming none (unattributed), cut short (truncated); suppressed: records the kernel's rate limit dropped, node-wide.",
            Counter,
            k.into_iter().flat_map(|k| {
                [
                    ("container", k.oom_attributed_total),
                    ("unattributed", k.oom_unattributed_total),
                    ("truncated", k.oom_truncated_total),
                    ("suppressed", k.oom_suppressed_total),
                ]
                .map(|(r, v)| (with(node.clone(), "result", r), v))
            }),
        )?;
        family(
            &mut enc,
            "kmsg_overruns",
            "Kernel log ring overruns (EPIPE): records overwritten before they were read.",
            Counter,
            k.map(|k| (node.clone(), k.overruns_total)),
        )?;
        family(
            &mut enc,
            "kmsg_read_limited",
            "Ticks whose kernel log pass stopped at samplers.kmsg.max_records_per_tick.",
            Counter,
            k.map(|k| (node.clone(), k.read_limited_total)),
        )?;
        family(
            &mut enc,
            "kmsg_remembered_cgroups",
            "Cgroup paths of recent workloads kept to attribute OOM kills after the cgroup is gone.",
            Gauge,
            k.map(|k| (node.clone(), k.remembered_cgroups)),
        )?;
        family(
            &mut enc,
            "kmsg_remembered_evicted",
            "Remembered cgroup paths dropped at the bound (16,384) before their time.",
            Counter,
            k.map(|k| (node.clone(), k.remembered_evicted_total)),
        )?;
        let bl = |b: &crate::snapshot::BreakerView| {
            let mut lb: Labels = vec![
                ("namespace", b.namespace.clone()),
                ("pod", b.pod.clone()),
                ("container", b.container.clone()),
            ];
            lb.extend(node.iter().cloned());
            with(lb, "rule", b.rule.clone())
        };
        let breakers = s.guard.iter().flat_map(|g| g.breakers.iter());
        family(
            &mut enc,
            "breaker_open",
            "1 while a breaker is open or half-open for the workload and rule.",
            Gauge,
            breakers.clone().map(|b| (bl(b), 1u64)),
        )?;
        family(
            &mut enc,
            "breaker_half_open",
            "1 while the breaker is in probation after its hold.",
            Gauge,
            breakers
                .clone()
                .map(|b| (bl(b), u64::from(b.state == "half_open"))),
        )?;
        family(
            &mut enc,
            "breaker_hold_remaining_seconds",
            "Seconds left in the hold; absent while held until a new revision.",
            Gauge,
            breakers
                .clone()
                .filter_map(|b| Some((bl(b), b.hold_remaining_seconds?))),
        )?;
        family(
            &mut enc,
            "breaker_trips",
            "Times the breaker tripped.",
            Counter,
            breakers.clone().map(|b| (bl(b), b.trips_total)),
        )?;
        family(
            &mut enc,
            "would_act",
            "Dry run: 1 while a breaker would be holding the workload with this action.",
            Gauge,
            breakers
                .clone()
                .filter(|b| b.would_act)
                .map(|b| (with(bl(b), "action", b.action), 1u64)),
        )?;
        family(
            &mut enc,
            "rule_pending_seconds",
            "How long the rule's threshold has held so far on the target.",
            Gauge,
            s.guard.iter().flat_map(|g| g.pending.iter()).map(|p| {
                let mut lb: Labels = vec![
                    ("namespace", p.namespace.clone()),
                    ("pod", p.pod.clone()),
                    ("container", p.container.clone()),
                ];
                lb.extend(node.iter().cloned());
                (with(lb, "rule", p.rule.clone()), p.seconds)
            }),
        )?;
        family(
            &mut enc,
            "actions",
            "Actions taken (or, dry run, decided) by rule, action and outcome.",
            Counter,
            s.guard
                .iter()
                .flat_map(|g| g.actions.iter())
                .map(|(r, a, o, n)| {
                    (
                        with(
                            with(with(node.clone(), "rule", r.clone()), "action", *a),
                            "outcome",
                            *o,
                        ),
                        *n,
                    )
                }),
        )?;
        family(
            &mut enc,
            "dry_run",
            "1 when the guard only reports what it would do.",
            Gauge,
            s.guard.iter().map(|g| (node.clone(), u64::from(g.dry_run))),
        )?;
        family(
            &mut enc,
            "guard_state_durable",
            "1 while the last write of the breaker state file succeeded; no new hold is applied at 0.",
            Gauge,
            s.guard
                .iter()
                .map(|g| (node.clone(), u64::from(g.state_durable))),
        )?;
        family(
            &mut enc,
            "guard_state_write_failures",
            "Writes of the breaker state file that failed.",
            Counter,
            s.guard
                .iter()
                .map(|g| (node.clone(), g.state_write_failures_total)),
        )?;
        family(
            &mut enc,
            "guard_state_quarantined",
            "1 when the state file found at start was unreadable and was kept aside.",
            Gauge,
            s.guard
                .iter()
                .map(|g| (node.clone(), u64::from(g.state_quarantined.is_some()))),
        )?;
        family(
            &mut enc,
            "guard_thaws_pending",
            "Cgroups the agent froze whose thaw failed; retried every tick.",
            Gauge,
            s.guard
                .iter()
                .map(|g| (node.clone(), g.thaws_pending as u64)),
        )?;
        let inp = &s.inputs;
        family(
            &mut enc,
            "log_files_open",
            "Log files the tailer holds open.",
            Gauge,
            inp.log_files_open.map(|n| (node.clone(), n as u64)),
        )?;
        family(
            &mut enc,
            "log_files_skipped",
            "Entries of the pod log tree the last pass did not open, by reason.",
            Gauge,
            [
                ("symlink", inp.log_files_skipped_symlink),
                ("not_regular", inp.log_files_skipped_not_regular),
                ("cap", inp.log_files_skipped_cap),
            ]
            .into_iter()
            .filter(|_| inp.log_files_open.is_some())
            .map(|(r, n)| (with(node.clone(), "reason", r), n as u64)),
        )?;
        family(
            &mut enc,
            "memory_files_open",
            "Cgroup memory files the memory sampler holds open.",
            Gauge,
            inp.memory_files_open.map(|n| (node.clone(), n as u64)),
        )?;
        family(
            &mut enc,
            "memory_files_unheld",
            "Memory files the last pass opened and closed again because the open-file cap was reached.",
            Gauge,
            inp.memory_files_open
                .map(|_| (node.clone(), inp.memory_files_unheld as u64)),
        )?;
        family(
            &mut enc,
            "socket_cache_entries",
            "Socket inodes the socket sampler's per-process cache holds.",
            Gauge,
            inp.socket_cache_entries.map(|n| (node.clone(), n)),
        )?;
        family(
            &mut enc,
            "socket_cache_overflows",
            "Processes or sockets left uncached (walked again next tick) because the cache was full.",
            Counter,
            inp.socket_cache_entries
                .map(|_| (node.clone(), inp.socket_cache_overflows_total)),
        )?;
        family(
            &mut enc,
            "socket_pids",
            "Processes whose fd table the socket sampler's last pass walked, or reused unchanged.",
            Gauge,
            [
                ("walked", inp.socket_pids_walked),
                ("reused", inp.socket_pids_reused),
            ]
            .into_iter()
            .filter(|_| inp.socket_cache_entries.is_some())
            .map(|(r, n)| (with(node.clone(), "pass", r), n)),
        )?;
        family(
            &mut enc,
            "discovery_non_utf8_names",
            "Names that are not UTF-8 in the last scan (kept under an escaped name).",
            Gauge,
            [
                ("cgroup", inp.non_utf8_cgroups),
                ("logs", inp.non_utf8_log_names),
            ]
            .into_iter()
            .map(|(t, n)| (with(node.clone(), "tree", t), n as u64)),
        )?;
        family(
            &mut enc,
            "discovery_skipped_cgroups",
            "Cgroups not walked: too deep or a path too long.",
            Gauge,
            std::iter::once((node.clone(), inp.skipped_cgroups as u64)),
        )?;
        family(
            &mut enc,
            "workloads",
            "Workloads discovered, by kind.",
            Gauge,
            Kind::ALL.iter().map(|k| {
                (
                    with(node.clone(), "kind", k.as_str()),
                    ws.iter()
                        .filter(|w| w.kind == *k && w.cgroup.is_some())
                        .count() as u64,
                )
            }),
        )?;
        family(
            &mut enc,
            "sampler_duration_seconds",
            "Duration of the sampler's last pass.",
            Gauge,
            s.samplers.iter().filter(|x| x.enabled).map(|x| {
                (
                    with(node.clone(), "sampler", x.name),
                    x.last_duration_seconds,
                )
            }),
        )?;
        family(
            &mut enc,
            "sampler_cpu_seconds",
            "CPU time (user+system) spent by each sampler, its helper threads included (per-thread clock).",
            Counter,
            s.samplers.iter().filter(|x| x.enabled).map(|x| {
                (
                    with(node.clone(), "sampler", x.name),
                    x.cpu_seconds_total,
                )
            }),
        )?;
        family(
            &mut enc,
            "sampler_fresh",
            "1 when the sampler succeeded within the last 3 intervals.",
            Gauge,
            s.samplers
                .iter()
                .filter(|x| x.enabled)
                .map(|x| (with(node.clone(), "sampler", x.name), u64::from(x.fresh))),
        )?;
        family(
            &mut enc,
            "sampler_errors",
            "Failed reads by sampler and kind.",
            Counter,
            s.samplers.iter().flat_map(|x| {
                let base = with(node.clone(), "sampler", x.name);
                ["io", "permission", "parse"].into_iter().map(move |k| {
                    let v = x
                        .errors_total
                        .iter()
                        .find(|(n, _)| n == k)
                        .map_or(0, |e| e.1);
                    (with(base.clone(), "kind", k), v)
                })
            }),
        )?;
        family(
            &mut enc,
            "tick_duration_seconds",
            "Duration of the last whole sampling tick.",
            Gauge,
            [(node.clone(), s.agent.tick_duration_seconds)],
        )?;
        family(
            &mut enc,
            "ticks",
            "Sampling ticks completed.",
            Counter,
            [(node.clone(), s.agent.ticks_total)],
        )?;
        family(
            &mut enc,
            "process_resident_memory_bytes",
            "Resident memory of the agent.",
            Gauge,
            [(node.clone(), s.agent.resident_memory_bytes)],
        )?;
        family(
            &mut enc,
            "process_cpu_seconds",
            "CPU time (user+system) used by the agent.",
            Counter,
            [(node.clone(), s.agent.cpu_seconds_total)],
        )?;
        family(
            &mut enc,
            "process_open_fds",
            "Open file descriptors of the agent.",
            Gauge,
            [(node.clone(), s.agent.open_fds)],
        )?;
        family(
            &mut enc,
            "build_info",
            "Agent version, source revision and the cgroup layout it detected.",
            Gauge,
            [(
                with(
                    with(
                        with(node.clone(), "version", env!("CARGO_PKG_VERSION")),
                        "revision",
                        super::info::REVISION,
                    ),
                    "cgroup_layout",
                    s.cgroup_layout.clone(),
                ),
                1u64,
            )],
        )?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
