//! Costs of the exhaustion signals on synthetic input: the port count over a netns of 28,000 TCP
//! sockets (the 20 July pod), the sock_diag message parser, the sysctl and pids parsers, and the
//! time-to-full estimator on a flat, a linear and a doubling window of 60 samples.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use nodeguard::sample::net::ports::{count_ports, parse_reserved_ports, PortRange};
use nodeguard::sample::net::sockdiag::{parse_batch, DiagSocket};
use nodeguard::sample::pids::{parse_loadavg_tasks, parse_pids_max};
use nodeguard::signal::full::{project, FullEstimator};
use std::time::{Duration, Instant};

fn storm_sockets(n: usize) -> Vec<DiagSocket> {
    (0..n)
        .map(|i| {
            let mut dst = [0u8; 16];
            dst[10] = 0xff;
            dst[11] = 0xff;
            // Most towards the one upstream, the rest spread over 50 backends.
            dst[15] = if i % 10 == 0 { (i % 50) as u8 } else { 7 };
            DiagSocket {
                state: if i % 3 == 0 { 6 } else { 1 },
                local_port: 32768 + (i % 28232) as u16,
                remote: (dst, 443),
            }
        })
        .collect()
}

/// A datagram of `n` inet_diag messages, as the kernel sends them.
fn datagram(n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        out.extend(88u32.to_ne_bytes());
        out.extend(20u16.to_ne_bytes());
        out.extend(2u16.to_ne_bytes());
        out.extend([0u8; 8]);
        let mut b = [0u8; 72];
        b[0] = 2;
        b[1] = 1;
        b[4..6].copy_from_slice(&(32768 + i as u16).to_be_bytes());
        b[6..8].copy_from_slice(&443u16.to_be_bytes());
        b[24..28].copy_from_slice(&[203, 0, 113, 7]);
        out.extend(b);
    }
    out
}

fn ports(c: &mut Criterion) {
    let range = PortRange {
        low: 32768,
        high: 60999,
        reserved: vec![],
    };
    let sockets = storm_sockets(28_000);
    let mut scratch = Vec::new();
    c.bench_function("count_ports 28,000 sockets", |b| {
        b.iter(|| count_ports(&range, black_box(&sockets), &mut scratch))
    });
    let dg = datagram(744); // what fits in the 64 KiB receive buffer
    c.bench_function("sock_diag datagram, 744 sockets", |b| {
        b.iter(|| {
            let mut n = 0u32;
            let _ = parse_batch(black_box(&dg), |_| n += 1);
            n
        })
    });
    c.bench_function("ip_local_reserved_ports, 3 ranges", |b| {
        b.iter(|| parse_reserved_ports(black_box("8080,9000-9010,40090-40099\n")))
    });
    c.bench_function("pids.max + loadavg", |b| {
        b.iter(|| {
            (
                parse_pids_max(black_box("max\n")),
                parse_loadavg_tasks(black_box("6.54 4.36 3.34 9/156 4549\n")),
            )
        })
    });
}

fn estimator(c: &mut Criterion) {
    let window = |f: &dyn Fn(f64) -> f64| -> Vec<(f64, f64)> {
        (0..60)
            .map(|i| {
                let t = -5.0 * f64::from(59 - i);
                (t, f(t + 300.0))
            })
            .collect()
    };
    let flat = window(&|s| 5000.0 + (s * 7.0).sin());
    let linear = window(&|s| 5000.0 + 10.0 * s);
    let doubling = window(&|s| 4000.0 + (s / 5.0).exp2() / 1e12);
    c.bench_function("project: flat (noise) 60 samples", |b| {
        b.iter(|| project(black_box(&flat), 131_072.0))
    });
    c.bench_function("project: linear 60 samples", |b| {
        b.iter(|| project(black_box(&linear), 131_072.0))
    });
    c.bench_function("project: doubling 60 samples", |b| {
        b.iter(|| project(black_box(&doubling), 1e15))
    });
    // One tick of a series: push, trim, project (flat: the common case).
    let t0 = Instant::now();
    let mut est = FullEstimator::default();
    let mut i = 0u32;
    c.bench_function("FullEstimator::observe, flat series", |b| {
        b.iter(|| {
            i += 1;
            est.observe(
                t0 + Duration::from_secs(5) * i,
                5000.0 + f64::from(i % 3),
                131_072.0,
            )
        })
    });
}

criterion_group!(benches, ports, estimator);
criterion_main!(benches);
