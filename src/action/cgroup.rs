//! Freezing and killing a container's own leaf cgroup, through a directory handle opened when the
//! rule started pending (the pin): a cgroup recreated at the same path is a different inode and is
//! never touched.

use super::breaker::{Knob, Limited};
use super::connect_limit::{self, ConnectLimiter};
use super::limit;
use super::{Actuator, Outcome};
use crate::cgroupfs::{join_rel, CgroupLayout};
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, Mode};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Which freezer the host's runtime uses. On hybrid hosts only one of them may be used: after a
/// v1 freeze, v2 never reports frozen for the same tasks (KERNEL-TRAPS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Freezer {
    V1 {
        root: PathBuf,
    },
    V2 {
        root: PathBuf,
    },
    /// No freezer: SIGSTOP/SIGCONT through pidfds, listing pids in the primary hierarchy.
    Sigstop {
        root: PathBuf,
    },
}

impl Freezer {
    pub fn detect(layout: &CgroupLayout) -> Freezer {
        if let Some(root) = layout.v1_controller("freezer") {
            return Freezer::V1 { root };
        }
        match layout.unified() {
            Some(u) if u.join("cgroup.freeze").exists() || has_freeze_file(u) => Freezer::V2 {
                root: u.to_path_buf(),
            },
            _ => Freezer::Sigstop {
                root: layout.primary(),
            },
        }
    }

    pub fn root(&self) -> &Path {
        match self {
            Freezer::V1 { root } | Freezer::V2 { root } | Freezer::Sigstop { root } => root,
        }
    }
}

/// The root cgroup has no `cgroup.freeze`; any child does when the kernel supports it.
fn has_freeze_file(root: &Path) -> bool {
    std::fs::read_dir(root)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .any(|e| e.path().join("cgroup.freeze").exists())
        })
        .unwrap_or(true)
}

/// An open cgroup directory and the identity it had when opened.
#[derive(Debug)]
pub struct CgroupHandle {
    pub rel: String,
    pub path: PathBuf,
    dir: OwnedFd,
    pub dev: u64,
    pub ino: u64,
}

impl CgroupHandle {
    pub fn open(freezer: &Freezer, rel: &str) -> std::io::Result<CgroupHandle> {
        CgroupHandle::open_at(freezer.root(), rel)
    }

    /// The cgroup `rel` in the hierarchy mounted at `root` (a limit's knob lives in its
    /// controller's hierarchy, not always the freezer's).
    pub fn open_at(root: &Path, rel: &str) -> std::io::Result<CgroupHandle> {
        let path = join_rel(root, rel);
        let fd = nix::fcntl::open(
            &path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(std::io::Error::from)?;
        // SAFETY: `open` returned a fresh descriptor that nothing else owns.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        let st = fstat(dir.as_raw_fd()).map_err(std::io::Error::from)?;
        Ok(CgroupHandle {
            rel: rel.to_owned(),
            path,
            dir,
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        })
    }

    /// Reopens a persisted handle, only if the path still names the same cgroup.
    pub fn reopen(freezer: &Freezer, rel: &str, ino: u64) -> Option<CgroupHandle> {
        CgroupHandle::open(freezer, rel)
            .ok()
            .filter(|h| h.ino == ino)
    }

    /// The path still resolves to the directory of this handle (not removed, not recreated).
    pub fn same_cgroup(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&self.path).is_ok_and(|m| m.ino() == self.ino && m.dev() == self.dev)
    }

    pub(crate) fn write_file(&self, file: &str, value: &str) -> std::io::Result<()> {
        let fd = openat(
            Some(self.dir.as_raw_fd()),
            file,
            OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(std::io::Error::from)?;
        // SAFETY: fresh descriptor from openat.
        let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        f.write_all(value.as_bytes())
    }

    pub(crate) fn read_file(&self, file: &str) -> std::io::Result<String> {
        let fd = openat(
            Some(self.dir.as_raw_fd()),
            file,
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(std::io::Error::from)?;
        // SAFETY: fresh descriptor from openat.
        let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut s = String::new();
        f.read_to_string(&mut s)?;
        Ok(s)
    }

    /// Every process in this cgroup and in every cgroup below it: freezing and `cgroup.kill`
    /// are hierarchical, so whatever checks, stops or kills a target must see the whole subtree.
    /// Bounded: a subtree too deep or too wide to verify is an error, never a partial answer.
    pub fn subtree_pids(&self) -> std::io::Result<Vec<u32>> {
        let mut pids = Vec::new();
        let mut seen = 0usize;
        walk_subtree(&self.path, 0, &mut seen, &mut pids)?;
        Ok(pids)
    }

    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.dir.as_fd()
    }
}

/// A subtree walk stops here: far beyond any kubelet or systemd tree, small enough to stay cheap.
pub const MAX_SUBTREE_CGROUPS: usize = 4096;
const MAX_SUBTREE_DEPTH: usize = 32;

fn walk_subtree(
    dir: &Path,
    depth: usize,
    seen: &mut usize,
    pids: &mut Vec<u32>,
) -> std::io::Result<()> {
    *seen += 1;
    if *seen > MAX_SUBTREE_CGROUPS || depth > MAX_SUBTREE_DEPTH {
        return Err(std::io::Error::other(format!(
            "more than {MAX_SUBTREE_CGROUPS} cgroups or {MAX_SUBTREE_DEPTH} levels below {}",
            dir.display()
        )));
    }
    match std::fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(t) => pids.extend(crate::cgroupfs::parse_procs(&t)),
        // A cgroup removed while we walk has no processes left to protect or kill (and a
        // directory listing below tells whether it is gone).
        Err(e) if crate::fsio::is_gone(&e) => {}
        Err(e) => return Err(e),
    }
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if crate::fsio::is_gone(&e) => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in rd {
        let entry = entry?;
        // `file_type` does not follow symlinks: cgroupfs has none, and a planted one is skipped.
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk_subtree(&entry.path(), depth + 1, seen, pids)?;
        }
    }
    Ok(())
}

/// Pure: `frozen 1` in a v2 `cgroup.events`.
pub fn v2_frozen(events: &str) -> bool {
    events.lines().any(|l| l.trim() == "frozen 1")
}

#[derive(Debug)]
pub struct CgroupActuator {
    freezer: Freezer,
    timeout: Duration,
    /// Pids never sent SIGSTOP or SIGKILL, whatever cgroup they sit in: 1, 2 and the agent.
    protected_pids: Vec<u32>,
    /// The connect filters loaded so far, one per policy (loaded at first use, kept).
    connect: Vec<ConnectLimiter>,
}

impl CgroupActuator {
    pub fn new(freezer: Freezer, timeout: Duration) -> Self {
        CgroupActuator {
            freezer,
            timeout,
            protected_pids: vec![1, 2, std::process::id()],
            connect: Vec::new(),
        }
    }

    /// The loaded filter for a policy value (`refuse`, `rate:<n>`).
    fn limiter(&mut self, value: &str) -> Result<&ConnectLimiter, String> {
        let policy = limit::connect_policy(value)
            .ok_or_else(|| format!("{value:?} is not a connect policy"))?;
        if let Some(i) = self.connect.iter().position(|l| l.policy() == policy) {
            return Ok(&self.connect[i]);
        }
        let l = ConnectLimiter::load(policy).map_err(|e| e.to_string())?;
        self.connect.push(l);
        Ok(&self.connect[self.connect.len() - 1])
    }

    fn wait(&self, mut done: impl FnMut() -> std::io::Result<bool>) -> std::io::Result<bool> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if done()? {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends the unix signal `sig` to every process of the subtree but the protected ones;
    /// returns how many it reached.
    fn send_to_subtree(
        &self,
        h: &CgroupHandle,
        sig: nix::sys::signal::Signal,
    ) -> std::io::Result<usize> {
        let mut n = 0;
        for pid in h.subtree_pids()? {
            if self.protected_pids.contains(&pid) {
                continue;
            }
            // A pidfd pins the process: SIGSTOP or SIGKILL cannot reach a recycled pid.
            let Ok(fd) = pidfd_open(pid) else { continue };
            if pidfd_send_signal(&fd, sig).is_ok() {
                n += 1;
            }
        }
        Ok(n)
    }

    fn freeze_inner(&self, h: &CgroupHandle) -> std::io::Result<bool> {
        match &self.freezer {
            Freezer::V1 { .. } => {
                h.write_file("freezer.state", "FROZEN")?;
                self.wait(|| Ok(h.read_file("freezer.state")?.trim() == "FROZEN"))
            }
            Freezer::V2 { .. } => {
                h.write_file("cgroup.freeze", "1")?;
                self.wait(|| Ok(v2_frozen(&h.read_file("cgroup.events")?)))
            }
            Freezer::Sigstop { .. } => {
                self.send_to_subtree(h, nix::sys::signal::Signal::SIGSTOP)?;
                Ok(true)
            }
        }
    }
}

impl Actuator for CgroupActuator {
    fn kill_freezes(&self) -> bool {
        matches!(self.freezer, Freezer::V1 { .. })
    }

    fn set_limit(&mut self, h: &CgroupHandle, knob: Knob, value: &str) -> Result<String, String> {
        if knob == Knob::Connect {
            // Attaching again is a no-op for a filter already there (the re-assert).
            let l = self.limiter(value)?;
            // The attachment stays in the kernel, held by the cgroup: the release finds ours by
            // name (`clear_limit`), as after a crash, so no handle needs keeping.
            drop(l.attach(&h.path).map_err(|e| e.to_string())?);
            return Ok(value.to_owned());
        }
        limit::write(h, knob, value).map_err(|e| format!("{}: {e}", h.path.display()))
    }

    fn clear_limit(&mut self, h: &CgroupHandle, l: &Limited) -> Outcome {
        if l.knob == Knob::Connect {
            // Ours by name, whichever instance attached them (a crashed agent's too).
            return match connect_limit::detach_all_ours(&h.path) {
                Ok(_) => Outcome::Done,
                Err(e) => Outcome::Failed(e.to_string()),
            };
        }
        match limit::read(h, l.knob) {
            Ok(now) if now == l.value => match limit::write(h, l.knob, &l.previous) {
                Ok(_) => Outcome::Done,
                Err(e) if crate::fsio::is_gone(&e) => Outcome::Gone,
                Err(e) => Outcome::Failed(format!("restore {}: {e}", h.path.display())),
            },
            // Someone set it since: theirs now.
            Ok(_) => Outcome::Done,
            Err(e) if crate::fsio::is_gone(&e) => Outcome::Gone,
            Err(e) => Outcome::Failed(format!("read {}: {e}", h.path.display())),
        }
    }

    fn limit_held(&mut self, h: &CgroupHandle, l: &Limited) -> Option<bool> {
        if l.knob == Knob::Connect {
            let ours = self.limiter(&l.value).ok()?.prog_ids();
            let on = connect_limit::attached_ids(&h.path, connect_limit::Hook::Connect4).ok()?;
            return Some(ours.iter().any(|id| on.contains(id)));
        }
        Some(limit::read(h, l.knob).ok()? == l.value)
    }

    /// FREEZING counts as held: a freeze in progress is ours. SIGSTOP leaves nothing to read.
    fn held(&mut self, h: &CgroupHandle) -> Option<bool> {
        match &self.freezer {
            Freezer::V1 { .. } => Some(h.read_file("freezer.state").ok()?.trim() != "THAWED"),
            Freezer::V2 { .. } => Some(h.read_file("cgroup.freeze").ok()?.trim() != "0"),
            Freezer::Sigstop { .. } => None,
        }
    }

    fn freeze(&mut self, h: &CgroupHandle) -> Outcome {
        let why = match self.freeze_inner(h) {
            Ok(true) => return Outcome::Done,
            Ok(false) => "freeze did not complete in time".to_owned(),
            Err(e) => format!("freeze {}: {e}", h.path.display()),
        };
        // Never leave a half-frozen cgroup behind; a thaw that fails here is retried by the
        // enforcer, which keeps the cgroup on its list until a thaw succeeds.
        match self.thaw(h) {
            Outcome::Failed(e) => Outcome::Failed(format!("{why}; thaw failed too: {e}")),
            _ => Outcome::Failed(format!("{why}; thawed")),
        }
    }

    fn thaw(&mut self, h: &CgroupHandle) -> Outcome {
        let res = match &self.freezer {
            Freezer::V1 { .. } => h.write_file("freezer.state", "THAWED"),
            Freezer::V2 { .. } => h.write_file("cgroup.freeze", "0"),
            Freezer::Sigstop { .. } => self
                .send_to_subtree(h, nix::sys::signal::Signal::SIGCONT)
                .map(|_| ()),
        };
        match res {
            Ok(()) => Outcome::Done,
            // A cgroup that is gone has nothing left to thaw.
            Err(e) if crate::fsio::is_gone(&e) => Outcome::Gone,
            Err(e) => Outcome::Failed(format!("thaw {}: {e}", h.path.display())),
        }
    }

    fn kill(&mut self, h: &CgroupHandle) -> Outcome {
        if let Freezer::V2 { .. } = self.freezer {
            if let Err(e) = h.write_file("cgroup.kill", "1") {
                return Outcome::Failed(format!("cgroup.kill {}: {e}", h.path.display()));
            }
        } else {
            // Freeze first so nothing forks away between listing and SIGKILL.
            let v1 = matches!(self.freezer, Freezer::V1 { .. });
            if v1 {
                // Best effort: whether or not the freeze completes, SIGKILL goes out and the
                // thaw below follows.
                if let Err(e) = self.freeze_inner(h) {
                    tracing::debug!(cgroup = %h.path.display(), error = %e, "freeze before kill");
                }
            }
            let sent = self.send_to_subtree(h, nix::sys::signal::Signal::SIGKILL);
            // On v1 SIGKILL does not land while frozen: thaw after sending it, also after a
            // freeze that timed out half-way (the enforcer retries a thaw that fails).
            if v1 {
                if let Outcome::Failed(e) = self.thaw(h) {
                    return Outcome::Failed(format!("thaw after the kill signal: {e}"));
                }
            }
            if let Err(e) = sent {
                return Outcome::Failed(format!("kill {}: {e}", h.path.display()));
            }
        }
        match self.wait(|| Ok(h.subtree_pids()?.is_empty())) {
            Ok(true) => Outcome::Done,
            Ok(false) => Outcome::Failed("processes remained after the kill timeout".into()),
            Err(e) if crate::fsio::is_gone(&e) => Outcome::Done,
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; on success the kernel returns a new descriptor we own.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid as nix::libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor returned by pidfd_open.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_send_signal(fd: &OwnedFd, sig: nix::sys::signal::Signal) -> std::io::Result<()> {
    // SAFETY: plain syscall on a pidfd we own; no siginfo.
    let r = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig as nix::libc::c_int,
            std::ptr::null::<nix::libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_events() {
        assert!(v2_frozen("populated 1\nfrozen 1\n"));
        assert!(!v2_frozen("populated 1\nfrozen 0\n"));
    }
}
