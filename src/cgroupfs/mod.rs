//! The cgroupfs foundation every stage shares: the layout of the hierarchies (detected once),
//! a walked cgroup's path from its escaped name (`join_rel`), and `cgroup.procs`. Discovery
//! walks with it, the samplers read through it, the actuator writes through it; none of them
//! owns it.

pub mod layout;
pub use layout::CgroupLayout;

use crate::error::ReadError;
use crate::fsio::unescape_name;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Whether the cgroup `rel` lies in one of `scopes` (`discovery.scopes`: `/`, or a path and
/// everything below it).
pub fn in_scopes(scopes: &[String], rel: &str) -> bool {
    scopes.iter().any(|s| {
        let s = s.trim_matches('/');
        s.is_empty()
            || rel
                .trim_start_matches('/')
                .strip_prefix(s)
                .is_some_and(|r| r.is_empty() || r.starts_with('/'))
    })
}

/// `<hierarchy root><rel>`; `rel` is absolute within the hierarchy, with names escaped as the
/// walk lists them: the path names the very directory listed, even one whose name is not UTF-8.
pub fn join_rel(root: &Path, rel: &str) -> PathBuf {
    let t = rel.trim_start_matches('/');
    if t.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(&unescape_name(t)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_hold_their_subtree_only() {
        let scopes = vec!["/kubepods.slice/".to_owned()];
        assert!(in_scopes(&scopes, "/kubepods.slice"));
        assert!(in_scopes(&scopes, "/kubepods.slice/pod1/c"));
        assert!(!in_scopes(&scopes, "/kubepods.slice-other/c"));
        assert!(!in_scopes(&scopes, "/system.slice/x.service"));
        assert!(in_scopes(&["/".to_owned()], "/anything"));
    }

    #[test]
    fn procs_lists_pids_and_skips_junk() {
        assert_eq!(parse_procs("12\n 34 \nx\n\n56\n"), vec![12, 34, 56]);
        assert_eq!(parse_procs(""), Vec::<u32>::new());
        assert_eq!(parse_procs("1\n22\n\nx\n333\n"), vec![1, 22, 333]);
    }

    #[test]
    fn rel_paths_join_under_the_root_with_names_unescaped() {
        let root = Path::new("/sys/fs/cgroup/memory");
        assert_eq!(join_rel(root, "/"), root);
        assert_eq!(join_rel(root, ""), root);
        assert_eq!(join_rel(root, "/a/b.scope"), root.join("a/b.scope"));
        assert_eq!(
            join_rel(root, "/u\\xffx").as_os_str().as_bytes(),
            b"/sys/fs/cgroup/memory/u\xffx"
        );
    }
}
