//! The process table: which pids each workload runs, and its zombies with the parent that does not
//! reap them.
//!
//! Zombies are no longer listed in `cgroup.procs` (see KERNEL-TRAPS), so they are found in /proc
//! and attributed through their parent, which is alive and still in the container's cgroup; the
//! zombie's own `0::` line is the fallback when the parent is outside every workload.

use crate::error::{ParseError, ReadError};
use crate::fsio::{self, read_into};
use crate::model::ZombieParent;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use serde::Serialize;
use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcEntry {
    pub pid: u32,
    pub ppid: u32,
    pub state: char,
    pub comm: String,
}

/// The fields of `/proc/<pid>/stat` the agent uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub pid: u32,
    pub comm: String,
    pub state: char,
    pub ppid: u32,
    /// Clock ticks.
    pub utime: u64,
    pub stime: u64,
    /// Clock ticks after boot.
    pub starttime: u64,
    /// Pages.
    pub rss: u64,
}

/// Pure: `/proc/<pid>/stat`. Our own parser rather than procfs-core's `Stat::from_read`, which
/// slices by index and panics on text that is not the kernel's (release aborts on panic).
/// The comm may hold spaces and parentheses: it runs from the first `(` to the last `)`.
pub fn parse_stat_fields(bytes: &[u8]) -> Result<Stat, ParseError> {
    let open = memchr::memchr(b'(', bytes).ok_or_else(|| ParseError::new("stat without '('"))?;
    let close = memchr::memrchr(b')', bytes)
        .filter(|c| *c > open)
        .ok_or_else(|| ParseError::new("stat without ')' after '('"))?;
    let pid = std::str::from_utf8(&bytes[..open])
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .ok_or_else(|| ParseError::new("stat: bad pid"))?;
    // Non-UTF-8 bytes in a comm are the process's own choice: shown replaced, not an error.
    let comm = String::from_utf8_lossy(&bytes[open + 1..close]).into_owned();
    // After the comm: field 3 (state) is index 0, so field n is index n - 3.
    let mut fields = bytes[close + 1..]
        .split(|b| b.is_ascii_whitespace())
        .filter(|f| !f.is_empty());
    // Fields are taken in increasing order; `at` counts those consumed.
    let mut at = 0;
    let mut field = |n: usize| -> Result<&[u8], ParseError> {
        let f = fields
            .nth(n - 3 - at)
            .ok_or_else(|| ParseError::new(format!("stat: no field {n}")))?;
        at = n - 2;
        Ok(f)
    };
    let number = |f: &[u8], n: usize| -> Result<u64, ParseError> {
        std::str::from_utf8(f)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| ParseError::new(format!("stat: bad field {n}")))
    };
    let state = match field(3)? {
        [c] if c.is_ascii_alphabetic() => char::from(*c),
        _ => return Err(ParseError::new("stat: bad state")),
    };
    // ppid is 0 for pid 1 and kernel threads' parent; never negative in practice.
    let ppid = std::str::from_utf8(field(4)?)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| ParseError::new("stat: bad field 4"))?;
    Ok(Stat {
        pid,
        comm,
        state,
        ppid: u32::try_from(ppid).unwrap_or(0),
        utime: number(field(14)?, 14)?,
        stime: number(field(15)?, 15)?,
        starttime: number(field(22)?, 22)?,
        rss: number(field(24)?, 24)?,
    })
}

/// Pure: the process-table entry of a `/proc/<pid>/stat`.
pub fn parse_stat(bytes: &[u8]) -> Result<ProcEntry, ParseError> {
    let st = parse_stat_fields(bytes)?;
    Ok(ProcEntry {
        pid: st.pid,
        ppid: st.ppid,
        state: st.state,
        comm: st.comm,
    })
}

/// Pure: the last allocated pid of `/proc/loadavg` (`0.20 0.18 0.12 1/80 11206`: 11206).
pub fn parse_last_pid(bytes: &[u8]) -> Result<u32, ParseError> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| t.split_ascii_whitespace().nth(4))
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| ParseError::new("loadavg: no last pid"))
}

/// Pure: the v2 path from `/proc/<pid>/cgroup` (the `0::` line).
pub fn parse_unified_path(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim_end)
}

/// Per-workload process facts for one tick.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProcSummary {
    pub processes: u64,
    pub zombies: u64,
    /// Parents holding unreaped children, most zombies first.
    pub zombie_parents: Vec<ZombieParent>,
}

/// A scanned process and its start time (clock ticks after boot).
pub type Scanned = (ProcEntry, u64);

/// Reads /proc relative to a descriptor held from construction: one path component per pid
/// instead of a walk from `/` (the walks were a third of the scan's kernel time).
#[derive(Debug)]
pub struct ProcTable {
    root: PathBuf,
    dir: Option<OwnedFd>,
    /// `/proc/<tid>/task/<tid>/children` exists (CONFIG_PROC_CHILDREN): zombies can be found
    /// from their parents; without it every tick scans.
    children: bool,
}

/// One `/proc/<pid>/stat`, the fields the zombie tracker needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcFacts {
    pub state: char,
    pub ppid: u32,
    pub starttime: u64,
    pub comm: String,
}

impl ProcTable {
    pub fn new(root: PathBuf) -> Self {
        let dir = fsio::open_dir(&root).ok();
        let children = root.join("thread-self/children").is_file();
        ProcTable {
            root,
            dir,
            children,
        }
    }

    /// Whether zombies can be looked up from their parents (else the tracker always scans).
    pub fn has_children(&self) -> bool {
        self.children
    }

    /// Reads `<root>/<rel>` into `buf`; `Ok(false)` when it is gone (the pid exited).
    pub fn read_at(&self, rel: &str, buf: &mut Vec<u8>) -> Result<bool, ReadError> {
        let Some(dir) = &self.dir else {
            return read_into(&self.root.join(rel), buf);
        };
        read_rel(dir.as_fd(), rel, buf).map_err(|e| ReadError::io(&self.root.join(rel), e))
    }

    /// One process's stat; `Ok(None)` when it is gone.
    pub fn facts(&self, pid: u32, buf: &mut Vec<u8>) -> Result<Option<ProcFacts>, ReadError> {
        let rel = format!("{pid}/stat");
        if !self.read_at(&rel, buf)? {
            return Ok(None);
        }
        let st = parse_stat_fields(buf).map_err(|e| ReadError::parse(&self.root.join(&rel), e))?;
        Ok(Some(ProcFacts {
            state: st.state,
            ppid: st.ppid,
            starttime: st.starttime,
            comm: st.comm,
        }))
    }

    /// The children of one thread (`/proc/<tid>/task/<tid>/children`), appended to `out`.
    pub fn children_of(
        &self,
        tid: u32,
        buf: &mut Vec<u8>,
        out: &mut Vec<u32>,
    ) -> Result<(), ReadError> {
        if self.read_at(&format!("{tid}/task/{tid}/children"), buf)? {
            out.extend(parse_pid_list(buf));
        }
        Ok(())
    }

    /// Every process's stat line, with its start time. Pids that exit between listing and
    /// reading are skipped; one unreadable pid is reported in `errors` and the scan goes on.
    /// `skip` leaves out pids known to be alive.
    pub fn scan_with(
        &self,
        mut skip: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<Scanned>, Vec<ReadError>), ReadError> {
        let pids = self.list_pids()?;
        Ok(self.read_pids(pids.into_iter().filter(|&p| !skip(p))))
    }

    /// The pids /proc lists (processes, not threads).
    pub fn list_pids(&self) -> Result<Vec<u32>, ReadError> {
        let rd = std::fs::read_dir(&self.root).map_err(|e| ReadError::io(&self.root, e))?;
        let mut out = Vec::with_capacity(512);
        for entry in rd.flatten() {
            if let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u32>().ok())
            {
                out.push(pid);
            }
        }
        Ok(out)
    }

    /// The stat lines of `pids`, with their start times; pids gone meanwhile are skipped, one
    /// unreadable pid is reported in the errors and the reads go on.
    pub fn read_pids(&self, pids: impl Iterator<Item = u32>) -> (Vec<Scanned>, Vec<ReadError>) {
        let mut out = Vec::with_capacity(512);
        let mut errors = Vec::new();
        let mut buf = Vec::with_capacity(512);
        let mut rel = String::with_capacity(16);
        for pid in pids {
            rel.clear();
            use std::fmt::Write;
            let _ = write!(rel, "{pid}/stat");
            match self.read_at(&rel, &mut buf) {
                Ok(true) => match parse_stat_fields(&buf) {
                    Ok(st) => out.push((
                        ProcEntry {
                            pid: st.pid,
                            ppid: st.ppid,
                            state: st.state,
                            comm: st.comm,
                        },
                        st.starttime,
                    )),
                    Err(e) => errors.push(ReadError::parse(&self.root.join(&rel), e)),
                },
                Ok(false) => {}
                Err(e) => errors.push(e),
            }
        }
        (out, errors)
    }

    /// The pid the kernel allocated last (`/proc/loadavg`'s last field); `Ok(None)` when that
    /// file is missing (not a Linux procfs).
    pub fn last_pid(&self, buf: &mut Vec<u8>) -> Result<Option<u32>, ReadError> {
        if !self.read_at("loadavg", buf)? {
            return Ok(None);
        }
        parse_last_pid(buf)
            .map(Some)
            .map_err(|e| ReadError::parse(&self.root.join("loadavg"), e))
    }

    /// Every process's stat line (see [`ProcTable::scan_with`]).
    pub fn scan(&self) -> Result<(Vec<ProcEntry>, Vec<ReadError>), ReadError> {
        let (entries, errors) = self.scan_with(|_| false)?;
        Ok((entries.into_iter().map(|(e, _)| e).collect(), errors))
    }

    /// The zombie's v2 cgroup path, for attribution when its parent is in no workload.
    pub fn unified_path(&self, pid: u32) -> Result<Option<String>, ReadError> {
        let mut buf = Vec::new();
        if !self.read_at(&format!("{pid}/cgroup"), &mut buf)? {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&buf);
        Ok(parse_unified_path(&text).map(str::to_owned))
    }
}

/// Reads a small file below a held directory into `buf`; `Ok(false)` when it is gone.
pub(crate) fn read_rel(dir: BorrowedFd<'_>, rel: &str, buf: &mut Vec<u8>) -> std::io::Result<bool> {
    buf.clear();
    let opened = nix::fcntl::openat(
        Some(dir.as_raw_fd()),
        rel,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
    .and_then(|fd| {
        // SAFETY: a descriptor just returned by openat(2), owned by nobody else.
        let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        f.read_to_end(buf)
    });
    match opened {
        Ok(_) => Ok(true),
        Err(e) if fsio::is_gone(&e) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Pure: pids separated by spaces or newlines (`children`, `cgroup.procs`, `tasks`).
pub fn parse_pid_list(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .split(|b| b.is_ascii_whitespace())
        .filter_map(|w| std::str::from_utf8(w).ok()?.parse().ok())
}

/// Pure: how many of a cgroup's zombies are not yet known. `current` is the largest of the
/// `pids.current` readings taken around the listing of `live` tasks (a task forked and released
/// between two of them is the only one that can hide a zombie); `known` are the tracked zombies
/// charged to it. Zero means nothing new to look for.
pub fn unknown_zombies(current: u64, live: usize, known: usize) -> u64 {
    current
        .saturating_sub(live as u64)
        .saturating_sub(known as u64)
}

/// Pure: attributes zombies to workloads. `owner_of` maps live pids (from `cgroup.procs`) to a
/// workload index; `fallback` resolves a zombie whose parent is in no workload.
pub fn attribute_zombies(
    entries: &[ProcEntry],
    owner_of: &HashMap<u32, usize>,
    mut fallback: impl FnMut(u32) -> Option<usize>,
) -> HashMap<usize, ProcSummary> {
    let comm_of: HashMap<u32, &str> = entries.iter().map(|e| (e.pid, e.comm.as_str())).collect();
    let mut out: HashMap<usize, ProcSummary> = HashMap::new();
    let mut parents: HashMap<(usize, u32), u64> = HashMap::new();
    for e in entries.iter().filter(|e| e.state == 'Z') {
        let owner = owner_of.get(&e.ppid).copied().or_else(|| fallback(e.pid));
        if let Some(w) = owner {
            out.entry(w).or_default().zombies += 1;
            *parents.entry((w, e.ppid)).or_default() += 1;
        }
    }
    for ((w, ppid), n) in parents {
        out.entry(w).or_default().zombie_parents.push(ZombieParent {
            pid: ppid,
            comm: comm_of.get(&ppid).copied().unwrap_or("").to_owned(),
            zombies: n,
        });
    }
    for s in out.values_mut() {
        s.zombie_parents
            .sort_by(|a, b| b.zombies.cmp(&a.zombies).then(a.pid.cmp(&b.pid)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_spaces_and_parentheses_in_comm() {
        let line = b"4242 (my (weird) proc) Z 4200 4242 4242 0 -1 4194308 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
        let e = parse_stat(line).unwrap();
        assert_eq!(
            e,
            ProcEntry {
                pid: 4242,
                ppid: 4200,
                state: 'Z',
                comm: "my (weird) proc".into()
            }
        );
        let sleeping = b"1 (systemd) S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
        assert_eq!(parse_stat(sleeping).unwrap().state, 'S');
        assert!(parse_stat(b"garbage").is_err());
        assert!(parse_stat(b"").is_err());
    }

    #[test]
    fn stat_fields_by_position() {
        let line = b"77 (a) b) R 1 77 77 0 -1 4194560 5 0 0 0 300 40 0 0 20 0 1 0 9999 1000000 321 18446744073709551615 0 0\n";
        let st = parse_stat_fields(line).unwrap();
        assert_eq!(
            (st.comm.as_str(), st.utime, st.stime, st.starttime, st.rss),
            ("a) b", 300, 40, 9999, 321)
        );
    }

    #[test]
    fn non_kernel_stat_text_is_an_error_not_a_panic() {
        // Each of these panicked in procfs-core's Stat::from_read (slicing before the pid, a `)`
        // before the `(`, nothing after the `)`).
        for text in [
            &b"(x) R 1"[..],
            b") (",
            b"1 (x)",
            b"1 (x",
            b"1 x) R",
            b"\xff (\xff) R",
        ] {
            assert!(parse_stat(text).is_err(), "{text:?}");
        }
        assert!(parse_stat(b"1 (x) R 0").is_err(), "truncated");
        let bad_utf8 = b"5 (\xffz) S 1 5 5 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 3 0 4 0";
        assert_eq!(parse_stat(bad_utf8).unwrap().comm, "\u{fffd}z");
    }

    #[test]
    fn pid_lists_and_the_unknown_difference() {
        assert_eq!(
            parse_pid_list(b"12 13\n14\n\nx 15 ").collect::<Vec<_>>(),
            vec![12, 13, 14, 15]
        );
        assert_eq!(parse_pid_list(b"").count(), 0);
        // 9 charged, 6 live threads, 2 zombies known: one to look for.
        assert_eq!(unknown_zombies(9, 6, 2), 1);
        assert_eq!(unknown_zombies(9, 6, 3), 0);
        // More listed than charged (a fork between the reads) or known than shown: nothing.
        assert_eq!(unknown_zombies(5, 6, 0), 0);
        assert_eq!(unknown_zombies(8, 6, 4), 0);
    }

    #[test]
    fn last_pid_of_loadavg() {
        assert_eq!(parse_last_pid(b"0.20 0.18 0.12 1/80 11206\n"), Ok(11206));
        assert!(parse_last_pid(b"0.20 0.18 0.12 1/80").is_err());
        assert!(parse_last_pid(b"0.20 0.18 0.12 1/80 x").is_err());
    }

    #[test]
    fn unified_line() {
        let text = "9:name=systemd:/\n4:memory:/\n0::/kubepods/burstable/podu/abc\n";
        assert_eq!(
            parse_unified_path(text),
            Some("/kubepods/burstable/podu/abc")
        );
        assert_eq!(parse_unified_path("4:memory:/x\n"), None);
    }

    fn entry(pid: u32, ppid: u32, state: char, comm: &str) -> ProcEntry {
        ProcEntry {
            pid,
            ppid,
            state,
            comm: comm.into(),
        }
    }

    #[test]
    fn zombies_go_to_the_parents_workload() {
        let entries = vec![
            entry(10, 1, 'S', "supervisor"),
            entry(11, 10, 'Z', "worker"),
            entry(12, 10, 'Z', "worker"),
            entry(20, 1, 'S', "other"),
            entry(21, 20, 'Z', "x"),
            entry(30, 99, 'Z', "orphan-ish"),
            entry(31, 98, 'Z', "unknown"),
        ];
        let owners = HashMap::from([(10, 0usize), (20, 1usize)]);
        let out = attribute_zombies(&entries, &owners, |pid| (pid == 30).then_some(1));
        assert_eq!(out[&0].zombies, 2);
        assert_eq!(
            out[&0].zombie_parents,
            vec![ZombieParent {
                pid: 10,
                comm: "supervisor".into(),
                zombies: 2
            }]
        );
        assert_eq!(out[&1].zombies, 2);
        assert_eq!(out[&1].zombie_parents.len(), 2);
        assert_eq!(out[&1].zombie_parents[0].zombies, 1);
        assert_eq!(out.len(), 2);
    }
}
