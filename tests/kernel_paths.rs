//! Real-kernel paths: a cgroup whose name is not UTF-8 is discovered under an escaped name and
//! read at the right directory, distinct from a real cgroup named like its escape.

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Removes the raw-named cgroups before the harness removes its parent (declared after it).
struct RawDirs(Vec<PathBuf>);

impl Drop for RawDirs {
    fn drop(&mut self) {
        for d in self.0.iter().rev() {
            if let Err(e) = std::fs::remove_dir(d) {
                eprintln!("rmdir {}: {e}", d.display());
            }
        }
    }
}

#[test]
fn non_utf8_cgroup_is_visible_escaped_and_read_at_its_own_path() {
    let Some(n) = common::node() else { return };
    let primary = n.layout.primary();
    let parent = primary.join(&n.name);
    let raw = parent.join(OsStr::from_bytes(b"ng\xff.scope"));
    let lookalike = parent.join("ng\\xff.scope");
    let mut dirs = RawDirs(Vec::new());
    // Different limits tell which directory each workload's memory was read from.
    let limit_file = if n.layout.memory_is_v2() {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    for (dir, limit) in [(&raw, 64u64 << 20), (&lookalike, 128 << 20)] {
        std::fs::create_dir(dir).expect("mkdir cgroup");
        dirs.0.push(dir.clone());
        std::fs::write(dir.join(limit_file), limit.to_string()).expect("limit");
    }

    let mut agent = n.agent();
    let snap = agent.tick();
    let find = |name: &str| {
        snap.workloads
            .iter()
            .find(|w| w.id.container == name)
            .unwrap_or_else(|| panic!("{name} not discovered: {:?}", snap.workloads))
    };
    let esc = find("ng\\xff.scope");
    let real = find("ng\\\\xff.scope");
    assert_eq!(
        esc.cgroup.as_deref(),
        Some(format!("/{}/ng\\xff.scope", n.name).as_str())
    );
    let limit = |w: &nodeguard::model::WorkloadSignals| w.memory.and_then(|m| m.value.limit_bytes);
    assert_eq!(limit(esc), Some(64 << 20));
    assert_eq!(limit(real), Some(128 << 20));
    drop(snap);
    drop(agent);
    drop(dirs);
}
