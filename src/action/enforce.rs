//! The enforcer: the only part of the guard that writes to cgroups or to the state file. The
//! guard decides; this applies, under three invariants that do not depend on the decisions:
//! - a hold is undone by the real actuator in every mode (a dry run only skips new holds), so a
//!   cgroup frozen by an earlier enforcing run is never stranded by a restart in dry-run;
//! - nothing is frozen or killed whose subtree holds pid 1, pid 2 or the agent itself;
//! - nothing is frozen or killed unless the breaker that records it was made durable first.

use super::cgroup::{CgroupHandle, Freezer};
use super::state::{self, StateFile};
use super::{Actuator, Outcome};
use crate::rule::ActionKind;
use std::path::PathBuf;

pub struct Enforcer {
    /// Freeze and kill: the cgroup writer, or a dry run.
    act: Box<dyn Actuator>,
    /// Thaws of holds we made: always the cgroup writer (a recording fake in tests).
    undo: Box<dyn Actuator>,
    freezer: Freezer,
    /// Never frozen or signalled, wherever they sit: pid 1, pid 2 (kthreadd) and the agent.
    protected: Vec<u32>,
    state_file: PathBuf,
    state_write_failures: u64,
    /// The last write of the state file succeeded: new holds may be applied.
    durable: bool,
}

impl std::fmt::Debug for Enforcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enforcer")
            .field("freezer", &self.freezer)
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

impl Enforcer {
    pub fn new(
        act: Box<dyn Actuator>,
        undo: Box<dyn Actuator>,
        freezer: Freezer,
        state_file: PathBuf,
    ) -> Enforcer {
        Enforcer {
            act,
            undo,
            freezer,
            protected: vec![1, 2, std::process::id()],
            state_file,
            state_write_failures: 0,
            durable: false,
        }
    }

    pub fn state_file(&self) -> &std::path::Path {
        &self.state_file
    }

    pub fn open(&self, rel: &str) -> std::io::Result<CgroupHandle> {
        CgroupHandle::open(&self.freezer, rel)
    }

    /// A persisted handle, only if the path still holds the cgroup we acted on.
    pub fn reopen(&self, rel: &str, ino: u64) -> Option<CgroupHandle> {
        CgroupHandle::reopen(&self.freezer, rel, ino)
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

    /// Applies a new hold (freeze or kill) with the configured actuator. Refused while the
    /// state file is not durable, on a cgroup replaced since it was opened, and on a subtree
    /// holding a protected process.
    pub fn apply(&mut self, action: ActionKind, h: &CgroupHandle) -> Outcome {
        if action == ActionKind::Report {
            return Outcome::Done;
        }
        if !self.durable {
            return Outcome::Failed(format!(
                "the state file {} cannot be written: not acting without a durable record",
                self.state_file.display()
            ));
        }
        // The path was removed or recreated since the hold started: never the cgroup we meant.
        if !h.same_cgroup() {
            return Outcome::Replaced;
        }
        if let Some(why) = self.refusal(h) {
            return Outcome::Failed(why);
        }
        match action {
            ActionKind::Freeze => self.act.freeze(h),
            ActionKind::Kill => self.act.kill(h),
            ActionKind::Report => Outcome::Done,
        }
    }

    /// Undoes one of our holds, in every mode. A cgroup recreated at the path is not ours.
    pub fn undo(&mut self, h: &CgroupHandle) -> Outcome {
        if !h.same_cgroup() {
            return Outcome::Gone;
        }
        let out = self.undo.thaw(h);
        if let Outcome::Failed(e) = &out {
            tracing::error!(cgroup = %h.path.display(), error = %e, "thaw failed");
        }
        out
    }

    /// Writes the state file; until a write succeeds again, no new hold is applied.
    pub fn persist(&mut self, file: &StateFile) -> bool {
        match state::save(&self.state_file, file) {
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
}
