//! Real-kernel tests of the core signals (CI runs them as root). Each test builds its own
//! kubelet-style tree under a unique parent cgroup and asserts exact numbers.

mod common;

use common::snap::{find, metrics_text};

use common::{node, Driver};
use nodeguard::discover::kubelet::QosClass;

const MIB: u64 = 1 << 20;

#[test]
fn discovers_both_drivers_with_names_qos_and_skips_the_sandbox() {
    let Some(mut n) = node() else { return };
    let a = n.pod(
        Driver::Systemd,
        QosClass::Burstable,
        "feeds",
        "backend-7d9f8-x2k4q",
    );
    let b = n.pod(Driver::Cgroupfs, QosClass::BestEffort, "web", "nginx-0");
    let g = n.pod(Driver::Systemd, QosClass::Guaranteed, "db", "postgres-0");
    let api = n.container(&a, "api", 0);
    let relay = n.container(&a, "relay", 0);
    let sandbox = n.container_cgroup(&a, "POD", 0);
    let web = n.container(&b, "nginx", 2);
    let pg = n.container(&g, "postgres", 0);
    for c in [&api, &relay, &web, &pg] {
        n.spawn(c, &["idle"]);
    }
    n.spawn(&sandbox, &["--comm", "pause", "idle"]);

    let snap = n.agent().tick();
    let ids: Vec<String> = snap.workloads.iter().map(|w| w.id.to_string()).collect();
    assert_eq!(
        ids,
        vec![
            "db/postgres-0/postgres",
            "feeds/backend-7d9f8-x2k4q/api",
            "feeds/backend-7d9f8-x2k4q/relay",
            "web/nginx-0/nginx",
        ]
    );
    assert_eq!(
        find(&snap, "feeds", "backend-7d9f8-x2k4q", "api").qos,
        Some(QosClass::Burstable)
    );
    assert_eq!(
        find(&snap, "web", "nginx-0", "nginx").qos,
        Some(QosClass::BestEffort)
    );
    assert_eq!(
        find(&snap, "db", "postgres-0", "postgres").qos,
        Some(QosClass::Guaranteed)
    );
    let w = find(&snap, "web", "nginx-0", "nginx");
    assert_eq!(w.container_id.as_deref(), Some(web.id.as_str()));
    assert_eq!(w.pod_uid.as_deref(), Some(b.uid.as_str()));
    // The log file number is kubelet's restart count.
    assert_eq!(w.restarts_total, 2);
    for w in &snap.workloads {
        assert_eq!(w.processes.map(|p| p.value), Some(1), "{}", w.id);
    }
    assert_eq!(snap.pods.len(), 3);
    let _ = sandbox;
}

#[test]
fn zombies_are_counted_exactly_and_blamed_on_the_parent() {
    let Some(mut n) = node() else { return };
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, "feeds", "backend-0");
    let sup = n.container(&p, "supervisor", 0);
    let quiet = n.container(&p, "quiet", 0);
    let parent = n.spawn(&sup, &["--comm", "py (supervisor)", "zombies", "5"]);
    n.spawn(&quiet, &["idle"]);
    let mut agent = n.agent();

    let snap = agent.tick();
    let s = find(&snap, "feeds", "backend-0", "supervisor");
    assert_eq!(s.zombies.map(|z| z.value), Some(5));
    assert_eq!(
        s.processes.map(|z| z.value),
        Some(1),
        "zombies leave cgroup.procs"
    );
    assert_eq!(s.zombie_parents.len(), 1);
    assert_eq!(s.zombie_parents[0].pid, parent);
    assert_eq!(s.zombie_parents[0].comm, "py (supervisor)");
    assert_eq!(s.zombie_parents[0].zombies, 5);
    assert_eq!(
        find(&snap, "feeds", "backend-0", "quiet")
            .zombies
            .map(|z| z.value),
        Some(0)
    );
    let text = metrics_text(&snap);
    assert!(text.contains(
        "nodeguard_container_zombies{namespace=\"feeds\",pod=\"backend-0\",container=\"supervisor\"} 5\n"
    ), "{text}");
    assert!(text.contains(
        "nodeguard_container_zombie_parent_zombies{namespace=\"feeds\",pod=\"backend-0\",container=\"supervisor\",parent_comm=\"py (supervisor)\"} 5\n"
    ), "{text}");

    // Once the parent reaps and exits, the zombies are gone.
    n.stop(parent);
    let snap = agent.tick();
    let s = find(&snap, "feeds", "backend-0", "supervisor");
    assert_eq!(s.zombies.map(|z| z.value), Some(0));
    assert_eq!(s.processes.map(|z| z.value), Some(0));
    assert!(s.zombie_parents.is_empty());
}

#[test]
fn memory_working_set_and_limit_on_the_real_controller() {
    let Some(mut n) = node() else { return };
    let p = n.pod(Driver::Systemd, QosClass::Burstable, "feeds", "mem-0");
    let limited = n.container(&p, "limited", 0);
    let unlimited = n.container(&p, "unlimited", 0);
    n.set_memory_limit(&limited, 256 * MIB);
    n.spawn(&limited, &["alloc", &(64 * MIB).to_string()]);
    n.spawn(&unlimited, &["alloc", &(16 * MIB).to_string()]);

    let snap = n.agent().tick();
    let l = find(&snap, "feeds", "mem-0", "limited")
        .memory
        .expect("memory")
        .value;
    assert_eq!(l.limit_bytes, Some(256 * MIB));
    // Allocated bytes plus the runtime of a small static binary (stack, libc, page tables).
    assert!(
        (64 * MIB..64 * MIB + 8 * MIB).contains(&l.working_set_bytes),
        "working set {} not within [64, 72) MiB",
        l.working_set_bytes
    );
    let u = find(&snap, "feeds", "mem-0", "unlimited")
        .memory
        .expect("memory")
        .value;
    assert_eq!(u.limit_bytes, None);
    assert!(
        (16 * MIB..24 * MIB).contains(&u.working_set_bytes),
        "{}",
        u.working_set_bytes
    );

    let text = metrics_text(&snap);
    assert!(text.contains(&format!(
        "nodeguard_container_memory_limit_bytes{{namespace=\"feeds\",pod=\"mem-0\",container=\"limited\"}} {}\n",
        256 * MIB
    )));
    assert!(!text.contains("nodeguard_container_memory_limit_bytes{namespace=\"feeds\",pod=\"mem-0\",container=\"unlimited\"}"));
}

#[test]
fn a_real_oom_kill_is_counted_and_kept_across_a_restart() {
    let Some(mut n) = node() else { return };
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, "feeds", "oom-0");
    let first = n.container(&p, "backend", 0);
    let bystander = n.container(&p, "sidecar", 0);
    n.spawn(&bystander, &["idle"]);
    n.set_memory_limit(&first, 32 * MIB);
    let mut agent = n.agent();
    assert_eq!(
        find(&agent.tick(), "feeds", "oom-0", "backend").oom_kills_total,
        0
    );

    let st = n.run_to_exit(&first, &["oom", &(256 * MIB).to_string()]);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        st.signal(),
        Some(9),
        "the OOM killer ends it with SIGKILL: {st:?}"
    );
    let snap = agent.tick();
    assert_eq!(find(&snap, "feeds", "oom-0", "backend").oom_kills_total, 1);
    assert_eq!(find(&snap, "feeds", "oom-0", "sidecar").oom_kills_total, 0);

    // The runtime removes the cgroup and starts a new container (new id, next log number).
    n.remove_cgroup(&first);
    let second = n.container(&p, "backend", 1);
    n.set_memory_limit(&second, 32 * MIB);
    let snap = agent.tick();
    let b = find(&snap, "feeds", "oom-0", "backend");
    assert_eq!(b.oom_kills_total, 1, "the total survives the new cgroup");
    assert_eq!(b.restarts_total, 1);
    n.run_to_exit(&second, &["oom", &(256 * MIB).to_string()]);
    let snap = agent.tick();
    let b = find(&snap, "feeds", "oom-0", "backend");
    assert_eq!(b.oom_kills_total, 2);
    assert_eq!(b.container_id.as_deref(), Some(second.id.as_str()));
    let text = metrics_text(&snap);
    assert!(text.contains(
        "nodeguard_container_oom_kills_total{namespace=\"feeds\",pod=\"oom-0\",container=\"backend\"} 2\n"
    ), "{text}");
}

#[test]
fn log_lines_are_counted_through_rotation_and_restart() {
    let Some(mut n) = node() else { return };
    let p = n.pod(Driver::Systemd, QosClass::Burstable, "feeds", "chatty-0");
    let c = n.container(&p, "relay", 0);
    let q = n.container(&p, "quiet", 0);
    n.spawn(&c, &["idle"]);
    n.spawn(&q, &["idle"]);
    // Present before the agent starts: counted in the total, not as a burst.
    n.write_log(&c, "stdout", 10);
    n.write_log(&c, "stderr", 4);
    let mut agent = n.agent();
    let snap = agent.tick();
    let r = find(&snap, "feeds", "chatty-0", "relay");
    assert_eq!(
        (r.log_lines_total.stdout, r.log_lines_total.stderr),
        (10, 4)
    );
    assert_eq!(r.log_lines_per_minute.total(), 0);

    n.write_log(&c, "stderr", 600);
    let snap = agent.tick();
    let r = find(&snap, "feeds", "chatty-0", "relay");
    assert_eq!(r.log_lines_total.stderr, 604);
    assert_eq!(r.log_lines_per_minute.stderr, 600);

    // kubelet rotation: rename, a few late lines land in the renamed file, new file starts.
    let log = n.log_path(&c);
    let rotated = log.with_extension("log.20260720-044601");
    std::fs::rename(&log, &rotated).unwrap();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&rotated)
            .unwrap();
        f.write_all(b"2026-07-20T04:46:02.000000000Z stderr F late line\n")
            .unwrap();
    }
    std::fs::File::create(&log).unwrap();
    n.write_log(&c, "stdout", 3);
    let snap = agent.tick();
    let r = find(&snap, "feeds", "chatty-0", "relay");
    assert_eq!(
        (r.log_lines_total.stdout, r.log_lines_total.stderr),
        (13, 605)
    );

    // Restart: new container id, `1.log`.
    n.remove_cgroup(&c);
    let c2 = n.container(&p, "relay", 1);
    n.write_log(&c2, "stderr", 2);
    let snap = agent.tick();
    let r = find(&snap, "feeds", "chatty-0", "relay");
    assert_eq!(r.restarts_total, 1);
    assert_eq!(
        (r.log_lines_total.stdout, r.log_lines_total.stderr),
        (13, 607)
    );
    let quiet = find(&snap, "feeds", "chatty-0", "quiet");
    assert_eq!(quiet.log_lines_total.total(), 0);
    assert_eq!(quiet.restarts_total, 0);
    let text = metrics_text(&snap);
    assert!(text.contains(
        "nodeguard_container_log_lines_total{namespace=\"feeds\",pod=\"chatty-0\",container=\"relay\",stream=\"stderr\"} 607\n"
    ), "{text}");
    assert!(text.contains(
        "nodeguard_container_restarts_total{namespace=\"feeds\",pod=\"chatty-0\",container=\"relay\"} 1\n"
    ), "{text}");
}

/// A sandbox whose image runs something else than `pause`: left out once past runc's init (the
/// pod's only log dir is claimed by its linked container), and not judged during the init.
#[test]
fn a_sandbox_not_running_pause_is_left_out() {
    let Some(mut n) = node() else { return };
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, "feeds", "sbx-0");
    let app = n.container(&p, "app", 0);
    n.spawn(&app, &["idle"]);
    let sandbox = n.container_cgroup(&p, "POD", 0);
    let init = n.spawn(&sandbox, &["--comm", "runc:[2:INIT]", "idle"]);
    let mut agent = n.agent();
    let snap = agent.tick();
    let ids: Vec<String> = snap.workloads.iter().map(|w| w.id.to_string()).collect();
    assert_eq!(ids, ["feeds/sbx-0/app"]);
    n.stop(init);
    n.spawn(&sandbox, &["--comm", "sleep", "idle"]);
    let snap = agent.tick();
    let ids: Vec<String> = snap.workloads.iter().map(|w| w.id.to_string()).collect();
    assert_eq!(ids, ["feeds/sbx-0/app"]);
    assert!(!metrics_text(&snap).contains(&sandbox.id[..12]));
}

#[test]
fn vanished_containers_lose_their_series() {
    let Some(mut n) = node() else { return };
    let p = n.pod(Driver::Cgroupfs, QosClass::BestEffort, "tmp", "job-0");
    let c = n.container_cgroup(&p, "worker", 0);
    // No CRI log tree for this pod (a log dir would keep the identity's series): an unlinked
    // container that runs something else than `pause` is a container, named by its short id.
    std::fs::remove_dir_all(n.pod_log_dir(&p)).expect("no pod log dir");
    let pid = n.spawn(&c, &["idle"]);
    let mut agent = n.agent();
    let snap = agent.tick();
    assert_eq!(snap.workloads.len(), 1);
    let short = format!("container=\"{}\"", &c.id[..12]);
    assert!(metrics_text(&snap).contains(&short));
    n.stop(pid);
    n.remove_cgroup(&c);
    let snap = agent.tick();
    assert!(snap.workloads.is_empty(), "{:?}", snap.workloads);
    assert!(!metrics_text(&snap).contains(&short));
}

#[test]
fn plain_host_cgroups_are_workloads_named_by_unit() {
    let Some(mut n) = node() else { return };
    n.mkdir("system.slice/demo.service/worker");
    n.mkdir("system.slice/idle.service");
    n.mkdir("batch/leaf");
    let unit = common::Container {
        pod: n.pod(Driver::Cgroupfs, QosClass::Guaranteed, "x", "y"),
        name: "demo".into(),
        id: String::new(),
        restart: 0,
        cgroup: "system.slice/demo.service/worker".into(),
    };
    let leaf = common::Container {
        cgroup: "batch/leaf".into(),
        ..unit.clone()
    };
    n.spawn(&unit, &["idle"]);
    n.spawn(&unit, &["idle"]);
    n.spawn(&leaf, &["idle"]);
    let snap = n.agent().tick();
    let units: Vec<(String, u64)> = snap
        .workloads
        .iter()
        .filter(|w| w.kind == nodeguard::model::Kind::Unit)
        .map(|w| {
            (
                w.id.container.clone(),
                w.processes.map(|p| p.value).unwrap_or(99),
            )
        })
        .collect();
    assert_eq!(
        units,
        vec![
            ("demo.service".to_string(), 2),
            ("idle.service".to_string(), 0),
            (format!("{}/batch/leaf", n.name), 1),
        ]
    );
}

#[test]
fn a_held_memory_file_of_a_recreated_cgroup_reads_the_new_one() {
    use nodeguard::sample::memory::MemoryReader;
    let Some(mut n) = node() else { return };
    let v2 = n.layout.memory_is_v2();
    let p = n.pod(Driver::Cgroupfs, QosClass::Burstable, "feeds", "held-0");
    let c = n.container_cgroup(&p, "app", 0);
    n.set_memory_limit(&c, 128 * MIB);
    let rel = n.rel(&c.cgroup);
    let dir = n.layout.primary().join(rel.trim_start_matches('/'));
    let mut r = MemoryReader::new(n.layout.primary(), v2);
    let read = |r: &mut MemoryReader| {
        r.begin_pass();
        // Inode 0: only what the kernel says about the held descriptors tells the cgroups apart.
        let s = r.read(&rel, 0).expect("read");
        r.finish_pass();
        s
    };
    let first = read(&mut r).expect("memory files");
    assert_eq!(first.limit_bytes, Some(128 * MIB));
    assert_eq!(r.stats().held_files, 4);
    // Removed: the held descriptors read ENODEV, which is churn, not an error.
    n.remove_cgroup(&c);
    assert_eq!(read(&mut r), None);
    assert_eq!(r.stats().held_files, 0);
    // Re-created under the same name, without a limit: the new cgroup is read, not the old one.
    let mut r2 = MemoryReader::new(n.layout.primary(), v2);
    std::fs::create_dir(&dir).expect("mkdir");
    assert_eq!(read(&mut r2).expect("memory files").limit_bytes, None);
    n.set_memory_limit(&c, 64 * MIB);
    assert_eq!(read(&mut r2).expect("held").limit_bytes, Some(64 * MIB));
    std::fs::remove_dir(&dir).expect("rmdir");
    std::fs::create_dir(&dir).expect("mkdir again");
    // r2 holds the removed cgroup's files: ENODEV, then the path gives the new one.
    assert_eq!(read(&mut r2).expect("memory files").limit_bytes, None);
    std::fs::remove_dir(&dir).expect("rmdir");
}

/// Discovery keeps the cgroup tree between scans and re-lists only directories whose entries
/// changed (inotify), so a steady scan lists a twelfth of the tree; a container replaced under
/// the same pod (the entry count unchanged), one added with nested cgroups deep in another pod
/// and nested cgroups removed are all seen at the very next scan, as a fresh full walk sees them.
#[test]
fn discovery_sees_exactly_what_changed_between_two_scans_and_lists_little_else() {
    use nodeguard::discover::names::NameSource;
    use nodeguard::discover::{Discovery, DiscoveryConfig, Inventory};
    let Some(mut n) = node() else { return };
    let mut pods = Vec::new();
    let mut ctrs = Vec::new();
    for i in 0..6 {
        let p = n.pod(
            Driver::Systemd,
            QosClass::Burstable,
            "shop",
            &format!("web-{i}"),
        );
        for name in ["app", "sidecar"] {
            ctrs.push(n.container(&p, name, 0));
        }
        pods.push(p);
    }
    // Nested cgroups inside a container (dind, systemd-in-container) belong to it.
    let nested = format!("{}/inner/deeper", ctrs[0].cgroup);
    n.mkdir(&nested);
    let discovery = |n: &common::TestNode| {
        Discovery::new(
            &n.layout,
            "/proc".into(),
            NameSource::new(n.pod_logs(), n.container_logs()),
            DiscoveryConfig {
                scopes: vec![n.rel("")],
                host_workloads: false,
            },
        )
    };
    let shape = |inv: &Inventory| {
        let mut v: Vec<(String, String, Vec<String>)> = inv
            .workloads
            .iter()
            .map(|w| (w.id.to_string(), w.cgroup.clone(), w.subtree.clone()))
            .collect();
        v.sort();
        v
    };
    let mut d = discovery(&n);
    let first = d.scan().expect("scan");
    assert_eq!(first.workloads.len(), 12);
    for _ in 0..2 {
        assert_eq!(shape(&d.scan().expect("scan")), shape(&first));
    }
    let steady = d.tree_stats();
    assert!(
        steady.unwatched == 0 && steady.held == steady.dirs,
        "{steady:?}"
    );
    assert!(steady.listed * 4 < steady.dirs, "{steady:?}");

    // Between two scans: pod 1's sidecar restarts (old cgroup removed, new id in the same pod),
    // pod 2 gets a container with a nested cgroup, and ctrs[0]'s nested cgroups go.
    let old = ctrs[3].clone();
    n.remove_cgroup(&old);
    let link = n
        .container_logs()
        .join(format!("web-1_shop_sidecar-{}.log", old.id));
    std::fs::remove_file(link).expect("old link");
    let restarted = n.container(&pods[1], "sidecar", 1);
    let added = n.container(&pods[2], "debug", 0);
    n.mkdir(&format!("{}/inner", added.cgroup));
    for dir in [nested.clone(), format!("{}/inner", ctrs[0].cgroup)] {
        let v1 = ["memory", "pids", "freezer"].map(|c| n.layout.v1_controller(c));
        let v2 = n.layout.unified().map(std::path::Path::to_path_buf);
        for h in v1.into_iter().chain([v2]).flatten() {
            let _ = std::fs::remove_dir(h.join(n.rel(&dir).trim_start_matches('/')));
        }
    }
    let inv = d.scan().expect("scan");
    assert_eq!(
        shape(&inv),
        shape(&discovery(&n).scan().expect("fresh scan"))
    );
    let cgroups: Vec<&str> = inv.workloads.iter().map(|w| w.cgroup.as_str()).collect();
    assert!(cgroups.contains(&n.rel(&restarted.cgroup).as_str()));
    assert!(!cgroups.contains(&n.rel(&old.cgroup).as_str()));
    let a = inv
        .workloads
        .iter()
        .find(|w| w.cgroup == n.rel(&added.cgroup))
        .expect("added container");
    assert_eq!(
        a.subtree,
        vec![
            n.rel(&added.cgroup),
            n.rel(&format!("{}/inner", added.cgroup))
        ]
    );
    let c0 = inv
        .workloads
        .iter()
        .find(|w| w.cgroup == n.rel(&ctrs[0].cgroup))
        .expect("container 0");
    assert_eq!(
        c0.subtree,
        vec![n.rel(&ctrs[0].cgroup)],
        "nested cgroups gone"
    );
    assert_eq!(inv.workloads.len(), 13);
    let s = d.tree_stats();
    assert!(s.listed < steady.listed + 10, "{s:?} after {steady:?}");
}
