//! Memory working set, limit and OOM kills of one cgroup, on v1 and v2.
//!
//! Working set = usage - inactive file, floored at zero, as cAdvisor and the kubelet define it.

use crate::cgroupfs::join_rel;
use crate::error::{ParseError, ReadError};
use crate::fsio::{self, unescape_name};
use nix::fcntl::OFlag;
use serde::Serialize;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
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

/// Default cap on the memory files held open: 330 cgroups of a 110-pod node hold 1,320.
/// [`MemoryReader::new`] lowers it to its share of the fd limit (`fsio::FdHolder`).
pub const DEFAULT_MAX_HELD_FILES: usize = 4096;

/// The four files of one cgroup, in [`MemoryReader::names`] order: usage, limit, stat, OOM.
#[derive(Debug, Default)]
struct Held {
    /// The cgroup directory's inode when the files were opened: a re-created cgroup of the same
    /// name has another, so its files are opened anew.
    ino: u64,
    files: [Option<File>; 4],
    /// The pass that last read it; sets not read by the latest pass are closed.
    pass: u64,
}

impl Held {
    fn count(&self) -> usize {
        self.files.iter().flatten().count()
    }
}

/// What the last pass held and read without a held descriptor.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MemoryFileStats {
    /// Memory files held open after the pass.
    pub held_files: usize,
    /// Files the pass read by opening them because the cap was reached (re-tried next pass).
    pub unheld_reads: usize,
}

/// Reads cgroups' memory files. Each file is opened once, below a descriptor of the hierarchy
/// root without following a symlink, and re-read with `pread` at offset 0 each pass (no path
/// walk, no open or close). A read that says the cgroup is gone (`ENODEV` from cgroupfs,
/// `ESTALE`, `ENOENT`) is churn: the handle is dropped and the path tried once more, which finds
/// a re-created cgroup of the same name or nothing.
#[derive(Debug)]
pub struct MemoryReader {
    root: PathBuf,
    v2: bool,
    root_fd: Option<OwnedFd>,
    held: HashMap<String, Held>,
    max_held: usize,
    /// Files in `held`.
    n_held: usize,
    pass: u64,
    buf: Vec<u8>,
    stats: MemoryFileStats,
}

impl MemoryReader {
    /// `root` is the memory hierarchy (v1 `memory` controller mount or the v2 tree).
    pub fn new(root: PathBuf, v2: bool) -> Self {
        MemoryReader {
            root,
            v2,
            root_fd: None,
            held: HashMap::new(),
            max_held: crate::fsio::FdHolder::Memory.cap(DEFAULT_MAX_HELD_FILES),
            n_held: 0,
            pass: 0,
            buf: Vec::with_capacity(4096),
            stats: MemoryFileStats::default(),
        }
    }

    /// Caps the files held open (0: none, every read opens its file), at most its share of the
    /// soft fd limit.
    pub fn with_max_held_files(mut self, max: usize) -> Self {
        self.max_held = crate::fsio::FdHolder::Memory.cap(max);
        self
    }

    /// What the last finished pass held.
    pub fn stats(&self) -> MemoryFileStats {
        self.stats
    }

    fn names(&self) -> [&'static str; 4] {
        if self.v2 {
            [
                "memory.current",
                "memory.max",
                "memory.stat",
                "memory.events",
            ]
        } else {
            [
                "memory.usage_in_bytes",
                "memory.limit_in_bytes",
                "memory.stat",
                "memory.oom_control",
            ]
        }
    }

    /// Starts a pass: each cgroup read until [`MemoryReader::finish_pass`] keeps its files.
    pub fn begin_pass(&mut self) {
        self.pass += 1;
        self.stats.unheld_reads = 0;
        if self.root_fd.is_none() {
            // A missing root reads as no cgroup at all, as paths below it would.
            self.root_fd = fsio::open_dir(&self.root).ok();
        }
    }

    /// Ends a pass: closes the files of cgroups it did not read (gone, or out of the inventory).
    pub fn finish_pass(&mut self) {
        let pass = self.pass;
        self.held.retain(|_, h| h.pass == pass);
        self.n_held = self.held.values().map(Held::count).sum();
        self.stats.held_files = self.n_held;
    }

    /// `Ok(None)` when the cgroup (or its memory files) does not exist: churn, or no memory
    /// accounting for this cgroup. `ino` is the cgroup directory's inode from discovery's walk
    /// (0 when unknown: held files are then trusted until a read says the cgroup is gone).
    pub fn read(&mut self, rel: &str, ino: u64) -> Result<Option<MemorySample>, ReadError> {
        let inactive_key = if self.v2 {
            "inactive_file"
        } else {
            "total_inactive_file"
        };
        let Some(usage) = self.read_file(rel, ino, 0, parse_u64)? else {
            self.forget(rel);
            return Ok(None);
        };
        let Some(limit) = self.read_file(rel, ino, 1, parse_limit)? else {
            self.forget(rel);
            return Ok(None);
        };
        let inactive = self
            .read_file(rel, ino, 2, |t| parse_keyed(t, inactive_key))?
            .flatten()
            .unwrap_or(0);
        let oom_kills = self.read_file(rel, ino, 3, oom_events)?.unwrap_or(0);
        Ok(Some(MemorySample {
            usage_bytes: usage,
            working_set_bytes: working_set(usage, inactive),
            limit_bytes: limit,
            oom_kills,
        }))
    }

    /// Closes the files of a cgroup that reads as gone.
    fn forget(&mut self, rel: &str) {
        if let Some(h) = self.held.remove(rel) {
            self.n_held -= h.count();
        }
    }

    /// Reads and parses file `which` of `rel`; `Ok(None)` when it does not exist.
    fn read_file<T>(
        &mut self,
        rel: &str,
        ino: u64,
        which: usize,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Result<Option<T>, ReadError> {
        let name = self.names()[which];
        let path = || join_rel(&self.root, rel).join(name);
        let pass = self.pass;
        let held = match self.held.get_mut(rel) {
            Some(h) if h.ino == ino => {
                h.pass = pass;
                Some(h)
            }
            _ => None,
        };
        if let Some(file) = held.and_then(|h| h.files[which].as_ref()) {
            match pread_all(file, &mut self.buf) {
                Ok(()) => return self.parse_buf(parse, path),
                // Removed (and maybe re-created): drop the handle and try the path.
                Err(e) if is_gone_file(&e) => {
                    if let Some(h) = self.held.get_mut(rel) {
                        h.files[which] = None;
                        self.n_held -= 1;
                    }
                }
                Err(e) => return Err(ReadError::io(&path(), e)),
            }
        }
        let Some(root) = &self.root_fd else {
            return Ok(None);
        };
        let file_rel = Path::new(OsStr::from_bytes(&unescape_name(
            rel.trim_start_matches('/'),
        )))
        .join(name);
        let file = match fsio::open_beneath(root.as_fd(), &file_rel, OFlag::O_RDONLY) {
            Ok(fd) => File::from(fd),
            Err(e) if is_gone_file(&e) || e.raw_os_error() == Some(nix::libc::ENOTDIR) => {
                return Ok(None)
            }
            Err(e) => return Err(ReadError::io(&path(), e)),
        };
        match pread_all(&file, &mut self.buf) {
            Ok(()) => {}
            Err(e) if is_gone_file(&e) => return Ok(None),
            Err(e) => return Err(ReadError::io(&path(), e)),
        }
        let value = self.parse_buf(parse, path)?;
        self.hold(rel, ino, which, file);
        Ok(value)
    }

    fn parse_buf<T>(
        &self,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
        path: impl Fn() -> PathBuf,
    ) -> Result<Option<T>, ReadError> {
        let text = std::str::from_utf8(&self.buf)
            .map_err(|e| ReadError::io(&path(), io::Error::new(io::ErrorKind::InvalidData, e)))?;
        parse(text)
            .map(Some)
            .map_err(|e| ReadError::parse(&path(), e))
    }

    /// Keeps `file` for the next passes, within the cap; over it the file is closed (counted).
    fn hold(&mut self, rel: &str, ino: u64, which: usize, file: File) {
        let pass = self.pass;
        let h = match self.held.get_mut(rel) {
            Some(h) => h,
            None => self.held.entry(rel.to_owned()).or_default(),
        };
        if h.ino != ino {
            // Files of an older cgroup of this name: closed, this one's replace them.
            self.n_held -= h.count();
            *h = Held {
                ino,
                ..Held::default()
            };
        }
        h.pass = pass;
        if h.files[which].is_some() {
            self.n_held -= 1;
            h.files[which] = None;
        }
        if self.n_held >= self.max_held {
            self.stats.unheld_reads += 1;
            return;
        }
        h.files[which] = Some(file);
        self.n_held += 1;
    }
}

/// Reads a whole small file from offset 0 into `buf`. A short read is the end: kernfs' seq
/// files produce all their text for one read large enough, as regular files do.
pub(crate) fn pread_all(file: &File, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    loop {
        if buf.capacity() - buf.len() < 1024 {
            buf.reserve(buf.capacity().max(4096));
        }
        let start = buf.len();
        let spare = buf.capacity() - start;
        buf.resize(start + spare, 0);
        let n = loop {
            match file.read_at(&mut buf[start..], start as u64) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r,
            }
        };
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                buf.truncate(start);
                return Err(e);
            }
        };
        buf.truncate(start + n);
        if n < spare {
            return Ok(());
        }
    }
}

/// A read or open that says the cgroup went away: `ENODEV` (cgroupfs after rmdir), `ESTALE`,
/// `ENOENT`, `ESRCH`.
pub(crate) fn is_gone_file(e: &io::Error) -> bool {
    fsio::is_gone(e) || e.raw_os_error() == Some(nix::libc::ESTALE)
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

    fn cgroup(root: &Path, rel: &str, usage: u64, limit: &str, oom: u64) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let d = root.join(rel);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("memory.current"), format!("{usage}\n")).unwrap();
        std::fs::write(d.join("memory.max"), limit).unwrap();
        std::fs::write(d.join("memory.stat"), "inactive_file 100\n").unwrap();
        std::fs::write(d.join("memory.events"), format!("oom_kill {oom}\n")).unwrap();
        std::fs::metadata(&d).unwrap().ino()
    }

    #[test]
    fn held_files_follow_rewrites_and_a_recreated_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let ino = cgroup(dir.path(), "a", 1000, "max\n", 0);
        let mut r = MemoryReader::new(dir.path().into(), true);
        r.begin_pass();
        let s = r.read("/a", ino).unwrap().unwrap();
        assert_eq!(
            (s.usage_bytes, s.working_set_bytes, s.limit_bytes),
            (1000, 900, None)
        );
        r.finish_pass();
        assert_eq!(r.stats().held_files, 4);
        // Rewritten in place: the held handle sees the new text.
        std::fs::write(dir.path().join("a/memory.current"), "5000\n").unwrap();
        r.begin_pass();
        assert_eq!(r.read("/a", ino).unwrap().unwrap().usage_bytes, 5000);
        r.finish_pass();
        // Removed and re-created under the same name: a held handle of the old directory would
        // still read its unlinked files; the new inode says to open the new ones.
        std::fs::remove_dir_all(dir.path().join("a")).unwrap();
        let ino2 = cgroup(dir.path(), "a", 7, "64\n", 3);
        assert_ne!(ino, ino2);
        r.begin_pass();
        let s = r.read("/a", ino2).unwrap().unwrap();
        assert_eq!(
            (s.usage_bytes, s.limit_bytes, s.oom_kills),
            (7, Some(64), 3)
        );
        r.finish_pass();
        assert_eq!(r.stats().held_files, 4);
        // Gone: no sample, and its handles are closed at the end of the pass.
        std::fs::remove_dir_all(dir.path().join("a")).unwrap();
        r.begin_pass();
        assert_eq!(r.read("/a", 0).unwrap(), None);
        r.finish_pass();
        assert_eq!(r.stats().held_files, 0);
    }

    #[test]
    fn cgroups_not_read_by_a_pass_are_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let a = cgroup(dir.path(), "a", 1, "max\n", 0);
        let b = cgroup(dir.path(), "b", 2, "max\n", 0);
        let mut r = MemoryReader::new(dir.path().into(), true);
        r.begin_pass();
        r.read("/a", a).unwrap();
        r.read("/b", b).unwrap();
        r.finish_pass();
        assert_eq!(r.stats().held_files, 8);
        r.begin_pass();
        r.read("/b", b).unwrap();
        r.finish_pass();
        assert_eq!(r.stats().held_files, 4);
    }

    #[test]
    fn the_fd_cap_bites_with_its_count_and_reads_stay_exact() {
        let dir = tempfile::tempdir().unwrap();
        let a = cgroup(dir.path(), "a", 1000, "2000\n", 1);
        let b = cgroup(dir.path(), "b", 3000, "max\n", 2);
        let mut r = MemoryReader::new(dir.path().into(), true).with_max_held_files(6);
        for _ in 0..2 {
            r.begin_pass();
            let sa = r.read("/a", a).unwrap().unwrap();
            let sb = r.read("/b", b).unwrap().unwrap();
            r.finish_pass();
            assert_eq!(
                (sa.usage_bytes, sa.limit_bytes, sa.oom_kills),
                (1000, Some(2000), 1)
            );
            assert_eq!(
                (sb.working_set_bytes, sb.limit_bytes, sb.oom_kills),
                (2900, None, 2)
            );
            assert_eq!(r.stats().held_files, 6);
            assert_eq!(r.stats().unheld_reads, 2);
        }
        // Nothing held: every read opens its file, and says so.
        let mut r = MemoryReader::new(dir.path().into(), true).with_max_held_files(0);
        r.begin_pass();
        assert_eq!(r.read("/a", a).unwrap().unwrap().usage_bytes, 1000);
        r.finish_pass();
        assert_eq!(
            r.stats(),
            MemoryFileStats {
                held_files: 0,
                unheld_reads: 4
            }
        );
    }

    #[test]
    fn a_symlinked_cgroup_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        cgroup(elsewhere.path(), "x", 1, "max\n", 0);
        std::os::unix::fs::symlink(elsewhere.path().join("x"), dir.path().join("x")).unwrap();
        let mut r = MemoryReader::new(dir.path().into(), true);
        r.begin_pass();
        assert!(
            r.read("/x", 0).is_err(),
            "a symlink below the root is refused"
        );
        r.finish_pass();
    }

    #[test]
    fn a_large_file_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let ino = cgroup(dir.path(), "a", 1000, "max\n", 0);
        let mut stat: String = (0..2000).map(|i| format!("key{i} {i}\n")).collect();
        stat.push_str("inactive_file 400\n");
        std::fs::write(dir.path().join("a/memory.stat"), stat).unwrap();
        let mut r = MemoryReader::new(dir.path().into(), true);
        r.begin_pass();
        assert_eq!(r.read("/a", ino).unwrap().unwrap().working_set_bytes, 600);
    }
}
