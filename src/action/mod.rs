//! Actions: breakers that hold a tripped workload, and the freeze/kill that enforce them.
//! Every action goes through the `Actuator` trait: the real cgroup writer, a dry run that
//! writes nothing, or a recording fake for tests.

pub mod breaker;
pub mod cgroup;
// `pub` only so the real-kernel test (tests/kernel_connect_limit.rs) reaches it; no agent code
// uses it yet.
pub mod connect_limit;
pub mod decide;
pub mod enforce;
pub mod evidence;
pub mod guard;
pub mod limit;
pub(crate) mod lock;
pub mod notify;
pub mod owner;
pub mod state;
pub mod throttle;

use breaker::{Knob, Limited};
use cgroup::CgroupHandle;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Dry run: the decision was made, nothing was written.
    DryRun,
    /// The path now names another cgroup than the one pinned for the action: not touched.
    Replaced,
    /// The cgroup no longer exists.
    Gone,
    Failed(String),
}

impl Outcome {
    /// Every outcome, for the values of `nodeguard_actions_total{outcome}`.
    pub const ALL: [Outcome; 5] = [
        Outcome::Done,
        Outcome::DryRun,
        Outcome::Replaced,
        Outcome::Gone,
        Outcome::Failed(String::new()),
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::DryRun => "dry_run",
            Outcome::Replaced => "replaced",
            Outcome::Gone => "gone",
            Outcome::Failed(_) => "failed",
        }
    }
}

pub trait Actuator: Send + std::fmt::Debug {
    /// False for a dry run: nothing it "freezes" is ours to record or thaw.
    fn writes(&self) -> bool {
        true
    }
    fn freeze(&mut self, h: &CgroupHandle) -> Outcome;
    fn thaw(&mut self, h: &CgroupHandle) -> Outcome;
    fn kill(&mut self, h: &CgroupHandle) -> Outcome;
    /// Whether `kill` freezes the cgroup on its way (v1): that freeze is then recorded first.
    fn kill_freezes(&self) -> bool {
        false
    }
    /// What the kernel says of a cgroup we froze: `Some(false)` once something thawed it;
    /// `None` where it cannot tell (no freezer state to read).
    fn held(&mut self, _h: &CgroupHandle) -> Option<bool> {
        None
    }
    /// A knob's current value (`h` in the knob's hierarchy); empty for the connect filter.
    fn read_limit(&mut self, h: &CgroupHandle, knob: Knob) -> std::io::Result<String> {
        limit::read(h, knob)
    }
    /// Sets a knob (attaches the connect filter); returns the value the kernel shows now.
    fn set_limit(&mut self, h: &CgroupHandle, knob: Knob, value: &str) -> Result<String, String>;
    /// Undoes a limit: the knob gets back what it held before, if it still holds ours (a value
    /// someone set since is theirs); the connect filter is detached.
    fn clear_limit(&mut self, h: &CgroupHandle, l: &Limited) -> Outcome;
    /// Whether a limit is still in force (`None`: cannot tell).
    fn limit_held(&mut self, h: &CgroupHandle, l: &Limited) -> Option<bool> {
        Some(self.read_limit(h, l.knob).ok()? == l.value)
    }
}

/// Takes every decision, writes nothing.
#[derive(Debug, Default)]
pub struct DryRun;

impl Actuator for DryRun {
    fn writes(&self) -> bool {
        false
    }
    fn freeze(&mut self, _: &CgroupHandle) -> Outcome {
        Outcome::DryRun
    }
    fn thaw(&mut self, _: &CgroupHandle) -> Outcome {
        Outcome::DryRun
    }
    fn kill(&mut self, _: &CgroupHandle) -> Outcome {
        Outcome::DryRun
    }
    fn set_limit(&mut self, _: &CgroupHandle, _: Knob, value: &str) -> Result<String, String> {
        Ok(value.to_owned())
    }
    fn clear_limit(&mut self, _: &CgroupHandle, _: &Limited) -> Outcome {
        Outcome::DryRun
    }
}

/// Records calls (`"freeze /path"`) and succeeds; for tests of the decision logic. A cgroup
/// listed in `thawed_outside` reads as thawed by another hand.
#[derive(Debug, Default, Clone)]
pub struct Recording {
    pub calls: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    pub thawed_outside: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Recording {
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    fn push(&self, what: &str, h: &CgroupHandle) -> Outcome {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("{what} {}", h.rel));
        Outcome::Done
    }
}

impl Actuator for Recording {
    fn freeze(&mut self, h: &CgroupHandle) -> Outcome {
        self.push("freeze", h)
    }
    fn thaw(&mut self, h: &CgroupHandle) -> Outcome {
        self.push("thaw", h)
    }
    fn kill(&mut self, h: &CgroupHandle) -> Outcome {
        self.push("kill", h)
    }
    fn held(&mut self, h: &CgroupHandle) -> Option<bool> {
        let outside = self
            .thawed_outside
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Some(!outside.contains(&h.rel))
    }
    /// Knobs are the files of the fake tree: `limit <knob> <rel> <value>` is recorded.
    fn set_limit(&mut self, h: &CgroupHandle, knob: Knob, value: &str) -> Result<String, String> {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("limit {knob:?} {} {value}", h.rel));
        fake_write(h, knob, value).map_err(|e| e.to_string())?;
        limit::read(h, knob).map_err(|e| e.to_string())
    }
    fn clear_limit(&mut self, h: &CgroupHandle, l: &Limited) -> Outcome {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("restore {:?} {} {}", l.knob, h.rel, l.previous));
        match limit::read(h, l.knob) {
            Ok(now) if now == l.value => match fake_write(h, l.knob, &l.previous) {
                Ok(()) => Outcome::Done,
                Err(e) => Outcome::Failed(e.to_string()),
            },
            Ok(_) => Outcome::Done,
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

/// A knob of a fake tree is a plain file: written whole (a cgroup file takes a write at offset
/// 0 without truncation, a plain file would keep the tail of a longer value).
fn fake_write(h: &CgroupHandle, knob: Knob, value: &str) -> std::io::Result<()> {
    match knob.file() {
        Some(f) => std::fs::write(h.path.join(f), value),
        None => Ok(()),
    }
}
