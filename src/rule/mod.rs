//! Rules: a signal past a threshold for a duration (pending, then firing), or a restart loop.
//! The engine is pure over snapshots and an injected `now`; it only says what fired and what
//! cleared.

pub mod observe;
pub mod pending;
pub mod restart_loop;

use crate::model::{Condition, Rule, Scope, SignalKind, Snapshot};
use observe::{observe, Target};
use pending::{PendingTimer, Transition};
use restart_loop::RestartLoop;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A rule firing on a target (reported every tick while it fires, so the guard can act later if
/// it could not act at once).
#[derive(Debug, Clone, PartialEq)]
pub struct Firing {
    pub rule: usize,
    /// The workload or pod to act on (a node rule's top contributor).
    pub target: Target,
    /// The value past the threshold (for node rules, the node value).
    pub value: f64,
    pub threshold: f64,
    /// How long the value has been past the threshold (the rule's `for` or more).
    pub pending_for: Duration,
    /// Node rules: the contributor's own value.
    pub contributor_value: Option<f64>,
}

#[derive(Debug, Default)]
pub struct Evaluation {
    pub firing: Vec<Firing>,
    pub cleared: Vec<(usize, Target)>,
    /// (rule, key, pending duration) for every key above its threshold, firing or not.
    pub pending: Vec<(usize, Target, Duration)>,
}

#[derive(Debug)]
pub struct RuleEngine {
    rules: Vec<Rule>,
    timers: Vec<HashMap<Target, PendingTimer>>,
    loops: Vec<HashMap<Target, RestartLoop>>,
}

impl RuleEngine {
    pub fn new(rules: Vec<Rule>) -> Self {
        let n = rules.len();
        RuleEngine {
            rules,
            timers: (0..n).map(|_| HashMap::new()).collect(),
            loops: (0..n).map(|_| HashMap::new()).collect(),
        }
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The engine for a reloaded rule list: a rule whose name and definition are unchanged keeps
    /// its progress (pending timers, restart history); a new or changed rule starts from zero.
    pub fn carry_over(mut self, rules: Vec<Rule>) -> RuleEngine {
        let mut next = RuleEngine::new(rules);
        for (i, rule) in next.rules.iter().enumerate() {
            if let Some(j) = self.rules.iter().position(|r| r == rule) {
                next.timers[i] = std::mem::take(&mut self.timers[j]);
                next.loops[i] = std::mem::take(&mut self.loops[j]);
            }
        }
        next
    }

    /// Forgets the progress of a rule's targets, so they must be past the threshold for the full
    /// `for` again (half-open after a breaker's hold).
    pub fn reset_matching(&mut self, rule: usize, mut matches: impl FnMut(&Target) -> bool) {
        if let Some(t) = self.timers.get_mut(rule) {
            t.retain(|k, _| !matches(k));
        }
    }

    pub fn evaluate(&mut self, now: Instant, snap: &Snapshot) -> Evaluation {
        let mut ev = Evaluation::default();
        for (ri, rule) in self.rules.iter().enumerate() {
            match &rule.condition {
                Condition::Threshold {
                    signal,
                    spec,
                    contributor_floor,
                } => {
                    let obs = observe(snap, *signal);
                    let timers = &mut self.timers[ri];
                    // Targets that vanished take their progress with them.
                    timers.retain(|k, _| obs.iter().any(|o| o.key == *k));
                    for o in obs {
                        let t = timers.entry(o.key.clone()).or_default();
                        let tr = t.observe(spec, now, o.value, o.stale);
                        if spec.exceeds(o.value) {
                            ev.pending.push((ri, o.key.clone(), t.pending_for(now)));
                        }
                        if tr == Some(Transition::Cleared) {
                            ev.cleared.push((ri, o.key.clone()));
                        }
                        if t.firing() {
                            let firing = Firing {
                                rule: ri,
                                target: o.key.clone(),
                                value: o.value,
                                threshold: spec.threshold,
                                pending_for: t.pending_for(now),
                                contributor_value: None,
                            };
                            if signal.scope() == Scope::Node {
                                ev.firing.extend(top_contributor(
                                    snap,
                                    *signal,
                                    *contributor_floor,
                                    firing,
                                ));
                            } else {
                                ev.firing.push(firing);
                            }
                        }
                    }
                }
                Condition::RestartLoop(spec) => {
                    let obs = observe(snap, SignalKind::Restarts);
                    let loops = &mut self.loops[ri];
                    loops.retain(|k, _| obs.iter().any(|o| o.key == *k));
                    for o in obs {
                        let bursts = loops.entry(o.key.clone()).or_default().observe(
                            spec,
                            now,
                            o.value as u64,
                        );
                        if bursts >= spec.bursts {
                            ev.firing.push(Firing {
                                rule: ri,
                                target: o.key,
                                value: f64::from(bursts),
                                threshold: f64::from(spec.bursts),
                                pending_for: Duration::ZERO,
                                contributor_value: None,
                            });
                        }
                    }
                }
            }
        }
        ev
    }
}

/// The node rule's target: the largest contributor, if it is above the floor.
fn top_contributor(snap: &Snapshot, node: SignalKind, floor: f64, mut f: Firing) -> Option<Firing> {
    let kind = node.contributor()?;
    let top = observe(snap, kind)
        .into_iter()
        .filter(|o| !o.stale)
        .max_by(|a, b| a.value.total_cmp(&b.value).then_with(|| b.key.cmp(&a.key)))?;
    if top.value < floor {
        // Checked again every tick while the node rule fires; the pending metric shows it.
        tracing::debug!(signal = ?node, top = %top.key, value = top.value, floor, "no contributor above the floor");
        return None;
    }
    f.target = top.key;
    f.contributor_value = Some(top.value);
    Some(f)
}
