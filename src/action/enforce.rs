//! Enforce: the only part of the guard that writes to cgroups, the state file or the webhook.
//! It applies the decider's commands under invariants that do not depend on any decision:
//! - a hold is undone by the real actuator in every mode (a dry run only skips new holds), so a
//!   cgroup frozen by an earlier enforcing run is never stranded by a restart in dry-run;
//! - nothing is frozen or killed whose subtree contains pid 1, pid 2 or the agent itself;
//! - nothing is frozen before the state file lists it (write-ahead), and nothing is held at all
//!   while the state file cannot be written;
//! - a thaw that fails is retried every tick until it succeeds or the cgroup is gone;
//! - only the holder of the state lock (`lock.rs`) writes, freezes, thaws or notifies;
//! - one ledger of what we hold: every freeze (a trip's, a new instance's, a restored one, the
//!   freeze step of a v1 kill) is in it and in the state file before the cgroup write; whatever
//!   no breaker claims is thawed, and all of it at shutdown.

use super::breaker::{HoldRecord, Knob, Limited};
use super::cgroup::{CgroupActuator, CgroupHandle, Freezer};
use super::decide::{Command, Pin, Report, Setting};
use super::evidence::{self, EvidenceRoots};
use super::limit::{self, KnobRoots};
use super::lock::{NoHand, StateLock};
use super::notify::Notifier;
use super::state::{self, ActedCgroup, StateFile};
use super::{Actuator, Outcome};
use crate::config::guard::Webhook;
use crate::model::ActionKind;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What this agent holds: every cgroup it froze (or is about to freeze) and has not thawed. In
/// the state file before each freeze; mirrored for [`FailOpen`], which thaws it from another
/// thread when a tick is stuck at SIGTERM.
#[derive(Debug, Default)]
struct Ledger {
    held: BTreeSet<ActedCgroup>,
    mirror: Arc<Mutex<BTreeSet<ActedCgroup>>>,
}

impl Ledger {
    fn sync(&self) {
        *self.mirror.lock().unwrap_or_else(|p| p.into_inner()) = self.held.clone();
    }
    fn insert(&mut self, c: ActedCgroup) -> bool {
        let new = self.held.insert(c);
        if new {
            self.sync();
        }
        new
    }
    fn remove(&mut self, c: &ActedCgroup) -> bool {
        let was = self.held.remove(c);
        if was {
            self.sync();
        }
        was
    }
    fn replace(&mut self, held: BTreeSet<ActedCgroup>) {
        self.held = held;
        self.sync();
    }
}

/// The limits this agent set and has not restored, keyed by cgroup and knob; mirrored like the
/// freeze ledger.
#[derive(Debug, Default)]
struct Limits {
    held: BTreeMap<(ActedCgroup, Knob), Limited>,
    mirror: Arc<Mutex<Vec<Limited>>>,
}

impl Limits {
    fn sync(&self) {
        *self.mirror.lock().unwrap_or_else(|p| p.into_inner()) =
            self.held.values().cloned().collect();
    }
    fn key(l: &Limited) -> (ActedCgroup, Knob) {
        (l.cgroup.clone(), l.knob)
    }
    /// Records `l` (replacing the record of the same knob); true if it was not there.
    fn insert(&mut self, l: Limited) -> bool {
        let new = self.held.insert(Limits::key(&l), l).is_none();
        self.sync();
        new
    }
    fn remove(&mut self, l: &Limited) -> bool {
        let was = self.held.remove(&Limits::key(l)).is_some();
        if was {
            self.sync();
        }
        was
    }
    fn replace(&mut self, all: impl IntoIterator<Item = Limited>) {
        self.held = all.into_iter().map(|l| (Limits::key(&l), l)).collect();
        self.sync();
    }
}

/// The fail-open path that does not wait for the enforcer: thaws every cgroup of the ledger
/// with a fresh cgroup writer. For a SIGTERM that arrives while a tick is stuck; the process
/// exits right after, and whatever a stuck write froze later is in the state file for the next
/// start.
#[derive(Debug, Clone)]
pub struct FailOpen {
    held: Arc<Mutex<BTreeSet<ActedCgroup>>>,
    limits: Arc<Mutex<Vec<Limited>>>,
    freezer: Freezer,
    roots: KnobRoots,
}

impl FailOpen {
    /// Returns how many cgroups were thawed (or were gone).
    pub fn thaw_all(&self) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut writer = CgroupActuator::new(self.freezer.clone(), Duration::from_secs(1));
        let mut n = 0;
        for c in held {
            let out = match CgroupHandle::reopen(&self.freezer, &c.cgroup, c.inode) {
                Some(h) => writer.thaw(&h),
                None => Outcome::Gone,
            };
            match out {
                Outcome::Failed(e) => {
                    tracing::error!(cgroup = %c.cgroup, error = %e, "fail-open thaw failed")
                }
                _ => n += 1,
            }
        }
        let limits = self
            .limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for l in limits {
            let Some(root) = self.roots.root(l.knob) else {
                continue;
            };
            let out = match CgroupHandle::open_at(root, &l.cgroup.cgroup) {
                Ok(h) if h.ino == l.cgroup.inode => writer.clear_limit(&h, &l),
                _ => Outcome::Gone,
            };
            match out {
                Outcome::Failed(e) => {
                    tracing::error!(cgroup = %l.cgroup.cgroup, error = %e, "fail-open restore failed")
                }
                _ => n += 1,
            }
        }
        n
    }
}

pub struct Enforcer {
    /// Freeze and kill: the cgroup writer, or a dry run.
    act: Box<dyn Actuator>,
    /// Thaws of holds we made: always the cgroup writer (a recording fake in tests).
    undo: Box<dyn Actuator>,
    freezer: Freezer,
    notifier: Notifier,
    /// Never frozen, stopped or killed, wherever they sit: pid 1, pid 2 (kthreadd) and the agent.
    protected: Vec<u32>,
    state_file: PathBuf,
    /// The state lock, or why this instance has none (then it never writes, thaws or notifies).
    hand: Result<StateLock, NoHand>,
    /// The decider's last state; written again with our own lists whenever they change.
    last: StateFile,
    /// Cgroups we froze and have not thawed: in the state file before each freeze.
    frozen: Ledger,
    /// Limits we set and have not restored: in the state file before each write.
    limits: Limits,
    /// Where each knob lives on this host.
    roots: KnobRoots,
    /// Where evidence is read (none: empty evidence).
    evidence: Option<EvidenceRoots>,
    /// Limits whose restore failed, retried at every run.
    unrestored: BTreeMap<(ActedCgroup, Knob), Limited>,
    /// At start: limits a previous run set; those not re-held by `restore` are restored.
    limit_orphans: BTreeMap<(ActedCgroup, Knob), Limited>,
    reasserted: u64,
    /// Held cgroups seen thawed once: a runtime thaws a frozen container it is about to kill
    /// (runc, for 10-30 ms before it removes the cgroup), so a thaw counts only if the cgroup is
    /// still there, still thawed, at the next tick.
    thawed_once: BTreeSet<ActedCgroup>,
    /// Open handles: a held directory keeps its inode, so a cgroup recreated at the same path
    /// can never pass for the one pinned or frozen, on any filesystem.
    pinned: HashMap<Pin, Vec<CgroupHandle>>,
    handles: HashMap<ActedCgroup, CgroupHandle>,
    /// Thaws that failed, retried at every run.
    unthawed: BTreeSet<ActedCgroup>,
    /// At start: cgroups a previous run froze. Those not re-held by `restore` are thawed.
    orphans: BTreeSet<ActedCgroup>,
    state_write_failures: u64,
    /// The last write of the state file succeeded: new holds may be applied.
    durable: bool,
    /// An unreadable state file could not be moved aside: never overwrite the only record.
    read_only: bool,
    quarantined: Option<String>,
    /// Held cgroups found thawed by another hand, and ledger entries no breaker claimed.
    foreign_thaws: u64,
    unclaimed_thaws: u64,
}

impl std::fmt::Debug for Enforcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enforcer")
            .field("freezer", &self.freezer)
            .field("frozen", &self.frozen)
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

fn open_error(rel: &str, e: &std::io::Error) -> Outcome {
    if crate::fsio::is_gone(e) {
        Outcome::Gone
    } else {
        Outcome::Failed(format!("open {rel}: {e}"))
    }
}

impl Enforcer {
    pub fn new(
        act: Box<dyn Actuator>,
        undo: Box<dyn Actuator>,
        freezer: Freezer,
        state_file: PathBuf,
        notifier: Notifier,
    ) -> Enforcer {
        let hand = StateLock::take(&state_file);
        if let Err(why) = &hand {
            tracing::warn!(reason = %why, "not the owner of the breaker state: this instance will not write, freeze, thaw or notify until it takes the lock");
        }
        Enforcer {
            hand,
            act,
            undo,
            freezer,
            notifier,
            protected: vec![1, 2, std::process::id()],
            state_file,
            last: StateFile {
                version: state::VERSION,
                ..StateFile::default()
            },
            frozen: Ledger::default(),
            limits: Limits::default(),
            roots: KnobRoots::default(),
            evidence: None,
            unrestored: BTreeMap::new(),
            limit_orphans: BTreeMap::new(),
            reasserted: 0,
            thawed_once: BTreeSet::new(),
            pinned: HashMap::new(),
            handles: HashMap::new(),
            unthawed: BTreeSet::new(),
            orphans: BTreeSet::new(),
            state_write_failures: 0,
            durable: false,
            read_only: false,
            quarantined: None,
            foreign_thaws: 0,
            unclaimed_thaws: 0,
        }
    }

    /// Where the limit actions find their knobs (none by default: every limit then fails with
    /// the reason).
    pub fn with_knob_roots(mut self, roots: KnobRoots) -> Enforcer {
        self.roots = roots;
        self
    }

    /// Where the evidence of a trip is read.
    pub fn with_evidence_roots(mut self, roots: EvidenceRoots) -> Enforcer {
        self.evidence = Some(roots);
        self
    }

    /// Why this instance has no hand, if it has none.
    pub fn no_hand(&self) -> Option<String> {
        self.hand.as_ref().err().map(ToString::to_string)
    }

    /// Tries again to take the state lock; true when this call took it (the caller then
    /// restores the state file, as at start).
    pub fn take_hand(&mut self) -> bool {
        if self.hand.is_ok() {
            return false;
        }
        match StateLock::take(&self.state_file) {
            Ok(lock) => {
                tracing::info!(state = %self.state_file.display(), "took the state lock: this instance now owns the breaker state");
                self.hand = Ok(lock);
                true
            }
            Err(why) => {
                if self.hand.as_ref().err() != Some(&why) {
                    tracing::warn!(reason = %why, "still not the owner of the breaker state");
                }
                self.hand = Err(why);
                false
            }
        }
    }

    /// The thaw that works without this enforcer (see [`FailOpen`]).
    pub fn fail_open(&self) -> FailOpen {
        FailOpen {
            held: self.frozen.mirror.clone(),
            limits: self.limits.mirror.clone(),
            freezer: self.freezer.clone(),
            roots: self.roots.clone(),
        }
    }

    pub fn state_file(&self) -> &Path {
        &self.state_file
    }

    /// A reloaded config: the actuators (dry run or not, freeze timeout) and the webhook, each
    /// when given. The state file, the frozen list and the open handles stay: they are what
    /// makes undo safe.
    pub fn reconfigure(
        &mut self,
        actuators: Option<(Box<dyn Actuator>, Box<dyn Actuator>)>,
        webhook: Option<Webhook>,
    ) {
        if let Some((act, undo)) = actuators {
            self.act = act;
            self.undo = undo;
        }
        if let Some(w) = webhook {
            // Its counts and active alerts carry over: they are re-sent to the new endpoint.
            self.notifier = self.notifier.successor(w);
        }
    }

    /// The webhook worker's counts.
    pub fn webhook(&self) -> crate::model::WebhookStatus {
        self.notifier.status()
    }

    /// Reads the state file at start. An unreadable one is moved aside (never overwritten by the
    /// next save) and the cgroups it names are adopted as orphans, thawed by `finish_restore`:
    /// with the record of the hold lost, failing open is the only safe choice.
    pub fn load(&mut self, unix_now: u64) -> Option<StateFile> {
        if self.hand.is_err() {
            return None;
        }
        state::remove_stale_temps(&self.state_file);
        let path = self.state_file.clone();
        let err = match state::load(&path) {
            Ok(Some(f)) => {
                let acted = f.breakers.iter().flat_map(|b| b.acted.iter());
                self.orphans = f.frozen.iter().chain(acted).cloned().collect();
                self.frozen.replace(self.orphans.clone());
                // The ledger's record last: it has the latest `previous` (a re-assert updates it).
                let limited = f.breakers.iter().flat_map(|b| b.limited.iter());
                self.adopt_limits(limited.chain(f.limits.iter()).cloned());
                return Some(f);
            }
            Ok(None) => return None,
            Err(e) => e,
        };
        let text = state::read_text(&path).unwrap_or_default();
        let salvaged = state::salvage_acted(&text);
        self.adopt_limits(state::salvage_limits(&text).into_iter());
        match state::quarantine(&path, unix_now) {
            Ok(aside) => {
                tracing::error!(error = %err, kept_at = %aside.display(), thawing = salvaged.len(), "breaker state unreadable: kept aside, thawing the cgroups it names, starting with no breakers");
                self.quarantined = Some(aside.display().to_string());
            }
            Err(qe) => {
                tracing::error!(error = %err, rename_error = %qe, "breaker state unreadable and cannot be moved aside: thawing the cgroups it names; no hold until it can be written");
                self.quarantined = Some(path.display().to_string());
                self.read_only = true;
            }
        }
        self.orphans = salvaged.into_iter().collect();
        self.frozen.replace(self.orphans.clone());
        None
    }

    /// After the restored holds were re-applied: thaws every cgroup a previous run froze that
    /// no breaker holds any more, then records the result.
    pub fn finish_restore(&mut self) {
        if self.hand.is_err() {
            return;
        }
        for c in std::mem::take(&mut self.orphans) {
            self.undo_one(c);
        }
        for l in std::mem::take(&mut self.limit_orphans).into_values() {
            self.restore_one(l);
        }
        self.write_state();
    }

    /// Limits a previous run set: ours to restore unless a restored breaker re-holds them.
    fn adopt_limits(&mut self, all: impl Iterator<Item = Limited>) {
        self.limit_orphans = all.map(|l| ((l.cgroup.clone(), l.knob), l)).collect();
        self.limits.replace(self.limit_orphans.values().cloned());
    }

    /// Applies commands in order; returns what the decider must learn from them.
    pub fn run(&mut self, commands: Vec<Command>) -> Vec<Report> {
        let hand = self.hand.is_ok();
        for c in std::mem::take(&mut self.unthawed) {
            self.undo_one(c);
        }
        for l in std::mem::take(&mut self.unrestored).into_values() {
            self.restore_one(l);
        }
        let mut reports = Vec::new();
        for cmd in commands {
            match cmd {
                Command::Pin { pin, rels } => {
                    let hs: Vec<CgroupHandle> =
                        rels.iter().filter_map(|rel| self.open(rel).ok()).collect();
                    let cgroups = hs
                        .iter()
                        .map(|h| ActedCgroup {
                            cgroup: h.rel.clone(),
                            inode: h.ino,
                        })
                        .collect();
                    self.pinned.insert(pin.clone(), hs);
                    reports.push(Report::Pinned { pin, cgroups });
                }
                Command::Unpin(pin) => {
                    self.pinned.remove(&pin);
                }
                Command::Persist(file) => {
                    self.last = file;
                    self.write_state();
                }
                Command::Hold {
                    ticket,
                    action,
                    rel,
                    ino,
                    instance,
                    setting,
                } => {
                    let (outcome, cgroup, limited) = self.hold(action, &rel, ino, &setting);
                    reports.push(Report::Held {
                        ticket,
                        outcome,
                        cgroup,
                        limited,
                        instance,
                    });
                }
                // Without the lock, what the decider holds is a live owner's: never ours to undo
                // or announce.
                Command::Undo(HoldRecord::Frozen(c)) if hand => self.undo_one(c),
                Command::Undo(HoldRecord::Limited(l)) if hand => self.restore_one(l),
                Command::Notify(e) if hand => self.notifier.send(e),
                Command::Undo(_) | Command::Notify(_) => {}
                // Read-only: in every mode, with or without the lock.
                Command::Capture { key, rel, log } => {
                    let evidence = self
                        .evidence
                        .as_ref()
                        .map(|roots| evidence::capture(roots, &rel, log.as_ref()))
                        .unwrap_or_default();
                    reports.push(Report::Captured { key, evidence });
                }
            }
        }
        reports
    }

    fn open(&self, rel: &str) -> std::io::Result<CgroupHandle> {
        CgroupHandle::open(&self.freezer, rel)
    }

    /// Why `h` must not be frozen or killed, if it must not.
    fn refusal(&self, h: &CgroupHandle) -> Option<String> {
        match h.subtree_pids() {
            Ok(pids) => pids.iter().find(|p| self.protected.contains(p)).map(|p| {
                format!(
                    "the cgroup or one below it holds pid {p} ({})",
                    match *p {
                        1 => "init",
                        2 => "kthreadd",
                        _ => "the agent",
                    }
                )
            }),
            // Fail closed: a subtree we cannot verify is not touched.
            Err(e) => Some(format!("cannot verify the subtree: {e}")),
        }
    }

    /// A new hold with the configured actuator. Refused while the state file is not durable, on
    /// a cgroup other than the pinned one, and on a subtree holding a protected process.
    fn hold(
        &mut self,
        action: ActionKind,
        rel: &str,
        ino: Option<u64>,
        setting: &Setting,
    ) -> (Outcome, Option<ActedCgroup>, Option<Limited>) {
        let h = match self.open(rel) {
            Ok(h) => h,
            Err(e) => return (open_error(rel, &e), None, None),
        };
        let cg = ActedCgroup {
            cgroup: rel.to_owned(),
            inode: h.ino,
        };
        // The path was removed or recreated since the hold started: never the cgroup we meant.
        if ino.is_some_and(|i| i != h.ino) {
            return (Outcome::Replaced, Some(cg), None);
        }
        // A dry run writes nothing, so it needs neither the lock nor a durable record; every
        // real hold needs both.
        if let (Err(why), true) = (&self.hand, self.act.writes()) {
            return (
                Outcome::Failed(format!("not acting: {why}")),
                Some(cg),
                None,
            );
        }
        if !self.durable && self.act.writes() {
            let why = format!(
                "the state file {} cannot be written: not acting without a durable record",
                self.state_file.display()
            );
            return (Outcome::Failed(why), Some(cg), None);
        }
        if let Some(why) = self.refusal(&h) {
            return (Outcome::Failed(why), Some(cg), None);
        }
        let outcome = match action {
            ActionKind::Freeze if self.act.writes() => {
                // Already ours (a restored hold): it is in the state file.
                if self.frozen.insert(cg.clone()) && !self.write_state() {
                    self.frozen.remove(&cg);
                    let why = "the state file cannot be written: not acting".to_owned();
                    return (Outcome::Failed(why), Some(cg), None);
                }
                let out = self.act.freeze(&h);
                if out == Outcome::Done {
                    self.orphans.remove(&cg);
                    self.handles.insert(cg.clone(), h);
                } else {
                    // The actuator thaws a failed freeze; should that thaw have failed too, this
                    // one keeps the cgroup listed and retried until a thaw succeeds.
                    self.undo_one(cg.clone());
                }
                out
            }
            ActionKind::Freeze => self.act.freeze(&h),
            ActionKind::Kill => {
                // A v1 kill freezes first: that freeze is a hold like any other, in the ledger
                // and the state file before the write, so an agent killed half-way leaves a
                // record its next start thaws.
                let record = self.act.writes() && self.act.kill_freezes();
                if record && self.frozen.insert(cg.clone()) && !self.write_state() {
                    self.frozen.remove(&cg);
                    let why = "the state file cannot be written: not acting".to_owned();
                    return (Outcome::Failed(why), Some(cg), None);
                }
                let out = self.act.kill(&h);
                // Never left frozen, whatever the kill did.
                if record || (matches!(out, Outcome::Failed(_)) && self.act.writes()) {
                    self.undo_one(cg.clone());
                }
                out
            }
            ActionKind::Report => Outcome::Done,
            a => {
                let (out, limited) = self.limit(a, rel, setting);
                return (out, Some(cg), limited);
            }
        };
        (outcome, Some(cg), None)
    }

    /// A limit: the knob's value now is recorded as `previous`, the record goes to the state
    /// file, then the knob is set; the value kept is the one the kernel shows.
    fn limit(
        &mut self,
        action: ActionKind,
        rel: &str,
        setting: &Setting,
    ) -> (Outcome, Option<Limited>) {
        let failed = |why: String| (Outcome::Failed(why), None);
        let (knob, root) = match self.roots.knob(action) {
            Ok((k, r)) => (k, r.to_path_buf()),
            Err(why) => return failed(why),
        };
        let h = match CgroupHandle::open_at(&root, rel) {
            Ok(h) => h,
            Err(e) => return (open_error(rel, &e), None),
        };
        let current = match self.act.read_limit(&h, knob) {
            Ok(v) => v,
            Err(e) => return failed(format!("read {}: {e}", h.path.display())),
        };
        // Only a v1 quota is relative to its cgroup's own period.
        let period = match knob {
            Knob::CpuCfsQuota => limit::cfs_period(&h),
            _ => 0,
        };
        let key = (
            ActedCgroup {
                cgroup: rel.to_owned(),
                inode: h.ino,
            },
            knob,
        );
        // A restored limit: the ledger's record, which a re-assert kept up to date.
        let restored = match setting {
            Setting::Restore(l) => Some(self.limit_orphans.get(&key).unwrap_or(l).clone()),
            _ => None,
        };
        // Held already (a limit set again on the same cgroup), or still ours after a crash:
        // what it replaced is the record's, never our own value.
        let held = self.limits.held.get(&key).cloned().or(restored);
        let (value, previous) = match (limit::value(knob, setting, period), held) {
            (Err(why), _) => return failed(format!("{}: {why}", action.as_str())),
            (Ok(v), Some(l)) if current == l.value => (v, l.previous),
            (Ok(v), _) => (v, current),
        };
        if !self.act.writes() {
            return (Outcome::DryRun, None);
        }
        let mut rec = Limited {
            cgroup: key.0.clone(),
            knob,
            value,
            previous,
        };
        // Re-held from a previous run: the record is there already and stays.
        self.limit_orphans.remove(&key);
        if self.limits.insert(rec.clone()) && !self.write_state() {
            self.limits.remove(&rec);
            return failed("the state file cannot be written: not acting".to_owned());
        }
        match self.act.set_limit(&h, knob, &rec.value) {
            Ok(shown) => {
                if shown != rec.value {
                    rec.value = shown;
                    self.limits.insert(rec.clone());
                    self.write_state();
                }
                (Outcome::Done, Some(rec))
            }
            Err(why) => {
                self.restore_one(rec);
                failed(why)
            }
        }
    }

    /// Restores one of our limits, in every mode; a failure is retried at every run.
    fn restore_one(&mut self, l: Limited) {
        let key = (l.cgroup.clone(), l.knob);
        // The ledger's record is the one a re-assert kept up to date.
        let l = self.limits.held.get(&key).cloned().unwrap_or(l);
        self.limit_orphans.remove(&key);
        let out = match self.roots.root(l.knob) {
            None => Outcome::Gone,
            Some(root) => match CgroupHandle::open_at(root, &l.cgroup.cgroup) {
                Ok(h) if h.ino == l.cgroup.inode => self.undo.clear_limit(&h, &l),
                Ok(_) => Outcome::Gone,
                Err(e) => open_error(&l.cgroup.cgroup, &e),
            },
        };
        match out {
            Outcome::Failed(e) => {
                if self.unrestored.insert(key, l.clone()).is_none() {
                    tracing::error!(cgroup = %l.cgroup.cgroup, knob = ?l.knob, error = %e, "restore failed; retrying every tick");
                }
            }
            _ => {
                self.limits.remove(&l);
            }
        }
    }

    /// Undoes one of our holds, in every mode. A cgroup recreated at the path is not ours.
    fn undo_one(&mut self, c: ActedCgroup) {
        self.orphans.remove(&c);
        let out = match self.handles.get(&c) {
            Some(h) if h.same_cgroup() => self.undo.thaw(h),
            Some(_) => Outcome::Gone,
            None => match self.open(&c.cgroup) {
                Ok(h) if h.ino == c.inode => self.undo.thaw(&h),
                Ok(_) => Outcome::Gone,
                Err(e) => open_error(&c.cgroup, &e),
            },
        };
        match out {
            Outcome::Failed(e) => {
                if self.unthawed.insert(c.clone()) {
                    tracing::error!(cgroup = %c.cgroup, error = %e, "thaw failed; retrying every tick");
                }
            }
            _ => {
                self.frozen.remove(&c);
                self.handles.remove(&c);
            }
        }
    }

    /// Writes the decider's last state with our own lists; until a write succeeds again, no new
    /// hold is applied.
    fn write_state(&mut self) -> bool {
        if self.read_only || self.hand.is_err() {
            self.state_write_failures += 1;
            self.durable = false;
            return false;
        }
        let mut file = self.last.clone();
        file.frozen = self.frozen.held.union(&self.unthawed).cloned().collect();
        let mut limits: BTreeMap<_, _> = self.limits.held.clone();
        limits.extend(self.unrestored.iter().map(|(k, v)| (k.clone(), v.clone())));
        // The breakers' copies follow the ledger (a re-assert changes `previous` and `value`).
        for l in file.breakers.iter_mut().flat_map(|b| b.limited.iter_mut()) {
            if let Some(mine) = limits.get(&(l.cgroup.clone(), l.knob)) {
                *l = mine.clone();
            }
        }
        file.limits = limits.into_values().collect();
        match state::save(&self.state_file, &file) {
            Ok(()) => {
                if !self.durable && self.state_write_failures > 0 {
                    tracing::info!(path = %self.state_file.display(), "breaker state writable again");
                }
                self.durable = true;
            }
            Err(e) => {
                if self.durable || self.state_write_failures == 0 {
                    tracing::error!(path = %self.state_file.display(), error = %e, "cannot write the breaker state: the guard will not act until it can");
                }
                self.state_write_failures += 1;
                self.durable = false;
            }
        }
        self.durable
    }

    pub fn durable(&self) -> bool {
        self.durable
    }

    pub fn state_write_failures(&self) -> u64 {
        self.state_write_failures
    }

    pub fn quarantined(&self) -> Option<&str> {
        self.quarantined.as_deref()
    }

    /// Why no hold can be applied now: no state lock, or a state file that still cannot be
    /// written (tried again here, once per tick, so that room made on the disk is seen).
    pub fn unable(&mut self) -> Option<String> {
        if let Err(why) = &self.hand {
            return Some(why.to_string());
        }
        if !self.durable && !self.write_state() {
            return Some(format!(
                "the state file {} cannot be written: no hold without a durable record",
                self.state_file.display()
            ));
        }
        None
    }

    /// Thaws that failed and are being retried.
    pub fn thaws_pending(&self) -> usize {
        self.unthawed.len()
    }

    pub fn foreign_thaws(&self) -> u64 {
        self.foreign_thaws
    }

    pub fn unclaimed_thaws(&self) -> u64 {
        self.unclaimed_thaws
    }

    /// Cgroups held now (frozen by us, not thawed).
    pub fn held(&self) -> usize {
        self.frozen.held.len()
    }

    /// Held means held: every cgroup of the ledger is read back from the kernel. One that
    /// another hand thawed (`echo THAWED > freezer.state`) leaves the ledger and is returned,
    /// so the decider stops calling it held; one that is gone is churn and leaves quietly.
    pub fn verify_held(&mut self) -> Vec<ActedCgroup> {
        if self.hand.is_err() {
            return Vec::new();
        }
        let mut thawed = Vec::new();
        let mut gone = Vec::new();
        let mut seen_thawed = BTreeSet::new();
        for (c, h) in &self.handles {
            if !self.frozen.held.contains(c) || self.unthawed.contains(c) {
                continue;
            }
            if !h.same_cgroup() {
                gone.push(c.clone());
            } else if self.undo.held(h) == Some(false) {
                if self.thawed_once.contains(c) {
                    thawed.push(c.clone());
                } else {
                    seen_thawed.insert(c.clone());
                }
            }
        }
        self.thawed_once = seen_thawed;
        for c in thawed.iter().chain(&gone) {
            self.frozen.remove(c);
            self.handles.remove(c);
        }
        for c in &thawed {
            tracing::warn!(cgroup = %c.cgroup, "a held cgroup was thawed outside nodeguard: its breaker is released");
        }
        self.foreign_thaws += thawed.len() as u64;
        let reasserted = self.reassert_limits();
        if !thawed.is_empty() || !gone.is_empty() || reasserted {
            self.write_state();
        }
        thawed
    }

    /// A limit someone rewrote (the kubelet on a resize or a restart) is set again; what they
    /// wrote becomes the value restored at the end. A cgroup that is gone leaves quietly.
    fn reassert_limits(&mut self) -> bool {
        let mut changed = false;
        let all: Vec<Limited> = self.limits.held.values().cloned().collect();
        for mut l in all {
            if self.unrestored.contains_key(&(l.cgroup.clone(), l.knob)) {
                continue;
            }
            let Some(root) = self.roots.root(l.knob) else {
                continue;
            };
            let h = match CgroupHandle::open_at(root, &l.cgroup.cgroup) {
                Ok(h) if h.ino == l.cgroup.inode => h,
                _ => {
                    self.limits.remove(&l);
                    changed = true;
                    continue;
                }
            };
            if self.undo.limit_held(&h, &l) != Some(false) {
                continue;
            }
            if l.knob != Knob::Connect {
                if let Ok(theirs) = self.undo.read_limit(&h, l.knob) {
                    l.previous = theirs;
                }
            }
            tracing::warn!(cgroup = %l.cgroup.cgroup, knob = ?l.knob, "a limit was rewritten outside nodeguard: set again");
            self.reasserted += 1;
            match self.undo.set_limit(&h, l.knob, &l.value) {
                Ok(shown) => l.value = shown,
                Err(e) => {
                    tracing::error!(cgroup = %l.cgroup.cgroup, error = %e, "cannot set the limit again")
                }
            }
            self.limits.insert(l);
            changed = true;
        }
        changed
    }

    pub fn reasserted(&self) -> u64 {
        self.reasserted
    }

    /// Limits held now.
    pub fn limits_held(&self) -> usize {
        self.limits.held.len()
    }

    /// One model of what we hold: a ledger entry that no breaker of the decider's last state
    /// claims has no owner left to thaw it, so it is thawed now.
    pub fn reconcile(&mut self) {
        if self.hand.is_err() {
            return;
        }
        let claimed: BTreeSet<&ActedCgroup> =
            self.last.breakers.iter().flat_map(|b| &b.acted).collect();
        let claimed_limits: BTreeSet<(&ActedCgroup, Knob)> = self
            .last
            .breakers
            .iter()
            .flat_map(|b| &b.limited)
            .map(|l| (&l.cgroup, l.knob))
            .collect();
        let stray_limits: Vec<Limited> = self
            .limits
            .held
            .values()
            .filter(|l| !claimed_limits.contains(&(&l.cgroup, l.knob)))
            .cloned()
            .collect();
        let stray: Vec<ActedCgroup> = self
            .frozen
            .held
            .iter()
            .filter(|c| !claimed.contains(c) && !self.unthawed.contains(*c))
            .cloned()
            .collect();
        if stray.is_empty() && stray_limits.is_empty() {
            return;
        }
        for l in stray_limits {
            tracing::warn!(cgroup = %l.cgroup.cgroup, knob = ?l.knob, "a limit no breaker holds: restored");
            self.unclaimed_thaws += 1;
            self.restore_one(l);
        }
        for c in stray {
            tracing::warn!(cgroup = %c.cgroup, "a frozen cgroup no breaker holds: thawed");
            self.unclaimed_thaws += 1;
            self.undo_one(c);
        }
        self.write_state();
    }

    /// Fail open at shutdown: thaws everything in the ledger, whoever decided it, and records
    /// that nothing is frozen (the breakers stay, so a restart re-applies what is still due).
    pub fn thaw_all(&mut self) {
        if self.hand.is_err() {
            return;
        }
        let all: Vec<ActedCgroup> = self.frozen.held.union(&self.unthawed).cloned().collect();
        for c in all {
            self.undo_one(c);
        }
        let mut limits: Vec<Limited> = self.limits.held.values().cloned().collect();
        limits.extend(self.unrestored.values().cloned());
        for l in limits {
            self.restore_one(l);
        }
        self.write_state();
    }
}
