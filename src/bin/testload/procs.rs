//! Process-table loads: `zombies`, `tasks`, `forker`.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Bytes, not a string: the comm in `stat` is whatever the process named itself (`--comm-hex`).
pub fn is_zombie(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let close = s.iter().rposition(|b| *b == b')')?;
            s[close + 1..]
                .iter()
                .find(|b| **b != b' ')
                .map(|b| *b == b'Z')
        })
        .unwrap_or(false)
}

pub const MAX_FORKER_CHILDREN: usize = 1000;
/// A child left without its parent exits after this long (the kill test wants orphans that do
/// not vanish by themselves right away); and every child exits after `CHILD_LIFETIME` anyway.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(10);
pub const CHILD_LIFETIME: Duration = Duration::from_secs(600);

/// Forks one child that sleeps until its lifetime ends or it has been an orphan for a while.
pub fn fork_child() -> Result<nix::unistd::Pid, nix::Error> {
    let parent = nix::unistd::getpid();
    // SAFETY: the forker is single-threaded; the child only sleeps, reads its parent pid and
    // calls _exit.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            let step = Duration::from_millis(100);
            let mut orphaned = Duration::ZERO;
            let mut lived = Duration::ZERO;
            while lived < CHILD_LIFETIME && orphaned < ORPHAN_GRACE {
                std::thread::sleep(step);
                lived += step;
                if nix::unistd::getppid() != parent {
                    orphaned += step;
                }
            }
            // SAFETY: plain _exit in the child.
            unsafe { nix::libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => Ok(child),
    }
}

/// Keeps `n` children alive, re-forking any that dies (at most `n * 100` re-forks), until stdin
/// closes (or 11 minutes pass); then kills and reaps its own children and exits.
pub fn forker(n: usize) -> ExitCode {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        match fork_child() {
            Ok(c) => children.push(c),
            Err(e) => {
                eprintln!("fork: {e}");
                for c in &children {
                    let _ = nix::sys::signal::kill(*c, nix::sys::signal::Signal::SIGKILL);
                    let _ = waitpid(*c, None);
                }
                return ExitCode::FAILURE;
            }
        }
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready {}", std::process::id());
    let _ = out.flush();
    let mut reforks_left = n * 100;
    // Bounded even if the test never closes stdin.
    let deadline = Instant::now() + CHILD_LIFETIME + Duration::from_secs(60);
    while Instant::now() < deadline {
        // Reap whatever died and replace it.
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(st) => {
                    let Some(pid) = st.pid() else { break };
                    children.retain(|c| *c != pid);
                    if reforks_left > 0 {
                        reforks_left -= 1;
                        match fork_child() {
                            Ok(c) => children.push(c),
                            Err(e) => eprintln!("re-fork: {e}"),
                        }
                    }
                }
            }
        }
        // Wait up to 50 ms for stdin to close.
        let mut pfd = nix::libc::pollfd {
            fd: 0,
            events: nix::libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { nix::libc::poll(&mut pfd, 1, 50) };
        if r > 0 {
            let mut sink = [0u8; 64];
            if !matches!(std::io::stdin().read(&mut sink), Ok(k) if k > 0) {
                break;
            }
        }
    }
    for c in &children {
        let _ = nix::sys::signal::kill(*c, nix::sys::signal::Signal::SIGKILL);
    }
    for c in children {
        let _ = waitpid(c, None);
    }
    ExitCode::SUCCESS
}

/// Forks `n` children that exit at once, and returns once each sits unreaped (a zombie).
pub fn zombies(n: u64) -> Result<Vec<nix::unistd::Pid>, String> {
    let mut children = Vec::new();
    for _ in 0..n {
        // SAFETY: this process is single-threaded; the child only calls _exit.
        match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => unsafe { nix::libc::_exit(0) },
            Ok(nix::unistd::ForkResult::Parent { child }) => children.push(child),
            Err(e) => return Err(format!("fork: {e}")),
        }
    }
    for c in &children {
        while !is_zombie(c.as_raw()) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    Ok(children)
}

/// Threads that park until the process exits (they die with it).
pub fn idle_threads(n: u64) -> Result<(), String> {
    for i in 0..n {
        std::thread::Builder::new()
            .name(format!("idle-{i}"))
            .spawn(|| loop {
                std::thread::park();
            })
            .map_err(|_| format!("thread {i}: cannot spawn"))?;
    }
    Ok(())
}
