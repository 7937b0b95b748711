//! `nodeguard status`: the running agent's `/api/state` at a glance (no second sampling). The
//! agent's answer is read into a [`View`] (pure, tested on hand-made states), which is printed
//! as a table for people or as JSON for scripts.

pub mod client;
pub mod render;

use serde::{Deserialize, Serialize};

/// Exit codes: quiet, something holds (a breaker open or a rule pending), agent unreachable.
pub const EXIT_QUIET: u8 = 0;
pub const EXIT_ATTENTION: u8 = 1;
pub const EXIT_UNREACHABLE: u8 = 2;

// === The agent's answer (the subset shown; every field optional, for older agents) ===

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct State {
    pub timestamp: f64,
    pub node: String,
    pub workloads: Vec<Workload>,
    pub pods: Vec<Pod>,
    pub node_conntrack: Option<Conntrack>,
    pub features: Vec<Feature>,
    pub guard: Option<Guard>,
    pub samplers: Vec<Sampler>,
    pub config: ConfigInfo,
    pub agent: Agent,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Workload {
    pub id: Id,
    pub kind: String,
    pub qos: Option<String>,
    pub cgroup: Option<String>,
    pub memory: Option<Held<Memory>>,
    pub oom_kills_total: u64,
    pub restarts_total: u64,
    pub processes: Option<Held<u64>>,
    pub zombies: Option<Held<u64>>,
    pub log_lines_per_minute: Lines,
    pub sockets: Option<Held<Sockets>>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct Id {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
pub struct Held<T> {
    pub value: T,
    #[serde(default)]
    pub stale: bool,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub struct Memory {
    pub working_set_bytes: u64,
    pub limit_bytes: Option<u64>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub struct Lines {
    pub stdout: u64,
    pub stderr: u64,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub struct Sockets {
    pub tcp: u64,
    pub udp: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Pod {
    pub namespace: String,
    pub pod: String,
    pub netns_conntrack_entries: Option<u64>,
    pub host_conntrack_entries: Option<u64>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
pub struct Conntrack {
    pub entries: u64,
    pub limit: u64,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Feature {
    pub name: String,
    pub available: bool,
    pub reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Guard {
    pub dry_run: bool,
    pub state_durable: bool,
    pub thaws_pending: usize,
    pub not_owner: Option<String>,
    pub breakers: Vec<Breaker>,
    pub pending: Vec<Pending>,
    pub rules: Vec<Rule>,
    pub pacing: Pacing,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct Breaker {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub rule: String,
    pub state: String,
    pub action: String,
    pub reason: String,
    pub hold_remaining_seconds: Option<f64>,
    pub would_act: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Pending {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub rule: String,
    pub seconds: f64,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub struct Rule {
    pub name: String,
    pub signal: Option<String>,
    pub above: f64,
    pub for_seconds: f64,
}

#[derive(Debug, Default, Clone, Copy, Deserialize, Serialize)]
#[serde(default)]
pub struct Pacing {
    pub actions_last_10m: u32,
    pub max_actions_per_10m: u32,
    pub cooldown_remaining_seconds: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Sampler {
    pub name: String,
    pub enabled: bool,
    pub age_seconds: Option<f64>,
    pub fresh: bool,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize)]
#[serde(default)]
pub struct ConfigInfo {
    pub file: Option<String>,
    pub hash: String,
    pub loaded_at: f64,
    pub reloads_total: u64,
    pub reload_failures_total: u64,
    pub last_reload_ok: bool,
    pub restart_required: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Agent {
    pub ticks_total: u64,
    pub start_time_seconds: f64,
}

// === What is shown ===

/// A table column a rule can mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Column {
    MemoryPercent,
    Restarts,
    LogLines,
    StderrLines,
    Tcp,
    Udp,
    Zombies,
    Conntrack,
}

impl Column {
    /// The column a rule's signal reads; node-wide signals mark the node line instead.
    fn of_signal(signal: &str) -> Option<Column> {
        Some(match signal {
            "memory_working_set_fraction" => Column::MemoryPercent,
            "restarts" => Column::Restarts,
            "log_lines_per_minute" => Column::LogLines,
            "stderr_lines_per_minute" => Column::StderrLines,
            "tcp_sockets" => Column::Tcp,
            "udp_sockets" => Column::Udp,
            "zombies" => Column::Zombies,
            "conntrack_entries" => Column::Conntrack,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub kind: String,
    pub qos: Option<String>,
    pub working_set_bytes: Option<u64>,
    pub limit_bytes: Option<u64>,
    /// Working set / limit, percent.
    pub memory_percent: Option<f64>,
    pub oom_kills: u64,
    pub restarts: u64,
    pub log_lines_per_minute: u64,
    pub stderr_lines_per_minute: u64,
    pub tcp: Option<u64>,
    pub udp: Option<u64>,
    pub processes: Option<u64>,
    pub zombies: Option<u64>,
    /// The pod's: the larger of its own table and its share of the node's.
    pub conntrack: Option<u64>,
    /// Some value is the last good one (the current read failed).
    pub stale: bool,
    /// Columns whose value is above a rule's threshold.
    pub marked: Vec<Column>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SamplerLine {
    pub name: String,
    pub enabled: bool,
    pub fresh: bool,
    pub age_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct NodeLine {
    pub conntrack_entries: Option<u64>,
    pub conntrack_limit: Option<u64>,
    pub zombies: u64,
    pub pacing: Pacing,
    /// Node-wide rules above their threshold (by name).
    pub marked: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PendingLine {
    pub rule: String,
    pub target: String,
    pub held_seconds: f64,
    pub for_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct View {
    pub node: String,
    /// `DRY-RUN` or `ENFORCING`; `UNKNOWN` before the guard's first step.
    pub mode: &'static str,
    pub config: ConfigInfo,
    pub uptime_seconds: f64,
    pub last_tick_age_seconds: Option<f64>,
    pub ticks_total: u64,
    pub samplers: Vec<SamplerLine>,
    /// Features that are off, with the agent's reason.
    pub features_off: Vec<Feature>,
    pub state_durable: Option<bool>,
    pub thaws_pending: usize,
    /// Why this agent does not own the breaker state, if it does not.
    pub not_owner: Option<String>,
    pub node_line: NodeLine,
    pub workloads: Vec<Row>,
    /// Rows before `--top` and `-n`.
    pub workloads_total: usize,
    pub pending: Vec<PendingLine>,
    pub breakers: Vec<Breaker>,
    pub exit_code: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum SortKey {
    #[default]
    Name,
    Memory,
    Percent,
    Oom,
    Restarts,
    Logs,
    Sockets,
    Zombies,
    Conntrack,
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub sort: SortKey,
    pub top: Option<usize>,
    pub namespace: Option<String>,
}

fn target(ns: &str, pod: &str, container: &str) -> String {
    match (ns.is_empty(), pod.is_empty(), container.is_empty()) {
        (true, true, true) => "(node)".to_owned(),
        (true, true, false) => container.to_owned(),
        (_, _, true) => format!("{ns}/{pod}"),
        _ => format!("{ns}/{pod}/{container}"),
    }
}

impl View {
    /// `now`: the reader's Unix time (the agent's clock on the same node).
    pub fn build(s: &State, now: f64, opt: &Options) -> View {
        let rules = s.guard.as_ref().map(|g| g.rules.as_slice()).unwrap_or(&[]);
        let above = |col: Column, v: f64| {
            rules.iter().any(|r| {
                r.signal.as_deref().and_then(Column::of_signal) == Some(col) && v > r.above
            })
        };
        let mut rows: Vec<Row> = s
            .workloads
            .iter()
            .map(|w| {
                let mem = w.memory.map(|m| m.value);
                let fraction = mem.and_then(|m| {
                    let l = m.limit_bytes.filter(|l| *l > 0)?;
                    Some(m.working_set_bytes as f64 / l as f64)
                });
                let pod = s
                    .pods
                    .iter()
                    .find(|p| p.namespace == w.id.namespace && p.pod == w.id.pod);
                let conntrack =
                    pod.and_then(|p| p.netns_conntrack_entries.max(p.host_conntrack_entries));
                let lines = w.log_lines_per_minute;
                let sockets = w.sockets.map(|x| x.value);
                let mut marked = Vec::new();
                let mut mark = |col, v: Option<f64>| {
                    if v.is_some_and(|v| above(col, v)) {
                        marked.push(col);
                    }
                };
                mark(Column::MemoryPercent, fraction);
                mark(Column::Restarts, Some(w.restarts_total as f64));
                mark(Column::LogLines, Some((lines.stdout + lines.stderr) as f64));
                mark(Column::StderrLines, Some(lines.stderr as f64));
                mark(Column::Tcp, sockets.map(|x| x.tcp as f64));
                mark(Column::Udp, sockets.map(|x| x.udp as f64));
                mark(Column::Zombies, w.zombies.map(|z| z.value as f64));
                mark(Column::Conntrack, conntrack.map(|c| c as f64));
                Row {
                    namespace: w.id.namespace.clone(),
                    pod: w.id.pod.clone(),
                    container: w.id.container.clone(),
                    kind: w.kind.clone(),
                    qos: w.qos.clone(),
                    working_set_bytes: mem.map(|m| m.working_set_bytes),
                    limit_bytes: mem.and_then(|m| m.limit_bytes),
                    memory_percent: fraction.map(|f| f * 100.0),
                    oom_kills: w.oom_kills_total,
                    restarts: w.restarts_total,
                    log_lines_per_minute: lines.stdout + lines.stderr,
                    stderr_lines_per_minute: lines.stderr,
                    tcp: sockets.map(|x| x.tcp),
                    udp: sockets.map(|x| x.udp),
                    processes: w.processes.map(|p| p.value),
                    zombies: w.zombies.map(|z| z.value),
                    conntrack,
                    stale: [w.memory.map(|m| m.stale), w.zombies.map(|z| z.stale)]
                        .into_iter()
                        .chain([w.sockets.map(|x| x.stale), w.processes.map(|p| p.stale)])
                        .any(|x| x == Some(true)),
                    marked,
                }
            })
            .collect();
        let workloads_total = rows.len();
        if let Some(ns) = &opt.namespace {
            rows.retain(|r| r.namespace == *ns);
        }
        sort(&mut rows, opt.sort);
        if let Some(n) = opt.top {
            rows.truncate(n);
        }
        let zombies: u64 = s
            .workloads
            .iter()
            .filter_map(|w| w.zombies.map(|z| z.value))
            .sum();
        let ct = s.node_conntrack;
        let node_values = [
            (
                "node_conntrack_fraction",
                ct.filter(|c| c.limit > 0)
                    .map(|c| c.entries as f64 / c.limit as f64),
            ),
            ("node_zombies", Some(zombies as f64)),
        ];
        let node_marked = rules
            .iter()
            .filter(|r| {
                node_values.iter().any(|(sig, v)| {
                    r.signal.as_deref() == Some(*sig) && v.is_some_and(|v| v > r.above)
                })
            })
            .map(|r| r.name.clone())
            .collect();
        let (pending, breakers) = match &s.guard {
            Some(g) => (
                g.pending
                    .iter()
                    .map(|p| PendingLine {
                        rule: p.rule.clone(),
                        target: target(&p.namespace, &p.pod, &p.container),
                        held_seconds: p.seconds,
                        for_seconds: rules
                            .iter()
                            .find(|r| r.name == p.rule && r.signal.is_some())
                            .map(|r| r.for_seconds),
                    })
                    .collect::<Vec<_>>(),
                g.breakers.clone(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        let attention = !pending.is_empty() || breakers.iter().any(|b| b.state == "open");
        View {
            node: s.node.clone(),
            mode: match &s.guard {
                Some(g) if g.dry_run => "DRY-RUN",
                Some(_) => "ENFORCING",
                None => "UNKNOWN",
            },
            config: s.config.clone(),
            uptime_seconds: (now - s.agent.start_time_seconds).max(0.0),
            last_tick_age_seconds: (s.agent.ticks_total > 0).then(|| (now - s.timestamp).max(0.0)),
            ticks_total: s.agent.ticks_total,
            samplers: s
                .samplers
                .iter()
                .map(|x| SamplerLine {
                    name: x.name.clone(),
                    enabled: x.enabled,
                    fresh: x.fresh,
                    age_seconds: x.age_seconds,
                })
                .collect(),
            features_off: s
                .features
                .iter()
                .filter(|f| !f.available)
                .cloned()
                .collect(),
            state_durable: s.guard.as_ref().map(|g| g.state_durable),
            thaws_pending: s.guard.as_ref().map_or(0, |g| g.thaws_pending),
            not_owner: s.guard.as_ref().and_then(|g| g.not_owner.clone()),
            node_line: NodeLine {
                conntrack_entries: ct.map(|c| c.entries),
                conntrack_limit: ct.map(|c| c.limit),
                zombies,
                pacing: s.guard.as_ref().map(|g| g.pacing).unwrap_or_default(),
                marked: node_marked,
            },
            workloads: rows,
            workloads_total,
            pending,
            breakers,
            exit_code: if attention {
                EXIT_ATTENTION
            } else {
                EXIT_QUIET
            },
        }
    }
}

/// Largest first for every key but the name.
fn sort(rows: &mut [Row], key: SortKey) {
    let name = |r: &Row| (r.namespace.clone(), r.pod.clone(), r.container.clone());
    let value = |r: &Row| -> f64 {
        match key {
            SortKey::Name => 0.0,
            SortKey::Memory => r.working_set_bytes.unwrap_or(0) as f64,
            SortKey::Percent => r.memory_percent.unwrap_or(-1.0),
            SortKey::Oom => r.oom_kills as f64,
            SortKey::Restarts => r.restarts as f64,
            SortKey::Logs => r.log_lines_per_minute as f64,
            SortKey::Sockets => (r.tcp.unwrap_or(0) + r.udp.unwrap_or(0)) as f64,
            SortKey::Zombies => r.zombies.unwrap_or(0) as f64,
            SortKey::Conntrack => r.conntrack.unwrap_or(0) as f64,
        }
    };
    rows.sort_by(|a, b| {
        value(b)
            .total_cmp(&value(a))
            .then_with(|| name(a).cmp(&name(b)))
    });
}

#[cfg(test)]
mod tests;
