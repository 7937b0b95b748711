//! Pids: the pids controller of each workload (`pids.current` counts threads and zombies, not
//! processes) and the node's task table against the smaller of `kernel.pid_max` and
//! `kernel.threads-max`.
//!
//! The controller is the v1 `pids` hierarchy where it is mounted (v1 and hybrid hosts), else the
//! unified tree. The node's count is `nr_threads` from `/proc/loadavg`: every task the kernel has
//! not released yet, kernel threads and unreaped zombies included, which is what `fork` runs out of.

use crate::discover::join_rel;
use crate::error::{ParseError, ReadError};
use crate::fsio::{self, parse_optional};
use crate::model::{NodePids, PidsSample};
use crate::sample::memory::parse_u64;
use crate::sample::procs::{parse_pid_list, read_rel};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Pure: `pids.max`, `max` meaning no limit.
pub fn parse_pids_max(text: &str) -> Result<Option<u64>, ParseError> {
    let t = text.trim();
    if t == "max" {
        return Ok(None);
    }
    parse_u64(t).map(Some)
}

/// Pure: the task count of `/proc/loadavg` (`0.20 0.18 0.12 1/80 11206`: 80).
pub fn parse_loadavg_tasks(text: &str) -> Result<u64, ParseError> {
    let field = text
        .split_ascii_whitespace()
        .nth(3)
        .ok_or_else(|| ParseError::new(format!("fewer than 4 fields in {text:?}")))?;
    let (_, total) = field
        .split_once('/')
        .ok_or_else(|| ParseError::new(format!("no running/total field in {text:?}")))?;
    total
        .parse()
        .map_err(|_| ParseError::new(format!("bad task count {total:?}")))
}

#[derive(Debug, Clone)]
pub struct PidsReader {
    root: PathBuf,
    proc_root: PathBuf,
    /// The file listing a cgroup's live threads: v1 `tasks`, v2 `cgroup.threads`.
    threads_file: &'static str,
}

/// One cgroup's directory in the pids hierarchy, opened once: its files are then opened by name.
#[derive(Debug)]
pub struct PidsDir {
    fd: OwnedFd,
    path: PathBuf,
    threads_file: &'static str,
}

impl PidsDir {
    fn read(&self, name: &str, buf: &mut Vec<u8>) -> Result<Option<String>, ReadError> {
        match read_rel(self.fd.as_fd(), name, buf) {
            Ok(true) => Ok(Some(String::from_utf8_lossy(buf).into_owned())),
            Ok(false) => Ok(None),
            Err(e) => Err(ReadError::io(&self.path.join(name), e)),
        }
    }

    fn parse<T>(
        &self,
        name: &str,
        buf: &mut Vec<u8>,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Result<Option<T>, ReadError> {
        match self.read(name, buf)? {
            Some(t) => parse(&t)
                .map(Some)
                .map_err(|e| ReadError::parse(&self.path.join(name), e)),
            None => Ok(None),
        }
    }

    /// `pids.current`; `Ok(None)` without the controller (or the cgroup is gone).
    pub fn current(&self, buf: &mut Vec<u8>) -> Result<Option<u64>, ReadError> {
        self.parse("pids.current", buf, parse_u64)
    }

    /// `pids.current` and `pids.max`.
    pub fn sample(&self, buf: &mut Vec<u8>) -> Result<Option<PidsSample>, ReadError> {
        let Some(current) = self.current(buf)? else {
            return Ok(None);
        };
        let Some(limit) = self.parse("pids.max", buf, parse_pids_max)? else {
            return Ok(None);
        };
        Ok(Some(PidsSample { current, limit }))
    }

    /// Appends the cgroup's live threads (zombies are not listed); `Ok(false)` when gone.
    pub fn threads(&self, buf: &mut Vec<u8>, out: &mut Vec<u32>) -> Result<bool, ReadError> {
        match read_rel(self.fd.as_fd(), self.threads_file, buf) {
            Ok(true) => {
                out.extend(parse_pid_list(buf));
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(e) => Err(ReadError::io(&self.path.join(self.threads_file), e)),
        }
    }
}

impl PidsReader {
    /// `root`: the pids hierarchy (v1 `pids` mount or the unified tree); `proc_root`: `/proc`.
    pub fn new(root: PathBuf, proc_root: PathBuf) -> Self {
        let threads_file = if root.join("cgroup.controllers").is_file() {
            "cgroup.threads"
        } else {
            "tasks"
        };
        PidsReader {
            root,
            proc_root,
            threads_file,
        }
    }

    /// Opens a cgroup's directory; `Ok(None)` when it does not exist in this hierarchy.
    pub fn open(&self, rel: &str) -> Result<Option<PidsDir>, ReadError> {
        let path = join_rel(&self.root, rel);
        match fsio::open_dir(&path) {
            Ok(fd) => Ok(Some(PidsDir {
                fd,
                path,
                threads_file: self.threads_file,
            })),
            Err(e) if fsio::is_gone(&e) || e.raw_os_error() == Some(nix::libc::ENOTDIR) => Ok(None),
            Err(e) => Err(ReadError::io(&path, e)),
        }
    }

    /// `Ok(None)` when the cgroup (or its pids controller) does not exist: churn, or the
    /// controller is not enabled there.
    pub fn read(&self, rel: &str) -> Result<Option<PidsSample>, ReadError> {
        match self.open(rel)? {
            Some(dir) => dir.sample(&mut Vec::new()),
            None => Ok(None),
        }
    }

    /// The node's task table; `Ok(None)` when a file is missing (not a Linux procfs).
    pub fn read_node(&self) -> Result<Option<NodePids>, ReadError> {
        let p = |rel: &str| self.proc_root.join(rel);
        let Some(current) = parse_optional(&p("loadavg"), parse_loadavg_tasks)? else {
            return Ok(None);
        };
        let Some(pid_max) = parse_optional(&p("sys/kernel/pid_max"), parse_u64)? else {
            return Ok(None);
        };
        let Some(threads_max) = parse_optional(&p("sys/kernel/threads-max"), parse_u64)? else {
            return Ok(None);
        };
        Ok(Some(NodePids {
            current,
            limit: pid_max.min(threads_max),
        }))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_max_and_loadavg() {
        assert_eq!(parse_pids_max("max\n"), Ok(None));
        assert_eq!(parse_pids_max("64\n"), Ok(Some(64)));
        assert!(parse_pids_max("-1").is_err());
        assert_eq!(parse_loadavg_tasks("6.54 4.36 3.34 9/156 4549\n"), Ok(156));
        assert!(parse_loadavg_tasks("6.54 4.36 3.34").is_err());
        assert!(parse_loadavg_tasks("1 2 3 9 4549").is_err());
        assert!(parse_loadavg_tasks("1 2 3 9/x 4549").is_err());
    }

    #[test]
    fn reads_a_tree_and_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("cg");
        let proc = dir.path().join("proc");
        std::fs::create_dir_all(cg.join("a/b")).unwrap();
        std::fs::create_dir_all(proc.join("sys/kernel")).unwrap();
        std::fs::write(cg.join("a/b/pids.current"), "7\n").unwrap();
        std::fs::write(cg.join("a/b/pids.max"), "max\n").unwrap();
        std::fs::write(cg.join("a/pids.current"), "9\n").unwrap();
        std::fs::write(cg.join("a/pids.max"), "12\n").unwrap();
        std::fs::write(proc.join("loadavg"), "0.00 0.01 0.05 2/431 999\n").unwrap();
        std::fs::write(proc.join("sys/kernel/pid_max"), "4194304\n").unwrap();
        std::fs::write(proc.join("sys/kernel/threads-max"), "126344\n").unwrap();
        let r = PidsReader::new(cg, proc);
        assert_eq!(
            r.read("/a/b").unwrap(),
            Some(PidsSample {
                current: 7,
                limit: None
            })
        );
        assert_eq!(
            r.read("/a").unwrap(),
            Some(PidsSample {
                current: 9,
                limit: Some(12)
            })
        );
        assert_eq!(r.read("/gone").unwrap(), None);
        assert_eq!(
            r.read_node().unwrap(),
            Some(NodePids {
                current: 431,
                limit: 126344
            })
        );
    }
}
