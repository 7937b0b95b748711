//! The agent run on fixture trees shaped like real hosts. Each tree carries `expected.txt`: what
//! one tick reads from it, workload by workload, and the metric lines it must export (see
//! tests/fixtures/README.md for where each shape and value comes from). Every value is asserted
//! exactly; one table-driven test per tree, then scenarios derived from the v2 tree.

use nodeguard::agent::Agent;
use nodeguard::cgroupfs::CgroupLayout;
use nodeguard::clock::ManualClock;
use nodeguard::config::Config;
use nodeguard::discover::names::NameSource;
use nodeguard::discover::{Discovery, DiscoveryConfig};
use nodeguard::export::metrics::{registry, render, SharedSnapshot};
use nodeguard::model::{Kept, PodSignals, Published, Snapshot, WorkloadSignals};
use std::fmt::{Display, Write as _};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn config(root: &Path, node: &str) -> Config {
    let p = |rel: &str| root.join(rel).display().to_string();
    let yaml = format!(
        // No kernel log in the fixtures: never the host's, whose OOM records are not theirs.
        "node_name: {node}\npaths:\n  proc: '{}'\n  cgroup: '{}'\n  pod_logs: '{}'\n  container_logs: '{}'\n  kmsg: '{}'\ndiscovery:\n  scopes: [\"/\"]\n",
        p("proc"),
        p("sys/fs/cgroup"),
        p("var/log/pods"),
        p("var/log/containers"),
        p("dev/kmsg"),
    );
    Config::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}"))
}

fn agent(root: &Path, node: &str) -> (Agent, ManualClock) {
    let clock = ManualClock::default();
    let agent = Agent::new(config(root, node), Arc::new(clock.clone())).unwrap();
    (agent, clock)
}

fn tick(root: &Path, node: &str) -> Published {
    agent(root, node).0.tick()
}

fn metrics(snap: Published) -> String {
    let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(snap)));
    render(&registry(shared)).unwrap()
}

fn assert_lines(text: &str, expected: &[&str]) {
    for line in expected {
        assert!(
            text.lines().any(|l| l == *line),
            "missing line\n  {line}\nin\n{text}"
        );
    }
}

/// Every series of one metric family, in exposition order.
fn series<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    let prefix = format!("{name}{{");
    text.lines().filter(|l| l.starts_with(&prefix)).collect()
}

// === the text form of what one tick read ===

fn opt<T: Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn kept<T: Display>(v: &Option<Kept<T>>) -> String {
    match v {
        None => "-".to_owned(),
        Some(h) if h.stale => format!("{} stale", h.value),
        Some(h) => h.value.to_string(),
    }
}

/// One workload as the lines of its `expected.txt` block.
fn describe_workload(w: &WorkloadSignals) -> String {
    let mut s = format!("workload {}\n  kind {}\n", w.id, w.kind.as_str());
    let mut line = |k: &str, v: String| writeln!(s, "  {k} {v}").unwrap();
    line("qos", opt(w.qos.map(|q| q.as_str())));
    line("pod_uid", opt(w.pod_uid.as_deref()));
    line("container_id", opt(w.container_id.as_deref()));
    line("cgroup", opt(w.cgroup.as_deref()));
    line(
        "memory",
        match &w.memory {
            None => "-".to_owned(),
            Some(m) => format!(
                "usage {} working_set {} limit {}{}",
                m.value.usage_bytes,
                m.value.working_set_bytes,
                opt(m.value.limit_bytes),
                if m.stale { " stale" } else { "" }
            ),
        },
    );
    line("oom_kills", w.oom_kills_total.to_string());
    line("processes", kept(&w.processes));
    line("zombies", kept(&w.zombies));
    for p in &w.zombie_parents {
        line(
            "zombie_parent",
            format!("{} {}: {}", p.pid, p.comm, p.zombies),
        );
    }
    macro_rules! counts {
        ($c:expr) => {
            format!(
                "stdout {} stderr {} malformed {}",
                $c.stdout, $c.stderr, $c.malformed
            )
        };
    }
    line("logs", counts!(w.log_lines_total));
    line("logs_per_minute", counts!(w.log_lines_per_minute));
    line("restarts", w.restarts_total.to_string());
    s
}

fn describe_pod(p: &PodSignals) -> String {
    format!(
        "pod {}/{}\n  uid {}\n  oom_kills {}\n  network host {} conntrack {} node_conntrack {} sockets {} addresses {:?} ephemeral_ports {}\n",
        p.namespace,
        p.pod,
        p.uid,
        opt(p.oom_kills_total),
        opt(p.host_network),
        opt(p.netns_conntrack_entries),
        opt(p.host_conntrack_entries),
        opt(p.netns_sockets.as_ref().map(|s| format!("{s:?}"))),
        p.addresses,
        opt(p.ephemeral_ports.map(|e| format!("{e:?}"))),
    )
}

/// The snapshot part of `expected.txt`: node, layout, samplers, workloads and pods in order.
fn describe(snap: &Snapshot, sandboxes: usize) -> String {
    let mut s = format!(
        "node {}\nlayout {}\nsandboxes {sandboxes}\n",
        snap.node, snap.cgroup_layout
    );
    for st in &snap.samplers {
        writeln!(
            s,
            "sampler {} enabled {} fresh {} errors {:?}",
            st.name, st.enabled, st.fresh, st.errors_total
        )
        .unwrap();
    }
    for w in &snap.workloads {
        s.push_str(&describe_workload(w));
    }
    for p in &snap.pods {
        s.push_str(&describe_pod(p));
    }
    s
}

/// `expected.txt`: comment lines (`#`) and blank lines are ignored; the snapshot part (see
/// `describe`) comes first, then metric directives:
/// - `metric <line>`: this exposition line is exported;
/// - `series <family>` then indented lines: the family's series, exactly and in order (none if
///   no lines follow);
/// - `absent <text>`: no exported line contains it.
///
/// `{version}` and `{revision}` stand for the build's.
struct Expected {
    snapshot: String,
    directives: Vec<String>,
}

fn expected(tree: &str) -> Expected {
    let path = fixture(tree).join("expected.txt");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = text
        .replace("{version}", env!("CARGO_PKG_VERSION"))
        .replace("{revision}", nodeguard::export::info::REVISION);
    let lines = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'));
    let (mut snapshot, mut directives) = (String::new(), Vec::new());
    for l in lines {
        let directive = ["metric ", "series ", "absent "]
            .iter()
            .any(|d| l.starts_with(d));
        if directive || !directives.is_empty() {
            directives.push(l.to_owned());
        } else {
            snapshot.push_str(l);
            snapshot.push('\n');
        }
    }
    Expected {
        snapshot,
        directives,
    }
}

fn check_directives(tree: &str, text: &str, directives: &[String]) {
    let mut i = 0;
    while i < directives.len() {
        let d = &directives[i];
        i += 1;
        if let Some(line) = d.strip_prefix("metric ") {
            assert_lines(text, &[line]);
        } else if let Some(family) = d.strip_prefix("series ") {
            let mut want = Vec::new();
            while let Some(l) = directives.get(i).and_then(|l| l.strip_prefix("  ")) {
                want.push(l);
                i += 1;
            }
            assert_eq!(series(text, family), want, "{tree}: series of {family}");
        } else if let Some(needle) = d.strip_prefix("absent ") {
            assert!(!text.contains(needle), "{tree}: {needle:?} is exported");
        } else {
            panic!("{tree}/expected.txt: unknown directive {d:?}");
        }
    }
}

fn sandboxes(root: &Path) -> (usize, Vec<String>) {
    // The snapshot does not carry the sandbox count, so ask discovery directly.
    let layout = CgroupLayout::detect(&root.join("sys/fs/cgroup")).unwrap();
    let mut discovery = Discovery::new(
        &layout,
        root.join("proc"),
        NameSource::new(root.join("var/log/pods"), root.join("var/log/containers")),
        DiscoveryConfig {
            scopes: vec!["/".into()],
            host_workloads: true,
        },
    );
    let inv = discovery.scan().unwrap();
    let names = inv
        .workloads
        .iter()
        .map(|w| w.id.container.clone())
        .collect();
    (inv.sandboxes, names)
}

/// One tick over the tree against its `expected.txt`, snapshot and metrics.
fn check_tree(tree: &str) {
    let want = expected(tree);
    let root = fixture(tree);
    let node = want
        .snapshot
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("node "))
        .unwrap_or_else(|| panic!("{tree}/expected.txt: the first line is `node <name>`"));
    let snap = tick(&root, node);
    let (sandboxes, names) = sandboxes(&root);
    // Pause sandboxes are counted and left out: no workload is named after one.
    assert!(
        names
            .iter()
            .all(|n| n != "pause" && !n.chars().all(|c| c.is_ascii_hexdigit())),
        "{tree}: {names:?}"
    );
    assert_eq!(names.len(), snap.workloads.len(), "{tree}");
    let got = describe(&snap, sandboxes);
    assert!(
        got == want.snapshot,
        "{tree}: the tick differs from expected.txt\n--- expected\n{}--- got\n{got}",
        want.snapshot
    );
    check_directives(tree, &metrics(snap), &want.directives);
}

#[test]
fn v2_systemd_tree() {
    check_tree("v2-systemd");
}

#[test]
fn v1_cgroupfs_tree() {
    check_tree("v1-cgroupfs");
}

#[test]
fn hybrid_systemd_tree() {
    check_tree("hybrid-systemd");
}

/// The sampler and feature names a real tick reports (named in `sample`, not by an enum) and
/// its layout are values the metric catalog declares.
#[test]
fn a_tick_reports_only_values_the_catalog_declares() {
    use nodeguard::export::catalog::{agent, network};
    for tree in ["v2-systemd", "v1-cgroupfs", "hybrid-systemd"] {
        let snap = tick(&fixture(tree), "n");
        let samplers: Vec<&str> = snap.samplers.iter().map(|s| s.name).collect();
        assert_eq!(samplers, agent::SAMPLERS, "{tree}");
        for f in &snap.features {
            assert!(
                network::FEATURES.contains(&f.name),
                "{tree}: feature {}",
                f.name
            );
        }
        assert!(agent::CGROUP_LAYOUTS.contains(&snap.cgroup_layout.as_str()));
        assert!(metrics(snap).contains("sampler=\"kmsg\""), "{tree}");
    }
}

// === scenarios derived from the v2 tree ===

mod v2 {
    pub const NODE: &str = "k3s-agent-1";
    pub const WEB_UID: &str = "3f6c2a1e-8b4d-4e7a-9c15-2d7e0b9a4f61";
    pub const APP: &str = "913e5ec576903244fced5ad2ee0f1fa3e96d75102e386ab299b4e1029105c04c";
    pub const WEB: &str = "web-5d9c7b8f6-x7kqp";

    pub fn web_pod() -> String {
        format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            WEB_UID.replace('-', "_")
        )
    }
    pub fn scope(pod: String, id: &str) -> String {
        format!("{pod}/cri-containerd-{id}.scope")
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn workload<'a>(snap: &'a Snapshot, container: &str) -> &'a WorkloadSignals {
    snap.workloads
        .iter()
        .find(|w| w.id.container == container)
        .unwrap()
}

/// Log totals, then per minute: stdout, stderr, malformed.
fn log_counts(w: &WorkloadSignals) -> [u64; 6] {
    let (t, m) = (w.log_lines_total, w.log_lines_per_minute);
    [
        t.stdout,
        t.stderr,
        t.malformed,
        m.stdout,
        m.stderr,
        m.malformed,
    ]
}

fn web_logs(root: &Path) -> PathBuf {
    root.join(format!("var/log/pods/shop_{}_{}", v2::WEB, v2::WEB_UID))
}

#[test]
fn v2_appended_log_lines_feed_the_rate() {
    use v2::*;
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture("v2-systemd"), dir.path());
    let (mut agent, clock) = agent(dir.path(), NODE);
    agent.tick();
    let log = web_logs(dir.path()).join("nginx/0.log");
    append(
        &log,
        "2024-05-14T09:12:21.1Z stdout F 10.42.0.1 - - \"GET /healthz HTTP/1.1\" 200 2\n\
         2024-05-14T09:12:21.2Z stdout F 10.42.1.7 - - \"GET /api/cart HTTP/1.1\" 200 512\n\
         2024-05-14T09:12:21.3Z stderr P 2024/05/14 09:12:21 [error] 29#29: *7 upstream timed out \n",
    );
    clock.advance(Duration::from_secs(5));
    let s = agent.tick();
    let nginx = workload(&s, "nginx");
    assert_eq!(log_counts(nginx), [6, 2, 0, 2, 0, 0]);
    // The P part completes now: one stderr line.
    append(
        &log,
        "2024-05-14T09:12:21.3Z stderr F while reading response header from upstream\n",
    );
    clock.advance(Duration::from_secs(5));
    let s = agent.tick();
    let nginx = workload(&s, "nginx");
    assert_eq!(log_counts(nginx), [6, 3, 0, 2, 1, 0]);
    clock.advance(Duration::from_secs(61));
    let s = agent.tick();
    let nginx = workload(&s, "nginx");
    assert_eq!(log_counts(nginx), [6, 3, 0, 0, 0, 0]);
    let app = workload(&s, "app");
    assert_eq!(log_counts(app), [3, 3, 0, 0, 0, 0]);
}

/// The app container is OOM-killed again and kubelet starts instance 2: the pod cgroup's
/// `oom_kill` goes 3 -> 4 while the killed container's cgroup is gone before the next tick.
#[test]
fn v2_oom_kill_and_restart_are_counted_once() {
    use v2::*;
    const NEW: &str = "336b090035a8f3ab09aa6112d5320af9f68db6cd9a7d20269acd097513bb87ea";
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    copy_tree(&fixture("v2-systemd"), root);
    let (mut agent, clock) = agent(root, NODE);
    let first = agent.tick();
    let app = workload(&first, "app");
    assert_eq!((app.oom_kills_total, app.restarts_total), (2, 1));

    let cg = root.join("sys/fs/cgroup");
    let pod = cg.join(web_pod().trim_start_matches('/'));
    fs::write(
        pod.join("memory.events"),
        "low 0\nhigh 0\nmax 131\noom 4\noom_kill 4\noom_group_kill 0\n",
    )
    .unwrap();
    let old = cg.join(scope(web_pod(), APP).trim_start_matches('/'));
    let new = cg.join(scope(web_pod(), NEW).trim_start_matches('/'));
    fs::create_dir(&new).unwrap();
    fs::copy(old.join("memory.stat"), new.join("memory.stat")).unwrap();
    fs::copy(old.join("memory.max"), new.join("memory.max")).unwrap();
    fs::write(new.join("memory.current"), "125829120\n").unwrap();
    fs::write(
        new.join("memory.events"),
        "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
    )
    .unwrap();
    fs::write(new.join("cgroup.procs"), "1602\n").unwrap();
    fs::remove_dir_all(&old).unwrap();
    for pid in ["1302", "1330", "1331", "1340", "1341", "1342"] {
        fs::remove_dir_all(root.join("proc").join(pid)).unwrap();
    }
    let proc = root.join("proc/1602");
    fs::create_dir(&proc).unwrap();
    fs::write(proc.join("comm"), "uwsgi (master)\n").unwrap();
    fs::write(
        proc.join("cgroup"),
        format!("0::{}\n", scope(web_pod(), NEW)),
    )
    .unwrap();
    fs::copy(fixture("v2-systemd/proc/1302/stat"), proc.join("stat")).unwrap();
    let stat = fs::read_to_string(proc.join("stat")).unwrap();
    fs::write(proc.join("stat"), stat.replacen("1302 ", "1602 ", 1)).unwrap();
    // kubelet: instance 0's log is collected, instance 2 logs to 2.log and gets its link.
    let logs = web_logs(root).join("app");
    fs::remove_file(logs.join("0.log")).unwrap();
    fs::write(
        logs.join("2.log"),
        "2024-05-14T09:13:02.5Z stdout F *** Starting uWSGI 2.0.25.1 (64bit) ***\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(
        format!("../pods/shop_{WEB}_{WEB_UID}/app/2.log"),
        root.join(format!("var/log/containers/{WEB}_shop_app-{NEW}.log")),
    )
    .unwrap();

    clock.advance(Duration::from_secs(5));
    let second = agent.tick();
    let app = workload(&second, "app");
    // The kill that happened in the vanished cgroup is credited from the pod's counter.
    assert_eq!(
        describe_workload(app),
        format!(
            "workload shop/{WEB}/app
  kind container
  qos burstable
  pod_uid {WEB_UID}
  container_id {NEW}
  cgroup {}
  memory usage 125829120 working_set 92274688 limit 536870912
  oom_kills 3
  processes 1
  zombies 0
  logs stdout 4 stderr 3 malformed 0
  logs_per_minute stdout 1 stderr 0 malformed 0
  restarts 2
",
            scope(web_pod(), NEW)
        )
    );
    let web = second.pods.iter().find(|p| p.pod == WEB).unwrap();
    assert_eq!(web.oom_kills_total, Some(4));
    assert_eq!(second.workloads.len(), 6);

    let text = metrics(second);
    let labels = format!("namespace=\"shop\",pod=\"{WEB}\",container=\"app\",node=\"{NODE}\"");
    assert_lines(
        &text,
        &[
            &format!("nodeguard_container_oom_kills_total{{{labels}}} 3"),
            &format!("nodeguard_container_restarts_total{{{labels}}} 2"),
            &format!("nodeguard_pod_oom_kills_total{{namespace=\"shop\",pod=\"{WEB}\",node=\"{NODE}\"}} 4"),
        ],
    );
}

// === one malformed memory file ===

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let ty = entry.file_type().unwrap();
        let dest = to.join(entry.file_name());
        if ty.is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(entry.path()).unwrap(), &dest).unwrap();
        } else if ty.is_dir() {
            copy_tree(&entry.path(), &dest);
        } else {
            fs::copy(entry.path(), &dest).unwrap();
        }
    }
}

/// Replaces the value of `inactive_file` in the app container's memory.stat.
fn corrupt_app_memory_stat(root: &Path) {
    let path = root
        .join("sys/fs/cgroup")
        .join(v2::scope(v2::web_pod(), v2::APP).trim_start_matches('/'))
        .join("memory.stat");
    let text = fs::read_to_string(&path).unwrap();
    let bad: String = text
        .lines()
        .map(|l| match l.strip_prefix("inactive_file ") {
            Some(_) => "inactive_file 33554432\u{fffd}\n".to_owned(),
            None => format!("{l}\n"),
        })
        .collect();
    assert_ne!(text, bad);
    fs::write(&path, bad).unwrap();
}

fn memory_errors(snap: &Snapshot) -> Vec<(String, u64)> {
    snap.samplers
        .iter()
        .find(|s| s.name == "memory")
        .unwrap()
        .errors_total
        .clone()
}

#[test]
fn malformed_memory_stat_spares_the_other_workloads() {
    use v2::*;
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture("v2-systemd"), dir.path());
    corrupt_app_memory_stat(dir.path());
    let snap = tick(dir.path(), NODE);

    let clean = tick(&fixture("v2-systemd"), NODE);
    for (got, want) in snap.workloads.iter().zip(&clean.workloads) {
        if want.id.to_string() == format!("shop/{WEB}/app") {
            // No last good value yet: no memory, and no OOM kills read (memory.events is read
            // after memory.stat); processes are sampled apart.
            let want = WorkloadSignals {
                memory: None,
                oom_kills_total: 0,
                ..want.clone()
            };
            assert_eq!(describe_workload(got), describe_workload(&want));
        } else {
            assert_eq!(describe_workload(got), describe_workload(want));
        }
    }
    assert_eq!(snap.workloads.len(), 6);
    assert_eq!(snap.pods, clean.pods);
    assert_eq!(memory_errors(&snap), vec![("parse".to_string(), 1)]);
    assert!(snap.samplers.iter().all(|s| s.fresh));

    let text = metrics(snap);
    assert_lines(
        &text,
        &[&format!(
            "nodeguard_sampler_errors_total{{node=\"{NODE}\",sampler=\"memory\",kind=\"parse\"}} 1"
        )],
    );
    assert_eq!(
        series(&text, "nodeguard_container_memory_working_set_bytes").len(),
        5
    );
}

#[test]
fn malformed_memory_stat_keeps_the_last_good_value_marked_stale() {
    use v2::*;
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&fixture("v2-systemd"), dir.path());
    let (mut agent, clock) = agent(dir.path(), NODE);
    let first = agent.tick();
    corrupt_app_memory_stat(dir.path());
    clock.advance(Duration::from_secs(5));
    let second = agent.tick();

    let app = |s: &Snapshot| {
        s.workloads
            .iter()
            .find(|w| w.id.container == "app")
            .cloned()
            .unwrap()
    };
    let before = app(&first);
    let after = app(&second);
    let memory = describe_workload(&after)
        .lines()
        .find(|l| l.starts_with("  memory "))
        .map(str::to_owned);
    assert_eq!(
        memory.as_deref(),
        Some("  memory usage 444596224 working_set 411041792 limit 536870912 stale")
    );
    assert_eq!(after.oom_kills_total, 2);
    assert_eq!(
        describe_workload(&WorkloadSignals {
            memory: before.memory,
            ..after
        }),
        describe_workload(&before)
    );
    assert!(second
        .workloads
        .iter()
        .filter(|w| w.id.container != "app")
        .all(|w| w.memory.is_some_and(|m| !m.stale)));
    assert_eq!(memory_errors(&second), vec![("parse".to_string(), 1)]);

    let text = metrics(second);
    assert_eq!(
        series(&text, "nodeguard_container_signal_stale"),
        vec![format!(
            "nodeguard_container_signal_stale{{namespace=\"shop\",pod=\"{WEB}\",container=\"app\",node=\"{NODE}\",signal=\"memory\"}} 1"
        )]
    );
    assert_lines(
        &text,
        &[&format!(
            "nodeguard_container_memory_working_set_bytes{{namespace=\"shop\",pod=\"{WEB}\",container=\"app\",node=\"{NODE}\"}} 411041792"
        )],
    );
}

#[test]
fn layouts_are_detected_from_files() {
    let detect = |tree: &str| {
        CgroupLayout::detect(&fixture(tree).join("sys/fs/cgroup"))
            .unwrap()
            .name()
    };
    assert_eq!(detect("v2-systemd"), "v2");
    assert_eq!(detect("v1-cgroupfs"), "v1");
    assert_eq!(detect("hybrid-systemd"), "hybrid");
    let (agent, _) = agent(&fixture("hybrid-systemd"), "ci-hybrid-1");
    assert_eq!(
        agent.layout().unified(),
        Some(
            fixture("hybrid-systemd")
                .join("sys/fs/cgroup/unified")
                .as_path()
        )
    );
}
