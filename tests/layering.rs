//! Data flows one way: no module of `src/` names a module of a stage downstream of it. The
//! stages, from the ground up, are the rows of `LAYERS`; a module may name its own row's module
//! and any row below, never one above. A new top-level module must be given a row here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// From the ground up. `model` names nothing in the crate.
const LAYERS: &[&[&str]] = &[
    &["model"],
    &["clock", "error"],
    &["fsio"],
    &["cgroupfs"],
    &["config"],
    &["discover"],
    &["sample"],
    &["signal"],
    &["rule"],
    &["action"],
    &["export", "status"],
    &["agent"],
    &["cli"],
    &["lib", "main"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|row| row.contains(&module))
}

/// The source with comments, string and char literals blanked, so only code is searched.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.extend_from_slice(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if b[i] == b'r' && matches!(b.get(i + 1), Some(b'"' | b'#')) && !ident(b, i) {
            // Raw string: r"..." or r#"..."#.
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let start = i + 2 + hashes;
            let end = b[start..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |p| start + p + close.len());
            for &c in &b[i..end] {
                blank(&mut out, c);
            }
            i = end;
        } else if b[i] == b'"' {
            blank(&mut out, b[i]);
            i += 1;
            while i < b.len() && b[i] != b'"' {
                let n = if b[i] == b'\\' { 2 } else { 1 };
                for &c in &b[i..(i + n).min(b.len())] {
                    blank(&mut out, c);
                }
                i += n;
            }
            if i < b.len() {
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), or a lifetime (left as it is).
            let len = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..].iter().position(|&c| c == b'\'').map(|p| p + 3)
            } else {
                let ch = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (b.get(i + 1 + ch) == Some(&b'\'')).then_some(ch + 2)
            };
            let n = len.unwrap_or(1);
            for &c in &b[i..(i + n).min(b.len())] {
                blank(&mut out, c);
            }
            i += n;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `b[i]` continues an identifier (so `r"` in `for"` is no raw string).
fn ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// The top-level modules a file names through `crate::`, with the line of each.
fn named_modules(code: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let b = code.as_bytes();
        if ident(b, at) || (at > 0 && b[at - 1] == b'$') {
            continue;
        }
        let line = code[..at].matches('\n').count() + 1;
        let rest = &code[at + "crate::".len()..];
        let rest = rest.trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::X, b}`: the first segment of each top-level item.
            let mut depth = 0;
            let mut item_start = true;
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_ascii_alphabetic() || c == '_') => {
                        item_start = false;
                        let name: String = group[k..]
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        let l = line + group[..k].matches('\n').count();
                        found.push((name, l));
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            found.push((name, line));
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The library's files and the top-level module each belongs to (binaries are crates of their
/// own and name the library by `nodeguard::`).
fn library() -> Vec<(PathBuf, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .filter_map(|p| {
            let rel = p.strip_prefix(&src).expect("under src").to_path_buf();
            let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
            if first == "bin" {
                return None;
            }
            let module = first.strip_suffix(".rs").unwrap_or(&first).to_owned();
            Some((p, module))
        })
        .collect()
}

/// Every downstream name, as `file:line: a (layer i) names b (layer j)`.
fn violations() -> Vec<String> {
    let mut bad = Vec::new();
    for (path, module) in library() {
        let Some(own) = layer(&module) else {
            bad.push(format!(
                "{}: module `{module}` has no row in LAYERS",
                path.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(&path).expect("read source");
        for (name, line) in named_modules(&code_only(&text)) {
            if name == module || name == "self" {
                continue;
            }
            match layer(&name) {
                Some(l) if l < own => {}
                Some(l) => bad.push(format!(
                    "{}:{line}: `{module}` (layer {own}) names `crate::{name}` (layer {l}): \
                     downstream or beside it",
                    path.display()
                )),
                None => bad.push(format!(
                    "{}:{line}: `crate::{name}` is no module with a row in LAYERS",
                    path.display()
                )),
            }
        }
    }
    bad
}

#[test]
fn no_module_names_a_stage_downstream_of_it() {
    let bad = violations();
    assert!(
        bad.is_empty(),
        "imports against the data flow:\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_library_module_has_a_layer() {
    let modules: BTreeSet<String> = library().into_iter().map(|(_, m)| m).collect();
    for m in &modules {
        assert!(layer(m).is_some(), "{m} has no row in LAYERS");
    }
    // The check reads what it claims to: all stages are there, and the model is on the ground.
    for m in [
        "model", "config", "discover", "sample", "signal", "rule", "action", "export",
    ] {
        assert!(modules.contains(m), "{m} not found under src/");
    }
    assert_eq!(layer("model"), Some(0));
}

#[test]
fn the_scanner_sees_imports_and_skips_comments_and_strings() {
    let src = r##"
//! See `crate::agent` for the wiring.
use crate::model::Snapshot;
use crate::{
    clock::Clock,
    sample::{logs::LineCounts, pids},
};
/* crate::export in a /* nested */ comment */
const S: &str = "crate::action";
const R: &str = r#"crate::cli"#;
const C: char = '"';
fn f<'a>(x: &'a str) -> crate::rule::Target { crate::signal::g(x) }
macro_rules! m { () => { $crate::status::x() } }
"##;
    let names: Vec<(String, usize)> = named_modules(&code_only(src));
    let names: Vec<(&str, usize)> = names.iter().map(|(n, l)| (n.as_str(), *l)).collect();
    assert_eq!(
        names,
        [
            ("model", 3),
            ("clock", 5),
            ("sample", 6),
            ("rule", 12),
            ("signal", 12)
        ]
    );
}

#[test]
fn a_downstream_import_is_reported() {
    // `sample` naming the snapshot's old home in `agent` would be caught.
    let names = named_modules(&code_only("use crate::agent::Agent;\n"));
    let own = layer("sample").expect("sample");
    let bad: Vec<_> = names
        .iter()
        .filter(|(n, _)| layer(n).is_some_and(|l| l >= own))
        .collect();
    assert_eq!(bad.len(), 1);
}
