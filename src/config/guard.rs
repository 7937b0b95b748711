//! The `guard:` section: rules, breaker policy, protections. Raw serde structs, then a compile
//! step that checks every rule and reports each bad field with its path.

use super::bounds::{Bounds, MAX_COUNT, MAX_DURATION, POSITIVE};
use super::FieldError;
use crate::model::{
    ActionKind, Condition, Direction, HoldPolicy, RestartLoopSpec, Rule, Scope, SignalKind,
    ThresholdSpec,
};
use serde::{Deserialize, Deserializer};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RawGuard {
    pub dry_run: bool,
    pub state_file: PathBuf,
    #[serde(with = "humantime_serde")]
    pub cooldown: Duration,
    pub max_actions_per_10m: u32,
    #[serde(with = "humantime_serde")]
    pub probation: Duration,
    #[serde(with = "humantime_serde")]
    pub max_hold: Duration,
    #[serde(with = "humantime_serde")]
    pub freeze_timeout: Duration,
    pub webhook_url: String,
    /// Re-sends of each active alert (docs/configuration.md, "Notifications").
    #[serde(with = "humantime_serde")]
    pub webhook_resend_interval: Duration,
    /// PEM bundle the `https://` webhook's certificate is verified against; empty: the system's.
    pub webhook_ca_file: PathBuf,
    /// A file holding a bearer token, sent as `Authorization: Bearer`; empty: none.
    pub webhook_bearer_token_file: PathBuf,
    /// The `runbook_url` annotation of the breaker's alert; empty: none.
    pub webhook_runbook_url: String,
    pub protect: Protect,
    /// Plain-host units that may be acted on (nothing outside kubepods is, by default).
    pub host_units: Vec<String>,
    pub containment: Containment,
    pub rules: Vec<RawRule>,
}

/// How hard the limit actions hold (the same for every rule that uses them).
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Containment {
    /// `throttle_cpu`: the CPU time the workload gets, in cores (0.1 = 10 ms per 100 ms).
    pub cpu_cores: f64,
    /// `limit_connections`: new outbound connects per second; 0 refuses every one.
    pub connects_per_second: u32,
}

impl Default for Containment {
    fn default() -> Self {
        Containment {
            cpu_cores: 0.1,
            connects_per_second: 0,
        }
    }
}

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Protect {
    pub namespaces: Vec<String>,
    /// Globs (`*`, `?`) on `namespace/pod/container`.
    pub workloads: Vec<String>,
}

impl Default for Protect {
    fn default() -> Self {
        // What a k3s cluster runs to keep itself up (docs/configuration.md, "protect").
        Protect {
            namespaces: [
                "kube-system",
                "kube-public",
                "kube-node-lease",
                "longhorn-system",
                "cert-manager",
                "ingress-nginx",
                "metallb-system",
                "monitoring",
                "victoria-metrics",
                "argocd",
                "flux-system",
            ]
            .map(String::from)
            .to_vec(),
            workloads: vec![],
        }
    }
}

impl Default for RawGuard {
    fn default() -> Self {
        RawGuard {
            dry_run: true,
            state_file: "/var/lib/nodeguard/state.json".into(),
            cooldown: Duration::from_secs(30),
            max_actions_per_10m: 6,
            probation: Duration::from_secs(3600),
            max_hold: Duration::from_secs(4 * 3600),
            freeze_timeout: Duration::from_secs(5),
            webhook_url: String::new(),
            webhook_resend_interval: DEFAULT_RESEND,
            webhook_ca_file: PathBuf::new(),
            webhook_bearer_token_file: PathBuf::new(),
            webhook_runbook_url: String::new(),
            protect: Protect::default(),
            host_units: vec![],
            containment: Containment::default(),
            rules: default_rules(),
        }
    }
}

/// The shipped rules (also spelled out in config/nodeguard.yaml; a test keeps both equal).
pub fn default_rules() -> Vec<RawRule> {
    let min = |m: u64| Some(Duration::from_secs(60 * m));
    let threshold = |name: &str, signal, above, for_duration, action, hold| RawRule {
        name: name.into(),
        signal: Some(signal),
        above: Some(above),
        for_duration,
        clear_below: None,
        clear_for: None,
        contributor_floor: None,
        restart_loop: None,
        below: None,
        clear_above: None,
        action: RawActions(vec![action]),
        verify_after: None,
        hold,
    };
    let fifteen = Some(RawHold::For(Duration::from_secs(900)));
    vec![
        RawRule {
            clear_for: min(1),
            action: RawActions(vec![ActionKind::ThrottleCpu, ActionKind::Freeze]),
            verify_after: Some(Duration::from_secs(15)),
            ..threshold(
                "log-flood",
                SignalKind::LogLinesPerMinute,
                599.0,
                min(1),
                ActionKind::Freeze,
                fifteen,
            )
        },
        threshold(
            "socket-storm",
            SignalKind::TcpSockets,
            5000.0,
            min(2),
            ActionKind::LimitConnections,
            fifteen,
        ),
        threshold(
            "memory-near-limit",
            SignalKind::MemoryWorkingSetFraction,
            0.85,
            min(15),
            ActionKind::Report,
            None,
        ),
        RawRule {
            contributor_floor: Some(5000.0),
            action: RawActions(vec![ActionKind::LimitConnections, ActionKind::Freeze]),
            verify_after: Some(Duration::from_secs(15)),
            ..threshold(
                "conntrack-pressure",
                SignalKind::NodeConntrackFraction,
                0.9,
                min(1),
                ActionKind::Freeze,
                fifteen,
            )
        },
        RawRule {
            name: "restart-loop".into(),
            signal: None,
            above: None,
            for_duration: None,
            clear_below: None,
            clear_for: None,
            contributor_floor: None,
            below: None,
            clear_above: None,
            restart_loop: Some(RawRestartLoop {
                burst_restarts: 3,
                burst_window: Duration::from_secs(600),
                bursts: 3,
                window: Duration::from_secs(3600),
            }),
            action: RawActions(vec![ActionKind::Freeze]),
            verify_after: None,
            hold: Some(RawHold::UntilNewRevision),
        },
    ]
}

/// A rule's `action`: one step (`freeze`), or a ladder tried in order (`[limit_connections,
/// freeze]`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RawActions(pub Vec<ActionKind>);

impl<'de> Deserialize<'de> for RawActions {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(ActionKind),
            Many(Vec<ActionKind>),
        }
        match OneOrMany::deserialize(d).map_err(|_| {
            serde::de::Error::custom(format!(
                "an action or a list of actions, from: {}",
                ActionKind::ALL.map(|a| a.as_str()).join(", ")
            ))
        })? {
            OneOrMany::One(a) => Ok(RawActions(vec![a])),
            OneOrMany::Many(v) => Ok(RawActions(v)),
        }
    }
}

/// How long a step holds before it is checked, by default.
pub const DEFAULT_VERIFY_AFTER: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RawHold {
    For(Duration),
    UntilNewRevision,
}

impl<'de> Deserialize<'de> for RawHold {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s == "until_new_revision" {
            return Ok(RawHold::UntilNewRevision);
        }
        humantime::parse_duration(&s)
            .map(RawHold::For)
            .map_err(|e| {
                serde::de::Error::custom(format!("{s:?}: {e} (or \"until_new_revision\")"))
            })
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawRestartLoop {
    pub burst_restarts: u32,
    #[serde(with = "humantime_serde")]
    pub burst_window: Duration,
    pub bursts: u32,
    #[serde(with = "humantime_serde")]
    pub window: Duration,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub name: String,
    pub signal: Option<SignalKind>,
    pub above: Option<f64>,
    #[serde(rename = "for", default, with = "humantime_serde")]
    pub for_duration: Option<Duration>,
    pub clear_below: Option<f64>,
    #[serde(default, with = "humantime_serde")]
    pub clear_for: Option<Duration>,
    pub contributor_floor: Option<f64>,
    pub restart_loop: Option<RawRestartLoop>,
    /// Time-to-full signals: past the threshold while the projection is below this.
    #[serde(default, with = "humantime_serde")]
    pub below: Option<Duration>,
    /// Time-to-full signals: once firing, clears only at or above this (default `below`).
    #[serde(default, with = "humantime_serde")]
    pub clear_above: Option<Duration>,
    /// Required (checked with the rest, so that a bad value is one error, not two).
    #[serde(default)]
    pub action: RawActions,
    /// A ladder's step is checked after this long (default 15 s).
    #[serde(default, with = "humantime_serde")]
    pub verify_after: Option<Duration>,
    pub hold: Option<RawHold>,
}

/// Default `webhook_resend_interval`: Prometheus's own resend delay.
pub const DEFAULT_RESEND: Duration = Duration::from_secs(60);
/// Bounds of `webhook_resend_interval`: the longest is Alertmanager's default `resolve_timeout`,
/// so a re-send always comes before an Alertmanager that ignored `endsAt` would resolve.
pub const MIN_RESEND: Duration = Duration::from_secs(1);
pub const MAX_RESEND: Duration = Duration::from_secs(300);
/// Where the system's CA bundle is on Debian, Ubuntu and Alpine (the image has none).
pub const SYSTEM_CA_FILE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Where and how breaker alerts are sent (`guard.webhook_*`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Webhook {
    /// Empty: no webhook.
    pub url: String,
    pub resend_interval: Duration,
    pub ca_file: Option<PathBuf>,
    pub bearer_token_file: Option<PathBuf>,
    pub runbook_url: String,
}

impl Default for Webhook {
    fn default() -> Self {
        Webhook {
            url: String::new(),
            resend_interval: DEFAULT_RESEND,
            ca_file: None,
            bearer_token_file: None,
            runbook_url: String::new(),
        }
    }
}

impl Webhook {
    /// Just a URL, with every other key at its default.
    pub fn url(url: impl Into<String>) -> Webhook {
        Webhook {
            url: url.into(),
            ..Webhook::default()
        }
    }
}

/// The compiled guard configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct GuardConfig {
    pub dry_run: bool,
    pub state_file: PathBuf,
    pub cooldown: Duration,
    pub max_actions_per_10m: u32,
    pub probation: Duration,
    pub max_hold: Duration,
    pub freeze_timeout: Duration,
    pub webhook: Webhook,
    pub protect: Protect,
    pub host_units: Vec<String>,
    pub containment: Containment,
    pub rules: Vec<Rule>,
}

/// For [`super::live`]'s key-by-key comparison only. Every field is named (no `..`), so a new
/// one cannot be left out; a compiled rule is compared by its `Debug` text.
impl serde::Serialize for GuardConfig {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let GuardConfig {
            dry_run,
            state_file,
            cooldown,
            max_actions_per_10m,
            probation,
            max_hold,
            freeze_timeout,
            webhook,
            protect,
            host_units,
            containment,
            rules,
        } = self;
        let rules: Vec<String> = rules.iter().map(|r| format!("{r:?}")).collect();
        let mut st = s.serialize_struct("GuardConfig", 12)?;
        st.serialize_field("dry_run", dry_run)?;
        st.serialize_field("state_file", state_file)?;
        st.serialize_field("cooldown", cooldown)?;
        st.serialize_field("max_actions_per_10m", max_actions_per_10m)?;
        st.serialize_field("probation", probation)?;
        st.serialize_field("max_hold", max_hold)?;
        st.serialize_field("freeze_timeout", freeze_timeout)?;
        st.serialize_field("webhook", webhook)?;
        st.serialize_field("protect", protect)?;
        st.serialize_field("host_units", host_units)?;
        st.serialize_field("containment", containment)?;
        st.serialize_field("rules", &rules)?;
        st.end()
    }
}

/// Largest `max_actions_per_10m`: one action per tick at the shortest interval is 6,000.
pub const MAX_ACTIONS_PER_10M: u64 = 1000;

/// Largest `burst_restarts` and `bursts` of a restart loop.
pub const MAX_RESTART_COUNT: u64 = 1000;

/// The threshold of a signal rule: `above` (and `clear_below`) for counts and fractions, `below`
/// (and `clear_above`) durations for times to full. `None` after reporting a missing threshold.
fn threshold_of(
    r: &RawRule,
    signal: SignalKind,
    p: &dyn Fn(&str) -> String,
    b: &mut Bounds,
) -> Option<(f64, f64, Direction)> {
    if signal.is_time() {
        for (field, set) in [
            ("above", r.above.is_some()),
            ("clear_below", r.clear_below.is_some()),
        ] {
            if set {
                b.error(&p(field), "time-to-full signals take `below` (a duration)");
            }
        }
        let Some(below) = r.below else {
            b.error(
                &p("below"),
                "required with a time-to-full signal (a duration)",
            );
            return None;
        };
        let below_ok = b.duration(&p("below"), below, POSITIVE, MAX_DURATION);
        let clear_above = r.clear_above.unwrap_or(below);
        if below_ok
            && b.duration(&p("clear_above"), clear_above, POSITIVE, MAX_DURATION)
            && clear_above < below
        {
            b.error(
                &p("clear_above"),
                format!("{clear_above:?} must be at least `below` ({below:?})"),
            );
        }
        return Some((
            below.as_secs_f64(),
            clear_above.as_secs_f64(),
            Direction::Below,
        ));
    }
    for (field, set) in [
        ("below", r.below.is_some()),
        ("clear_above", r.clear_above.is_some()),
    ] {
        if set {
            b.error(&p(field), "only for time-to-full signals (`*_full_in`)");
        }
    }
    let Some(above) = r.above else {
        b.error(&p("above"), "required with `signal`");
        return None;
    };
    // Counts are compared as f64: past 2^53 they are no longer exact.
    let max = if signal.is_fraction() { 1.0 } else { MAX_COUNT };
    let above_ok = b.float(&p("above"), above, 0.0, max);
    let clear_below = r.clear_below.unwrap_or(above);
    if above_ok && b.float(&p("clear_below"), clear_below, 0.0, max) && clear_below > above {
        b.error(
            &p("clear_below"),
            format!("{clear_below} must not exceed above ({above})"),
        );
    }
    Some((above, clear_below, Direction::Above))
}

pub fn compile(raw: RawGuard, errs: &mut Vec<FieldError>) -> GuardConfig {
    let mut b = Bounds::new(errs);
    b.int(
        "guard.max_actions_per_10m",
        raw.max_actions_per_10m.into(),
        1,
        MAX_ACTIONS_PER_10M,
    );
    b.duration("guard.cooldown", raw.cooldown, Duration::ZERO, MAX_DURATION);
    b.duration(
        "guard.probation",
        raw.probation,
        Duration::ZERO,
        MAX_DURATION,
    );
    b.duration("guard.max_hold", raw.max_hold, POSITIVE, MAX_DURATION);
    b.duration(
        "guard.freeze_timeout",
        raw.freeze_timeout,
        POSITIVE,
        MAX_DURATION,
    );
    // A quota under 1 % of a core is the CFS minimum (1 ms per 100 ms); above the node's size
    // it holds nothing back.
    b.float(
        "guard.containment.cpu_cores",
        raw.containment.cpu_cores,
        0.01,
        1024.0,
    );
    b.int(
        "guard.containment.connects_per_second",
        raw.containment.connects_per_second.into(),
        0,
        1_000_000,
    );
    if !raw.state_file.is_absolute() {
        b.error(
            "guard.state_file",
            format!("{} must be an absolute path", raw.state_file.display()),
        );
    }
    if !raw.webhook_url.is_empty() && split_url(&raw.webhook_url).is_none() {
        b.error(
            "guard.webhook_url",
            format!(
                "{:?} is not an http:// or https://host[:port]/path URL",
                raw.webhook_url
            ),
        );
    }
    b.duration(
        "guard.webhook_resend_interval",
        raw.webhook_resend_interval,
        MIN_RESEND,
        MAX_RESEND,
    );
    let file = |p: PathBuf, path: &str, b: &mut Bounds| {
        if p.as_os_str().is_empty() {
            return None;
        }
        if !p.is_absolute() {
            b.error(path, format!("{} must be an absolute path", p.display()));
        }
        Some(p)
    };
    let ca_file = file(raw.webhook_ca_file, "guard.webhook_ca_file", &mut b);
    let token = file(
        raw.webhook_bearer_token_file,
        "guard.webhook_bearer_token_file",
        &mut b,
    );
    let webhook = Webhook {
        url: raw.webhook_url,
        resend_interval: raw.webhook_resend_interval,
        ca_file,
        bearer_token_file: token,
        runbook_url: raw.webhook_runbook_url,
    };
    let mut rules = Vec::new();
    for (i, r) in raw.rules.iter().enumerate() {
        let p = |f: &str| format!("guard.rules[{i}].{f}");
        if r.name.is_empty() {
            b.error(&p("name"), "must not be empty");
        } else if raw.rules[..i].iter().any(|o| o.name == r.name) {
            b.error(
                &p("name"),
                format!("{:?} is used by an earlier rule", r.name),
            );
        }
        let ladder = r.action.0.clone();
        check_ladder(&ladder, r.restart_loop.is_some(), &p("action"), &mut b);
        let action = ladder.first().copied().unwrap_or(ActionKind::Report);
        let verify_after = r.verify_after.unwrap_or(DEFAULT_VERIFY_AFTER);
        if r.verify_after.is_some() {
            b.duration(&p("verify_after"), verify_after, POSITIVE, MAX_DURATION);
        }
        let hold = match (r.hold, action) {
            (Some(RawHold::For(d)), _) => {
                b.duration(&p("hold"), d, POSITIVE, MAX_DURATION);
                HoldPolicy::For(d)
            }
            (Some(RawHold::UntilNewRevision), _) => HoldPolicy::UntilNewRevision,
            // A report-only rule opens a breaker for the metrics; it holds nothing.
            (None, ActionKind::Report) => HoldPolicy::For(Duration::from_secs(3600)),
            (None, _) => {
                b.error(
                    &p("hold"),
                    "required for every action but report (a duration or \"until_new_revision\")",
                );
                HoldPolicy::For(Duration::from_secs(1))
            }
        };
        let condition = match (&r.signal, &r.restart_loop) {
            (Some(_), Some(_)) | (None, None) => {
                b.error(
                    &p("signal"),
                    "exactly one of `signal` and `restart_loop` is required",
                );
                continue;
            }
            (None, Some(l)) => {
                for (f, v) in [("burst_restarts", l.burst_restarts), ("bursts", l.bursts)] {
                    b.int(
                        &p(&format!("restart_loop.{f}")),
                        v.into(),
                        1,
                        MAX_RESTART_COUNT,
                    );
                }
                let burst_ok = b.duration(
                    &p("restart_loop.burst_window"),
                    l.burst_window,
                    POSITIVE,
                    MAX_DURATION,
                );
                let window_ok = b.duration(
                    &p("restart_loop.window"),
                    l.window,
                    Duration::ZERO,
                    MAX_DURATION,
                );
                if burst_ok && window_ok && l.window < l.burst_window {
                    b.error(
                        &p("restart_loop.window"),
                        "needs 0 < burst_window <= window",
                    );
                }
                Condition::RestartLoop(RestartLoopSpec {
                    burst_restarts: l.burst_restarts,
                    burst_window: l.burst_window,
                    bursts: l.bursts,
                    window: l.window,
                })
            }
            (Some(signal), None) => {
                let Some((threshold, clear_at, direction)) = threshold_of(r, *signal, &p, &mut b)
                else {
                    continue;
                };
                let floor = match (signal.scope(), r.contributor_floor) {
                    (Scope::Node, Some(f)) => {
                        b.float(&p("contributor_floor"), f, 0.0, MAX_COUNT);
                        f
                    }
                    (Scope::Node, None) => {
                        b.error(
                            &p("contributor_floor"),
                            "node rules act on the top contributor only above this floor: required",
                        );
                        0.0
                    }
                    (_, Some(_)) => {
                        b.error(&p("contributor_floor"), "only for node signals");
                        0.0
                    }
                    (_, None) => 0.0,
                };
                let for_duration = r.for_duration.unwrap_or_default();
                b.duration(&p("for"), for_duration, Duration::ZERO, MAX_DURATION);
                let clear_for = r.clear_for.unwrap_or(for_duration);
                if r.clear_for.is_some() {
                    b.duration(&p("clear_for"), clear_for, Duration::ZERO, MAX_DURATION);
                }
                Condition::Threshold {
                    signal: *signal,
                    spec: ThresholdSpec {
                        threshold,
                        clear_at,
                        for_duration,
                        clear_for,
                        direction,
                    },
                    contributor_floor: floor,
                }
            }
        };
        rules.push(Rule {
            name: r.name.clone(),
            condition,
            action,
            ladder,
            verify_after,
            hold,
        });
    }
    GuardConfig {
        dry_run: raw.dry_run,
        state_file: raw.state_file,
        cooldown: raw.cooldown,
        max_actions_per_10m: raw.max_actions_per_10m,
        probation: raw.probation,
        max_hold: raw.max_hold,
        freeze_timeout: raw.freeze_timeout,
        webhook,
        protect: raw.protect,
        host_units: raw.host_units,
        containment: raw.containment,
        rules,
    }
}

/// A ladder goes from gentle to hard: `report` alone, `kill` last, each step once; a restart
/// loop has no value that could show a step worked, so it takes one step.
fn check_ladder(ladder: &[ActionKind], restart_loop: bool, path: &str, b: &mut Bounds) {
    let ok = match ladder {
        [] => Err("required: an action, or a list of them from the gentlest"),
        [_] => Ok(()),
        _ if restart_loop => {
            Err("a restart loop takes one action (nothing shows whether a step worked)")
        }
        l if l.contains(&ActionKind::Report) => Err("report is an action on its own, not a step"),
        l if l[..l.len() - 1].contains(&ActionKind::Kill) => Err("kill can only be the last step"),
        l if (1..l.len()).any(|i| l[..i].contains(&l[i])) => Err("each step once"),
        _ => Ok(()),
    };
    if let Err(why) = ok {
        b.error(path, why);
    }
}

/// A webhook URL, split: `https`, `host:port` (the port defaulted by scheme) and the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookUrl {
    pub https: bool,
    pub authority: String,
    /// The host alone (no brackets around an IPv6 address): the TLS server name.
    pub host: String,
    pub path: String,
}

/// Pure: `http[s]://host[:port][/path]` split; `None` for any other URL (no userinfo, no query
/// rewriting: the path is sent as written).
pub fn split_url(url: &str) -> Option<WebhookUrl> {
    let (https, rest) = match url.strip_prefix("https://") {
        Some(rest) => (true, rest),
        None => (false, url.strip_prefix("http://")?),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    // `[v6]:port`, `[v6]`, `host:port`, `host`.
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (h, after) = v6.split_once(']')?;
            (h, after.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        },
    };
    if host.is_empty() || port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return None;
    }
    let authority = match port {
        Some(_) => authority.to_owned(),
        None => format!("{authority}:{}", if https { 443 } else { 80 }),
    };
    Some(WebhookUrl {
        https,
        authority,
        host: host.to_owned(),
        path: path.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::split_url;
    use crate::config::Config;
    use crate::model::{Condition, Direction};
    use std::time::Duration;

    #[test]
    fn urls() {
        let parts = |u: &str| split_url(u).map(|w| (w.https, w.authority, w.host, w.path));
        let s = String::from;
        assert_eq!(
            parts("http://am:9093/api/v2/alerts"),
            Some((false, s("am:9093"), s("am"), s("/api/v2/alerts")))
        );
        assert_eq!(
            parts("http://am"),
            Some((false, s("am:80"), s("am"), s("/")))
        );
        assert_eq!(
            parts("https://am"),
            Some((true, s("am:443"), s("am"), s("/")))
        );
        assert_eq!(
            parts("https://[::1]:9443/x"),
            Some((true, s("[::1]:9443"), s("::1"), s("/x")))
        );
        assert_eq!(parts("http:///x"), None);
        assert_eq!(parts("ftp://am/x"), None);
        assert_eq!(parts("http://u:p@am/x"), None);
        assert_eq!(parts("http://am:port/x"), None);
    }

    fn errors(rules: &str) -> Vec<String> {
        match Config::from_yaml(&format!("guard:\n  rules:\n{rules}")) {
            Ok(_) => vec![],
            Err(e) => {
                e.0.into_iter()
                    .map(|e| format!("{}: {}", e.path, e.message))
                    .collect()
            }
        }
    }

    #[test]
    fn time_to_full_rules_fire_below_a_bounded_duration() {
        let c = Config::from_yaml(
            "guard:\n  rules:\n    - {name: ct-soon, signal: node_conntrack_full_in, below: 5m, clear_above: 15m, for: 30s, contributor_floor: 1000, action: report}\n    - {name: pids, signal: node_pids_fraction, above: 0.9, contributor_floor: 100, action: report}\n",
        )
        .unwrap();
        let Condition::Threshold { spec, .. } = &c.guard.rules[0].condition else {
            panic!("{:?}", c.guard.rules[0]);
        };
        assert_eq!(spec.direction, Direction::Below);
        assert_eq!((spec.threshold, spec.clear_at), (300.0, 900.0));
        assert_eq!(spec.for_duration, Duration::from_secs(30));
        let Condition::Threshold { spec, .. } = &c.guard.rules[1].condition else {
            panic!();
        };
        assert_eq!(spec.direction, Direction::Above);

        let errs = errors(
            "    - {name: a, signal: memory_full_in, above: 5, action: report}\n    - {name: b, signal: memory_full_in, below: 400000000000y, action: report}\n    - {name: c, signal: memory_full_in, below: 10m, clear_above: 1m, action: report}\n    - {name: d, signal: pids, below: 10m, action: report}\n    - {name: e, signal: pids_fraction, above: 1.5, action: report}\n    - {name: f, signal: memory_full_in, below: 0s, action: report}\n",
        );
        assert_eq!(
            errs.iter()
                .map(|e| e.split(':').next().unwrap())
                .collect::<Vec<_>>(),
            [
                "guard.rules[0].above",
                "guard.rules[0].below",
                "guard.rules[1].below",
                "guard.rules[2].clear_above",
                "guard.rules[3].below",
                "guard.rules[3].above",
                "guard.rules[4].above",
                "guard.rules[5].below",
            ],
            "{errs:#?}"
        );
    }
}
