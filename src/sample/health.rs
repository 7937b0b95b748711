//! Per-sampler bookkeeping: freshness, duration, errors by kind, and log lines only on transitions.

use crate::error::{ErrorKind, ReadError};
use crate::model::SamplerStatus;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// CPU time of the calling thread (`CLOCK_THREAD_CPUTIME_ID`): what a sampler costs, whatever
/// else the process's other threads (HTTP, helpers) do meanwhile.
pub fn thread_cpu() -> Duration {
    let mut ts = nix::libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; this clock exists on every Linux since 2.6.12.
    let rc = unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

/// The samplers by the names `sampler` labels and the snapshot give them, in that order (the
/// catalog's `SAMPLERS` is [`SamplerName::NAMES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SamplerName {
    Discovery,
    Memory,
    Processes,
    Logs,
    Sockets,
    Conntrack,
    Ports,
    Kmsg,
}

impl SamplerName {
    pub const ALL: [SamplerName; 8] = [
        Self::Discovery,
        Self::Memory,
        Self::Processes,
        Self::Logs,
        Self::Sockets,
        Self::Conntrack,
        Self::Ports,
        Self::Kmsg,
    ];

    /// `ALL` as strings.
    pub const NAMES: [&'static str; 8] = {
        let mut out = [""; 8];
        let mut i = 0;
        while i < out.len() {
            out[i] = Self::ALL[i].as_str();
            i += 1;
        }
        out
    };

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Discovery => "discovery",
            Self::Memory => "memory",
            Self::Processes => "processes",
            Self::Logs => "logs",
            Self::Sockets => "sockets",
            Self::Conntrack => "conntrack",
            Self::Ports => "ports",
            Self::Kmsg => "kmsg",
        }
    }
}

#[derive(Debug)]
pub struct SamplerHealth {
    pub name: SamplerName,
    pub enabled: bool,
    last_ok: Option<Instant>,
    last_duration: Duration,
    errors: BTreeMap<ErrorKind, u64>,
    /// Paths that failed last tick: a path is logged when it starts and when it stops failing.
    failing: HashSet<PathBuf>,
    cpu: Duration,
}

impl SamplerHealth {
    pub fn new(name: SamplerName, enabled: bool) -> Self {
        SamplerHealth {
            name,
            enabled,
            last_ok: None,
            last_duration: Duration::ZERO,
            errors: BTreeMap::new(),
            failing: HashSet::new(),
            cpu: Duration::ZERO,
        }
    }

    /// Ends a sampling pass. `complete` is false when the pass produced nothing usable.
    pub fn finish(&mut self, started: Instant, now: Instant, errors: &[ReadError], complete: bool) {
        self.last_duration = now.saturating_duration_since(started);
        if complete {
            self.last_ok = Some(now);
        }
        let mut failing = HashSet::with_capacity(errors.len());
        for e in errors {
            *self.errors.entry(e.kind()).or_default() += 1;
            let path = e.path().to_path_buf();
            if !self.failing.contains(&path) {
                tracing::warn!(sampler = self.name.as_str(), kind = e.kind().as_str(), error = %e, "read failed; keeping last good value");
            }
            failing.insert(path);
        }
        for p in self.failing.difference(&failing) {
            tracing::info!(sampler = self.name.as_str(), path = %p.display(), "read recovered");
        }
        self.failing = failing;
    }

    /// Adds CPU time spent for this sampler (on the tick's thread or a helper's).
    pub fn charge(&mut self, cpu: Duration) {
        self.cpu += cpu;
    }

    pub fn status(&self, now: Instant, interval: Duration) -> SamplerStatus {
        let age = self.last_ok.map(|t| now.saturating_duration_since(t));
        SamplerStatus {
            name: self.name.as_str(),
            enabled: self.enabled,
            age_seconds: age.map(|a| a.as_secs_f64()),
            fresh: age.is_some_and(|a| a <= interval * 3),
            last_duration_seconds: self.last_duration.as_secs_f64(),
            cpu_seconds_total: self.cpu.as_secs_f64(),
            errors_total: self
                .errors
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), *v))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_charged_per_thread_and_summed() {
        // Work on this thread moves its clock; a sleeping helper's work is not ours.
        let t0 = thread_cpu();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let spent = thread_cpu().saturating_sub(t0);
        assert!(spent > Duration::ZERO, "{x}");
        let mut h = SamplerHealth::new(SamplerName::Sockets, true);
        h.charge(Duration::from_millis(1500));
        h.charge(Duration::from_millis(250));
        let st = h.status(Instant::now(), Duration::from_secs(5));
        assert_eq!(st.cpu_seconds_total, 1.75);
    }
    use std::path::Path;

    #[test]
    fn counts_errors_and_tracks_freshness() {
        let t0 = Instant::now();
        let mut h = SamplerHealth::new(SamplerName::Memory, true);
        let iv = Duration::from_secs(5);
        assert!(!h.status(t0, iv).fresh);
        let err = ReadError::parse(Path::new("/x"), crate::error::ParseError::new("bad"));
        h.finish(t0, t0, &[err], true);
        let s = h.status(t0 + Duration::from_secs(15), iv);
        assert!(s.fresh);
        assert_eq!(s.errors_total, vec![("parse".to_string(), 1)]);
        assert!(!h.status(t0 + Duration::from_secs(16), iv).fresh);
    }

    #[test]
    fn names_are_distinct_and_in_label_order() {
        let mut sorted = SamplerName::ALL;
        sorted.sort();
        assert_eq!(sorted, SamplerName::ALL);
        let set: std::collections::HashSet<_> = SamplerName::NAMES.iter().collect();
        assert_eq!(set.len(), SamplerName::NAMES.len());
        assert_eq!(SamplerName::NAMES[4], SamplerName::Sockets.as_str());
    }
}
