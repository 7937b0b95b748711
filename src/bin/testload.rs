//! `nodeguard-testload`: the misbehaving workloads of the integration tests and whole-node
//! scenarios. It joins the cgroups it is told to, sets up its load, prints `ready`, then holds
//! until its stdin closes, when it reaps its children and exits (so tests never need to signal
//! anything they did not start, and zombies never outlive a test).

use std::io::{Read, Write};
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!(
        "usage: nodeguard-testload [--join PROCS_FILE]... [--comm NAME] <mode>\n\
         modes: idle | zombies N | alloc BYTES | oom BYTES"
    );
    ExitCode::from(64)
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut joins = Vec::new();
    let mut comm = None;
    while args.first().is_some_and(|a| a.starts_with("--")) {
        let flag = args.remove(0);
        let Some(value) = (!args.is_empty()).then(|| args.remove(0)) else {
            return usage();
        };
        match flag.as_str() {
            "--join" => joins.push(value),
            "--comm" => comm = Some(value),
            _ => return usage(),
        }
    }
    // Join before anything else so every child is born inside the cgroups.
    for j in &joins {
        if let Err(e) = std::fs::write(j, std::process::id().to_string()) {
            eprintln!("join {j}: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(c) = comm {
        if let Ok(name) = std::ffi::CString::new(c) {
            let _ = nix::sys::prctl::set_name(&name);
        }
    }
    let mode = args.first().map(String::as_str);
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let mut children = Vec::new();
    let mut hold: Vec<Vec<u8>> = Vec::new();
    match mode {
        Some("idle") => {}
        Some("zombies") => {
            for _ in 0..n {
                // SAFETY: this process is single-threaded; the child only calls _exit.
                match unsafe { nix::unistd::fork() } {
                    Ok(nix::unistd::ForkResult::Child) => unsafe { nix::libc::_exit(0) },
                    Ok(nix::unistd::ForkResult::Parent { child }) => children.push(child),
                    Err(e) => {
                        eprintln!("fork: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            // Ready only once every child has exited and sits unreaped.
            for c in &children {
                while !is_zombie(c.as_raw()) {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
        }
        Some("alloc") | Some("oom") => {
            // Touch every page so the memory is charged, in 1 MiB steps.
            let step = 1 << 20;
            let mut done = 0;
            while done < n {
                let len = step.min(n - done) as usize;
                hold.push(vec![0xA5u8; len]);
                done += len as u64;
            }
        }
        _ => return usage(),
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "ready {}", std::process::id());
    let _ = out.flush();
    // Hold until the test closes our stdin.
    let mut sink = [0u8; 64];
    while matches!(std::io::stdin().read(&mut sink), Ok(n) if n > 0) {}
    for c in children {
        let _ = nix::sys::wait::waitpid(c, None);
    }
    drop(hold);
    ExitCode::SUCCESS
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}
