//! The agent run on fixture trees shaped like real hosts (see tests/fixtures/README.md for where
//! each shape comes from and the table of expected values). Every value is asserted exactly.

use nodeguard::agent::Agent;
use nodeguard::clock::ManualClock;
use nodeguard::config::Config;
use nodeguard::discover::kubelet::QosClass;
use nodeguard::discover::names::NameSource;
use nodeguard::discover::{CgroupLayout, Discovery, DiscoveryConfig};
use nodeguard::export::metrics::{registry, render, SharedSnapshot};
use nodeguard::model::LineCounts;
use nodeguard::model::ZombieParent;
use nodeguard::model::{Held, MemoryValues, PodSignals, Published, Snapshot, WorkloadSignals};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

const V1_UNLIMITED: &str = "9223372036854771712";

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

// === expected rows ===

/// The snapshot fields that come from the cgroup tree and /proc (logs are asserted apart).
#[derive(Debug, PartialEq)]
struct Row {
    id: (String, String, String),
    kind: &'static str,
    qos: Option<QosClass>,
    pod_uid: Option<String>,
    container_id: Option<String>,
    cgroup: Option<String>,
    memory: Option<Held<MemoryValues>>,
    oom_kills_total: u64,
    processes: Option<Held<u64>>,
    zombies: Option<Held<u64>>,
    zombie_parents: Vec<ZombieParent>,
}

fn row(w: &WorkloadSignals) -> Row {
    Row {
        id: (
            w.id.namespace.clone(),
            w.id.pod.clone(),
            w.id.container.clone(),
        ),
        kind: w.kind.as_str(),
        qos: w.qos,
        pod_uid: w.pod_uid.clone(),
        container_id: w.container_id.clone(),
        cgroup: w.cgroup.clone(),
        memory: w.memory,
        oom_kills_total: w.oom_kills_total,
        processes: w.processes,
        zombies: w.zombies,
        zombie_parents: w.zombie_parents.clone(),
    }
}

fn id(ns: &str, pod: &str, container: &str) -> (String, String, String) {
    (ns.into(), pod.into(), container.into())
}

fn mem(usage: u64, working_set: u64, limit: Option<u64>) -> Option<Held<MemoryValues>> {
    Some(Held {
        value: MemoryValues {
            usage_bytes: usage,
            working_set_bytes: working_set,
            limit_bytes: limit,
        },
        stale: false,
    })
}

fn fresh(v: u64) -> Option<Held<u64>> {
    Some(Held {
        value: v,
        stale: false,
    })
}

fn parent(pid: u32, comm: &str, zombies: u64) -> ZombieParent {
    ZombieParent {
        pid,
        comm: comm.into(),
        zombies,
    }
}

fn unit(name: &str, cgroup: &str, usage: u64, working_set: u64, processes: u64) -> Row {
    Row {
        id: id("", "", name),
        kind: "unit",
        qos: None,
        pod_uid: None,
        container_id: Some(cgroup.into()),
        cgroup: Some(cgroup.into()),
        memory: mem(usage, working_set, None),
        oom_kills_total: 0,
        processes: fresh(processes),
        zombies: fresh(0),
        zombie_parents: vec![],
    }
}

/// A container row without zombies or OOM kills; callers override with struct update syntax.
fn container(
    (ns, pod, name): (&str, &str, &str),
    qos: QosClass,
    uid: &str,
    container_id: &str,
    cgroup: String,
    memory: Option<Held<MemoryValues>>,
    processes: u64,
) -> Row {
    Row {
        id: id(ns, pod, name),
        kind: "container",
        qos: Some(qos),
        pod_uid: Some(uid.into()),
        container_id: Some(container_id.into()),
        cgroup: Some(cgroup),
        memory,
        oom_kills_total: 0,
        processes: fresh(processes),
        zombies: fresh(0),
        zombie_parents: vec![],
    }
}

fn rows(snap: &Snapshot) -> Vec<Row> {
    snap.workloads.iter().map(row).collect()
}

fn logs(snap: &Snapshot) -> Vec<(String, LineCounts, u64)> {
    snap.workloads
        .iter()
        .map(|w| (w.id.to_string(), w.log_lines_total, w.restarts_total))
        .collect()
}

/// Content present when the agent starts is backlog: counted in totals, not in the rate.
fn assert_no_rate_at_start(snap: &Snapshot) {
    for w in &snap.workloads {
        assert_eq!(w.log_lines_per_minute, LineCounts::default(), "{}", w.id);
    }
}

fn lines(stdout: u64, stderr: u64) -> LineCounts {
    LineCounts {
        stdout,
        stderr,
        malformed: 0,
    }
}

fn assert_samplers_clean(snap: &Snapshot) {
    let got: Vec<_> = snap
        .samplers
        .iter()
        .map(|s| (s.name, s.enabled, s.fresh, s.errors_total.clone()))
        .collect();
    assert_eq!(
        got,
        [
            "discovery",
            "memory",
            "processes",
            "logs",
            "sockets",
            "conntrack",
            "ports",
            "kmsg"
        ]
        .map(|n| (n, true, true, vec![]))
    );
}

// === v2-systemd: k3s, unified hierarchy, systemd cgroup driver ===

mod v2 {
    pub const NODE: &str = "k3s-agent-1";
    pub const WEB_UID: &str = "3f6c2a1e-8b4d-4e7a-9c15-2d7e0b9a4f61";
    pub const PG_UID: &str = "a1d4e8c2-5f3b-4c9e-8a70-6b2d9e1f3c85";
    pub const DBG_UID: &str = "7e2b9c4d-1a6f-4d83-b5e0-9f8c3a2d1e47";
    pub const NGINX: &str = "c842e7e9efb61e3cc052505d39c50d0e0ae82d6b04405ac03322df3549cdf6e0";
    pub const APP: &str = "913e5ec576903244fced5ad2ee0f1fa3e96d75102e386ab299b4e1029105c04c";
    pub const PG: &str = "c91a4aed8c393df97cca82215204ca565e2dc46f514d49b6fa01439eb122320e";
    pub const SHELL: &str = "339add00d50ed924573b14aeb9aa2283db84c63c88096484dc52098f414c42a8";
    pub const WEB: &str = "web-5d9c7b8f6-x7kqp";

    pub fn web_pod() -> String {
        format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            WEB_UID.replace('-', "_")
        )
    }
    pub fn pg_pod() -> String {
        format!(
            "/kubepods.slice/kubepods-pod{}.slice",
            PG_UID.replace('-', "_")
        )
    }
    pub fn dbg_pod() -> String {
        format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
            DBG_UID.replace('-', "_")
        )
    }
    pub fn scope(pod: String, id: &str) -> String {
        format!("{pod}/cri-containerd-{id}.scope")
    }
}

#[test]
fn v2_systemd_snapshot() {
    use v2::*;
    let snap = tick(&fixture("v2-systemd"), NODE);
    assert_eq!(snap.cgroup_layout, "v2");
    assert_eq!(snap.node, NODE);
    let expected = vec![
        unit(
            "containerd.service",
            "/system.slice/containerd.service",
            110_100_480,
            57_671_680,
            1,
        ),
        unit(
            "k3s.service",
            "/system.slice/k3s.service",
            914_358_272,
            763_363_328,
            4,
        ),
        Row {
            oom_kills_total: 1,
            ..container(
                ("db", "postgres-0", "postgres"),
                QosClass::Guaranteed,
                PG_UID,
                PG,
                scope(pg_pod(), PG),
                mem(794_820_608, 526_385_152, Some(1_073_741_824)),
                4,
            )
        },
        container(
            ("default", "debug-shell", "shell"),
            QosClass::BestEffort,
            DBG_UID,
            SHELL,
            scope(dbg_pod(), SHELL),
            mem(5_767_168, 2_883_584, None),
            2,
        ),
        Row {
            oom_kills_total: 2,
            zombies: fresh(3),
            zombie_parents: vec![parent(1302, "uwsgi (master)", 2), parent(1330, "uwsgi", 1)],
            ..container(
                ("shop", WEB, "app"),
                QosClass::Burstable,
                WEB_UID,
                APP,
                scope(web_pod(), APP),
                mem(444_596_224, 411_041_792, Some(536_870_912)),
                3,
            )
        },
        container(
            ("shop", WEB, "nginx"),
            QosClass::Burstable,
            WEB_UID,
            NGINX,
            scope(web_pod(), NGINX),
            mem(22_020_096, 15_728_640, Some(268_435_456)),
            3,
        ),
    ];
    assert_eq!(rows(&snap), expected);
    // Pod cgroups in walk order; OOM kills are hierarchical on v2 (web: 2 now + 1 of the
    // instance that was replaced).
    let pod = |ns: &str, name: &str, uid: &str, oom| PodSignals {
        namespace: ns.into(),
        pod: name.into(),
        uid: uid.into(),
        oom_kills_total: Some(oom),
        // The fixtures carry no network namespaces: the network columns stay empty.
        host_network: None,
        netns_conntrack_entries: None,
        host_conntrack_entries: None,
        netns_sockets: None,
        addresses: vec![],
        ephemeral_ports: None,
    };
    assert_eq!(
        snap.pods,
        vec![
            pod("default", "debug-shell", DBG_UID, 0),
            pod("shop", WEB, WEB_UID, 3),
            pod("db", "postgres-0", PG_UID, 1),
        ]
    );
    assert_samplers_clean(&snap);
}

#[test]
fn v2_systemd_metrics() {
    use v2::*;
    let text = metrics(tick(&fixture("v2-systemd"), NODE));
    let app = format!("namespace=\"shop\",pod=\"{WEB}\",container=\"app\",node=\"{NODE}\"");
    assert_lines(
        &text,
        &[
            &format!("nodeguard_container_memory_working_set_bytes{{{app}}} 411041792"),
            &format!("nodeguard_container_memory_usage_bytes{{{app}}} 444596224"),
            &format!("nodeguard_container_oom_kills_total{{{app}}} 2"),
            &format!("nodeguard_container_processes{{{app}}} 3"),
            &format!("nodeguard_container_zombies{{{app}}} 3"),
            &format!("nodeguard_container_zombie_parent_zombies{{{app},parent_comm=\"uwsgi (master)\"}} 2"),
            &format!("nodeguard_container_zombie_parent_zombies{{{app},parent_comm=\"uwsgi\"}} 1"),
            &format!("nodeguard_container_memory_working_set_bytes{{namespace=\"\",pod=\"\",container=\"k3s.service\",node=\"{NODE}\"}} 763363328"),
            &format!("nodeguard_pod_oom_kills_total{{namespace=\"shop\",pod=\"{WEB}\",node=\"{NODE}\"}} 3"),
            &format!("nodeguard_workloads{{node=\"{NODE}\",kind=\"container\"}} 4"),
            &format!("nodeguard_workloads{{node=\"{NODE}\",kind=\"unit\"}} 2"),
            &format!("nodeguard_sampler_errors_total{{node=\"{NODE}\",sampler=\"memory\",kind=\"parse\"}} 0"),
            &format!("nodeguard_build_info{{node=\"{NODE}\",version=\"{}\",revision=\"{}\",cgroup_layout=\"v2\"}} 1", env!("CARGO_PKG_VERSION"), nodeguard::export::info::REVISION),
        ],
    );
    // Unlimited (debug-shell, both units): no limit series at all.
    assert_eq!(
        series(&text, "nodeguard_container_memory_limit_bytes"),
        vec![
            format!("nodeguard_container_memory_limit_bytes{{namespace=\"db\",pod=\"postgres-0\",container=\"postgres\",node=\"{NODE}\"}} 1073741824"),
            format!("nodeguard_container_memory_limit_bytes{{{app}}} 536870912"),
            format!("nodeguard_container_memory_limit_bytes{{namespace=\"shop\",pod=\"{WEB}\",container=\"nginx\",node=\"{NODE}\"}} 268435456"),
        ]
    );
    assert!(series(&text, "nodeguard_container_signal_stale").is_empty());
}

#[test]
fn v2_systemd_logs_and_restarts() {
    use v2::*;
    let snap = tick(&fixture("v2-systemd"), NODE);
    // F lines count once each, P parts are joined into the next F line of their stream; app was
    // restarted once (0.log of the replaced instance, 1.log now).
    assert_no_rate_at_start(&snap);
    assert_eq!(
        logs(&snap),
        vec![
            ("containerd.service".into(), lines(0, 0), 0),
            ("k3s.service".into(), lines(0, 0), 0),
            ("db/postgres-0/postgres".into(), lines(1, 4), 0),
            ("default/debug-shell/shell".into(), lines(2, 0), 0),
            (format!("shop/{WEB}/app"), lines(3, 3), 1),
            (format!("shop/{WEB}/nginx"), lines(4, 2), 0),
        ]
    );
    let text = metrics(snap);
    let app = format!("namespace=\"shop\",pod=\"{WEB}\",container=\"app\",node=\"{NODE}\"");
    assert_lines(
        &text,
        &[
            &format!("nodeguard_container_log_lines_total{{{app},stream=\"stdout\"}} 3"),
            &format!("nodeguard_container_log_lines_total{{{app},stream=\"stderr\"}} 3"),
            &format!("nodeguard_container_restarts_total{{{app}}} 1"),
        ],
    );
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
    assert_eq!(
        (nginx.log_lines_total, nginx.log_lines_per_minute),
        (lines(6, 2), lines(2, 0))
    );
    // The P part completes now: one stderr line.
    append(
        &log,
        "2024-05-14T09:12:21.3Z stderr F while reading response header from upstream\n",
    );
    clock.advance(Duration::from_secs(5));
    let s = agent.tick();
    let nginx = workload(&s, "nginx");
    assert_eq!(
        (nginx.log_lines_total, nginx.log_lines_per_minute),
        (lines(6, 3), lines(2, 1))
    );
    clock.advance(Duration::from_secs(61));
    let s = agent.tick();
    let nginx = workload(&s, "nginx");
    assert_eq!(
        (nginx.log_lines_total, nginx.log_lines_per_minute),
        (lines(6, 3), lines(0, 0))
    );
    let app = workload(&s, "app");
    assert_eq!(
        (app.log_lines_total, app.log_lines_per_minute),
        (lines(3, 3), lines(0, 0))
    );
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
    assert_eq!(
        row(app),
        Row {
            // The kill that happened in the vanished cgroup is credited from the pod's counter.
            oom_kills_total: 3,
            ..container(
                ("shop", WEB, "app"),
                QosClass::Burstable,
                WEB_UID,
                NEW,
                scope(web_pod(), NEW),
                mem(125_829_120, 92_274_688, Some(536_870_912)),
                1,
            )
        }
    );
    assert_eq!(app.restarts_total, 2);
    assert_eq!(
        (app.log_lines_total, app.log_lines_per_minute),
        (lines(4, 3), lines(1, 0))
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

// === v1-cgroupfs: legacy hierarchy, kubelet's cgroupfs driver ===

mod v1 {
    pub const NODE: &str = "worker-legacy-1";
    pub const API_UID: &str = "5b0e7d3a-9c21-4f6e-8d4b-1a2c3e4f5a6b";
    pub const DIND_UID: &str = "c8f1a2b3-4d5e-4f60-9a1b-2c3d4e5f6a7b";
    pub const REDIS_UID: &str = "e4d3c2b1-a0f9-4e8d-b7c6-5a4b3c2d1e0f";
    pub const API: &str = "74c2b10dfa093bda8589884822cabdda8eb5b1216f91935c67870dda24df31a7";
    pub const DIND: &str = "debf9361217a2e69d7863936aa01357d6299c25d87626e77dad36c9b8df5a725";
    pub const REDIS: &str = "e7f3667b7864f7b57e8800bf0e3feafd6d149703cd3b86c36314eca40ff569fe";
    pub const API_POD: &str = "api-6c8d9f7b5-q2w4e";
}

#[test]
fn v1_cgroupfs_snapshot() {
    use v1::*;
    let snap = tick(&fixture("v1-cgroupfs"), NODE);
    assert_eq!(snap.cgroup_layout, "v1");
    let expected = vec![
        unit(
            "containerd.service",
            "/system.slice/containerd.service",
            160_432_128,
            87_031_808,
            4,
        ),
        unit(
            "kubelet.service",
            "/system.slice/kubelet.service",
            144_703_488,
            111_149_056,
            1,
        ),
        Row {
            oom_kills_total: 1,
            ..container(
                ("cache", "redis-0", "redis"),
                QosClass::Guaranteed,
                REDIS_UID,
                REDIS,
                format!("/kubepods/pod{REDIS_UID}/{REDIS}"),
                mem(235_929_600, 233_832_448, Some(268_435_456)),
                1,
            )
        },
        // docker-in-docker: usage and total_inactive_file cover the nested build container
        // (inactive_file alone would give 234881024). Its process count is asserted in
        // `container_processes_include_nested_cgroups`.
        container(
            ("ci", "dind-build-7x9k2", "dind"),
            QosClass::BestEffort,
            DIND_UID,
            DIND,
            format!("/kubepods/besteffort/pod{DIND_UID}/{DIND}"),
            mem(245_366_784, 192_937_984, None),
            0,
        ),
        Row {
            zombies: fresh(1),
            zombie_parents: vec![parent(2151, "gunicorn", 1)],
            ..container(
                ("payments", API_POD, "api"),
                QosClass::Burstable,
                API_UID,
                API,
                format!("/kubepods/burstable/pod{API_UID}/{API}"),
                mem(205_520_896, 188_743_680, Some(402_653_184)),
                3,
            )
        },
    ];
    let mut got = rows(&snap);
    for r in got.iter_mut().filter(|r| r.id.2 == "dind") {
        r.processes = fresh(0);
    }
    assert_eq!(got, expected);
    // v1 counts OOM kills per cgroup, not hierarchically: no pod-level value.
    let pod = |ns: &str, name: &str, uid: &str| PodSignals {
        namespace: ns.into(),
        pod: name.into(),
        uid: uid.into(),
        oom_kills_total: None,
        host_network: None,
        netns_conntrack_entries: None,
        host_conntrack_entries: None,
        netns_sockets: None,
        addresses: vec![],
        ephemeral_ports: None,
    };
    assert_eq!(
        snap.pods,
        vec![
            pod("ci", "dind-build-7x9k2", DIND_UID),
            pod("payments", API_POD, API_UID),
            pod("cache", "redis-0", REDIS_UID),
        ]
    );
    assert_samplers_clean(&snap);
}

#[test]
fn v1_cgroupfs_metrics() {
    use v1::*;
    let text = metrics(tick(&fixture("v1-cgroupfs"), NODE));
    let redis = format!("namespace=\"cache\",pod=\"redis-0\",container=\"redis\",node=\"{NODE}\"");
    let api = format!("namespace=\"payments\",pod=\"{API_POD}\",container=\"api\",node=\"{NODE}\"");
    assert_lines(
        &text,
        &[
            &format!("nodeguard_container_memory_working_set_bytes{{{redis}}} 233832448"),
            &format!("nodeguard_container_oom_kills_total{{{redis}}} 1"),
            &format!("nodeguard_container_memory_working_set_bytes{{{api}}} 188743680"),
            &format!("nodeguard_container_zombie_parent_zombies{{{api},parent_comm=\"gunicorn\"}} 1"),
            &format!("nodeguard_container_memory_working_set_bytes{{namespace=\"ci\",pod=\"dind-build-7x9k2\",container=\"dind\",node=\"{NODE}\"}} 192937984"),
            &format!("nodeguard_build_info{{node=\"{NODE}\",version=\"{}\",revision=\"{}\",cgroup_layout=\"v1\"}} 1", env!("CARGO_PKG_VERSION"), nodeguard::export::info::REVISION),
        ],
    );
    // 9223372036854771712 is v1's "no limit": dind and both units have no series.
    assert_eq!(
        series(&text, "nodeguard_container_memory_limit_bytes"),
        vec![
            format!("nodeguard_container_memory_limit_bytes{{{redis}}} 268435456"),
            format!("nodeguard_container_memory_limit_bytes{{{api}}} 402653184"),
        ]
    );
    assert!(!text.contains(V1_UNLIMITED));
    assert!(series(&text, "nodeguard_pod_oom_kills_total").is_empty());
}

#[test]
fn v1_cgroupfs_logs() {
    use v1::*;
    let snap = tick(&fixture("v1-cgroupfs"), NODE);
    assert_no_rate_at_start(&snap);
    assert_eq!(
        logs(&snap),
        vec![
            ("containerd.service".into(), lines(0, 0), 0),
            ("kubelet.service".into(), lines(0, 0), 0),
            ("cache/redis-0/redis".into(), lines(4, 0), 0),
            ("ci/dind-build-7x9k2/dind".into(), lines(1, 3), 0),
            (format!("payments/{API_POD}/api"), lines(5, 2), 0),
        ]
    );
}

#[test]
fn container_processes_include_nested_cgroups() {
    // The dind container runs dockerd, containerd and a shim in its own cgroup and the build
    // (`make`, pid 2460) in `<id>/docker/<inner id>`: the container runs 4 processes, as its
    // memory (hierarchical) already counts the nested build.
    let snap = tick(&fixture("v1-cgroupfs"), v1::NODE);
    let dind = snap
        .workloads
        .iter()
        .find(|w| w.id.container == "dind")
        .unwrap();
    assert_eq!(dind.processes, fresh(4));
}

// === hybrid-systemd: v1 controllers + cgroup2 at unified/, systemd driver (like the CI host) ===

mod hybrid {
    pub const NODE: &str = "ci-hybrid-1";
    pub const RUNNER_UID: &str = "9d8c7b6a-5e4f-4a3b-8c2d-1e0f9a8b7c6d";
    pub const NE_UID: &str = "2b3c4d5e-6f70-4819-a2b3-c4d5e6f70819";
    pub const RUNNER: &str = "a231afba456399e59d908510ccbffc8651c31509d4fab543e777c36a931e4932";
    pub const NE: &str = "e3e4bad93443a2f7b4c07fff210c5cef14aa1869dc425d58e11fa2928b270f2b";
    pub const RUNNER_POD: &str = "linux-x64-4vq7k-runner-zt8sd";
}

#[test]
fn hybrid_systemd_snapshot() {
    use hybrid::*;
    let snap = tick(&fixture("hybrid-systemd"), NODE);
    assert_eq!(snap.cgroup_layout, "hybrid");
    let expected = vec![
        // containerd.service has no memory accounting: absent from the memory controller, so
        // not a workload; its shim is the parent the exec-probe zombies fall back from.
        unit(
            "kubelet.service",
            "/system.slice/kubelet.service",
            145_752_064,
            120_586_240,
            1,
        ),
        Row {
            zombies: fresh(3),
            // 3150, 3151: parent is the shim (in no workload), attributed by their `0::` line;
            // 3141: parent 3120 is in the runner's cgroup.procs.
            zombie_parents: vec![
                parent(3090, "containerd-shim", 2),
                parent(3120, "Runner.Listener", 1),
            ],
            ..container(
                ("ci-runners", RUNNER_POD, "runner"),
                QosClass::Burstable,
                RUNNER_UID,
                RUNNER,
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{RUNNER}.scope",
                    RUNNER_UID.replace('-', "_")
                ),
                mem(448_790_528, 354_418_688, Some(2_147_483_648)),
                2,
            )
        },
        container(
            ("monitoring", "node-exporter-hx7wq", "node-exporter"),
            QosClass::BestEffort,
            NE_UID,
            NE,
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{NE}.scope",
                NE_UID.replace('-', "_")
            ),
            mem(23_855_104, 22_806_528, None),
            1,
        ),
    ];
    assert_eq!(rows(&snap), expected);
    let pod = |ns: &str, name: &str, uid: &str| PodSignals {
        namespace: ns.into(),
        pod: name.into(),
        uid: uid.into(),
        oom_kills_total: None,
        host_network: None,
        netns_conntrack_entries: None,
        host_conntrack_entries: None,
        netns_sockets: None,
        addresses: vec![],
        ephemeral_ports: None,
    };
    assert_eq!(
        snap.pods,
        vec![
            pod("monitoring", "node-exporter-hx7wq", NE_UID),
            pod("ci-runners", RUNNER_POD, RUNNER_UID),
        ]
    );
    assert_samplers_clean(&snap);
}

#[test]
fn hybrid_systemd_metrics() {
    use hybrid::*;
    let text = metrics(tick(&fixture("hybrid-systemd"), NODE));
    let runner = format!(
        "namespace=\"ci-runners\",pod=\"{RUNNER_POD}\",container=\"runner\",node=\"{NODE}\""
    );
    assert_lines(
        &text,
        &[
            &format!("nodeguard_container_memory_working_set_bytes{{{runner}}} 354418688"),
            &format!("nodeguard_container_zombies{{{runner}}} 3"),
            &format!("nodeguard_container_zombie_parent_zombies{{{runner},parent_comm=\"containerd-shim\"}} 2"),
            &format!("nodeguard_container_zombie_parent_zombies{{{runner},parent_comm=\"Runner.Listener\"}} 1"),
            &format!("nodeguard_build_info{{node=\"{NODE}\",version=\"{}\",revision=\"{}\",cgroup_layout=\"hybrid\"}} 1", env!("CARGO_PKG_VERSION"), nodeguard::export::info::REVISION),
        ],
    );
    assert_eq!(
        series(&text, "nodeguard_container_memory_limit_bytes"),
        vec![format!(
            "nodeguard_container_memory_limit_bytes{{{runner}}} 2147483648"
        )]
    );
}

#[test]
fn hybrid_systemd_logs() {
    use hybrid::*;
    let snap = tick(&fixture("hybrid-systemd"), NODE);
    assert_no_rate_at_start(&snap);
    assert_eq!(
        logs(&snap),
        vec![
            ("kubelet.service".into(), lines(0, 0), 0),
            (format!("ci-runners/{RUNNER_POD}/runner"), lines(5, 1), 0),
            (
                "monitoring/node-exporter-hx7wq/node-exporter".into(),
                lines(0, 3),
                0
            ),
        ]
    );
}

// === discovery: sandboxes ===

#[test]
fn pause_sandboxes_are_counted_and_left_out() {
    // The snapshot does not carry the sandbox count, so ask discovery directly.
    for (tree, sandboxes, workloads) in [
        ("v2-systemd", 3, 6),
        ("v1-cgroupfs", 3, 5),
        ("hybrid-systemd", 2, 3),
    ] {
        let root = fixture(tree);
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
        assert_eq!(inv.sandboxes, sandboxes, "{tree}");
        assert_eq!(inv.workloads.len(), workloads, "{tree}");
        assert!(
            inv.workloads.iter().all(|w| w.id.container != "pause"
                && !w.id.container.chars().all(|c| c.is_ascii_hexdigit())),
            "{tree}: {:?}",
            inv.workloads
        );
    }
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
    for (got, want) in rows(&snap).into_iter().zip(rows(&clean)) {
        if want.id == id("shop", WEB, "app") {
            // No last good value yet: no memory, and no OOM kills read (memory.events is read
            // after memory.stat); processes are sampled apart.
            assert_eq!(
                got,
                Row {
                    memory: None,
                    oom_kills_total: 0,
                    ..want
                }
            );
        } else {
            assert_eq!(got, want);
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
            .map(row)
            .unwrap()
    };
    let before = app(&first);
    let after = app(&second);
    assert_eq!(
        after.memory,
        Some(Held {
            value: MemoryValues {
                usage_bytes: 444_596_224,
                working_set_bytes: 411_041_792,
                limit_bytes: Some(536_870_912),
            },
            stale: true,
        })
    );
    assert_eq!(after.oom_kills_total, 2);
    assert_eq!(
        Row {
            memory: before.memory,
            ..after
        },
        before
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
    let (agent, _) = agent(&fixture("hybrid-systemd"), hybrid::NODE);
    assert_eq!(
        agent.layout().unified(),
        Some(
            fixture("hybrid-systemd")
                .join("sys/fs/cgroup/unified")
                .as_path()
        )
    );
}
