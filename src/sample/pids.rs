//! Pids: the pids controller of each workload (`pids.current` counts threads and zombies, not
//! processes) and the node's task table against the smaller of `kernel.pid_max` and
//! `kernel.threads-max`.
//!
//! The controller is the v1 `pids` hierarchy where it is mounted (v1 and hybrid hosts), else the
//! unified tree. The node's count is `nr_threads` from `/proc/loadavg`: every task the kernel has
//! not released yet, kernel threads and unreaped zombies included, which is what `fork` runs out of.

use super::memory::{is_gone_file, parse_u64, pread_all};
use super::procs::parse_pid_list;
use super::zombies::Measure;
use super::Reading;
use crate::cgroupfs::join_rel;
use crate::discover::Workload;
use crate::error::{ParseError, ReadError};
use crate::fsio::{self, parse_optional, unescape_name};
use crate::model::{NodePids, PidsSample};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
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

/// Default cap on the descriptors held for pids files: per cgroup its directory, `pids.current`
/// and `pids.max` (and on v1/hybrid hosts its directory in the hierarchy `cgroup.procs` is listed
/// from): ~880 at 110 pods. [`PidsReader::new`] lowers it to its share of the fd limit (`fsio::FdHolder`).
pub const DEFAULT_MAX_HELD_FILES: usize = 2048;

/// The held descriptors of one cgroup.
#[derive(Debug, Default)]
struct Held {
    /// The cgroup directory's inode from discovery's walk when these were opened: a re-created
    /// cgroup of the same name has another, so it is opened anew.
    ino: u64,
    /// Its directory in the pids hierarchy (`None`: not there).
    dir: Option<OwnedFd>,
    /// Its directory in the hierarchy `cgroup.procs` is listed from, where that is another one.
    procs_dir: Option<OwnedFd>,
    /// `cgroup.procs` is listed from `procs_dir` (another hierarchy), never from `dir`.
    split: bool,
    /// `pids.current`, `pids.max`, opened on first read and re-read with `pread`.
    files: [Option<File>; 2],
    /// The pass that last used it; entries the latest pass did not use are closed.
    pass: u64,
    /// The pass that opened it: a file missing below a directory opened this pass is missing.
    opened: u64,
    /// (`pids.current`, processes) when the live threads last listed were exactly
    /// `pids.current`: no zombie in the cgroup then (see [`PidsReader::measure`]).
    quiet: Option<(u64, usize)>,
    /// Not held (over the cap): closed at the end of the operation.
    once: bool,
}

impl Held {
    fn count(&self) -> usize {
        usize::from(self.dir.is_some())
            + usize::from(self.procs_dir.is_some())
            + self.files.iter().flatten().count()
    }
}

/// What the last pass held and opened without holding.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PidsFileStats {
    /// Descriptors held after the pass (cgroup directories and pids files).
    pub held_files: usize,
    /// Cgroups whose directory the pass opened and closed again because the cap was reached
    /// (re-tried next pass; their files are read all the same).
    pub unheld_reads: usize,
}

/// The pids controller of each cgroup, and its `cgroup.procs`. Each cgroup's directories are
/// opened once below a descriptor of the hierarchy root (no symlink followed) and its
/// `pids.current` and `pids.max` re-read with `pread` at offset 0 (no path walk, no open or
/// close). The pid lists (`cgroup.procs`, `tasks`, `cgroup.threads`) are opened anew relative to
/// the held directory each time: on v1 a held descriptor re-reads the pid list its first read
/// built while that list is cached (a second after the last read), not the cgroup's tasks now. A
/// read that says the cgroup is gone (`ENODEV` from cgroupfs, `ESTALE`, `ENOENT`) drops the
/// handles and tries the path once more, which finds a re-created cgroup or nothing.
#[derive(Debug)]
pub struct PidsReader {
    root: PathBuf,
    proc_root: PathBuf,
    /// The file listing a cgroup's live threads: v1 `tasks`, v2 `cgroup.threads`.
    threads_file: &'static str,
    root_fd: Option<OwnedFd>,
    /// The hierarchy `cgroup.procs` is listed from, where it is not `root`, and its descriptor.
    procs_root: Option<(PathBuf, Option<OwnedFd>)>,
    held: HashMap<String, Held>,
    max_held: usize,
    /// Descriptors in `held`.
    n_held: usize,
    pass: u64,
    buf: Vec<u8>,
    stats: PidsFileStats,
}

/// Which file of a cgroup an operation reads.
#[derive(Clone, Copy)]
enum Which {
    Current,
    Max,
    Threads,
    Procs,
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
            root_fd: None,
            procs_root: None,
            held: HashMap::new(),
            max_held: crate::fsio::FdHolder::Pids.cap(DEFAULT_MAX_HELD_FILES),
            n_held: 0,
            pass: 0,
            buf: Vec::with_capacity(4096),
            stats: PidsFileStats::default(),
        }
    }

    /// Caps the descriptors held (0: none, every read opens its files), at most its share of
    /// the soft fd limit.
    pub fn with_max_held_files(mut self, max: usize) -> Self {
        self.max_held = crate::fsio::FdHolder::Pids.cap(max);
        self
    }

    /// What the last finished pass held.
    pub fn stats(&self) -> PidsFileStats {
        self.stats
    }

    /// Starts a pass: each cgroup used until [`PidsReader::finish_pass`] keeps its descriptors.
    pub fn begin_pass(&mut self) {
        self.pass += 1;
        self.stats.unheld_reads = 0;
        if self.root_fd.is_none() {
            // A missing root reads as no cgroup at all, as paths below it would.
            self.root_fd = fsio::open_dir(&self.root).ok();
        }
        if let Some((root, fd @ None)) = &mut self.procs_root {
            *fd = fsio::open_dir(root).ok();
        }
    }

    /// Ends a pass: closes what cgroups it did not use hold (gone, or out of the inventory).
    pub fn finish_pass(&mut self) {
        let pass = self.pass;
        self.held.retain(|_, h| h.pass == pass);
        self.n_held = self.held.values().map(Held::count).sum();
        self.stats.held_files = self.n_held;
    }

    /// `rel`'s `cgroup.procs` in `primary` (discovery's hierarchy), appended to `out`; nothing
    /// when the cgroup is gone.
    pub fn list_procs(
        &mut self,
        primary: &Path,
        rel: &str,
        ino: u64,
        out: &mut Vec<u32>,
    ) -> Result<(), ReadError> {
        if primary != self.root.as_path()
            && self.procs_root.as_ref().is_none_or(|(p, _)| p != primary)
        {
            self.procs_root = Some((primary.to_path_buf(), fsio::open_dir(primary).ok()));
            // Directories of the other hierarchy held so far are of no use.
            self.held.clear();
        }
        if self.attempt(rel, ino, Which::Procs)? {
            out.extend(parse_pid_list(&self.buf));
        }
        Ok(())
    }

    /// `pids.current`; `Ok(None)` without the controller (or the cgroup is gone).
    pub fn current(&mut self, rel: &str, ino: u64) -> Result<Option<u64>, ReadError> {
        self.parse(rel, ino, Which::Current, parse_u64)
    }

    /// `pids.current` and `pids.max`; `Ok(None)` when the cgroup (or its pids controller) does
    /// not exist: churn, or the controller is not enabled there. `ino`: the cgroup directory's
    /// inode from discovery's walk (0 when unknown: held files are then trusted until a read
    /// says the cgroup is gone).
    pub fn read(&mut self, rel: &str, ino: u64) -> Result<Option<PidsSample>, ReadError> {
        let Some(current) = self.current(rel, ino)? else {
            return Ok(None);
        };
        let Some(limit) = self.parse(rel, ino, Which::Max, parse_pids_max)? else {
            return Ok(None);
        };
        Ok(Some(PidsSample { current, limit }))
    }

    /// Appends the cgroup's live threads (zombies are not listed); `Ok(false)` when gone.
    pub fn threads(&mut self, rel: &str, ino: u64, out: &mut Vec<u32>) -> Result<bool, ReadError> {
        if !self.attempt(rel, ino, Which::Threads)? {
            return Ok(false);
        }
        out.extend(parse_pid_list(&self.buf));
        Ok(true)
    }

    /// Workload `w`'s pids controller (reported) and the zombie tracker's measure:
    /// `pids.current` after the listing of `procs` processes, and where that shows more tasks
    /// (threads or zombies), the live threads and `pids.current` once more (the larger reading
    /// counts). `ino_of` gives a cgroup's inode from discovery's walk.
    ///
    /// Where the threads last listed were exactly `pids.current` (no zombie) and neither
    /// `pids.current` nor the number of processes changed since, the threads are not listed
    /// again: only a thread's exit in the same tick as a new zombie keeps both numbers, and the
    /// tracker's staleness pass finds that zombie (docs/performance.md).
    pub fn measure(
        &mut self,
        w: &Workload,
        ino_of: &dyn Fn(&str) -> u64,
        procs: usize,
        track: bool,
        errors: &mut Vec<ReadError>,
    ) -> (Reading<PidsSample>, Measure) {
        let mut m = Measure::default();
        let ino = ino_of(&w.cgroup);
        let first = match self.read(&w.cgroup, ino) {
            Ok(Some(s)) => s,
            Ok(None) => return (Reading::Absent, m),
            Err(e) => {
                errors.push(e);
                return (Reading::Failed, m);
            }
        };
        m.current = Some(first.current);
        m.live = procs;
        let quiet = self.held.get(&w.cgroup).and_then(|h| h.quiet);
        self.set_quiet(&w.cgroup, None);
        if !track || first.current <= procs as u64 {
            return (Reading::Read(first), m);
        }
        if quiet == Some((first.current, procs)) {
            // Nothing to look for: as the last listing, every task a live thread.
            m.live = usize::try_from(first.current).unwrap_or(usize::MAX);
            self.set_quiet(&w.cgroup, quiet);
            return (Reading::Read(first), m);
        }
        let mut listed = true;
        for (k, rel) in w.subtree.iter().enumerate() {
            match self.threads(rel, ino_of(rel), &mut m.tids) {
                Ok(true) => {}
                Ok(false) => listed = listed && k > 0,
                Err(e) => {
                    errors.push(e);
                    listed = false;
                }
            }
        }
        m.live = m.tids.len();
        match self.current(&w.cgroup, ino) {
            Ok(Some(again)) if listed => {
                let current = first.current.max(again);
                m.current = Some(current);
                if current == m.live as u64 {
                    self.set_quiet(&w.cgroup, Some((first.current, procs)));
                }
            }
            Ok(_) => m.current = None,
            Err(e) => {
                errors.push(e);
                m.current = None;
            }
        }
        (Reading::Read(first), m)
    }

    fn set_quiet(&mut self, rel: &str, quiet: Option<(u64, usize)>) {
        if let Some(h) = self.held.get_mut(rel) {
            h.quiet = quiet;
        }
    }

    fn parse<T>(
        &mut self,
        rel: &str,
        ino: u64,
        which: Which,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Result<Option<T>, ReadError> {
        if !self.attempt(rel, ino, which)? {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&self.buf);
        parse(&text)
            .map(Some)
            .map_err(|e| ReadError::parse(&self.path(rel, which), e))
    }

    fn name(&self, which: Which) -> &'static str {
        match which {
            Which::Current => "pids.current",
            Which::Max => "pids.max",
            Which::Threads => self.threads_file,
            Which::Procs => "cgroup.procs",
        }
    }

    fn path(&self, rel: &str, which: Which) -> PathBuf {
        let root = match (which, &self.procs_root) {
            (Which::Procs, Some((p, _))) => p,
            _ => &self.root,
        };
        join_rel(root, rel).join(self.name(which))
    }

    /// Reads file `which` of `rel` into `self.buf`; `Ok(false)` when it (or the cgroup) is not
    /// there. Held descriptors that say the cgroup is gone are dropped and the path tried once.
    fn attempt(&mut self, rel: &str, ino: u64, which: Which) -> Result<bool, ReadError> {
        let mut buf = std::mem::take(&mut self.buf);
        let r = self.attempt_into(rel, ino, which, &mut buf);
        self.buf = buf;
        r
    }

    fn attempt_into(
        &mut self,
        rel: &str,
        ino: u64,
        which: Which,
        buf: &mut Vec<u8>,
    ) -> Result<bool, ReadError> {
        let name = self.name(which);
        for retry in [false, true] {
            let may_hold = self.n_held < self.max_held;
            let pass = self.pass;
            let Some(slot) = self.slot(rel, ino)? else {
                return Ok(false);
            };
            let fresh = slot.opened == pass;
            let before = slot.count();
            let r = read_one(slot, which, name, buf, may_hold);
            let (once, added) = (slot.once, slot.count() - before);
            if once {
                self.held.remove(rel);
            } else {
                self.n_held += added;
            }
            match r {
                Ok(found) if found || fresh || retry => return Ok(found),
                Ok(_) => {}
                Err(e) if is_gone_file(&e) || e.raw_os_error() == Some(nix::libc::ENOTDIR) => {
                    if retry {
                        return Ok(false);
                    }
                }
                Err(e) => return Err(ReadError::io(&self.path(rel, which), e)),
            }
            // Held, and gone or missing now: the cgroup may have been re-created.
            self.forget(rel);
        }
        Ok(false)
    }

    /// Closes a cgroup's descriptors.
    fn forget(&mut self, rel: &str) {
        if let Some(h) = self.held.remove(rel) {
            self.n_held -= h.count();
        }
    }

    /// `rel`'s entry, opened if needed (`None`: in neither hierarchy). Over the cap the entry
    /// is marked `once` and closed after one read.
    fn slot(&mut self, rel: &str, ino: u64) -> Result<Option<&mut Held>, ReadError> {
        let pass = self.pass;
        let stale = self.held.get(rel).is_some_and(|h| h.ino != ino);
        if stale {
            self.forget(rel);
        }
        if !self.held.contains_key(rel) {
            let Some(mut h) = self.open_entry(rel, ino)? else {
                return Ok(None);
            };
            let needs = h.count() + 2;
            if self.n_held + needs > self.max_held {
                h.once = true;
                self.stats.unheld_reads += 1;
            } else {
                self.n_held += h.count();
            }
            self.held.insert(rel.to_owned(), h);
        }
        let h = self.held.get_mut(rel);
        if let Some(h) = h {
            h.pass = pass;
            return Ok(Some(h));
        }
        Ok(None)
    }

    fn open_entry(&self, rel: &str, ino: u64) -> Result<Option<Held>, ReadError> {
        let open = |root: Option<&OwnedFd>, path: &Path| -> Result<Option<OwnedFd>, ReadError> {
            let Some(root) = root else { return Ok(None) };
            let rel_path = Path::new(OsStr::from_bytes(&unescape_name(
                rel.trim_start_matches('/'),
            )))
            .to_path_buf();
            match fsio::open_beneath(
                root.as_fd(),
                &rel_path,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            ) {
                Ok(fd) => Ok(Some(fd)),
                Err(e) if is_gone_file(&e) || e.raw_os_error() == Some(nix::libc::ENOTDIR) => {
                    Ok(None)
                }
                Err(e) => Err(ReadError::io(&join_rel(path, rel), e)),
            }
        };
        let dir = open(self.root_fd.as_ref(), &self.root)?;
        let procs_dir = match &self.procs_root {
            Some((p, fd)) => open(fd.as_ref(), p)?,
            None => None,
        };
        if dir.is_none() && procs_dir.is_none() {
            return Ok(None);
        }
        Ok(Some(Held {
            ino,
            dir,
            procs_dir,
            split: self.procs_root.is_some(),
            opened: self.pass,
            pass: self.pass,
            ..Held::default()
        }))
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

/// Reads one file of a cgroup's entry into `buf`: a held `pids.*` file with `pread`, else the
/// file opened relative to the held directory (and, for `pids.*` of a held entry, kept).
/// `Ok(false)`: not there.
fn read_one(
    h: &mut Held,
    which: Which,
    name: &str,
    buf: &mut Vec<u8>,
    may_hold: bool,
) -> io::Result<bool> {
    let slot = match which {
        Which::Current => Some(0),
        Which::Max => Some(1),
        Which::Threads | Which::Procs => None,
    };
    if let Some(file) = slot.and_then(|i| h.files[i].as_ref()) {
        pread_all(file, buf)?;
        return Ok(true);
    }
    let dir = match which {
        Which::Procs if h.split => h.procs_dir.as_ref(),
        Which::Procs => h.dir.as_ref(),
        _ => h.dir.as_ref(),
    };
    let Some(dir) = dir else {
        buf.clear();
        return Ok(false);
    };
    let file = match nix::fcntl::openat(
        Some(dir.as_raw_fd()),
        name,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    ) {
        // SAFETY: a descriptor just returned by openat(2), owned by nobody else.
        Ok(fd) => File::from(unsafe { OwnedFd::from_raw_fd(fd) }),
        Err(nix::errno::Errno::ENOENT) => {
            buf.clear();
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    };
    pread_all(&file, buf)?;
    if let (Some(i), false, true) = (slot, h.once, may_hold) {
        h.files[i] = Some(file);
    }
    Ok(true)
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
        let mut r = PidsReader::new(cg, proc);
        r.begin_pass();
        assert_eq!(
            r.read("/a/b", 0).unwrap(),
            Some(PidsSample {
                current: 7,
                limit: None
            })
        );
        assert_eq!(
            r.read("/a", 0).unwrap(),
            Some(PidsSample {
                current: 9,
                limit: Some(12)
            })
        );
        assert_eq!(r.read("/gone", 0).unwrap(), None);
        assert_eq!(
            r.read_node().unwrap(),
            Some(NodePids {
                current: 431,
                limit: 126344
            })
        );
    }

    fn ino(p: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).unwrap().ino()
    }

    fn cgroup(root: &Path, name: &str, current: u64, tasks: &str) -> u64 {
        let d = root.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("pids.current"), format!("{current}\n")).unwrap();
        std::fs::write(d.join("pids.max"), "max\n").unwrap();
        std::fs::write(d.join("tasks"), tasks).unwrap();
        std::fs::write(d.join("cgroup.procs"), tasks).unwrap();
        ino(&d)
    }

    fn workload(cgroup: &str) -> Workload {
        use crate::discover::kubelet::QosClass;
        use crate::discover::WorkloadKind;
        use crate::model::WorkloadId;
        Workload {
            id: WorkloadId::container("shop", "web-0", "app"),
            kind: WorkloadKind::Container {
                pod_uid: "u-1".into(),
                container_id: "c1".into(),
                qos: QosClass::Burstable,
            },
            cgroup: cgroup.into(),
            subtree: vec![cgroup.into()],
        }
    }

    fn current(r: &mut PidsReader, rel: &str, ino: u64) -> Option<u64> {
        r.begin_pass();
        let v = r.read(rel, ino).unwrap().map(|s| s.current);
        r.finish_pass();
        v
    }

    #[test]
    fn held_files_are_re_read_and_follow_a_re_created_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let first = cgroup(dir.path(), "a", 3, "");
        let mut r = PidsReader::new(dir.path().into(), dir.path().into());
        assert_eq!(current(&mut r, "/a", first), Some(3));
        // The directory, pids.current and pids.max.
        assert_eq!(
            r.stats(),
            PidsFileStats {
                held_files: 3,
                unheld_reads: 0
            }
        );
        // Written in place: the held descriptor reads the new text.
        std::fs::write(dir.path().join("a/pids.current"), "4\n").unwrap();
        assert_eq!(current(&mut r, "/a", first), Some(4));
        // rmdir + mkdir of the same name: another inode, so opened anew (a held file of the
        // removed directory would still read "4" here; cgroupfs answers it with ENODEV).
        std::fs::remove_dir_all(dir.path().join("a")).unwrap();
        let second = cgroup(dir.path(), "a", 9, "");
        assert_ne!(first, second);
        assert_eq!(current(&mut r, "/a", second), Some(9));
        assert_eq!(r.stats().held_files, 3);
        // Gone (discovery no longer lists it: inode 0): nothing, and nothing held.
        std::fs::remove_dir_all(dir.path().join("a")).unwrap();
        assert_eq!(current(&mut r, "/a", 0), None);
        assert_eq!(r.stats().held_files, 0);
        // Out of the inventory: a pass that does not read it closes its files.
        let third = cgroup(dir.path(), "b", 1, "");
        assert_eq!(current(&mut r, "/b", third), Some(1));
        r.begin_pass();
        r.finish_pass();
        assert_eq!(r.stats().held_files, 0);
    }

    #[test]
    fn a_gone_held_directory_is_opened_again_by_its_path() {
        // Without an inode from discovery (0), a read that says the cgroup is gone re-opens it.
        let dir = tempfile::tempdir().unwrap();
        cgroup(dir.path(), "a", 2, "7\n8\n");
        let mut r = PidsReader::new(dir.path().into(), dir.path().into());
        r.begin_pass();
        let mut tids = Vec::new();
        assert!(r.threads("/a", 0, &mut tids).unwrap());
        r.finish_pass();
        std::fs::remove_dir_all(dir.path().join("a")).unwrap();
        cgroup(dir.path(), "a", 2, "9\n");
        r.begin_pass();
        tids.clear();
        // The held directory is empty and dead: ENOENT, then the path finds the new one.
        assert!(r.threads("/a", 0, &mut tids).unwrap());
        assert_eq!(tids, vec![9]);
        r.finish_pass();
    }

    #[test]
    fn over_the_cap_files_are_read_and_closed() {
        let dir = tempfile::tempdir().unwrap();
        let a = cgroup(dir.path(), "a", 5, "");
        let mut r = PidsReader::new(dir.path().into(), dir.path().into()).with_max_held_files(0);
        assert_eq!(current(&mut r, "/a", a), Some(5));
        assert_eq!(r.stats().held_files, 0);
        assert!(r.stats().unheld_reads > 0);
        // Room for one cgroup (3 descriptors) of two.
        let b = cgroup(dir.path(), "b", 6, "");
        let mut r = PidsReader::new(dir.path().into(), dir.path().into()).with_max_held_files(4);
        r.begin_pass();
        assert_eq!(r.read("/a", a).unwrap().map(|s| s.current), Some(5));
        assert_eq!(r.read("/b", b).unwrap().map(|s| s.current), Some(6));
        r.finish_pass();
        assert!(r.stats().held_files <= 4, "{:?}", r.stats());
        assert!(r.stats().unheld_reads > 0, "{:?}", r.stats());
    }

    #[test]
    fn procs_are_listed_from_the_primary_hierarchy() {
        let pids = tempfile::tempdir().unwrap();
        let primary = tempfile::tempdir().unwrap();
        let ino = cgroup(primary.path(), "a", 0, "11\n12\n");
        cgroup(pids.path(), "a", 2, "");
        let mut r = PidsReader::new(pids.path().into(), pids.path().into());
        r.begin_pass();
        let mut out = Vec::new();
        r.list_procs(primary.path(), "/a", ino, &mut out).unwrap();
        assert_eq!(out, vec![11, 12]);
        assert_eq!(r.read("/a", ino).unwrap().map(|s| s.current), Some(2));
        // Listed anew each time (a v1 pid list is cached behind a held descriptor).
        std::fs::write(primary.path().join("a/cgroup.procs"), "13\n").unwrap();
        out.clear();
        r.list_procs(primary.path(), "/a", ino, &mut out).unwrap();
        assert_eq!(out, vec![13]);
        r.finish_pass();
        // Both directories and the two pids files.
        assert_eq!(r.stats().held_files, 4);
        // Gone from the primary hierarchy only: no processes (not the pids hierarchy's list).
        let b = cgroup(primary.path(), "b", 0, "");
        cgroup(pids.path(), "b", 1, "21\n");
        std::fs::remove_dir_all(primary.path().join("b")).unwrap();
        out.clear();
        r.begin_pass();
        r.list_procs(primary.path(), "/b", b, &mut out).unwrap();
        assert!(out.is_empty(), "{out:?}");
        assert_eq!(r.read("/b", b).unwrap().map(|s| s.current), Some(1));
        r.finish_pass();
        out.clear();
        r.begin_pass();
        r.list_procs(primary.path(), "/gone", 0, &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn threads_are_listed_again_only_when_the_counts_move() {
        let dir = tempfile::tempdir().unwrap();
        // One process with three threads, no zombie.
        let ino = cgroup(dir.path(), "a", 3, "5\n6\n7\n");
        let mut r = PidsReader::new(dir.path().into(), dir.path().into());
        let w = workload("/a");
        let ino_of = |_: &str| ino;
        let mut errors = Vec::new();
        let mut tick = |r: &mut PidsReader, procs: usize| {
            r.begin_pass();
            let (_, m) = r.measure(&w, &ino_of, procs, true, &mut errors);
            r.finish_pass();
            m
        };
        let m = tick(&mut r, 1);
        assert_eq!(
            (m.current, m.live, m.tids.clone()),
            (Some(3), 3, vec![5, 6, 7])
        );
        // Unchanged: not listed (the listing is changed behind the reader to show it is not read).
        std::fs::write(dir.path().join("a/tasks"), "5\n").unwrap();
        let m = tick(&mut r, 1);
        assert_eq!((m.current, m.live, m.tids.len()), (Some(3), 3, 0));
        // pids.current moved (a zombie: 3 threads and one more task): listed again.
        std::fs::write(dir.path().join("a/tasks"), "5\n6\n7\n").unwrap();
        std::fs::write(dir.path().join("a/pids.current"), "4\n").unwrap();
        let m = tick(&mut r, 1);
        assert_eq!((m.current, m.live), (Some(4), 3));
        // A zombie seen: not quiet, listed every tick while it lasts.
        let m = tick(&mut r, 1);
        assert_eq!((m.current, m.live), (Some(4), 3));
        // The number of processes moved: listed again.
        std::fs::write(dir.path().join("a/pids.current"), "3\n").unwrap();
        let m = tick(&mut r, 1);
        assert_eq!((m.current, m.live), (Some(3), 3));
        std::fs::write(dir.path().join("a/tasks"), "5\n6\n").unwrap();
        let m = tick(&mut r, 2);
        assert_eq!((m.current, m.live, m.tids.len()), (Some(3), 2, 2));
        assert!(errors.is_empty(), "{errors:?}");
    }
}
