//! The guard: each tick, rules are evaluated on the snapshot; a rule that holds trips a breaker
//! on exactly the offending workload, paced node-wide, announced once; breakers are enforced on
//! new instances, released after their hold (half-open), reset by a new revision, persisted.

use super::breaker::{next_hold, Breaker, BreakerId, BreakerState};
use super::cgroup::CgroupHandle;
use super::enforce::Enforcer;
use super::notify::{Event, Notifier};
use super::owner::owner_of;
use super::state::{self, ActedCgroup, PersistedBreaker, StateFile};
use super::throttle::Throttle;
use super::Outcome;
use crate::clock::Clock;
use crate::config::guard::GuardConfig;
use crate::rule::signal::Target;
use crate::rule::{ActionKind, Condition, Evaluation, Firing, RuleEngine};
use crate::snapshot::{BreakerView, GuardStatus, Kind, PendingView, Snapshot, WorkloadSignals};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

type Key = (BreakerId, usize);

pub struct Guard {
    cfg: GuardConfig,
    clock: Arc<dyn Clock>,
    engine: RuleEngine,
    breakers: BTreeMap<Key, Breaker>,
    throttle: Throttle,
    enforcer: Enforcer,
    /// Cgroups we froze whose thaw failed: retried every tick, persisted until thawed.
    unthawed: Vec<CgroupHandle>,
    /// Where an unreadable state file was moved at start, if it was.
    state_quarantined: Option<String>,
    notifier: Notifier,
    protected_namespaces: Vec<String>,
    node: String,
    /// Handles opened when a rule's hold started on a target, used when it trips.
    pending_handles: HashMap<(usize, Target), Vec<CgroupHandle>>,
    actions: BTreeMap<(String, &'static str, &'static str), u64>,
    /// (rule, target) already logged as protected or deferred: logged once, not per tick.
    quiet: HashSet<(usize, Target, &'static str)>,
    /// Revisions replaced by a newer one, per identity, while they still run.
    superseded: HashMap<BreakerId, HashSet<String>>,
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

/// Simple `*`/`?` glob; protection lists are short and patterns trivial.
pub fn glob(pattern: &str, text: &str) -> bool {
    fn m(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some(b'*'), _) => m(&p[1..], t) || (!t.is_empty() && m(p, &t[1..])),
            (Some(b'?'), Some(_)) => m(&p[1..], &t[1..]),
            (Some(a), Some(b)) if a == b => m(&p[1..], &t[1..]),
            _ => false,
        }
    }
    m(pattern.as_bytes(), text.as_bytes())
}

/// A workload's breaker identity and revision.
pub fn identity(w: &WorkloadSignals) -> (BreakerId, String) {
    if w.kind == Kind::Unit {
        return (
            BreakerId {
                namespace: String::new(),
                owner: w.id.container.clone(),
                container: w.id.container.clone(),
            },
            String::new(),
        );
    }
    let o = owner_of(&w.id.pod, w.pod_uid.as_deref().unwrap_or(""));
    (
        BreakerId {
            namespace: w.id.namespace.clone(),
            owner: o.name,
            container: w.id.container.clone(),
        },
        o.revision,
    )
}

/// A rule target that belongs to what a breaker holds (its owner, one container or all).
fn covers(id: &BreakerId, k: &Target) -> bool {
    match k {
        Target::Workload(w) => {
            w.namespace == id.namespace
                && owner_of(&w.pod, "").name == id.owner
                && (id.container.is_empty() || w.container == id.container)
        }
        Target::Pod { namespace, pod } => {
            *namespace == id.namespace
                && owner_of(pod, "").name == id.owner
                && id.container.is_empty()
        }
        Target::Node => false,
    }
}

fn matches_id(id: &BreakerId, w: &WorkloadSignals) -> bool {
    let (wid, _) = identity(w);
    wid.namespace == id.namespace
        && wid.owner == id.owner
        && (id.container.is_empty() || wid.container == id.container)
}

/// The workloads a breaker holds now: its identity, minus replicas it spared.
fn held_by<'a>(b: &Breaker, snap: &'a Snapshot) -> Vec<&'a WorkloadSignals> {
    snap.workloads
        .iter()
        .filter(|w| {
            w.cgroup.is_some() && matches_id(&b.id, w) && !b.spared_pods.contains(&w.id.pod)
        })
        .collect()
}

impl Guard {
    pub fn new(cfg: GuardConfig, clock: Arc<dyn Clock>, enforcer: Enforcer, node: String) -> Guard {
        let mut protected_namespaces = cfg.protect.namespaces.clone();
        if let Ok(ns) = std::env::var("POD_NAMESPACE") {
            if !ns.is_empty() && !protected_namespaces.contains(&ns) {
                protected_namespaces.push(ns);
            }
        }
        let mut g = Guard {
            engine: RuleEngine::new(cfg.rules.clone()),
            throttle: Throttle::new(cfg.cooldown, cfg.max_actions_per_10m),
            notifier: Notifier::new(Some(cfg.webhook_url.clone())),
            cfg,
            clock,
            breakers: BTreeMap::new(),
            enforcer,
            unthawed: Vec::new(),
            state_quarantined: None,
            protected_namespaces,
            node,
            pending_handles: HashMap::new(),
            actions: BTreeMap::new(),
            quiet: HashSet::new(),
            superseded: HashMap::new(),
        };
        g.restore();
        g
    }

    pub fn dry_run(&self) -> bool {
        self.cfg.dry_run
    }

    /// Why a workload must not be acted on, if it must not.
    fn protected(&self, w: &WorkloadSignals) -> Option<&'static str> {
        if w.kind == Kind::Unit {
            if !self.cfg.host_units.contains(&w.id.container) {
                return Some("outside kubepods and not listed in guard.host_units");
            }
            return None;
        }
        if self.protected_namespaces.contains(&w.id.namespace) {
            return Some("protected namespace");
        }
        let full = format!("{}/{}/{}", w.id.namespace, w.id.pod, w.id.container);
        if self.cfg.protect.workloads.iter().any(|g| glob(g, &full)) {
            return Some("protected by guard.protect.workloads");
        }
        None
    }

    fn wall(&self, now: Instant, at: Instant) -> f64 {
        let w = self.clock.wall();
        let t = if at >= now {
            w.checked_add(at - now)
        } else {
            w.checked_sub(now - at)
        };
        t.map(unix).unwrap_or(0.0)
    }

    fn event(
        &self,
        b: &Breaker,
        transition: &'static str,
        outcome: &str,
        held_for: Duration,
    ) -> Event {
        Event {
            transition,
            namespace: b.id.namespace.clone(),
            pod: b.pod.clone(),
            container: b.id.container.clone(),
            owner: b.id.owner.clone(),
            rule: self.cfg.rules[b.rule].name.clone(),
            value: b.value,
            threshold: b.threshold,
            held_for_seconds: held_for.as_secs_f64(),
            action: b.action.as_str(),
            outcome: outcome.to_owned(),
            hold_seconds: b.hold_until.map(|_| b.hold.as_secs_f64()),
            dry_run: self.cfg.dry_run,
            node: self.node.clone(),
            reason: b.reason.clone(),
        }
    }

    fn count(&mut self, rule: usize, action: &'static str, outcome: &'static str) {
        *self
            .actions
            .entry((self.cfg.rules[rule].name.clone(), action, outcome))
            .or_default() += 1;
    }

    pub fn step(&mut self, snap: &Snapshot) -> GuardStatus {
        let now = self.clock.now();
        self.throttle.begin_tick();
        let mut changed = self.retry_thaws();
        changed |= self.releases();
        // Expiring holds reset their rule's progress first, so a half-open workload must hold
        // the full `for` again before it trips again.
        changed |= self.maintain(now, snap);
        self.superseded.retain(|id, revs| {
            revs.retain(|r| {
                snap.workloads
                    .iter()
                    .any(|w| matches_id(id, w) && identity(w).1 == *r)
            });
            !revs.is_empty()
        });
        let ev = self.engine.evaluate(now, snap);
        self.track_pending(snap, &ev);
        changed |= self.trip(now, snap, &ev);
        if changed {
            self.persist();
        }
        self.status(now, &ev)
    }

    /// Opens the targets' cgroups when a hold starts, so the action later hits the same ones.
    fn track_pending(&mut self, snap: &Snapshot, ev: &Evaluation) {
        let live: HashSet<(usize, Target)> =
            ev.pending.iter().map(|(r, k, _)| (*r, k.clone())).collect();
        self.pending_handles.retain(|k, _| live.contains(k));
        for (rule, key) in live {
            if key == Target::Node || self.pending_handles.contains_key(&(rule, key.clone())) {
                continue;
            }
            let handles = crate::rule::signal::targets(snap, &key)
                .iter()
                .filter_map(|id| {
                    snap.workloads
                        .iter()
                        .find(|w| w.id == *id)?
                        .cgroup
                        .as_deref()
                })
                .filter_map(|rel| self.enforcer.open(rel).ok())
                .collect();
            self.pending_handles.insert((rule, key), handles);
        }
    }

    /// Hold expiry, probation end, new revisions, and enforcement on new instances.
    fn maintain(&mut self, now: Instant, snap: &Snapshot) -> bool {
        let mut changed = false;
        // New instances of held workloads, held after the loop (each recorded before it is).
        let mut to_hold: Vec<(Key, String)> = Vec::new();
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
                self.thaw_all(&mut b);
                let e = self.event(&b, "reset_new_revision", "thawed", Duration::ZERO);
                self.notifier.send(e);
                changed = true;
                continue;
            }
            match b.state {
                BreakerState::Open if b.hold_until.is_some_and(|t| now >= t) => {
                    self.thaw_all(&mut b);
                    b.state = BreakerState::HalfOpen;
                    b.probation_until = Some(later(now, self.cfg.probation));
                    let id = b.id.clone();
                    self.engine.reset_matching(b.rule, |k| covers(&id, k));
                    let e = self.event(&b, "half_open", "thawed", Duration::ZERO);
                    self.notifier.send(e);
                    changed = true;
                }
                BreakerState::HalfOpen if b.probation_until.is_some_and(|t| now >= t) => {
                    let e = self.event(&b, "closed", "probation passed", Duration::ZERO);
                    self.notifier.send(e);
                    changed = true;
                    continue;
                }
                BreakerState::Open if b.action != ActionKind::Report => {
                    // A restarted instance of a held workload is held too.
                    for w in current {
                        let inst = w.container_id.clone().unwrap_or_default();
                        let held = b
                            .acted
                            .iter()
                            .any(|h| Some(h.rel.as_str()) == w.cgroup.as_deref());
                        if held || b.enforced.contains(&inst) {
                            continue;
                        }
                        b.enforced.insert(inst);
                        b.pod = w.id.pod.clone();
                        if let Some(rel) = w.cgroup.as_deref() {
                            to_hold.push((key.clone(), rel.to_owned()));
                        }
                    }
                }
                _ => {}
            }
            self.breakers.insert(key, b);
        }
        for (key, rel) in to_hold {
            changed |= self.hold_new_instance(&key, &rel);
        }
        changed
    }

    /// Freezes a new instance of a held workload: recorded in the state file first.
    fn hold_new_instance(&mut self, key: &Key, rel: &str) -> bool {
        let h = match self.enforcer.open(rel) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(cgroup = rel, error = %e, "cannot open a held workload's cgroup");
                return false;
            }
        };
        let Some(b) = self.breakers.get_mut(key) else {
            return false;
        };
        let h = if self.cfg.dry_run {
            h
        } else {
            b.acted.push(h);
            self.persist();
            match self.breakers.get_mut(key).and_then(|b| b.acted.pop()) {
                Some(h) => h,
                None => return false,
            }
        };
        let Some(mut b) = self.breakers.remove(key) else {
            return false;
        };
        let out = self.enforcer.apply(ActionKind::Freeze, &h);
        self.count(b.rule, "freeze", out.as_str());
        let e = self.event(&b, "reapplied", out.as_str(), Duration::ZERO);
        self.notifier.send(e);
        if out == Outcome::Done {
            b.acted.push(h);
        }
        self.breakers.insert(key.clone(), b);
        true
    }

    /// Undoes every hold of a breaker; a thaw that fails is kept and retried every tick.
    fn thaw_all(&mut self, b: &mut Breaker) {
        for h in b.acted.drain(..) {
            if let Outcome::Failed(_) = self.enforcer.undo(&h) {
                self.unthawed.push(h);
            }
        }
        b.enforced.clear();
    }

    fn retry_thaws(&mut self) -> bool {
        if self.unthawed.is_empty() {
            return false;
        }
        let before = self.unthawed.len();
        let pending = std::mem::take(&mut self.unthawed);
        for h in pending {
            if let Outcome::Failed(_) = self.enforcer.undo(&h) {
                self.unthawed.push(h);
            }
        }
        self.unthawed.len() != before
    }

    fn trip(&mut self, now: Instant, snap: &Snapshot, ev: &Evaluation) -> bool {
        let mut changed = false;
        for f in &ev.firing {
            // Only live instances can be acted on: a crash-looping container between two
            // restarts has none, and must not use up the node's pacing.
            let targets: Vec<&WorkloadSignals> = crate::rule::signal::targets(snap, &f.target)
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
            // still holds in the rule's window while the rollout finishes).
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
            if rule.action != ActionKind::Report {
                if let Err(why) = self.throttle.check(now) {
                    if self.quiet.insert((f.rule, f.target.clone(), "deferred")) {
                        tracing::info!(rule = %rule.name, target = %f.target, why, "action deferred");
                    }
                    continue;
                }
            }
            self.quiet
                .retain(|(r, t, _)| !(*r == f.rule && *t == f.target));
            let hold = next_hold(rule.hold, previous, self.cfg.max_hold);
            let mut handles = self
                .pending_handles
                .remove(&(f.rule, f.target.clone()))
                .unwrap_or_default();
            // Each target's handle: the one opened when the hold started, else opened now.
            let opened: Vec<(&WorkloadSignals, std::io::Result<CgroupHandle>)> = targets
                .iter()
                .filter_map(|w| {
                    let rel = w.cgroup.as_deref()?;
                    let h = match handles.iter().position(|h| h.rel == rel) {
                        Some(i) => Ok(handles.swap_remove(i)),
                        None => self.enforcer.open(rel),
                    };
                    Some((*w, h))
                })
                .collect();
            let signal = match &rule.condition {
                Condition::Threshold { signal, .. } => format!("{signal:?}"),
                Condition::RestartLoop(_) => "restart bursts".to_owned(),
            };
            let trips = self.breakers.get(&key).map_or(0, |b| b.trips);
            let spared_pods = snap
                .workloads
                .iter()
                .filter(|w| matches_id(&key.0, w) && w.id.pod != first.id.pod)
                .map(|w| w.id.pod.clone())
                .collect();
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
                trips: trips + 1,
                acted: Vec::new(),
                enforced: HashSet::new(),
                spared_pods,
            };
            let mut planned = Vec::new();
            let mut outcomes = Vec::new();
            for (w, h) in opened {
                match h {
                    // A report touches no cgroup: it holds as soon as it is recorded.
                    _ if rule.action == ActionKind::Report => {
                        self.count(f.rule, rule.action.as_str(), Outcome::Done.as_str());
                        b.enforced
                            .insert(w.container_id.clone().unwrap_or_default());
                        outcomes.push(Outcome::Done);
                    }
                    Ok(h) => planned.push((w, h)),
                    Err(e) => {
                        let rel = w.cgroup.as_deref().unwrap_or_default();
                        let out = Outcome::Failed(format!("open {rel}: {e}"));
                        self.count(f.rule, rule.action.as_str(), out.as_str());
                        outcomes.push(out);
                    }
                }
            }
            // Write-ahead: the breaker and every cgroup it is about to freeze are durable before
            // the first write to a cgroup (the enforcer refuses to act otherwise).
            let (workloads, mut hs): (Vec<&WorkloadSignals>, Vec<CgroupHandle>) =
                planned.into_iter().unzip();
            if rule.action != ActionKind::Report {
                if rule.action == ActionKind::Freeze && !self.cfg.dry_run {
                    b.acted = std::mem::take(&mut hs);
                }
                self.breakers.insert(key.clone(), b);
                self.persist();
                b = match self.breakers.remove(&key) {
                    Some(b) => b,
                    None => continue,
                };
                if rule.action == ActionKind::Freeze && !self.cfg.dry_run {
                    hs = std::mem::take(&mut b.acted);
                }
            }
            for (w, h) in workloads.into_iter().zip(hs) {
                let out = self.enforcer.apply(rule.action, &h);
                self.count(f.rule, rule.action.as_str(), out.as_str());
                if matches!(out, Outcome::Done | Outcome::DryRun) {
                    b.enforced
                        .insert(w.container_id.clone().unwrap_or_default());
                }
                // Only what was really frozen is ours to thaw.
                if out == Outcome::Done && rule.action == ActionKind::Freeze {
                    b.acted.push(h);
                }
                outcomes.push(out);
            }
            if rule.action != ActionKind::Report {
                self.throttle.record(now);
            }
            if outcomes.contains(&Outcome::Replaced) {
                // No hold ever ran on the cgroup now at that path: it starts from zero.
                let target = f.target.clone();
                self.engine.reset_matching(f.rule, |k| *k == target);
            }
            let ok = outcomes
                .iter()
                .any(|o| matches!(o, Outcome::Done | Outcome::DryRun));
            let outcome = summarize(&outcomes);
            let transition = if ok { "opened" } else { "action_failed" };
            let e = self.event(&b, transition, &outcome, f.held_for);
            self.notifier.send(e);
            if ok {
                self.breakers.insert(key, b);
            } else {
                // Nothing was held: no breaker, the rule is re-checked after the cool-down.
                self.breakers.remove(&key);
            }
            changed = true;
        }
        changed
    }

    fn releases(&mut self) -> bool {
        let mut changed = false;
        for req in state::take_releases(&self.cfg.state_file) {
            let keys: Vec<Key> = self
                .breakers
                .iter()
                .filter(|((id, r), b)| {
                    id.namespace == req.namespace
                        && (id.owner == req.pod || b.pod == req.pod)
                        && id.container == req.container
                        && req
                            .rule
                            .as_ref()
                            .is_none_or(|n| *n == self.cfg.rules[*r].name)
                })
                .map(|(k, _)| k.clone())
                .collect();
            for k in keys {
                if let Some(mut b) = self.breakers.remove(&k) {
                    self.thaw_all(&mut b);
                    let e = self.event(&b, "released", "thawed by hand", Duration::ZERO);
                    self.notifier.send(e);
                    changed = true;
                }
            }
        }
        changed
    }

    /// Fail open: thaw everything this agent froze. Breakers stay in the state file, so a
    /// restarted agent re-applies holds that are still due.
    pub fn shutdown(&mut self) {
        self.retry_thaws();
        let keys: Vec<Key> = self.breakers.keys().cloned().collect();
        for k in keys {
            let Some(b) = self.breakers.remove(&k) else {
                continue;
            };
            // The handles stay in the breaker (and the state file): a restart re-applies them.
            for h in &b.acted {
                self.enforcer.undo(h);
            }
            self.breakers.insert(k, b);
        }
        self.persist();
    }

    /// Writes the state file; `false` when it could not be (the enforcer then refuses to act).
    fn persist(&mut self) -> bool {
        let now = self.clock.now();
        let acted = |hs: &[CgroupHandle]| {
            hs.iter()
                .map(|h| ActedCgroup {
                    cgroup: h.rel.clone(),
                    inode: h.ino,
                })
                .collect()
        };
        let breakers = self
            .breakers
            .values()
            .map(|b| PersistedBreaker {
                id: b.id.clone(),
                rule: self.cfg.rules[b.rule].name.clone(),
                action: b.action,
                state: b.state,
                pod: b.pod.clone(),
                revision: b.revision.clone(),
                reason: b.reason.clone(),
                value: b.value,
                threshold: b.threshold,
                since: self.wall(now, b.opened_at),
                hold_until: b.hold_until.map(|t| self.wall(now, t)),
                probation_until: b.probation_until.map(|t| self.wall(now, t)),
                hold_seconds: b.hold.as_secs_f64(),
                trips: b.trips,
                acted: acted(&b.acted),
                spared_pods: b.spared_pods.iter().cloned().collect(),
            })
            .collect();
        let file = StateFile {
            version: state::VERSION,
            saved_at: unix(self.clock.wall()),
            breakers,
            thaw: acted(&self.unthawed),
        };
        self.enforcer.persist(&file)
    }

    /// Reads the state file at start. Holds still due are re-applied when enforcing; in a dry
    /// run, and for expired holds, what we froze is thawed for real. A file that cannot be read
    /// is moved aside (never overwritten) and the cgroups it names are thawed: with the record
    /// of the hold lost, failing open is the only safe choice.
    fn restore(&mut self) {
        let path = self.enforcer.state_file().to_path_buf();
        let file = match state::load(&path) {
            Ok(Some(f)) => f,
            Ok(None) => {
                self.persist();
                return;
            }
            Err(e) => {
                let salvaged = std::fs::read_to_string(&path)
                    .map(|t| state::salvage_acted(&t))
                    .unwrap_or_default();
                let secs = self
                    .clock
                    .wall()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                match state::quarantine(&path, secs) {
                    Ok(aside) => {
                        tracing::error!(error = %e, kept_at = %aside.display(), thawing = salvaged.len(), "breaker state unreadable: kept aside, thawing the cgroups it names, starting with no breakers");
                        self.state_quarantined = Some(aside.display().to_string());
                    }
                    Err(qe) => {
                        tracing::error!(error = %e, rename_error = %qe, "breaker state unreadable and cannot be moved aside: not acting until it can be written");
                        self.state_quarantined = Some(path.display().to_string());
                        for a in &salvaged {
                            if let Some(h) = self.enforcer.reopen(&a.cgroup, a.inode) {
                                self.enforcer.undo(&h);
                            }
                        }
                        // Saving now would overwrite the only record: leave the enforcer
                        // without a durable state, so it refuses to act.
                        return;
                    }
                }
                for a in &salvaged {
                    if let Some(h) = self.enforcer.reopen(&a.cgroup, a.inode) {
                        if let Outcome::Failed(_) = self.enforcer.undo(&h) {
                            self.unthawed.push(h);
                        }
                    }
                }
                self.persist();
                return;
            }
        };
        let now = self.clock.now();
        let wall_now = unix(self.clock.wall());
        // Persisted numbers are range-checked by `state::parse`; the arithmetic saturates anyway.
        let at = |t: f64| {
            let d = Duration::try_from_secs_f64((t - wall_now).abs()).unwrap_or(Duration::ZERO);
            if t >= wall_now {
                later(now, d)
            } else {
                now.checked_sub(d).unwrap_or(now)
            }
        };
        for a in &file.thaw {
            if let Some(h) = self.enforcer.reopen(&a.cgroup, a.inode) {
                if let Outcome::Failed(_) = self.enforcer.undo(&h) {
                    self.unthawed.push(h);
                }
            }
        }
        let mut reapply = Vec::new();
        for p in file.breakers {
            let handles: Vec<CgroupHandle> = p
                .acted
                .iter()
                .filter_map(|a| self.enforcer.reopen(&a.cgroup, a.inode))
                .collect();
            let Some(rule) = self.cfg.rules.iter().position(|r| r.name == p.rule) else {
                tracing::warn!(rule = %p.rule, "a persisted breaker's rule no longer exists: dropping it");
                for h in handles {
                    if let Outcome::Failed(_) = self.enforcer.undo(&h) {
                        self.unthawed.push(h);
                    }
                }
                continue;
            };
            let mut b = Breaker {
                id: p.id,
                rule,
                action: p.action,
                state: p.state,
                pod: p.pod,
                revision: p.revision,
                reason: p.reason,
                value: p.value,
                threshold: p.threshold,
                opened_at: at(p.since),
                hold_until: p.hold_until.map(at),
                probation_until: p.probation_until.map(at),
                hold: Duration::try_from_secs_f64(p.hold_seconds).unwrap_or(Duration::ZERO),
                trips: p.trips,
                acted: Vec::new(),
                enforced: HashSet::new(),
                spared_pods: p.spared_pods.into_iter().collect(),
            };
            let due = b.state == BreakerState::Open && b.hold_until.is_none_or(|t| t > now);
            let hold = due && b.action != ActionKind::Report && !self.cfg.dry_run;
            for h in handles {
                if hold {
                    // Recorded again below before it is re-applied.
                    b.acted.push(h);
                } else if let Outcome::Failed(_) = self.enforcer.undo(&h) {
                    self.unthawed.push(h);
                }
            }
            let outcome = if !due {
                "hold expired"
            } else if self.cfg.dry_run && b.action != ActionKind::Report {
                "dry run: hold kept, cgroups thawed"
            } else {
                "hold re-applied"
            };
            let e = self.event(&b, "restored", outcome, Duration::ZERO);
            self.notifier.send(e);
            let key = (b.id.clone(), rule);
            if hold {
                reapply.push(key.clone());
            }
            self.breakers.insert(key, b);
        }
        self.persist();
        for key in reapply {
            let Some(mut b) = self.breakers.remove(&key) else {
                continue;
            };
            let acted = std::mem::take(&mut b.acted);
            for h in acted {
                match self.enforcer.apply(ActionKind::Freeze, &h) {
                    Outcome::Done => b.acted.push(h),
                    // Not ours to hold any more (replaced, protected, or no durable record):
                    // make sure it is not left frozen either.
                    _ => {
                        if let Outcome::Failed(_) = self.enforcer.undo(&h) {
                            self.unthawed.push(h);
                        }
                    }
                }
            }
            self.breakers.insert(key, b);
        }
        self.persist();
    }

    fn status(&self, now: Instant, ev: &Evaluation) -> GuardStatus {
        GuardStatus {
            dry_run: self.cfg.dry_run,
            state_durable: self.enforcer.durable(),
            state_write_failures_total: self.enforcer.state_write_failures(),
            state_quarantined: self.state_quarantined.clone(),
            thaws_pending: self.unthawed.len(),
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
                    since: self.wall(now, b.opened_at),
                    hold_remaining_seconds: b.hold_remaining(now).map(|d| d.as_secs_f64()),
                    trips_total: b.trips,
                    would_act: self.cfg.dry_run
                        && b.state == BreakerState::Open
                        && b.action != ActionKind::Report,
                })
                .collect(),
            pending: ev
                .pending
                .iter()
                .map(|(r, k, d)| PendingView {
                    namespace: k.labels().0.to_owned(),
                    pod: k.labels().1.to_owned(),
                    container: k.labels().2.to_owned(),
                    rule: self.cfg.rules[*r].name.clone(),
                    seconds: d.as_secs_f64(),
                })
                .collect(),
            actions: self
                .actions
                .iter()
                .map(|((r, a, o), n)| (r.clone(), *a, *o, *n))
                .collect(),
        }
    }
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
        f.held_for.as_secs()
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

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
