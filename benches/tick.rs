//! Cost of one full tick on a synthetic node the size of a busy Pi 5 (110 pods, 220 containers,
//! ~2,000 processes, v2 layout), built in a temp dir so the bench never depends on the live host;
//! and the cost of rendering `/metrics` for 250 containers with every signal present (memory with
//! limits, sockets by state, logs, zombies, pod netns totals, conntrack, a dump, node name).

#[path = "support/node.rs"]
mod node;

use criterion::{criterion_group, criterion_main, Criterion};
use nodeguard::agent::Agent;
use nodeguard::clock::SystemClock;
use nodeguard::export::metrics::{registry, render};
use nodeguard::model::LineCounts;
use nodeguard::model::PidsSample;
use nodeguard::model::WorkloadId;
use nodeguard::model::ZombieParent;
use nodeguard::model::{
    DumpStatus, EphemeralPorts, Kept, MemoryValues, NetnsSockets, NodeConntrack, PodSignals,
    Snapshot, SocketCounts, WorkloadSignals,
};
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    node::build(dir.path());
    let cfg = node::config(dir.path());
    let mut agent = Agent::new(cfg, Arc::new(SystemClock)).unwrap();
    let first = agent.tick();
    assert_eq!(first.workloads.len(), node::PODS * node::CONTAINERS_PER_POD);
    c.bench_function("tick_220_containers_v2_fixture", |b| {
        b.iter(|| agent.tick())
    });

    let shared = Arc::new(RwLock::new(Arc::new(agent.tick())));
    let reg = registry(shared);
    c.bench_function("render_metrics_220_containers", |b| {
        b.iter(|| render(&reg).unwrap())
    });
}

/// A snapshot of 125 pods x 2 containers where every series family has its rows.
fn full_snapshot(pods: usize) -> Snapshot {
    let mut snap = Snapshot {
        node: "pi5-node-07".into(),
        cgroup_layout: "v2".into(),
        node_conntrack: Some(NodeConntrack {
            entries: 130_000,
            limit: 262_144,
        }),
        conntrack_dump: Some(DumpStatus {
            age_seconds: 4.2,
            duration_seconds: 0.21,
            entries: 130_000,
            attributed: 104_000,
            restarts: 0,
        }),
        ..Snapshot::default()
    };
    for p in 0..pods {
        let uid = format!("{p:08x}-0000-4000-8000-000000000000");
        let (namespace, pod) = (
            format!("team-{}", p % 12),
            format!("service-{p}-7d9f8b6c5-x2k4q"),
        );
        for c in 0..2 {
            let mut states = BTreeMap::new();
            states.insert("established", 90 + c as u64);
            states.insert("listen", 1);
            states.insert("time_wait", 2);
            snap.workloads.push(WorkloadSignals {
                id: WorkloadId::container(&namespace, &pod, if c == 0 { "app" } else { "sidecar" }),
                kind: nodeguard::model::Kind::Container,
                qos: None,
                pod_uid: Some(uid.clone()),
                container_id: Some(format!("{p:032x}{c:032x}")),
                cgroup: Some(format!("/kubepods.slice/pod{p}/c{c}")),
                memory: Some(Kept {
                    value: MemoryValues {
                        usage_bytes: 157_286_400 + p as u64,
                        working_set_bytes: 124_857_600,
                        limit_bytes: Some(536_870_912),
                    },
                    stale: false,
                }),
                oom_kills_total: (p % 3) as u64,
                processes: Some(Kept {
                    value: 9,
                    stale: false,
                }),
                zombies: Some(Kept {
                    value: (p % 2) as u64,
                    stale: false,
                }),
                zombie_parents: if p % 2 == 1 {
                    vec![ZombieParent {
                        pid: 4000 + p as u32,
                        comm: "worker".into(),
                        zombies: 1,
                    }]
                } else {
                    vec![]
                },
                log_lines_total: LineCounts {
                    stdout: 12_345,
                    stderr: 678,
                    malformed: 0,
                },
                log_lines_per_minute: LineCounts {
                    stdout: 60,
                    stderr: 2,
                    malformed: 0,
                },
                restarts_total: (p % 4) as u64,
                sockets: Some(Kept {
                    value: SocketCounts {
                        tcp: 93,
                        udp: 1,
                        tcp_states: states,
                    },
                    stale: false,
                }),
                pids: Some(Kept {
                    value: PidsSample {
                        current: 23,
                        limit: Some(1024),
                    },
                    stale: false,
                }),
                memory_full_in_seconds: (p % 50 == 0).then_some(1800.0),
            });
        }
        snap.pods.push(PodSignals {
            namespace,
            pod,
            uid,
            oom_kills_total: Some(0),
            host_network: Some(false),
            netns_conntrack_entries: Some(40),
            host_conntrack_entries: Some(950),
            netns_sockets: Some(NetnsSockets {
                tcp_inuse: 183,
                tcp_time_wait: 3,
                udp_inuse: 1,
                tcp6_inuse: 0,
                udp6_inuse: 0,
            }),
            addresses: vec![format!("10.42.{}.{}", p / 250, p % 250 + 2)
                .parse()
                .unwrap()],
            ephemeral_ports: Some(EphemeralPorts {
                available: 28232,
                used: (p % 10 == 0).then_some(15_000),
                used_top_destination: (p % 10 == 0).then_some(14_000),
            }),
        });
    }
    snap
}

fn exposition(c: &mut Criterion) {
    let snap = full_snapshot(125);
    assert_eq!(snap.workloads.len(), 250);
    let reg = registry(Arc::new(RwLock::new(Arc::new(snap.into()))));
    let text = render(&reg).unwrap();
    eprintln!(
        "/metrics for 250 containers: {} bytes, {} series",
        text.len(),
        text.lines().filter(|l| !l.starts_with('#')).count()
    );
    c.bench_function("render_metrics_250_containers_full", |b| {
        b.iter(|| render(&reg).unwrap())
    });
}

criterion_group!(benches, bench, exposition);
criterion_main!(benches);
