//! Log counting throughput (MB/s) on large generated CRI log files, compared in the same run with
//! `wc -l` on the same file (page cache warm for both). Two shapes: short lines (typical app
//! logs, ~100 B) and long lines (JSON logs, ~1.5 KB, some split by the runtime into `P` pieces).
//!
//! Measured: `CriCounter::feed` on bytes in memory (the parser alone), `LogTailer::sample` on a
//! pod log tree holding the file (what the agent does: open, pread 128 KiB chunks, count) and
//! `wc -l FILE` (a process: exec costs ~1 ms, under 1 % at these sizes). After criterion's
//! report, a summary of interleaved medians gives the tailer/`wc -l` ratio in one line.
//! Without `--bench` (`cargo test --all-targets`) it is a smoke run on 2 MiB files.

use criterion::{Criterion, Throughput};
use nodeguard::sample::logs::cri::CriCounter;
use nodeguard::sample::logs::LogTailer;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// File size of each shape; large enough that `wc -l`'s exec is noise, small enough for RAM.
const FILE_BYTES: usize = 192 << 20;
const SMOKE_BYTES: usize = 2 << 20;

/// Deterministic xorshift so every run counts the same bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Shape {
    name: &'static str,
    /// Content length range of a logical line.
    min: usize,
    max: usize,
}

const SHAPES: [Shape; 2] = [
    Shape {
        name: "short_lines",
        min: 20,
        max: 160,
    },
    Shape {
        name: "long_lines",
        min: 200,
        max: 2800,
    },
];

/// CRI splits a logical line longer than this into `P` pieces (kubelet's 16 KiB, scaled down so
/// the long shape has pieces too).
const PIECE: usize = 2048;

struct Generated {
    path: PathBuf,
    bytes: u64,
    /// Newlines in the file (what `wc -l` prints).
    newlines: u64,
    /// Logical (`F`) lines.
    full: u64,
}

fn generate(dir: &Path, shape: &Shape, size: usize) -> Generated {
    let pod = dir.join(format!(
        "pods/bench_{}_0000-uid/app",
        shape.name.replace('_', "-")
    ));
    fs::create_dir_all(&pod).unwrap();
    let path = pod.join("0.log");
    let mut out = std::io::BufWriter::with_capacity(1 << 20, fs::File::create(&path).unwrap());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789 {}\":,=.-_/ABCDEFGHIJKLMNOP";
    let mut content = Vec::with_capacity(shape.max);
    let (mut bytes, mut newlines, mut full) = (0u64, 0u64, 0u64);
    let mut t = 0u64;
    while (bytes as usize) < size {
        let len = shape.min + rng.below((shape.max - shape.min) as u64) as usize;
        content.clear();
        content.extend((0..len).map(|_| alphabet[rng.below(alphabet.len() as u64) as usize]));
        let stream = if rng.below(4) == 0 {
            "stderr"
        } else {
            "stdout"
        };
        let pieces: Vec<&[u8]> = content.chunks(PIECE).collect();
        for (i, piece) in pieces.iter().enumerate() {
            t += 1 + rng.below(1000);
            let tag = if i + 1 == pieces.len() { 'F' } else { 'P' };
            let header = format!(
                "2026-07-20T04:{:02}:{:02}.{:09}Z {stream} {tag} ",
                (t / 60_000_000) % 60,
                (t / 1_000_000) % 60,
                t % 1_000_000_000
            );
            out.write_all(header.as_bytes()).unwrap();
            out.write_all(piece).unwrap();
            out.write_all(b"\n").unwrap();
            bytes += (header.len() + piece.len() + 1) as u64;
            newlines += 1;
        }
        full += 1;
    }
    out.flush().unwrap();
    Generated {
        path,
        bytes,
        newlines,
        full,
    }
}

fn feed_all(data: &[u8]) -> u64 {
    let mut c = CriCounter::new();
    // The tailer's chunk size, so carries across chunk ends are exercised as in the agent.
    let mut total = 0;
    for chunk in data.chunks(128 * 1024) {
        total += c.feed(chunk).total();
    }
    total
}

fn tail_all(root: &Path) -> u64 {
    let mut t = LogTailer::new(root.to_path_buf(), u64::MAX);
    let (samples, errors) = t.sample();
    assert!(errors.is_empty(), "{errors:?}");
    samples.iter().map(|s| s.backlog_lines.total()).sum()
}

fn wc_l(path: &Path) -> u64 {
    let out = Command::new("wc").arg("-l").arg(path).output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn mb_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

fn bench(c: &mut Criterion, smoke: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut summary = Vec::new();
    let rounds = if smoke { 1 } else { 11 };
    for shape in &SHAPES {
        let g = generate(
            dir.path(),
            shape,
            if smoke { SMOKE_BYTES } else { FILE_BYTES },
        );
        let root = g.path.ancestors().nth(3).unwrap().to_path_buf();
        let data = fs::read(&g.path).unwrap();
        // Same answers before timing anything.
        assert_eq!(feed_all(&data), g.full);
        assert_eq!(tail_all(&root), g.full);
        assert_eq!(wc_l(&g.path), g.newlines);

        let mut group = c.benchmark_group(format!("log_counting/{}", shape.name));
        group.throughput(Throughput::Bytes(g.bytes));
        group.sample_size(10);
        group.measurement_time(Duration::from_secs(8));
        group.bench_function("cri_counter_feed", |b| b.iter(|| feed_all(&data)));
        group.bench_function("tailer_sample", |b| b.iter(|| tail_all(&root)));
        group.bench_function("wc_l", |b| b.iter(|| wc_l(&g.path)));
        group.finish();

        // Interleaved so that load from other processes hits all three alike.
        let (mut feed, mut tail, mut wc) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            let t = Instant::now();
            feed_all(&data);
            feed.push(t.elapsed());
            let t = Instant::now();
            tail_all(&root);
            tail.push(t.elapsed());
            let t = Instant::now();
            wc_l(&g.path);
            wc.push(t.elapsed());
        }
        let (feed, tail, wc) = (median(feed), median(tail), median(wc));
        summary.push(format!(
            "{:<12} {:>7.0} MB, {:>9} lines ({:>5.0} B/line): feed {:>6.0} MB/s, tailer {:>6.0} MB/s, wc -l {:>6.0} MB/s, tailer/wc -l speed {:.2}",
            shape.name,
            g.bytes as f64 / 1e6,
            g.newlines,
            g.bytes as f64 / g.newlines as f64,
            mb_per_s(g.bytes, feed),
            mb_per_s(g.bytes, tail),
            mb_per_s(g.bytes, wc),
            wc.as_secs_f64() / tail.as_secs_f64(),
        ));
        fs::remove_file(&g.path).unwrap();
    }
    println!("\nlog counting, medians of {rounds} interleaved runs:");
    for s in summary {
        println!("  {s}");
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` does not.
    let smoke = !std::env::args().any(|a| a == "--bench");
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c, smoke);
    c.final_summary();
}
