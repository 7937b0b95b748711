//! Discovery: which workloads run on this node, from the cgroup tree and the kubelet log tree.
//! No API server is needed; the same walk finds systemd units and other cgroups on a plain host.

pub mod kubelet;
pub mod layout;
pub mod names;

use crate::error::ReadError;
use crate::workload::WorkloadId;
use kubelet::{KubeCgroup, QosClass};
pub use layout::CgroupLayout;
use names::{NameIndex, NameSource};
use serde::Serialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

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
    /// Sandbox verdicts by container id: a cgroup's role never changes, so ask /proc once.
    sandbox_cache: HashMap<String, bool>,
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
            sandbox_cache: HashMap::new(),
        }
    }

    pub fn scan(&mut self) -> Result<Inventory, ReadError> {
        let index = self.names.load()?;
        let mut dirs = Vec::new();
        for scope in &self.config.scopes {
            let rel = normalize(scope);
            walk(&self.primary, &rel, &mut dirs)?;
        }
        let mut inv = Inventory::default();
        let mut seen_ids = Vec::new();
        let mut i = 0;
        while i < dirs.len() {
            let rel = dirs[i].clone();
            let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
            if let Some(k) = kubelet::kubepods_index(&comps) {
                let end = subtree_end(&dirs, i);
                if let Some(kc) = kubelet::parse(&comps[k..]) {
                    let is_container = matches!(kc, KubeCgroup::Container { .. });
                    self.classify_kube(kc, &dirs[i..end], &index, &mut inv, &mut seen_ids)?;
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
            let subtree_end = subtree_end(&dirs, i);
            let is_unit = name.ends_with(".service") || name.ends_with(".scope");
            let is_leaf = subtree_end == i + 1;
            if is_unit || (is_leaf && !comps.is_empty() && has_procs(&self.primary, &rel)?) {
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
        self.sandbox_cache.retain(|id, _| seen_ids.contains(id));
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
                        if self.is_sandbox(&id, rel)? {
                            inv.sandboxes += 1;
                            return Ok(());
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

    /// The sandbox holds only the `pause` process and never writes a container log.
    fn is_sandbox(&mut self, id: &str, rel: &str) -> Result<bool, ReadError> {
        if let Some(v) = self.sandbox_cache.get(id) {
            return Ok(*v);
        }
        let pids = read_procs(&self.primary, rel)?;
        if pids.is_empty() {
            // Decide once it has a process.
            return Ok(false);
        }
        let mut all_pause = true;
        for pid in &pids {
            let comm =
                crate::fsio::read_optional(&self.proc_root.join(pid.to_string()).join("comm"))?;
            if let Some(c) = comm {
                all_pause &= c.trim_end() == "pause";
            }
        }
        self.sandbox_cache.insert(id.to_owned(), all_pause);
        Ok(all_pause)
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

/// Depth-first, pre-order list of cgroup directories (relative paths). A vanished directory is
/// churn and simply not listed.
fn walk(root: &Path, rel: &str, out: &mut Vec<String>) -> Result<(), ReadError> {
    let abs = join_rel(root, rel);
    let rd = match std::fs::read_dir(&abs) {
        Ok(rd) => rd,
        Err(e) if crate::fsio::is_gone(&e) => return Ok(()),
        Err(e) => return Err(ReadError::io(&abs, e)),
    };
    out.push(rel.to_owned());
    let mut children: Vec<String> = Vec::new();
    for entry in rd {
        let Ok(entry) = entry else { continue };
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            if let Some(name) = entry.file_name().to_str() {
                children.push(name.to_owned());
            }
        }
    }
    children.sort();
    for c in children {
        let child = if rel == "/" {
            format!("/{c}")
        } else {
            format!("{rel}/{c}")
        };
        walk(root, &child, out)?;
    }
    Ok(())
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

/// `<hierarchy root><rel>`; `rel` is absolute within the hierarchy.
pub fn join_rel(root: &Path, rel: &str) -> PathBuf {
    let t = rel.trim_start_matches('/');
    if t.is_empty() {
        root.to_path_buf()
    } else {
        root.join(t)
    }
}

/// Pids listed in a cgroup's `cgroup.procs` (zombies are not listed: see KERNEL-TRAPS).
pub fn read_procs(root: &Path, rel: &str) -> Result<Vec<u32>, ReadError> {
    let path = join_rel(root, rel).join("cgroup.procs");
    let text = crate::fsio::read_optional(&path)?.unwrap_or_default();
    Ok(parse_procs(&text))
}

/// Pure: one pid per line; junk lines are skipped.
pub fn parse_procs(text: &str) -> Vec<u32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

fn has_procs(root: &Path, rel: &str) -> Result<bool, ReadError> {
    Ok(!read_procs(root, rel)?.is_empty())
}

#[cfg(test)]
mod tests {
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
    fn procs_parse() {
        assert_eq!(parse_procs("1\n22\n\nx\n333\n"), vec![1, 22, 333]);
    }

    #[test]
    fn scope_normalization() {
        assert_eq!(normalize("/"), "/");
        assert_eq!(normalize(""), "/");
        assert_eq!(normalize("ngtest-1/"), "/ngtest-1");
        assert_eq!(join_rel(Path::new("/r"), "/"), PathBuf::from("/r"));
        assert_eq!(join_rel(Path::new("/r"), "/a/b"), PathBuf::from("/r/a/b"));
    }
}
