//! Paths the documentation and the manifests' comments name (`daemonset/...`, `docs/...`) must
//! exist: docs/deploy.md once sent readers to a `daemonset/base/configmap.yaml` that never was.

use super::Report;
use std::path::Path;

/// Where the references are read: every Markdown file under docs/, the README, and the YAML
/// under daemonset/ (its comments point at each other).
const ROOTS: [&str; 3] = ["docs", "README.md", "daemonset"];

/// Every repository path `text` names that `exists` denies. A reference starts at `daemonset/`
/// or `docs/` not preceded by a path character (so `https://host/you/nodeguard//daemonset/base`
/// and `<prefix>/docs/` are someone else's tree); templates and globs (`<Alert>`, `*`) are not
/// paths; trailing punctuation is prose.
pub(crate) fn dead(text: &str, exists: impl Fn(&str) -> bool) -> Vec<String> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || "/._-<>*{}$".contains(c);
    let mut out = Vec::new();
    for prefix in ["daemonset/", "docs/"] {
        for (i, _) in text.match_indices(prefix) {
            if text[..i].chars().next_back().is_some_and(path_char) {
                continue;
            }
            let end = text[i..]
                .find(|c: char| !path_char(c))
                .map_or(text.len(), |n| i + n);
            let p = text[i..end].trim_end_matches(['.', ',', ':', ';']);
            if p.contains(['<', '>', '*', '{', '}', '$']) {
                continue;
            }
            if !exists(p.trim_end_matches('/')) && !out.iter().any(|o| o == p) {
                out.push(p.to_owned());
            }
        }
    }
    out
}

/// The check over the repository: one finding per file and dead path.
pub(crate) fn check(repo: &Path, r: &mut Report) {
    let mut files = Vec::new();
    let mut stack: Vec<String> = ROOTS.iter().map(|s| (*s).to_owned()).collect();
    while let Some(rel) = stack.pop() {
        let full = repo.join(&rel);
        if full.is_dir() {
            match std::fs::read_dir(&full) {
                Ok(entries) => stack.extend(
                    entries
                        .flatten()
                        .map(|e| format!("{rel}/{}", e.file_name().to_string_lossy())),
                ),
                Err(e) => r.fail(format!("{rel}: {e}")),
            }
        } else if rel.ends_with(".md") || rel.ends_with(".yaml") {
            files.push(rel);
        }
    }
    files.sort();
    let mut n = 0;
    for f in &files {
        let text = match std::fs::read_to_string(repo.join(f)) {
            Ok(t) => t,
            Err(e) => {
                r.fail(format!("{f}: {e}"));
                continue;
            }
        };
        for p in dead(&text, |p| repo.join(p).exists()) {
            n += 1;
            r.fail(format!("{f}: names {p}, which does not exist"));
        }
    }
    if n == 0 {
        r.ok(format!(
            "{} files: every daemonset/ and docs/ path they name exists",
            files.len()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exists(p: &str) -> bool {
        [
            "daemonset/base/nodeguard.yaml",
            "docs/deploy.md",
            "daemonset/base",
            "docs",
        ]
        .contains(&p)
    }

    #[test]
    fn dead_references_are_found_and_others_left_alone() {
        let text = "Review `daemonset/base/configmap.yaml` (reference: docs/deploy.md).\n\
                    Edit daemonset/base/nodeguard.yaml, then daemonset/base/.\n\
                    remote: https://git.example.org/you/nodeguard//daemonset/nosuch?ref=v1\n\
                    `<prefix>/docs/runbooks/X.md`, docs/runbooks/<Alert>.md, daemonset/rules/*.yaml\n\
                    (see docs/nosuch.md), docs/nosuch.md again";
        assert_eq!(
            dead(text, exists),
            ["daemonset/base/configmap.yaml", "docs/nosuch.md"]
        );
    }

    #[test]
    fn the_repository_has_no_dead_reference() {
        let mut r = Report::default();
        check(Path::new(env!("CARGO_MANIFEST_DIR")), &mut r);
        assert_eq!(r.errors, Vec::<String>::new());
    }
}
