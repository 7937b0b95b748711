//! The pod log tree as the tailer lists it: `<namespace>_<pod>_<uid>/<container>/<N>.log`,
//! each level opened below the root without following symlinks, and the kubelet grammar of
//! the names.

use super::*;

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

impl LogTailer {
    /// Lists the tree. The flag is false when the root itself could not be listed.
    pub(super) fn scan(&mut self, errors: &mut Vec<ReadError>) -> (Scan, bool) {
        let mut scan = Scan::new();
        let root = match fsio::open_dir(&self.root) {
            Ok(fd) => fd,
            Err(e) if is_gone(&e) => return (scan, true),
            Err(e) => {
                errors.push(ReadError::io(&self.root, e));
                return (self.last_scan.clone(), false);
            }
        };
        let mut pods: Vec<(Vec<u8>, EntryKind)> = Vec::new();
        let listed = fsio::for_each_entry(root.as_fd(), |name, kind, _| {
            pods.push((name.to_vec(), kind));
        });
        if let Err(e) = listed {
            errors.push(ReadError::io(&self.root, e));
            return (self.last_scan.clone(), false);
        }
        for (raw, kind) in pods {
            let label = escape_name(&raw);
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
                raw: OsStr::from_bytes(&raw),
                namespace,
                pod,
                uid,
            };
            self.scan_pod(root.as_fd(), &pod_dir, &mut scan, errors);
        }
        (scan, true)
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
        let fd = match open_subdir(root, Path::new(p.raw)) {
            Ok(Some(fd)) => fd,
            Ok(None) => {
                // Replaced by a symlink since the listing.
                self.stats.skipped_symlink += 1;
                return;
            }
            // Deleted (or replaced by a file) between the two listings: the pod is gone.
            Err(e) if is_gone(&e) || e.raw_os_error() == Some(nix::libc::ENOTDIR) => return,
            Err(e) => {
                errors.push(ReadError::io(&pod_path, e));
                self.reuse_last(scan, same_pod);
                return;
            }
        };
        let mut containers: Vec<(Vec<u8>, EntryKind)> = Vec::new();
        if let Err(e) = fsio::for_each_entry(fd.as_fd(), |name, kind, _| {
            containers.push((name.to_vec(), kind));
        }) {
            errors.push(ReadError::io(&pod_path, e));
            self.reuse_last(scan, same_pod);
            return;
        }
        for (raw, kind) in containers {
            match kind {
                EntryKind::Dir => {}
                EntryKind::Symlink => {
                    self.stats.skipped_symlink += 1;
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
            let listed = match open_subdir(fd.as_fd(), Path::new(name)) {
                Ok(Some(dir)) => self.list_logs(dir.as_fd()),
                Ok(None) => {
                    self.stats.skipped_symlink += 1;
                    continue;
                }
                Err(e) => Err(e),
            };
            match listed {
                Ok(logs) => {
                    scan.insert(key, ContainerScan { rel, logs });
                }
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

    /// The regular `<N>.log` files of a container dir, sorted by N; other entries with such a
    /// name are counted as skipped. Only `(N, inode)` is kept per file, so a directory of
    /// 100,000 files costs 1.6 MB for the pass, and no descriptor.
    fn list_logs(&mut self, dir: BorrowedFd<'_>) -> io::Result<Vec<(u32, u64)>> {
        let mut logs = Vec::new();
        let stats = &mut self.stats;
        fsio::for_each_entry(dir, |name, kind, ino| {
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

/// `<namespace>_<pod>_<uid>`: namespace and pod are DNS-1123 names, which have no `_`.
pub(super) fn split_pod_dir(name: &str) -> Option<(&str, &str, &str)> {
    let mut parts = name.split('_');
    let namespace = parts.next()?;
    let pod = parts.next()?;
    let uid = parts.next()?;
    if parts.next().is_some() || namespace.is_empty() || pod.is_empty() || uid.is_empty() {
        return None;
    }
    Some((namespace, pod, uid))
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
