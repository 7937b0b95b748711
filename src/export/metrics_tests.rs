//! The exposition with names a workload chose: parsed back by a strict OpenMetrics line parser
//! (always) and by promtool (the Prometheus parser; required as root or in CI).

use super::*;
use crate::export::catalog::{self, Meta};
use crate::model::LineCounts;
use crate::model::WorkloadId;
use crate::model::ZombieParent;
use crate::model::{
    BreakerView, GuardStatus, Kept, MemoryValues, PendingView, PodSignals, Published,
    SamplerStatus, Snapshot, WorkloadSignals,
};
use std::collections::{BTreeMap, BTreeSet, HashSet};

/// Label values nobody should be able to turn into syntax.
fn hostile() -> Vec<String> {
    vec![
        "n\"".into(),
        "a\\b".into(),
        "line\nbreak".into(),
        "trailing\\".into(),
        "\"} 1\nnodeguard_fake 2\n# EOF\n".into(),
        "x\",injected=\"y".into(),
        "tab\tcr\rbell\x07esc\x1b".into(),
        "ünïcødé-名前-😀".into(),
        "\\n\\\"".into(),
        "\u{feff}\u{200b}\u{2028}".into(),
        "x".repeat(4096),
    ]
}

fn workload(ns: &str, pod: &str, container: &str, comms: &[String]) -> WorkloadSignals {
    WorkloadSignals {
        id: WorkloadId::container(ns, pod, container),
        kind: crate::model::Kind::Container,
        qos: None,
        pod_uid: Some("uid".into()),
        container_id: Some("cid".into()),
        cgroup: Some(format!("/kubepods/{pod}")),
        memory: Some(Kept {
            value: MemoryValues {
                usage_bytes: 2,
                working_set_bytes: 1,
                limit_bytes: Some(3),
            },
            stale: true,
        }),
        oom_kills_total: 1,
        processes: Some(Kept {
            value: 4,
            stale: true,
        }),
        zombies: Some(Kept {
            value: comms.len() as u64,
            stale: false,
        }),
        zombie_parents: comms
            .iter()
            .enumerate()
            .map(|(i, c)| ZombieParent {
                pid: 100 + i as u32,
                comm: c.clone(),
                zombies: 1,
            })
            .collect(),
        log_lines_total: LineCounts::default(),
        log_lines_per_minute: LineCounts::default(),
        restarts_total: 0,
        sockets: None,
        pids: None,
        memory_full_in_seconds: None,
    }
}

fn hostile_snapshot() -> Published {
    let names = hostile();
    let mut s = Snapshot {
        node: "a\"b".into(),
        cgroup_layout: "v2\"\n".into(),
        ..Snapshot::default()
    };
    // Every hostile string as the comm of a parent, and as each identity label in turn.
    s.workloads
        .push(workload("feeds", "backend-0", "supervisor", &names));
    for (i, n) in names.iter().enumerate() {
        s.workloads.push(workload(n, &format!("p{i}"), "c", &[]));
        s.workloads.push(workload("ns", n, "c", &[]));
        s.workloads.push(workload("ns", &format!("p{i}"), n, &[]));
        s.pods.push(PodSignals {
            namespace: "ns".into(),
            pod: n.clone(),
            uid: format!("u{i}"),
            oom_kills_total: Some(1),
            host_network: Some(true),
            netns_conntrack_entries: Some(1),
            host_conntrack_entries: None,
            netns_sockets: None,
            addresses: vec![],
            ephemeral_ports: None,
        });
    }
    // Two parents of one comm in one container: one series, their sum.
    s.workloads.push(workload(
        "dup",
        "p",
        "c",
        &["uwsgi".into(), "uwsgi".into(), "n\"".into()],
    ));
    let guard = Some(GuardStatus {
        dry_run: true,
        state_quarantined: Some("/var/lib/\"x\n".into()),
        breakers: vec![BreakerView {
            namespace: "ns".into(),
            pod: names[0].clone(),
            container: names[2].clone(),
            owner: "o".into(),
            rule: names[4].clone(),
            state: "half_open",
            action: "freeze",
            reason: "r".into(),
            value: 1.0,
            threshold: 0.5,
            since: 0.0,
            hold_remaining_seconds: Some(3.0),
            trips_total: 2,
            would_act: true,
            evidence: None,
        }],
        pending: vec![PendingView {
            namespace: names[1].clone(),
            pod: names[3].clone(),
            container: "c".into(),
            rule: names[5].clone(),
            seconds: 4.0,
        }],
        actions: vec![(names[6].clone(), "freeze", "dry_run", 1)],
        webhook: crate::model::WebhookStatus {
            configured: true,
            sent_total: 3,
            failed_total: 1,
            dropped_queue_full_total: 1,
            dropped_table_full_total: 1,
            active_alerts: 1,
        },
        ..GuardStatus::default()
    });
    s.samplers.push(SamplerStatus {
        name: "processes",
        enabled: true,
        ..SamplerStatus::default()
    });
    Published { observed: s, guard }
}

fn rendered(s: &Published) -> String {
    let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(s.clone())));
    render(&registry(shared)).expect("render")
}

#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
}

impl Sample {
    fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

fn is_name(s: &str, colon: bool) -> bool {
    let ok = |c: char, first: bool| {
        c == '_' || c.is_ascii_alphabetic() || (colon && c == ':') || (!first && c.is_ascii_digit())
    };
    let mut it = s.chars();
    it.next().is_some_and(|c| ok(c, true)) && it.all(|c| ok(c, false))
}

/// A strict OpenMetrics text parser for what this agent writes: descriptors, samples with
/// quoted and escaped label values, `# EOF` last. Returns every sample with its labels
/// unescaped, or the first bad line.
fn parse_exposition(text: &str) -> Result<Vec<Sample>, String> {
    let body = text
        .strip_suffix("# EOF\n")
        .ok_or("the exposition does not end with `# EOF`")?;
    let mut out = Vec::new();
    let mut family = String::new();
    let mut families = HashSet::new();
    let mut series = HashSet::new();
    for (i, line) in body.split_terminator('\n').enumerate() {
        let bad = |why: &str| format!("line {}: {why}: {line:?}", i + 1);
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kw, name) = (parts.next(), parts.next().unwrap_or(""));
            if !is_name(name, true) {
                return Err(bad("bad family name"));
            }
            match (kw, parts.next()) {
                (Some("HELP"), Some(help)) if !help.contains(['\r']) => {}
                (Some("TYPE"), Some(t))
                    if ["counter", "gauge", "info", "stateset", "unknown"].contains(&t) =>
                {
                    if !families.insert(name.to_owned()) {
                        return Err(bad("family declared twice"));
                    }
                    family = name.to_owned();
                }
                (Some("UNIT"), Some(_)) => {}
                _ => return Err(bad("bad descriptor")),
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| bad("no value"))?;
        let name = &line[..name_end];
        if !is_name(name, true) || !name.starts_with(family.as_str()) || family.is_empty() {
            return Err(bad("sample outside its family"));
        }
        let mut labels = Vec::new();
        let mut rest = &line[name_end..];
        if let Some(mut l) = rest.strip_prefix('{') {
            loop {
                let eq = l.find('=').ok_or_else(|| bad("label without ="))?;
                let key = &l[..eq];
                if !is_name(key, false) || labels.iter().any(|(k, _)| k == key) {
                    return Err(bad("bad or repeated label name"));
                }
                let mut chars = l[eq + 1..]
                    .strip_prefix('"')
                    .ok_or_else(|| bad("unquoted label value"))?
                    .char_indices();
                let start = eq + 2;
                let mut value = String::new();
                let end = loop {
                    match chars.next() {
                        None => return Err(bad("unterminated label value")),
                        Some((j, '"')) => break start + j + 1,
                        Some((_, '\\')) => match chars.next() {
                            Some((_, '\\')) => value.push('\\'),
                            Some((_, '"')) => value.push('"'),
                            Some((_, 'n')) => value.push('\n'),
                            _ => return Err(bad("bad escape in label value")),
                        },
                        Some((_, c)) => value.push(c),
                    }
                };
                labels.push((key.to_owned(), value));
                l = &l[end..];
                if let Some(r) = l.strip_prefix(',') {
                    l = r;
                } else if let Some(r) = l.strip_prefix('}') {
                    rest = r;
                    break;
                } else {
                    return Err(bad("garbage after a label value"));
                }
            }
        }
        let mut fields = rest
            .strip_prefix(' ')
            .ok_or_else(|| bad("no space before the value"))?
            .split(' ');
        let value = fields.next().unwrap_or("");
        if value.parse::<f64>().is_err() || fields.next().is_some() {
            return Err(bad("bad value"));
        }
        let mut key: Vec<_> = labels.clone();
        key.sort();
        if !series.insert((name.to_owned(), key)) {
            return Err(bad("duplicate series"));
        }
        out.push(Sample {
            name: name.to_owned(),
            labels,
        });
    }
    Ok(out)
}

#[test]
fn hostile_names_round_trip_through_the_exposition() {
    let text = rendered(&hostile_snapshot());
    let samples = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(samples.iter().all(|s| s.label("node") == Some("a\"b")));

    let comms: BTreeSet<&str> = samples
        .iter()
        .filter(|s| s.name == "nodeguard_container_zombie_parent_zombies")
        .filter(|s| s.label("container") == Some("supervisor"))
        .filter_map(|s| s.label("parent_comm"))
        .collect();
    let names = hostile();
    assert_eq!(comms, names.iter().map(String::as_str).collect());
    for n in &names {
        for key in ["namespace", "pod", "container"] {
            assert!(
                samples
                    .iter()
                    .any(|s| s.name == "nodeguard_container_processes"
                        && s.label(key) == Some(n.as_str())),
                "{key}={n:?} lost"
            );
        }
    }
    let rules: BTreeSet<&str> = samples.iter().filter_map(|s| s.label("rule")).collect();
    assert!(rules.contains(names[4].as_str()) && rules.contains(names[5].as_str()));
    assert!(!samples.iter().any(|s| s.name == "nodeguard_fake"));
}

#[test]
fn zombie_parents_are_summed_by_comm_without_pids() {
    let text = rendered(&hostile_snapshot());
    let samples = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}"));
    let dup: Vec<_> = samples
        .iter()
        .filter(|s| s.name == "nodeguard_container_zombie_parent_zombies")
        .filter(|s| s.label("namespace") == Some("dup"))
        .collect();
    assert_eq!(dup.len(), 2, "{dup:?}");
    assert!(dup.iter().all(|s| s.label("parent_pid").is_none()));
    assert!(text.contains(
        "nodeguard_container_zombie_parent_zombies{namespace=\"dup\",pod=\"p\",container=\"c\",node=\"a\\\"b\",parent_comm=\"uwsgi\"} 2\n"
    ));
}

#[test]
fn the_line_parser_rejects_what_an_unescaping_encoder_writes() {
    let raw = "# TYPE m gauge\nm{comm=\"n\"\"} 1\n# EOF\n";
    assert!(parse_exposition(raw).is_err());
    let raw = "# TYPE m gauge\nm{comm=\"a\nb\"} 1\n# EOF\n";
    assert!(parse_exposition(raw).is_err());
    let ok = "# TYPE m gauge\nm{comm=\"n\\\"\"} 1\n# EOF\n";
    assert_eq!(parse_exposition(ok).unwrap()[0].label("comm"), Some("n\""));
}

/// `promtool check metrics` on `text`: its exit code and every line it said. `None` where
/// promtool is missing and the test need not run (neither root nor CI); there it fails.
fn promtool(text: &str) -> Option<(Option<i32>, Vec<String>)> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let must = nix::unistd::geteuid().is_root() || std::env::var_os("CI").is_some();
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) if !must => {
            eprintln!("SKIP: promtool not found ({e}); install Debian package `prometheus`");
            return None;
        }
        Err(e) => panic!("promtool is required as root or in CI (apt-get install prometheus): {e}"),
    };
    let mut stdin = child.stdin.take().expect("promtool stdin");
    let body = text.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(body.as_bytes()));
    let out = child.wait_with_output().expect("promtool ran");
    match writer.join().expect("writer thread") {
        // promtool stops reading at the first parse error; its status tells.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => panic!("write to promtool: {e}"),
        _ => {}
    }
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    Some((out.status.code(), said.lines().map(str::to_owned).collect()))
}

/// promtool is the Prometheus parser itself, and it reads the 0.0.4 text format: the hostile
/// exposition and the whole registry, converted, pass with exit 0 and not one remark.
#[test]
fn promtool_accepts_the_text_exposition_without_a_remark() {
    let hostile = rendered(&hostile_snapshot());
    for om in [hostile.clone(), rendered_all(&full_snapshot())] {
        let text = crate::export::exposition::to_text(&om).expect("convert");
        let Some((code, said)) = promtool(&text) else {
            return;
        };
        assert!(
            code == Some(0) && said.is_empty(),
            "promtool on the 0.0.4 text ({code:?}):\n{}",
            said.join("\n")
        );
    }
    // The OpenMetrics text read as 0.0.4 was what `curl | promtool` saw before: every counter
    // is a family of its own there, without help (exit 3), and nothing else is wrong.
    let Some((code, said)) = promtool(&hostile) else {
        return;
    };
    assert_eq!(code, Some(3), "{said:?}");
    assert!(
        !said.is_empty()
            && said
                .iter()
                .all(|l| l.starts_with("nodeguard_") && l.ends_with("_total no help text")),
        "{said:?}"
    );
}

/// The 0.0.4 text carries the same samples as the OpenMetrics text, hostile label values
/// byte for byte: only descriptor lines and `# EOF` differ.
#[test]
fn the_text_exposition_has_every_sample_of_the_openmetrics_one() {
    for om in [
        rendered(&hostile_snapshot()),
        rendered_all(&full_snapshot()),
    ] {
        let text = crate::export::exposition::to_text(&om).expect("convert");
        let samples = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        };
        let (a, b) = (samples(&om), samples(&text));
        assert!(a.len() > 50, "{} samples", a.len());
        assert_eq!(a, b);
    }
}

/// Families in an exposition: name as documented (counters with `_total`, info with `_info`) ->
/// (type, label names seen on its samples, `node` left out: it is on every series when known).
fn families(text: &str) -> BTreeMap<String, (String, BTreeSet<String>)> {
    let mut out: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
    let mut by_base = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (base, ty) = rest.split_once(' ').expect("TYPE line");
            let name = match ty {
                "counter" => format!("{base}_total"),
                "info" => format!("{base}_info"),
                _ => base.to_owned(),
            };
            by_base.insert(base.to_owned(), name.clone());
            out.entry(name).or_default().0 = ty.to_owned();
        }
    }
    for s in parse_exposition(text).expect("exposition parses") {
        let base = ["_total", "_info", "_created"]
            .iter()
            .find_map(|suf| {
                s.name
                    .strip_suffix(suf)
                    .filter(|b| by_base.contains_key(*b))
            })
            .unwrap_or(&s.name);
        let Some(name) = by_base.get(base) else {
            continue;
        };
        let labels = &mut out.get_mut(name).expect("family").1;
        labels.extend(
            s.labels
                .iter()
                .map(|(k, _)| k.clone())
                .filter(|k| k != "node"),
        );
    }
    out
}

/// docs/metrics.md's table rows: (section, metric, type cell, labels cell), in order.
fn documented() -> Vec<(String, String, String, String)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md"))
        .expect("docs/metrics.md");
    let mut out = Vec::new();
    let mut section = String::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = h.trim().to_owned();
            continue;
        }
        // Cells split at each `|` that is not escaped as `\|`.
        let mut cells = vec![String::new()];
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&'|') => {
                    cells.last_mut().expect("a cell").push_str("\\|");
                    chars.next();
                }
                '|' => cells.push(String::new()),
                c => cells.last_mut().expect("a cell").push(c),
            }
        }
        let cell = |i: usize| cells.get(i).map_or("", |c| c.trim()).to_owned();
        let name = cell(1);
        let Some(name) = name
            .strip_prefix('`')
            .and_then(|c| c.strip_suffix('`'))
            .filter(|c| c.starts_with("nodeguard_"))
        else {
            continue;
        };
        out.push((section.clone(), name.to_owned(), cell(2), cell(3)));
    }
    out
}

/// The whole registry as the agent builds it: the snapshot's, the config's, the server's and the
/// watchdog's.
fn rendered_all(s: &Published) -> String {
    let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(s.clone())));
    let mut r = registry(shared.clone());
    crate::export::info::register(&mut r, shared.clone());
    crate::export::limits::register(&mut r, Arc::default(), shared.clone());
    let five = std::time::Duration::from_secs(5);
    let watch = crate::export::watchdog::TickWatch::new(five, std::time::Duration::ZERO);
    crate::export::watchdog::register(&mut r, Arc::new(watch), shared);
    render(&r).expect("render")
}

#[test]
fn docs_metrics_md_lists_every_family_with_its_type_and_labels() {
    let docs = documented();
    let mut problems = Vec::new();
    for m in catalog::all() {
        let name = m.exposed_name();
        let row = format!("| `{name}` | {} | {} |", m.ty.as_str(), m.docs_labels());
        let found: Vec<_> = docs.iter().filter(|d| d.1 == name).collect();
        match found[..] {
            [] => problems.push(format!(
                "{name} is exported but not in docs/metrics.md; add under \"## {}\": {row}",
                m.section.heading()
            )),
            [(section, _, ty, labels)] => {
                if section != m.section.heading() {
                    problems.push(format!(
                        "{name} is under \"## {section}\", the catalog says \"## {}\"",
                        m.section.heading()
                    ));
                }
                if *ty != m.ty.as_str() || *labels != m.docs_labels() {
                    problems.push(format!(
                        "{name}: documented as | {ty} | {labels} |, the catalog's row starts {row}"
                    ));
                }
            }
            _ => problems.push(format!("{name} is documented {} times", found.len())),
        }
    }
    let exported: BTreeSet<String> = catalog::exposed_names().into_iter().collect();
    for (_, name, _, _) in &docs {
        if !exported.contains(name) {
            problems.push(format!("{name} is documented but not in the catalog"));
        }
    }
    assert!(
        problems.is_empty(),
        "the catalog (src/export/catalog) and docs/metrics.md disagree:\n - {}",
        problems.join("\n - ")
    );
}

/// The exposition has exactly the catalog's families, with its types and label names, and an
/// enumerated label only takes the values the catalog declares.
#[test]
fn the_exposition_is_the_catalog() {
    let text = rendered_all(&full_snapshot());
    let code = families(&text);
    let catalog: BTreeMap<String, Meta> = catalog::all()
        .into_iter()
        .map(|m| (m.exposed_name(), m))
        .collect();
    assert_eq!(
        code.keys().collect::<Vec<_>>(),
        catalog.keys().collect::<Vec<_>>()
    );
    for (name, (ty, labels)) in &code {
        let m = &catalog[name];
        assert_eq!(ty, m.ty.as_str(), "{name}");
        let declared: BTreeSet<String> = m.labels.iter().map(|l| l.name.to_owned()).collect();
        assert_eq!(
            labels, &declared,
            "{name}: the full snapshot gives every family samples"
        );
    }
    let samples = parse_exposition(&text).expect("exposition parses");
    for s in &samples {
        // A counter's samples are `<name>_total`, a gauge's `<name>`: the exposed name.
        let m = catalog
            .get(&s.name)
            .unwrap_or_else(|| panic!("{} is in no family", s.name));
        for l in m.labels {
            if let (Some(values), Some(v)) = (l.values, s.label(l.name)) {
                assert!(
                    values().contains(&v),
                    "{}: {}={v:?} is not declared",
                    s.name,
                    l.name
                );
            }
        }
    }
}

/// Every optional part of the snapshot filled, so every family has samples.
fn full_snapshot() -> Published {
    use crate::model::{
        DumpStatus, EphemeralPorts, Feature, KmsgStatus, NetnsSockets, NodeConntrack, SocketCounts,
    };
    use crate::model::{NodePids, PidsSample};
    let Published {
        observed: mut s,
        mut guard,
    } = hostile_snapshot();
    s.node = "n1".into();
    for (i, w) in s.workloads.iter_mut().enumerate() {
        w.sockets = Some(Kept {
            value: SocketCounts {
                tcp: 3,
                udp: 1,
                tcp_states: [("established", 2), ("listen", 1)].into_iter().collect(),
            },
            stale: false,
        });
        w.pids = Some(Kept {
            value: PidsSample {
                current: 7,
                limit: Some(100),
            },
            stale: i % 2 == 0,
        });
        w.memory_full_in_seconds = Some(60.5);
        w.restarts_total = 2;
        w.log_lines_total = LineCounts {
            stdout: 10,
            stderr: 3,
            malformed: 1,
        };
        w.log_lines_per_minute = LineCounts {
            stdout: 5,
            stderr: 1,
            malformed: 0,
        };
    }
    let mut unit = workload("", "", "cron.service", &[]);
    unit.kind = crate::model::Kind::Unit;
    unit.pod_uid = None;
    s.workloads.push(unit);
    for p in &mut s.pods {
        p.host_conntrack_entries = Some(9);
        p.netns_sockets = Some(NetnsSockets {
            tcp_inuse: 1,
            tcp_time_wait: 2,
            udp_inuse: 3,
            tcp6_inuse: 4,
            udp6_inuse: 5,
        });
        p.ephemeral_ports = Some(EphemeralPorts {
            available: 28232,
            used: Some(100),
            used_top_destination: Some(50),
        });
    }
    s.node_conntrack = Some(NodeConntrack {
        entries: 10,
        limit: 262144,
    });
    s.node_conntrack_full_in_seconds = Some(3600.0);
    s.node_pids = Some(NodePids {
        current: 500,
        limit: 4194304,
    });
    s.node_pids_full_in_seconds = Some(7200.0);
    s.conntrack_dump = Some(DumpStatus {
        age_seconds: 1.5,
        duration_seconds: 0.25,
        entries: 10,
        attributed: 4,
        restarts: 0,
    });
    s.features = [
        "sockets",
        "pod_conntrack",
        "conntrack_dump",
        "ephemeral_ports",
        "oom_kmsg",
    ]
    .into_iter()
    .enumerate()
    .map(|(i, name)| Feature {
        name,
        available: i % 2 == 0,
        reason: None,
    })
    .collect();
    s.kmsg = Some(KmsgStatus {
        records_total: 100,
        oom_attributed_total: 1,
        oom_unattributed_total: 2,
        oom_truncated_total: 3,
        oom_suppressed_total: 4,
        overruns_total: 5,
        read_limited_total: 6,
        remembered_cgroups: 7,
        remembered_evicted_total: 8,
    });
    if let Some(g) = guard.as_mut() {
        g.state_durable = true;
        g.state_write_failures_total = 1;
        g.thaws_pending = 2;
        g.actions.push(("r2".into(), "kill", "failed", 3));
    }
    s.inputs = crate::model::InputStats {
        non_utf8_cgroups: 1,
        non_utf8_log_names: 2,
        skipped_cgroups: 3,
        log_files_open: Some(4),
        log_files_skipped_symlink: 5,
        log_files_skipped_not_regular: 6,
        log_files_skipped_cap: 7,
        files_not_regular_total: [21, 22, 23],
        socket_cache_entries: Some(8),
        socket_cache_overflows_total: 9,
        socket_pids_walked: 10,
        socket_pids_reused: 11,
        memory_files_open: Some(12),
        memory_files_unheld: 13,
        discovery_dirs_held: 14,
        discovery_dirs_unheld: 15,
        discovery_dirs_unwatched: 16,
        discovery_dirs_listed: 17,
        discovery_watch_overflows_total: 18,
        pids_files_open: Some(19),
        pids_files_unheld: 20,
    };
    s.samplers = catalog::agent::SAMPLERS
        .into_iter()
        .enumerate()
        .map(|(i, name)| SamplerStatus {
            name,
            enabled: i != 6,
            age_seconds: Some(1.0),
            fresh: i % 2 == 0,
            last_duration_seconds: 0.125,
            cpu_seconds_total: 2.5,
            errors_total: vec![("parse".into(), 2), ("io".into(), 1)],
        })
        .collect();
    s.cgroup_layout = "v2".into();
    s.agent = crate::model::AgentStats {
        ticks_total: 12,
        tick_duration_seconds: 0.5,
        resident_memory_bytes: 1 << 24,
        cpu_seconds_total: Some(3.25),
        open_fds: 40,
        start_time_seconds: 1.0,
    };
    s.config = crate::model::ConfigStatus {
        hash: "0123456789abcdef".into(),
        loaded_at: 1.5,
        reloads_total: 2,
        reload_failures_total: 1,
        last_reload_ok: false,
        restart_required: vec!["listen"],
        ..Default::default()
    };
    Published { observed: s, guard }
}

/// Before the agent's own `/proc` entry was read once there is no CPU figure: the series is left
/// out rather than written as a 0 a later good read would turn into a counter reset.
#[test]
fn process_cpu_is_omitted_until_read() {
    let sample_line = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("nodeguard_process_cpu_seconds_total"))
            .map(str::to_owned)
    };
    let mut p = Published::default();
    let text = rendered(&p);
    assert!(
        text.contains("# TYPE nodeguard_process_cpu_seconds counter"),
        "{text}"
    );
    assert_eq!(sample_line(&text), None, "{text}");
    p.observed.agent.cpu_seconds_total = Some(1.5);
    assert_eq!(
        sample_line(&rendered(&p)).as_deref(),
        Some("nodeguard_process_cpu_seconds_total 1.5")
    );
}
