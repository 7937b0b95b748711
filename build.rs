//! Stamps the build with its source revision (`nodeguard_build_info{revision}`): the
//! `NODEGUARD_REVISION` environment variable when set (image builds pass it), else the git commit
//! of this checkout, else nothing (the binary says `unknown`). A tarball without `.git`, or one
//! unpacked inside some other repository, builds the same way and never fails here.

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=NODEGUARD_REVISION");
    if let Some(r) = std::env::var("NODEGUARD_REVISION")
        .ok()
        .filter(|r| !r.trim().is_empty())
    {
        println!("cargo:rustc-env=NODEGUARD_REVISION={}", r.trim());
        return;
    }
    let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") else {
        return;
    };
    let dir = Path::new(&dir);
    // Only this crate's own repository: not one that happens to enclose an unpacked tarball.
    let top = git(dir, &["rev-parse", "--show-toplevel"]);
    let ours = top.is_some_and(|t| {
        let (a, b) = (Path::new(&t).canonicalize(), dir.canonicalize());
        matches!((a, b), (Ok(a), Ok(b)) if a == b)
    });
    if !ours {
        return;
    }
    if let Some(rev) = git(dir, &["rev-parse", "--short=12", "HEAD"]) {
        println!("cargo:rustc-env=NODEGUARD_REVISION={rev}");
    }
    // Rebuild the stamp when HEAD moves: HEAD itself, and the branch it points to (worktrees
    // keep these outside `.git/`, which `--git-path` resolves).
    for p in ["HEAD", "packed-refs"] {
        if let Some(path) = git(dir, &["rev-parse", "--git-path", p]) {
            rerun_if_exists(dir, &path);
        }
    }
    if let Some(r) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        if let Some(path) = git(dir, &["rev-parse", "--git-path", &r]) {
            rerun_if_exists(dir, &path);
        }
    }
}

/// A missing path would make cargo rerun this script on every build.
fn rerun_if_exists(dir: &Path, path: &str) {
    let p = dir.join(path);
    if p.exists() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
