//! Memory loads: `alloc`, `oom`, `oom-child`, `oom-child-hold`, `grow`.

use std::process::ExitCode;
use std::time::Duration;

/// Forks a child that touches `bytes` in 1 MiB steps and waits for it: the unix signal that
/// ended it (9 for the OOM killer), or an error if it exited by itself.
pub fn oom_child_stay(bytes: u64) -> Result<i32, String> {
    use nix::sys::wait::{waitpid, WaitStatus};
    // SAFETY: single-threaded here; the child only allocates and calls _exit.
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        nix::unistd::ForkResult::Child => {
            let mut charged: Vec<Vec<u8>> = Vec::new();
            let mut done = 0;
            while done < bytes {
                let len = (1u64 << 20).min(bytes - done) as usize;
                charged.push(vec![0xA5u8; len]);
                done += len as u64;
            }
            // SAFETY: plain _exit in the child.
            unsafe { nix::libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => match waitpid(child, None) {
            Ok(WaitStatus::Signaled(_, sig, _)) => Ok(sig as i32),
            Ok(st) => Err(format!("child ended without a signal: {st:?}")),
            Err(e) => Err(format!("waitpid: {e}")),
        },
    }
}

/// Touches every page so the memory is charged, in 1 MiB steps; kept by the caller.
pub fn alloc(n: u64) -> Vec<Vec<u8>> {
    let mut charged = Vec::new();
    let step = 1 << 20;
    let mut done = 0;
    while done < n {
        let len = step.min(n - done) as usize;
        charged.push(vec![0xA5u8; len]);
        done += len as u64;
    }
    charged
}

/// The victim is a child (the largest task of the cgroup); the parent reaps it and exits 0 if it
/// died of SIGKILL, 1 otherwise, without ever printing `ready`.
pub fn oom_child(n: u64) -> ExitCode {
    // SAFETY: this process is single-threaded here; the child only allocates and exits.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let mut charged: Vec<Vec<u8>> = Vec::new();
            let mut done = 0;
            while done < n {
                charged.push(vec![0xA5u8; (1u64 << 20).min(n - done) as usize]);
                done += 1 << 20;
            }
            unsafe { nix::libc::_exit(0) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            let st = nix::sys::wait::waitpid(child, None);
            let killed = matches!(
                st,
                Ok(nix::sys::wait::WaitStatus::Signaled(
                    _,
                    nix::sys::signal::Signal::SIGKILL,
                    _
                ))
            );
            if killed {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("fork: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A steady leak on a thread of its own: 1 MiB every `ms` milliseconds up to `total`, then kept
/// until the process exits.
pub fn grow(total: u64, ms: u64) {
    std::thread::spawn(move || {
        let mut grown = Vec::new();
        let mut done = 0u64;
        while done < total {
            std::thread::sleep(Duration::from_millis(ms));
            grown.push(vec![0xA5u8; 1 << 20]);
            done += 1 << 20;
        }
        std::mem::forget(grown);
    });
}
