//! The decider's view for `/api/state`, `nodeguard status` and the metrics.

use super::*;

impl Decider {
    pub fn status(&self, now: Instant, wall: SystemTime) -> GuardStatus {
        GuardStatus {
            dry_run: self.cfg.dry_run,
            breakers: self
                .breakers
                .values()
                .map(|b| BreakerView {
                    namespace: b.id.namespace.clone(),
                    pod: b.pod.clone(),
                    container: b.id.container.clone(),
                    owner: b.id.owner.clone(),
                    rule: self.cfg.rules[b.rule].name.clone(),
                    state: match b.state {
                        BreakerState::Open => "open",
                        BreakerState::HalfOpen => "half_open",
                    },
                    action: b.action.as_str(),
                    reason: b.reason.clone(),
                    value: b.value,
                    threshold: b.threshold,
                    since: wall_of(now, wall, b.opened_at),
                    hold_remaining_seconds: b.hold_remaining(now).map(|d| d.as_secs_f64()),
                    trips_total: b.trips,
                    evidence: b.evidence.clone(),
                    would_act: self.cfg.dry_run
                        && b.state == BreakerState::Open
                        && b.action != ActionKind::Report,
                })
                .collect(),
            pending: self
                .pending
                .iter()
                .map(|(r, k, d)| {
                    let (namespace, pod, container) = k.labels();
                    PendingView {
                        namespace: namespace.to_owned(),
                        pod: pod.to_owned(),
                        container: container.to_owned(),
                        rule: self.cfg.rules[*r].name.clone(),
                        seconds: d.as_secs_f64(),
                    }
                })
                .collect(),
            actions: self
                .actions
                .iter()
                .map(|((r, a, o), n)| (r.clone(), *a, *o, *n))
                .collect(),
            rules: self
                .cfg
                .rules
                .iter()
                .map(|r| {
                    let (signal, for_seconds) = match &r.condition {
                        Condition::Threshold { signal, spec, .. } => {
                            (Some(*signal), spec.for_duration.as_secs_f64())
                        }
                        Condition::RestartLoop(_) => (None, 0.0),
                    };
                    RuleView {
                        name: r.name.clone(),
                        signal,
                        above: r.threshold(),
                        for_seconds,
                        action: r.action.as_str(),
                    }
                })
                .collect(),
            pacing: {
                let (actions_last_10m, max_actions_per_10m, left) = self.throttle.view(now);
                PacingView {
                    actions_last_10m,
                    max_actions_per_10m,
                    cooldown_remaining_seconds: left.as_secs_f64(),
                }
            },
            ..GuardStatus::default()
        }
    }
}
