//! The agent's own cost: CPU, resident memory and open descriptors, read once per tick.

use super::procs::parse_stat_fields;
use crate::error::ReadError;
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
    page_size: u64,
}

impl SelfReader {
    pub fn new(proc_root: PathBuf) -> Self {
        let tps = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .unwrap_or(100);
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096);
        SelfReader {
            dir: proc_root.join(std::process::id().to_string()),
            ticks_per_second: tps as f64,
            page_size: page as u64,
        }
    }

    pub fn read(&self) -> Result<Option<SelfStat>, ReadError> {
        let path = self.dir.join("stat");
        let mut buf = Vec::new();
        if !read_into(&path, &mut buf)? {
            return Ok(None);
        }
        let st = parse_stat_fields(&buf).map_err(|e| ReadError::parse(&path, e))?;
        let fd_dir = self.dir.join("fd");
        let open_fds = std::fs::read_dir(&fd_dir)
            .map_err(|e| ReadError::io(&fd_dir, e))?
            .count() as u64;
        Ok(Some(SelfStat {
            cpu_seconds: (st.utime as f64 + st.stime as f64) / self.ticks_per_second,
            rss_bytes: st.rss.saturating_mul(self.page_size),
            open_fds,
        }))
    }
}
