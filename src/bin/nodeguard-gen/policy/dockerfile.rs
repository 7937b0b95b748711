//! The Dockerfile: multi-stage, the build stage on `$BUILDPLATFORM` cross-compiling both musl
//! targets with a pinned cargo auditable, a scratch or distroless-static final stage, and a build
//! context (.dockerignore, an allow-list) that lets every COPY source in and keeps target/, .git
//! and tests/ out.

use super::Report;

/// Instructions with continuation lines joined; comment lines between instructions dropped.
fn instructions(text: &str) -> Vec<String> {
    let (mut out, mut cur) = (Vec::new(), String::new());
    for raw in text.lines() {
        if raw.trim_start().starts_with('#') && cur.is_empty() {
            continue;
        }
        if let Some(s) = raw.strip_suffix('\\') {
            cur.push_str(s);
            cur.push(' ');
            continue;
        }
        cur.push_str(raw);
        if !cur.trim().is_empty() {
            out.push(cur.trim().to_owned());
        }
        cur.clear();
    }
    out
}

/// Whether the build context includes `path` (last matching pattern wins, `!` re-includes).
pub fn included(ignore: &str, path: &str) -> bool {
    let mut ok = true;
    for pat in ignore.lines().map(str::trim) {
        if pat.is_empty() || pat.starts_with('#') {
            continue;
        }
        let (neg, pat) = match pat.strip_prefix('!') {
            Some(p) => (true, p),
            None => (false, pat),
        };
        let pat = pat.trim_matches('/');
        if super::yaml::glob(pat, path) || path.starts_with(&format!("{pat}/")) {
            ok = neg;
        }
    }
    ok
}

pub fn check(dockerfile: &str, ignore: &str, exists: impl Fn(&str) -> bool, r: &mut Report) {
    let lines = instructions(dockerfile);
    let upper = |l: &str| l.to_ascii_uppercase();
    let froms: Vec<&String> = lines
        .iter()
        .filter(|l| upper(l).starts_with("FROM "))
        .collect();
    if froms.len() < 2 {
        r.fail("not multi-stage");
    }
    if !froms
        .first()
        .is_some_and(|f| f.contains("--platform=$BUILDPLATFORM"))
    {
        r.fail("the build stage must run on $BUILDPLATFORM and cross-compile");
    }
    if let Some(last) = froms.last() {
        let words: Vec<&str> = last.split_whitespace().collect();
        let named = upper(last).contains(" AS ");
        let image = if named {
            words.get(words.len().saturating_sub(3))
        } else {
            words.last()
        };
        let image = image.copied().unwrap_or("");
        if !(image == "scratch" || image.starts_with("gcr.io/distroless/static")) {
            r.fail(format!(
                "final stage {image} is not scratch or distroless static"
            ));
        }
    }
    let text = lines.join("\n");
    for arch in ["amd64", "arm64"] {
        if !text.contains(arch) {
            r.fail(format!("TARGETARCH {arch} not handled"));
        }
    }
    for t in ["x86_64-unknown-linux-musl", "aarch64-unknown-linux-musl"] {
        if !text.contains(t) {
            r.fail(format!("target {t} not built"));
        }
    }
    // Scanners read the dependency list cargo auditable embeds (docs/release.md).
    let pinned = text.split("cargo install --locked ").skip(1).any(|rest| {
        rest.split_whitespace()
            .next()
            .is_some_and(|w| w.contains("cargo-auditable@"))
    });
    if !pinned || !text.contains("cargo auditable build --release --locked") {
        r.fail("the binary must be built with a pinned cargo auditable (cargo auditable build --release --locked)");
    }
    for l in &lines {
        if !upper(l).starts_with("COPY ") || l.contains("--from=") {
            continue;
        }
        let args: Vec<&str> = l
            .split_whitespace()
            .skip(1)
            .filter(|a| !a.starts_with("--"))
            .collect();
        for src in args.iter().take(args.len().saturating_sub(1)) {
            let src = src.strip_prefix("./").unwrap_or(src.trim_end_matches('/'));
            if !exists(src) {
                r.fail(format!("COPY {src}: no such path"));
            } else if !included(ignore, src) {
                r.fail(format!("COPY {src}: excluded by .dockerignore"));
            } else {
                r.ok(format!("COPY {src}"));
            }
        }
    }
    for must_not in ["target", ".git", "tests"] {
        if included(ignore, must_not) {
            r.fail(format!(
                ".dockerignore lets {must_not}/ into the build context"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn shipped() -> (String, String) {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        (
            std::fs::read_to_string(repo.join("Dockerfile")).unwrap(),
            std::fs::read_to_string(repo.join(".dockerignore")).unwrap(),
        )
    }

    fn exists(p: &str) -> bool {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(p).exists()
    }

    #[test]
    fn the_shipped_dockerfile_passes() {
        let (d, i) = shipped();
        let mut r = Report::default();
        check(&d, &i, exists, &mut r);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
    }

    #[test]
    fn a_context_that_lets_tests_in_or_keeps_a_copy_out_fails() {
        let (d, i) = shipped();
        let mut r = Report::default();
        check(&d, &i.replace("!src\n", "!tests\n"), exists, &mut r);
        assert!(
            r.has("COPY src: excluded by .dockerignore"),
            "{:?}",
            r.errors
        );
        assert!(r.has("lets tests/ into"), "{:?}", r.errors);
    }

    #[test]
    fn single_stage_and_unpinned_auditable_fail() {
        let d = "FROM rust:1 AS build\nRUN cargo install cargo-auditable\nCOPY nothere ./\n";
        let mut r = Report::default();
        check(d, "*\n", |_| false, &mut r);
        for e in [
            "not multi-stage",
            "$BUILDPLATFORM",
            "pinned cargo auditable",
            "COPY nothere: no such path",
            "TARGETARCH amd64",
        ] {
            assert!(r.has(e), "{e}: {:?}", r.errors);
        }
    }

    #[test]
    fn continuation_lines_join_and_comments_drop() {
        let got = instructions("# c\nRUN a \\\n  b\n\nCOPY x y\n");
        assert_eq!(got, ["RUN a    b", "COPY x y"]);
    }
}
