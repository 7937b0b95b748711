//! The rest of the tick on the synthetic 220-container v2 node of `benches/tick.rs` (a fixture
//! tree in a temp dir, no sockets): per tick, the tick thread's CPU minus what the samplers
//! charged themselves (`cpu_seconds_total`), and the CPU of rendering `/metrics` for it.
//! `cargo run --release --example rest_cost -- [TICKS]`; means in microseconds.

use nodeguard::agent::Agent;
use nodeguard::clock::SystemClock;
use nodeguard::config::Config;
use nodeguard::export::metrics::{registry, render};
use std::fs;
use std::path::Path;
use std::sync::{Arc, RwLock};

fn thread_cpu_us() -> f64 {
    let r = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_THREAD)
        .expect("getrusage");
    let us = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e6 + t.tv_usec() as f64;
    us(r.user_time()) + us(r.system_time())
}

const PODS: usize = 110;
const CONTAINERS_PER_POD: usize = 2;
const PROCS_PER_CONTAINER: usize = 9;

fn write(p: &Path, s: &str) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, s).unwrap();
}

fn build_node(root: &Path) {
    let cg = root.join("sys/fs/cgroup");
    write(&cg.join("cgroup.controllers"), "cpu memory pids\n");
    let mut pid = 1000;
    for p in 0..PODS {
        let uid = format!("{p:08x}-0000-4000-8000-000000000000");
        let pod_dir = cg.join(format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        ));
        write(
            &pod_dir.join("memory.events"),
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
        );
        for c in 0..CONTAINERS_PER_POD {
            let id = format!("{p:032x}{c:032x}");
            let dir = pod_dir.join(format!("cri-containerd-{id}.scope"));
            write(&dir.join("memory.current"), "157286400\n");
            write(&dir.join("memory.max"), "536870912\n");
            write(&dir.join("memory.stat"), "anon 104857600\nfile 52428800\nkernel 1048576\nactive_file 20000000\ninactive_file 32428800\n");
            write(
                &dir.join("memory.events"),
                "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
            );
            let mut procs = String::new();
            for _ in 0..PROCS_PER_CONTAINER {
                procs.push_str(&format!("{pid}\n"));
                write(
                    &root.join(format!("proc/{pid}/stat")),
                    &format!("{pid} (worker) S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 100 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n"),
                );
                pid += 1;
            }
            write(&dir.join("cgroup.procs"), &procs);
            let name = format!("c{c}");
            let log = root.join(format!("var/log/pods/ns{p}_pod{p}_{uid}/{name}/0.log"));
            let mut lines = String::new();
            for i in 0..100 {
                lines.push_str(&format!("2026-07-20T04:46:01.{i:09}Z stderr F line {i}\n"));
            }
            write(&log, &lines);
            write(
                &root.join(format!("var/log/containers/pod{p}_ns{p}_{name}-{id}.log")),
                "",
            );
        }
    }
}

fn main() {
    let ticks: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(50);
    let dir = tempfile::tempdir().expect("temp dir");
    build_node(dir.path());
    let r = dir.path().display();
    let cfg = Config::from_yaml(&format!(
        "paths:\n  proc: {r}/proc\n  cgroup: {r}/sys/fs/cgroup\n  pod_logs: {r}/var/log/pods\n  container_logs: {r}/var/log/containers\n  kmsg: {r}/dev/kmsg\n"
    ))
    .expect("config");
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
