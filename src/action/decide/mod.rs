//! Decide: each tick, rules are evaluated on the snapshot; a rule that fires trips a breaker on
//! exactly the offending workload, paced node-wide, announced once; breakers are enforced on new
//! instances, released after their hold (half-open), reset by a new revision, persisted.
//!
//! Pure: no file, cgroup or socket is touched here. Every effect is a [`Command`] for the
//! enforcer, whose outcomes come back as [`Report`]s through [`Decider::settle`].

use super::breaker::{next_hold, Breaker, BreakerId, BreakerState, HoldRecord, Limited};
use super::evidence::LogOf;
use super::notify::{AlertState, Event};
use super::state::{self, ActedCgroup, PersistedBreaker, ReleaseRequest, StateFile};
use super::throttle::Throttle;
use super::Outcome;
use crate::config::guard::GuardConfig;
use crate::model::{
    ActionKind, BreakerView, Condition, Evidence, GuardStatus, Kind, PacingView, PendingView,
    RuleView, Snapshot, WorkloadSignals,
};
use crate::rule::observe::Target;
use crate::rule::{Evaluation, Firing, RuleEngine};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod persist;
mod status;
mod target;
#[cfg(test)]
mod tests;

use crate::cgroupfs::in_scopes;
use target::{covers, held_by, matches_id};
pub use target::{glob, identity};

pub type Key = (BreakerId, usize);
/// A rule pending on a target: its cgroups are pinned (inode recorded) when it starts pending.
pub type Pin = (usize, Target);

/// One effect, applied by the enforcer in the order given.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Record the inodes of these cgroups now, so that the action later hits these and not a
    /// cgroup recreated at the same path. Answered by [`Report::Pinned`].
    Pin {
        pin: Pin,
        rels: Vec<String>,
    },
    /// The rule stopped pending on the target, or acted: the pinned cgroups are let go.
    Unpin(Pin),
    /// Write the state file. Every `Hold` after a `Persist` that failed is refused.
    Persist(StateFile),
    /// A new hold: `action` on the cgroup at `rel` (`ino`: the inode it must still have).
    Hold {
        ticket: Ticket,
        action: ActionKind,
        rel: String,
        ino: Option<u64>,
        /// The instance (container id) held, echoed in the report.
        instance: String,
        /// What a limit is set to.
        setting: Setting,
    },
    /// Undo one of our holds: always for real, whatever the mode.
    Undo(HoldRecord),
    Notify(Event),
    /// Read the evidence of a tripping breaker's cgroup (before its holds).
    Capture {
        key: Key,
        rel: String,
        log: Option<LogOf>,
    },
}

/// What a limit action sets, chosen from the snapshot when it is decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Setting {
    /// Freeze, kill and report take none.
    None,
    /// `throttle_memory`: `memory.high` at the working set.
    Bytes(u64),
    /// `limit_pids`: `pids.max` at the current count.
    Tasks(u64),
    /// `throttle_cpu`: this many cores.
    Cores(f64),
    /// `limit_connections`: connects per second, 0 refuses them all.
    Connects(u32),
    /// A limit held before a restart: the same value, and the value it first replaced.
    Restore(Limited),
}

/// What a `Hold` was for, so its outcome can be settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ticket {
    /// A breaker tripping now.
    Trip(Key),
    /// A new instance of a workload a breaker already holds.
    NewInstance(Key),
    /// A persisted hold re-applied after a restart.
    Restored(Key),
    /// The next step of a breaker's ladder: the step before did not stop the symptom.
    Escalate(Key),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    Pinned {
        pin: Pin,
        cgroups: Vec<ActedCgroup>,
    },
    Held {
        ticket: Ticket,
        outcome: Outcome,
        /// The cgroup, when it could be opened.
        cgroup: Option<ActedCgroup>,
        /// The limit set, for a limit action that was done.
        limited: Option<Limited>,
        instance: String,
    },
    Captured {
        key: Key,
        evidence: Evidence,
    },
}

/// A breaker whose holds are in flight: settled once their outcomes are back.
#[derive(Debug)]
struct Trip {
    target: Target,
    pending_for: Duration,
    outcomes: Vec<Outcome>,
}

pub struct Decider {
    cfg: GuardConfig,
    engine: RuleEngine,
    breakers: BTreeMap<Key, Breaker>,
    throttle: Throttle,
    protected_namespaces: Vec<String>,
    node: String,
    /// Cgroups pinned when a rule started pending on a target, used when it trips.
    pins: HashMap<Pin, Vec<ActedCgroup>>,
    trips: BTreeMap<Key, Trip>,
    actions: BTreeMap<(String, &'static str, &'static str), u64>,
    /// (rule, target) already logged as protected or deferred: logged once, not per tick.
    quiet: HashSet<(usize, Target, &'static str)>,
    /// Revisions replaced by a newer one, per identity, while they still run.
    superseded: HashMap<BreakerId, HashSet<String>>,
    pending: Vec<(usize, Target, Duration)>,
    /// `discovery.scopes`: a held cgroup outside them is not ours to hold.
    scopes: Vec<String>,
    /// The instance (container id) each pinned cgroup had when pinned, by path.
    pin_instances: HashMap<Pin, HashMap<String, String>>,
    /// Why no hold can be applied now (no state lock, no durable record): rules that would act
    /// are not tripped (nor paced) while it lasts.
    unable: Option<String>,
    /// What each release request of the last tick released, in the order given.
    released: Vec<Vec<state::ReleasedBreaker>>,
    /// The time of the call being decided (monotonic and wall), for the events' wall times.
    clock: (Instant, SystemTime),
}

/// `now + d`, saturating far in the future instead of overflowing (config bounds every duration;
/// this keeps arithmetic on a hold total even so).
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86400)))
        .unwrap_or(now)
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The wall-clock time of `at`, given that `now` is `wall`.
fn wall_of(now: Instant, wall: SystemTime, at: Instant) -> f64 {
    let t = if at >= now {
        wall.checked_add(at - now)
    } else {
        wall.checked_sub(now - at)
    };
    t.map(unix).unwrap_or(0.0)
}

impl Decider {
    /// `protected_namespaces` already lists the agent's own namespace, if it runs in one.
    pub fn new(cfg: GuardConfig, node: String, protected_namespaces: Vec<String>) -> Decider {
        Decider::scoped(cfg, node, protected_namespaces, vec!["/".into()])
    }

    /// A decider that holds nothing outside `scopes` (`discovery.scopes`).
    pub fn scoped(
        cfg: GuardConfig,
        node: String,
        protected_namespaces: Vec<String>,
        scopes: Vec<String>,
    ) -> Decider {
        Decider {
            scopes,
            pin_instances: HashMap::new(),
            unable: None,
            released: Vec::new(),
            clock: (Instant::now(), SystemTime::now()),
            engine: RuleEngine::new(cfg.rules.clone()),
            throttle: Throttle::new(cfg.cooldown, cfg.max_actions_per_10m),
            cfg,
            breakers: BTreeMap::new(),
            protected_namespaces,
            node,
            pins: HashMap::new(),
            trips: BTreeMap::new(),
            actions: BTreeMap::new(),
            quiet: HashSet::new(),
            superseded: HashMap::new(),
            pending: Vec::new(),
        }
    }

    /// Why a workload must not be acted on, if it must not.
    fn protected(&self, w: &WorkloadSignals) -> Option<&'static str> {
        let id = &w.id;
        self.protected_as(w.kind == Kind::Unit, &id.namespace, &id.pod, &id.container)
    }

    /// The same, from what a breaker keeps of its workload (a restored or reloaded one).
    fn protected_breaker(&self, b: &Breaker) -> Option<&'static str> {
        // Host units are the breakers without a namespace (`identity`).
        let unit = b.id.namespace.is_empty();
        if let Some(why) = self.protected_as(unit, &b.id.namespace, &b.pod, &b.id.container) {
            return Some(why);
        }
        if b.acted.iter().any(|c| !in_scopes(&self.scopes, &c.cgroup)) {
            return Some("outside discovery.scopes");
        }
        None
    }

    fn protected_as(
        &self,
        unit: bool,
        namespace: &str,
        pod: &str,
        container: &str,
    ) -> Option<&'static str> {
        if unit {
            if !self.cfg.host_units.iter().any(|u| u == container) {
                return Some("outside kubepods and not listed in guard.host_units");
            }
            return None;
        }
        if self.protected_namespaces.iter().any(|n| n == namespace) {
            return Some("protected namespace");
        }
        let full = format!("{namespace}/{pod}/{container}");
        if self.cfg.protect.workloads.iter().any(|g| glob(g, &full)) {
            return Some("protected by guard.protect.workloads");
        }
        None
    }

    fn event(
        &self,
        b: &Breaker,
        transition: &'static str,
        outcome: &str,
        pending_for: Duration,
    ) -> Event {
        let (now, wall) = self.clock;
        let holding = b.state == BreakerState::Open && b.hold_until.is_none_or(|t| t > now);
        // The alert is "nodeguard holds this workload": firing while the breaker is open, resolved
        // at every end of the hold (half-open included); a failed trip opened nothing.
        let alert = match transition {
            "opened" | "reapplied" | "escalated" | "restored" | "mode_changed" if holding => {
                AlertState::Firing
            }
            "action_failed" => AlertState::None,
            _ => AlertState::Resolved,
        };
        Event {
            transition,
            alert,
            namespace: b.id.namespace.clone(),
            pod: b.pod.clone(),
            container: b.id.container.clone(),
            owner: b.id.owner.clone(),
            rule: self.cfg.rules[b.rule].name.clone(),
            value: b.value,
            threshold: b.threshold,
            pending_for_seconds: pending_for.as_secs_f64(),
            action: b.action.as_str(),
            outcome: outcome.to_owned(),
            hold_seconds: b.hold_until.map(|_| b.hold.as_secs_f64()),
            dry_run: self.cfg.dry_run,
            node: self.node.clone(),
            reason: b.reason.clone(),
            evidence: b.evidence.clone(),
            at: unix(wall),
            started_at: wall_of(now, wall, b.opened_at),
            hold_ends_at: b.hold_until.map(|t| wall_of(now, wall, t)),
        }
    }

    /// Every call that can emit events starts here: their wall times are as of this call.
    fn at(&mut self, now: Instant, wall: SystemTime) {
        self.clock = (now, wall);
    }

    fn count(&mut self, rule: usize, action: &'static str, outcome: &'static str) {
        *self
            .actions
            .entry((self.cfg.rules[rule].name.clone(), action, outcome))
            .or_default() += 1;
    }

    /// One tick's decisions. Commands come in the order they must be applied: undos and
    /// notifications, then the state (write-ahead), then the new holds.
    pub fn decide(
        &mut self,
        now: Instant,
        wall: SystemTime,
        snap: &Snapshot,
        releases: &[ReleaseRequest],
    ) -> Vec<Command> {
        self.at(now, wall);
        let mut out = Vec::new();
        let mut holds = Vec::new();
        self.throttle.begin_tick();
        let mut changed = self.releases(releases, &mut out);
        // Expiring holds reset their rule's progress first, so a half-open workload must be past
        // the threshold for the full `for` again before it trips again.
        changed |= self.maintain(now, snap, &mut out, &mut holds);
        self.superseded.retain(|id, revs| {
            revs.retain(|r| {
                snap.workloads
                    .iter()
                    .any(|w| matches_id(id, w) && identity(w).1 == *r)
            });
            !revs.is_empty()
        });
        let ev = self.engine.evaluate(now, snap);
        self.track_pending(snap, &ev, &mut out);
        changed |= self.trip(now, snap, &ev, &mut out, &mut holds);
        self.pending = ev.pending;
        if changed || !holds.is_empty() {
            out.push(Command::Persist(self.state(now, wall)));
        }
        out.extend(holds);
        out
    }

    /// Pins the targets' cgroups when a rule starts pending, so the action later hits the same
    /// ones.
    fn track_pending(&mut self, snap: &Snapshot, ev: &Evaluation, out: &mut Vec<Command>) {
        let live: HashSet<Pin> = ev.pending.iter().map(|(r, k, _)| (*r, k.clone())).collect();
        let gone: Vec<Pin> = self
            .pins
            .keys()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        for pin in gone {
            self.pins.remove(&pin);
            self.pin_instances.remove(&pin);
            out.push(Command::Unpin(pin));
        }
        for pin in live {
            if pin.1 == Target::Node || self.pins.contains_key(&pin) {
                continue;
            }
            let pinned: Vec<(String, String)> = crate::rule::observe::targets(snap, &pin.1)
                .iter()
                .filter_map(|id| {
                    let w = snap.workloads.iter().find(|w| w.id == *id)?;
                    Some((
                        w.cgroup.clone()?,
                        w.container_id.clone().unwrap_or_default(),
                    ))
                })
                .collect();
            let rels = pinned.iter().map(|(rel, _)| rel.clone()).collect();
            self.pin_instances
                .insert(pin.clone(), pinned.into_iter().collect());
            // Filled in by the enforcer's report; an empty entry stops a second pin.
            self.pins.insert(pin.clone(), Vec::new());
            out.push(Command::Pin { pin, rels });
        }
    }

    /// Hold expiry, probation end, new revisions, and enforcement on new instances.
    fn maintain(
        &mut self,
        now: Instant,
        snap: &Snapshot,
        out: &mut Vec<Command>,
        holds: &mut Vec<Command>,
    ) -> bool {
        let mut changed = false;
        let keys: Vec<Key> = self.breakers.keys().cloned().collect();
        for key in keys {
            let Some(mut b) = self.breakers.remove(&key) else {
                continue;
            };
            let current = held_by(&b, snap);
            // The owner deployed something new: the breaker has done its job.
            if current.iter().any(|w| identity(w).1 != b.revision) {
                self.superseded
                    .entry(b.id.clone())
                    .or_default()
                    .insert(b.revision.clone());
                undo_all(&mut b, out);
                out.push(Command::Notify(self.event(
                    &b,
                    "reset_new_revision",
                    "thawed",
                    Duration::ZERO,
                )));
                changed = true;
                continue;
            }
            match b.state {
                BreakerState::Open if b.hold_until.is_some_and(|t| now >= t) => {
                    undo_all(&mut b, out);
                    b.state = BreakerState::HalfOpen;
                    b.probation_until = Some(later(now, self.cfg.probation));
                    let id = b.id.clone();
                    self.engine.reset_matching(b.rule, |k| covers(&id, k));
                    let e = self.event(&b, "half_open", "thawed", Duration::ZERO);
                    out.push(Command::Notify(e));
                    changed = true;
                }
                BreakerState::HalfOpen if b.probation_until.is_some_and(|t| now >= t) => {
                    let e = self.event(&b, "closed", "probation passed", Duration::ZERO);
                    out.push(Command::Notify(e));
                    changed = true;
                    continue;
                }
                BreakerState::Open if b.action != ActionKind::Report => {
                    // A restarted instance of a held workload is held too, at the same step.
                    let action = b.action.for_new_instance();
                    for w in current {
                        let inst = w.container_id.clone().unwrap_or_default();
                        let at = |c: &ActedCgroup| Some(c.cgroup.as_str()) == w.cgroup.as_deref();
                        let held =
                            b.acted.iter().any(at) || b.limited.iter().any(|l| at(&l.cgroup));
                        if held || b.enforced.contains(&inst) {
                            continue;
                        }
                        b.enforced.insert(inst.clone());
                        b.pod = w.id.pod.clone();
                        if let Some(rel) = w.cgroup.clone() {
                            holds.push(Command::Hold {
                                ticket: Ticket::NewInstance(key.clone()),
                                action,
                                rel,
                                ino: None,
                                instance: inst,
                                setting: self.setting(action, w),
                            });
                        }
                    }
                    changed |= self.verify_step(now, snap, &key, &mut b, out, holds);
                }
                _ => {}
            }
            self.breakers.insert(key, b);
        }
        changed
    }

    /// What a limit action sets on `w`, from the snapshot.
    fn setting(&self, action: ActionKind, w: &WorkloadSignals) -> Setting {
        let c = &self.cfg.containment;
        match action {
            ActionKind::ThrottleMemory => w
                .memory
                .as_ref()
                .map_or(Setting::None, |m| Setting::Bytes(m.value.working_set_bytes)),
            ActionKind::LimitPids => w
                .pids
                .as_ref()
                .map_or(Setting::None, |p| Setting::Tasks(p.value.current.max(1))),
            ActionKind::ThrottleCpu => Setting::Cores(c.cpu_cores),
            ActionKind::LimitConnections => Setting::Connects(c.connects_per_second),
            ActionKind::Freeze | ActionKind::Kill | ActionKind::Report => Setting::None,
        }
    }

    /// A ladder's step, checked every `verify_after`: if the symptom grew since the last check
    /// (by more than 2 %, the noise of a rate), the next step is applied on top (paced like a
    /// trip). A step that holds it keeps holding it; a symptom that grows again later
    /// escalates then.
    fn verify_step(
        &mut self,
        now: Instant,
        snap: &Snapshot,
        key: &Key,
        b: &mut Breaker,
        out: &mut Vec<Command>,
        holds: &mut Vec<Command>,
    ) -> bool {
        let rule = &self.cfg.rules[b.rule];
        let Some(&next) = rule.ladder.get(b.step + 1) else {
            return false;
        };
        if now.saturating_duration_since(b.step_since) < rule.verify_after {
            return false;
        }
        let Some(value) = symptom(snap, rule, &b.id) else {
            return false;
        };
        // 2 % of its size (the noise of a rate); a negated time grows towards zero.
        let grew = value > b.checked_value + 0.02 * b.checked_value.abs();
        if !grew {
            b.checked_value = value;
            b.step_since = now;
            return false;
        }
        if let Err(why) = self.throttle.check(now) {
            tracing::debug!(rule = %rule.name, why, "escalation deferred");
            return false;
        }
        self.throttle.record(now);
        let targets: Vec<&WorkloadSignals> = held_by(b, snap)
            .into_iter()
            .filter(|w| w.cgroup.is_some())
            .collect();
        let from = b.action;
        b.step += 1;
        b.action = next;
        b.step_since = now;
        b.checked_value = value;
        b.value = value;
        b.reason = format!(
            "{}; still growing under {} ({} -> {}): {}",
            b.reason
                .split("; still growing under")
                .next()
                .unwrap_or_default(),
            from.as_str(),
            round(b.checked_value),
            round(value),
            next.as_str()
        );
        for w in targets {
            if let Some(rel) = w.cgroup.clone() {
                holds.push(Command::Hold {
                    ticket: Ticket::Escalate(key.clone()),
                    action: next,
                    rel,
                    ino: None,
                    instance: w.container_id.clone().unwrap_or_default(),
                    setting: self.setting(next, w),
                });
            }
        }
        let e = self.event(b, "escalated", from.as_str(), Duration::ZERO);
        out.push(Command::Notify(e));
        true
    }

    fn trip(
        &mut self,
        now: Instant,
        snap: &Snapshot,
        ev: &Evaluation,
        out: &mut Vec<Command>,
        holds: &mut Vec<Command>,
    ) -> bool {
        let mut changed = false;
        for f in &ev.firing {
            // Only live instances can be acted on: a crash-looping container between two
            // restarts has none, and must not use up the node's pacing.
            let targets: Vec<&WorkloadSignals> = crate::rule::observe::targets(snap, &f.target)
                .iter()
                .filter_map(|id| {
                    snap.workloads
                        .iter()
                        .find(|w| w.id == *id && w.cgroup.is_some())
                })
                .collect();
            let Some(first) = targets.first() else {
                continue;
            };
            let (mut id, revision) = identity(first);
            if matches!(f.target, Target::Pod { .. }) {
                id.container.clear();
            }
            // A revision the owner has already replaced is never tripped again (its history
            // is still in the rule's window while the rollout finishes).
            if self
                .superseded
                .get(&id)
                .is_some_and(|r| r.contains(&revision))
            {
                continue;
            }
            let key = (id, f.rule);
            let previous = match self.breakers.get(&key) {
                Some(b) if b.state == BreakerState::Open => continue,
                Some(b) => Some(b.hold),
                None => None,
            };
            if let Some(reason) = targets.iter().find_map(|w| self.protected(w)) {
                if self.quiet.insert((f.rule, f.target.clone(), "protected")) {
                    tracing::info!(rule = %self.cfg.rules[f.rule].name, target = %f.target, reason, "rule holds on a protected workload: not acting");
                }
                continue;
            }
            let rule = self.cfg.rules[f.rule].clone();
            let writes = rule.action != ActionKind::Report && !self.cfg.dry_run;
            if let (true, Some(why)) = (writes, &self.unable) {
                // Said and counted once per target while it lasts, never per tick; the pacing
                // is kept for when the guard can act again.
                if self.quiet.insert((f.rule, f.target.clone(), "unable")) {
                    tracing::warn!(rule = %rule.name, target = %f.target, why, "rule holds but the guard cannot act");
                    self.count(
                        f.rule,
                        rule.action.as_str(),
                        Outcome::Failed(String::new()).as_str(),
                    );
                }
                continue;
            }
            if rule.action != ActionKind::Report {
                if let Err(why) = self.throttle.check(now) {
                    if self.quiet.insert((f.rule, f.target.clone(), "deferred")) {
                        tracing::info!(rule = %rule.name, target = %f.target, why, "action deferred");
                    }
                    continue;
                }
                self.throttle.record(now);
            }
            // Acting again: a later protection or deferral is news. A failure stays quiet
            // until an action succeeds (`finish_trip`).
            self.quiet
                .retain(|(r, t, why)| !(*r == f.rule && *t == f.target && *why != "failed"));
            let hold = next_hold(rule.hold, previous, self.cfg.max_hold);
            let signal = match &rule.condition {
                Condition::Threshold { signal, .. } => format!("{signal:?}"),
                Condition::RestartLoop(_) => "restart bursts".to_owned(),
            };
            let pin = (f.rule, f.target.clone());
            let pinned = self.pins.remove(&pin).unwrap_or_default();
            let instances = self.pin_instances.remove(&pin).unwrap_or_default();
            let mut b = Breaker {
                id: key.0.clone(),
                rule: f.rule,
                action: rule.action,
                state: BreakerState::Open,
                pod: first.id.pod.clone(),
                revision: revision.clone(),
                reason: reason(&signal, f),
                value: f.value,
                threshold: f.threshold,
                opened_at: now,
                hold_until: hold.map(|h| later(now, h)),
                probation_until: None,
                hold: hold.unwrap_or_default(),
                trips: self.breakers.get(&key).map_or(0, |b| b.trips) + 1,
                acted: Vec::new(),
                limited: Vec::new(),
                step: 0,
                step_since: now,
                // Measured as every later check is.
                checked_value: symptom(snap, &rule, &key.0)
                    .unwrap_or(f.contributor_value.unwrap_or(f.value)),
                evidence: None,
                enforced: HashSet::new(),
                spared_pods: snap
                    .workloads
                    .iter()
                    .filter(|w| matches_id(&key.0, w) && w.id.pod != first.id.pod)
                    .map(|w| w.id.pod.clone())
                    .collect(),
            };
            let mut trip = Trip {
                target: f.target.clone(),
                pending_for: f.pending_for,
                outcomes: Vec::new(),
            };
            // What the owner needs to understand it, read before anything is done to it.
            if let Some(rel) = first.cgroup.clone() {
                holds.push(Command::Capture {
                    key: key.clone(),
                    rel,
                    log: first.pod_uid.as_ref().map(|uid| LogOf {
                        namespace: first.id.namespace.clone(),
                        pod: first.id.pod.clone(),
                        pod_uid: uid.clone(),
                        container: first.id.container.clone(),
                    }),
                });
            }
            for w in &targets {
                let Some(rel) = w.cgroup.clone() else {
                    continue;
                };
                if rule.action == ActionKind::Report {
                    // A report touches no cgroup: it is done as soon as it is recorded.
                    self.count(f.rule, rule.action.as_str(), Outcome::Done.as_str());
                    b.enforced
                        .insert(w.container_id.clone().unwrap_or_default());
                    trip.outcomes.push(Outcome::Done);
                    continue;
                }
                // The inode recorded when the rule started pending; a target without one is
                // opened now. The same instance recreated at the path (a unit restarted in
                // place) is the same workload: it is held, not reported replaced.
                let instance = w.container_id.clone().unwrap_or_default();
                let same_instance = instances
                    .get(&rel)
                    .is_some_and(|i| !i.is_empty() && *i == instance);
                let ino = pinned
                    .iter()
                    .find(|p| p.cgroup == rel)
                    .map(|p| p.inode)
                    .filter(|_| !same_instance);
                holds.push(Command::Hold {
                    ticket: Ticket::Trip(key.clone()),
                    action: rule.action,
                    rel,
                    ino,
                    instance: w.container_id.clone().unwrap_or_default(),
                    setting: self.setting(rule.action, w),
                });
            }
            // Let go of the pinned cgroups once the holds have used them.
            holds.push(Command::Unpin(pin));
            self.breakers.insert(key.clone(), b);
            if rule.action == ActionKind::Report {
                self.finish_trip(&key, trip, out);
            } else {
                self.trips.insert(key, trip);
            }
            changed = true;
        }
        changed
    }

    /// A tripping breaker whose outcomes are all in: it opens if any action was done.
    fn finish_trip(&mut self, key: &Key, trip: Trip, out: &mut Vec<Command>) {
        if trip.outcomes.contains(&Outcome::Replaced) {
            // No action ever ran on the cgroup now at that path: its rule starts from zero.
            let target = trip.target.clone();
            self.engine.reset_matching(key.1, |k| *k == target);
        }
        let ok = trip
            .outcomes
            .iter()
            .any(|o| matches!(o, Outcome::Done | Outcome::DryRun));
        let Some(b) = self.breakers.remove(key) else {
            return;
        };
        let transition = if ok { "opened" } else { "action_failed" };
        // A failure that repeats (a full state disk, a refused subtree) is announced once, not
        // at every retry; the count in `nodeguard_actions_total` still moves.
        let failed = (key.1, trip.target.clone(), "failed");
        let again = if ok {
            self.quiet.remove(&failed);
            false
        } else {
            !self.quiet.insert(failed)
        };
        if !again {
            let e = self.event(&b, transition, &summarize(&trip.outcomes), trip.pending_for);
            out.push(Command::Notify(e));
        }
        // Nothing done: no breaker, the rule is re-checked after the cool-down.
        if ok {
            self.breakers.insert(key.clone(), b);
        }
    }

    /// Takes the enforcer's outcomes; returns the notifications and the state they change.
    pub fn settle(&mut self, now: Instant, wall: SystemTime, reports: Vec<Report>) -> Vec<Command> {
        self.at(now, wall);
        let mut out = Vec::new();
        let mut changed = false;
        for r in reports {
            match r {
                Report::Pinned { pin, cgroups } => {
                    if let Some(p) = self.pins.get_mut(&pin) {
                        *p = cgroups;
                    }
                }
                Report::Captured { key, evidence } => {
                    if let Some(b) = self.breakers.get_mut(&key) {
                        b.evidence = Some(evidence);
                        changed = true;
                    }
                }
                Report::Held {
                    ticket,
                    outcome,
                    cgroup,
                    limited,
                    instance,
                } => {
                    changed = true;
                    self.settle_hold(ticket, outcome, cgroup, limited, instance, &mut out);
                }
            }
        }
        for (key, trip) in std::mem::take(&mut self.trips) {
            self.finish_trip(&key, trip, &mut out);
        }
        if changed {
            out.push(Command::Persist(self.state(now, wall)));
        }
        out
    }

    fn settle_hold(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        cgroup: Option<ActedCgroup>,
        limited: Option<Limited>,
        instance: String,
        out: &mut Vec<Command>,
    ) {
        let key = match &ticket {
            Ticket::Trip(k)
            | Ticket::NewInstance(k)
            | Ticket::Restored(k)
            | Ticket::Escalate(k) => k.clone(),
        };
        let Some(mut b) = self.breakers.remove(&key) else {
            // A hold whose breaker is gone meanwhile must not stay.
            if outcome == Outcome::Done {
                if let Some(l) = limited {
                    out.push(Command::Undo(HoldRecord::Limited(l)));
                } else if let Some(c) = cgroup {
                    out.push(Command::Undo(HoldRecord::Frozen(c)));
                }
            }
            return;
        };
        // A limit that was set is the breaker's to restore, whatever the ticket.
        if let (Outcome::Done, Some(l)) = (&outcome, &limited) {
            // One record per cgroup and knob: a re-applied limit replaces its old record.
            b.limited
                .retain(|o| !(o.cgroup == l.cgroup && o.knob == l.knob));
            b.limited.push(l.clone());
        }
        // Every freeze that was done is the breaker's to undo: its trip's own, and the freeze of
        // a new or restored instance whatever the breaker's action (a kill rule freezes the next
        // instance).
        // A freeze: the trip's own, or a new, restored or escalated instance's (a kill rule
        // freezes the next instance); never a limit's cgroup.
        let froze = limited.is_none()
            && match ticket {
                Ticket::Trip(_) | Ticket::Escalate(_) => b.action == ActionKind::Freeze,
                Ticket::NewInstance(_) | Ticket::Restored(_) => true,
            };
        let frozen = outcome == Outcome::Done && froze;
        match ticket {
            Ticket::Trip(_) => {
                self.count(b.rule, b.action.as_str(), outcome.as_str());
                if matches!(outcome, Outcome::Done | Outcome::DryRun) {
                    b.enforced.insert(instance);
                }
                if let Some(t) = self.trips.get_mut(&key) {
                    t.outcomes.push(outcome);
                }
            }
            // A cgroup gone before it could be opened: churn, nothing was tried.
            Ticket::NewInstance(_) if outcome == Outcome::Gone && cgroup.is_none() => {}
            Ticket::NewInstance(_) => {
                self.count(
                    b.rule,
                    b.action.for_new_instance().as_str(),
                    outcome.as_str(),
                );
                let e = self.event(&b, "reapplied", outcome.as_str(), Duration::ZERO);
                out.push(Command::Notify(e));
            }
            Ticket::Escalate(_) => {
                self.count(b.rule, b.action.as_str(), outcome.as_str());
            }
            Ticket::Restored(_) => {
                // Not ours to hold any more (replaced, protected, or no durable record): the
                // enforcer thaws what it does not hold.
            }
        }
        // Only what was really frozen is ours to thaw.
        if frozen {
            if let Some(c) = cgroup {
                if !b.acted.contains(&c) {
                    b.acted.push(c);
                }
            }
        }
        self.breakers.insert(key, b);
    }

    fn releases(&mut self, requests: &[ReleaseRequest], out: &mut Vec<Command>) -> bool {
        let mut changed = false;
        self.released.clear();
        for req in requests {
            let keys: Vec<Key> = self
                .breakers
                .iter()
                .filter(|((id, r), b)| req.matches(id, &b.pod, &self.cfg.rules[*r].name))
                .map(|(k, _)| k.clone())
                .collect();
            let mut released = Vec::new();
            for k in keys {
                if let Some(mut b) = self.breakers.remove(&k) {
                    undo_all(&mut b, out);
                    // Released means released: the rule must hold for its full `for` again.
                    let id = b.id.clone();
                    self.engine.reset_matching(b.rule, |t| covers(&id, t));
                    let e = self.event(&b, "released", "thawed by hand", Duration::ZERO);
                    out.push(Command::Notify(e));
                    released.push(state::ReleasedBreaker {
                        rule: self.cfg.rules[b.rule].name.clone(),
                        namespace: b.id.namespace.clone(),
                        pod: b.pod.clone(),
                        container: b.id.container.clone(),
                        action: b.action.as_str().to_owned(),
                    });
                    changed = true;
                }
            }
            self.released.push(released);
        }
        changed
    }

    /// What each release request given to the last [`Decider::decide`] released, in order.
    pub fn take_released(&mut self) -> Vec<Vec<state::ReleasedBreaker>> {
        std::mem::take(&mut self.released)
    }

    pub fn dry_run(&self) -> bool {
        self.cfg.dry_run
    }

    /// Why the enforcer cannot apply a hold now, if it cannot.
    pub fn set_unable(&mut self, why: Option<String>) {
        if why.is_none() {
            self.quiet.retain(|(_, _, k)| *k != "unable");
        }
        self.unable = why;
    }

    /// Cgroups another hand thawed while held: the kernel says they are not held, so neither
    /// do we. The policy is that of a hand release (the operator who thawed it meant it): the
    /// breaker is released, its other cgroups thawed; a symptom that persists trips the rule
    /// again after its `for`.
    pub fn thawed_outside(
        &mut self,
        now: Instant,
        wall: SystemTime,
        thawed: &[ActedCgroup],
    ) -> Vec<Command> {
        self.at(now, wall);
        let mut out = Vec::new();
        let keys: Vec<Key> = self
            .breakers
            .iter()
            .filter(|(_, b)| b.acted.iter().any(|c| thawed.contains(c)))
            .map(|(k, _)| k.clone())
            .collect();
        for k in &keys {
            if let Some(mut b) = self.breakers.remove(k) {
                b.acted.retain(|c| !thawed.contains(c));
                undo_all(&mut b, &mut out);
                let id = b.id.clone();
                self.engine.reset_matching(b.rule, |t| covers(&id, t));
                let e = self.event(&b, "released", "thawed outside nodeguard", Duration::ZERO);
                out.push(Command::Notify(e));
            }
        }
        if !keys.is_empty() {
            out.push(Command::Persist(self.state(now, wall)));
        }
        out
    }

    /// The same decider with nothing decided: for an instance that just took the state lock,
    /// whose earlier decisions were never applied.
    pub fn fresh(&self) -> Decider {
        Decider::scoped(
            self.cfg.clone(),
            self.node.clone(),
            self.protected_namespaces.clone(),
            self.scopes.clone(),
        )
    }
}

/// Undoes every hold of a breaker: what it froze, and every limit it set.
fn undo_all(b: &mut Breaker, out: &mut Vec<Command>) {
    out.extend(
        b.acted
            .drain(..)
            .map(|c| Command::Undo(HoldRecord::Frozen(c))),
    );
    out.extend(
        b.limited
            .drain(..)
            .map(|l| Command::Undo(HoldRecord::Limited(l))),
    );
    b.enforced.clear();
}

/// The rule's symptom on what the breaker holds now, as a value that grows when it worsens:
/// the held targets' own value (a node rule's: its contributor's level, as conntrack entries of
/// the pod), the largest among them; a time to full (`below`) counts down, so it is negated.
fn symptom(snap: &Snapshot, rule: &crate::model::Rule, id: &BreakerId) -> Option<f64> {
    let Condition::Threshold { signal, spec, .. } = &rule.condition else {
        return None;
    };
    let (kind, sign) = match signal.contributor() {
        Some(level) => (level, 1.0),
        None if spec.direction == crate::model::Direction::Below => (*signal, -1.0),
        None => (*signal, 1.0),
    };
    crate::rule::observe::observe(snap, kind)
        .into_iter()
        .filter(|o| !o.stale && covers(id, &o.key))
        .map(|o| sign * o.value)
        .reduce(f64::max)
}

fn summarize(outcomes: &[Outcome]) -> String {
    let mut parts: Vec<String> = outcomes
        .iter()
        .map(|o| match o {
            Outcome::Failed(e) => format!("failed: {e}"),
            o => o.as_str().to_owned(),
        })
        .collect();
    parts.dedup();
    if parts.is_empty() {
        "no target cgroup".to_owned()
    } else {
        parts.join("; ")
    }
}

fn reason(signal: &str, f: &Firing) -> String {
    let mut r = format!(
        "{signal} = {} above {} for {}s",
        round(f.value),
        round(f.threshold),
        f.pending_for.as_secs()
    );
    if let Some(c) = f.contributor_value {
        r.push_str(&format!("; top contributor holds {}", round(c)));
    }
    r
}

fn round(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}
