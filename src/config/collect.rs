//! Every type error of a section, not just the first: serde stops at the first error, so the
//! offending node is recorded with its path, pruned from the YAML tree, and the section is
//! deserialized again until it succeeds. Pruned fields take their defaults; a struct missing a
//! required field is pruned as a whole.
//!
//! Pruning a sequence element shifts the indices after it, so the pruned indices are kept to map
//! every later path (type errors and the validation's) back to the user's own indices.

use super::FieldError;
use serde::de::DeserializeOwned;
use serde_norway::Value;
use std::collections::HashMap;

/// Errors reported at most in one run; past it the file is mostly not a nodeguard config.
pub const MAX_ERRORS: usize = 100;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
    /// An enum variant or a key serde could not name: reported, not located in the tree.
    Opaque(String),
}

/// What was pruned, in the user's own indices.
#[derive(Debug, Default)]
pub struct Pruned {
    /// Original indices removed from each sequence, by the sequence's original path.
    removed: HashMap<String, Vec<usize>>,
    /// Original paths of the pruned nodes.
    paths: Vec<String>,
    /// Some errors went unreported past [`MAX_ERRORS`].
    pub capped: bool,
}

impl Pruned {
    /// The user's path of a path into the pruned tree.
    fn original(&self, segs: &[Seg]) -> Vec<Seg> {
        let mut out: Vec<Seg> = Vec::with_capacity(segs.len());
        for s in segs {
            let s = match s {
                Seg::Index(i) => {
                    let mut o = *i;
                    if let Some(gone) = self.removed.get(&render(&out)) {
                        // `gone` is sorted: each removed index at or before `o` shifts it on.
                        for g in gone {
                            if *g <= o {
                                o += 1;
                            }
                        }
                    }
                    Seg::Index(o)
                }
                other => other.clone(),
            };
            out.push(s);
        }
        out
    }

    fn record(&mut self, orig: &[Seg]) {
        if let Some((Seg::Index(i), parent)) = orig.split_last() {
            let gone = self.removed.entry(render(parent)).or_default();
            let at = gone.partition_point(|g| g < i);
            gone.insert(at, *i);
        }
        self.paths.push(render(orig));
    }

    /// Maps a validation error's path (built on the pruned tree) back to the user's indices;
    /// `None` when it is about a pruned node, whose type error was already reported.
    pub fn translate(&self, path: &str) -> Option<String> {
        let orig = render(&self.original(&parse_path(path)));
        let under = |p: &String| {
            orig == *p
                || orig
                    .strip_prefix(p.as_str())
                    .is_some_and(|r| r.starts_with(['.', '[']))
        };
        (!self.paths.iter().any(under)).then_some(orig)
    }
}

/// Deserializes the section `key`, recording each type error with its full path. `None` when the
/// section as a whole is unusable (its defaults apply).
pub fn section<T: DeserializeOwned>(
    key: &str,
    value: &Value,
    errs: &mut Vec<FieldError>,
    pruned: &mut Pruned,
) -> Option<T> {
    let mut tree = value.clone();
    let root = [Seg::Key(key.to_owned())];
    // Required fields pruned for a bad value: their "missing field" error says nothing new.
    let mut pruned_fields: Vec<(Vec<Seg>, String)> = Vec::new();
    loop {
        let err = match serde_path_to_error::deserialize::<_, T>(&tree) {
            Ok(t) => return Some(t),
            Err(e) => e,
        };
        if errs.len() >= MAX_ERRORS {
            pruned.capped = true;
            return None;
        }
        let segs: Vec<Seg> = err.path().iter().map(seg).collect();
        let message = err.into_inner().to_string();
        let full: Vec<Seg> = root.iter().cloned().chain(segs.iter().cloned()).collect();
        let orig = pruned.original(&full);
        let repeat = pruned_fields
            .iter()
            .any(|(p, f)| *p == orig && message == format!("missing field `{f}`"));
        if !repeat {
            errs.push(FieldError {
                path: render(&orig),
                message,
            });
        }
        // Prune the deepest node that can be located in the tree.
        let locatable = segs
            .iter()
            .position(|s| matches!(s, Seg::Opaque(_)))
            .unwrap_or(segs.len());
        let at = &segs[..locatable];
        if at.is_empty() || !remove(&mut tree, at) {
            return None;
        }
        let orig_at = &orig[..=locatable];
        if let Some((Seg::Key(f), parent)) = orig_at.split_last() {
            pruned_fields.push((parent.to_vec(), f.clone()));
        }
        pruned.record(orig_at);
    }
}

fn seg(s: &serde_path_to_error::Segment) -> Seg {
    use serde_path_to_error::Segment;
    match s {
        Segment::Seq { index } => Seg::Index(*index),
        Segment::Map { key } => Seg::Key(key.clone()),
        Segment::Enum { variant } => Seg::Opaque(variant.clone()),
        Segment::Unknown => Seg::Opaque("?".into()),
    }
}

/// Removes the node at `path` (non-empty); false when it is not in the tree.
fn remove(tree: &mut Value, path: &[Seg]) -> bool {
    let Some((last, parent)) = path.split_last() else {
        return false;
    };
    let mut node = tree;
    for s in parent {
        let next = match (s, node) {
            (Seg::Key(k), Value::Mapping(m)) => {
                m.iter_mut().find(|(mk, _)| key_is(mk, k)).map(|(_, v)| v)
            }
            (Seg::Index(i), Value::Sequence(v)) => v.get_mut(*i),
            _ => None,
        };
        match next {
            Some(n) => node = n,
            None => return false,
        }
    }
    match (last, node) {
        (Seg::Key(k), Value::Mapping(m)) => {
            let before = m.len();
            m.retain(|mk, _| !key_is(mk, k));
            m.len() < before
        }
        (Seg::Index(i), Value::Sequence(v)) if *i < v.len() => {
            v.remove(*i);
            true
        }
        _ => false,
    }
}

/// Whether a YAML key is the one serde_path_to_error names `k` (it names scalars by value).
fn key_is(key: &Value, k: &str) -> bool {
    match key {
        Value::String(s) => s == k,
        Value::Number(n) => n.to_string() == k,
        Value::Bool(b) => b.to_string() == k,
        _ => false,
    }
}

fn render(segs: &[Seg]) -> String {
    let mut out = String::new();
    for s in segs {
        match s {
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
            Seg::Key(k) | Seg::Opaque(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
        }
    }
    out
}

/// `a.b[2].c` -> segments (validation paths are built from field names, so `.` and `[` only
/// ever separate).
fn parse_path(path: &str) -> Vec<Seg> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (name, mut rest) = part.split_once('[').map_or((part, ""), |(n, r)| (n, r));
        if !name.is_empty() {
            out.push(Seg::Key(name.to_owned()));
        }
        while let Some((idx, after)) = rest.split_once(']') {
            match idx.parse() {
                Ok(i) => out.push(Seg::Index(i)),
                Err(_) => out.push(Seg::Opaque(idx.to_owned())),
            }
            rest = after.strip_prefix('[').unwrap_or(after);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Item {
        name: String,
        #[serde(default)]
        on: bool,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Sec {
        a: u32,
        b: bool,
        items: Vec<Item>,
    }

    fn run(yaml: &str) -> (Option<Sec>, Vec<FieldError>, Pruned) {
        let v: Value = serde_norway::from_str(yaml).unwrap();
        let mut errs = Vec::new();
        let mut pruned = Pruned::default();
        let s = section::<Sec>("s", &v, &mut errs, &mut pruned);
        (s, errs, pruned)
    }

    #[test]
    fn every_type_error_of_a_section_with_original_indices() {
        let (s, errs, pruned) = run(
            "a: x\nb: 3\nitems:\n  - {on: true}\n  - {name: ok, on: 7}\n  - {name: n3, bad: 1}\n  - {name: last}\n",
        );
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "s.a",
                "s.b",
                "s.items[0]",
                "s.items[1].on",
                "s.items[2].bad"
            ]
        );
        let s = s.unwrap();
        assert_eq!(s.items.len(), 3, "{s:?}");
        assert_eq!(s.items[2].name, "last");
        // Validation of the pruned tree names the user's element, and not pruned nodes.
        assert_eq!(
            pruned.translate("s.items[2].name").as_deref(),
            Some("s.items[3].name")
        );
        assert_eq!(
            pruned.translate("s.items[0].name").as_deref(),
            Some("s.items[1].name")
        );
        assert_eq!(pruned.translate("s.items[0].on"), None);
        assert_eq!(pruned.translate("s.a"), None);
    }

    #[test]
    fn a_pruned_required_field_is_reported_once() {
        let (_, errs, _) = run("items:\n  - {name: [1]}\n  - {name: ok}\n");
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].path, "s.items[0].name");
    }

    #[test]
    fn a_wrong_section_type_is_one_error() {
        let (s, errs, _) = run("[1, 2]");
        assert!(s.is_none());
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].path, "s");
    }

    #[test]
    fn paths_round_trip() {
        for p in [
            "a",
            "a.b",
            "a.b[2].c",
            "a[1][2]",
            "guard.rules[10].restart_loop.window",
        ] {
            assert_eq!(render(&parse_path(p)), p);
        }
    }
}
