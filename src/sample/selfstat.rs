//! The agent's own cost: CPU, resident memory and open descriptors, read once per tick.

use super::procs::parse_stat_fields;
use crate::error::{ParseError, ReadError};
use crate::fsio::read_into;
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SelfStat {
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
    pub open_fds: u64,
}

#[derive(Debug)]
pub struct SelfReader {
    dir: PathBuf,
    ticks_per_second: f64,
    /// The last good reading: a failed read repeats it (a CPU counter must never go back to 0);
    /// `None` before the first good one (nothing to report rather than a 0 that would read as
    /// a counter reset once a read succeeds).
    last: Option<SelfStat>,
    failing: bool,
}

/// Pure: `VmRSS` of `/proc/<pid>/status`, in bytes. Not `stat`'s rss field: on 6.12 arm64 that
/// is a per-CPU approximated counter (64 pages shown for 151 real); `VmRSS` is exact.
pub fn parse_vm_rss(status: &str) -> Result<u64, ParseError> {
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .ok_or_else(|| ParseError::new("no VmRSS line"))?;
    let mut it = line.split_ascii_whitespace();
    let kb: u64 = it
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| ParseError::new(format!("VmRSS value {line:?}")))?;
    match it.next() {
        Some("kB") => Ok(kb.saturating_mul(1024)),
        other => Err(ParseError::new(format!("VmRSS unit {other:?}"))),
    }
}

impl SelfReader {
    pub fn new(proc_root: PathBuf) -> Self {
        let tps = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100);
        SelfReader {
            dir: proc_root.join(std::process::id().to_string()),
            ticks_per_second: tps as f64,
            last: None,
            failing: false,
        }
    }

    pub fn read(&self) -> Result<Option<SelfStat>, ReadError> {
        let path = self.dir.join("stat");
        let mut buf = Vec::new();
        if !read_into(&path, &mut buf)? {
            return Ok(None);
        }
        let st = parse_stat_fields(&buf).map_err(|e| ReadError::parse(&path, e))?;
        let status = self.dir.join("status");
        let rss_bytes = crate::fsio::parse_optional(&status, parse_vm_rss)?.unwrap_or(0);
        let fd_dir = self.dir.join("fd");
        let open_fds = crate::fsio::count_fds(&fd_dir).map_err(|e| ReadError::io(&fd_dir, e))?;
        Ok(Some(SelfStat {
            cpu_seconds: (st.utime as f64 + st.stime as f64) / self.ticks_per_second,
            rss_bytes,
            open_fds,
        }))
    }

    /// This tick's reading, or the last good one when it cannot be read (logged once); `None`
    /// until a read succeeds.
    pub fn sample(&mut self) -> Option<SelfStat> {
        match self.read() {
            Ok(Some(s)) => {
                if self.failing {
                    tracing::info!("own /proc entry readable again");
                }
                self.failing = false;
                self.last = Some(s);
            }
            Ok(None) => {}
            Err(e) => {
                if !self.failing {
                    tracing::warn!(error = %e, "cannot read the agent's own /proc entry; repeating the last values");
                }
                self.failing = true;
            }
        }
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_in_bytes() {
        let status = "Name:\tnodeguard\nVmHWM:\t    9100 kB\nVmRSS:\t    8912 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss(status), Ok(8912 * 1024));
        assert!(parse_vm_rss("Name:\tkthreadd\n").is_err());
        assert!(parse_vm_rss("VmRSS:\t 12 MB\n").is_err());
        assert!(parse_vm_rss("VmRSS:\n").is_err());
    }

    #[test]
    fn a_failed_read_repeats_the_last_values() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join(std::process::id().to_string());
        std::fs::create_dir_all(own.join("fd")).unwrap();
        std::fs::write(own.join("fd/0"), "").unwrap();
        let stat = format!(
            "{} (nodeguard) S 1 1 1 0 -1 0 0 0 0 0 250 50 0 0 20 0 4 0 100 1000 10 0",
            std::process::id()
        );
        std::fs::write(own.join("stat"), &stat).unwrap();
        std::fs::write(own.join("status"), "VmRSS:\t 100 kB\n").unwrap();
        let mut r = SelfReader::new(dir.path().to_path_buf());
        let first = r.sample().expect("read");
        assert_eq!(first.rss_bytes, 102_400);
        assert_eq!(first.open_fds, 1);
        assert!(first.cpu_seconds > 0.0);
        std::fs::write(own.join("stat"), "garbage").unwrap();
        assert_eq!(r.sample(), Some(first), "no counter reset on a failed read");
    }

    #[test]
    fn nothing_is_reported_until_a_read_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join(std::process::id().to_string());
        std::fs::create_dir_all(own.join("fd")).unwrap();
        std::fs::write(own.join("stat"), "garbage").unwrap();
        std::fs::write(own.join("status"), "VmRSS:\t 100 kB\n").unwrap();
        let mut r = SelfReader::new(dir.path().to_path_buf());
        assert_eq!(r.sample(), None, "a failed first read is no 0");
        let stat = format!(
            "{} (nodeguard) S 1 1 1 0 -1 0 0 0 0 0 250 50 0 0 20 0 4 0 100 1000 10 0",
            std::process::id()
        );
        std::fs::write(own.join("stat"), &stat).unwrap();
        let good = r.sample().expect("read");
        assert!(good.cpu_seconds > 0.0);
        std::fs::remove_file(own.join("stat")).unwrap();
        std::fs::write(own.join("status"), "no rss").unwrap();
        assert_eq!(
            r.sample(),
            Some(good),
            "gone or unparsable later: the last good values"
        );
    }
}
