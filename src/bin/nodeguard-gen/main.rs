//! `nodeguard-gen`: writes the shipped objects that are derived from other files, so they are
//! never edited by hand: the VMRule and PrometheusRule (from daemonset/rules/nodeguard.rules.yaml),
//! the Grafana dashboard (from the panel table in dashboard.rs) and its ConfigMap, and the man
//! pages (from the CLI's definition, man.rs).
//! `--check` writes nothing and fails when a committed file differs (scripts/ship-check).
//! The subcommands are ship-check's own policy checks of what ships (`policy`, `gitops`) and the
//! YAML reshapes it needs for outside tools (`split-crds`, `spec`); see [`policy`]; and the
//! benchmark scripts' summary tables (`bench-summary`).

mod bench;
mod dashboard;
mod man;
mod policy;
mod rules;

use clap::{Parser, Subcommand};
use policy::{manifests, yaml, Report};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Generate the VMRule, PrometheusRule and Grafana dashboard objects")]
struct Args {
    /// Compare with the committed files instead of writing them; exit 1 on any difference.
    #[arg(long)]
    check: bool,
    /// Repository root.
    #[arg(long, global = true, default_value = env!("CARGO_MANIFEST_DIR"))]
    root: PathBuf,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Policy checks of daemonset/, the alert rules, the Alertmanager example and the Dockerfile.
    /// Writes into WORK what the script runs outside tools on: core.txt (files of core objects),
    /// kustomizations.txt (overlays to render), patches.txt, nodeguard.yaml (the shipped config).
    Policy {
        #[arg(long)]
        work: PathBuf,
    },
    /// The API server's semantic pod rules (policy/apiserver.rs) on every DaemonSet of each
    /// rendered FILE (`kubectl kustomize` output of a combination `policy` wrote, or an overlay).
    Semantics { files: Vec<PathBuf> },
    /// Checks the rendered GitOps example (kubectl kustomize daemonset/examples/gitops) and the
    /// ArgoCD Application.
    Gitops { rendered: PathBuf },
    /// Writes FILE.core.yaml: the objects of FILE that have a Kubernetes schema (CRDs left out).
    SplitCrds { file: PathBuf },
    /// Writes the `spec` of the rule object in FILE to OUT, as a rule file.
    Spec { file: PathBuf, out: PathBuf },
    /// Prints the summary table of the whole-node scenario's JSON files in DIR (scripts/bench,
    /// scripts/bench-cost).
    BenchSummary {
        #[arg(value_enum)]
        kind: bench::Kind,
        dir: PathBuf,
        /// Seconds the benchmark took (printed last).
        #[arg(long)]
        took: Option<u64>,
    },
}

/// `policy`: every check; the lists for the script written even when a check fails.
fn policy(repo: &Path, work: &Path) -> Result<Report, String> {
    let mut r = Report::default();
    println!("  -- manifests: structure, cross-references, checkov skips");
    let tree = manifests::Tree::load(repo, &mut r);
    let layout = manifests::Layout::new(repo, &tree, &mut r);
    let write = |name: &str, lines: &[String]| {
        let mut text = lines.join("\n");
        text.push('\n');
        std::fs::write(work.join(name), text)
            .map_err(|e| format!("{}: {e}", work.join(name).display()))
    };
    write("core.txt", &layout.core_files(&tree))?;
    write("kustomizations.txt", &layout.builds)?;
    write("combinations.txt", &combinations(repo, work, &tree)?)?;
    write(
        "patches.txt",
        &layout.patches.iter().cloned().collect::<Vec<_>>(),
    )?;
    let groups = yaml::load(repo, policy::alerts::RULES)?["groups"].clone();
    let json: serde_json::Value = serde_json::from_str(&yaml::read(repo, dashboard::JSON_PATH)?)
        .map_err(|e| format!("{}: {e}", dashboard::JSON_PATH))?;
    let objs = layout.objects(&tree);
    if let Some(cfg) = manifests::check_objects(&objs, &groups, &json, &mut r) {
        let p = work.join("nodeguard.yaml");
        std::fs::write(&p, cfg).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    r.note(format!(
        "{} objects in {} files, {} kustomizations",
        objs.len(),
        layout.referenced.len(),
        layout.kustomizations.len()
    ));
    println!(
        "  -- rules: labels, runbooks, metric names, test coverage; Alertmanager inhibit rules"
    );
    policy::alerts::run(repo, &mut r)?;
    println!("  -- Dockerfile: stages, platforms, build context");
    policy::dockerfile::check(
        &yaml::read(repo, "Dockerfile")?,
        &yaml::read(repo, ".dockerignore")?,
        |p| repo.join(p).exists(),
        &mut r,
    );
    println!("  -- documentation and manifest comments: the daemonset/ and docs/ paths they name");
    policy::docpaths::check(repo, &mut r);
    Ok(r)
}

/// Writes WORK/combos/<name>/kustomization.yaml for every combination of the pod components on
/// the base ([`manifests::combinations`]); returns their directories.
fn combinations(repo: &Path, work: &Path, tree: &manifests::Tree) -> Result<Vec<String>, String> {
    let canon = |p: &Path| {
        p.canonicalize()
            .map_err(|e| format!("{}: {e}", p.display()))
    };
    // Every combination sits two levels under WORK (names without `/`): one way back for all.
    let up = manifests::relative(&canon(work)?.join("combos/x"), &canon(repo)?);
    let mut dirs = Vec::new();
    for (name, text) in manifests::combinations(&manifests::pod_components(tree), &up) {
        let dir = work.join("combos").join(&name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join("kustomization.yaml");
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        dirs.push(dir.display().to_string());
    }
    Ok(dirs)
}

fn subcommand(repo: &Path, cmd: Cmd) -> Result<bool, String> {
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    match cmd {
        Cmd::Policy { work } => Ok(policy(repo, &work)?.errors.is_empty()),
        Cmd::Semantics { files } => {
            let mut r = Report::default();
            for f in &files {
                let what = f.file_name().map_or_else(
                    || f.display().to_string(),
                    |n| n.to_string_lossy().into_owned(),
                );
                policy::apiserver::check_rendered(&read(f)?, &what, &mut r);
            }
            Ok(r.errors.is_empty())
        }
        Cmd::Gitops { rendered } => {
            let mut r = Report::default();
            policy::gitops::check(
                &read(&rendered)?,
                &yaml::load(repo, "daemonset/examples/gitops/runbook-url.yaml")?,
                &yaml::load(repo, "daemonset/examples/argocd/application.yaml")?,
                |p| repo.join(p).is_file(),
                &mut r,
            );
            Ok(r.errors.is_empty())
        }
        Cmd::SplitCrds { file } => {
            let (core, crds) = policy::gitops::split_crds(&read(&file)?)?;
            let mut out = file.into_os_string();
            out.push(".core.yaml");
            std::fs::write(&out, core).map_err(|e| e.to_string())?;
            println!(
                "  {}: {crds} CRD objects left out",
                Path::new(&out).display()
            );
            Ok(true)
        }
        Cmd::Spec { file, out } => {
            let spec = policy::gitops::spec_of(&read(&file)?)
                .map_err(|e| format!("{}: {e}", file.display()))?;
            std::fs::write(&out, spec).map_err(|e| format!("{}: {e}", out.display()))?;
            Ok(true)
        }
        Cmd::BenchSummary { kind, dir, took } => {
            print!("{}", bench::summary(kind, &dir, took)?);
            Ok(true)
        }
    }
}

/// Every generated file: path under the root, and its content.
fn outputs(root: &Path) -> Result<Vec<(&'static str, String)>, String> {
    let read = |p: &str| {
        std::fs::read_to_string(root.join(p))
            .map_err(|e| format!("{}: {e}", root.join(p).display()))
    };
    let src = read(rules::SOURCE)?;
    let names = nodeguard::export::catalog::exposed_names();
    let dash = dashboard::dashboard();
    let missing = dashboard::uncovered(names.iter().map(String::as_str), &dash);
    if !missing.is_empty() {
        return Err(format!(
            "catalog families (src/export/catalog) on no dashboard panel (add them in src/bin/nodeguard-gen/dashboard.rs): {}",
            missing.join(", ")
        ));
    }
    let json = dashboard::render_json();
    // Leaked: a handful of page names, once per run of a generator.
    let man = man::pages()?
        .into_iter()
        .map(|(path, text)| (&*Box::leak(path.into_boxed_str()), text));
    Ok(vec![
        (
            "daemonset/components/vmrule/vmrule.yaml",
            rules::render(&src, rules::Kind::VmRule)?,
        ),
        (
            "daemonset/components/prometheusrule/prometheusrule.yaml",
            rules::render(&src, rules::Kind::PrometheusRule)?,
        ),
        (
            "daemonset/components/dashboard/dashboard.yaml",
            dashboard::render_configmap(&json),
        ),
        (dashboard::JSON_PATH, json),
    ]
    .into_iter()
    .chain(man)
    .collect())
}

/// The first line where two texts differ, for a drift report.
fn first_difference(old: &str, new: &str) -> String {
    let (mut o, mut n) = (old.lines(), new.lines());
    for i in 1.. {
        match (o.next(), n.next()) {
            (None, None) => return "trailing whitespace only".to_owned(),
            (a, b) if a == b => continue,
            (a, b) => {
                return format!(
                    "line {i}: committed {:?}, generated {:?}",
                    a.unwrap_or("<end>"),
                    b.unwrap_or("<end>")
                )
            }
        }
    }
    unreachable!()
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(cmd) = args.cmd {
        return match subcommand(&args.root, cmd) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("nodeguard-gen: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let files = match outputs(&args.root) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("nodeguard-gen: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut drift = 0;
    for (rel, content) in &files {
        let path = args.root.join(rel);
        let old = std::fs::read_to_string(&path).ok();
        if old.as_deref() == Some(content.as_str()) {
            println!("  ok   {rel}");
            continue;
        }
        if args.check {
            drift += 1;
            match &old {
                None => println!("  DRIFT {rel}: missing"),
                Some(o) => println!("  DRIFT {rel}: {}", first_difference(o, content)),
            }
            continue;
        }
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, content));
        if let Err(e) = written {
            eprintln!("nodeguard-gen: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("  wrote {rel}");
    }
    if drift > 0 {
        eprintln!(
            "nodeguard-gen: {drift} generated file(s) differ from their source: run `cargo run --bin nodeguard-gen` and commit"
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_difference_names_the_line() {
        assert_eq!(
            first_difference("a\nb\n", "a\nc\n"),
            "line 2: committed \"b\", generated \"c\""
        );
        assert_eq!(
            first_difference("a\n", "a\nb\n"),
            "line 2: committed \"<end>\", generated \"b\""
        );
    }

    #[test]
    fn outputs_render_from_the_repository() {
        let files = outputs(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap();
        assert_eq!(files.len(), 4 + man::pages().unwrap().len());
        assert!(files.iter().all(|(_, c)| c.ends_with('\n')));
    }
}
