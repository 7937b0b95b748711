//! Discovery: which workloads run on this node, from the cgroup tree and the kubelet log tree.
//! No API server is needed; the same walk finds systemd units and other cgroups on a plain host.

pub mod kubelet;
pub mod names;
mod tree;
pub use tree::TreeStats;

use crate::cgroupfs::CgroupLayout;
use crate::cgroupfs::{join_rel, read_procs};
use crate::error::ReadError;
use crate::fsio;
use crate::model::WorkloadId;
use kubelet::{KubeCgroup, QosClass};
use names::{NameIndex, NameSource};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WorkloadKind {
    Container {
        pod_uid: String,
        container_id: String,
        qos: QosClass,
    },
    /// A systemd unit or another cgroup on the host.
    Unit,
}

/// One workload found this tick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Workload {
    pub id: WorkloadId,
    #[serde(flatten)]
    pub kind: WorkloadKind,
    /// The workload's cgroup, relative to a hierarchy root (`/kubepods/burstable/pod.../<id>`).
    pub cgroup: String,
    /// The workload's cgroup and every cgroup below it (a unit may have children).
    #[serde(skip)]
    pub subtree: Vec<String>,
}

impl Workload {
    /// The instance: a new container id (or a recreated unit cgroup) is a new instance of the
    /// same workload identity.
    pub fn instance(&self) -> &str {
        match &self.kind {
            WorkloadKind::Container { container_id, .. } => container_id,
            WorkloadKind::Unit => &self.cgroup,
        }
    }
}

/// A pod-level cgroup: its counters cover containers whose own cgroups are already gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodCgroup {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub qos: QosClass,
    pub cgroup: String,
}

#[derive(Debug, Default, Clone, Serialize)]
pub struct Inventory {
    pub workloads: Vec<Workload>,
    pub pods: Vec<PodCgroup>,
    /// Pod sandbox (pause) cgroups recognised and left out.
    pub sandboxes: usize,
}

#[derive(Debug, Clone)]
pub struct DiscoveryConfig {
    /// Cgroup subtrees to walk, relative to the hierarchy root ("/" for all).
    pub scopes: Vec<String>,
    /// Report systemd units and leaf cgroups outside kubepods as workloads.
    pub host_workloads: bool,
}

#[derive(Debug)]
pub struct Discovery {
    primary: PathBuf,
    proc_root: PathBuf,
    names: NameSource,
    config: DiscoveryConfig,
    /// Container ids known to be sandboxes: a cgroup's role never changes, so ask /proc once.
    sandbox_cache: HashSet<String>,
    /// Ids judged sandboxes at the last scan (cached or not), and the names it used: the kernel
    /// log names cgroups that may be gone by the time it is read.
    last_sandboxes: HashSet<String>,
    last_index: NameIndex,
    /// Directory inode of each cgroup of the last walk: a cgroup re-created under the same name
    /// has another, so readers holding its files know to open them anew.
    inos: HashMap<String, u64>,
    /// The pod log root as the last scan listed it, for the log tailer.
    pod_listing: Option<names::PodLogListing>,
    stats: DiscoveryStats,
    /// `cgroup.procs` read during the last scan, by cgroup: the process sampler takes them
    /// instead of reading the same files again.
    listed: std::collections::HashMap<String, Vec<u32>>,
    /// The cgroup tree of each scope, kept between scans (`tree.rs`).
    trees: Vec<tree::Tree>,
}

impl Discovery {
    pub fn new(
        layout: &CgroupLayout,
        proc_root: PathBuf,
        names: NameSource,
        config: DiscoveryConfig,
    ) -> Self {
        Discovery {
            primary: layout.primary(),
            proc_root,
            names,
            config,
            sandbox_cache: HashSet::new(),
            last_sandboxes: HashSet::new(),
            last_index: NameIndex::default(),
            inos: HashMap::new(),
            pod_listing: None,
            stats: DiscoveryStats::default(),
            listed: std::collections::HashMap::new(),
            trees: Vec::new(),
        }
    }

    /// What the kept cgroup trees hold and did at the last scan, over all scopes.
    pub fn tree_stats(&self) -> TreeStats {
        let mut t = TreeStats::default();
        for s in self.trees.iter().map(tree::Tree::stats) {
            t.dirs += s.dirs;
            t.held += s.held;
            t.unwatched += s.unwatched;
            t.listed += s.listed;
            t.overflows += s.overflows;
        }
        t
    }

    /// Whether `rel` lies in a configured scope (the agent's view of the tree).
    pub fn in_scope(&self, rel: &str) -> bool {
        crate::cgroupfs::in_scopes(&self.config.scopes, rel)
    }

    /// The container a kubelet cgroup path (or a cgroup below it) names, from the path grammar
    /// alone: for a container whose cgroup no scan saw. Named from the last scan's log trees,
    /// else by its short id; `None` outside the scopes, for non-container paths and sandboxes.
    pub fn container_of_path(&self, rel: &str) -> Option<(WorkloadId, String, String)> {
        if !self.in_scope(rel) {
            return None;
        }
        let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
        let k = kubelet::kubepods_index(&comps)?;
        // kubepods[/qos]/pod/<container>: the container is at most 4 levels below kubepods.
        let found =
            (1..=4.min(comps.len() - k)).find_map(|n| match kubelet::parse(&comps[k..k + n]) {
                Some(KubeCgroup::Container { pod_uid, id, .. }) => Some((pod_uid, id)),
                _ => None,
            });
        let (pod_uid, id) = found?;
        if self.sandbox_cache.contains(&id) || self.last_sandboxes.contains(&id) {
            return None;
        }
        let wid = match self.last_index.containers.get(&id) {
            Some(c) => WorkloadId::container(&c.namespace, &c.pod, &c.container),
            None => {
                let (namespace, pod) = pod_names(&self.last_index, &pod_uid);
                WorkloadId::container(&namespace, &pod, &id[..12.min(id.len())])
            }
        };
        Some((wid, pod_uid, id))
    }

    /// The pod log root as the last scan listed it (`None` before the first scan).
    pub fn pod_log_listing(&self) -> Option<&names::PodLogListing> {
        self.pod_listing.as_ref()
    }

    /// The directory inode of a cgroup the last walk listed (0 when it did not list it).
    pub fn cgroup_ino(&self, rel: &str) -> u64 {
        self.inos.get(rel).copied().unwrap_or(0)
    }

    /// What the last successful scan could not represent as is.
    pub fn stats(&self) -> DiscoveryStats {
        self.stats
    }

    /// One line when names start or stop needing escapes or cgroups start or stop being cut.
    fn log_transitions(&self, now: DiscoveryStats) {
        let was = self.stats;
        let kinds = [
            (
                "non_utf8_cgroups",
                was.non_utf8_cgroups,
                now.non_utf8_cgroups,
            ),
            (
                "non_utf8_log_names",
                was.non_utf8_log_names,
                now.non_utf8_log_names,
            ),
            ("skipped_cgroups", was.skipped_cgroups, now.skipped_cgroups),
        ];
        for (what, was, is) in kinds {
            if was == 0 && is > 0 {
                tracing::warn!(
                    what,
                    count = is,
                    "discovery: names escaped or cgroups skipped"
                );
            } else if was > 0 && is == 0 {
                tracing::info!(what, "discovery: no more names escaped or cgroups skipped");
            }
        }
    }

    /// The `cgroup.procs` listings the last scan read (each taken once).
    pub fn take_listed(&mut self) -> std::collections::HashMap<String, Vec<u32>> {
        std::mem::take(&mut self.listed)
    }

    /// `cgroup.procs` of `rel`, kept for the process sampler of this tick.
    fn listed_procs(&mut self, rel: &str) -> Result<&[u32], ReadError> {
        if !self.listed.contains_key(rel) {
            let pids = read_procs(&self.primary, rel)?;
            self.listed.insert(rel.to_owned(), pids);
        }
        Ok(self.listed.get(rel).map_or(&[], Vec::as_slice))
    }

    pub fn scan(&mut self) -> Result<Inventory, ReadError> {
        self.listed.clear();
        let listing = self.names.list_pods();
        let index = self.names.index(&listing);
        self.pod_listing = Some(listing);
        let index = index?;
        let mut stats = DiscoveryStats {
            non_utf8_log_names: index.non_utf8_names,
            ..DiscoveryStats::default()
        };
        let mut walked = Walked::default();
        if self.trees.is_empty() {
            let scopes = self.config.scopes.iter();
            self.trees = scopes.map(|s| tree::Tree::new(normalize(s))).collect();
        }
        let root_fd = fsio::open_dir(&self.primary).map_err(|e| ReadError::io(&self.primary, e))?;
        for tree in &mut self.trees {
            tree.scan(&self.primary, root_fd.as_fd(), &mut walked, &mut stats)?;
        }
        let dirs = &walked.dirs;
        let mut inv = Inventory::default();
        let mut seen_ids = Vec::new();
        let live = live_container_ids(dirs);
        self.last_sandboxes.clear();
        let mut i = 0;
        while i < dirs.len() {
            let rel = dirs[i].clone();
            let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
            if let Some(k) = kubelet::kubepods_index(&comps) {
                let end = subtree_end(dirs, i);
                if let Some(kc) = kubelet::parse(&comps[k..]) {
                    let is_container = matches!(kc, KubeCgroup::Container { .. });
                    self.classify_kube(kc, &dirs[i..end], &index, &live, &mut inv, &mut seen_ids)?;
                    // A container's nested cgroups (dind, systemd-in-container) belong to it.
                    if is_container {
                        i = end;
                        continue;
                    }
                }
                i += 1;
                continue;
            }
            if !self.config.host_workloads {
                i += 1;
                continue;
            }
            let name = comps.last().copied().unwrap_or("");
            let subtree_end = subtree_end(dirs, i);
            let is_unit = name.ends_with(".service") || name.ends_with(".scope");
            let is_leaf = subtree_end == i + 1;
            if is_unit || (is_leaf && !comps.is_empty() && !self.listed_procs(&rel)?.is_empty()) {
                let label = if is_unit {
                    name.to_owned()
                } else {
                    rel.trim_start_matches('/').to_owned()
                };
                inv.workloads.push(Workload {
                    id: WorkloadId::unit(&label),
                    kind: WorkloadKind::Unit,
                    cgroup: rel.clone(),
                    subtree: dirs[i..subtree_end].to_vec(),
                });
                i = subtree_end;
                continue;
            }
            i += 1;
        }
        self.sandbox_cache.retain(|id| seen_ids.contains(id));
        self.inos = walked.dirs.into_iter().zip(walked.inos).collect();
        self.last_index = index;
        self.log_transitions(stats);
        self.stats = stats;
        inv.workloads
            .sort_by(|a, b| a.id.cmp(&b.id).then(a.cgroup.cmp(&b.cgroup)));
        Ok(inv)
    }

    /// `subtree` is the cgroup itself followed by its descendants.
    fn classify_kube(
        &mut self,
        kc: KubeCgroup,
        subtree: &[String],
        index: &NameIndex,
        live: &HashSet<String>,
        inv: &mut Inventory,
        seen_ids: &mut Vec<String>,
    ) -> Result<(), ReadError> {
        let rel = subtree[0].as_str();
        match kc {
            KubeCgroup::Pod { qos, uid } => {
                let (namespace, pod) = pod_names(index, &uid);
                inv.pods.push(PodCgroup {
                    namespace,
                    pod,
                    uid,
                    qos,
                    cgroup: rel.to_owned(),
                });
            }
            KubeCgroup::Container {
                qos,
                pod_uid,
                id,
                runtime: _,
            } => {
                seen_ids.push(id.clone());
                let wid = match index.containers.get(&id) {
                    Some(c) => WorkloadId::container(&c.namespace, &c.pod, &c.container),
                    None => {
                        match self.unlinked(&id, rel, &pod_uid, index, live)? {
                            Unlinked::Sandbox => {
                                inv.sandboxes += 1;
                                self.last_sandboxes.insert(id);
                                return Ok(());
                            }
                            Unlinked::Undecided => return Ok(()),
                            Unlinked::Container => {}
                        }
                        // Not yet linked by kubelet (or no logs): name it by its short id.
                        let (namespace, pod) = pod_names(index, &pod_uid);
                        WorkloadId::container(&namespace, &pod, &id[..12.min(id.len())])
                    }
                };
                inv.workloads.push(Workload {
                    id: wid,
                    kind: WorkloadKind::Container {
                        pod_uid,
                        container_id: id,
                        qos,
                    },
                    cgroup: rel.to_owned(),
                    subtree: subtree.to_vec(),
                });
            }
            KubeCgroup::QosLevel | KubeCgroup::PodHelper => {}
        }
        Ok(())
    }

    /// What an unlinked container cgroup is. Only a `pause` verdict is cached: a cgroup seen
    /// while runc is still setting it up (`runc:[2:INIT]`) may be either, and a container that
    /// kubelet has not linked yet gets its link a moment later. Past runc's init, the CRI log
    /// tree decides (the runtime opens a container's log before its task exists; a sandbox has
    /// none): a container-name log dir of the pod that no linked live container claims is this
    /// container's; none left means the sandbox, whatever its image runs.
    fn unlinked(
        &mut self,
        id: &str,
        rel: &str,
        pod_uid: &str,
        index: &NameIndex,
        live: &HashSet<String>,
    ) -> Result<Unlinked, ReadError> {
        if self.sandbox_cache.contains(id) {
            return Ok(Unlinked::Sandbox);
        }
        let pids = self.listed_procs(rel)?.to_vec();
        let mut comms = Vec::with_capacity(pids.len());
        let mut comm = Vec::new();
        for pid in &pids {
            // Bytes: a workload sets its comm to anything (prctl), UTF-8 or not.
            let path = self.proc_root.join(pid.to_string()).join("comm");
            if fsio::read_into(&path, &mut comm)? {
                comms.push(comm.trim_ascii_end().to_vec());
            }
        }
        let v = unlinked_verdict(&comms);
        if v == Unlinked::Sandbox {
            self.sandbox_cache.insert(id.to_owned());
        }
        if v != Unlinked::Container {
            return Ok(v);
        }
        // No pod log dir: no CRI log tree to ask (a runtime without kubelet's logs).
        let Some(pod) = index.pods.get(pod_uid) else {
            return Ok(v);
        };
        let dirs = self.names.container_dirs(pod, pod_uid)?;
        Ok(log_evidence(&dirs, &claimed_names(index, pod, live)))
    }
}

/// Names of the pod's containers that are linked and have a cgroup this scan.
fn claimed_names<'a>(
    index: &'a NameIndex,
    pod: &names::PodName,
    live: &HashSet<String>,
) -> HashSet<&'a str> {
    index
        .containers
        .iter()
        .filter(|(id, c)| live.contains(*id) && c.namespace == pod.namespace && c.pod == pod.pod)
        .map(|(_, c)| c.container.as_str())
        .collect()
}

/// Pure: an unlinked, running container cgroup is a container when the pod's log dir has a
/// container name that no linked live container claims, else the sandbox.
fn log_evidence(log_dirs: &[String], claimed: &HashSet<&str>) -> Unlinked {
    if log_dirs.iter().any(|d| !claimed.contains(d.as_str())) {
        Unlinked::Container
    } else {
        Unlinked::Sandbox
    }
}

/// Every container id in the walk (for which log names a live container claims).
fn live_container_ids(dirs: &[String]) -> HashSet<String> {
    let mut out = HashSet::new();
    for rel in dirs {
        let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
        if let Some(k) = kubelet::kubepods_index(&comps) {
            if let Some(KubeCgroup::Container { id, .. }) = kubelet::parse(&comps[k..]) {
                out.insert(id);
            }
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unlinked {
    /// Only `pause`: the pod sandbox, left out.
    Sandbox,
    /// No process yet, or runc still in its init: decided at a later tick, not reported now.
    Undecided,
    /// Something else runs: a container kubelet has not linked yet, reported by its short id.
    Container,
}

/// Pure: the verdict on an unlinked container cgroup from the comms of its processes.
fn unlinked_verdict(comms: &[Vec<u8>]) -> Unlinked {
    if comms.is_empty() || comms.iter().any(|c| c.starts_with(b"runc:")) {
        Unlinked::Undecided
    } else if comms.iter().all(|c| c == b"pause") {
        Unlinked::Sandbox
    } else {
        Unlinked::Container
    }
}

fn pod_names(index: &NameIndex, uid: &str) -> (String, String) {
    match index.pods.get(uid) {
        Some(p) => (p.namespace.clone(), p.pod.clone()),
        None => (String::new(), format!("pod{uid}")),
    }
}

fn normalize(scope: &str) -> String {
    let t = scope.trim_matches('/');
    if t.is_empty() {
        "/".to_owned()
    } else {
        format!("/{t}")
    }
}

/// Deepest cgroup level walked below a scope, and longest relative path kept: a cgroup beyond
/// either is left out (and counted), so the walk holds at most this many directory descriptors
/// and no path handed to the readers and the actuator exceeds PATH_MAX.
const MAX_DEPTH: usize = 64;
const MAX_REL_LEN: usize = 3072;

/// What the last walk could not represent as is, for `nodeguard_discovery_*` gauges.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DiscoveryStats {
    /// Cgroup directories whose name is not UTF-8: listed under their escaped name (`\xNN`).
    pub non_utf8_cgroups: usize,
    /// Entries of the pod and container log dirs whose name is not UTF-8 (never kubelet's): not
    /// used for names.
    pub non_utf8_log_names: usize,
    /// Cgroups not walked because they are deeper than 64 levels or their path is longer than
    /// 3072 bytes (with their subtree).
    pub skipped_cgroups: usize,
}

/// Depth-first, pre-order list of cgroup directories (relative paths, names escaped with
/// [`crate::fsio::escape_name`], which [`join_rel`] undoes), walked in full. A vanished directory
/// is churn and simply not listed; a symlink is not a cgroup and is not followed.
#[cfg(test)]
fn walk(
    root: &std::path::Path,
    rel: &str,
    out: &mut Walked,
    stats: &mut DiscoveryStats,
) -> Result<(), ReadError> {
    let root_fd = fsio::open_dir(root).map_err(|e| ReadError::io(root, e))?;
    tree::Tree::one_shot(normalize(rel)).scan(root, root_fd.as_fd(), out, stats)
}

/// The walk's output: cgroup paths in pre-order, and each one's directory inode.
#[derive(Debug, Default)]
struct Walked {
    dirs: Vec<String>,
    inos: Vec<u64>,
}

fn is_gone_dir(e: &std::io::Error) -> bool {
    fsio::is_gone(e) || e.raw_os_error() == Some(nix::libc::ENOTDIR)
}

/// Index one past the last descendant of `dirs[i]` in the pre-order listing.
fn subtree_end(dirs: &[String], i: usize) -> usize {
    let prefix = if dirs[i] == "/" {
        "/".to_owned()
    } else {
        format!("{}/", dirs[i])
    };
    let mut j = i + 1;
    while j < dirs.len() && dirs[j].starts_with(&prefix) {
        j += 1;
    }
    j
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    #[test]
    fn an_unlinked_cgroup_in_runc_init_is_not_judged_yet() {
        let v = |c: &[&str]| {
            unlinked_verdict(&c.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>())
        };
        assert_eq!(v(&["runc:[2:INIT]"]), Unlinked::Undecided);
        assert_eq!(v(&[]), Unlinked::Undecided);
        assert_eq!(v(&["pause"]), Unlinked::Sandbox);
        assert_eq!(v(&["pause", "pause"]), Unlinked::Sandbox);
        assert_eq!(v(&["nginx"]), Unlinked::Container);
        assert_eq!(v(&["pause", "sh"]), Unlinked::Container);
    }

    use super::*;

    #[test]
    fn subtree_end_respects_name_prefixes() {
        let dirs: Vec<String> = ["/", "/a", "/a/b", "/ab", "/c"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(subtree_end(&dirs, 1), 3);
        assert_eq!(subtree_end(&dirs, 0), 5);
        assert_eq!(subtree_end(&dirs, 3), 4);
    }

    #[test]
    fn scope_normalization() {
        assert_eq!(normalize("/"), "/");
        assert_eq!(normalize(""), "/");
        assert_eq!(normalize("ngtest-1/"), "/ngtest-1");
        assert_eq!(join_rel(Path::new("/r"), "/"), PathBuf::from("/r"));
        assert_eq!(join_rel(Path::new("/r"), "/a/b"), PathBuf::from("/r/a/b"));
    }

    #[test]
    fn walk_keeps_non_utf8_names_visible_and_joinable() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let raw = root.join(OsStr::from_bytes(b"u\xffx.scope"));
        // The text a non-UTF-8 name escapes to, as a real name beside it: must stay distinct.
        let lookalike = root.join("u\\xffx.scope");
        for d in [&raw, &lookalike] {
            std::fs::create_dir_all(d.join("child")).unwrap();
        }
        std::fs::create_dir(root.join("system-systemd\\x2dfsck.slice")).unwrap();
        std::os::unix::fs::symlink("/", root.join("escape")).unwrap();
        let mut deep = root.join("deep");
        for _ in 0..MAX_DEPTH + 3 {
            deep.push("d");
        }
        std::fs::create_dir_all(&deep).unwrap();

        let mut walked = Walked::default();
        let mut stats = DiscoveryStats::default();
        walk(root, "/", &mut walked, &mut stats).unwrap();
        let out = walked.dirs;
        assert!(
            out.iter().all(|r| !r.starts_with("/escape")),
            "symlink followed"
        );
        assert!(out.contains(&"/system-systemd\\x2dfsck.slice".to_owned()));
        let esc = "/u\\xffx.scope";
        let real = "/u\\\\xffx.scope";
        assert!(out.contains(&esc.to_owned()) && out.contains(&format!("{esc}/child")));
        assert!(out.contains(&real.to_owned()));
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&join_rel(root, esc)), ino(&raw));
        assert_eq!(
            ino(&join_rel(root, &format!("{esc}/child"))),
            ino(&raw.join("child"))
        );
        assert_eq!(ino(&join_rel(root, real)), ino(&lookalike));
        assert_eq!(stats.non_utf8_cgroups, 1);
        // Levels 1..=64 below the root are walked: "/deep" and 63 "d" under it.
        assert_eq!(
            out.iter().filter(|r| r.starts_with("/deep")).count(),
            MAX_DEPTH
        );
        assert_eq!(stats.skipped_cgroups, 1);
    }

    #[test]
    fn walk_of_a_missing_scope_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let mut out = Walked::default();
        let mut stats = DiscoveryStats::default();
        walk(dir.path(), "/nope", &mut out, &mut stats).unwrap();
        assert!(out.dirs.is_empty());
    }

    #[test]
    fn a_non_utf8_comm_does_not_fail_the_scan() {
        let dir = tempfile::tempdir().unwrap();
        let cg = dir.path().join("cgroup");
        let pod = "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod7e2b9c4d_1a6f_4d83_b5e0_9f8c3a2d1e47.slice";
        let id = "339add00d50ed924573b14aeb9aa2283db84c63c88096484dc52098f414c42a8";
        let ctr = cg.join(pod).join(format!("cri-containerd-{id}.scope"));
        std::fs::create_dir_all(&ctr).unwrap();
        std::fs::write(cg.join("cgroup.controllers"), "memory pids\n").unwrap();
        std::fs::write(ctr.join("cgroup.procs"), "4242\n").unwrap();
        let proc = dir.path().join("proc");
        std::fs::create_dir_all(proc.join("4242")).unwrap();
        std::fs::write(proc.join("4242/comm"), b"\xff\xfe\"bad\n").unwrap();
        let layout = CgroupLayout::detect(&cg).unwrap();
        let names = NameSource::new(dir.path().join("pods"), dir.path().join("containers"));
        let config = DiscoveryConfig {
            scopes: vec!["/".into()],
            host_workloads: false,
        };
        let mut d = Discovery::new(&layout, proc, names, config);
        let inv = d.scan().unwrap();
        assert_eq!(inv.workloads.len(), 1);
        assert_eq!(inv.sandboxes, 0);
    }
}

#[cfg(test)]
mod sandbox_tests {
    use super::*;

    const POD: &str = "kubepods/burstable/pod0a1b";
    const SANDBOX: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const LINKED: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const STARTING: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";

    /// A v2 tree with one pod: `(dir, discovery)`; each container cgroup runs one process.
    fn tree(procs: &[(&str, u32, &str)]) -> (tempfile::TempDir, Discovery) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let cg = root.join("cg");
        std::fs::create_dir_all(cg.join(POD)).unwrap();
        std::fs::write(cg.join("cgroup.controllers"), "memory\n").unwrap();
        for (id, pid, comm) in procs {
            let c = cg.join(POD).join(id);
            std::fs::create_dir_all(&c).unwrap();
            std::fs::write(c.join("cgroup.procs"), format!("{pid}\n")).unwrap();
            let p = root.join("proc").join(pid.to_string());
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("comm"), format!("{comm}\n")).unwrap();
        }
        let pods = root.join("pods");
        std::fs::create_dir_all(pods.join("shop_web-0_0a1b/app")).unwrap();
        let links = root.join("containers");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(
            "../pods/shop_web-0_0a1b/app/0.log",
            links.join(format!("web-0_shop_app-{LINKED}.log")),
        )
        .unwrap();
        let d = Discovery::new(
            &CgroupLayout::detect(&cg).unwrap(),
            root.join("proc"),
            NameSource::new(pods, links),
            DiscoveryConfig {
                scopes: vec!["/".into()],
                host_workloads: false,
            },
        );
        (dir, d)
    }

    fn names(inv: &Inventory) -> Vec<String> {
        inv.workloads.iter().map(|w| w.id.to_string()).collect()
    }

    #[test]
    fn a_sandbox_that_does_not_run_pause_is_still_the_sandbox() {
        let (_dir, mut d) = tree(&[(SANDBOX, 10, "sleep"), (LINKED, 11, "uwsgi")]);
        let inv = d.scan().unwrap();
        assert_eq!(names(&inv), vec!["shop/web-0/app".to_owned()]);
        assert_eq!(inv.sandboxes, 1);
        // Not cached (it was not `pause`), but the kernel log attribution knows it.
        assert!(!d.sandbox_cache.contains(SANDBOX));
        assert_eq!(
            d.container_of_path(&format!("/{POD}/{SANDBOX}")),
            None,
            "a sandbox is never credited an OOM kill"
        );
    }

    #[test]
    fn an_unlinked_container_with_an_unclaimed_log_dir_is_a_container() {
        // The linked `app` has no live cgroup (restarting): its log dir is unclaimed, so the new,
        // not yet linked instance is a container once past runc's init (never judged during it).
        let (dir, mut d) = tree(&[(STARTING, 12, "runc:[2:INIT]")]);
        let inv = d.scan().unwrap();
        assert!(
            inv.workloads.is_empty() && inv.sandboxes == 0,
            "runc init: not judged"
        );
        std::fs::write(dir.path().join("proc/12/comm"), "uwsgi\n").unwrap();
        let inv = d.scan().unwrap();
        assert_eq!(names(&inv), vec![format!("shop/web-0/{}", &STARTING[..12])]);
        assert_eq!(inv.sandboxes, 0);
    }

    #[test]
    fn log_evidence_is_pure() {
        let claimed: HashSet<&str> = ["app"].into();
        assert_eq!(log_evidence(&["app".into()], &claimed), Unlinked::Sandbox);
        assert_eq!(
            log_evidence(&["app".into(), "sidecar".into()], &claimed),
            Unlinked::Container
        );
        assert_eq!(log_evidence(&[], &HashSet::new()), Unlinked::Sandbox);
    }
}
