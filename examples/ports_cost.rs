//! Measures the two exact-enough sources of a pod netns's TCP ports, as root, for a pid in it:
//! reading `/proc/<pid>/net/tcp` + `tcp6` (no setns; misses bound-only sockets) against the
//! sampler's own pass (helper thread, setns, both sysctls, sock_diag dump of both families,
//! count). `cargo run --release --example ports_cost -- PID [ROUNDS]`; medians in microseconds.

use nodeguard::sample::net::ports::{read_namespaces, PortsJob, PortsOutcome};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let pid: u32 = args
        .next()
        .and_then(|a| a.parse().ok())
        .expect("usage: ports_cost PID [ROUNDS]");
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let proc_root = Path::new("/proc");
    let netns = std::fs::metadata(format!("/proc/{pid}/ns/net"))
        .expect("ns")
        .ino();
    let (mut procfs, mut diag, mut range_only) = (Vec::new(), Vec::new(), Vec::new());
    let mut lines = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        let a = std::fs::read(format!("/proc/{pid}/net/tcp")).expect("tcp");
        let b = std::fs::read(format!("/proc/{pid}/net/tcp6")).expect("tcp6");
        procfs.push(t.elapsed().as_secs_f64() * 1e6);
        lines = a.iter().chain(&b).filter(|&&c| c == b'\n').count() - 2;
        for (count, out) in [(true, &mut diag), (false, &mut range_only)] {
            let job = PortsJob {
                pid,
                netns,
                known: None,
                tcp_sockets: 0,
                trigger: if count { 0.0 } else { 2.0 },
            };
            let t = Instant::now();
            let (r, _) = read_namespaces(proc_root, &[job]);
            out.push(t.elapsed().as_secs_f64() * 1e6);
            if let [PortsOutcome::Failed(e)] = r.as_slice() {
                panic!("{e}");
            }
        }
    }
    let last = read_namespaces(
        proc_root,
        &[PortsJob {
            pid,
            netns,
            known: None,
            tcp_sockets: 0,
            trigger: 0.0,
        }],
    );
    println!("sockets in /proc/{pid}/net/tcp*: {lines}; last pass {last:?}");
    println!("procfs tcp+tcp6 read: {:.0} us", median(procfs));
    println!(
        "sampler pass, range only (thread, setns, 2 sysctls): {:.0} us",
        median(range_only)
    );
    println!("sampler pass with sock_diag count: {:.0} us", median(diag));
}
