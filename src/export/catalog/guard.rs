//! The guard (`rule`, `action`): breakers, pending rules, actions and their outcomes, and the
//! state file that makes holds survive a restart.

use super::{
    names, Family, Label, Meta, Rows, Section, Type, Unit, CONTAINER, NAMESPACE, POD, RULE,
};
use crate::action::Outcome;
use crate::model::ActionKind;
use crate::model::{BreakerView, GuardStatus, Published};

use Section::Guard as S;
use Type::{Counter, Gauge};

const ACTION: Label = Label::of("action", || names(&ActionKind::ALL, |a| a.as_str()));
const BREAKER: [Label; 4] = [NAMESPACE, POD, CONTAINER, RULE];
const WOULD_ACT: [Label; 5] = [NAMESPACE, POD, CONTAINER, RULE, ACTION];
const ACTIONS: [Label; 3] = [
    RULE,
    ACTION,
    Label::of("outcome", || names(&Outcome::ALL, Outcome::as_str)),
];

fn breaker(b: &BreakerView) -> [&str; 4] {
    [&b.namespace, &b.pod, &b.container, &b.rule]
}

/// One row per breaker that has a value.
fn breakers<'a, V: Into<super::Num>>(
    s: &'a Published,
    out: &mut Rows<'a>,
    value: fn(&BreakerView) -> Option<V>,
) {
    for b in s.guard.iter().flat_map(|g| &g.breakers) {
        if let Some(v) = value(b) {
            out.add(&breaker(b), v);
        }
    }
}

/// The guard's single series, once it has stepped.
fn node<'a, V: Into<super::Num>>(s: &'a Published, out: &mut Rows<'a>, v: fn(&GuardStatus) -> V) {
    if let Some(g) = &s.guard {
        out.add(&[], v(g));
    }
}

pub const FAMILIES: &[Family<Published>] = &[
    Meta {
        name: "breaker_open",
        ty: Gauge,
        unit: None,
        help: "1 while a breaker is open or half-open for the workload and rule.",
        labels: &BREAKER,
        section: S,
    }
    .with_rows(|s, out| breakers(s, out, |_| Some(1u64))),
    Meta {
        name: "breaker_half_open",
        ty: Gauge,
        unit: None,
        help: "1 while the breaker is in probation after its hold.",
        labels: &BREAKER,
        section: S,
    }
    .with_rows(|s, out| breakers(s, out, |b| Some(b.state == "half_open"))),
    Meta {
        name: "breaker_hold_remaining_seconds",
        ty: Gauge,
        unit: Some(Unit::Seconds),
        help: "Seconds left in the hold; absent while held until a new revision.",
        labels: &BREAKER,
        section: S,
    }
    .with_rows(|s, out| breakers(s, out, |b| b.hold_remaining_seconds)),
    Meta {
        name: "breaker_trips",
        ty: Counter,
        unit: None,
        help: "Times the breaker tripped.",
        labels: &BREAKER,
        section: S,
    }
    .with_rows(|s, out| breakers(s, out, |b| Some(b.trips_total))),
    Meta {
        name: "would_act",
        ty: Gauge,
        unit: None,
        help: "Dry run: 1 while a breaker would be holding the workload with this action.",
        labels: &WOULD_ACT,
        section: S,
    }
    .with_rows(|s, out| {
            for b in s.guard.iter().flat_map(|g| &g.breakers).filter(|b| b.would_act) {
                let [ns, pod, c, rule] = breaker(b);
                out.add(&[ns, pod, c, rule, b.action], 1u64);
            }
        }),
    Meta {
        name: "rule_pending_seconds",
        ty: Gauge,
        unit: Some(Unit::Seconds),
        help: "How long the rule's threshold has held so far on the target.",
        labels: &BREAKER,
        section: S,
    }
    .with_rows(|s, out| {
            for p in s.guard.iter().flat_map(|g| &g.pending) {
                out.add(&[&p.namespace, &p.pod, &p.container, &p.rule], p.seconds);
            }
        }),
    Meta {
        name: "actions",
        ty: Counter,
        unit: None,
        help: "Actions taken (or, dry run, decided) by rule, action and outcome.",
        labels: &ACTIONS,
        section: S,
    }
    .with_rows(|s, out| {
            for (rule, action, outcome, n) in s.guard.iter().flat_map(|g| &g.actions) {
                out.add(&[rule, action, outcome], *n);
            }
        }),
    Meta {
        name: "dry_run",
        ty: Gauge,
        unit: None,
        help: "1 when the guard only reports what it would do.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |g| g.dry_run)),
    Meta {
        name: "guard_state_durable",
        ty: Gauge,
        unit: None,
        help: "1 while the last write of the breaker state file succeeded; no new hold is applied at 0.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |g| g.state_durable)),
    Meta {
        name: "guard_state_write_failures",
        ty: Counter,
        unit: None,
        help: "Writes of the breaker state file that failed.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |g| g.state_write_failures_total)),
    Meta {
        name: "guard_state_quarantined",
        ty: Gauge,
        unit: None,
        help: "1 when the state file found at start was unreadable and was kept aside.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |g| g.state_quarantined.is_some())),
    Meta {
        name: "guard_thaws_pending",
        ty: Gauge,
        unit: None,
        help: "Cgroups the agent froze whose thaw failed; retried every tick.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |g| g.thaws_pending)),
    Meta {
        name: "guard_state_owner",
        ty: Gauge,
        unit: None,
        help: "1 while this instance holds the state lock; at 0 it never writes, freezes, thaws or notifies (another agent owns the state, or its directory is unusable: see /api/state guard.not_owner).",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |g| g.not_owner.is_none())),
    Meta {
        name: "guard_held_cgroups",
        ty: Gauge,
        unit: None,
        help: "Cgroups frozen by this agent, as the kernel confirmed at the last tick.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |g| g.held_cgroups)),
    Meta {
        name: "guard_foreign_thaws",
        ty: Counter,
        unit: None,
        help: "Held cgroups found thawed by another hand; each releases its breaker.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |g| g.foreign_thaws_total)),
    Meta {
        name: "guard_unclaimed_thaws",
        ty: Counter,
        unit: None,
        help: "Frozen cgroups that no breaker claimed any more, thawed by the agent (a safety net: should stay 0).",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |g| g.unclaimed_thaws_total)),
    // The breaker alerts' webhook: series only when one is configured.
    Meta {
        name: "webhook_posts",
        ty: Counter,
        unit: None,
        help: "POSTs of breaker alerts to guard.webhook_url, by result (sent: 2xx; failed: refused, unreachable, TLS).",
        labels: &[Label::of("result", || vec!["sent", "failed"])],
        section: S,
    }
    .with_rows(|s, out| {
        if let Some(w) = s.guard.as_ref().map(|g| &g.webhook).filter(|w| w.configured) {
            out.add(&["sent"], w.sent_total);
            out.add(&["failed"], w.failed_total);
        }
    }),
    Meta {
        name: "webhook_dropped",
        ty: Counter,
        unit: None,
        help: "Breaker alert events not sent (queue_full: the queue of 64 was full) and alerts not re-sent (table_full: too many firing).",
        labels: &[Label::of("reason", || vec!["queue_full", "table_full"])],
        section: S,
    }
    .with_rows(|s, out| {
        if let Some(w) = s.guard.as_ref().map(|g| &g.webhook).filter(|w| w.configured) {
            out.add(&["queue_full"], w.dropped_queue_full_total);
            out.add(&["table_full"], w.dropped_table_full_total);
        }
    }),
    Meta {
        name: "webhook_active_alerts",
        ty: Gauge,
        unit: None,
        help: "Breaker alerts firing, re-sent every guard.webhook_resend_interval.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| {
        if let Some(w) = s.guard.as_ref().map(|g| &g.webhook).filter(|w| w.configured) {
            out.add(&[], w.active_alerts);
        }
    }),
    Meta {
        name: "guard_limits_held",
        ty: Gauge,
        unit: None,
        help: "Limits set by this agent now (memory.high, pids.max, CPU quota, connect filter), each restored when its hold ends.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |g| g.limits_held)),
    Meta {
        name: "guard_limits_reasserted",
        ty: Counter,
        unit: None,
        help: "Limits found rewritten by someone else (a kubelet resize, a restart) and set again; what they wrote is restored at the end.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |g| g.limits_reasserted_total)),
];
