//! `bench-summary`: the tables `scripts/bench` and `scripts/bench-cost` print from the JSON that
//! the whole-node scenario (`tests/bench_node.rs`) writes, one file per node size. Missing files
//! and runs are left out (a run that was not asked for); a missing figure prints as `-`.

use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

/// Which table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// `scripts/bench-cost`: node-24.json and node-110.json, steady and churn, with and without
    /// the `BEFORE` binary.
    Cost,
    /// `scripts/bench`: node.json and node-child-ehash.json (shared / per-pod TCP hash tables).
    Node,
}

/// Reads the JSON files of `kind` under `dir` and renders the summary.
pub fn summary(kind: Kind, dir: &Path, took: Option<u64>) -> Result<String, String> {
    let load = |name: &str| -> Result<Option<Value>, String> {
        let p = dir.join(name);
        match std::fs::read_to_string(&p) {
            Ok(t) => serde_json::from_str(&t)
                .map(Some)
                .map_err(|e| format!("{}: {e}", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", p.display())),
        }
    };
    let mut out = String::new();
    match kind {
        Kind::Cost => {
            let files = [(24, load("node-24.json")?), (110, load("node-110.json")?)];
            cost(&mut out, &files);
            if let Some(t) = took {
                let _ = writeln!(out, "took {t} s");
            }
        }
        Kind::Node => {
            for (name, title) in [
                ("node.json", "shared TCP hash table"),
                ("node-child-ehash.json", "per-pod TCP hash tables"),
            ] {
                if let Some(r) = load(name)? {
                    node(&mut out, title, &r);
                }
            }
        }
    }
    Ok(out)
}

fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

/// `{:>w$.p$}` of a figure, `-` where the JSON has none.
fn fig(v: &Value, key: &str, w: usize, p: usize) -> String {
    match num(v, key) {
        Some(x) => format!("{x:>w$.p$}"),
        None => format!("{:>w$}", "-"),
    }
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).map_or_else(|| "None".into(), plain)
}

/// A value as a reader wants it: strings bare, lists space-separated (a load average), objects
/// as `key value, ...` (the node's shape).
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "None".into(),
        Value::Array(a) => a.iter().map(plain).collect::<Vec<_>>().join(" "),
        Value::Object(m) => m
            .iter()
            .map(|(k, x)| format!("{k} {}", plain(x)))
            .collect::<Vec<_>>()
            .join(", "),
        other => other.to_string(),
    }
}

/// `name ms, ...` largest first (ties by name, so the order is stable).
fn split(v: &Value, key: &str, by_size: bool) -> String {
    let mut parts: Vec<(&str, f64)> = v
        .get(key)
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, x)| Some((k.as_str(), x.as_f64()?)))
                .collect()
        })
        .unwrap_or_default();
    if by_size {
        parts.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    }
    parts
        .iter()
        .map(|(k, x)| format!("{k} {x:.1}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn cost(out: &mut String, files: &[(u32, Option<Value>)]) {
    let _ = writeln!(
        out,
        "{:>4} {:<16} {:>5} {:>13} {:>7} {:>18} {:>6} {:>9} {:>13}  per-sampler CPU ms/tick",
        "pods",
        "run",
        "ticks",
        "agent ms/tick",
        "median",
        "exporter ms/scrape",
        "ratio",
        "VmHWM KiB",
        "walked/reused"
    );
    for (pods, r) in files {
        let Some(r) = r else { continue };
        for run in ["before_default", "default", "before_changing", "changing"] {
            let Some(x) = r.get(run) else { continue };
            let wr = format!(
                "{:.0}/{:.0}",
                num(x, "socket_pids_walked").unwrap_or(0.0),
                num(x, "socket_pids_reused").unwrap_or(0.0)
            );
            // What the samplers' own CPU does not cover: signals, rules, export, HTTP.
            let rest = num(x, "agent_cpu_per_tick_ms").map(|t| {
                let sampled: f64 = x
                    .get("sampler_cpu_per_tick_ms")
                    .and_then(Value::as_object)
                    .map_or(0.0, |m| m.values().filter_map(Value::as_f64).sum());
                format!(", rest {:.1}", t - sampled)
            });
            let _ = writeln!(
                out,
                "{pods:>4} {run:<16} {} {} {} {} {} {} {wr:>13}  {}{}",
                fig(x, "ticks", 5, 0),
                fig(x, "agent_cpu_per_tick_ms", 13, 1),
                fig(x, "agent_cpu_per_tick_median_ms", 7, 1),
                fig(x, "exporter_cpu_per_scrape_ms", 18, 1),
                fig(x, "cpu_ratio", 6, 2),
                fig(x, "agent_vmhwm_kib", 9, 0),
                split(x, "sampler_cpu_per_tick_ms", true),
                rest.unwrap_or_default()
            );
        }
        let _ = writeln!(
            out,
            "     node: {}; load {} -> {}",
            text(r, "node"),
            text(r, "load_before"),
            text(r, "load_end")
        );
    }
}

fn node(out: &mut String, title: &str, r: &Value) {
    let _ = writeln!(
        out,
        "whole node, {title}: {}, load {} -> {}",
        text(r, "node"),
        text(r, "load_before"),
        text(r, "load_end")
    );
    let _ = writeln!(
        out,
        "  {:<11} {:>5} {:>13} {:>7} {:>9} | {:>18} {:>7} {:>9} | {:>9} {:>9} | dump",
        "run",
        "ticks",
        "agent ms/tick",
        "median",
        "VmHWM KiB",
        "exporter ms/scrape",
        "median",
        "VmHWM KiB",
        "cpu ratio",
        "rss ratio"
    );
    for run in ["default", "no_sockets", "dump"] {
        let Some(x) = r.get(run) else { continue };
        let _ = writeln!(
            out,
            "  {run:<11} {} {} {} {} | {} {} {} | {} {} | {} {}",
            fig(x, "ticks", 5, 0),
            fig(x, "agent_cpu_per_tick_ms", 13, 1),
            fig(x, "agent_cpu_per_tick_median_ms", 7, 1),
            fig(x, "agent_vmhwm_kib", 9, 0),
            fig(x, "exporter_cpu_per_scrape_ms", 18, 1),
            fig(x, "exporter_cpu_per_scrape_median_ms", 7, 1),
            fig(x, "exporter_vmhwm_kib", 9, 0),
            fig(x, "cpu_ratio", 9, 2),
            fig(x, "rss_ratio", 9, 2),
            text(x, "dump_seen"),
            text(x, "dump_duration_s")
        );
        let tick = num(x, "tick_duration_median_ms")
            .map(|t| format!("{t:.1}"))
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "  {:<11} sampler ms (median): {}; tick {tick}",
            "",
            split(x, "sampler_duration_median_ms", false)
        );
    }
    if let Some(c) = r.get("churn") {
        let _ = writeln!(
            out,
            "  churn: {} events in {} s; RSS KiB first/last/max {}/{}/{}, fds {}/{}/{}; second-half trend {} KiB and {} fds per 10 min",
            text(c, "events"),
            text(c, "seconds"),
            text(c, "rss_first_kib"),
            text(c, "rss_last_kib"),
            text(c, "rss_max_kib"),
            text(c, "fds_first"),
            text(c, "fds_last"),
            text(c, "fds_max"),
            fig(c, "rss_trend_kib_per_10min_second_half", 0, 0),
            fig(c, "fds_trend_per_10min_second_half", 0, 1)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_cost_table_has_a_row_per_run_and_the_split_largest_first() {
        let r = json!({
            "node": {"pods": 24, "processes": 456}, "load_before": ["0.5", "0.4", "0.3"],
            "load_end": ["1.0", "0.8", "0.5"],
            "default": {
                "ticks": 12, "agent_cpu_per_tick_ms": 23.3, "agent_cpu_per_tick_median_ms": 25.0,
                "exporter_cpu_per_scrape_ms": 42.5, "cpu_ratio": 0.547, "agent_vmhwm_kib": 7808,
                "socket_pids_walked": 36, "socket_pids_reused": 396,
                "sampler_cpu_per_tick_ms": {"sockets": 5.2, "processes": 5.5, "logs": 2.6}
            },
            "changing": {"ticks": 12, "agent_cpu_per_tick_ms": 34.2}
        });
        let mut out = String::new();
        cost(&mut out, &[(24, Some(r)), (110, None)]);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 4, "{out}");
        assert_eq!(
            lines[1],
            "  24 default             12          23.3    25.0               42.5   0.55      7808        36/396  processes 5.5, sockets 5.2, logs 2.6, rest 10.0"
        );
        // A figure the run lacks is `-`, not 0.
        assert!(lines[2].starts_with("  24 changing            12          34.2       -                  -      -         -           0/0  "), "{}", lines[2]);
        assert_eq!(
            lines[3],
            "     node: pods 24, processes 456; load 0.5 0.4 0.3 -> 1.0 0.8 0.5"
        );
    }

    #[test]
    fn summary_reads_the_files_there_are_and_reports_a_broken_one() {
        let d = tempfile::tempdir().unwrap();
        let empty = summary(Kind::Cost, d.path(), Some(7)).unwrap();
        assert_eq!(empty.lines().count(), 2, "{empty}");
        assert!(empty.ends_with("took 7 s\n"));
        std::fs::write(d.path().join("node.json"), r#"{"node": "n", "default": {"ticks": 3, "sampler_duration_median_ms": {"memory": 1.25}}, "churn": {"events": 4, "seconds": 60, "rss_trend_kib_per_10min_second_half": 12.4, "fds_trend_per_10min_second_half": 0.04}}"#).unwrap();
        let n = summary(Kind::Node, d.path(), None).unwrap();
        assert!(
            n.starts_with("whole node, shared TCP hash table: n, load None -> None\n"),
            "{n}"
        );
        assert!(
            n.contains("sampler ms (median): memory 1.2; tick -\n"),
            "{n}"
        );
        assert!(n.contains("churn: 4 events in 60 s;"), "{n}");
        assert!(n.contains("trend 12 KiB and 0.0 fds per 10 min"), "{n}");
        std::fs::write(d.path().join("node-110.json"), "{").unwrap();
        let e = summary(Kind::Cost, d.path(), None).unwrap_err();
        assert!(e.contains("node-110.json"), "{e}");
    }
}
