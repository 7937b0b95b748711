//! The DaemonSet as shipped, run as the kubelet would run it, on the containerd tier: the pod
//! template rendered by `kubectl kustomize` (base, then base + `actions`) and translated into CRI
//! calls (tests/common/podspec.rs) on the suite's own containerd, the image imported from
//! `target/oci/nodeguard-oci.tar` (scripts/image), the probes polled as declared. The in-pod
//! agent must measure the suite's other CRI pods exactly as the kernel's files and the host-run
//! agent do, freeze a workload when enforcement is on, let a `nodeguard release` undo it, and
//! thaw it when its own container is stopped.
//!
//! Test-only substitutions (docs/testing.md, "The shipped pod spec"): containerd (and so the
//! node network of a hostNetwork pod) runs in a network namespace the test made, whose "node
//! address" is 198.18.255.1 on a dummy link; the hostPaths `/var/log/pods`,
//! `/var/log/containers` and `/var/lib/nodeguard` are the suite's own directories,
//! `/sys/fs/cgroup` is the real one; the container's args gain `--set
//! discovery.scopes=[<suite parent>]` and, to act, `--set guard.dry_run=false` and one rule.

mod common;
#[path = "common/cri.rs"]
mod cri;
#[path = "common/podspec.rs"]
mod podspec;

use common::agent::{parse_openmetrics, Checks, Sample};
use common::snap::metrics_text;
use common::{Container, TestNode};
use cri::{Containerd, CriPod, Spec, PAUSE_IMAGE};
use nodeguard::agent::Agent;
use nodeguard::clock::SystemClock;
use nodeguard::config::live;
use nodeguard::config::overrides::{hashed_text, Override};
use nodeguard::discover::kubelet::QosClass;
use podspec::{Context, ProbeSpec, Rendered, Substitutions, Translated};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// The node's address inside the test's network namespace (benchmarking range, RFC 2544).
const NODE_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 255, 1);
const NODE_NAME: &str = "ngds-node";
/// Every wait of this test is bounded by this.
const WAIT: Duration = Duration::from_secs(90);

/// A network namespace of our own (`ip netns add`), deleted on drop.
struct NetNs {
    name: String,
}

impl NetNs {
    fn new(name: String) -> NetNs {
        let ns = NetNs { name };
        ip(&["netns", "add", &ns.name]);
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        // The node's address on its loopback (no dummy link: the module may be missing).
        ip(&[
            "-n",
            &ns.name,
            "addr",
            "add",
            &format!("{NODE_IP}/32"),
            "dev",
            "lo",
        ]);
        ns
    }

    fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        match Command::new("ip")
            .args(["netns", "del", &self.name])
            .status()
        {
            Ok(st) if st.success() => {}
            other => eprintln!("cleanup: ip netns del {}: {other:?}", self.name),
        }
    }
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("spawn ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

// === the kubelet's prober ===

/// The kubelet's probe workers for one container: each probe first after its
/// `initialDelaySeconds`, then every `periodSeconds`, each GET bounded by `timeoutSeconds`;
/// consecutive results counted against the thresholds. Driven by `step` from the test's waits.
struct Prober {
    netns: PathBuf,
    started: Instant,
    probes: [(ProbeSpec, Option<Instant>, u32, u32); 2],
    /// Readiness as the kubelet would report it.
    ready: bool,
    ready_at: Option<Duration>,
    /// Liveness failures that reached the threshold (the kubelet would have killed it).
    liveness_kills: u32,
    results: [(u32, u32); 2],
}

impl Prober {
    fn new(netns: PathBuf, t: &Translated) -> Prober {
        Prober {
            netns,
            started: Instant::now(),
            probes: [
                (t.liveness.clone(), None, 0, 0),
                (t.readiness.clone(), None, 0, 0),
            ],
            ready: false,
            ready_at: None,
            liveness_kills: 0,
            results: [(0, 0); 2],
        }
    }

    /// Runs the probes that are due.
    fn step(&mut self) {
        let now = Instant::now();
        for i in 0..2 {
            let (spec, last, succ, fail) = &mut self.probes[i];
            let due = match last {
                None => now >= self.started + spec.initial_delay,
                Some(t) => now >= *t + spec.period,
            };
            if !due {
                continue;
            }
            *last = Some(now);
            let addr = SocketAddr::from((NODE_IP, spec.port));
            let (r, _) = cri::http_probe_while(&self.netns, addr, &spec.path, spec.timeout, || {});
            if r == cri::ProbeResult::Success {
                *succ += 1;
                *fail = 0;
                self.results[i].0 += 1;
            } else if r.is_failure() {
                *fail += 1;
                *succ = 0;
                self.results[i].1 += 1;
                eprintln!(
                    "probe {} {}: {r:?}",
                    ["liveness", "readiness"][i],
                    spec.path
                );
            }
            if i == 0 && *fail >= spec.failure_threshold {
                self.liveness_kills += 1;
                *fail = 0;
            }
            if i == 1 {
                if *succ >= spec.success_threshold && !self.ready {
                    self.ready = true;
                    self.ready_at = Some(self.started.elapsed());
                } else if *fail >= spec.failure_threshold {
                    self.ready = false;
                }
            }
        }
    }

    /// Probes for `d`.
    fn wait(&mut self, d: Duration) {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.step();
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Probes until `cond` holds (bounded by `WAIT`); whether it did.
    fn until(&mut self, mut cond: impl FnMut(&Prober) -> bool) -> bool {
        let deadline = Instant::now() + WAIT;
        loop {
            self.step();
            if cond(self) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

// === the agent pod ===

/// One nodeguard pod run from a render: its sandbox, container, and the cgroup of the container.
struct AgentPod {
    pod: CriPod,
    id: String,
    t: Translated,
    prober: Prober,
}

impl AgentPod {
    fn container(&self) -> Container {
        Container {
            pod: self.pod.pod.clone(),
            name: self.t.container_name.clone(),
            id: self.id.clone(),
            restart: 0,
            cgroup: format!("{}/{}", self.pod.pod.cgroup, self.id),
        }
    }

    fn scrape(&self, path: &str) -> Option<(u16, String)> {
        podspec::get_in(
            &self.prober.netns,
            SocketAddr::from((NODE_IP, self.t.readiness.port)),
            path,
        )
    }
}

/// What every nodeguard pod of the test shares: the node's network namespace, the imported
/// image's id, the hostPath substitutions.
struct Stage<'a> {
    netns: &'a Path,
    image_ref: &'a str,
    subst: &'a Substitutions,
}

fn run_agent_pod(
    ctd: &mut Containerd,
    n: &mut TestNode,
    stage: &Stage,
    r: &Rendered,
    pod_name: &str,
    extra_args: &[String],
) -> AgentPod {
    let (netns, image_ref, subst) = (stage.netns, stage.image_ref, stage.subst);
    let ds = r.daemonset();
    let ns = ds["metadata"]["namespace"].as_str().expect("namespace");
    let qos = podspec::qos(&ds["spec"]["template"]["spec"]);
    assert_eq!(qos, QosClass::Burstable, "the shipped pod's QoS class");
    let pod = n.pod(common::Driver::Cgroupfs, qos, ns, pod_name);
    // The pod cgroup's own limits, set by the kubelet before RunPodSandbox (v1 hierarchies; on a
    // pure v2 node runc's conversion of the container's values is checked instead).
    for (ctl, file, v) in podspec::pod_cgroup_values(&ds["spec"]["template"]["spec"]) {
        if let Some(h) = n.layout.v1_controller(ctl) {
            let f = h
                .join(n.rel(&pod.cgroup).trim_start_matches('/'))
                .join(file);
            std::fs::write(&f, v.to_string()).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        }
    }
    let pod_dir = n.dir.path().join("kubelet/pods").join(&pod.uid);
    let ctx = Context {
        node_name: NODE_NAME,
        pod_name,
        uid: &pod.uid,
        cgroup_parent: n.rel(&pod.cgroup),
        log_directory: n.pod_log_dir(&pod),
        pod_dir,
        image_ref,
        subst,
        extra_args,
    };
    let t = podspec::translate(r, &ctx);
    for c in &t.host_path_checks {
        eprintln!("hostPath {c}");
    }
    let id = ctd.run_sandbox(&t.sandbox);
    let cri_pod = CriPod {
        id: id.clone(),
        pod: pod.clone(),
        config: t.sandbox.clone(),
    };
    std::fs::create_dir_all(n.pod_log_dir(&pod).join(&t.container_name))
        .expect("container log dir");
    let cid = ctd.create_and_start(&id, t.container.clone(), &t.sandbox);
    // The kubelet's /var/log/containers link, made right after CreateContainer.
    let link = n.container_logs().join(common::kubelet::container_log_link(
        ns,
        pod_name,
        &t.container_name,
        &cid,
    ));
    std::os::unix::fs::symlink(
        n.pod_log_dir(&pod).join(&t.container_name).join("0.log"),
        link,
    )
    .expect("container log link");
    let prober = Prober::new(netns.to_path_buf(), &t);
    AgentPod {
        pod: cri_pod,
        id: cid,
        t,
        prober,
    }
}

// === kernel truth ===

fn status_field(pid: u32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{key}:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default()
}

fn cap_mask(names: &[&str]) -> u64 {
    names
        .iter()
        .map(|n| match *n {
            "DAC_READ_SEARCH" => 2,
            "KILL" => 5,
            "NET_ADMIN" => 12,
            "SYS_PTRACE" => 19,
            "SYS_ADMIN" => 21,
            "BPF" => 39,
            other => panic!("capability {other}"),
        })
        .fold(0u64, |m, b| m | (1 << b))
}

/// The mount options (`ro`/`rw`) of `point` as the process `pid` sees it.
fn mount_opts(pid: u32, point: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .ok()?
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(point))
        .and_then(|l| {
            l.split(' ')
                .nth(5)
                .map(|o| o.split(',').next().unwrap_or("").to_owned())
        })
}

fn read_trim(p: &Path) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("({}: {e})", p.display()))
}

/// `(working set, limit)` from the kernel's files, as the agent computes them.
fn kernel_memory(n: &TestNode, c: &Container) -> u64 {
    let dir = n
        .layout
        .primary()
        .join(n.rel(&c.cgroup).trim_start_matches('/'));
    let num = |f: &str| read_trim(&dir.join(f)).parse::<u64>().unwrap_or(u64::MAX);
    let (usage, key) = if n.layout.memory_is_v2() {
        (num("memory.current"), "inactive_file ")
    } else {
        (num("memory.usage_in_bytes"), "total_inactive_file ")
    };
    let inactive = std::fs::read_to_string(dir.join("memory.stat"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    usage.saturating_sub(inactive)
}

fn zombies_of(parent: u32) -> u64 {
    let mut k = 0;
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.first() == Some(&"Z") && f.get(1) == Some(&parent.to_string().as_str()) {
            k += 1;
        }
    }
    k
}

/// Full (`F`) CRI lines of a container log by stream.
fn log_lines(path: &Path) -> (u64, u64) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = (0, 0);
    for l in text.lines() {
        let mut it = l.splitn(4, ' ');
        match (it.nth(1), it.next()) {
            (Some("stdout"), Some("F")) => out.0 += 1,
            (Some("stderr"), Some("F")) => out.1 += 1,
            _ => {}
        }
    }
    out
}

/// A compared figure: series name, container, an extra label, the kernel's (or file's) value.
type Row<'a> = (&'a str, &'a str, Option<(&'a str, &'a str)>, f64);

/// The value of the series `name` for container `c` of shop/cart-0 (and `extra` label).
fn value(samples: &[Sample], name: &str, c: &str, extra: Option<(&str, &str)>) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && s.label("namespace") == Some("shop")
                && s.label("pod") == Some("cart-0")
                && s.label("container") == Some(c)
                && extra.is_none_or(|(k, v)| s.label(k) == Some(v))
        })
        .map(|s| s.value)
}

/// The value of the pod-level series `name` of shop/`pod`.
fn pod_value(samples: &[Sample], name: &str, pod: &str) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name && s.label("namespace") == Some("shop") && s.label("pod") == Some(pod)
        })
        .map(|s| s.value)
}

/// One scrape of the agent behind `p` (on the node's address): `None` if it failed, else the
/// series' value if it is there.
fn scrape_series(
    p: &Prober,
    name: &str,
    c: &str,
    extra: Option<(&str, &str)>,
) -> Option<Option<f64>> {
    let port = p.probes[1].0.port;
    podspec::get_in(&p.netns, SocketAddr::from((NODE_IP, port)), "/metrics")
        .filter(|(code, _)| *code == 200)
        .and_then(|(_, b)| parse_openmetrics(&b).ok())
        .map(|m| value(&m, name, c, extra))
}

fn series(p: &Prober, name: &str, c: &str, extra: Option<(&str, &str)>) -> Option<f64> {
    scrape_series(p, name, c, extra).flatten()
}

/// The ConfigMap's `nodeguard.yaml` in a render.
fn config_text(r: &Rendered) -> String {
    r.objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .and_then(|o| o["data"]["nodeguard.yaml"].as_str())
        .expect("nodeguard.yaml in the ConfigMap")
        .to_owned()
}

fn parse(text: &str) -> Vec<Sample> {
    parse_openmetrics(text).unwrap_or_else(|e| panic!("/metrics: {e}\n{text}"))
}

#[test]
fn daemonset_as_shipped() {
    let t0 = Instant::now();
    if let Some(why) = cri::unavailable() {
        common::cannot_run(&why);
        return;
    }
    if !which("kubectl") {
        common::cannot_run("kubectl is not installed (it renders the kustomize base)");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Where scripts/image writes it: cargo's target directory (relative to the package root).
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or(repo.join("target"), |t| repo.join(t));
    let archive = target.join("oci/nodeguard-oci.tar");
    if !archive.is_file() {
        common::cannot_run(&format!(
            "{} is missing: build it with scripts/image",
            archive.display()
        ));
        return;
    }
    let Some(mut n) = common::node() else { return };
    // Dropped in reverse: containerd first, then the namespace, then the node's cgroups.
    let netns = NetNs::new(format!("ngds-{}", std::process::id()));
    let mut ctd = Containerd::start_in(&n, PAUSE_IMAGE, Some(netns.path()));
    let mut ck = Checks::new("daemonset_as_shipped");

    // === the render and the image ===
    let work = n.dir.path().to_path_buf();
    let base = podspec::render(repo, &[], &work);
    let acting = podspec::render(repo, &["actions"], &work);
    let image = base.daemonset()["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .expect("image")
        .to_owned();
    ck.check(
        "IfNotPresent: the image is not on the node before the import (nothing is pulled)",
        ctd.image_status(&image).is_none(),
        &image,
    );
    let t_import = Instant::now();
    let image_ref = ctd.import_archive(&archive, &image);
    eprintln!(
        "image {image} ({image_ref}) imported in {:.1} s",
        t_import.elapsed().as_secs_f64()
    );

    // === the workloads: a pod the agent must measure ===
    let shop = ctd.run_pod(&mut n, "shop", "cart-0");
    let shop_pid = ctd.sandbox_pid(&n, &shop);
    cri::enable_conntrack(shop_pid);
    let spec = |args: &'static [&'static str]| Spec {
        args,
        ..Default::default()
    };
    let api = ctd.run_container(
        &n,
        &shop,
        "api",
        0,
        Spec {
            args: &["--until-term", "alloc", "67108864"],
            memory_limit: Some(256 * MIB),
            ..Default::default()
        },
    );
    let reaper = ctd.run_container(
        &n,
        &shop,
        "reaper",
        0,
        spec(&["--until-term", "--comm", "py (supervisor)", "zombies", "5"]),
    );
    let server = ctd.run_container(
        &n,
        &shop,
        "server",
        0,
        spec(&["--until-term", "listen", "127.0.0.1:7000"]),
    );
    ctd.wait_log(&server, "ready ");
    let client = ctd.run_container(
        &n,
        &shop,
        "client",
        0,
        spec(&["--until-term", "connect", "127.0.0.1:7000", "3", "2"]),
    );
    let chatty = ctd.run_container(
        &n,
        &shop,
        "chatty",
        0,
        spec(&["--until-term", "lines", "10", "4", "100"]),
    );
    for c in [&api, &reaper, &client, &chatty] {
        ctd.wait_log(c, "ready ");
    }

    let subst = Substitutions {
        served: vec![
            ("/var/log/pods".into(), n.pod_logs()),
            ("/var/log/containers".into(), n.container_logs()),
            (
                "/var/lib/nodeguard".into(),
                n.state_file().parent().expect("state dir").to_path_buf(),
            ),
        ],
        // The kmsg component's /dev/kmsg is the host's, read-only: reading the kernel log
        // changes nothing on the host.
        real: vec!["/sys/fs/cgroup".into(), "/dev/kmsg".into()],
    };
    let scope = format!("--set=discovery.scopes=[\"{}\"]", n.rel(""));
    let netns_path = netns.path();
    let stage = Stage {
        netns: &netns_path,
        image_ref: &image_ref,
        subst: &subst,
    };

    // === base: measuring ===
    let t_pod = Instant::now();
    let mut ag = run_agent_pod(
        &mut ctd,
        &mut n,
        &stage,
        &base,
        "nodeguard-base",
        std::slice::from_ref(&scope),
    );
    let ready = ag.prober.until(|p| p.ready);
    let st = ctd.status_of(&ag.id);
    ck.check(
        "base pod: ready under its own readiness probe",
        ready,
        format!(
            "ready after {:?} (probes ok/failed: liveness {:?}, readiness {:?}); container state {} reason {:?} exit {}; log tail: {}",
            ag.prober.ready_at,
            ag.prober.results[0],
            ag.prober.results[1],
            st.state,
            st.reason,
            st.exit_code,
            std::fs::read_to_string(n.pod_log_dir(&ag.pod.pod).join("nodeguard/0.log"))
                .unwrap_or_default()
                .lines()
                .rev()
                .take(5)
                .collect::<Vec<_>>()
                .join(" | ")
        ),
    );
    eprintln!(
        "base pod ready {:.1} s after RunPodSandbox",
        t_pod.elapsed().as_secs_f64()
    );
    let agent_cg = ag.container();
    let pids = n.procs(&agent_cg);
    let pid = pids.first().copied().unwrap_or(0);
    ck.check(
        "the agent is the container's one process",
        pids.len() == 1,
        format!("{pids:?}"),
    );

    // What the kernel applied from the pod spec.
    let want_caps = cap_mask(&["SYS_PTRACE", "DAC_READ_SEARCH", "NET_ADMIN"]);
    let eff = u64::from_str_radix(&status_field(pid, "CapEff"), 16).unwrap_or(u64::MAX);
    let bnd = u64::from_str_radix(&status_field(pid, "CapBnd"), 16).unwrap_or(u64::MAX);
    ck.check(
        "capabilities: effective and bounding sets are exactly SYS_PTRACE, DAC_READ_SEARCH, NET_ADMIN",
        eff == want_caps && bnd == want_caps,
        format!("CapEff {eff:#x} CapBnd {bnd:#x}, want {want_caps:#x}"),
    );
    ck.check(
        "allowPrivilegeEscalation false: NoNewPrivs 1; seccomp RuntimeDefault: filter mode 2; uid 0",
        status_field(pid, "NoNewPrivs") == "1"
            && status_field(pid, "Seccomp") == "2"
            && status_field(pid, "Uid").split_whitespace().next() == Some("0"),
        format!(
            "NoNewPrivs {} Seccomp {} Uid {}",
            status_field(pid, "NoNewPrivs"),
            status_field(pid, "Seccomp"),
            status_field(pid, "Uid")
        ),
    );
    let host_ns = |k: &str| {
        std::fs::read_link(format!("/proc/{pid}/ns/{k}")).ok()
            == std::fs::read_link(format!("/proc/self/ns/{k}")).ok()
    };
    let pid_net = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
    let netns_ino = std::fs::metadata(netns.path()).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.ino()
    });
    ck.check(
        "hostPID: the host's pid namespace; hostNetwork: the node's (the test's) network namespace",
        host_ns("pid")
            && pid_net.as_ref().is_some_and(|l| {
                netns_ino
                    .as_ref()
                    .is_ok_and(|i| l.to_string_lossy() == format!("net:[{i}]"))
            }),
        format!(
            "pid ns shared {}, net {pid_net:?} vs netns inode {netns_ino:?}",
            host_ns("pid")
        ),
    );
    let mounts: Vec<(&str, Option<String>)> = [
        "/",
        "/etc/nodeguard",
        "/host/sys/fs/cgroup",
        "/host/sys/fs/cgroup/freezer",
        "/host/sys/fs/cgroup/unified",
        "/var/log/pods",
        "/var/log/containers",
        "/var/lib/nodeguard",
    ]
    .into_iter()
    .map(|m| (m, mount_opts(pid, m)))
    .collect();
    eprintln!("base pod mounts: {mounts:?}");
    let opt = |m: &str| {
        mounts
            .iter()
            .find(|(p, _)| *p == m)
            .and_then(|(_, o)| o.clone())
    };
    ck.check(
        "readOnlyRootFilesystem and the read-only volumes are ro; the state volume rw",
        opt("/").as_deref() == Some("ro")
            && opt("/etc/nodeguard").as_deref() == Some("ro")
            && opt("/host/sys/fs/cgroup").as_deref() == Some("ro")
            && opt("/var/log/pods").as_deref() == Some("ro")
            && opt("/var/log/containers").as_deref() == Some("ro")
            && opt("/var/lib/nodeguard").as_deref() == Some("rw"),
        format!("{mounts:?}"),
    );
    // A limit of the pod spec, not of the agent (docs/deploy.md, "Privileges"): containerd 1.6
    // and runc 1.1 remount only the top of an rbind read-only, so on a v1 or hybrid node the
    // controller mounts below /host/sys/fs/cgroup stay writable. If a runtime ever makes it
    // recursive this check fails, and the docs change with it.
    let v1_mounts = n.layout.v1_controller("freezer").is_some();
    ck.check(
        "readOnly is not recursive: on a v1/hybrid node the controller mounts below are rw",
        !v1_mounts || opt("/host/sys/fs/cgroup/freezer").as_deref() == Some("rw"),
        format!(
            "v1 controllers {v1_mounts}, freezer {:?}",
            opt("/host/sys/fs/cgroup/freezer")
        ),
    );
    // Kernel values of the container's cgroup against what the kubelet computes.
    let cpu_dir = n
        .layout
        .v1_controller("cpu")
        .map(|h| h.join(n.rel(&agent_cg.cgroup).trim_start_matches('/')));
    let mem_dir = n
        .layout
        .primary()
        .join(n.rel(&agent_cg.cgroup).trim_start_matches('/'));
    let (cpu_seen, mem_seen) = match &cpu_dir {
        Some(d) => (
            format!(
                "{} {} {}",
                read_trim(&d.join("cpu.shares")),
                read_trim(&d.join("cpu.cfs_quota_us")),
                read_trim(&d.join("cpu.cfs_period_us"))
            ),
            read_trim(&mem_dir.join(if n.layout.memory_is_v2() {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            })),
        ),
        None => (
            read_trim(&mem_dir.join("cpu.max")),
            read_trim(&mem_dir.join("memory.max")),
        ),
    };
    let cpu_want = if cpu_dir.is_some() {
        "51 50000 100000"
    } else {
        "50000 100000"
    };
    ck.check(
        "resources: cpu 50m request -> shares 51, 500m limit -> quota 50000 per 100000 us, memory limit 128Mi",
        cpu_seen == cpu_want && mem_seen == (128 * MIB).to_string(),
        format!("cpu {cpu_seen:?} memory {mem_seen:?}"),
    );
    let own_adj = read_trim(Path::new("/proc/self/oom_score_adj"))
        .parse::<i64>()
        .unwrap_or(0);
    let adj = read_trim(Path::new(&format!("/proc/{pid}/oom_score_adj")));
    ck.check(
        "system-node-critical: oom_score_adj -997, raised to containerd's own by restrict_oom_score_adj",
        adj == own_adj.max(-997).to_string(),
        format!("{adj} (containerd's {own_adj})"),
    );
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let env: Vec<String> = environ
        .split(|b| *b == 0)
        .map(|e| String::from_utf8_lossy(e).into_owned())
        .collect();
    ck.check(
        "downward API: NODE_NAME and POD_NAMESPACE",
        env.contains(&format!("NODE_NAME={NODE_NAME}"))
            && env.contains(&"POD_NAMESPACE=nodeguard".to_owned()),
        format!("{env:?}"),
    );

    // === figures: the in-pod agent against the kernel's files and the host-run agent ===
    let extra = "samplers:\n  sockets:\n    enabled: true\n";
    let mut host = Agent::new(n.config(extra), Arc::new(SystemClock)).expect("host agent");
    let reaper_cg = cri::cg(&shop, &reaper);
    let reaper_pid = n.procs(&reaper_cg).first().copied().unwrap_or(0);
    let api_cg = cri::cg(&shop, &api);
    // The in-pod agent ticks every 5 s: a scrape whose kernel reads before and after agree.
    let (mut pod_m, mut mem_k, mut tries) = (Vec::new(), 0, 0);
    while tries < 8 {
        tries += 1;
        let before = kernel_memory(&n, &api_cg);
        // One interval (5 s) later the agent has ticked after `before` was read.
        ag.prober.wait(Duration::from_millis(5200));
        let text = ag.scrape("/metrics").map(|(_, b)| b).unwrap_or_default();
        let after = kernel_memory(&n, &api_cg);
        pod_m = parse(&text);
        mem_k = after;
        if before == after && value(&pod_m, "nodeguard_container_zombies", "reaper", None).is_some()
        {
            break;
        }
    }
    let host_snap = host.tick();
    let host_m = parse(&metrics_text(&host_snap));
    let (chatty_out, chatty_err) = log_lines(&chatty.log);
    let zk = zombies_of(reaper_pid) as f64;
    let rows: Vec<Row> = vec![
        ("nodeguard_container_zombies", "reaper", None, zk),
        (
            "nodeguard_container_processes",
            "reaper",
            None,
            n.procs(&reaper_cg).len() as f64,
        ),
        (
            "nodeguard_container_pids",
            "reaper",
            None,
            n.pids_current(&reaper_cg) as f64,
        ),
        (
            "nodeguard_container_sockets",
            "client",
            Some(("protocol", "tcp")),
            3.0,
        ),
        (
            "nodeguard_container_sockets",
            "client",
            Some(("protocol", "udp")),
            2.0,
        ),
        (
            "nodeguard_container_sockets",
            "server",
            Some(("protocol", "tcp")),
            4.0,
        ),
        (
            "nodeguard_container_sockets",
            "server",
            Some(("protocol", "udp")),
            1.0,
        ),
        (
            "nodeguard_container_log_lines_total",
            "chatty",
            Some(("stream", "stdout")),
            chatty_out as f64,
        ),
        (
            "nodeguard_container_log_lines_total",
            "chatty",
            Some(("stream", "stderr")),
            chatty_err as f64,
        ),
        (
            "nodeguard_container_memory_limit_bytes",
            "api",
            None,
            (256 * MIB) as f64,
        ),
        (
            "nodeguard_container_memory_working_set_bytes",
            "api",
            None,
            mem_k as f64,
        ),
    ];
    let mut table = Vec::new();
    for (name, c, extra, kernel) in &rows {
        let in_pod = value(&pod_m, name, c, *extra);
        let on_host = value(&host_m, name, c, *extra);
        let label = format!(
            "{name}{{container={c}{}}}",
            extra.map(|(k, v)| format!(",{k}={v}")).unwrap_or_default()
        );
        table.push(format!(
            "{label}: kernel {kernel}, in-pod {in_pod:?}, host-run {on_host:?}"
        ));
        ck.check(
            &format!("in-pod {label} = kernel/files = host-run agent"),
            in_pod == Some(*kernel) && on_host == Some(*kernel),
            format!("kernel {kernel}, in-pod {in_pod:?}, host-run {on_host:?}"),
        );
    }
    // The pod's own conntrack table: 3 TCP + 2 UDP flows, read through /proc/<pid>/ns/net.
    let ct: f64 = cri::nsenter(shop_pid, &["conntrack", "-C"])
        .trim()
        .parse()
        .unwrap_or(-1.0);
    let pod_ct = |m: &[Sample]| {
        m.iter()
            .find(|s| {
                s.name == "nodeguard_pod_conntrack_entries"
                    && s.label("pod") == Some("cart-0")
                    && s.label("scope") == Some("pod_netns")
            })
            .map(|s| s.value)
    };
    table.push(format!(
        "nodeguard_pod_conntrack_entries{{pod=cart-0,scope=pod_netns}}: conntrack -C {ct}, in-pod {:?}, host-run {:?}",
        pod_ct(&pod_m),
        pod_ct(&host_m)
    ));
    ck.check(
        "in-pod pod conntrack entries = conntrack -C in the pod's netns = host-run agent = 5",
        ct == 5.0 && pod_ct(&pod_m) == Some(ct) && pod_ct(&host_m) == Some(ct),
        format!(
            "conntrack -C {ct}, in-pod {:?}, host-run {:?}",
            pod_ct(&pod_m),
            pod_ct(&host_m)
        ),
    );
    eprintln!("figures compared:\n  {}", table.join("\n  "));
    ck.check(
        "the agent's own pod is seen (namespace nodeguard) and nothing outside the suite's parent",
        pod_m
            .iter()
            .filter(|s| s.name == "nodeguard_container_processes")
            .all(|s| matches!(s.label("namespace"), Some("shop") | Some("nodeguard"))),
        format!(
            "{:?}",
            pod_m
                .iter()
                .filter(|s| s.name == "nodeguard_container_processes")
                .map(|s| format!(
                    "{:?}/{:?}/{:?}",
                    s.label("namespace"),
                    s.label("pod"),
                    s.label("container")
                ))
                .collect::<Vec<_>>()
        ),
    );
    let layout = |m: &[Sample]| {
        m.iter()
            .find(|s| s.name == "nodeguard_build_info")
            .and_then(|s| s.label("cgroup_layout").map(str::to_owned))
    };
    ck.check(
        "the in-pod agent finds the same cgroup layout through /host/sys/fs/cgroup",
        layout(&pod_m).is_some() && layout(&pod_m) == layout(&host_m),
        format!(
            "in-pod {:?}, host-run {:?}",
            layout(&pod_m),
            layout(&host_m)
        ),
    );
    let unavailable: Vec<String> = pod_m
        .iter()
        .filter(|s| s.name == "nodeguard_feature_available" && s.value == 0.0)
        .map(|s| s.label("feature").unwrap_or("?").to_owned())
        .collect();
    eprintln!("base pod: features unavailable: {unavailable:?}");
    let errors: Vec<String> = pod_m
        .iter()
        .filter(|s| s.name == "nodeguard_sampler_errors_total" && s.value > 0.0)
        .map(|s| format!("{:?}/{:?} {}", s.label("sampler"), s.label("kind"), s.value))
        .collect();
    ck.check(
        "base pod: no sampler error",
        errors.is_empty(),
        format!("{errors:?}"),
    );
    let agent_log = n.pod_log_dir(&ag.pod.pod).join("nodeguard/0.log");
    let warned: Vec<String> = std::fs::read_to_string(&agent_log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .map(str::to_owned)
        .collect();
    ck.check(
        "base pod: the agent logged no warning or error (its CRI log)",
        warned.is_empty(),
        format!("{warned:#?}"),
    );
    // The config in force is the projected ConfigMap (read through the `..data` links) plus the
    // scope override; an edit in place is the kubelet's `..data` swap, reloaded live.
    let cm_text = config_text(&base);
    let ov = Override::parse(scope.trim_start_matches("--set=")).expect("scope override");
    let hash_of = |text: &str| live::hash(&hashed_text(text, std::slice::from_ref(&ov)));
    let info_of = |p: &Prober| {
        let port = p.probes[1].0.port;
        podspec::get_in(&p.netns, SocketAddr::from((NODE_IP, port)), "/metrics")
            .and_then(|(_, b)| parse_openmetrics(&b).ok())
            .and_then(|m| {
                m.iter()
                    .find(|s| s.name == "nodeguard_config_info")
                    .and_then(|s| s.label("hash").map(str::to_owned))
            })
    };
    let first = info_of(&ag.prober);
    ck.check(
        "config in force: the ConfigMap's nodeguard.yaml + the scope override (nodeguard_config_info hash)",
        first.as_deref() == Some(hash_of(&cm_text).as_str()),
        format!("in-pod {first:?}, want {}", hash_of(&cm_text)),
    );
    let edited = format!("{cm_text}\n# edited in place (kubectl edit)\n");
    let cm_dir = n
        .dir
        .path()
        .join("kubelet/pods")
        .join(&ag.pod.pod.uid)
        .join("volumes/kubernetes.io~configmap/config");
    let t_edit = Instant::now();
    podspec::update_config_map(&cm_dir, "nodeguard.yaml", &edited);
    let mut now_hash = None;
    let reloaded = ag.prober.until(|p| {
        now_hash = info_of(p);
        now_hash.as_deref() == Some(hash_of(&edited).as_str())
    });
    ck.check(
        "ConfigMap edited in place (the kubelet's ..data swap): reloaded live in the pod",
        reloaded,
        format!(
            "{now_hash:?} {:.1} s after the swap, want {}",
            t_edit.elapsed().as_secs_f64(),
            hash_of(&edited)
        ),
    );
    ck.check(
        "base pod: live all along (no liveness kill)",
        ag.prober.liveness_kills == 0 && ag.prober.results[0].0 > 0,
        format!("liveness ok/failed {:?}", ag.prober.results[0]),
    );
    // The agent's own cost in its pod, against the requests the DaemonSet declares (32Mi, 50m).
    let ws = kernel_memory(&n, &agent_cg);
    let cpu_ns = n
        .layout
        .v1_controller("cpuacct")
        .map(|h| {
            read_trim(
                &h.join(n.rel(&agent_cg.cgroup).trim_start_matches('/'))
                    .join("cpuacct.usage"),
            )
        })
        .and_then(|v| v.parse::<u64>().ok());
    let alive = t_pod.elapsed();
    eprintln!(
        "base pod: agent working set {ws} bytes, CPU {cpu_ns:?} ns over {:.1} s",
        alive.as_secs_f64()
    );
    ck.check(
        "base pod: the agent's working set is below its 32 MiB request",
        ws > 0 && ws < 32 * MIB,
        format!("{ws} bytes"),
    );
    ctd.stop_id(&ag.id, ag.t.grace);
    let st = ctd.status_of(&ag.id);
    ck.check(
        "base pod: StopContainer ends it with exit 0",
        st.exit_code == 0,
        format!("exit {} reason {:?}", st.exit_code, st.reason),
    );
    ctd.remove_sandbox(&ag.pod.id);

    // === base + ports: the per-pod ephemeral ports need SYS_ADMIN (setns) through seccomp ===
    let ports = podspec::render(repo, &["ports"], &work);
    let mut ag = run_agent_pod(
        &mut ctd,
        &mut n,
        &stage,
        &ports,
        "nodeguard-ports",
        std::slice::from_ref(&scope),
    );
    let ready = ag.prober.until(|p| p.ready);
    // Two ticks after ready: the sampler has run with the pod's netns joined.
    ag.prober.wait(Duration::from_secs(10));
    let m = ag
        .scrape("/metrics")
        .map(|(_, b)| parse(&b))
        .unwrap_or_default();
    let host_m = parse(&metrics_text(&host.tick()));
    let range = cri::nsenter(shop_pid, &["cat", "/proc/sys/net/ipv4/ip_local_port_range"]);
    let reserved = cri::nsenter(
        shop_pid,
        &["cat", "/proc/sys/net/ipv4/ip_local_reserved_ports"],
    );
    let bounds: Vec<f64> = range
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    let kernel_ports = match bounds[..] {
        [lo, hi] if reserved.trim().is_empty() => hi - lo + 1.0,
        _ => -1.0,
    };
    let feature = m
        .iter()
        .find(|s| {
            s.name == "nodeguard_feature_available" && s.label("feature") == Some("ephemeral_ports")
        })
        .map(|s| s.value);
    let avail = |m: &[Sample]| pod_value(m, "nodeguard_pod_ephemeral_ports_available", "cart-0");
    ck.check(
        "ports pod: ready; SYS_ADMIN added; ephemeral_ports available (setns under RuntimeDefault seccomp)",
        ready
            && feature == Some(1.0)
            && u64::from_str_radix(
                &status_field(n.procs(&ag.container()).first().copied().unwrap_or(0), "CapEff"),
                16,
            )
            .ok()
                == Some(cap_mask(&["SYS_PTRACE", "DAC_READ_SEARCH", "NET_ADMIN", "SYS_ADMIN"])),
        format!("ready {ready}, feature {feature:?}"),
    );
    ck.check(
        "in-pod ephemeral ports available for cart-0 = the pod netns's ip_local_port_range (no reserved) = host-run",
        avail(&m) == Some(kernel_ports) && avail(&host_m) == Some(kernel_ports),
        format!(
            "kernel {range:?} reserved {reserved:?} -> {kernel_ports}, in-pod {:?}, host-run {:?}",
            avail(&m),
            avail(&host_m)
        ),
    );
    ctd.stop_id(&ag.id, ag.t.grace);
    ctd.remove_sandbox(&ag.pod.id);

    // === base + kmsg: /dev/kmsg read through the device cgroup (privileged) ===
    let kmsg = podspec::render(repo, &["kmsg"], &work);
    let mut ag = run_agent_pod(
        &mut ctd,
        &mut n,
        &stage,
        &kmsg,
        "nodeguard-kmsg",
        std::slice::from_ref(&scope),
    );
    let ready = ag.prober.until(|p| p.ready);
    // Two ticks after ready: the kernel-log pass has run at least twice.
    ag.prober.wait(Duration::from_secs(10));
    let m = ag
        .scrape("/metrics")
        .map(|(_, b)| parse(&b))
        .unwrap_or_default();
    let find = |name: &str, k: &str, v: &str| {
        m.iter()
            .find(|s| s.name == name && s.label(k) == Some(v))
            .map(|s| s.value)
    };
    let feature = find("nodeguard_feature_available", "feature", "oom_kmsg");
    let fresh = find("nodeguard_sampler_fresh", "sampler", "kmsg");
    let errors: f64 = m
        .iter()
        .filter(|s| {
            s.name == "nodeguard_sampler_errors_total" && s.label("sampler") == Some("kmsg")
        })
        .map(|s| s.value)
        .sum();
    ck.check(
        "kmsg pod: ready; oom_kmsg available, the kmsg sampler fresh with no error (privileged opens /dev/kmsg past the device cgroup)",
        ready && feature == Some(1.0) && fresh == Some(1.0) && errors == 0.0,
        format!("ready {ready}, feature {feature:?}, fresh {fresh:?}, errors {errors}"),
    );
    ctd.stop_id(&ag.id, ag.t.grace);
    ctd.remove_sandbox(&ag.pod.id);

    // === base + actions, enforcing: freeze, release, freeze again, thaw on stop ===
    let args = vec![
        scope.clone(),
        "--set=guard.dry_run=false".to_owned(),
        "--set=guard.rules=[{name: zombie-leak, signal: zombies, above: 4, for: 0s, action: freeze, hold: 15m}]".to_owned(),
    ];
    let t_pod = Instant::now();
    let mut ag = run_agent_pod(&mut ctd, &mut n, &stage, &acting, "nodeguard-acting", &args);
    let ready = ag.prober.until(|p| p.ready);
    ck.check(
        "actions pod: ready under its own readiness probe",
        ready,
        format!("after {:?}", ag.prober.ready_at),
    );
    let pid = n.procs(&ag.container()).first().copied().unwrap_or(0);
    let want = cap_mask(&["SYS_PTRACE", "DAC_READ_SEARCH", "NET_ADMIN", "KILL", "BPF"]);
    let eff = u64::from_str_radix(&status_field(pid, "CapEff"), 16).unwrap_or(u64::MAX);
    ck.check(
        "actions pod: KILL and BPF added",
        eff == want,
        format!("CapEff {eff:#x}, want {want:#x}"),
    );
    ck.check(
        "actions pod: the cgroup mount is rw",
        mount_opts(pid, "/host/sys/fs/cgroup").as_deref() == Some("rw"),
        format!("{:?}", mount_opts(pid, "/host/sys/fs/cgroup")),
    );
    let frozen = |n: &TestNode| n.freezer_state(&reaper_cg) == "FROZEN";
    let t_trip = Instant::now();
    let ok = ag.prober.until(|_| frozen(&n));
    ck.check(
        "the in-pod agent froze shop/cart-0/reaper (5 zombies > 4): freezer.state FROZEN",
        ok,
        format!(
            "{} after {:.1} s (pod started {:.1} s before)",
            n.freezer_state(&reaper_cg),
            t_trip.elapsed().as_secs_f64(),
            (t_trip - t_pod).as_secs_f64()
        ),
    );
    ck.check(
        "nothing else of the suite is frozen",
        n.frozen_outside(&[&reaper_cg]).is_empty(),
        format!("{:?}", n.frozen_outside(&[&reaper_cg])),
    );
    let trips_of = |p: &Prober| {
        series(
            p,
            "nodeguard_breaker_trips_total",
            "reaper",
            Some(("rule", "zombie-leak")),
        )
    };
    // The tick that froze it publishes its metrics after the write: wait for the scrape.
    let mut seen = None;
    ag.prober.until(|p| {
        seen = trips_of(p);
        seen == Some(1.0)
    });
    ck.check(
        "exported: 1 trip of zombie-leak on reaper",
        seen == Some(1.0),
        format!("{seen:?}"),
    );
    // The operator's CLI on the host, on the same state dir the pod's hostPath serves.
    let cm_text = config_text(&acting).replace(
        "state_file: /var/lib/nodeguard/state.json",
        &format!("state_file: {}", n.state_file().display()),
    );
    let host_cfg = n.dir.path().join("host-nodeguard.yaml");
    std::fs::write(&host_cfg, cm_text).expect("host config");
    let (code, out) = common::agent::cli(&host_cfg, &["release", "shop/cart-0/reaper"]);
    ck.check(
        "nodeguard release on the host: exit 0",
        code == 0,
        out.trim(),
    );
    let t_rel = Instant::now();
    let ok = ag.prober.until(|_| !frozen(&n));
    ck.check(
        "release: the in-pod agent thawed reaper (freezer.state THAWED)",
        ok,
        format!(
            "{} after {:.1} s",
            n.freezer_state(&reaper_cg),
            t_rel.elapsed().as_secs_f64()
        ),
    );
    // Tripped again once the node-wide cool-down (30 s from the first trip) is over.
    // A released breaker is gone (its series with it); the symptom trips a new one.
    let open_of = |p: &Prober| {
        scrape_series(
            p,
            "nodeguard_breaker_open",
            "reaper",
            Some(("rule", "zombie-leak")),
        )
    };
    let mut open = None;
    ag.prober.until(|p| {
        open = open_of(p);
        open == Some(None)
    });
    let agent_log = n.pod_log_dir(&ag.pod.pod).join("nodeguard/0.log");
    let released = std::fs::read_to_string(&agent_log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("breaker released") && l.contains("reaper"))
        .count();
    ck.check(
        "release: the breaker is gone from /metrics, one `released` transition logged",
        open == Some(None) && released == 1,
        format!("breaker_open {open:?}, {released} released lines"),
    );
    let t_again = Instant::now();
    let ok = ag.prober.until(|_| frozen(&n));
    let again = t_again.elapsed();
    let mut seen = None;
    ag.prober.until(|p| {
        seen = open_of(p).flatten().zip(trips_of(p));
        seen == Some((1.0, 1.0))
    });
    ck.check(
        "tripped again after the release (the 30 s cool-down over): FROZEN, a new breaker open with 1 trip",
        ok && seen == Some((1.0, 1.0)),
        format!(
            "{} after {:.1} s, (open, trips) {seen:?}",
            n.freezer_state(&reaper_cg),
            again.as_secs_f64(),
        ),
    );
    ck.check(
        "actions pod: live all along (no liveness kill)",
        ag.prober.liveness_kills == 0,
        format!("liveness ok/failed {:?}", ag.prober.results[0]),
    );
    let t_stop = Instant::now();
    ctd.stop_id(&ag.id, ag.t.grace);
    let stop_took = t_stop.elapsed();
    let st = ctd.status_of(&ag.id);
    ck.check(
        "StopContainer (grace 30 s): the agent exits 0 and reaper is thawed",
        st.exit_code == 0 && !frozen(&n),
        format!(
            "exit {} reason {:?} in {:.2} s; reaper {}",
            st.exit_code,
            st.reason,
            stop_took.as_secs_f64(),
            n.freezer_state(&reaper_cg)
        ),
    );
    ck.check(
        "reaper still has its 5 zombies, and runs",
        zombies_of(reaper_pid) == 5 && ctd.status(&reaper).state == 1,
        format!(
            "{} zombies, state {}",
            zombies_of(reaper_pid),
            ctd.status(&reaper).state
        ),
    );
    ctd.remove_sandbox(&ag.pod.id);

    // === the rolling update's next pod: the hold still due comes back from the state volume ===
    let t_next = Instant::now();
    let mut ag = run_agent_pod(&mut ctd, &mut n, &stage, &acting, "nodeguard-next", &args);
    let ok = ag.prober.until(|_| frozen(&n));
    let took = t_next.elapsed();
    let mut seen = None;
    ag.prober.until(|p| {
        seen = open_of(p).flatten().zip(trips_of(p));
        seen == Some((1.0, 1.0))
    });
    ck.check(
        "the next pod re-applies the hold from the state volume: FROZEN, the same breaker (1 trip)",
        ok && seen == Some((1.0, 1.0)),
        format!(
            "{} {:.1} s after RunPodSandbox, (open, trips) {seen:?}",
            n.freezer_state(&reaper_cg),
            took.as_secs_f64()
        ),
    );
    ctd.stop_id(&ag.id, ag.t.grace);
    ck.check(
        "the next pod stopped: reaper thawed again",
        !frozen(&n) && ag.prober.liveness_kills == 0,
        n.freezer_state(&reaper_cg),
    );
    ctd.remove_sandbox(&ag.pod.id);
    let codes = ctd.delete_pod(&n, &shop, &[&api, &reaper, &server, &client, &chatty]);
    ck.check(
        "the workloads end on SIGTERM with exit 0",
        codes == [0; 5],
        format!("{codes:?}"),
    );

    drop(ctd);
    drop(netns);
    eprintln!(
        "daemonset tier: {:.1} s in all (containerd start, render, import included)",
        t0.elapsed().as_secs_f64()
    );
    ck.finish();
}

/// The translation alone (no containerd, no root): the CRI configs the kubelet would send for the
/// base pod and for base + actions, field by field.
#[test]
fn shipped_pod_spec_as_cri_configs() {
    if !which("kubectl") {
        common::cannot_run("kubectl is not installed (it renders the kustomize base)");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("tempdir");
    let subst = Substitutions {
        served: ["/var/log/pods", "/var/log/containers", "/var/lib/nodeguard"]
            .iter()
            .map(|h| ((*h).to_owned(), dir.path().join(h.trim_start_matches('/'))))
            .collect(),
        real: vec!["/sys/fs/cgroup".into()],
    };
    let extra = ["--set=discovery.scopes=[\"/ngtest\"]".to_owned()];
    for (components, pod_name) in [(&[][..], "base"), (&["actions"][..], "acting")] {
        let r = podspec::render(repo, components, dir.path());
        let ctx = Context {
            node_name: NODE_NAME,
            pod_name,
            uid: "00000000-0000-4000-8000-000000000001",
            cgroup_parent: "/kubepods/burstable/pod00000000-0000-4000-8000-000000000001".into(),
            log_directory: dir.path().join("pods/x"),
            pod_dir: dir.path().join("kubelet").join(pod_name),
            image_ref: "sha256:0",
            subst: &subst,
            extra_args: &extra,
        };
        let t = podspec::translate(&r, &ctx);
        let sb = t.sandbox.linux.as_ref().expect("sandbox linux");
        let sbsc = sb
            .security_context
            .as_ref()
            .expect("sandbox security context");
        let node = k8s_cri::v1::NamespaceMode::Node as i32;
        let ns = sbsc.namespace_options.as_ref().expect("namespaces");
        assert_eq!(
            (ns.network, ns.pid),
            (node, node),
            "{pod_name}: hostNetwork, hostPID"
        );
        assert_eq!(
            t.sandbox.hostname, "",
            "{pod_name}: no hostname with hostNetwork"
        );
        assert_eq!(
            t.sandbox
                .port_mappings
                .iter()
                .map(|p| (p.container_port, p.host_port))
                .collect::<Vec<_>>(),
            [(9913, 9913)]
        );
        let c = &t.container;
        let lx = c.linux.as_ref().expect("container linux");
        let res = lx.resources.as_ref().expect("resources");
        assert_eq!(
            (
                res.cpu_shares,
                res.cpu_quota,
                res.cpu_period,
                res.memory_limit_in_bytes,
                res.oom_score_adj
            ),
            (51, 50_000, 100_000, 128 << 20, -997),
            "{pod_name}: resources"
        );
        let sc = lx.security_context.as_ref().expect("security context");
        let caps = sc.capabilities.as_ref().expect("capabilities");
        let mut want_add = vec!["SYS_PTRACE", "DAC_READ_SEARCH", "NET_ADMIN"];
        if pod_name == "acting" {
            want_add.extend(["KILL", "BPF"]);
        }
        assert_eq!(
            caps.add_capabilities, want_add,
            "{pod_name}: capabilities added"
        );
        assert_eq!(
            caps.drop_capabilities,
            ["ALL"],
            "{pod_name}: capabilities dropped"
        );
        assert!(
            !sc.privileged && sc.readonly_rootfs && sc.no_new_privs,
            "{pod_name}: {sc:?}"
        );
        assert_eq!(
            (
                sc.run_as_user.as_ref().map(|u| u.value),
                sc.run_as_group.as_ref().map(|g| g.value)
            ),
            (Some(0), Some(0))
        );
        assert_eq!(
            sc.masked_paths,
            podspec::DEFAULT_MASKED,
            "{pod_name}: masked paths"
        );
        assert_eq!(
            sc.readonly_paths,
            podspec::DEFAULT_READONLY,
            "{pod_name}: read-only paths"
        );
        assert_eq!(
            sc.seccomp.as_ref().map(|s| s.profile_type),
            Some(k8s_cri::v1::security_profile::ProfileType::RuntimeDefault as i32)
        );
        assert_eq!(
            c.args,
            [
                "--config",
                "/etc/nodeguard/nodeguard.yaml",
                "--set=discovery.scopes=[\"/ngtest\"]"
            ]
        );
        assert_eq!(
            c.envs
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect::<Vec<_>>(),
            [
                format!("NODE_NAME={NODE_NAME}"),
                "POD_NAMESPACE=nodeguard".into()
            ]
        );
        // In the rendered order (kustomize's merge moves a patched mount first), compared sorted.
        let mut mounts: Vec<(String, bool)> = c
            .mounts
            .iter()
            .map(|m| (m.container_path.clone(), m.readonly))
            .collect();
        mounts.sort();
        let cgroup_ro = pod_name == "base";
        assert_eq!(
            mounts,
            [
                ("/dev/termination-log".to_owned(), false),
                ("/etc/hosts".to_owned(), false),
                ("/etc/nodeguard".to_owned(), true),
                ("/host/sys/fs/cgroup".to_owned(), cgroup_ro),
                ("/var/lib/nodeguard".to_owned(), false),
                ("/var/log/containers".to_owned(), true),
                ("/var/log/pods".to_owned(), true),
            ],
            "{pod_name}: mounts"
        );
        let cfg = c
            .mounts
            .iter()
            .find(|m| m.container_path == "/etc/nodeguard")
            .map(|m| Path::new(&m.host_path).join("nodeguard.yaml"))
            .expect("config mount");
        assert_eq!(
            std::fs::read_to_string(&cfg).expect("projected config"),
            config_text(&r),
            "{pod_name}: the projected ConfigMap"
        );
        assert!(std::fs::symlink_metadata(&cfg).expect("key").is_symlink());
        assert_eq!(
            (
                t.liveness.path.as_str(),
                t.liveness.port,
                t.liveness.initial_delay.as_secs(),
                t.liveness.period.as_secs(),
                t.liveness.timeout.as_secs(),
                t.liveness.failure_threshold
            ),
            ("/healthz", 9913, 5, 10, 2, 3)
        );
        assert_eq!(
            (
                t.readiness.path.as_str(),
                t.readiness.port,
                t.readiness.initial_delay.as_secs(),
                t.readiness.period.as_secs(),
                t.readiness.timeout.as_secs(),
                t.readiness.failure_threshold
            ),
            ("/readyz", 9913, 0, 10, 2, 3)
        );
        assert_eq!(t.grace, 30);
        assert!(
            subst.served.iter().all(|(_, p)| p.is_dir()),
            "DirectoryOrCreate made the served dirs"
        );
    }
}
