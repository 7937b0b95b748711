//! Pure parser costs on fixed inputs.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use nodeguard::discover::kubelet;
use nodeguard::sample::memory::{parse_keyed, parse_limit};
use nodeguard::sample::procs::parse_stat;

const V1_STAT: &str = "cache 52428800\nrss 104857600\nrss_huge 0\nshmem 0\nmapped_file 1000\ndirty 0\nwriteback 0\npgpgin 100\npgpgout 50\npgfault 1000\npgmajfault 0\ninactive_anon 0\nactive_anon 104857600\ninactive_file 32428800\nactive_file 20000000\nunevictable 0\nhierarchical_memory_limit 536870912\ntotal_cache 52428800\ntotal_rss 104857600\ntotal_rss_huge 0\ntotal_shmem 0\ntotal_mapped_file 1000\ntotal_dirty 0\ntotal_writeback 0\ntotal_pgpgin 100\ntotal_pgpgout 50\ntotal_pgfault 1000\ntotal_pgmajfault 0\ntotal_inactive_anon 0\ntotal_active_anon 104857600\ntotal_inactive_file 32428800\ntotal_active_file 20000000\ntotal_unevictable 0\n";
const STAT: &[u8] = b"4242 (my (weird) proc) S 4200 4242 4242 0 -1 4194308 0 0 0 0 12 7 0 0 20 0 1 0 12345 1000000 250 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

fn bench(c: &mut Criterion) {
    c.bench_function("memory_stat_v1_total_inactive_file", |b| {
        b.iter(|| parse_keyed(black_box(V1_STAT), "total_inactive_file"))
    });
    c.bench_function("memory_limit", |b| {
        b.iter(|| parse_limit(black_box("9223372036854771712\n")))
    });
    c.bench_function("proc_pid_stat", |b| b.iter(|| parse_stat(black_box(STAT))));
    let path = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12ab34cd_5678_90ef_aaaa_bbbbccccdddd.slice/cri-containerd-4f5c1b2a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b.scope";
    c.bench_function("kubelet_cgroup_name", |b| {
        b.iter(|| {
            let comps: Vec<&str> = black_box(path).split('/').collect();
            kubelet::parse(&comps)
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
