//! Which cgroup layout the host uses, detected once at start.

use serde::Serialize;
use std::path::{Path, PathBuf};

/// The cgroup hierarchies the agent reads. Paths are mount points under the configured root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum CgroupLayout {
    /// One unified tree at the root (`/sys/fs/cgroup`).
    Unified { root: PathBuf },
    /// v1 controllers at `<root>/<controller>`, no v2 tree.
    Legacy { root: PathBuf },
    /// v1 controllers plus a v2 tree at `<root>/unified` (systemd's hybrid mode).
    Hybrid { root: PathBuf, unified: PathBuf },
}

impl CgroupLayout {
    /// Detects the layout from files present, so that fixture trees are detected like real mounts.
    pub fn detect(root: &Path) -> Option<CgroupLayout> {
        let root = root.to_path_buf();
        if root.join("cgroup.controllers").is_file() {
            return Some(CgroupLayout::Unified { root });
        }
        let has_v1 = ["memory", "pids", "freezer", "cpu", "systemd"]
            .iter()
            .any(|c| root.join(c).join("cgroup.procs").is_file());
        let unified = root.join("unified");
        match (has_v1, unified.join("cgroup.controllers").is_file()) {
            (true, true) => Some(CgroupLayout::Hybrid { root, unified }),
            (true, false) => Some(CgroupLayout::Legacy { root }),
            (false, true) => Some(CgroupLayout::Unified { root: unified }),
            (false, false) => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            CgroupLayout::Unified { .. } => "v2",
            CgroupLayout::Legacy { .. } => "v1",
            CgroupLayout::Hybrid { .. } => "hybrid",
        }
    }

    /// The tree discovery walks and memory is read from: the v2 tree on unified hosts, else the v1
    /// memory controller (kubelet creates every container there; systemd units may be missing from
    /// it unless memory accounting is on, which is also when there is no memory to report).
    pub fn primary(&self) -> PathBuf {
        match self {
            CgroupLayout::Unified { root } => root.clone(),
            CgroupLayout::Legacy { root } | CgroupLayout::Hybrid { root, .. } => {
                root.join("memory")
            }
        }
    }

    pub fn memory_is_v2(&self) -> bool {
        matches!(self, CgroupLayout::Unified { .. })
    }

    /// The v2 tree, if any (for `0::` paths and, later, `cgroup.freeze`).
    pub fn unified(&self) -> Option<&Path> {
        match self {
            CgroupLayout::Unified { root } => Some(root),
            CgroupLayout::Hybrid { unified, .. } => Some(unified),
            CgroupLayout::Legacy { .. } => None,
        }
    }

    /// The pids controller: the v1 `pids` mount where there is one (v1 and hybrid hosts: runc
    /// charges tasks there), else the unified tree.
    pub fn pids_root(&self) -> Option<PathBuf> {
        self.v1_controller("pids")
            .or_else(|| self.unified().map(Path::to_path_buf))
    }

    /// A v1 controller mount, if the host has v1 controllers.
    pub fn v1_controller(&self, name: &str) -> Option<PathBuf> {
        match self {
            CgroupLayout::Unified { .. } => None,
            CgroupLayout::Legacy { root } | CgroupLayout::Hybrid { root, .. } => {
                let p = root.join(name);
                p.join("cgroup.procs").is_file().then_some(p)
            }
        }
    }
}
