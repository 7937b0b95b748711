//! The rule file as Kubernetes objects: its `groups:` becomes the `spec` of a VMRule or a
//! PrometheusRule. Done on the text, not through a YAML model, so every comment of the source
//! reaches the object and nothing is re-quoted; scripts/ship-check parses both and compares.

use std::fmt::Write as _;

pub const SOURCE: &str = "daemonset/rules/nodeguard.rules.yaml";
pub const RUNBOOK_DIR: &str = "/docs/runbooks/";

/// Which operator's rule object to write.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    VmRule,
    PrometheusRule,
}

impl Kind {
    fn api_version(self) -> &'static str {
        match self {
            Kind::VmRule => "operator.victoriametrics.com/v1beta1",
            Kind::PrometheusRule => "monitoring.coreos.com/v1",
        }
    }
    fn kind(self) -> &'static str {
        match self {
            Kind::VmRule => "VMRule",
            Kind::PrometheusRule => "PrometheusRule",
        }
    }
}

/// The source must be comments and exactly one top-level key, `groups:`, and every runbook_url
/// must be `<prefix>/docs/runbooks/<alert>.md` with a single prefix (the one kustomize replaces).
pub fn check_source(src: &str) -> Result<String, String> {
    let mut tops = Vec::new();
    for (n, line) in src.lines().enumerate() {
        if line.contains('\t') {
            return Err(format!("{SOURCE}:{}: tab character", n + 1));
        }
        let first = line.chars().next();
        if first.is_some_and(|c| c != ' ' && c != '#') {
            tops.push((n + 1, line));
        }
    }
    match tops.as_slice() {
        [(_, "groups:")] => {}
        [] => return Err(format!("{SOURCE}: no top-level `groups:`")),
        _ => {
            let keys: Vec<String> = tops.iter().map(|(n, l)| format!("{n}: {l}")).collect();
            return Err(format!(
                "{SOURCE}: the only top-level key must be `groups:`, found {}",
                keys.join("; ")
            ));
        }
    }
    let mut prefixes: Vec<&str> = Vec::new();
    let mut alert = None;
    for (n, line) in src.lines().enumerate() {
        let t = line.trim_start();
        if let Some(a) = t.strip_prefix("- alert: ") {
            alert = Some(a.trim());
        }
        if let Some(url) = t.strip_prefix("runbook_url: ") {
            let url = url.trim();
            let (prefix, page) = url.split_once(RUNBOOK_DIR).ok_or_else(|| {
                format!("{SOURCE}:{}: runbook_url {url} has no {RUNBOOK_DIR}", n + 1)
            })?;
            let want = format!("{}.md", alert.unwrap_or("?"));
            if page != want {
                return Err(format!(
                    "{SOURCE}:{}: runbook_url {url} should end in {want}",
                    n + 1
                ));
            }
            if !prefixes.contains(&prefix) {
                prefixes.push(prefix);
            }
        }
    }
    match prefixes.as_slice() {
        [one] => Ok((*one).to_owned()),
        [] => Err(format!("{SOURCE}: no runbook_url")),
        many => Err(format!("{SOURCE}: runbook_url prefixes differ: {many:?}")),
    }
}

/// The object: a generated-file header, metadata, and the source from `groups:` on, indented
/// under `spec:`.
pub fn render(src: &str, kind: Kind) -> Result<String, String> {
    check_source(src)?;
    let start = src
        .lines()
        .position(|l| l == "groups:")
        .ok_or_else(|| format!("{SOURCE}: no top-level `groups:`"))?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# GENERATED from {SOURCE} by `cargo run --bin nodeguard-gen`: edit the source, not this\n\
         # file (scripts/ship-check fails when they drift). Runbook links: docs/deploy.md."
    );
    let _ = writeln!(out, "apiVersion: {}", kind.api_version());
    let _ = writeln!(out, "kind: {}", kind.kind());
    out.push_str(
        "metadata:\n  name: nodeguard\n  namespace: nodeguard\n  labels:\n    \
         app.kubernetes.io/name: nodeguard\nspec:\n",
    );
    for line in src.lines().skip(start) {
        if line.is_empty() {
            out.push('\n');
        } else {
            let _ = writeln!(out, "  {line}");
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "# header, dropped\n\
        \n\
        groups:\n\
        \x20 - name: g\n\
        \x20   rules:\n\
        \x20     # kept\n\
        \x20     - alert: A\n\
        \x20       expr: up == 0\n\
        \n\
        \x20       annotations:\n\
        \x20         runbook_url: https://x.example/r/docs/runbooks/A.md\n";

    #[test]
    fn wraps_groups_under_spec_with_comments() {
        let out = render(SRC, Kind::VmRule).unwrap();
        assert!(out.contains("apiVersion: operator.victoriametrics.com/v1beta1\nkind: VMRule\n"));
        assert!(out.contains("spec:\n  groups:\n    - name: g\n      rules:\n        # kept\n"));
        assert!(
            out.contains("expr: up == 0\n\n          annotations:"),
            "blank lines stay blank"
        );
        assert!(!out.contains("header, dropped"));
        let p = render(SRC, Kind::PrometheusRule).unwrap();
        assert!(p.contains("apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\n"));
    }

    #[test]
    fn one_prefix_found() {
        assert_eq!(check_source(SRC).unwrap(), "https://x.example/r");
    }

    #[test]
    fn rejects_other_top_level_keys_and_tabs() {
        let e = check_source(&format!("{SRC}extra: 1\n")).unwrap_err();
        assert!(e.contains("extra: 1"), "{e}");
        assert!(check_source("# nothing\n")
            .unwrap_err()
            .contains("no top-level"));
        assert!(check_source(&SRC.replace("expr", "\texpr"))
            .unwrap_err()
            .contains("tab"));
    }

    #[test]
    fn rejects_mixed_or_misnamed_runbooks() {
        let two = format!(
            "{SRC}      - alert: B\n        annotations:\n          runbook_url: https://y.example/docs/runbooks/B.md\n"
        );
        assert!(check_source(&two).unwrap_err().contains("prefixes differ"));
        let wrong = SRC.replace("runbooks/A.md", "runbooks/B.md");
        assert!(check_source(&wrong)
            .unwrap_err()
            .contains("should end in A.md"));
        let rel = SRC.replace("https://x.example/r/docs/runbooks/", "runbooks/");
        assert!(check_source(&rel)
            .unwrap_err()
            .contains("has no /docs/runbooks/"));
    }
}
