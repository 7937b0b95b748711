//! The guard: the decider and the enforcer, stepped together once per tick. Each step reads the
//! hand releases (the only input besides the snapshot), lets the decider decide, the enforcer
//! apply, and the decider settle what the enforcer reports.

use super::decide::Decider;
use super::enforce::Enforcer;
use super::state;
use super::Actuator;
use crate::clock::Clock;
use crate::config::guard::GuardConfig;
use crate::config::guard::Webhook;
use crate::model::{GuardStatus, Snapshot};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

pub use super::decide::{glob, identity};

pub struct Guard {
    clock: Arc<dyn Clock>,
    decider: Decider,
    enforcer: Enforcer,
}

/// Where the guard may act: `discovery.scopes`, beside the guard config.
#[derive(Debug, Clone)]
pub struct Reach {
    pub scopes: Vec<String>,
    /// The agent's own namespace, always protected.
    pub own_namespace: Option<String>,
}

impl Default for Reach {
    fn default() -> Reach {
        Reach {
            scopes: vec!["/".into()],
            own_namespace: None,
        }
    }
}

impl Guard {
    /// Restores the breakers of the state file (re-holding, or thawing what is not held any
    /// more) before the first tick, when this instance owns the state.
    pub fn new(
        cfg: GuardConfig,
        clock: Arc<dyn Clock>,
        enforcer: Enforcer,
        node: String,
        reach: Reach,
    ) -> Guard {
        let protected = protected_namespaces(&cfg, reach.own_namespace);
        let decider = Decider::scoped(cfg, node, protected, reach.scopes);
        let mut g = Guard {
            clock,
            decider,
            enforcer,
        };
        if g.enforcer.no_hand().is_none() {
            g.restore();
        }
        g
    }

    /// Takes over the state file: its breakers are re-held or thawed, and every cgroup it
    /// lists that no breaker holds is thawed.
    fn restore(&mut self) {
        let (now, wall) = (self.clock.now(), self.clock.wall());
        let secs = wall.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if let Some(file) = self.enforcer.load(secs) {
            let reports = self.enforcer.run(self.decider.restore(now, wall, file));
            let settled = self.decider.settle(now, wall, reports);
            self.enforcer.run(settled);
        }
        self.enforcer.finish_restore();
    }

    /// The thaw that does not wait for a tick in progress (SIGTERM during a stuck tick).
    pub fn fail_open(&self) -> super::enforce::FailOpen {
        self.enforcer.fail_open()
    }

    pub fn dry_run(&self) -> bool {
        self.decider.dry_run()
    }

    /// Applies a reloaded guard config (every key but `state_file`, which needs a restart):
    /// the enforcer swaps its actuators first, so the undos and holds that follow use the new
    /// mode; it keeps its state file and frozen list, so nothing frozen is ever lost track of.
    pub fn reconfigure(
        &mut self,
        cfg: GuardConfig,
        actuators: Option<(Box<dyn Actuator>, Box<dyn Actuator>)>,
        webhook: Option<Webhook>,
        own_namespace: Option<String>,
    ) {
        self.enforcer.reconfigure(actuators, webhook);
        let protected = protected_namespaces(&cfg, own_namespace);
        let (now, wall) = (self.clock.now(), self.clock.wall());
        let commands = self.decider.reconfigure(now, wall, cfg, protected);
        // Without the lock the enforcer drops the undos and the state writes.
        let reports = self.enforcer.run(commands);
        let settled = self.decider.settle(now, wall, reports);
        self.enforcer.run(settled);
    }

    pub fn step(&mut self, snap: &Snapshot) -> GuardStatus {
        if self.enforcer.take_hand() {
            // Whatever it decided without the lock was never applied: start from the state file.
            self.decider = self.decider.fresh();
            self.restore();
        }
        let (now, wall) = (self.clock.now(), self.clock.wall());
        let owner = self.enforcer.no_hand().is_none();
        let thawed = self.enforcer.verify_held();
        let mut commands = self.decider.thawed_outside(now, wall, &thawed);
        let taken = if owner {
            state::take_releases(self.enforcer.state_file())
        } else {
            Vec::new()
        };
        let requests: Vec<state::ReleaseRequest> = taken
            .iter()
            .filter_map(|t| t.request.as_ref().ok().cloned())
            .collect();
        self.decider.set_unable(self.enforcer.unable());
        commands.extend(self.decider.decide(now, wall, snap, &requests));
        let released = self.decider.take_released();
        let reports = self.enforcer.run(commands);
        let settled = self.decider.settle(now, wall, reports);
        self.enforcer.run(settled);
        self.enforcer.reconcile();
        // After the undos and the state write: a sender that reads its outcome finds the state
        // file saying the same.
        answer_releases(taken, released);
        // As of the decision, not of the end of the writes: a hold's remaining time is exact.
        self.status_at(now, wall)
    }

    /// Fail open: thaw everything this agent froze, whichever breaker (if any) froze it.
    /// Breakers stay in the state file, so a restarted agent re-applies holds still due.
    pub fn shutdown(&mut self) {
        let (now, wall) = (self.clock.now(), self.clock.wall());
        let commands = self.decider.shutdown(now, wall);
        self.enforcer.run(commands);
        self.enforcer.thaw_all();
    }

    /// The guard as of now (after a reload, between ticks).
    pub fn status(&self) -> GuardStatus {
        self.status_at(self.clock.now(), self.clock.wall())
    }

    fn status_at(&self, now: std::time::Instant, wall: std::time::SystemTime) -> GuardStatus {
        GuardStatus {
            state_durable: self.enforcer.durable(),
            state_write_failures_total: self.enforcer.state_write_failures(),
            state_quarantined: self.enforcer.quarantined().map(str::to_owned),
            thaws_pending: self.enforcer.thaws_pending(),
            not_owner: self.enforcer.no_hand(),
            held_cgroups: self.enforcer.held(),
            foreign_thaws_total: self.enforcer.foreign_thaws(),
            unclaimed_thaws_total: self.enforcer.unclaimed_thaws(),
            limits_held: self.enforcer.limits_held(),
            limits_reasserted_total: self.enforcer.reasserted(),
            webhook: self.enforcer.webhook(),
            ..self.decider.status(now, wall)
        }
    }
}

/// Writes each taken request's outcome beside it (`released` pairs with the readable ones).
fn answer_releases(taken: Vec<state::TakenRelease>, released: Vec<Vec<state::ReleasedBreaker>>) {
    use state::{ReleaseOutcome, ReleaseVerdict};
    let mut released = released.into_iter();
    for t in taken {
        let outcome = match t.request {
            Ok(_) => {
                let r = released.next().unwrap_or_default();
                ReleaseOutcome {
                    verdict: if r.is_empty() {
                        ReleaseVerdict::NotHeld
                    } else {
                        ReleaseVerdict::Released
                    },
                    released: r,
                    reason: None,
                }
            }
            Err(why) => ReleaseOutcome {
                verdict: ReleaseVerdict::Refused,
                released: Vec::new(),
                reason: Some(why),
            },
        };
        if let Err(e) = state::write_release_outcome(&t.path, &outcome) {
            tracing::warn!(path = %t.path.display(), error = %e, "cannot write a release outcome");
        }
    }
}

/// The configured protected namespaces plus the agent's own.
fn protected_namespaces(cfg: &GuardConfig, own_namespace: Option<String>) -> Vec<String> {
    let mut protected = cfg.protect.namespaces.clone();
    if let Some(ns) = own_namespace.filter(|ns| !ns.is_empty()) {
        if !protected.contains(&ns) {
            protected.push(ns);
        }
    }
    protected
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
