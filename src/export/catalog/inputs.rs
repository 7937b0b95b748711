//! What the readers hold or skipped (`sample/logs`, `sample/net/fdcache`, `discover`): bounds on
//! untrusted trees made visible, and the workloads discovery found.

use super::{names, Family, Label, Meta, Section, Type};
use crate::model::{Kind, Published};

use Section::Agent as S;
use Type::{Counter, Gauge};

/// Why an entry of the pod log tree was not opened.
pub const LOG_SKIP_REASONS: [&str; 3] = ["symlink", "not_regular", "cap"];
/// What the socket pass did with a process's fd table.
pub const SOCKET_PASSES: [&str; 2] = ["walked", "reused"];
/// The trees whose names discovery reads.
pub const TREES: [&str; 2] = ["cgroup", "logs"];

pub const FAMILIES: &[Family<Published>] = &[
    Meta {
        name: "log_files_open",
        ty: Gauge,
        unit: None,
        help: "Log files the tailer holds open.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| {
            if let Some(n) = s.inputs.log_files_open {
                out.add(&[], n);
            }
        }),
    Meta {
        name: "log_files_skipped",
        ty: Gauge,
        unit: None,
        help: "Entries of the pod log tree the last pass did not open, by reason.",
        labels: &[Label::of("reason", || LOG_SKIP_REASONS.to_vec())],
        section: S,
    }
    .with_rows(|s, out| {
            let i = &s.inputs;
            if i.log_files_open.is_some() {
                let by = [
                    i.log_files_skipped_symlink,
                    i.log_files_skipped_not_regular,
                    i.log_files_skipped_cap,
                ];
                for (r, n) in LOG_SKIP_REASONS.into_iter().zip(by) {
                    out.add(&[r], n);
                }
            }
        }),
    Meta {
        name: "files_not_regular",
        ty: Counter,
        unit: None,
        help: "Opens refused because the path was a FIFO, socket, device or directory where a regular file belongs, by reader.",
        labels: &[Label::of("reader", || {
            crate::fsio::Reader::ALL.map(crate::fsio::Reader::as_str).to_vec()
        })],
        section: S,
    }
    .with_rows(|s, out| {
        for (r, n) in crate::fsio::Reader::ALL
            .into_iter()
            .zip(s.inputs.files_not_regular_total)
        {
            out.add(&[r.as_str()], n);
        }
    }),
    Meta {
        name: "memory_files_open",
        ty: Gauge,
        unit: None,
        help: "Cgroup memory files the memory sampler holds open.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| {
            if let Some(n) = s.inputs.memory_files_open {
                out.add(&[], n);
            }
        }),
    Meta {
        name: "memory_files_unheld",
        ty: Gauge,
        unit: None,
        help: "Memory files the last pass opened and closed again because the open-file cap was reached.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| {
            if s.inputs.memory_files_open.is_some() {
                out.add(&[], s.inputs.memory_files_unheld);
            }
        }),
    Meta {
        name: "pids_files_open",
        ty: Gauge,
        unit: None,
        help: "Cgroup directories and pids files the process sampler holds open.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| {
        if let Some(n) = s.inputs.pids_files_open {
            out.add(&[], n);
        }
    }),
    Meta {
        name: "pids_files_unheld",
        ty: Gauge,
        unit: None,
        help: "Cgroups the last pass read by opening and closing their files because the open-file cap was reached.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| {
        if s.inputs.pids_files_open.is_some() {
            out.add(&[], s.inputs.pids_files_unheld);
        }
    }),
    Meta {
        name: "socket_cache_entries",
        ty: Gauge,
        unit: None,
        help: "Socket inodes the socket sampler's per-process cache holds.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| {
            if let Some(n) = s.inputs.socket_cache_entries {
                out.add(&[], n);
            }
        }),
    Meta {
        name: "socket_cache_overflows",
        ty: Counter,
        unit: None,
        help: "Processes or sockets left uncached (walked again next tick) because the cache was full.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| {
            if s.inputs.socket_cache_entries.is_some() {
                out.add(&[], s.inputs.socket_cache_overflows_total);
            }
        }),
    Meta {
        name: "socket_pids",
        ty: Gauge,
        unit: None,
        help: "Processes whose fd table the socket sampler's last pass walked, or reused unchanged.",
        labels: &[Label::of("pass", || SOCKET_PASSES.to_vec())],
        section: S,
    }
    .with_rows(|s, out| {
            let i = &s.inputs;
            if i.socket_cache_entries.is_some() {
                let by = [i.socket_pids_walked, i.socket_pids_reused];
                for (p, n) in SOCKET_PASSES.into_iter().zip(by) {
                    out.add(&[p], n);
                }
            }
        }),
    Meta {
        name: "discovery_non_utf8_names",
        ty: Gauge,
        unit: None,
        help: "Names that are not UTF-8 in the last scan (kept under an escaped name).",
        labels: &[Label::of("tree", || TREES.to_vec())],
        section: S,
    }
    .with_rows(|s, out| {
            let by = [s.inputs.non_utf8_cgroups, s.inputs.non_utf8_log_names];
            for (t, n) in TREES.into_iter().zip(by) {
                out.add(&[t], n);
            }
        }),
    Meta {
        name: "discovery_skipped_cgroups",
        ty: Gauge,
        unit: None,
        help: "Cgroups not walked: too deep or a path too long.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.inputs.skipped_cgroups)),
    Meta {
        name: "discovery_dirs_held",
        ty: Gauge,
        unit: None,
        help: "Cgroup directories discovery holds open between scans.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.inputs.discovery_dirs_held)),
    Meta {
        name: "discovery_dirs_unheld",
        ty: Gauge,
        unit: None,
        help: "Cgroup directories discovery keeps but does not hold open because the cap was reached.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.inputs.discovery_dirs_unheld)),
    Meta {
        name: "discovery_dirs_unwatched",
        ty: Gauge,
        unit: None,
        help: "Cgroup directories without an inotify watch, listed every scan.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.inputs.discovery_dirs_unwatched)),
    Meta {
        name: "discovery_dirs_listed",
        ty: Gauge,
        unit: None,
        help: "Cgroup directories the last scan listed.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.inputs.discovery_dirs_listed)),
    Meta {
        name: "discovery_watch_overflows",
        ty: Counter,
        unit: None,
        help: "Inotify queue overflows of discovery (each re-lists every cgroup directory once).",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.inputs.discovery_watch_overflows_total)),
    Meta {
        name: "workloads",
        ty: Gauge,
        unit: None,
        help: "Workloads discovered, by kind.",
        labels: &[Label::of("kind", || names(&Kind::ALL, |k| k.as_str()))],
        section: Section::Workloads,
    }
    .with_rows(|s, out| {
            for k in Kind::ALL {
                let n = s.workloads.iter().filter(|w| w.kind == k && w.cgroup.is_some());
                out.add(&[k.as_str()], n.count());
            }
        }),
];
