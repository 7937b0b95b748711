//! The process table: which pids each workload runs, and its zombies with the parent that does not
//! reap them.
//!
//! Zombies are no longer listed in `cgroup.procs` (see KERNEL-TRAPS), so they are found in /proc
//! and attributed through their parent, which is alive and still in the container's cgroup; the
//! zombie's own `0::` line is the fallback when the parent is outside every workload.

use crate::error::{ParseError, ReadError};
use crate::fsio::{read_into, read_optional};
use procfs_core::FromRead;
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcEntry {
    pub pid: u32,
    pub ppid: u32,
    pub state: char,
    pub comm: String,
}

/// Pure: `/proc/<pid>/stat`. The comm may hold spaces and parentheses; procfs-core splits on the
/// last `)`, which is the only safe way.
pub fn parse_stat(bytes: &[u8]) -> Result<ProcEntry, ParseError> {
    let st = procfs_core::process::Stat::from_read(bytes)
        .map_err(|e| ParseError::new(format!("bad stat: {e}")))?;
    Ok(ProcEntry {
        pid: u32::try_from(st.pid).map_err(|_| ParseError::new("negative pid"))?,
        ppid: u32::try_from(st.ppid).unwrap_or(0),
        state: st.state,
        comm: st.comm,
    })
}

/// Pure: the v2 path from `/proc/<pid>/cgroup` (the `0::` line).
pub fn parse_unified_path(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::trim_end)
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ZombieParent {
    pub pid: u32,
    pub comm: String,
    pub zombies: u64,
}

/// Per-workload process facts for one tick.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProcSummary {
    pub processes: u64,
    pub zombies: u64,
    /// Parents holding unreaped children, most zombies first.
    pub zombie_parents: Vec<ZombieParent>,
}

#[derive(Debug, Clone)]
pub struct ProcTable {
    root: PathBuf,
}

impl ProcTable {
    pub fn new(root: PathBuf) -> Self {
        ProcTable { root }
    }

    /// Every process's stat line. Pids that exit between listing and reading are skipped; one
    /// unreadable pid is reported in `errors` and the scan goes on.
    pub fn scan(&self) -> Result<(Vec<ProcEntry>, Vec<ReadError>), ReadError> {
        let rd = std::fs::read_dir(&self.root).map_err(|e| ReadError::io(&self.root, e))?;
        let mut out = Vec::with_capacity(512);
        let mut errors = Vec::new();
        let mut buf = Vec::with_capacity(512);
        for entry in rd.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let path = self.root.join(pid.to_string()).join("stat");
            match read_into(&path, &mut buf) {
                Ok(true) => match parse_stat(&buf) {
                    Ok(e) => out.push(e),
                    Err(e) => errors.push(ReadError::parse(&path, e)),
                },
                Ok(false) => {}
                Err(e) => errors.push(e),
            }
        }
        Ok((out, errors))
    }

    /// The zombie's v2 cgroup path, for attribution when its parent is in no workload.
    pub fn unified_path(&self, pid: u32) -> Result<Option<String>, ReadError> {
        let path = self.root.join(pid.to_string()).join("cgroup");
        Ok(read_optional(&path)?.and_then(|t| parse_unified_path(&t).map(str::to_owned)))
    }
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
