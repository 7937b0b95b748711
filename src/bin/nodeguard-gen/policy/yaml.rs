//! The few YAML and path helpers the checks share.

use serde::Deserialize;
use serde_norway::Value;
use std::path::Path;

/// Every non-empty document of a multi-document YAML text.
pub fn docs(text: &str) -> Result<Vec<Value>, serde_norway::Error> {
    let mut out = Vec::new();
    for d in serde_norway::Deserializer::from_str(text) {
        let v = Value::deserialize(d)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

/// One YAML document from a file under `repo`, with the path in the error.
pub fn load(repo: &Path, rel: &str) -> Result<Value, String> {
    let text = read(repo, rel)?;
    serde_norway::from_str(&text).map_err(|e| format!("{rel}: not YAML: {e}"))
}

pub fn read(repo: &Path, rel: &str) -> Result<String, String> {
    std::fs::read_to_string(repo.join(rel)).map_err(|e| format!("{rel}: {e}"))
}

/// Documents back to one YAML stream (for the schema validator).
pub fn dump_all(docs: &[&Value]) -> Result<String, String> {
    let mut out = String::new();
    for d in docs {
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(d).map_err(|e| e.to_string())?);
    }
    Ok(out)
}

pub fn seq(v: &Value) -> &[Value] {
    v.as_sequence().map_or(&[], |s| s.as_slice())
}

pub fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// Key/value pairs of a mapping (string keys only), empty for anything else.
pub fn pairs(v: &Value) -> impl Iterator<Item = (&str, &Value)> {
    v.as_mapping()
        .into_iter()
        .flat_map(|m| m.iter())
        .filter_map(|(k, v)| k.as_str().map(|k| (k, v)))
}

/// Every pair of `sub` is in `sup` (a selector matches a label set).
pub fn subset(sub: &Value, sup: &Value) -> bool {
    pairs(sub).all(|(k, v)| sup[k] == *v)
}

/// `os.path.normpath(os.path.join(base, rel))` on `/`-separated relative paths.
pub fn join(base: &str, rel: &str) -> String {
    let mut parts: Vec<&str> = base
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    for p in rel.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

pub fn dirname(p: &str) -> &str {
    p.rsplit_once('/').map_or("", |(d, _)| d)
}

pub fn basename(p: &str) -> &str {
    p.rsplit_once('/').map_or(p, |(_, b)| b)
}

/// A Prometheus duration (`5m`, `1h30m`, `250ms`).
pub fn is_duration(s: &str) -> bool {
    let mut rest = s;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "s", "m", "h", "d", "w", "y"]
            .into_iter()
            .find(|u| rest.starts_with(u));
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

/// Every `nodeguard_[a-z_]+` word in a text (a metric family or series name).
pub fn metric_names(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(off) = text[i..].find("nodeguard_") {
        let start = i + off;
        let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
        let mut end = start + "nodeguard_".len();
        while end < b.len() && (b[end].is_ascii_lowercase() || b[end] == b'_') {
            end += 1;
        }
        let bounded = (start == 0 || !word(b[start - 1])) && (end == b.len() || !word(b[end]));
        if bounded && end > start + "nodeguard_".len() {
            out.push(&text[start..end]);
        }
        i = end;
    }
    out
}

/// Shell-style glob (`*`, `?`), where `*` also matches `/` as Python's fnmatch does.
pub fn glob(pat: &str, s: &str) -> bool {
    fn go(p: &[u8], s: &[u8]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((b'*', rest)) => (0..=s.len()).any(|i| go(rest, &s[i..])),
            Some((b'?', rest)) => !s.is_empty() && go(rest, &s[1..]),
            Some((c, rest)) => s.first() == Some(c) && go(rest, &s[1..]),
        }
    }
    go(pat.as_bytes(), s.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_join_like_normpath() {
        assert_eq!(
            join("daemonset/examples/gitops", "../../base"),
            "daemonset/base"
        );
        assert_eq!(join("daemonset", "./base/x.yaml"), "daemonset/base/x.yaml");
        assert_eq!(dirname("a/b/c.yaml"), "a/b");
        assert_eq!(basename("a/b/c.yaml"), "c.yaml");
    }

    #[test]
    fn durations() {
        for ok in ["5m", "1h30m", "250ms", "0s", "2w"] {
            assert!(is_duration(ok), "{ok}");
        }
        for bad in ["", "5", "m", "5 m", "1.5h", "5min"] {
            assert!(!is_duration(bad), "{bad}");
        }
    }

    #[test]
    fn metric_names_are_whole_words() {
        assert_eq!(
            metric_names("rate(nodeguard_a_total[5m]) / xnodeguard_b + nodeguard_c:ratio"),
            ["nodeguard_a_total", "nodeguard_c"]
        );
    }

    #[test]
    fn globs() {
        assert!(glob("*", "src/main.rs"));
        assert!(glob("src", "src"));
        assert!(glob("*.rs", "a/b.rs"));
        assert!(!glob("src", "srcx"));
        assert!(glob("a?c", "abc"));
    }

    #[test]
    fn multi_document_streams() {
        let d = docs("a: 1\n---\n---\nb: 2\n").unwrap();
        assert_eq!(d.len(), 2);
        assert!(subset(&d[0], &d[0]));
        assert!(!subset(&d[0], &d[1]));
    }
}
