//! Measures the agent's own per-tick reading (`SelfReader::sample`: `stat`, `status` and the fd
//! count) while this process holds as many descriptors as the agent does on a 110-pod node
//! (3,428 in the whole-node scenario), against the fd count it replaced (a listing of
//! `/proc/self/fd`). CPU time (utime + stime, `getrusage`) per call, mean of ROUNDS calls.
//! `cargo run --release --example selfstat_cost -- [FDS] [ROUNDS]`.

use nodeguard::sample::selfstat::SelfReader;
use std::path::PathBuf;

fn cpu() -> f64 {
    let r = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e6 + t.tv_usec() as f64;
    us(r.user_time()) + us(r.system_time())
}

fn per_call(rounds: usize, mut f: impl FnMut() -> u64) -> (f64, u64) {
    let t = cpu();
    let mut last = 0;
    for _ in 0..rounds {
        last = f();
    }
    ((cpu() - t) / rounds as f64, last)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let fds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3_400);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(500);
    let held: Vec<std::fs::File> = (0..fds)
        .map(|_| std::fs::File::open("/dev/null").expect("open /dev/null"))
        .collect();
    let mut reader = SelfReader::new(PathBuf::from("/proc"));
    let (sample, n) = per_call(rounds, || reader.sample().map_or(0, |s| s.open_fds));
    let (listing, m) = per_call(rounds, || {
        std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count() as u64)
            .unwrap_or(0)
    });
    println!(
        "{} descriptors: SelfReader::sample {sample:.1} us/call (open_fds {n}); \
         listing /proc/self/fd {listing:.1} us/call ({m} entries)",
        held.len()
    );
}
