//! Pure parser costs on fixed inputs: cgroup memory files (v1 and v2), `/proc/<pid>/stat`,
//! `/proc/net/tcp` with 20,000 sockets, sockstat, the conntrack stat file, CRI log lines, a
//! kernel-log `oom-kill:` record and an ordinary record.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use nodeguard::cgroupfs::parse_procs;
use nodeguard::discover::kubelet;
use nodeguard::sample::kmsg::{parse_header, parse_message};
use nodeguard::sample::logs::cri::{parse_line, CriCounter};
use nodeguard::sample::memory::{parse_keyed, parse_limit, parse_u64};
use nodeguard::sample::net::conntrack::parse_stat_entries;
use nodeguard::sample::net::inet::for_each_socket;
use nodeguard::sample::net::sockstat::{parse_sockstat, parse_sockstat6};
use nodeguard::sample::procs::parse_stat;

const V1_STAT: &str = "cache 52428800\nrss 104857600\nrss_huge 0\nshmem 0\nmapped_file 1000\ndirty 0\nwriteback 0\npgpgin 100\npgpgout 50\npgfault 1000\npgmajfault 0\ninactive_anon 0\nactive_anon 104857600\ninactive_file 32428800\nactive_file 20000000\nunevictable 0\nhierarchical_memory_limit 536870912\ntotal_cache 52428800\ntotal_rss 104857600\ntotal_rss_huge 0\ntotal_shmem 0\ntotal_mapped_file 1000\ntotal_dirty 0\ntotal_writeback 0\ntotal_pgpgin 100\ntotal_pgpgout 50\ntotal_pgfault 1000\ntotal_pgmajfault 0\ntotal_inactive_anon 0\ntotal_active_anon 104857600\ntotal_inactive_file 32428800\ntotal_active_file 20000000\ntotal_unevictable 0\n";
/// A v2 `memory.stat` as Linux 6.x prints it (inactive_file is the 11th of ~40 keys).
const V2_STAT: &str = "anon 104857600\nfile 52428800\nkernel 1048576\nkernel_stack 65536\npagetables 131072\nsec_pagetables 0\npercpu 1280\nsock 0\nvmalloc 0\nshmem 0\nzswap 0\nzswapped 0\nfile_mapped 1000\nfile_dirty 0\nfile_writeback 0\nswapcached 0\nanon_thp 0\nfile_thp 0\nshmem_thp 0\ninactive_anon 4857600\nactive_anon 100000000\ninactive_file 32428800\nactive_file 20000000\nunevictable 0\nslab_reclaimable 100000\nslab_unreclaimable 50000\nslab 150000\nworkingset_refault_anon 0\nworkingset_refault_file 0\nworkingset_activate_anon 0\nworkingset_activate_file 0\nworkingset_restore_anon 0\nworkingset_restore_file 0\nworkingset_nodereclaim 0\npgscan 0\npgsteal 0\npgscan_kswapd 0\npgscan_direct 0\npgsteal_kswapd 0\npgsteal_direct 0\npgfault 1000\npgmajfault 0\n";
const V2_EVENTS: &str = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
const STAT: &[u8] = b"4242 (my (weird) proc) S 4200 4242 4242 0 -1 4194308 0 0 0 0 12 7 0 0 20 0 1 0 12345 1000000 250 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
const SOCKSTAT: &str = "sockets: used 20412\nTCP: inuse 20130 orphan 0 tw 12 alloc 20135 mem 233\nUDP: inuse 1 mem 0\nUDPLITE: inuse 0\nRAW: inuse 0\nFRAG: inuse 0 memory 0\n";
const SOCKSTAT6: &str =
    "TCP6: inuse 1\nUDP6: inuse 1\nUDPLITE6: inuse 0\nRAW6: inuse 0\nFRAG6: inuse 0 memory 0\n";
const CT_STAT: &str = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n0001fbd0  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000  00000000 00000000 00000000 00000000\n0001fbd0  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000  00000000 00000000 00000000 00000000\n";

/// `/proc/net/tcp` of a busy pod netns: a header and `n` sockets (listeners, established, some
/// TIME_WAIT without inode), formatted exactly as the kernel pads them.
fn tcp_table(n: usize) -> String {
    let mut t = String::from("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode                                                     \n");
    for i in 0..n {
        let (st, inode) = match i % 50 {
            0 => ("0A", 100_000 + i),
            1 => ("06", 0),
            _ => ("01", 100_000 + i),
        };
        t.push_str(&format!(
            "{i:>4}: 0100007F:{:04X} 0100007F:{:04X} {st} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 0000000024996da1 20 4 30 10 -1                     \n",
            8080 + i % 8,
            30000 + i % 30000
        ));
    }
    t
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("cgroup_memory");
    g.bench_function("v1_stat_total_inactive_file", |b| {
        b.iter(|| parse_keyed(black_box(V1_STAT), "total_inactive_file"))
    });
    g.bench_function("v2_stat_inactive_file", |b| {
        b.iter(|| parse_keyed(black_box(V2_STAT), "inactive_file"))
    });
    g.bench_function("v2_events_oom_kill", |b| {
        b.iter(|| parse_keyed(black_box(V2_EVENTS), "oom_kill"))
    });
    g.bench_function("limit", |b| {
        b.iter(|| parse_limit(black_box("9223372036854771712\n")))
    });
    g.bench_function("current", |b| {
        b.iter(|| parse_u64(black_box("157286400\n")))
    });
    g.bench_function("procs_9_pids", |b| {
        b.iter(|| {
            parse_procs(black_box(
                "1001\n1002\n1003\n1004\n1005\n1006\n1007\n1008\n1009\n",
            ))
        })
    });
    g.finish();

    c.bench_function("proc_pid_stat", |b| b.iter(|| parse_stat(black_box(STAT))));

    let tcp = tcp_table(20_000);
    let mut g = c.benchmark_group("proc_net_tcp");
    g.throughput(Throughput::Elements(20_000));
    g.bench_function("20000_sockets", |b| {
        b.iter(|| {
            let mut n = 0u64;
            for_each_socket(black_box(tcp.as_bytes()), |inode, st| {
                n = n.wrapping_add(inode ^ u64::from(st))
            })
            .unwrap();
            n
        })
    });
    g.finish();

    let mut g = c.benchmark_group("netns");
    g.bench_function("sockstat", |b| {
        b.iter(|| parse_sockstat(black_box(SOCKSTAT)))
    });
    g.bench_function("sockstat6", |b| {
        b.iter(|| parse_sockstat6(black_box(SOCKSTAT6)))
    });
    g.bench_function("nf_conntrack_stat", |b| {
        b.iter(|| parse_stat_entries(black_box(CT_STAT)))
    });
    g.finish();

    let mut g = c.benchmark_group("cri_log");
    let line =
        b"2026-07-20T04:46:01.123456789Z stderr F connect ETIMEDOUT 203.0.113.7:443 attempt 17";
    g.bench_function("parse_line", |b| b.iter(|| parse_line(black_box(line))));
    let mut chunk = Vec::new();
    for i in 0..1000 {
        chunk.extend_from_slice(
            format!("2026-07-20T04:46:01.{i:09}Z stderr F connect ETIMEDOUT 203.0.113.7:443 attempt {i}\n")
                .as_bytes(),
        );
    }
    g.throughput(Throughput::Elements(1000));
    g.bench_function("feed_1000_lines", |b| {
        b.iter(|| CriCounter::new().feed(black_box(&chunk)))
    });
    g.finish();

    let path = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12ab34cd_5678_90ef_aaaa_bbbbccccdddd.slice/cri-containerd-4f5c1b2a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b.scope";
    c.bench_function("kubelet_cgroup_name", |b| {
        b.iter(|| {
            let comps: Vec<&str> = black_box(path).split('/').collect();
            kubelet::parse(&comps)
        })
    });

    // The record this hybrid host's kernel wrote for a test's OOM kill (v1 memory controller).
    let oom = b"6,31270,12462280588,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/ngtest-14564-2/kubepods/pod000038e4-0003-4000-8000-000000000001/00000000000038e4000000000000000400000000000000000000000000000003,task_memcg=/ngtest-14564-2/kubepods/pod000038e4-0003-4000-8000-000000000001/00000000000038e4000000000000000400000000000000000000000000000003,task=nodeguard-testl,pid=14582,uid=0\n";
    let other = b"6,31271,12462280600,-;Memory cgroup out of memory: Killed process 14582 (nodeguard-testl) total-vm:265304kB, anon-rss:32000kB\n";
    let mut g = c.benchmark_group("kmsg");
    for (name, rec) in [("oom_kill_record", &oom[..]), ("other_record", &other[..])] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let h = parse_header(black_box(rec)).expect("header");
                parse_message(h.facility, h.message)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
