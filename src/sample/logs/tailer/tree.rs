//! The pod log tree as the tailer lists it: `<namespace>_<pod>_<uid>/<container>/<N>.log`,
//! each level opened below the root without following symlinks, and the kubelet grammar of
//! the names.

use super::*;
pub(super) use crate::discover::names::split_pod_dir;
use crate::discover::names::PodLogListing;
use std::os::fd::AsRawFd;

/// A container as found on disk. Ordered by workload id first so the output is sorted by id; the
/// uid separates a recreated pod of the same name whose old directory is still there. Names are
/// [`escape_name`]d, so distinct directories never share a key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct ContainerKey {
    pub(super) id: WorkloadId,
    pub(super) pod_uid: String,
}

#[derive(Debug, Clone)]
pub(super) struct ContainerScan {
    /// `<pod dir>/<container dir>` as on disk, relative to the root.
    pub(super) rel: PathBuf,
    /// `(N, inode)` of each regular `<N>.log`, sorted by N: the last one is the current file.
    pub(super) logs: Vec<(u32, u64)>,
}

pub(super) type Scan = BTreeMap<ContainerKey, ContainerScan>;

/// A directory's identity and last change, from `fstatat` without following a symlink. Adding,
/// removing or renaming an entry updates the directory's mtime and ctime (POSIX) and, on most
/// filesystems, its size or link count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stamp {
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    size: i64,
    nlink: u64,
}

/// A directory's last listing, reused while its [`Stamp`] stays the same, with what that listing
/// counted as skipped (the skips are gauges of each pass, so a reused listing counts them again).
#[derive(Debug, Clone)]
pub(super) struct DirMemo<T> {
    stamp: Stamp,
    entries: T,
    symlinks: usize,
    not_regular: usize,
    /// The pass that last used it; memos of directories no pass lists any more are dropped.
    pass: u64,
}

/// How long a directory must have been unchanged when it was listed for the listing to be
/// reused: a change within the same timestamp granule as the listed one (the kernel's coarse
/// clock, a jiffy; up to 2 s on some filesystems) could leave the stamp as it was.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// A pod dir's entries worth looking at: container dirs and symlinks (counted), raw names.
type Entries = Vec<(Vec<u8>, EntryKind)>;

/// Memos of the pod dirs (by raw name) and container dirs (by path below the root).
#[derive(Debug, Default)]
pub(super) struct TreeMemo {
    pods: HashMap<Vec<u8>, DirMemo<Entries>>,
    containers: HashMap<PathBuf, DirMemo<Vec<(u32, u64)>>>,
    pass: u64,
    /// Wall-clock time of this pass: filesystem timestamps are wall-clock, whatever clock the
    /// agent runs on.
    now: Option<std::time::SystemTime>,
    /// Directories listed and reused by the last pass.
    pub(super) listed: usize,
    pub(super) reused: usize,
    /// [`SETTLE`] unless set (tests).
    pub(super) settle: Option<std::time::Duration>,
}

impl TreeMemo {
    fn begin(&mut self) {
        self.pass += 1;
        self.now = Some(std::time::SystemTime::now());
        self.listed = 0;
        self.reused = 0;
    }

    fn finish(&mut self) {
        let pass = self.pass;
        self.pods.retain(|_, m| m.pass == pass);
        self.containers.retain(|_, m| m.pass == pass);
    }

    /// Whether a listing taken now of a directory with this stamp may be reused later.
    fn settled(&self, st: &Stamp) -> bool {
        let settle = self.settle.unwrap_or(SETTLE);
        let Some(limit) = self.now.and_then(|n| n.checked_sub(settle)) else {
            return false;
        };
        let Ok(limit) = limit.duration_since(std::time::UNIX_EPOCH) else {
            return false;
        };
        let limit = (limit.as_secs() as i64, i64::from(limit.subsec_nanos()));
        st.mtime <= limit && st.ctime <= limit
    }
}

/// The stamp of `rel` below `dir`, not following a final symlink; `Ok(None)` when it is one.
fn stamp_at(dir: BorrowedFd<'_>, rel: &Path) -> io::Result<Option<(Stamp, bool)>> {
    use nix::sys::stat::fstatat;
    let st = fstatat(
        Some(dir.as_raw_fd()),
        rel,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )?;
    let fmt = st.st_mode & nix::libc::S_IFMT;
    if fmt == nix::libc::S_IFLNK {
        return Ok(None);
    }
    Ok(Some((
        Stamp {
            ino: st.st_ino,
            mtime: (st.st_mtime, st.st_mtime_nsec),
            ctime: (st.st_ctime, st.st_ctime_nsec),
            size: st.st_size,
            nlink: st.st_nlink as u64,
        },
        fmt == nix::libc::S_IFDIR,
    )))
}

impl LogTailer {
    /// Lists the tree: the root from `listing` when it is of this root (discovery's, made once
    /// per tick), else listed here; a pod or container dir whose stamp is unchanged since a
    /// settled listing is not listed again. The flag is false when the root itself could not be
    /// listed. The root's descriptor comes back for the opens that follow.
    pub(super) fn scan(
        &mut self,
        listing: Option<&PodLogListing>,
        errors: &mut Vec<ReadError>,
    ) -> (Scan, bool, Option<OwnedFd>) {
        let mut scan = Scan::new();
        let own;
        let listing = match listing.filter(|l| l.root() == self.root) {
            Some(l) => l,
            None => {
                own = PodLogListing::list(&self.root);
                &own
            }
        };
        let pods = match listing.entries() {
            Ok(p) => p,
            Err(e) => {
                errors.push(e);
                return (self.last_scan.clone(), false, None);
            }
        };
        let root = match fsio::open_dir(&self.root) {
            Ok(fd) => fd,
            Err(e) if is_gone(&e) => return (scan, true, None),
            Err(e) => {
                errors.push(ReadError::io(&self.root, e));
                return (self.last_scan.clone(), false, None);
            }
        };
        self.memo.begin();
        for (raw, kind) in pods {
            let label = escape_name(raw);
            let Some((namespace, pod, uid)) = split_pod_dir(&label) else {
                continue;
            };
            match kind {
                EntryKind::Dir => {}
                EntryKind::Symlink => {
                    self.stats.skipped_symlink += 1;
                    continue;
                }
                EntryKind::File | EntryKind::Other => continue,
            }
            let pod_dir = PodDir {
                raw: OsStr::from_bytes(raw),
                namespace,
                pod,
                uid,
            };
            self.scan_pod(root.as_fd(), &pod_dir, &mut scan, errors);
        }
        self.memo.finish();
        (scan, true, Some(root))
    }

    /// The container dirs of a pod dir: its memo while the stamp holds, else listed (and
    /// memoised). `Err(None)`: the pod is gone or not a directory (or a symlink, counted).
    fn pod_entries(
        &mut self,
        root: BorrowedFd<'_>,
        p: &PodDir<'_>,
    ) -> Result<(Entries, Option<fsio::Listed>), Option<io::Error>> {
        let raw = p.raw.as_bytes();
        let stamp = match stamp_at(root, Path::new(p.raw)) {
            Ok(Some((st, true))) => Some(st),
            Ok(Some((_, false))) => return Err(None),
            Ok(None) => {
                self.stats.skipped_symlink += 1;
                return Err(None);
            }
            Err(e) if is_gone(&e) || e.raw_os_error() == Some(nix::libc::ENOTDIR) => {
                return Err(None)
            }
            // Listed the usual way, which reports the error.
            Err(_) => None,
        };
        let pass = self.memo.pass;
        if let (Some(st), Some(m)) = (stamp, self.memo.pods.get_mut(raw)) {
            if m.stamp == st {
                m.pass = pass;
                self.stats.skipped_symlink += m.symlinks;
                self.memo.reused += 1;
                return Ok((m.entries.clone(), None));
            }
        }
        let fd = match open_subdir(root, Path::new(p.raw)) {
            Ok(Some(fd)) => fd,
            Ok(None) => {
                // Replaced by a symlink since the listing.
                self.stats.skipped_symlink += 1;
                return Err(None);
            }
            // Deleted (or replaced by a file) between the two listings: the pod is gone.
            Err(e) if is_gone(&e) || e.raw_os_error() == Some(nix::libc::ENOTDIR) => {
                return Err(None)
            }
            Err(e) => return Err(Some(e)),
        };
        let mut containers: Entries = Vec::new();
        let fd = fsio::list_into(fd, |name, kind, _| {
            if matches!(kind, EntryKind::Dir | EntryKind::Symlink) {
                containers.push((name.to_vec(), kind));
            }
        })
        .map_err(Some)?;
        self.memo.listed += 1;
        if let Some(st) = stamp.filter(|st| self.memo.settled(st)) {
            let symlinks = containers
                .iter()
                .filter(|(_, k)| *k == EntryKind::Symlink)
                .count();
            self.memo.pods.insert(
                raw.to_vec(),
                DirMemo {
                    stamp: st,
                    entries: containers.clone(),
                    symlinks: 0,
                    not_regular: 0,
                    pass,
                },
            );
            // Counted below, when each entry is looked at; a reused memo counts them itself.
            if let Some(m) = self.memo.pods.get_mut(raw) {
                m.symlinks = symlinks;
            }
        }
        Ok((containers, Some(fd)))
    }

    fn scan_pod(
        &mut self,
        root: BorrowedFd<'_>,
        p: &PodDir<'_>,
        scan: &mut Scan,
        errors: &mut Vec<ReadError>,
    ) {
        let same_pod = |k: &ContainerKey| {
            k.id.namespace == p.namespace && k.id.pod == p.pod && k.pod_uid == p.uid
        };
        let pod_path = self.root.join(p.raw);
        let (containers, pod_fd) = match self.pod_entries(root, p) {
            Ok(v) => v,
            Err(None) => return,
            Err(Some(e)) => {
                errors.push(ReadError::io(&pod_path, e));
                self.reuse_last(scan, same_pod);
                return;
            }
        };
        for (raw, kind) in containers {
            match kind {
                EntryKind::Dir => {}
                EntryKind::Symlink => {
                    // A memo's symlinks were counted with it.
                    if pod_fd.is_some() {
                        self.stats.skipped_symlink += 1;
                    }
                    continue;
                }
                EntryKind::File | EntryKind::Other => continue,
            }
            let name = OsStr::from_bytes(&raw);
            let key = ContainerKey {
                id: WorkloadId::container(p.namespace, p.pod, &escape_name(&raw)),
                pod_uid: p.uid.to_owned(),
            };
            let rel = Path::new(p.raw).join(name);
            let listed = match &pod_fd {
                Some(fd) => self.container_logs(fd.as_fd(), Path::new(name), &rel),
                None => self.container_logs(root, &rel, &rel),
            };
            match listed {
                Ok(Some(logs)) => {
                    scan.insert(key, ContainerScan { rel, logs });
                }
                Ok(None) => {}
                Err(e) if is_gone(&e) || e.raw_os_error() == Some(nix::libc::ENOTDIR) => {}
                Err(e) => {
                    errors.push(ReadError::io(&self.root.join(&rel), e));
                    let last = self.last_scan.get(&key).cloned();
                    scan.insert(
                        key,
                        last.unwrap_or(ContainerScan {
                            rel,
                            logs: Vec::new(),
                        }),
                    );
                }
            }
        }
    }

    /// A container dir's logs (`at` names it below `dir`; `rel` below the root, the memo's key):
    /// its memo while the stamp holds, else listed. `Ok(None)`: it is (now) a symlink, counted.
    fn container_logs(
        &mut self,
        dir: BorrowedFd<'_>,
        at: &Path,
        rel: &Path,
    ) -> io::Result<Option<Vec<(u32, u64)>>> {
        let stamp = match stamp_at(dir, at) {
            Ok(Some((st, true))) => Some(st),
            Ok(Some((_, false))) => return Err(io::Error::from_raw_os_error(nix::libc::ENOTDIR)),
            Ok(None) => {
                self.stats.skipped_symlink += 1;
                return Ok(None);
            }
            Err(e) if is_gone(&e) => return Err(e),
            Err(_) => None,
        };
        let pass = self.memo.pass;
        if let (Some(st), Some(m)) = (stamp, self.memo.containers.get_mut(rel)) {
            if m.stamp == st {
                m.pass = pass;
                self.stats.skipped_symlink += m.symlinks;
                self.stats.skipped_not_regular += m.not_regular;
                self.memo.reused += 1;
                return Ok(Some(m.entries.clone()));
            }
        }
        let Some(fd) = open_subdir(dir, at)? else {
            self.stats.skipped_symlink += 1;
            return Ok(None);
        };
        let before = self.stats;
        let logs = self.list_logs(fd)?;
        self.memo.listed += 1;
        if let Some(st) = stamp.filter(|st| self.memo.settled(st)) {
            self.memo.containers.insert(
                rel.to_path_buf(),
                DirMemo {
                    stamp: st,
                    entries: logs.clone(),
                    symlinks: self.stats.skipped_symlink - before.skipped_symlink,
                    not_regular: self.stats.skipped_not_regular - before.skipped_not_regular,
                    pass,
                },
            );
        }
        Ok(Some(logs))
    }

    /// The regular `<N>.log` files of a container dir, sorted by N; other entries with such a
    /// name are counted as skipped. Only `(N, inode)` is kept per file, so a directory of
    /// 100,000 files costs 1.6 MB for the pass, and no descriptor.
    fn list_logs(&mut self, dir: OwnedFd) -> io::Result<Vec<(u32, u64)>> {
        let mut logs = Vec::new();
        let stats = &mut self.stats;
        fsio::list_into(dir, |name, kind, ino| {
            let Some(n) = std::str::from_utf8(name).ok().and_then(restart_number) else {
                return;
            };
            match kind {
                EntryKind::File => logs.push((n, ino)),
                EntryKind::Symlink => stats.skipped_symlink += 1,
                EntryKind::Dir | EntryKind::Other => stats.skipped_not_regular += 1,
            }
        })?;
        logs.sort_unstable();
        Ok(logs)
    }

    pub(super) fn reuse_last(&self, scan: &mut Scan, keep: impl Fn(&ContainerKey) -> bool) {
        for (key, cs) in &self.last_scan {
            if keep(key) {
                scan.insert(key.clone(), cs.clone());
            }
        }
    }
}

/// A pod directory entry: its name as on disk and the parts of its escaped form.
pub(super) struct PodDir<'a> {
    raw: &'a OsStr,
    namespace: &'a str,
    pod: &'a str,
    uid: &'a str,
}

/// Opens a directory entry below `dir`; `Ok(None)` when it is (now) a symlink.
pub(super) fn open_subdir(dir: BorrowedFd<'_>, name: &Path) -> io::Result<Option<OwnedFd>> {
    match fsio::open_beneath(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
        Ok(fd) => Ok(Some(fd)),
        Err(e) if is_refused_link(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `<digits>.log` as kubelet writes it (`%d.log`: no leading zero, so one N has one name) ->
/// the restart number; rotated (`N.log.<ts>`, `.gz`) and other names -> None.
pub(super) fn restart_number(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".log")?;
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    digits.parse().ok()
}
