//! Memory working set, limit and OOM kills of one cgroup, on v1 and v2.
//!
//! Working set = usage - inactive file, floored at zero, as cAdvisor and the kubelet define it.

use crate::discover::join_rel;
use crate::error::{ParseError, ReadError};
use crate::fsio::parse_optional;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// v1 reports "no limit" as a huge page-aligned number; anything at or above this is unlimited.
const V1_UNLIMITED_FLOOR: u64 = 1 << 62;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemorySample {
    pub usage_bytes: u64,
    pub working_set_bytes: u64,
    /// `None` when unlimited.
    pub limit_bytes: Option<u64>,
    /// Cumulative OOM events in this cgroup ([`oom_events`]; on v2 hierarchical: a pod cgroup
    /// counts its containers').
    pub oom_kills: u64,
}

/// Pure: a single-number file (`memory.current`, `memory.usage_in_bytes`).
pub fn parse_u64(text: &str) -> Result<u64, ParseError> {
    let t = text.trim();
    t.parse()
        .map_err(|_| ParseError::new(format!("expected an integer, got {t:?}")))
}

/// Pure: a limit file; `max` (v2) or a v1 value near 2^63 means unlimited.
pub fn parse_limit(text: &str) -> Result<Option<u64>, ParseError> {
    let t = text.trim();
    if t == "max" {
        return Ok(None);
    }
    let v = parse_u64(t)?;
    Ok((v < V1_UNLIMITED_FLOOR).then_some(v))
}

/// Pure: a flat keyed file (`memory.stat`, `memory.events`, `memory.oom_control`): the value of
/// `key`, or `None` if the key is absent. Malformed other lines are ignored; a malformed value of
/// `key` is an error.
pub fn parse_keyed(text: &str, key: &str) -> Result<Option<u64>, ParseError> {
    for line in text.lines() {
        let mut it = line.split_ascii_whitespace();
        if it.next() == Some(key) {
            let v = it
                .next()
                .ok_or_else(|| ParseError::new(format!("{key} has no value")))?;
            return v
                .parse()
                .map(Some)
                .map_err(|_| ParseError::new(format!("{key}: expected an integer, got {v:?}")));
        }
    }
    Ok(None)
}

/// Pure: OOM events from `memory.events` / `memory.oom_control`. One event is one OOM-killer
/// invocation, as one kernel `oom-kill:` record: with `memory.oom.group=1` (kubelet sets it on
/// v2) killing N processes adds N+1 to `oom_kill` but 1 to `oom_group_kill`, so a cgroup that
/// has group kills counts those. v1 has no group kill: `oom_kill`. Missing keys read as zero
/// (old v1 kernels lack `oom_kill`).
pub fn oom_events(text: &str) -> Result<u64, ParseError> {
    let group = parse_keyed(text, "oom_group_kill")?.unwrap_or(0);
    if group > 0 {
        return Ok(group);
    }
    Ok(parse_keyed(text, "oom_kill")?.unwrap_or(0))
}

/// Pure: combines the raw files into a sample.
pub fn working_set(usage: u64, inactive_file: u64) -> u64 {
    usage.saturating_sub(inactive_file)
}

#[derive(Debug, Clone)]
pub struct MemoryReader {
    root: PathBuf,
    v2: bool,
}

impl MemoryReader {
    /// `root` is the memory hierarchy (v1 `memory` controller mount or the v2 tree).
    pub fn new(root: PathBuf, v2: bool) -> Self {
        MemoryReader { root, v2 }
    }

    /// `Ok(None)` when the cgroup (or its memory files) does not exist: churn, or no memory
    /// accounting for this cgroup.
    pub fn read(&self, rel: &str) -> Result<Option<MemorySample>, ReadError> {
        let dir = join_rel(&self.root, rel);
        if self.v2 {
            read_set(
                &dir,
                [
                    "memory.current",
                    "memory.max",
                    "memory.stat",
                    "memory.events",
                ],
                "inactive_file",
            )
        } else {
            read_set(
                &dir,
                [
                    "memory.usage_in_bytes",
                    "memory.limit_in_bytes",
                    "memory.stat",
                    "memory.oom_control",
                ],
                "total_inactive_file",
            )
        }
    }
}

fn read_set(
    dir: &Path,
    [usage_f, limit_f, stat_f, oom_f]: [&str; 4],
    inactive_key: &str,
) -> Result<Option<MemorySample>, ReadError> {
    let Some(usage) = parse_optional(&dir.join(usage_f), parse_u64)? else {
        return Ok(None);
    };
    let Some(limit) = parse_optional(&dir.join(limit_f), parse_limit)? else {
        return Ok(None);
    };
    let stat_path = dir.join(stat_f);
    let inactive = parse_optional(&stat_path, |t| parse_keyed(t, inactive_key))?
        .flatten()
        .unwrap_or(0);
    let oom_kills = parse_optional(&dir.join(oom_f), oom_events)?.unwrap_or(0);
    Ok(Some(MemorySample {
        usage_bytes: usage,
        working_set_bytes: working_set(usage, inactive),
        limit_bytes: limit,
        oom_kills,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const V2_STAT: &str = "anon 104857600\nfile 52428800\nkernel 1048576\nactive_anon 100000000\ninactive_anon 4857600\nactive_file 20000000\ninactive_file 32428800\nunevictable 0\n";
    const V1_STAT: &str = "cache 52428800\nrss 104857600\ninactive_file 1000\ntotal_cache 52428800\ntotal_rss 104857600\ntotal_inactive_file 32428800\ntotal_active_file 20000000\n";
    const V2_EVENTS: &str = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";
    const V1_OOM: &str = "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n";

    #[test]
    fn keyed_files() {
        assert_eq!(parse_keyed(V2_STAT, "inactive_file"), Ok(Some(32428800)));
        // total_inactive_file must not be confused with inactive_file.
        assert_eq!(
            parse_keyed(V1_STAT, "total_inactive_file"),
            Ok(Some(32428800))
        );
        assert_eq!(parse_keyed(V1_STAT, "inactive_file"), Ok(Some(1000)));
        assert_eq!(parse_keyed(V2_EVENTS, "oom_kill"), Ok(Some(2)));
        assert_eq!(parse_keyed(V1_OOM, "oom_kill"), Ok(Some(4)));
        assert_eq!(
            parse_keyed("oom_kill_disable 0\nunder_oom 0\n", "oom_kill"),
            Ok(None)
        );
        assert!(parse_keyed("oom_kill x\n", "oom_kill").is_err());
        assert!(parse_keyed("oom_kill\n", "oom_kill").is_err());
    }

    #[test]
    fn one_group_kill_is_one_event() {
        // memory.oom.group=1, 3 processes killed: oom_kill 4, oom_group_kill 1.
        let grouped = "low 0\nhigh 0\nmax 40\noom 1\noom_kill 4\noom_group_kill 1\n";
        assert_eq!(oom_events(grouped), Ok(1));
        assert_eq!(oom_events(V2_EVENTS), Ok(2));
        assert_eq!(oom_events(V1_OOM), Ok(4));
        assert_eq!(oom_events("oom_kill_disable 0\nunder_oom 0\n"), Ok(0));
        assert!(oom_events("oom_group_kill x\n").is_err());
    }

    #[test]
    fn limits() {
        assert_eq!(parse_limit("max\n"), Ok(None));
        assert_eq!(parse_limit("9223372036854771712\n"), Ok(None));
        assert_eq!(parse_limit("536870912\n"), Ok(Some(536870912)));
        assert!(parse_limit("lots").is_err());
    }

    #[test]
    fn working_set_is_floored() {
        assert_eq!(working_set(157286400, 32428800), 124857600);
        assert_eq!(working_set(10, 20), 0);
        assert_eq!(parse_u64(" 42\n"), Ok(42));
        assert!(parse_u64("").is_err());
    }
}
