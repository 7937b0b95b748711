//! Conntrack table usage from procfs: the node's count/max and one namespace's entry count.
//!
//! `nf_conntrack_count` under `/proc/sys` is the count of the *reader's* netns, so a namespace is
//! read through `/proc/<pid>/net/stat/nf_conntrack`, whose `entries` column is per netns.

use crate::error::{ParseError, ReadError};
use crate::fsio;
use std::path::{Path, PathBuf};

/// Parses `/proc/<pid>/net/stat/nf_conntrack`: a header, then one hex row per CPU whose first
/// column (`entries`) is the namespace-wide count, repeated on every row.
pub fn parse_stat_entries(text: &str) -> Result<u64, ParseError> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header = lines
        .next()
        .ok_or_else(|| ParseError::new("empty nf_conntrack stat file"))?;
    if header.split_ascii_whitespace().next() != Some("entries") {
        return Err(ParseError::new(format!(
            "header does not start with `entries`: {header:?}"
        )));
    }
    let row = lines
        .next()
        .ok_or_else(|| ParseError::new("nf_conntrack stat file has no CPU row"))?;
    let first = row.split_ascii_whitespace().next().unwrap_or("");
    u64::from_str_radix(first, 16)
        .map_err(|_| ParseError::new(format!("bad entries column {first:?}")))
}

fn parse_decimal(text: &str, what: &str) -> Result<u64, ParseError> {
    let t = text.trim();
    t.parse::<u64>()
        .map_err(|_| ParseError::new(format!("bad {what} {t:?}")))
}

/// Parses `/proc/sys/net/netfilter/nf_conntrack_count`.
pub fn parse_count(text: &str) -> Result<u64, ParseError> {
    parse_decimal(text, "nf_conntrack_count")
}

/// Parses `/proc/sys/net/netfilter/nf_conntrack_max`.
pub fn parse_max(text: &str) -> Result<u64, ParseError> {
    parse_decimal(text, "nf_conntrack_max")
}

/// Node-level conntrack usage, as seen from the agent's own network namespace.
#[derive(Debug, Clone)]
pub struct NodeConntrack {
    count_path: PathBuf,
    max_path: PathBuf,
}

impl NodeConntrack {
    /// `proc_root` is normally `/proc` (a host mount in a container).
    pub fn new(proc_root: PathBuf) -> Self {
        let dir = proc_root.join("sys/net/netfilter");
        NodeConntrack {
            count_path: dir.join("nf_conntrack_count"),
            max_path: dir.join("nf_conntrack_max"),
        }
    }

    /// `(count, max)`; `Ok(None)` when conntrack is not loaded (the files do not exist).
    pub fn read(&self) -> Result<Option<(u64, u64)>, ReadError> {
        let Some(count) = fsio::parse_optional(&self.count_path, parse_count)? else {
            return Ok(None);
        };
        let Some(max) = fsio::parse_optional(&self.max_path, parse_max)? else {
            return Ok(None);
        };
        Ok(Some((count, max)))
    }
}

/// Conntrack entries of the network namespace of `pid`; `Ok(None)` when the pid is gone or
/// conntrack is not loaded.
pub fn netns_entries(proc_root: &Path, pid: u32) -> Result<Option<u64>, ReadError> {
    let path = proc_root
        .join(pid.to_string())
        .join("net/stat/nf_conntrack");
    fsio::parse_optional(&path, parse_stat_entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Linux 6.18, 2 CPUs, a netns holding 0x7d0 (2000) entries.
    const STAT: &str = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart
000007d0  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000  00000000 00000000 00000000 00000000
000007d0  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000  00000000 00000000 00000000 00000000
";

    #[test]
    fn parses_stat_entries() {
        assert_eq!(parse_stat_entries(STAT).unwrap(), 2000);
    }

    #[test]
    fn stat_errors() {
        assert!(parse_stat_entries("").is_err());
        assert!(parse_stat_entries(STAT.lines().next().unwrap()).is_err());
        assert!(parse_stat_entries("entries x\nzz 0\n").is_err());
        assert!(parse_stat_entries("foo\n00000001\n").is_err());
        assert!(parse_stat_entries("entries\n   \n").is_err());
    }

    #[test]
    fn parses_count_and_max() {
        assert_eq!(parse_count("123\n").unwrap(), 123);
        assert_eq!(parse_max("262144\n").unwrap(), 262144);
        assert!(parse_count("").is_err());
        assert!(parse_max("-1\n").is_err());
    }

    #[test]
    fn reader_absent_present_and_bad() {
        let dir = std::env::temp_dir().join(format!("ngct-proc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let reader = NodeConntrack::new(dir.clone());
        assert_eq!(reader.read().unwrap(), None);
        assert_eq!(netns_entries(&dir, 42).unwrap(), None);

        let nf = dir.join("sys/net/netfilter");
        std::fs::create_dir_all(&nf).unwrap();
        std::fs::write(nf.join("nf_conntrack_count"), "7\n").unwrap();
        assert_eq!(reader.read().unwrap(), None, "max missing");
        std::fs::write(nf.join("nf_conntrack_max"), "65536\n").unwrap();
        assert_eq!(reader.read().unwrap(), Some((7, 65536)));
        std::fs::write(nf.join("nf_conntrack_max"), "lots\n").unwrap();
        let err = reader.read().unwrap_err();
        assert!(err.path().ends_with("nf_conntrack_max"), "{err}");

        let stat = dir.join("42/net/stat");
        std::fs::create_dir_all(&stat).unwrap();
        std::fs::write(stat.join("nf_conntrack"), STAT).unwrap();
        assert_eq!(netns_entries(&dir, 42).unwrap(), Some(2000));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_this_machine_when_available() {
        // Only checks that the real files parse; their values belong to the machine.
        let proc_root = Path::new("/proc");
        let _ = NodeConntrack::new(proc_root.to_path_buf()).read().unwrap();
        let _ = netns_entries(proc_root, std::process::id()).unwrap();
    }
}
