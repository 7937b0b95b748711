//! Incremental socket ownership. A full pass (readdir of every `/proc/<pid>/fd`, `fstatat` and a
//! `getxattr` per socket) is what the socket sampler cost; most of it re-reads what did not change.
//! Each tick this reads one `stat` of each pid's fd directory instead: on Linux 6.2+ `st_size` is
//! the number of open fds and `st_ino` is new for a new process on a reused pid (procfs makes a new
//! inode per task), so only pids whose (inode, count) changed are walked again, and `getxattr` is
//! called only for socket inodes not seen before. What both miss (an fd replaced by another, count
//! kept: `dup2`, close + open) is caught by re-walking every pid of 1/N of the pods each tick,
//! so no cached count is older than N ticks. Older kernels (st_size 0) walk everything every tick.
//! Each cached pid's fd directory is held open and `fstat`ed: no path walk, no `ptrace` access
//! check per tick (a quarter of the cost of `stat` by path), and a held directory of an exited
//! task fails with `ENOENT` even when its pid was reused.
//!
//! Attribution is kept too: each workload (by cgroup) keeps its distinct socket inodes and their
//! TCP/UDP totals, recomputed only when the (pid, list generation) set it is made of changed, and
//! an inode -> holders map resolves a socket held by several workloads (it counts for the first
//! in the tick's order, as a full pass counts it). The steady state is one `fstat` per pid and
//! nothing per socket. A tick where any pid's list is not cached (the bound, an old kernel, a
//! fixture tree) is attributed from the lists, per socket, as before, and the kept state rebuilt.

use super::sockets::{parse_proto_name, Proto};
use crate::error::ReadError;
use crate::model::SocketCounts;
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::{fstat, fstatat, stat, FileStat, SFlag};
use std::collections::HashMap;
use std::ffi::CStr;
use std::hash::{BuildHasherDefault, Hasher};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub use crate::config::DEFAULT_FULL_WALK_EVERY;

mod attribution;
mod procfd;
use attribution::{attribute, Kept, Known};
use procfd::{fd_count_in_size, fd_dir, itoa, push_error, socket_proto_at};

/// Socket inodes remembered (per-pid lists and the inode -> protocol map each hold at most this
/// many, ~40 bytes each): 131,072 is 5x the 110-pod bench node. Beyond it pids are walked every
/// tick, as before the cache, and `overflows_total` counts it.
pub const MAX_CACHED_SOCKETS: usize = 131_072;

/// Fd directories held open, at most (and at most 3/16 of the soft `RLIMIT_NOFILE`): 8x the
/// 110-pod bench node's pids. A pid beyond it is `stat`ed by path each tick (exact, slower) and
/// counted in `overflows_total`.
pub const MAX_HELD_DIRS: usize = 16_384;

/// Socket inode maps, rebuilt or probed once per socket per tick (~20,000 at 110 pods): a
/// multiplicative hash instead of SipHash. The keys are inode numbers the kernel hands out in
/// sequence (`get_next_ino`), not values a workload chooses, so flooding one bucket is not open
/// to it.
#[derive(Default, Clone, Copy)]
pub struct InoHasher(u64);

impl Hasher for InoHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

pub type InoMap<V> = HashMap<u64, V, BuildHasherDefault<InoHasher>>;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Pids walked / reused in the last pass.
    pub walked: u64,
    pub reused: u64,
    /// Socket inodes held by the cache after the last pass.
    pub entries: u64,
    /// Times a pid's sockets or a protocol were not cached because the bound was reached.
    pub overflows_total: u64,
    /// False when `st_size` of `/proc/<pid>/fd` is not the fd count (before Linux 6.2).
    pub incremental: bool,
}

struct PidEntry {
    dir_ino: u64,
    fds: i64,
    seen: u64,
    sockets: Vec<u64>,
    /// Changes whenever `sockets` does: the workloads made of this pid recompute then only.
    gen: u64,
    /// `/proc/<pid>/fd`, open (`None` beyond [`MAX_HELD_DIRS`]).
    dir: Option<OwnedFd>,
}

/// A pid counting for a workload this tick: its cached list (by generation), or, walked and not
/// cached, its sockets at `walked` in the tick's buffer.
struct Contrib {
    pid: u32,
    gen: u64,
    walked: Option<(usize, usize)>,
}

/// The per-tick result: counts by workload index, and socket inode -> the workload it counts for.
pub struct Attribution {
    pub counts: HashMap<usize, SocketCounts>,
    pub owner: InoMap<usize>,
    pub denied: Option<String>,
    /// Workloads with a pid whose fd table could not be read this tick: their counts are short
    /// of its sockets, so the signal keeps their last good value (stale) instead.
    pub failed: std::collections::HashSet<usize>,
}

pub struct SocketCache {
    proc_root: PathBuf,
    every: u32,
    max: usize,
    tick: u64,
    pids: HashMap<u32, PidEntry>,
    /// Socket inode -> protocol and kept holders; at most `max` entries.
    protos: InoMap<Known>,
    /// Rotation slot of each group (a pod uid, or a host workload's cgroup), dealt round-robin
    /// on first sight so the slots stay balanced.
    slots: HashMap<String, u32>,
    next_slot: u32,
    cached: usize,
    stats: CacheStats,
    /// Protocols of this tick's sockets beyond the bound (as many as the pass itself holds).
    spill: InoMap<Proto>,
    path: Vec<u8>,
    /// `proc_root`, open: new pids' fd directories are opened relative to it.
    proc: Option<OwnedFd>,
    held: usize,
    max_held: usize,
    next_gen: u64,
    /// Kept workloads (a slab, by id), their ids by key, free ids.
    wl: Vec<Option<Kept>>,
    wl_ids: HashMap<String, u32>,
    wl_free: Vec<u32>,
    /// Inodes held by more than one kept workload: which.
    shared: InoMap<Vec<u32>>,
    /// The kept state was dropped: protocols are pruned once it is rebuilt.
    rebuild: bool,
    union_buf: Vec<u64>,
    /// Inodes no kept workload held any more this tick.
    unheld: Vec<u64>,
    /// Build the inode -> workload map on incremental ticks (only the TCP states need it).
    want_owner: bool,
    /// Benchmarks: attribute every tick from the per-pid lists (the first rounds' pass).
    per_tick_only: bool,
    bufs: TickBufs,
    /// `getxattrat(2)` works here (cleared at its first refusal).
    xattrat: bool,
}

/// A tick's working vectors, kept for the next tick.
#[derive(Default)]
struct TickBufs {
    wids: Vec<u32>,
    held: Vec<u64>,
    contrib: Vec<Contrib>,
    starts: Vec<usize>,
    sockets: Vec<u64>,
}

impl SocketCache {
    pub fn new(proc_root: PathBuf, every: u32) -> Self {
        let incremental = fd_count_in_size(&proc_root);
        let proc_root_path = proc_root.clone();
        SocketCache {
            proc_root,
            every: every.max(1),
            max: MAX_CACHED_SOCKETS,
            tick: 0,
            pids: HashMap::new(),
            protos: InoMap::default(),
            slots: HashMap::new(),
            next_slot: 0,
            cached: 0,
            stats: CacheStats {
                incremental,
                ..CacheStats::default()
            },
            spill: InoMap::default(),
            path: Vec::with_capacity(64),
            proc: if incremental {
                crate::fsio::open_dir(&proc_root_path).ok()
            } else {
                None
            },
            held: 0,
            // Up to MAX_HELD_DIRS, and the socket pass's share of the fd limit.
            max_held: crate::fsio::FdHolder::Sockets.cap(MAX_HELD_DIRS),
            next_gen: 0,
            wl: Vec::new(),
            wl_ids: HashMap::new(),
            wl_free: Vec::new(),
            shared: InoMap::default(),
            rebuild: true,
            union_buf: Vec::new(),
            unheld: Vec::new(),
            want_owner: true,
            per_tick_only: false,
            bufs: TickBufs::default(),
            xattrat: true,
        }
    }

    /// Whether [`Attribution::owner`] is filled on incremental ticks (a per-socket map; the
    /// per-tick pass always fills it).
    pub fn with_owner(mut self, want: bool) -> Self {
        self.want_owner = want;
        self
    }

    /// Benchmarks: no kept totals, every tick attributed per socket from the per-pid lists.
    pub fn with_per_tick_attribution(mut self) -> Self {
        self.per_tick_only = true;
        self
    }

    /// Tests: a smaller bound.
    pub fn with_max(mut self, max: usize) -> Self {
        self.max = max;
        self
    }

    /// Tests: a smaller bound on held fd directories.
    pub fn with_max_held(mut self, max: usize) -> Self {
        self.max_held = max;
        self
    }

    /// Fd directories held open now.
    pub fn held_dirs(&self) -> usize {
        self.held
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// `pids[i]` are the pids of workload `i`, `groups[i]` its rotation group. A socket shared
    /// across workloads (inherited, or passed over a unix socket) counts once, for the first.
    /// Workloads are keyed by their index (tests); the agent keys them by cgroup
    /// ([`sample_keyed`](Self::sample_keyed)).
    pub fn sample(
        &mut self,
        groups: &[&str],
        pids: &[Vec<u32>],
        errors: &mut Vec<ReadError>,
    ) -> Attribution {
        let keys: Vec<String> = (0..pids.len()).map(|i| i.to_string()).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        self.sample_keyed(&keys, groups, pids, errors)
    }

    /// As [`sample`](Self::sample), `keys[i]` naming workload `i` from tick to tick: its distinct
    /// sockets and totals are kept and recomputed only when the (pid, socket list) set it is made
    /// of changed.
    pub fn sample_keyed(
        &mut self,
        keys: &[&str],
        groups: &[&str],
        pids: &[Vec<u32>],
        errors: &mut Vec<ReadError>,
    ) -> Attribution {
        self.tick += 1;
        let tick = self.tick;
        let phase = (tick % u64::from(self.every)) as u32;
        let mut denied = None;
        let mut failed = std::collections::HashSet::new();
        self.spill.clear();
        // Each workload's kept entry; a key seen twice, an old kernel or a fixture tree: the
        // whole tick is attributed from the per-pid lists, as a full pass.
        let mut per_tick = !self.stats.incremental || self.per_tick_only;
        // The tick's buffers, kept between ticks (cleared, not re-allocated at their peak each
        // tick: short-lived blocks of tens of KiB fragmented the heap).
        let mut wids = std::mem::take(&mut self.bufs.wids);
        let mut held = std::mem::take(&mut self.bufs.held);
        let mut contrib = std::mem::take(&mut self.bufs.contrib);
        let mut starts = std::mem::take(&mut self.bufs.starts);
        let mut tick_buf = std::mem::take(&mut self.bufs.sockets);
        wids.clear();
        contrib.clear();
        starts.clear();
        tick_buf.clear();
        if !per_tick {
            for i in 0..pids.len() {
                match self.wl_entry(keys.get(i).copied().unwrap_or(""), tick) {
                    Some(w) => wids.push(w),
                    None => {
                        per_tick = true;
                        break;
                    }
                }
            }
        }
        let (mut walked, mut reused) = (0u64, 0u64);
        // The pids that count this tick, in workload order (`contrib`): cached (by generation)
        // or walked and not cached (their sockets in `tick_buf`).
        for (i, ps) in pids.iter().enumerate() {
            starts.push(contrib.len());
            let group = groups.get(i).copied().unwrap_or("");
            let due = !self.stats.incremental || self.slot(group) == phase;
            for &pid in ps {
                let (st, opened) = if self.stats.incremental {
                    match self.fd_stat(pid) {
                        Ok(Some((st, opened))) => (Some(st), opened),
                        Ok(None) => continue,
                        Err(e) => {
                            push_error(&fd_dir(&self.proc_root, pid), e, errors, &mut denied);
                            failed.insert(i);
                            continue;
                        }
                    }
                } else {
                    (None, None)
                };
                if let (Some(st), false) = (st, due) {
                    if let Some(e) = self.pids.get_mut(&pid) {
                        if e.dir_ino == st.st_ino && e.fds == st.st_size {
                            e.seen = tick;
                            reused += 1;
                            contrib.push(Contrib {
                                pid,
                                gen: e.gen,
                                walked: None,
                            });
                            continue;
                        }
                    }
                }
                held.clear();
                let walk_from = opened
                    .as_ref()
                    .or_else(|| self.pids.get(&pid).and_then(|e| e.dir.as_ref()))
                    .map(|fd| fd.as_raw_fd());
                let dir = fd_dir(&self.proc_root, pid);
                match self.walk(walk_from, &dir, &mut held) {
                    Ok(true) => {}
                    Ok(false) => {
                        self.forget(pid);
                        continue;
                    }
                    Err(e) => {
                        if e.kind() == crate::error::ErrorKind::Permission {
                            denied = Some(e.to_string());
                        }
                        errors.push(e);
                        failed.insert(i);
                        continue;
                    }
                }
                walked += 1;
                let gen = st.and_then(|st| self.store(pid, st.st_ino, st.st_size, &held, opened));
                match gen {
                    Some(gen) => contrib.push(Contrib {
                        pid,
                        gen,
                        walked: None,
                    }),
                    None => {
                        let from = tick_buf.len();
                        tick_buf.extend_from_slice(&held);
                        contrib.push(Contrib {
                            pid,
                            gen: 0,
                            walked: Some((from, tick_buf.len())),
                        });
                        per_tick = true;
                    }
                }
            }
        }
        starts.push(contrib.len());
        let mut out = Attribution {
            counts: (0..pids.len())
                .map(|i| (i, SocketCounts::default()))
                .collect(),
            owner: InoMap::default(),
            denied,
            failed,
        };
        // Exited pids, closed sockets and gone pods leave the cache with the tick they vanish.
        let (mut cached, mut held_dirs) = (0, 0);
        self.pids.retain(|_, e| {
            let keep = e.seen == tick;
            if keep {
                cached += e.sockets.len();
                held_dirs += usize::from(e.dir.is_some());
            }
            keep
        });
        self.cached = cached;
        self.held = held_dirs;
        if per_tick {
            self.clear_kept();
            // Sized for this tick's sockets: no rehash while it fills.
            out.owner = InoMap::with_capacity_and_hasher(cached, Default::default());
            for (i, w) in starts.windows(2).enumerate() {
                for c in &contrib[w[0]..w[1]] {
                    let list = match c.walked {
                        Some((a, b)) => &tick_buf[a..b],
                        None => self.pids.get(&c.pid).map_or(&[][..], |e| &e.sockets),
                    };
                    attribute(i, list, &self.protos, &self.spill, &mut out);
                }
            }
            self.protos.retain(|ino, _| out.owner.contains_key(ino));
        } else {
            self.update_kept(&wids, &contrib, &starts, tick);
            self.resolve(&wids, &mut out);
        }
        self.spill = InoMap::default();
        let live: std::collections::HashSet<&str> = groups.iter().copied().collect();
        self.slots.retain(|g, _| live.contains(g.as_str()));
        self.stats.walked = walked;
        self.stats.reused = reused;
        self.stats.entries = self.protos.len() as u64;
        self.bufs = TickBufs {
            wids,
            held,
            contrib,
            starts,
            sockets: tick_buf,
        };
        out
    }

    /// The identity of `pid`'s task this tick: its fd directory's inode, when the pid was
    /// checked this tick (`None` otherwise). A held directory's `fstat` succeeding proves the
    /// task is the one first seen.
    pub fn task(&self, pid: u32) -> Option<u64> {
        self.pids
            .get(&pid)
            .filter(|e| e.seen == self.tick)
            .map(|e| e.dir_ino)
    }

    fn slot(&mut self, group: &str) -> u32 {
        if let Some(&s) = self.slots.get(group) {
            return s;
        }
        let s = self.next_slot % self.every;
        self.next_slot = self.next_slot.wrapping_add(1);
        self.slots.insert(group.to_owned(), s);
        s
    }

    /// `opened`: the pid's fd directory, opened this tick (to be held unless one is). The
    /// generation of the pid's list; `None` when it was not cached.
    fn store(
        &mut self,
        pid: u32,
        dir_ino: u64,
        fds: i64,
        sockets: &[u64],
        opened: Option<OwnedFd>,
    ) -> Option<u64> {
        let old = self.pids.get(&pid).map_or(0, |e| e.sockets.len());
        if self.cached - old + sockets.len() > self.max {
            // Not cached: walked again next tick, as without the cache.
            self.forget(pid);
            self.stats.overflows_total += 1;
            return None;
        }
        self.cached = self.cached - old + sockets.len();
        self.next_gen += 1;
        let next_gen = self.next_gen;
        let e = self.pids.entry(pid).or_insert_with(|| PidEntry {
            dir_ino,
            fds,
            seen: 0,
            sockets: Vec::new(),
            gen: next_gen,
            dir: None,
        });
        e.dir_ino = dir_ino;
        e.fds = fds;
        e.seen = self.tick;
        if e.sockets != sockets {
            e.sockets.clear();
            e.sockets.extend_from_slice(sockets);
            e.gen = next_gen;
        }
        let gen = e.gen;
        if e.dir.is_none() {
            if let Some(fd) = opened {
                if self.held < self.max_held {
                    e.dir = Some(fd);
                    self.held += 1;
                } else {
                    // Stat'ed by path each tick instead: exact, slower.
                    self.stats.overflows_total += 1;
                }
            }
        }
        Some(gen)
    }

    fn forget(&mut self, pid: u32) {
        if let Some(e) = self.pids.remove(&pid) {
            self.cached -= e.sockets.len();
            self.held -= usize::from(e.dir.is_some());
        }
    }

    /// The fd directory's inode and fd count, and the directory if it was opened for this
    /// (the pid is new, or beyond the bound); `Ok(None)`: the pid is gone. A held directory
    /// whose task exited is dropped and the pid looked up again (a reused pid is a new entry).
    fn fd_stat(&mut self, pid: u32) -> Result<Option<(FileStat, Option<OwnedFd>)>, Errno> {
        let mut unheld = false;
        if let Some(e) = self.pids.get(&pid) {
            match &e.dir {
                Some(fd) => match fstat(fd.as_raw_fd()) {
                    Ok(st) => return Ok(Some((st, None))),
                    Err(Errno::ENOENT | Errno::ESRCH) => self.forget(pid),
                    Err(e) => return Err(e),
                },
                None => unheld = true,
            }
        }
        let opened = match &self.proc {
            // Known and beyond the bound: by path, unless there is room again.
            _ if unheld && self.held >= self.max_held => None,
            Some(proc) => {
                let mut rel = itoa(pid);
                rel.extend_from_slice(b"/fd\0");
                let rel = CStr::from_bytes_with_nul(&rel).map_err(|_| Errno::EINVAL)?;
                // SAFETY: a NUL-terminated path relative to a directory fd we hold.
                let fd = unsafe {
                    nix::libc::openat(
                        proc.as_raw_fd(),
                        rel.as_ptr(),
                        nix::libc::O_RDONLY | nix::libc::O_DIRECTORY | nix::libc::O_CLOEXEC,
                    )
                };
                if fd < 0 {
                    match Errno::last() {
                        Errno::ENOENT | Errno::ESRCH => return Ok(None),
                        // Out of descriptors: stat'ed by path, not held.
                        Errno::EMFILE | Errno::ENFILE => None,
                        e => return Err(e),
                    }
                } else {
                    // SAFETY: a descriptor just returned by openat(2), owned by nobody else.
                    Some(unsafe { OwnedFd::from_raw_fd(fd) })
                }
            }
            None => None,
        };
        let st = match &opened {
            Some(fd) => fstat(fd.as_raw_fd()),
            None => stat(&fd_dir(&self.proc_root, pid)),
        };
        match st {
            Ok(st) => Ok(Some((st, opened))),
            Err(Errno::ENOENT | Errno::ESRCH) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Appends the socket inodes in `dir` (a `/proc/<pid>/fd`), learning the protocol of new
    /// ones. `Ok(false)`: the pid exited.
    /// `from`: the directory, held open: rewound and listed on that descriptor (no path walk, no
    /// second descriptor, no glibc `DIR` stream: `fsio::getdents`'s kept buffer).
    fn walk(
        &mut self,
        from: Option<std::os::fd::RawFd>,
        dir: &Path,
        out: &mut Vec<u64>,
    ) -> Result<bool, ReadError> {
        // The pid exited: its fd directory is gone.
        let gone = |e: &std::io::Error| {
            e.raw_os_error()
                .is_some_and(|n| matches!(Errno::from_raw(n), Errno::ENOENT | Errno::ESRCH))
        };
        let opened;
        let dfd = match from {
            // SAFETY: `from` is a descriptor this cache holds for the whole call.
            Some(fd) => unsafe { BorrowedFd::borrow_raw(fd) },
            None => {
                match crate::fsio::open_dir(dir) {
                    Ok(fd) => opened = fd,
                    Err(e) if gone(&e) => return Ok(false),
                    Err(e) => return Err(ReadError::io(dir, e)),
                }
                opened.as_fd()
            }
        };
        let listed = crate::fsio::rewind(dfd).and_then(|()| {
            crate::fsio::getdents(dfd, |name, _, _| {
                // Followed relative to the open directory; an fd closed since readdir is churn.
                let Ok(st) = fstatat(Some(dfd.as_raw_fd()), name, AtFlags::empty()) else {
                    return;
                };
                if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFSOCK.bits() {
                    return;
                }
                let ino = st.st_ino;
                if !self.protos.contains_key(&ino) && !self.spill.contains_key(&ino) {
                    let Some(proto) =
                        socket_proto_at(&mut self.xattrat, dfd, &mut self.path, dir, name)
                    else {
                        // Closed in between: not held any more.
                        return;
                    };
                    if self.protos.len() < self.max {
                        self.protos.insert(ino, Known::remembered(proto));
                    } else {
                        // Uncached: known for this tick only, asked again next tick.
                        self.stats.overflows_total += 1;
                        self.spill.insert(ino, proto);
                    }
                }
                out.push(ino);
            })
        });
        match listed {
            Ok(()) => Ok(true),
            Err(e) if gone(&e) => Ok(false),
            Err(e) => Err(ReadError::io(dir, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::OwnedFd;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    /// A child holding exactly one UDP socket (stdin) and one TCP listener (stdout): the test
    /// process's own fds change under the tests running beside this one.
    /// Our own child, stopped and reaped however the test ends.
    struct Holder(std::process::Child);

    impl Drop for Holder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn holder() -> Holder {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        holding(OwnedFd::from(udp), OwnedFd::from(tcp))
    }

    /// A child holding `udp` as stdin and `tcp` as stdout.
    fn holding(udp: OwnedFd, tcp: OwnedFd) -> Holder {
        let child = Holder(
            Command::new("sleep")
                .arg("60")
                .stdin(Stdio::from(udp))
                .stdout(Stdio::from(tcp))
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        // Settled once it sleeps with the same fds twice (the loader and locale setup open
        // files; the harness may pass fds of its own down).
        let stat = format!("/proc/{}/stat", child.0.id());
        let mut last = None;
        for _ in 0..500 {
            let s = std::fs::read_to_string(&stat).unwrap_or_default();
            let fds =
                std::fs::read_dir(format!("/proc/{}/fd", child.0.id())).map_or(0, |d| d.count());
            if s.contains(") S ") && last == Some(fds) {
                return child;
            }
            last = Some(fds);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("sleep never settled: {stat}");
    }

    /// A pid whose fd table cannot be read (here: not a directory) marks its workload failed,
    /// so the signal keeps the last good count instead of a short one; the others are not.
    #[test]
    fn an_unreadable_fd_table_marks_its_workload_failed() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("10/fd")).unwrap();
        std::fs::create_dir_all(root.path().join("20")).unwrap();
        std::fs::write(root.path().join("20/fd"), "").unwrap();
        let mut cache = SocketCache::new(root.path().to_path_buf(), 3);
        let mut errors = Vec::new();
        let a = cache.sample(&["a", "b"], &[vec![10], vec![10, 20]], &mut errors);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(a.failed, [1].into_iter().collect());
    }

    fn pass(cache: &mut SocketCache, pid: u32) -> ((u64, u64), CacheStats) {
        let mut errors = Vec::new();
        let a = cache.sample(&["pod"], &[vec![pid]], &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        let c = &a.counts[&0];
        ((c.tcp, c.udp), cache.stats())
    }

    #[test]
    fn unchanged_pids_are_reused_and_every_group_is_walked_every_n_ticks() {
        let mut child = holder();
        let pid = child.0.id();
        let mut cache = SocketCache::new("/proc".into(), 3);
        assert!(
            cache.stats().incremental,
            "Linux 6.2+ expected on the test machines"
        );
        // The one group gets slot 0: walked on ticks 3, 6 (tick % 3 == 0), reused otherwise,
        // apart from the first pass, which knows nothing yet.
        let mut walks = Vec::new();
        for t in 1..=6 {
            let (c, s) = pass(&mut cache, pid);
            assert_eq!(c, (1, 1), "tick {t}");
            assert_eq!(s.walked + s.reused, 1, "tick {t}");
            if s.walked == 1 {
                walks.push(t);
            }
            assert_eq!(s.entries, 2, "tick {t}");
        }
        assert_eq!(walks, vec![1, 3, 6]);
        child.0.kill().unwrap();
        child.0.wait().unwrap();
        // An exited pid leaves nothing behind and counts nothing.
        let (c, s) = pass(&mut cache, pid);
        assert_eq!((c, s.walked, s.reused, s.entries), ((0, 0), 0, 0, 0));
    }

    #[test]
    fn the_bound_keeps_pids_uncached_but_counted() {
        let child = holder();
        let mut cache = SocketCache::new("/proc".into(), 1000).with_max(0);
        for _ in 0..2 {
            let (c, s) = pass(&mut cache, child.0.id());
            assert_eq!((c, s.walked, s.reused, s.entries), ((1, 1), 1, 0, 0));
        }
        // Two protocols and one pid list refused per pass.
        assert_eq!(cache.stats().overflows_total, 6);
    }

    #[test]
    fn fd_directories_are_held_up_to_the_bound_and_let_go_with_the_pid() {
        let a = holder();
        let b = holder();
        let mut cache = SocketCache::new("/proc".into(), 1000).with_max_held(1);
        let mut errors = Vec::new();
        for t in 0..3 {
            let at = cache.sample(&["pod"], &[vec![a.0.id(), b.0.id()]], &mut errors);
            assert!(errors.is_empty(), "{errors:?}");
            assert_eq!((at.counts[&0].tcp, at.counts[&0].udp), (2, 2), "tick {t}");
            assert_eq!(cache.held_dirs(), 1, "tick {t}");
            // The second pid is reused all the same, stat'ed by path.
            if t > 0 {
                assert_eq!((cache.stats().walked, cache.stats().reused), (0, 2));
            }
        }
        // Refused once, when it was stored.
        assert_eq!(cache.stats().overflows_total, 1);
        drop(a);
        let at = cache.sample(&["pod"], &[vec![b.0.id()]], &mut errors);
        assert_eq!((at.counts[&0].tcp, at.counts[&0].udp), (1, 1));
        assert_eq!(cache.held_dirs(), 0, "the exited pid's directory is closed");
    }

    /// The kept per-workload totals against the per-tick pass (`with_max(0)`: nothing cached) on
    /// the same ticks: a socket two pids of one workload hold counts once, one held across
    /// workloads for the first of them in this tick's order, whichever order and set of workloads.
    #[test]
    fn kept_totals_count_shared_sockets_as_the_per_tick_pass_does() {
        let shared = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tcp = || OwnedFd::from(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
        let a = holding(OwnedFd::from(shared.try_clone().unwrap()), tcp());
        let b = holding(OwnedFd::from(shared.try_clone().unwrap()), tcp());
        drop(shared);
        let c = holder();
        let (a, b, c) = (a.0.id(), b.0.id(), c.0.id());
        let mut kept = SocketCache::new("/proc".into(), 1000);
        let mut full = SocketCache::new("/proc".into(), 1000).with_max(0);
        // (keys, pids by workload, (tcp, udp) by workload)
        type Tick<'a> = (Vec<&'a str>, Vec<Vec<u32>>, Vec<(u64, u64)>);
        let ticks: Vec<Tick> = vec![
            (
                vec!["x", "y"],
                vec![vec![a, b], vec![c]],
                vec![(2, 1), (1, 1)],
            ),
            // Reused: the same again.
            (
                vec!["x", "y"],
                vec![vec![a, b], vec![c]],
                vec![(2, 1), (1, 1)],
            ),
            (vec!["x", "y"], vec![vec![a], vec![b]], vec![(1, 1), (1, 0)]),
            (vec!["y", "x"], vec![vec![b], vec![a]], vec![(1, 1), (1, 0)]),
            (vec!["x"], vec![vec![a]], vec![(1, 1)]),
            (
                vec!["y", "x"],
                vec![vec![b, c], vec![a]],
                vec![(2, 2), (1, 0)],
            ),
        ];
        for (t, (keys, pids, want)) in ticks.iter().enumerate() {
            let (mut e1, mut e2) = (Vec::new(), Vec::new());
            let groups = keys.clone();
            let k = kept.sample_keyed(keys, &groups, pids, &mut e1);
            let f = full.sample_keyed(keys, &groups, pids, &mut e2);
            assert!(e1.is_empty() && e2.is_empty(), "{e1:?} {e2:?}");
            let got = |at: &Attribution| -> Vec<(u64, u64)> {
                (0..pids.len())
                    .map(|i| (at.counts[&i].tcp, at.counts[&i].udp))
                    .collect()
            };
            assert_eq!(got(&k), *want, "tick {t}");
            assert_eq!(got(&f), *want, "tick {t}, per-tick pass");
            assert_eq!(k.owner, f.owner, "tick {t}");
            // Nothing changes on disk: only pids not listed the tick before are walked (b and c
            // left with workload y on tick 4).
            let walked = match t {
                0 => 3,
                5 => 2,
                _ => 0,
            };
            assert_eq!(kept.stats().walked, walked, "tick {t}");
        }
        assert_eq!(kept.stats().overflows_total, 0);
    }

    /// The pass's CPU per tick with kept totals against the per-tick attribution, on the same
    /// 1,980 processes (10 sockets each, 220 workloads of 9: the 110-pod bench node's shape),
    /// 60 ticks, rotation 1/12. Run alone (children inherit the sockets made for them):
    /// `cargo test --release --lib kept_totals_cost -- --ignored --nocapture --exact ...`.
    #[test]
    #[ignore]
    fn kept_totals_cost() {
        let mut kids = Vec::new();
        for _ in 0..1980 {
            // Without SOCK_CLOEXEC: inherited by the next child only, closed here after.
            let fds: Vec<OwnedFd> = (0..10)
                .map(|_| {
                    // SAFETY: socket(2) returns a new descriptor or -1.
                    let fd =
                        unsafe { nix::libc::socket(nix::libc::AF_INET, nix::libc::SOCK_DGRAM, 0) };
                    assert!(fd >= 0);
                    // SAFETY: just returned, owned by nobody else.
                    unsafe { OwnedFd::from_raw_fd(fd) }
                })
                .collect();
            let child = Command::new("sleep")
                .arg("300")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            drop(fds);
            kids.push(Holder(child));
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        let pids: Vec<Vec<u32>> = kids
            .chunks(9)
            .map(|c| c.iter().map(|h| h.0.id()).collect())
            .collect();
        let names: Vec<String> = (0..pids.len()).map(|i| format!("w{i}")).collect();
        let keys: Vec<&str> = names.iter().map(String::as_str).collect();
        // Interleaved tick by tick, so the machine's load moves both alike.
        let mut caches = [
            (
                "per-tick attribution",
                SocketCache::new("/proc".into(), 12).with_per_tick_attribution(),
                Duration::ZERO,
            ),
            (
                "kept totals",
                SocketCache::new("/proc".into(), 12).with_owner(false),
                Duration::ZERO,
            ),
        ];
        let mut errors = Vec::new();
        for t in 0..132 {
            for (_, cache, cpu) in caches.iter_mut() {
                let t0 = crate::sample::health::thread_cpu();
                let a = cache.sample_keyed(&keys, &keys, &pids, &mut errors);
                if t >= 12 {
                    *cpu += crate::sample::health::thread_cpu().saturating_sub(t0);
                }
                let counted: u64 = a.counts.values().map(|c| c.tcp + c.udp).sum();
                assert_eq!(counted, 19_800);
            }
        }
        assert!(errors.is_empty(), "{errors:?}");
        for (label, cache, cpu) in &caches {
            let s = cache.stats();
            println!(
                "{label}: {:?} per tick (walked {} reused {})",
                *cpu / 120,
                s.walked,
                s.reused
            );
        }
    }

    /// The inode map's entries stay 16 bytes (its buckets are ~40 % of the pass's memory), and
    /// the packed protocol and holder count read back.
    #[test]
    fn known_entries_are_16_bytes_and_keep_protocol_and_count() {
        assert_eq!(std::mem::size_of::<(u64, Known)>(), 16);
        for proto in [Proto::Tcp, Proto::Udp, Proto::Other] {
            let mut k = Known::remembered(proto);
            assert_eq!((k.proto(), k.n()), (proto, 0));
            k.set_n(3);
            k.set_n(k.n() - 1);
            assert_eq!((k.proto(), k.n()), (proto, 2));
        }
    }

    /// The protocol read relative to the fd directory is the one read by path, and a refused
    /// `getxattrat` (`at` cleared) still answers, by path.
    #[test]
    fn socket_protocols_by_getxattrat_and_by_path_agree() {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dir = fd_dir(Path::new("/proc"), std::process::id());
        let dfd = crate::fsio::open_dir(&dir).unwrap();
        let mut buf = Vec::new();
        for (fd, want) in [(udp.as_raw_fd(), Proto::Udp), (tcp.as_raw_fd(), Proto::Tcp)] {
            let name = std::ffi::CString::new(fd.to_string()).unwrap();
            let by_path = procfd::socket_proto(&mut buf, &dir, &name);
            let mut at = true;
            let by_at = socket_proto_at(&mut at, dfd.as_fd(), &mut buf, &dir, &name);
            assert_eq!((by_path, by_at), (Some(want), Some(want)));
            if !at {
                // qemu-user (the unprivileged aarch64 run) answers ENOSYS for syscalls it does
                // not know; as root or under CI the machine is a real 6.13+ kernel.
                let must = nix::unistd::geteuid().is_root() || std::env::var_os("CI").is_some();
                assert!(
                    !must,
                    "getxattrat refused: Linux 6.13+ expected as root or under CI"
                );
                println!("SKIP: getxattrat refused here (kernel before 6.13, or qemu-user): only the by-path answer was checked");
            }
            let mut refused = false;
            let without = socket_proto_at(&mut refused, dfd.as_fd(), &mut buf, &dir, &name);
            assert_eq!(without, Some(want));
        }
        // Closed in between: nothing, either way.
        let mut at = true;
        let gone = socket_proto_at(&mut at, dfd.as_fd(), &mut buf, &dir, c"999999");
        assert_eq!(gone, None);
    }

    #[test]
    fn itoa_writes_decimal() {
        for n in [0u32, 7, 10, 4_194_304, u32::MAX] {
            assert_eq!(itoa(n), n.to_string().into_bytes());
        }
    }

    #[test]
    fn a_fixture_tree_is_walked_in_full() {
        let dir = tempfile::tempdir().unwrap();
        let cache = SocketCache::new(dir.path().into(), 12);
        assert!(!cache.stats().incremental);
    }

    #[test]
    fn slots_are_dealt_round_robin() {
        let mut cache = SocketCache::new("/proc".into(), 3);
        let s: Vec<u32> = ["a", "b", "c", "d", "a"]
            .iter()
            .map(|g| cache.slot(g))
            .collect();
        assert_eq!(s, vec![0, 1, 2, 0, 0]);
    }
}
