//! The Grafana dashboard, from a table of panels: per node, the top containers by each symptom,
//! the guard's breakers and actions, and the agent's own cost and health. Queries select with
//! `@N` (the cluster and node variables) or `@W` (and namespace), expanded here so every panel
//! filters the same way; aggregations by node keep the cluster apart. Annotations mark breaker
//! transitions on every time series panel. scripts/e2e-vmalert evaluates every query and
//! annotation against a real VictoriaMetrics.

use serde_json::{json, Value};
use std::fmt::Write as _;

pub const JSON_PATH: &str = "dashboards/nodeguard.json";
pub const UID: &str = "nodeguard";

#[derive(Clone, Copy, PartialEq)]
enum Viz {
    Timeseries,
    Stat,
    Table,
}

struct Target {
    expr: &'static str,
    legend: &'static str,
}

struct Panel {
    title: &'static str,
    description: &'static str,
    viz: Viz,
    unit: &'static str,
    width: u32,
    targets: Vec<Target>,
    /// Stat value mappings (value, text, colour).
    mappings: &'static [(&'static str, &'static str, &'static str)],
    /// A red threshold, where the shipped alert starts.
    red_above: Option<f64>,
}

struct Row {
    title: &'static str,
    panels: Vec<Panel>,
}

fn t(expr: &'static str, legend: &'static str) -> Target {
    Target { expr, legend }
}

fn panel(title: &'static str, viz: Viz, unit: &'static str, width: u32) -> Panel {
    Panel {
        title,
        description: "",
        viz,
        unit,
        width,
        targets: Vec::new(),
        mappings: &[],
        red_above: None,
    }
}

impl Panel {
    fn desc(mut self, d: &'static str) -> Self {
        self.description = d;
        self
    }
    fn q(mut self, expr: &'static str, legend: &'static str) -> Self {
        self.targets.push(t(expr, legend));
        self
    }
    fn red(mut self, v: f64) -> Self {
        self.red_above = Some(v);
        self
    }
    fn map(mut self, m: &'static [(&'static str, &'static str, &'static str)]) -> Self {
        self.mappings = m;
        self
    }
}

const WL: &str = "{{node}} {{namespace}}/{{pod}}/{{container}}";
const POD: &str = "{{node}} {{namespace}}/{{pod}}";
const NODE: &str = "{{node}}";

fn rows() -> Vec<Row> {
    use Viz::*;
    vec![
        Row {
            title: "Nodes",
            panels: vec![
                panel("Mode", Stat, "none", 4)
                    .desc("DRY-RUN: the guard only reports (nodeguard_would_act). ENFORCING: it freezes and kills.")
                    .q("max by (node) (nodeguard_dry_run{@N})", NODE)
                    .map(&[("1", "DRY-RUN", "blue"), ("0", "ENFORCING", "orange")]),
                panel("Scrape up", Stat, "none", 4)
                    .q("max by (node) (up{job=\"nodeguard\", @N})", NODE)
                    .map(&[("1", "UP", "green"), ("0", "DOWN", "red")]),
                panel("Workloads", Stat, "none", 4)
                    .q("sum by (node, kind) (nodeguard_workloads{@N})", "{{node}} {{kind}}"),
                panel("Open breakers", Stat, "none", 4)
                    .desc("Breakers open or half-open (in dry-run they are open on paper only).")
                    .q(
                        "sum by (node) (nodeguard_breaker_open{@N}) or sum by (node) (0 * nodeguard_dry_run{@N})",
                        NODE,
                    )
                    .red(1.0),
                panel("Node conntrack table used", Timeseries, "percentunit", 8)
                    .desc("nf_conntrack_count / nf_conntrack_max of each node; NodeguardNodeConntrackNearFull above 80 %.")
                    .q(
                        "max by (node) (nodeguard_node_conntrack_entries{@N} / nodeguard_node_conntrack_limit{@N})",
                        NODE,
                    )
                    .red(0.8),
            ],
        },
        Row {
            title: "Top containers by symptom (per node)",
            panels: vec![
                panel("Sockets (TCP + UDP)", Timeseries, "short", 8)
                    .desc("Sockets held by each container's own fds. NodeguardContainerSocketStorm above 5000.")
                    .q("topk by (node) (10, sum without (protocol) (nodeguard_container_sockets{@W}))", WL)
                    .red(5000.0),
                panel("Log lines per minute", Timeseries, "short", 8)
                    .desc("stdout + stderr, trailing minute. NodeguardContainerLogFlood above 1000.")
                    .q("topk by (node) (10, sum without (stream) (nodeguard_container_log_lines_per_minute{@W}))", WL)
                    .red(1000.0),
                panel("Memory working set vs limit", Timeseries, "percentunit", 8)
                    .desc("Containers with a limit. NodeguardContainerMemoryNearLimit above 85 %.")
                    .q(
                        "topk by (node) (10, nodeguard_container_memory_working_set_bytes{@W} / nodeguard_container_memory_limit_bytes{@W})",
                        WL,
                    )
                    .red(0.85),
                panel("Zombies", Timeseries, "short", 8)
                    .desc("Exited children not reaped by a process of the container.")
                    .q("topk by (node) (10, nodeguard_container_zombies{@W} > 0)", WL)
                    .red(5.0),
                panel("Conntrack share of the node's table (pods)", Timeseries, "percentunit", 8)
                    .desc("The larger of the pod's own-netns count and its host-table entries (dump), over nf_conntrack_max. NodeguardPodConntrackHog above 25 %.")
                    .q(
                        "topk by (node) (10, max without (scope) (nodeguard_pod_conntrack_entries{@W}) / on (node) group_left () max by (node) (nodeguard_node_conntrack_limit{@N}))",
                        POD,
                    )
                    .red(0.25),
                panel("Restarts in range", Table, "short", 8)
                    .desc("Restarts (kubelet log numbers, new container ids) within the dashboard's time range.")
                    .q("topk by (node) (10, increase(nodeguard_container_restarts_total{@W}[$__range]) > 0)", WL),
                panel("OOM kills in range", Table, "short", 8)
                    .desc("Container OOM kills within the time range; pod-level (cgroup v2 only) below them.")
                    .q("topk by (node) (10, increase(nodeguard_container_oom_kills_total{@W}[$__range]) > 0)", WL)
                    .q("topk by (node) (10, increase(nodeguard_pod_oom_kills_total{@W}[$__range]) > 0)", POD),
                panel("Memory working set", Timeseries, "bytes", 8)
                    .q("topk by (node) (10, nodeguard_container_memory_working_set_bytes{@W})", WL)
                    .q("topk by (node) (3, nodeguard_container_memory_usage_bytes{@W})", "usage {{node}} {{namespace}}/{{pod}}/{{container}}"),
                panel("Processes", Timeseries, "short", 8)
                    .q("topk by (node) (10, nodeguard_container_processes{@W})", WL),
                panel("Zombie parents", Table, "short", 8)
                    .desc("Zombies held per non-reaping parent command (pids: /api/state).")
                    .q("topk by (node) (10, nodeguard_container_zombie_parent_zombies{@W})", WL),
                panel("TCP sockets by state", Timeseries, "short", 8)
                    .desc("Needs samplers.sockets.tcp_states: true (off by default: it reads every socket's state).")
                    .q("sum by (node, state) (nodeguard_container_tcp_sockets{@W})", "{{node}} {{state}}"),
                panel("Pod network namespaces", Timeseries, "short", 8)
                    .desc("Sockets in use and TIME_WAIT in each pod's own netns (hostNetwork pods are the node's: listed as such).")
                    .q("topk by (node) (10, sum without (protocol) (nodeguard_pod_netns_sockets{@W}))", POD)
                    .q("topk by (node) (10, nodeguard_pod_netns_tcp_time_wait{@W})", "time_wait {{node}} {{namespace}}/{{pod}}")
                    .q("count by (node) (nodeguard_pod_host_network{@W} == 1)", "hostNetwork pods {{node}}"),
                panel("Log lines (total, by stream)", Timeseries, "short", 8)
                    .q(
                        "topk by (node) (10, sum by (node, namespace, pod, container, stream) (rate(nodeguard_container_log_lines_total{@W}[$__rate_interval])) * 60)",
                        "{{node}} {{namespace}}/{{pod}}/{{container}} {{stream}}",
                    ),
            ],
        },
        Row {
            title: "Guard: breakers and actions",
            panels: vec![
                panel("Breakers", Table, "s", 12)
                    .desc("Open (1) and half-open (probation) breakers, hold left, and dry-run decisions (would act).")
                    .q("nodeguard_breaker_open{@W} > 0", WL)
                    .q("nodeguard_breaker_half_open{@W} > 0", WL)
                    .q("nodeguard_breaker_hold_remaining_seconds{@W}", WL)
                    .q("nodeguard_would_act{@W} > 0", WL),
                panel("Rules pending", Table, "s", 12)
                    .desc("How long each guard rule's threshold has held so far (node rules: container=\"node\").")
                    .q("nodeguard_rule_pending_seconds{@W}", WL),
                panel("Breaker trips", Table, "short", 8)
                    .q("nodeguard_breaker_trips_total{@W}", WL),
                panel("Actions", Table, "short", 8)
                    .desc("Since the agent started, by rule, action and outcome (dry_run: decided, not done).")
                    .q("sum by (node, rule, action, outcome) (nodeguard_actions_total{@N})", "{{node}} {{rule}} {{action}} {{outcome}}"),
                panel("Guard state", Stat, "none", 8)
                    .desc("Owner of the state (1; 0: another agent holds its lock, the guard acts on nothing), state file durable (1), failed writes, quarantined at start, thaws pending, cgroups held as the kernel confirms, held cgroups thawed by another hand, frozen cgroups no breaker claimed (should stay 0).")
                    .q("min by (node) (nodeguard_guard_state_owner{@N})", "owner {{node}}")
                    .q("min by (node) (nodeguard_guard_state_durable{@N})", "durable {{node}}")
                    .q("sum by (node) (nodeguard_guard_state_write_failures_total{@N})", "write failures {{node}}")
                    .q("max by (node) (nodeguard_guard_state_quarantined{@N})", "quarantined {{node}}")
                    .q("sum by (node) (nodeguard_guard_thaws_pending{@N})", "thaws pending {{node}}")
                    .q("sum by (node) (nodeguard_guard_held_cgroups{@N})", "held {{node}}")
                    .q("sum by (node) (nodeguard_guard_foreign_thaws_total{@N})", "foreign thaws {{node}}")
                    .q("sum by (node) (nodeguard_guard_unclaimed_thaws_total{@N})", "unclaimed thaws {{node}}")
                    .q("sum by (node) (nodeguard_guard_limits_held{@N})", "limits held {{node}}")
                    .q("sum by (node) (nodeguard_guard_limits_reasserted_total{@N})", "limits set again {{node}}"),
                panel("Alert webhook", Stat, "none", 8)
                    .desc("Breaker alerts POSTed to guard.webhook_url (sent, failed), events dropped (queue full, table full), alerts firing and re-sent.")
                    .q("sum by (node, result) (nodeguard_webhook_posts_total{@N})", "{{result}} {{node}}")
                    .q("sum by (node, reason) (nodeguard_webhook_dropped_total{@N})", "dropped {{reason}} {{node}}")
                    .q("sum by (node) (nodeguard_webhook_active_alerts{@N})", "firing {{node}}"),
            ],
        },
        Row {
            title: "Exhaustion: tasks, ports, time to full",
            panels: vec![
                panel("Tasks per container", Timeseries, "short", 8)
                    .desc("pids.current: threads and zombies, not processes; and the share of pids.max where one is set.")
                    .q("topk by (node) (10, nodeguard_container_pids{@W})", WL)
                    .q(
                        "topk by (node) (10, nodeguard_container_pids{@W} / nodeguard_container_pids_limit{@W})",
                        "of limit {{node}} {{namespace}}/{{pod}}/{{container}}",
                    ),
                panel("Node task table used", Timeseries, "percentunit", 8)
                    .desc("Threads and zombies of the node over min(kernel.pid_max, kernel.threads-max).")
                    .q(
                        "max by (node) (nodeguard_node_pids{@N} / nodeguard_node_pids_limit{@N})",
                        NODE,
                    )
                    .red(0.8),
                panel("Ephemeral ports used (pods)", Timeseries, "percentunit", 8)
                    .desc("Of the pod netns's port range less reserved ports: all ports (bind) and towards its busiest destination (connect). Counted only above samplers.ports.trigger. NodeguardPodEphemeralPortsExhausted above 90 %.")
                    .q(
                        "topk by (node) (10, nodeguard_pod_ephemeral_ports_used_top_destination{@W} / nodeguard_pod_ephemeral_ports_available{@W})",
                        "top destination {{node}} {{namespace}}/{{pod}}",
                    )
                    .q(
                        "topk by (node) (10, nodeguard_pod_ephemeral_ports_used{@W} / nodeguard_pod_ephemeral_ports_available{@W})",
                        POD,
                    )
                    .red(0.9),
                panel("Time to full", Table, "s", 8)
                    .desc("Projected from the last 5 minutes of samples (line or doubling); absent while nothing grows. The *FullSoon alerts fire under 4 h for 10 minutes.")
                    .q("nodeguard_node_conntrack_full_in_seconds{@N}", "conntrack {{node}}")
                    .q("nodeguard_node_pids_full_in_seconds{@N}", "tasks {{node}}")
                    .q("topk by (node) (10, nodeguard_container_memory_full_in_seconds{@W})", "memory {{node}} {{namespace}}/{{pod}}/{{container}}"),
            ],
        },
        Row {
            title: "Agent: cost and health",
            panels: vec![
                panel("CPU", Timeseries, "percentunit", 6)
                    .desc("Fraction of one core (the DaemonSet's limit is 0.5).")
                    .q("rate(nodeguard_process_cpu_seconds_total{@N}[$__rate_interval])", NODE),
                panel("Resident memory", Timeseries, "bytes", 6)
                    .q("nodeguard_process_resident_memory_bytes{@N}", NODE),
                panel("Tick", Timeseries, "s", 6)
                    .desc("Last tick's duration, ticks per second, and the last tick's age against the bound past which the loop counts as stalled (NodeguardTickStalled).")
                    .q("nodeguard_tick_duration_seconds{@N}", "duration {{node}}")
                    .q("rate(nodeguard_ticks_total{@N}[$__rate_interval])", "ticks/s {{node}}")
                    .q("nodeguard_agent_last_tick_age_seconds{@N}", "age {{node}}")
                    .q("nodeguard_agent_tick_stall_bound_seconds{@N}", "stall bound {{node}}"),
                panel("Sampler duration", Timeseries, "s", 6)
                    .q("nodeguard_sampler_duration_seconds{@N}", "{{node}} {{sampler}}"),
                panel("Sampler CPU", Timeseries, "percentunit", 6)
                    .desc("Fraction of one core each sampler uses, helper threads included; the gap to the agent's CPU is signals, rules and export.")
                    .q("rate(nodeguard_sampler_cpu_seconds_total{@N}[$__rate_interval])", "{{node}} {{sampler}}"),
                panel("Socket cache", Timeseries, "short", 6)
                    .desc("Processes re-walked vs reused by the last socket pass, cached socket inodes, and refusals at the bound (then walked every tick).")
                    .q("nodeguard_socket_pids{@N}", "{{node}} {{pass}}")
                    .q("nodeguard_socket_cache_entries{@N}", "entries {{node}}")
                    .q("rate(nodeguard_socket_cache_overflows_total{@N}[$__rate_interval])", "overflows/s {{node}}"),
                panel("Samplers", Table, "short", 8)
                    .desc("Fresh (1) within 3 intervals, failed reads in range, containers showing last-good values.")
                    .q("nodeguard_sampler_fresh{@N}", "{{node}} {{sampler}}")
                    .q("sum by (node, sampler, kind) (increase(nodeguard_sampler_errors_total{@N}[$__range]))", "{{node}} {{sampler}} {{kind}}")
                    .q("count by (node, signal) (nodeguard_container_signal_stale{@W} == 1)", "stale {{node}} {{signal}}"),
                panel("Features", Table, "short", 8)
                    .desc("0: switched off (missing capability or kernel module): NodeguardFeatureUnavailable.")
                    .q("nodeguard_feature_available{@N}", "{{node}} {{feature}}"),
                panel("Build", Table, "short", 8)
                    .q("nodeguard_build_info{@N}", "{{node}} {{version}} {{revision}} {{cgroup_layout}}"),
                panel("Config", Table, "short", 8)
                    .desc("The config hash live on each node (compare with Git), reloads, refused reloads, and whether a changed key waits for a restart.")
                    .q("nodeguard_config_info{@N}", "{{node}} {{hash}}")
                    .q("nodeguard_config_last_reload_success{@N}", "last reload ok {{node}}")
                    .q("time() - nodeguard_config_last_reload_success_timestamp_seconds{@N}", "since last good reload {{node}}")
                    .q("increase(nodeguard_config_reloads_total{@N}[$__range])", "reloads {{node}}")
                    .q("increase(nodeguard_config_reload_failures_total{@N}[$__range])", "refused {{node}}")
                    .q("nodeguard_config_restart_required{@N}", "restart required {{node}}"),
                panel("Files held", Timeseries, "short", 8)
                    .desc("Open fds against what the readers hold: log files, cgroup memory and pids files (and those read unheld past the caps), entries the log tailer skipped, and files refused for not being regular files (a FIFO planted as the config, a log or a release request).")
                    .q("nodeguard_process_open_fds{@N}", "open fds {{node}}")
                    .q("nodeguard_log_files_open{@N}", "log files open {{node}}")
                    .q("nodeguard_log_files_skipped{@N}", "skipped {{node}} {{reason}}")
                    .q("increase(nodeguard_files_not_regular_total{@N}[$__range])", "not regular {{node}} {{reader}}")
                    .q("nodeguard_memory_files_open{@N}", "memory files open {{node}}")
                    .q("nodeguard_memory_files_unheld{@N}", "memory files unheld {{node}}")
                    .q("nodeguard_pids_files_open{@N}", "pids files open {{node}}")
                    .q("nodeguard_pids_files_unheld{@N}", "pids cgroups unheld {{node}}"),
                panel("Cgroup discovery", Timeseries, "short", 8)
                    .desc("The kept cgroup tree: directories held open (and kept past the cap without a descriptor), without an inotify watch (listed every scan), listed by the last scan; inotify queue overflows (each re-lists the whole tree once).")
                    .q("nodeguard_discovery_dirs_held{@N}", "held {{node}}")
                    .q("nodeguard_discovery_dirs_unheld{@N}", "unheld {{node}}")
                    .q("nodeguard_discovery_dirs_unwatched{@N}", "unwatched {{node}}")
                    .q("nodeguard_discovery_dirs_listed{@N}", "listed {{node}}")
                    .q("increase(nodeguard_discovery_watch_overflows_total{@N}[$__rate_interval])", "overflows {{node}}"),
                panel("HTTP server", Timeseries, "short", 8)
                    .desc("Connections against the cap, and connections refused, timed out or evicted (at the cap, to let a new one in) per second; responses cut (a reader too many snapshots behind).")
                    .q("nodeguard_http_connections{@N}", "open {{node}}")
                    .q("nodeguard_http_connections_max{@N}", "cap {{node}}")
                    .q("rate(nodeguard_http_connections_rejected_total{@N}[$__rate_interval])", "rejected/s {{node}}")
                    .q("sum by (node, reason) (rate(nodeguard_http_connections_timed_out_total{@N}[$__rate_interval]))", "timed out/s {{node}} {{reason}}")
                    .q("rate(nodeguard_http_accept_errors_total{@N}[$__rate_interval])", "accept errors/s {{node}}")
                    .q("rate(nodeguard_http_connections_evicted_total{@N}[$__rate_interval])", "evicted/s {{node}}")
                    .q("rate(nodeguard_http_responses_cut_total{@N}[$__rate_interval])", "cut/s {{node}}"),
                panel("HTTP bodies", Timeseries, "bytes", 8)
                    .desc("Rendered /metrics and /api/state bodies alive, shared by their readers (at most about 2 x (http.response_generations + 1) bodies with one /metrics format scraped, 3 x with both).")
                    .q("nodeguard_http_response_bodies_bytes{@N}", "{{node}}"),
                panel("Discovery", Timeseries, "short", 8)
                    .desc("Names that are not UTF-8, and cgroups not walked (too deep or path too long).")
                    .q("nodeguard_discovery_non_utf8_names{@N}", "non-UTF-8 {{node}} {{tree}}")
                    .q("nodeguard_discovery_skipped_cgroups{@N}", "skipped cgroups {{node}}"),
                panel("Kernel log (OOM kills)", Timeseries, "short", 12)
                    .desc("oom-kill: records read from /dev/kmsg per second by result; ring overruns (records lost) and passes cut by samplers.kmsg.max_records_per_tick; cgroup paths remembered for attribution.")
                    .q("sum by (node, result) (rate(nodeguard_kmsg_oom_records_total{@N}[$__rate_interval]))", "{{node}} {{result}}")
                    .q("rate(nodeguard_kmsg_overruns_total{@N}[$__rate_interval])", "overruns/s {{node}}")
                    .q("rate(nodeguard_kmsg_read_limited_total{@N}[$__rate_interval])", "limited passes/s {{node}}")
                    .q("rate(nodeguard_kmsg_records_total{@N}[$__rate_interval])", "records/s {{node}}")
                    .q("nodeguard_kmsg_remembered_cgroups{@N}", "remembered cgroups {{node}}")
                    .q("increase(nodeguard_kmsg_remembered_evicted_total{@N}[$__rate_interval])", "evicted early {{node}}"),
                panel("Conntrack dump", Timeseries, "short", 12)
                    .desc("The host-table dump that attributes entries to pods (only above samplers.conntrack.dump_trigger).")
                    .q("nodeguard_conntrack_dump_entries{@N}", "entries {{node}}")
                    .q("nodeguard_conntrack_dump_attributed_entries{@N}", "attributed {{node}}")
                    .q("nodeguard_conntrack_dump_duration_seconds{@N}", "duration s {{node}}")
                    .q("nodeguard_conntrack_dump_age_seconds{@N}", "age s {{node}}"),
            ],
        },
    ]
}

/// The selectors, and `cluster` beside every `node` grouping: two clusters may name a node alike.
/// A metric without a `cluster` label (one cluster, no external label) matches `cluster=~".*"`,
/// the variable's All value, and groups as before.
fn expand(expr: &str) -> String {
    expr.replace(
        "@W",
        "cluster=~\"$cluster\", node=~\"$node\", namespace=~\"$namespace\"",
    )
    .replace("@N", "cluster=~\"$cluster\", node=~\"$node\"")
    .replace("by (node", "by (cluster, node")
    .replace("on (node)", "on (cluster, node)")
}

/// Breaker transitions, one annotation stream each, evaluated every minute (`step`, which the
/// `offset` matches): a trip (the breaker appears, or its trip count moves while it stays open),
/// the end of a hold (half-open, probation), and the close (the breaker is gone while the agent
/// still reports, so an agent that stopped closes nothing).
const ANNOTATIONS: [(&str, &str, &str, &str); 3] = [
    (
        "Breaker tripped",
        "red",
        "(nodeguard_breaker_open{@W} unless nodeguard_breaker_open{@W} offset 1m) or (changes(nodeguard_breaker_trips_total{@W}[1m]) > 0)",
        "{{rule}} tripped",
    ),
    (
        "Breaker half-open",
        "orange",
        "(nodeguard_breaker_half_open{@W} == 1) unless (nodeguard_breaker_half_open{@W} offset 1m == 1)",
        "{{rule}} half-open (probation)",
    ),
    (
        "Breaker closed",
        "green",
        "(nodeguard_breaker_open{@W} offset 1m unless nodeguard_breaker_open{@W}) and on (node) nodeguard_build_info{@N}",
        "{{rule}} closed",
    ),
];

fn annotations() -> Vec<Value> {
    let mut list = vec![json!({
        "name": "Annotations & Alerts", "builtIn": 1, "type": "dashboard", "enable": true,
        "hide": true, "iconColor": "rgba(0, 211, 255, 1)",
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
    })];
    for (name, color, expr, title) in ANNOTATIONS {
        list.push(json!({
            "name": name,
            "datasource": datasource(),
            "enable": true,
            "hide": false,
            "iconColor": color,
            "expr": expand(expr),
            "step": "1m",
            "titleFormat": title,
            "textFormat": "{{node}} {{namespace}}/{{pod}}/{{container}}",
            "tagKeys": "node,namespace,pod,rule",
            "useValueForTime": false,
        }));
    }
    list
}

fn datasource() -> Value {
    json!({"type": "prometheus", "uid": "${datasource}"})
}

fn panel_json(p: &Panel, id: u32, x: u32, y: u32, h: u32) -> Value {
    let instant = p.viz == Viz::Table;
    let targets: Vec<Value> = p
        .targets
        .iter()
        .enumerate()
        .map(|(i, tg)| {
            json!({
                "datasource": datasource(),
                "refId": ((b'A' + i as u8) as char).to_string(),
                "expr": expand(tg.expr),
                "legendFormat": tg.legend,
                "instant": instant,
                "range": !instant,
                "format": if instant { "table" } else { "time_series" },
            })
        })
        .collect();
    let mut steps = vec![json!({"color": "green", "value": null})];
    if let Some(v) = p.red_above {
        steps.push(json!({"color": "red", "value": v}));
    }
    let mappings: Vec<Value> = if p.mappings.is_empty() {
        Vec::new()
    } else {
        let opts: serde_json::Map<String, Value> = p
            .mappings
            .iter()
            .enumerate()
            .map(|(i, (v, text, color))| {
                (
                    (*v).to_owned(),
                    json!({"text": text, "color": color, "index": i}),
                )
            })
            .collect();
        vec![json!({"type": "value", "options": opts})]
    };
    let (kind, options, transformations) = match p.viz {
        Viz::Timeseries => (
            "timeseries",
            json!({"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]},
                   "tooltip": {"mode": "multi", "sort": "desc"}}),
            json!([]),
        ),
        Viz::Stat => (
            "stat",
            json!({"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": false},
                   "colorMode": "background", "graphMode": "none", "textMode": "auto"}),
            json!([]),
        ),
        Viz::Table => (
            "table",
            json!({"showHeader": true, "sortBy": [{"displayName": "Value", "desc": true}]}),
            json!([{"id": "merge", "options": {}},
                   {"id": "organize", "options": {"excludeByName": {"Time": true, "__name__": true, "job": true, "instance": true}}}]),
        ),
    };
    json!({
        "id": id,
        "type": kind,
        "title": p.title,
        "description": p.description,
        "datasource": datasource(),
        "gridPos": {"h": h, "w": p.width, "x": x, "y": y},
        "targets": targets,
        "options": options,
        "transformations": transformations,
        "fieldConfig": {
            "defaults": {
                "unit": p.unit,
                "mappings": mappings,
                "thresholds": {"mode": "absolute", "steps": steps},
                "color": {"mode": if p.viz == Viz::Timeseries { "palette-classic" } else { "thresholds" }},
            },
            "overrides": [],
        },
    })
}

fn variable(name: &str, label: &str, query: &str) -> Value {
    json!({
        "name": name,
        "label": label,
        "type": "query",
        "datasource": datasource(),
        "definition": query,
        "query": {"query": query, "refId": name},
        "refresh": 2,
        "includeAll": true,
        "multi": true,
        "allValue": ".*",
        "current": {"selected": true, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    })
}

/// The whole dashboard model.
pub fn dashboard() -> Value {
    let mut panels = Vec::new();
    let (mut id, mut y) = (1u32, 0u32);
    for row in rows() {
        panels.push(json!({
            "id": id, "type": "row", "title": row.title, "collapsed": false,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": [],
        }));
        id += 1;
        y += 1;
        let mut x = 0;
        for p in &row.panels {
            let h = if p.viz == Viz::Stat { 4 } else { 8 };
            if x + p.width > 24 {
                x = 0;
                y += 8;
            }
            panels.push(panel_json(p, id, x, y, h));
            id += 1;
            x += p.width;
        }
        y += 8;
    }
    json!({
        "uid": UID,
        "title": "nodeguard",
        "description": "Per-node symptoms of runaway containers, nodeguard's breakers and actions, and the agent's own cost (docs/metrics.md).",
        "tags": ["nodeguard", "kubernetes"],
        "timezone": "",
        "editable": true,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "annotations": {"list": annotations()},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1, "regex": "", "includeAll": false, "multi": false},
            // Every agent exports nodeguard_build_info; `cluster` is the label a multi-cluster
            // setup adds (vmagent/Prometheus external labels). Without it the variable offers
            // only All (`.*`), which matches series without the label.
            variable("cluster", "Cluster", "label_values(nodeguard_build_info, cluster)"),
            variable("node", "Node", "label_values(nodeguard_build_info{cluster=~\"$cluster\"}, node)"),
            variable("namespace", "Namespace", "label_values(nodeguard_container_processes{cluster=~\"$cluster\", node=~\"$node\"}, namespace)"),
        ]},
        "panels": panels,
    })
}

/// The dashboard as the file Grafana imports: pretty JSON, one trailing newline.
pub fn render_json() -> String {
    let mut s = serde_json::to_string_pretty(&dashboard()).expect("a json! value serializes");
    s.push('\n');
    s
}

/// The ConfigMap the Grafana sidecar loads (label grafana_dashboard: "1").
pub fn render_configmap(json: &str) -> String {
    let mut out = String::from(
        "# GENERATED from dashboards/nodeguard.json by `cargo run --bin nodeguard-gen`: edit\n\
         # src/bin/nodeguard-gen/dashboard.rs, not this file (scripts/ship-check fails on drift).\n\
         # The Grafana sidecar loads every ConfigMap labelled grafana_dashboard: \"1\" in the\n\
         # namespaces it watches (docs/deploy.md, \"Dashboard\").\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: nodeguard-dashboard\n  namespace: nodeguard\n  \
         labels:\n    app.kubernetes.io/name: nodeguard\n    grafana_dashboard: \"1\"\ndata:\n  nodeguard.json: |\n",
    );
    for line in json.lines() {
        let _ = writeln!(out, "    {line}");
    }
    out
}

/// Families (by the names queries use) that no panel queries.
pub fn uncovered<'a>(names: impl IntoIterator<Item = &'a str>, dash: &Value) -> Vec<String> {
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_owned))
        .collect();
    let mut missing = Vec::new();
    for name in names {
        let used = exprs.iter().any(|e| {
            e.match_indices(name).any(|(i, _)| {
                let after = e[i + name.len()..].bytes().next();
                !after.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
            })
        });
        if !used && !missing.iter().any(|m| m == name) {
            missing.push(name.to_owned());
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_panel_queries_through_the_variables() {
        let d = dashboard();
        let mut ids = Vec::new();
        for p in d["panels"].as_array().unwrap() {
            ids.push(p["id"].as_u64().unwrap());
            let g = &p["gridPos"];
            assert!(
                g["x"].as_u64().unwrap() + g["w"].as_u64().unwrap() <= 24,
                "{}",
                p["title"]
            );
            if p["type"] == "row" {
                continue;
            }
            assert_eq!(p["datasource"]["uid"], "${datasource}");
            let targets = p["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "{} has no query", p["title"]);
            for t in targets {
                let e = t["expr"].as_str().unwrap();
                assert!(
                    e.contains("cluster=~\"$cluster\", node=~\"$node\""),
                    "{}: {e} ignores $cluster or $node",
                    p["title"]
                );
                assert!(
                    !e.contains("by (node") && !e.contains("on (node"),
                    "{e}: groups nodes of different clusters together"
                );
                assert!(!e.contains('@'), "{e}: unexpanded selector");
                if e.contains("nodeguard_container_") {
                    assert!(
                        e.contains("namespace=~\"$namespace\""),
                        "{e} ignores $namespace"
                    );
                }
            }
        }
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), n, "panel ids unique");
        let vars: Vec<&str> = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(vars, ["datasource", "cluster", "node", "namespace"]);
        for v in &d["templating"]["list"].as_array().unwrap()[1..] {
            assert_eq!(v["includeAll"], true);
            assert_eq!(v["allValue"], ".*", "All must match a missing label");
        }
    }

    #[test]
    fn breaker_transitions_are_annotated() {
        let d = dashboard();
        let list = d["annotations"]["list"].as_array().unwrap();
        let names: Vec<&str> = list.iter().map(|a| a["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "Annotations & Alerts",
                "Breaker tripped",
                "Breaker half-open",
                "Breaker closed"
            ]
        );
        for a in &list[1..] {
            let e = a["expr"].as_str().unwrap();
            assert!(!e.contains('@'), "{e}: unexpanded selector");
            assert!(e.contains("nodeguard_breaker_"), "{e}");
            assert!(
                e.matches("cluster=~\"$cluster\", node=~\"$node\"").count()
                    == e.matches('{').count() - e.matches("{{").count(),
                "{e}: every selector filters by cluster and node"
            );
            assert_eq!(a["datasource"]["uid"], "${datasource}");
            assert_eq!(a["step"], "1m");
        }
        assert!(list[3]["expr"].as_str().unwrap().ends_with(
            "and on (cluster, node) nodeguard_build_info{cluster=~\"$cluster\", node=~\"$node\"}"
        ));
    }

    #[test]
    fn every_documented_family_is_on_the_dashboard() {
        let names = nodeguard::export::catalog::exposed_names();
        assert_eq!(
            uncovered(names.iter().map(String::as_str), &dashboard()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn uncovered_matches_whole_names_only() {
        let d =
            json!({"panels": [{"targets": [{"expr": "nodeguard_ticks_total{node=~\"$node\"}"}]}]});
        let names = [
            "nodeguard_ticks_total",
            "nodeguard_ticks",
            "nodeguard_other",
        ];
        assert_eq!(uncovered(names, &d), ["nodeguard_ticks", "nodeguard_other"]);
    }

    #[test]
    fn configmap_holds_the_json_verbatim() {
        let json = render_json();
        let cm = render_configmap(&json);
        assert!(cm.contains("grafana_dashboard: \"1\""));
        let body: String = cm
            .split("  nodeguard.json: |\n")
            .nth(1)
            .unwrap()
            .lines()
            .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap()))
            .collect();
        assert_eq!(body, json);
        let back: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(back["uid"], UID);
    }
}
