//! The hand: the one agent that may write the state file, freeze, thaw and notify. It is the
//! holder of an exclusive `flock` on `<state file>.lock`, taken without waiting and held for
//! the agent's whole life; the kernel drops it when the holder exits, however it exits
//! (SIGKILL included), so a dead owner never blocks its successor.
//!
//! An instance without the lock (a second install, the new pod of a rolling update while the
//! old one still runs, a `cargo run` beside the DaemonSet) never writes, freezes, thaws or
//! notifies: it cannot undo a live owner's holds. It tries again at every tick.

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Held for as long as the value lives.
#[derive(Debug)]
pub(crate) struct StateLock {
    _lock: Flock<File>,
}

/// Why this instance has no hand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NoHand {
    /// Another live process holds the lock (`pid` as it wrote it, when readable).
    #[error("the state directory is owned by another nodeguard (pid {pid}, lock {path})")]
    Owned { path: PathBuf, pid: String },
    #[error("cannot take the state lock {path}: {error}")]
    Unusable { path: PathBuf, error: String },
}

pub(crate) fn lock_path(state_file: &Path) -> PathBuf {
    let name = state_file
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("state");
    state_file.with_file_name(format!("{name}.lock"))
}

impl StateLock {
    /// Takes the lock without waiting. Never blocks: the file is opened non-blocking, must be a
    /// regular file, and is never reached through a symlink.
    pub(crate) fn take(state_file: &Path) -> Result<StateLock, NoHand> {
        let path = lock_path(state_file);
        let unusable = |e: &dyn std::fmt::Display| NoHand::Unusable {
            path: path.clone(),
            error: e.to_string(),
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| unusable(&e))?;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| unusable(&e))?;
        let kind = file.metadata().map_err(|e| unusable(&e))?.file_type();
        if !kind.is_file() {
            let what = if kind.is_fifo() {
                "a fifo"
            } else {
                "not a regular file"
            };
            return Err(unusable(&what));
        }
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut lock) => {
                // Who holds it, for the message of the next instance; best effort.
                let me = format!("{}\n", std::process::id());
                let _ = lock
                    .set_len(0)
                    .and_then(|()| lock.rewind())
                    .and_then(|()| lock.write_all(me.as_bytes()));
                Ok(StateLock { _lock: lock })
            }
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let mut pid = String::new();
                let _ = (&mut file).take(32).read_to_string(&mut pid);
                let pid = pid.trim();
                Err(NoHand::Owned {
                    path,
                    pid: if pid.is_empty() {
                        "unknown".into()
                    } else {
                        pid.into()
                    },
                })
            }
            Err((_, e)) => Err(unusable(&e)),
        }
    }
}

/// Who holds the state lock, as seen by a command that only asks (`nodeguard release`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Holder {
    /// A live agent (the pid it wrote, or `unknown`).
    Agent { pid: String },
    /// No agent holds it (or none ever ran with this state file).
    Free,
}

/// Asks whether an agent holds the lock: opened read-only, without following a link or
/// blocking; a shared lock tried and dropped at once. An agent that starts in that instant
/// misses its lock for one tick and takes it at the next (it retries every tick).
pub(crate) fn holder(state_file: &Path) -> Result<Holder, NoHand> {
    let path = lock_path(state_file);
    let unusable = |e: &dyn std::fmt::Display| NoHand::Unusable {
        path: path.clone(),
        error: e.to_string(),
    };
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Holder::Free),
        Err(e) => return Err(unusable(&e)),
    };
    if !file.metadata().map_err(|e| unusable(&e))?.is_file() {
        return Err(unusable(&"not a regular file"));
    }
    match Flock::lock(file, FlockArg::LockSharedNonblock) {
        Ok(_shared) => Ok(Holder::Free),
        Err((mut file, Errno::EWOULDBLOCK)) => {
            let mut pid = String::new();
            let _ = (&mut file).take(32).read_to_string(&mut pid);
            let pid = pid.trim();
            Ok(Holder::Agent {
                pid: if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
                    "unknown".into()
                } else {
                    pid.into()
                },
            })
        }
        Err((_, e)) => Err(unusable(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("sub/state.json");
        let first = StateLock::take(&state).expect("first takes it");
        match StateLock::take(&state) {
            Err(NoHand::Owned { pid, .. }) => assert_eq!(pid, std::process::id().to_string()),
            other => panic!("second must be refused: {other:?}"),
        }
        assert_eq!(
            holder(&state),
            Ok(Holder::Agent {
                pid: std::process::id().to_string()
            })
        );
        drop(first);
        assert_eq!(holder(&state), Ok(Holder::Free));
        StateLock::take(&state).expect("free again once dropped");
        assert_eq!(
            holder(&dir.path().join("none/state.json")),
            Ok(Holder::Free)
        );
    }

    #[test]
    fn a_fifo_or_a_link_at_the_lock_name_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        nix::unistd::mkfifo(&lock_path(&state), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(matches!(
            StateLock::take(&state),
            Err(NoHand::Unusable { .. })
        ));
        let other = dir.path().join("other.json");
        std::os::unix::fs::symlink(dir.path().join("victim"), lock_path(&other)).unwrap();
        assert!(matches!(
            StateLock::take(&other),
            Err(NoHand::Unusable { .. })
        ));
        assert!(!dir.path().join("victim").exists());
    }

    #[test]
    fn an_unusable_directory_is_said() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("blocked"), "").unwrap();
        let e = StateLock::take(&dir.path().join("blocked/state.json")).unwrap_err();
        assert!(matches!(e, NoHand::Unusable { .. }), "{e}");
    }
}
