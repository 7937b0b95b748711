//! `nodeguard-gen`: writes the shipped objects that are derived from other files, so they are
//! never edited by hand: the VMRule and PrometheusRule (from daemonset/rules/nodeguard.rules.yaml),
//! the Grafana dashboard (from the panel table in dashboard.rs) and its ConfigMap.
//! `--check` writes nothing and fails when a committed file differs (scripts/ship-check).

mod dashboard;
mod rules;

use clap::Parser;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Generate the VMRule, PrometheusRule and Grafana dashboard objects")]
struct Args {
    /// Compare with the committed files instead of writing them; exit 1 on any difference.
    #[arg(long)]
    check: bool,
    /// Repository root.
    #[arg(long, default_value = env!("CARGO_MANIFEST_DIR"))]
    root: PathBuf,
}

/// Every generated file: path under the root, and its content.
fn outputs(root: &Path) -> Result<Vec<(&'static str, String)>, String> {
    let read = |p: &str| {
        std::fs::read_to_string(root.join(p))
            .map_err(|e| format!("{}: {e}", root.join(p).display()))
    };
    let src = read(rules::SOURCE)?;
    let metrics = read("docs/metrics.md")?;
    let dash = dashboard::dashboard();
    let missing = dashboard::uncovered(&metrics, &dash);
    if !missing.is_empty() {
        return Err(format!(
            "docs/metrics.md families on no dashboard panel (add them in src/bin/nodeguard-gen/dashboard.rs): {}",
            missing.join(", ")
        ));
    }
    let json = dashboard::render_json();
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
    ])
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
        assert_eq!(files.len(), 4);
        assert!(files.iter().all(|(_, c)| c.ends_with('\n')));
    }
}
