//! The rest of the tick on the synthetic 220-container v2 node of `benches/tick.rs` (a fixture
//! tree in a temp dir, no sockets): per tick, the tick thread's CPU minus what the samplers
//! charged themselves (`cpu_seconds_total`), and the CPU of rendering `/metrics` for it.
//! `cargo run --release --example rest_cost -- [TICKS]`; means in microseconds.

#[path = "../benches/support/node.rs"]
mod node;

use nodeguard::agent::Agent;
use nodeguard::clock::SystemClock;
use nodeguard::export::metrics::{registry, render};
use std::sync::{Arc, RwLock};

fn thread_cpu_us() -> f64 {
    let r = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD)
        .expect("getrusage");
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e6 + t.tv_usec() as f64;
    us(r.user_time()) + us(r.system_time())
}

fn main() {
    let ticks: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50);
    let dir = tempfile::tempdir().expect("temp dir");
    node::build(dir.path());
    let cfg = node::config(dir.path());
    let mut agent = Agent::new(cfg, Arc::new(SystemClock)).expect("agent");
    let sampled = |p: &nodeguard::model::Published| -> f64 {
        p.samplers.iter().map(|s| s.cpu_seconds_total).sum::<f64>() * 1e6
    };
    let mut last = agent.tick();
    let (mut tick_us, mut sampler_us, mut render_us, mut bytes) = (0.0, 0.0, 0.0, 0);
    for _ in 0..ticks {
        let t = thread_cpu_us();
        let p = agent.tick();
        tick_us += thread_cpu_us() - t;
        sampler_us += sampled(&p) - sampled(&last);
        let reg = registry(Arc::new(RwLock::new(Arc::new(p.clone()))));
        let t = thread_cpu_us();
        bytes = render(&reg).expect("render").len();
        render_us += thread_cpu_us() - t;
        last = p;
    }
    let n = ticks as f64;
    println!(
        "{} workloads, {ticks} ticks: tick {:.0} us, samplers {:.0} us, rest of the tick {:.0} us; /metrics {:.0} us ({bytes} bytes)",
        last.workloads.len(),
        tick_us / n,
        sampler_us / n,
        (tick_us - sampler_us) / n,
        render_us / n
    );
}
