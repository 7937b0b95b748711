//! Incremental, rotation-safe reader of kubelet's pod log tree
//! (`<root>/<namespace>_<pod>_<uid>/<container>/<restart>.log`): counts the lines written since
//! the previous pass, never re-reading a byte and with a bounded amount of reading per pass.
//!
//! The tree is untrusted: everything below the root is opened relative to a descriptor of it
//! without following any symlink ([`crate::fsio::open_beneath`]), and the number of files held
//! open is capped. What is declined is counted in [`LogTreeStats`], never logged per file.

use super::cri::CriCounter;
use crate::discover::names::PodLogListing;
use crate::error::ReadError;
use crate::fsio::{self, escape_name, is_gone, is_refused_link, EntryKind, RegularFileError};
use crate::model::WorkloadId;
use nix::fcntl::OFlag;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

pub use super::cri::LineCounts;

#[cfg(test)]
mod tests;
mod tree;

use tree::{ContainerKey, ContainerScan, Scan};

/// Size of the one read buffer shared by all files: large enough for few syscalls (measured a
/// few percent faster than 64 KiB), small enough to stay in L2 and to make a multi-GB log cost
/// no memory.
const READ_BUF: usize = 128 * 1024;

pub use crate::config::DEFAULT_MAX_OPEN_FILES;

/// What one container's logs did during one `sample()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerLogSample {
    pub id: WorkloadId,
    pub pod_uid: String,
    /// lines written since the previous sample() (these feed the per-minute rate)
    pub new_lines: LineCounts,
    /// lines that were already in files when the agent first saw them at start-up: they go into
    /// the total counter but must not count as a burst in the rate
    pub backlog_lines: LineCounts,
    /// highest N among the container's current `<N>.log` regular files (kubelet's restart count)
    pub max_restart_number: Option<u32>,
}

/// Entries of the log tree the last pass did not open, by reason, and the files it holds open.
/// Gauges of the last pass: a symlink that stays there is counted once per pass, not summed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LogTreeStats {
    /// Log files held open after the pass (current files and files being drained).
    pub open_files: usize,
    /// Pod dirs, container dirs and `<N>.log` entries that are symlinks: never followed, wherever
    /// they point (kubelet writes none under the pod log root).
    pub skipped_symlink: usize,
    /// `<N>.log` entries that are not regular files (FIFOs, sockets, devices, directories).
    pub skipped_not_regular: usize,
    /// `<N>.log` files not opened because `max_open_files` was reached (or the fd table was
    /// full); tried again next pass.
    pub skipped_cap: usize,
}

/// An open log file and how far it has been counted.
#[derive(Debug)]
struct Tracked {
    container: ContainerKey,
    n: u32,
    /// For error messages only: files are reached through descriptors.
    path: PathBuf,
    /// Held open so that bytes written just before a rename or unlink can still be read.
    file: File,
    ino: u64,
    offset: u64,
    /// Bytes before this offset were in the file when the agent first saw it: backlog, not rate.
    backlog_end: u64,
    counter: CriCounter,
}

impl Tracked {
    fn in_backlog(&self) -> bool {
        self.offset < self.backlog_end
    }
}

/// Counts per container, split by how they must be reported.
#[derive(Debug, Default, Clone, Copy)]
struct Delta {
    new: LineCounts,
    backlog: LineCounts,
}

/// Tails the pod log tree, one `sample()` per tick. Holds one fd per container (its current,
/// highest `<N>.log`), plus older, rotated or removed files only until they are drained, never
/// more than `max_open_files` in all; and one read buffer.
pub struct LogTailer {
    root: PathBuf,
    max_bytes_per_tick: u64,
    max_open_files: usize,
    /// False until the first pass that could list the root: files it finds are backlog.
    primed: bool,
    /// The current `<N>.log` of each container.
    files: BTreeMap<ContainerKey, Tracked>,
    /// Handles of replaced, removed and older files: read to their end, then closed.
    draining: Vec<Tracked>,
    /// `(N, inode)` of a container's older `<N>.log` already opened once, while still listed:
    /// never opened again.
    opened_older: HashMap<ContainerKey, HashSet<(u32, u64)>>,
    /// `(N, inode)` seen by the first pass but not opened then; still backlog when they open.
    unopened_at_start: HashMap<ContainerKey, HashSet<(u32, u64)>>,
    /// The previous listing, reused for a directory whose listing fails (e.g. EMFILE), so that a
    /// transient error neither drops containers nor recounts their files as new.
    last_scan: Scan,
    buf: Vec<u8>,
    /// Rotates which live file is read first, so a noisy container cannot starve the others of
    /// the byte budget tick after tick.
    cursor: usize,
    stats: LogTreeStats,
    /// Listings of pod and container dirs, reused while the directory is unchanged.
    memo: tree::TreeMemo,
}

impl LogTailer {
    /// root = the pod log dir (default /var/log/pods), configurable for tests.
    /// max_bytes_per_tick bounds the work of one sample() across all files: reading beyond it
    /// continues at the next sample (a multi-GB existing log must neither cost RAM nor stall a
    /// tick). A budget of 0 is taken as 1 so that reading always progresses. The open-file cap
    /// starts at [`DEFAULT_MAX_OPEN_FILES`] (see [`LogTailer::with_max_open_files`]).
    pub fn new(root: PathBuf, max_bytes_per_tick: u64) -> Self {
        LogTailer {
            root,
            max_bytes_per_tick: max_bytes_per_tick.max(1),
            max_open_files: fd_reserve_cap(DEFAULT_MAX_OPEN_FILES),
            primed: false,
            files: BTreeMap::new(),
            draining: Vec::new(),
            opened_older: HashMap::new(),
            unopened_at_start: HashMap::new(),
            last_scan: Scan::new(),
            buf: vec![0; READ_BUF],
            cursor: 0,
            stats: LogTreeStats::default(),
            memo: tree::TreeMemo::default(),
        }
    }

    /// Caps the log files held open at once (at least 1), and at their share of the soft fd
    /// limit (a quarter of `RLIMIT_NOFILE` as it is now, `fsio::FdHolder`) so that logs can
    /// never take the descriptors the other samplers and the HTTP server need.
    pub fn with_max_open_files(mut self, max_open_files: usize) -> Self {
        self.max_open_files = fd_reserve_cap(max_open_files);
        self
    }

    /// The cap in force after the fd-limit clamp.
    pub fn max_open_files(&self) -> usize {
        self.max_open_files
    }

    /// What the last pass declined, and the files it holds open.
    pub fn stats(&self) -> LogTreeStats {
        self.stats
    }

    /// One incremental pass. A missing root is Ok(empty) (plain host without Kubernetes).
    /// Per-file read errors do not stop the other files: they are returned in the second element.
    /// Returns one sample per container directory present, sorted by id then pod uid.
    pub fn sample(&mut self) -> (Vec<ContainerLogSample>, Vec<ReadError>) {
        self.sample_listed(None)
    }

    /// [`LogTailer::sample`] with the root as discovery listed it this tick (used when it is a
    /// listing of this tailer's root), so that the tree is listed once per tick.
    pub fn sample_listed(
        &mut self,
        listing: Option<&PodLogListing>,
    ) -> (Vec<ContainerLogSample>, Vec<ReadError>) {
        let before = self.stats;
        self.stats = LogTreeStats::default();
        let mut errors = Vec::new();
        let (scan, root_listed, root) = self.scan(listing, &mut errors);
        self.reconcile(&scan, root, &mut errors);

        // Every tracked file belongs to a listed container (reconcile sees to it), so all
        // lookups hit this map and the key strings are cloned once per container, not per file.
        let mut deltas: BTreeMap<ContainerKey, Delta> =
            scan.keys().map(|k| (k.clone(), Delta::default())).collect();
        self.read_all(&mut deltas, &mut errors);

        let samples = scan
            .iter()
            .map(|(key, cs)| {
                let delta = deltas.get(key).copied().unwrap_or_default();
                ContainerLogSample {
                    id: key.id.clone(),
                    pod_uid: key.pod_uid.clone(),
                    new_lines: delta.new,
                    backlog_lines: delta.backlog,
                    max_restart_number: cs.logs.last().map(|(n, _)| *n),
                }
            })
            .collect();

        if root_listed {
            self.primed = true;
        }
        self.last_scan = scan;
        self.stats.open_files = self.tracked_files();
        self.log_transitions(before);
        (samples, errors)
    }

    /// Open log files: current ones plus older, rotated or removed ones still being drained.
    pub fn tracked_files(&self) -> usize {
        self.files.len() + self.draining.len()
    }

    /// One summary line when a kind of skip starts or stops, never one per file or per tick.
    fn log_transitions(&self, before: LogTreeStats) {
        let now = self.stats;
        let kinds = [
            ("symlink", before.skipped_symlink, now.skipped_symlink),
            (
                "not_regular",
                before.skipped_not_regular,
                now.skipped_not_regular,
            ),
            ("cap", before.skipped_cap, now.skipped_cap),
        ];
        for (reason, was, is) in kinds {
            if was == 0 && is > 0 {
                tracing::warn!(
                    root = %self.root.display(),
                    reason,
                    skipped = is,
                    max_open_files = self.max_open_files,
                    "log tree entries skipped (counted in nodeguard_log_files_skipped)"
                );
            } else if was > 0 && is == 0 {
                tracing::info!(root = %self.root.display(), reason, "log tree entries no longer skipped");
            }
        }
    }

    /// Brings the open handles in line with the listing: retires the handle of a current file
    /// that was replaced (a higher N, or the same name with a new inode) or removed to
    /// `draining`, closes those of containers that are gone, then opens, within the cap, each
    /// container's new current file first and older files not yet read after them.
    fn reconcile(&mut self, scan: &Scan, root: Option<OwnedFd>, errors: &mut Vec<ReadError>) {
        let keys: Vec<ContainerKey> = self.files.keys().cloned().collect();
        for key in keys {
            let current = scan.get(&key).and_then(|cs| cs.logs.last().copied());
            let Some(t) = self.files.get(&key) else {
                continue;
            };
            if current == Some((t.n, t.ino)) {
                continue;
            }
            if let Some(old) = self.files.remove(&key) {
                if scan.contains_key(&key) {
                    self.opened_older
                        .entry(key)
                        .or_default()
                        .insert((old.n, old.ino));
                    self.draining.push(old);
                }
                // Lines of a container no longer listed could not be reported: closed now.
            }
        }
        self.draining.retain(|t| scan.contains_key(&t.container));
        // Only files still listed: once a file is gone its inode number can be reused by a new
        // log, which must then be read like any new file (an inode alone is no identity).
        for set in [&mut self.opened_older, &mut self.unopened_at_start] {
            set.retain(|k, files| {
                let Some(cs) = scan.get(k) else {
                    return false;
                };
                // `logs` is sorted: a binary search keeps this linear in the files held.
                files.retain(|f| cs.logs.binary_search(f).is_ok());
                !files.is_empty()
            });
        }

        let mut current = Vec::new();
        let mut older = Vec::new();
        for (key, cs) in scan {
            let Some((&(n, ino), rest)) = cs.logs.split_last() else {
                continue;
            };
            let done = self.opened_older.get(key);
            // A file read once as an older one (its successor was removed) is not read again.
            if !self.files.contains_key(key) && !done.is_some_and(|d| d.contains(&(n, ino))) {
                current.push((key, cs, n, ino));
            }
            for &(n, ino) in rest {
                if !done.is_some_and(|d| d.contains(&(n, ino))) {
                    older.push((key, cs, n, ino));
                }
            }
        }
        let root = match root.map_or_else(|| fsio::open_dir(&self.root), Ok) {
            Ok(fd) => fd,
            Err(e) => {
                if !is_gone(&e) {
                    errors.push(ReadError::io(&self.root, e));
                }
                return;
            }
        };
        let mut full = false;
        let n_current = current.len();
        for (i, (key, cs, n, ino)) in current.into_iter().chain(older).enumerate() {
            let is_current = i < n_current;
            if full || self.tracked_files() >= self.max_open_files {
                self.stats.skipped_cap += 1;
                if !self.primed {
                    self.unopened_at_start
                        .entry(key.clone())
                        .or_default()
                        .insert((n, ino));
                }
                continue;
            }
            match self.open(root.as_fd(), key, cs, n, ino) {
                Ok(Some(t)) => {
                    if is_current {
                        self.files.insert(key.clone(), t);
                    } else {
                        self.opened_older
                            .entry(key.clone())
                            .or_default()
                            .insert((n, ino));
                        self.draining.push(t);
                    }
                }
                Ok(None) => {}
                Err((e, _)) if is_fd_exhaustion(&e) => {
                    // The cap did not bite but the fd table is full: stop opening this pass.
                    full = true;
                    self.stats.skipped_cap += 1;
                }
                Err((e, path)) => {
                    if !self.primed {
                        self.unopened_at_start
                            .entry(key.clone())
                            .or_default()
                            .insert((n, ino));
                    }
                    errors.push(ReadError::io(&path, e));
                }
            }
        }
    }

    /// Opens one `<N>.log` below the root. `Ok(None)`: gone, or skipped (and counted).
    fn open(
        &mut self,
        root: BorrowedFd<'_>,
        key: &ContainerKey,
        cs: &ContainerScan,
        n: u32,
        ino: u64,
    ) -> Result<Option<Tracked>, (io::Error, PathBuf)> {
        let rel = cs.rel.join(format!("{n}.log"));
        // Present at start-up (or not opened then): what it holds now is backlog.
        let backlog = !self.primed
            || self
                .unopened_at_start
                .get(key)
                .is_some_and(|s| s.contains(&(n, ino)));
        let path = self.root.join(&rel);
        // A FIFO, socket or device that slipped in under a log name (after the listing) is
        // refused without blocking in open().
        let file = match fsio::open_regular_beneath(root, &rel, &path, fsio::Reader::Logs) {
            Ok(file) => file,
            Err(e) if e.is_gone() => return Ok(None),
            Err(e) if e.is_refused_link() => {
                self.stats.skipped_symlink += 1;
                return Ok(None);
            }
            Err(RegularFileError::NotRegular { .. }) => {
                self.stats.skipped_not_regular += 1;
                return Ok(None);
            }
            Err(RegularFileError::Io { source, .. }) => return Err((source, path)),
            Err(e) => return Err((io::Error::other(e.to_string()), path)),
        };
        let tracked = tracked_from(file, key, n, &path, backlog).map_err(|e| (e, path))?;
        if let Some(s) = self.unopened_at_start.get_mut(key) {
            s.remove(&(n, ino));
        }
        Ok(Some(tracked))
    }

    /// Reads within the byte budget: first the retired handles (their lines came before those
    /// of the file that replaced them), then files caught up with their backlog, the first of
    /// them rotating each pass, then backlog in key order (finishing one file before the next).
    fn read_all(
        &mut self,
        deltas: &mut BTreeMap<ContainerKey, Delta>,
        errors: &mut Vec<ReadError>,
    ) {
        let mut budget = self.max_bytes_per_tick;
        let buf = &mut self.buf;

        let mut i = 0;
        while i < self.draining.len() && budget > 0 {
            let t = &mut self.draining[i];
            let mut spare = Delta::default();
            let delta = deltas.get_mut(&t.container).unwrap_or(&mut spare);
            match pump(t, buf, &mut budget, delta) {
                Ok(true) => {
                    // Drained: dropping the handle closes the fd.
                    self.draining.swap_remove(i);
                }
                Ok(false) => i += 1,
                Err(e) => {
                    errors.push(ReadError::io(&t.path, e));
                    self.draining.swap_remove(i);
                }
            }
        }

        let (mut live, backlog): (Vec<&mut Tracked>, Vec<&mut Tracked>) =
            self.files.values_mut().partition(|t| !t.in_backlog());
        let start = if live.is_empty() {
            0
        } else {
            self.cursor % live.len()
        };
        self.cursor = self.cursor.wrapping_add(1);
        live.rotate_left(start);
        for t in live.into_iter().chain(backlog) {
            if budget == 0 {
                break;
            }
            let mut spare = Delta::default();
            let delta = deltas.get_mut(&t.container).unwrap_or(&mut spare);
            if let Err(e) = pump(t, buf, &mut budget, delta) {
                // Kept: the next pass retries from the same offset.
                errors.push(ReadError::io(&t.path, e));
            }
        }
    }
}

fn is_fd_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(c) if c == nix::libc::EMFILE || c == nix::libc::ENFILE)
}

/// `wanted`, at least 1 and at most the log files' share of the fd limit ([`FdHolder`]).
fn fd_reserve_cap(wanted: usize) -> usize {
    crate::fsio::FdHolder::Logs.cap(wanted).max(1)
}
/// Reads `t` from its offset up to its current size or until the budget is spent. Returns true
/// when it reached the size it had at the start of the call.
fn pump(t: &mut Tracked, buf: &mut [u8], budget: &mut u64, delta: &mut Delta) -> io::Result<bool> {
    let size = t.file.metadata()?.len();
    if size < t.offset {
        // Truncated in place (copytruncate): what is there now was written after the truncation.
        t.offset = 0;
        t.backlog_end = 0;
        t.counter.reset();
    }
    while t.offset < size {
        if *budget == 0 {
            return Ok(false);
        }
        let want = (buf.len() as u64).min(size - t.offset).min(*budget) as usize;
        let Some(dst) = buf.get_mut(..want) else {
            return Ok(false);
        };
        let n = match t.file.read_at(dst, t.offset) {
            // Shrank since the fstat: the next pass sees the truncation.
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let chunk = &dst[..n];
        let old_len = t.backlog_end.saturating_sub(t.offset).min(n as u64) as usize;
        let (old, fresh) = chunk.split_at(old_len);
        if !old.is_empty() {
            delta.backlog.add(&t.counter.feed(old));
        }
        if !fresh.is_empty() {
            // A line begun in the backlog and finished here counts as new: it ended after start-up.
            delta.new.add(&t.counter.feed(fresh));
        }
        t.offset += n as u64;
        *budget = budget.saturating_sub(n as u64);
    }
    Ok(true)
}

/// A tracked file from a regular file opened below the root.
fn tracked_from(
    file: File,
    key: &ContainerKey,
    n: u32,
    path: &Path,
    backlog: bool,
) -> io::Result<Tracked> {
    // Identity and size from the handle itself, not the path, which may have changed since.
    let meta = file.metadata()?;
    Ok(Tracked {
        container: key.clone(),
        n,
        path: path.to_path_buf(),
        ino: meta.ino(),
        offset: 0,
        backlog_end: if backlog { meta.len() } else { 0 },
        counter: CriCounter::new(),
        file,
    })
}
