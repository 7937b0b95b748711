//! The guard: the decider and the enforcer, stepped together once per tick. Each step reads the
//! hand releases (the only input besides the snapshot), lets the decider decide, the enforcer
//! apply, and the decider settle what the enforcer reports.

use super::decide::Decider;
use super::enforce::Enforcer;
use super::notify::Notifier;
use super::state;
use super::Actuator;
use crate::clock::Clock;
use crate::config::guard::GuardConfig;
use crate::model::{GuardStatus, Snapshot};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

pub use super::decide::{glob, identity};

pub struct Guard {
    clock: Arc<dyn Clock>,
    decider: Decider,
    enforcer: Enforcer,
}

impl Guard {
    /// Restores the breakers of the state file (re-holding, or thawing what is not held any
    /// more) before the first tick.
    pub fn new(
        cfg: GuardConfig,
        clock: Arc<dyn Clock>,
        mut enforcer: Enforcer,
        node: String,
        own_namespace: Option<String>,
    ) -> Guard {
        let protected = protected_namespaces(&cfg, own_namespace);
        let mut decider = Decider::new(cfg, node, protected);
        let (now, wall) = (clock.now(), clock.wall());
        let secs = wall.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if let Some(file) = enforcer.load(secs) {
            let reports = enforcer.run(decider.restore(now, wall, file));
            enforcer.run(decider.settle(now, wall, reports));
        }
        enforcer.finish_restore();
        Guard {
            clock,
            decider,
            enforcer,
        }
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
        notifier: Option<Notifier>,
        own_namespace: Option<String>,
    ) {
        self.enforcer.reconfigure(actuators, notifier);
        let protected = protected_namespaces(&cfg, own_namespace);
        let (now, wall) = (self.clock.now(), self.clock.wall());
        let commands = self.decider.reconfigure(now, wall, cfg, protected);
        let reports = self.enforcer.run(commands);
        let settled = self.decider.settle(now, wall, reports);
        self.enforcer.run(settled);
    }

    pub fn step(&mut self, snap: &Snapshot) -> GuardStatus {
        let (now, wall) = (self.clock.now(), self.clock.wall());
        let releases = state::take_releases(self.enforcer.state_file());
        let commands = self.decider.decide(now, wall, snap, &releases);
        let reports = self.enforcer.run(commands);
        let settled = self.decider.settle(now, wall, reports);
        self.enforcer.run(settled);
        // As of the decision, not of the end of the writes: a hold's remaining time is exact.
        self.status_at(now, wall)
    }

    /// Fail open: thaw everything this agent froze. Breakers stay in the state file, so a
    /// restarted agent re-applies holds that are still due.
    pub fn shutdown(&mut self) {
        let (now, wall) = (self.clock.now(), self.clock.wall());
        let commands = self.decider.shutdown(now, wall);
        self.enforcer.run(commands);
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
            ..self.decider.status(now, wall)
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
