//! Names for kubelet cgroups without an API server: the pod log tree and the container log links.
//!
//! `/var/log/pods/<namespace>_<pod>_<uid>/` gives a pod uid its namespace and name;
//! `/var/log/containers/<pod>_<namespace>_<container>-<id>.log` gives a container id its name.

use crate::error::ReadError;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodName {
    pub namespace: String,
    pub pod: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerName {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// Pure: the kubelet grammar of a pod log dir, `<namespace>_<pod>_<uid>` -> its three parts
/// (names are DNS-1123, so `_` only separates). The one grammar discovery and the tailer use.
pub fn split_pod_dir(name: &str) -> Option<(&str, &str, &str)> {
    let mut it = name.splitn(3, '_');
    let (ns, pod, uid) = (it.next()?, it.next()?, it.next()?);
    if ns.is_empty() || pod.is_empty() || uid.is_empty() || uid.contains('_') {
        return None;
    }
    Some((ns, pod, uid))
}

/// Pure: a pod log dir's name -> the pod's name and its uid.
pub fn parse_pod_dir(name: &str) -> Option<(PodName, &str)> {
    let (ns, pod, uid) = split_pod_dir(name)?;
    Some((
        PodName {
            namespace: ns.to_owned(),
            pod: pod.to_owned(),
        },
        uid,
    ))
}

/// Pure: `<pod>_<namespace>_<container>-<id>.log` -> (name, id).
pub fn parse_container_link(name: &str) -> Option<(ContainerName, &str)> {
    let stem = name.strip_suffix(".log")?;
    let (rest, id) = stem.rsplit_once('-')?;
    let mut it = rest.splitn(3, '_');
    let (pod, ns, container) = (it.next()?, it.next()?, it.next()?);
    if [pod, ns, container, id].iter().any(|s| s.is_empty()) || container.contains('_') {
        return None;
    }
    Some((
        ContainerName {
            namespace: ns.to_owned(),
            pod: pod.to_owned(),
            container: container.to_owned(),
        },
        id,
    ))
}

/// The name index, rebuilt each tick from two directory listings (no file is opened).
#[derive(Debug, Default)]
pub struct NameIndex {
    pub pods: HashMap<String, PodName>,
    pub containers: HashMap<String, ContainerName>,
    /// Entries of either directory whose name is not UTF-8: kubelet writes only DNS-1123 names,
    /// so they name nothing, but they are counted rather than ignored silently.
    pub non_utf8_names: usize,
}

#[derive(Debug, Clone)]
pub struct NameSource {
    pod_logs: PathBuf,
    container_logs: PathBuf,
}

impl NameSource {
    pub fn new(pod_logs: PathBuf, container_logs: PathBuf) -> Self {
        NameSource {
            pod_logs,
            container_logs,
        }
    }

    /// Lists the pod log root and builds the index from it.
    pub fn load(&self) -> Result<NameIndex, ReadError> {
        self.index(&self.list_pods())
    }

    /// The pod log root's entries, listed once per tick for discovery and the tailer.
    pub fn list_pods(&self) -> PodLogListing {
        PodLogListing::list(&self.pod_logs)
    }

    /// The index from a listing of the pod log root and a listing of the container log links.
    pub fn index(&self, pods: &PodLogListing) -> Result<NameIndex, ReadError> {
        let mut index = NameIndex::default();
        for (raw, _) in pods.entries()? {
            match std::str::from_utf8(raw) {
                Ok(name) => {
                    if let Some((pod, uid)) = parse_pod_dir(name) {
                        index.pods.insert(uid.to_owned(), pod);
                    }
                }
                Err(_) => index.non_utf8_names += 1,
            }
        }
        // Only the link names are read: a link is never followed, wherever it points.
        for name in list_dir(&self.container_logs, &mut index.non_utf8_names)? {
            if let Some((c, id)) = parse_container_link(&name) {
                index.containers.insert(id.to_owned(), c);
            }
        }
        Ok(index)
    }
}

impl NameSource {
    /// The container-name directories of a pod's log dir (`<namespace>_<pod>_<uid>/<name>/`),
    /// opened below `pod_logs` without following a symlink; a missing pod dir is empty.
    pub fn container_dirs(&self, pod: &PodName, uid: &str) -> Result<Vec<String>, ReadError> {
        use crate::fsio::{self, EntryKind};
        let root = match fsio::open_dir(&self.pod_logs) {
            Ok(fd) => fd,
            Err(e) if fsio::is_gone(&e) => return Ok(Vec::new()),
            Err(e) => return Err(ReadError::io(&self.pod_logs, e)),
        };
        let name = format!("{}_{}_{uid}", pod.namespace, pod.pod);
        let dir = self.pod_logs.join(&name);
        let fd = match fsio::open_beneath(
            std::os::fd::AsFd::as_fd(&root),
            Path::new(&name),
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
        ) {
            Ok(fd) => fd,
            Err(e) if fsio::is_gone(&e) || fsio::is_refused_link(&e) => return Ok(Vec::new()),
            Err(e) => return Err(ReadError::io(&dir, e)),
        };
        let mut out = Vec::new();
        fsio::for_each_entry(std::os::fd::AsFd::as_fd(&fd), |n, kind, _| {
            if kind == EntryKind::Dir {
                if let Ok(n) = std::str::from_utf8(n) {
                    out.push(n.to_owned());
                }
            }
        })
        .map_err(|e| ReadError::io(&dir, e))?;
        Ok(out)
    }
}

/// One listing of the pod log root (`/var/log/pods`): entry names as on disk and their kinds,
/// or why it could not be listed. Made once per tick by discovery and handed to the tailer, so
/// the root is listed once.
#[derive(Debug)]
pub struct PodLogListing {
    root: PathBuf,
    outcome: Result<Vec<(Vec<u8>, crate::fsio::EntryKind)>, std::io::Error>,
}

impl PodLogListing {
    /// Lists `root`; a missing root is listed empty (a host without Kubernetes).
    pub fn list(root: &Path) -> Self {
        use crate::fsio;
        let listed = fsio::open_dir(root).and_then(|fd| {
            let mut out = Vec::new();
            fsio::list_into(fd, |name, kind, _| out.push((name.to_vec(), kind)))?;
            Ok(out)
        });
        let outcome = match listed {
            Err(e) if fsio::is_gone(&e) => Ok(Vec::new()),
            other => other,
        };
        PodLogListing {
            root: root.to_path_buf(),
            outcome,
        }
    }

    /// The directory listed.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The entries (raw name, kind), or the error, which names the root.
    pub fn entries(&self) -> Result<&[(Vec<u8>, crate::fsio::EntryKind)], ReadError> {
        match &self.outcome {
            Ok(v) => Ok(v),
            Err(e) => Err(ReadError::io(&self.root, clone_io(e))),
        }
    }
}

fn clone_io(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(e.kind(), e.to_string()),
    }
}

/// Entry names of a directory; a missing directory is empty (a host without Kubernetes).
/// Listed with `getdents64` into the kept buffer (`fsio::getdents`), not a `DIR` stream.
fn list_dir(dir: &Path, non_utf8: &mut usize) -> Result<Vec<String>, ReadError> {
    let fd = match crate::fsio::open_dir(dir) {
        Ok(fd) => fd,
        Err(e) if crate::fsio::is_gone(&e) => return Ok(Vec::new()),
        Err(e) => return Err(ReadError::io(dir, e)),
    };
    let mut out = Vec::new();
    crate::fsio::getdents(
        std::os::fd::AsFd::as_fd(&fd),
        |name, _, _| match std::str::from_utf8(name.to_bytes()) {
            Ok(name) => out.push(name.to_owned()),
            Err(_) => *non_utf8 += 1,
        },
    )
    .map_err(|e| ReadError::io(dir, e))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_dir_names() {
        let (p, uid) =
            parse_pod_dir("feeds_backend-7d9f8-x2k4q_0c1d2e3f-aaaa-bbbb-cccc-1234567890ab")
                .unwrap();
        assert_eq!(p.namespace, "feeds");
        assert_eq!(p.pod, "backend-7d9f8-x2k4q");
        assert_eq!(uid, "0c1d2e3f-aaaa-bbbb-cccc-1234567890ab");
        assert_eq!(parse_pod_dir("no-underscores"), None);
        assert_eq!(parse_pod_dir("a_b_c_d"), None);
        assert_eq!(parse_pod_dir("_b_c"), None);
    }

    #[test]
    fn container_link_names() {
        let (c, id) =
            parse_container_link("backend-7d9f8-x2k4q_feeds_api-server-0123456789abcdef.log")
                .unwrap();
        assert_eq!(
            c,
            ContainerName {
                namespace: "feeds".into(),
                pod: "backend-7d9f8-x2k4q".into(),
                container: "api-server".into()
            }
        );
        assert_eq!(id, "0123456789abcdef");
        assert_eq!(parse_container_link("pod_ns_c-id.txt"), None);
        assert_eq!(parse_container_link("pod_ns-id.log"), None);
        assert_eq!(parse_container_link("pod_ns_c-.log"), None);
    }

    #[test]
    fn missing_dirs_are_empty() {
        let src = NameSource::new("/nonexistent/a".into(), "/nonexistent/b".into());
        let idx = src.load().unwrap();
        assert!(idx.pods.is_empty() && idx.containers.is_empty());
    }

    #[test]
    fn non_utf8_entries_are_counted_not_dropped_silently() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        let pods = dir.path().join("pods");
        let links = dir.path().join("containers");
        std::fs::create_dir_all(pods.join("ns_p_uid-1")).unwrap();
        std::fs::create_dir_all(pods.join(std::ffi::OsStr::from_bytes(b"ns_\xff_uid-2"))).unwrap();
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(
            "/etc/shadow",
            links.join(std::ffi::OsStr::from_bytes(b"p_ns_c\xfe-abc.log")),
        )
        .unwrap();
        let idx = NameSource::new(pods, links).load().unwrap();
        assert_eq!(idx.pods.len(), 1);
        assert!(idx.containers.is_empty());
        assert_eq!(idx.non_utf8_names, 2);
    }
}
