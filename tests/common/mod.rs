//! Real-kernel test harness: a uniquely named parent cgroup in every hierarchy, a kubelet-style
//! tree below it, real processes (`nodeguard-testload`) inside, and kubelet-style log trees in a
//! temp dir. Everything it creates is removed on drop, even when the test fails; it only ever
//! stops processes it started itself.
#![allow(dead_code)]

pub mod agent;
pub mod kubelet;
pub mod net;
pub mod snap;

use nodeguard::agent::Agent;
use nodeguard::cgroupfs::CgroupLayout;
use nodeguard::clock::SystemClock;
use nodeguard::config::Config;
use nodeguard::discover::kubelet::QosClass;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const TESTLOAD: &str = env!("CARGO_BIN_EXE_nodeguard-testload");
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
static SEQ: AtomicU32 = AtomicU32::new(0);

pub use kubelet::Driver;

#[derive(Debug, Clone)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Cgroup path relative to the test parent.
    pub cgroup: String,
    pub driver: Driver,
}

#[derive(Debug, Clone)]
pub struct Container {
    pub pod: Pod,
    pub name: String,
    pub id: String,
    pub restart: u32,
    /// Cgroup path relative to the test parent.
    pub cgroup: String,
}

struct Proc {
    pid: u32,
    /// Cgroup (relative to the test parent) it was started in; `None` for a process that only
    /// entered a network namespace.
    cgroup: Option<String>,
    child: Child,
    stdin: Option<ChildStdin>,
    /// Its stdout lines after `ready`, for a process started by `spawn_talk`.
    answers: Option<std::sync::mpsc::Receiver<String>>,
}

pub struct TestNode {
    /// The unique parent cgroup, e.g. `ngtest-1234-0`.
    pub name: String,
    pub layout: CgroupLayout,
    hierarchies: Vec<PathBuf>,
    pub dir: tempfile::TempDir,
    created: Vec<String>,
    /// Cgroups with names that are not UTF-8 (leaves below `created` ones), removed first.
    created_raw: Vec<PathBuf>,
    procs: Vec<Proc>,
    /// Network namespaces and links (`net.rs`), released after every process is stopped,
    /// newest first.
    guards: Vec<std::rc::Rc<dyn std::any::Any>>,
    /// The agent is pointed at the v2 tree alone (`paths.cgroup: <unified>`), so it uses v2's
    /// `cgroup.freeze` even on a hybrid host (`on_unified`).
    unified_only: bool,
}

/// True where a real-kernel test must run: as root, or with `CI` set (CI is root; a CI job that
/// is not root is broken, not a reason to pass off a test as run).
pub fn must_run() -> bool {
    nix::unistd::geteuid().is_root() || ci()
}

/// `CI` set to anything but empty, `0` or `false`.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// A real-kernel test cannot run here: a failure (panic with the reason) where it must run
/// (`must_run`), else one `SKIP:` line that `scripts/test` counts. Returns only to skip.
pub fn cannot_run(why: &str) {
    if must_run() {
        panic!(
            "real-kernel test cannot run: {why} (running as root or with CI set, a missing \
             prerequisite is a failure, not a skip; scripts/setup-test-deps installs the tools)"
        );
    }
    eprintln!("SKIP: {why}");
}

/// Returns `None` (after a SKIP line) only where real cgroups cannot be made and the test need
/// not run (not root, CI unset); as root or in CI a missing cgroupfs is a failure.
pub fn node() -> Option<TestNode> {
    if !nix::unistd::geteuid().is_root() {
        cannot_run("real-kernel test needs root (CI runs as root)");
        return None;
    }
    let Some(layout) = CgroupLayout::detect(Path::new(CGROUP_ROOT)) else {
        cannot_run(&format!("no cgroup hierarchy at {CGROUP_ROOT}"));
        return None;
    };
    let mut hierarchies: Vec<PathBuf> = ["memory", "pids", "freezer", "cpu"]
        .iter()
        .filter_map(|c| layout.v1_controller(c))
        .collect();
    if let Some(u) = layout.unified() {
        hierarchies.push(u.to_path_buf());
    }
    let name = format!(
        "ngtest-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    );
    let mut n = TestNode {
        name,
        layout,
        hierarchies,
        dir: tempfile::tempdir().expect("tempdir"),
        created: Vec::new(),
        created_raw: Vec::new(),
        procs: Vec::new(),
        guards: Vec::new(),
        unified_only: false,
    };
    std::fs::create_dir_all(n.pod_logs()).expect("pod log dir");
    std::fs::create_dir_all(n.container_logs()).expect("container log dir");
    n.mkdir("");
    Some(n)
}

impl TestNode {
    pub fn pod_logs(&self) -> PathBuf {
        self.dir.path().join("pods")
    }

    pub fn container_logs(&self) -> PathBuf {
        self.dir.path().join("containers")
    }

    /// Absolute cgroup path (relative to a hierarchy root) of a path below the test parent.
    pub fn rel(&self, inner: &str) -> String {
        if inner.is_empty() {
            format!("/{}", self.name)
        } else {
            format!("/{}/{}", self.name, inner)
        }
    }

    /// Points the agent (and `freezer_state`, `procs`, `thaw`) at the v2 tree alone: on a hybrid
    /// host the guard then freezes with v2's `cgroup.freeze`, as on a pure v2 node. Call before
    /// any process is frozen (the two freezers interfere; KERNEL-TRAPS). False where there is
    /// no v2 tree.
    pub fn on_unified(&mut self) -> bool {
        self.unified_only = self.layout.unified().is_some();
        self.unified_only
    }

    /// Which freezer the agent of this node uses: `"v1"` or `"v2"`.
    pub fn freezer_kind(&self) -> &'static str {
        match self.freezer() {
            Some((_, true)) => "v1",
            _ => "v2",
        }
    }

    /// The agent's configuration for this node: real /proc and cgroups, scoped to our parent.
    pub fn config(&self, extra: &str) -> Config {
        Config::from_yaml(&self.config_yaml(extra)).expect("test config")
    }

    /// The YAML behind `config` (for a config file the real binary reads).
    pub fn config_yaml(&self, extra: &str) -> String {
        let root = match (self.unified_only, self.layout.unified()) {
            (true, Some(u)) => u.display().to_string(),
            _ => CGROUP_ROOT.to_owned(),
        };
        let yaml = format!(
            "listen: 127.0.0.1:0\ninterval: 1s\npaths:\n  proc: /proc\n  cgroup: {root}\n  pod_logs: {}\n  container_logs: {}\ndiscovery:\n  scopes: [\"{}\"]\n{extra}",
            self.pod_logs().display(),
            self.container_logs().display(),
            self.rel(""),
        );
        // Breaker state stays in the test's temp dir, never in /var/lib.
        if extra.contains("guard:") {
            yaml
        } else {
            format!(
                "{yaml}guard:\n  state_file: {}\n",
                self.state_file().display()
            )
        }
    }

    pub fn state_file(&self) -> PathBuf {
        self.dir.path().join("state/state.json")
    }

    pub fn agent(&self) -> Agent {
        Agent::new(self.config(""), Arc::new(SystemClock)).expect("agent")
    }

    /// Creates `inner` (and its parents) in every hierarchy we mirror.
    pub fn mkdir(&mut self, inner: &str) {
        let rel = self.rel(inner);
        let mut prefix = String::new();
        for comp in rel.split('/').filter(|c| !c.is_empty()) {
            prefix.push('/');
            prefix.push_str(comp);
            if self.created.contains(&prefix) {
                continue;
            }
            for h in &self.hierarchies {
                let p = h.join(prefix.trim_start_matches('/'));
                if !p.exists() {
                    std::fs::create_dir(&p)
                        .unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
                }
            }
            self.created.push(prefix.clone());
        }
    }

    /// On a pure v2 host, enables the memory and pids controllers for the children of the test
    /// parent and of every cgroup on the way to `inner` (a pod), as kubelet does: without it a
    /// container cgroup has no `memory.*` or `pids.*` files. Never on a container cgroup, which
    /// holds processes (v2's no-internal-process rule).
    pub fn delegate(&self, inner: &str) {
        if !self.layout.memory_is_v2() {
            return;
        }
        let root = self.layout.primary();
        let mut dir = root.join(&self.name);
        let parts: Vec<&str> = inner.split('/').filter(|c| !c.is_empty()).collect();
        for i in 0..=parts.len() {
            if i > 0 {
                dir = dir.join(parts[i - 1]);
            }
            let f = dir.join("cgroup.subtree_control");
            for ctl in ["+memory", "+pids", "+cpu"] {
                std::fs::write(&f, ctl).unwrap_or_else(|e| panic!("{ctl} > {}: {e}", f.display()));
            }
        }
    }

    /// Creates a leaf cgroup with any name the kernel takes (not UTF-8, `"`, `\\`) below the
    /// already created `parent`, in every hierarchy; removed on drop. Its path relative to a
    /// hierarchy root, or the error of the first `mkdir` (the kernel refuses a newline).
    pub fn mkdir_raw(&mut self, parent: &str, name: &std::ffi::OsStr) -> std::io::Result<PathBuf> {
        let rel = PathBuf::from(self.rel(parent).trim_start_matches('/')).join(name);
        for (i, h) in self.hierarchies.iter().enumerate() {
            if let Err(e) = std::fs::create_dir(h.join(&rel)) {
                if i == 0 {
                    return Err(e);
                }
                panic!("mkdir {}: {e}", h.join(&rel).display());
            }
        }
        self.created_raw.push(rel.clone());
        Ok(rel)
    }

    /// The `cgroup.procs` files of `rel` (relative to a hierarchy root) in every hierarchy the
    /// node mirrors: writing a pid into all of them moves the process there.
    pub fn procs_files(&self, rel: &Path) -> Vec<PathBuf> {
        let rel = rel.strip_prefix("/").unwrap_or(rel);
        self.hierarchies
            .iter()
            .map(|h| h.join(rel).join("cgroup.procs"))
            .collect()
    }

    /// Moves a process the test started into the cgroup `rel` in every hierarchy.
    pub fn move_pid(&self, pid: u32, rel: &Path) {
        for f in self.procs_files(rel) {
            std::fs::write(&f, pid.to_string())
                .unwrap_or_else(|e| panic!("move {pid} to {}: {e}", f.display()));
        }
    }

    /// Every cgroup the test made (in the freezer's hierarchy) that is frozen or freezing, except
    /// `targets` and their descendants: what a guard must never have touched.
    pub fn frozen_outside(&self, targets: &[&Container]) -> Vec<String> {
        let Some((root, v1)) = self.freezer() else {
            return Vec::new();
        };
        let targets: Vec<String> = targets.iter().map(|c| self.rel(&c.cgroup)).collect();
        let mut dirs: Vec<PathBuf> = self
            .created
            .iter()
            .map(|d| PathBuf::from(d.trim_start_matches('/')))
            .collect();
        dirs.extend(self.created_raw.iter().cloned());
        let mut out = Vec::new();
        for d in dirs {
            let shown = format!("/{}", d.display());
            if targets
                .iter()
                .any(|t| shown == *t || shown.starts_with(&format!("{t}/")))
            {
                continue;
            }
            let state = if v1 {
                std::fs::read_to_string(root.join(&d).join("freezer.state"))
                    .map(|t| t.trim().to_owned())
                    .unwrap_or_default()
            } else {
                std::fs::read_to_string(root.join(&d).join("cgroup.events"))
                    .map(|t| {
                        if t.lines().any(|l| l.trim() == "frozen 1") {
                            "FROZEN".to_owned()
                        } else {
                            "THAWED".to_owned()
                        }
                    })
                    .unwrap_or_default()
            };
            if state == "FROZEN" || state == "FREEZING" {
                out.push(format!("{shown} {state}"));
            }
        }
        out
    }

    pub fn pod(&mut self, driver: Driver, qos: QosClass, namespace: &str, name: &str) -> Pod {
        let uid = format!(
            "{:08x}-{:04x}-4000-8000-{:012x}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst),
            self.created.len()
        );
        let cgroup = kubelet::pod_cgroup(driver, qos, &uid);
        self.mkdir(&cgroup);
        self.delegate(&cgroup);
        let pod = Pod {
            namespace: namespace.into(),
            name: name.into(),
            uid,
            cgroup,
            driver,
        };
        std::fs::create_dir_all(self.pod_log_dir(&pod)).expect("pod log dir");
        pod
    }

    pub fn pod_log_dir(&self, pod: &Pod) -> PathBuf {
        self.pod_logs()
            .join(kubelet::pod_log_dir(&pod.namespace, &pod.name, &pod.uid))
    }

    /// A container cgroup plus its kubelet log file `<restart>.log` and `/var/log/containers` link.
    pub fn container(&mut self, pod: &Pod, name: &str, restart: u32) -> Container {
        let c = self.container_cgroup(pod, name, restart);
        let dir = self.pod_log_dir(pod).join(name);
        std::fs::create_dir_all(&dir).expect("container log dir");
        let log = dir.join(format!("{restart}.log"));
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let link = self.container_logs().join(kubelet::container_log_link(
            &pod.namespace,
            &pod.name,
            name,
            &c.id,
        ));
        std::os::unix::fs::symlink(&log, link).expect("container log link");
        c
    }

    /// A container cgroup with no log link (a sandbox, or a container kubelet has not linked).
    pub fn container_cgroup(&mut self, pod: &Pod, name: &str, restart: u32) -> Container {
        let id = format!(
            "{:016x}{:016x}{:016x}{:016x}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst),
            restart,
            self.created.len()
        );
        let leaf = kubelet::container_leaf(pod.driver, &id);
        let cgroup = format!("{}/{leaf}", pod.cgroup);
        self.mkdir(&cgroup);
        Container {
            pod: pod.clone(),
            name: name.into(),
            id,
            restart,
            cgroup,
        }
    }

    pub fn log_path(&self, c: &Container) -> PathBuf {
        self.pod_log_dir(&c.pod)
            .join(&c.name)
            .join(format!("{}.log", c.restart))
    }

    /// Appends `n` full CRI lines to the container's current log.
    pub fn write_log(&self, c: &Container, stream: &str, n: usize) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.log_path(c))
            .expect("open log");
        let mut buf = String::new();
        for i in 0..n {
            buf.push_str(&kubelet::cri_line(
                i,
                stream,
                &format!("connect ETIMEDOUT 203.0.113.7:443 attempt {i}"),
            ));
        }
        f.write_all(buf.as_bytes()).expect("write log");
    }

    /// Writes a memory limit in the memory hierarchy (v1 or v2).
    pub fn set_memory_limit(&self, c: &Container, bytes: u64) {
        let (root, file) = if self.layout.memory_is_v2() {
            (self.layout.primary(), "memory.max")
        } else {
            (self.layout.primary(), "memory.limit_in_bytes")
        };
        let p = root
            .join(self.rel(&c.cgroup).trim_start_matches('/'))
            .join(file);
        std::fs::write(&p, bytes.to_string()).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }

    fn join_args(&self, c: &Container) -> Vec<String> {
        let mut args = Vec::new();
        for h in &self.hierarchies {
            args.push("--join".to_owned());
            args.push(
                h.join(self.rel(&c.cgroup).trim_start_matches('/'))
                    .join("cgroup.procs")
                    .display()
                    .to_string(),
            );
        }
        args
    }

    /// Starts `nodeguard-testload` inside the container and waits for `ready`.
    pub fn spawn(&mut self, c: &Container, args: &[&str]) -> u32 {
        let child = self.start(c, args);
        self.track(child, Some(c.cgroup.clone()), args)
    }

    /// Starts `nodeguard-testload` inside the container's cgroups and the network namespace
    /// `netns` (a `/run/netns/...` file), and waits for `ready`.
    pub fn spawn_in(&mut self, c: &Container, netns: &Path, args: &[&str]) -> u32 {
        let child = self.launch(self.join_args(c), Some(netns), args);
        self.track(child, Some(c.cgroup.clone()), args)
    }

    /// Starts `nodeguard-testload` in the network namespace `netns` only: it stays in the test
    /// runner's cgroup, outside every workload of the test. Stopped like the others.
    pub fn spawn_netns_only(&mut self, netns: &Path, args: &[&str]) -> u32 {
        let child = self.launch(Vec::new(), Some(netns), args);
        self.track(child, None, args)
    }

    /// Starts `nodeguard-testload` inside the container like `spawn`, keeping its stdout: `ask`
    /// then sends it a request line and waits for its answer (the `hold` mode).
    pub fn spawn_talk(&mut self, c: &Container, args: &[&str]) -> u32 {
        let child = self.start(c, args);
        self.track_with(child, Some(c.cgroup.clone()), args, true)
    }

    /// `spawn_talk` inside the network namespace `netns` too.
    pub fn spawn_talk_in(&mut self, c: &Container, netns: &Path, args: &[&str]) -> u32 {
        let child = self.launch(self.join_args(c), Some(netns), args);
        self.track_with(child, Some(c.cgroup.clone()), args, true)
    }

    /// Sends one request line to a process started by `spawn_talk` and returns its answer line
    /// (bounded: no answer in 30 s fails the test).
    pub fn ask(&mut self, pid: u32, line: &str) -> String {
        self.send(pid, line);
        let p = self
            .procs
            .iter()
            .find(|p| p.pid == pid)
            .unwrap_or_else(|| panic!("no process {pid} of ours"));
        let rx = p.answers.as_ref().expect("started by spawn_talk");
        rx.recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no answer from {pid} to {line:?}: {e}"))
            .trim_end()
            .to_owned()
    }

    fn track(&mut self, child: Child, cgroup: Option<String>, args: &[&str]) -> u32 {
        self.track_with(child, cgroup, args, false)
    }

    fn track_with(
        &mut self,
        mut child: Child,
        cgroup: Option<String>,
        args: &[&str],
        talk: bool,
    ) -> u32 {
        let stdout = child.stdout.take().expect("stdout");
        // Bounded: a workload that hangs before `ready` fails the test instead of hanging it
        // (the reader thread ends when the child is stopped below and its stdout closes).
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut out = BufReader::new(stdout);
            let mut line = String::new();
            let _ = out.read_line(&mut line);
            let _ = tx.send(line);
            // A talking process's later lines are its answers, until its stdout closes.
            if !talk {
                return;
            }
            loop {
                let mut line = String::new();
                match out.read_line(&mut line) {
                    Ok(n) if n > 0 && tx.send(line).is_ok() => {}
                    _ => break,
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| "(no ready line within 30 s)".to_owned());
        let ready = line
            .strip_prefix("ready ")
            .and_then(|p| p.trim().parse().ok());
        let stdin = child.stdin.take();
        let p = Proc {
            pid: ready.unwrap_or(0),
            cgroup,
            child,
            stdin,
            answers: talk.then_some(rx),
        };
        let Some(pid) = ready else {
            // Reaped (or stopped) before the test fails: it never outlives the test.
            finish(p);
            panic!("testload {args:?} did not get ready: {line:?}");
        };
        self.procs.push(p);
        pid
    }

    /// Starts `nodeguard-testload` and returns once it has exited (the OOM case).
    pub fn run_to_exit(&mut self, c: &Container, args: &[&str]) -> std::process::ExitStatus {
        let mut child = self.start(c, args);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = child.try_wait().expect("wait") {
                return st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("testload {args:?} did not exit in 30s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn start(&self, c: &Container, args: &[&str]) -> Child {
        self.launch(self.join_args(c), None, args)
    }

    fn launch(&self, join: Vec<String>, netns: Option<&Path>, args: &[&str]) -> Child {
        let netns: Vec<String> = netns
            .map(|p| vec!["--netns".to_owned(), p.display().to_string()])
            .unwrap_or_default();
        Command::new(TESTLOAD)
            .args(netns)
            .args(join)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn testload")
    }

    /// The freezer the guard uses on this host (`Freezer::detect`): the v1 hierarchy when it is
    /// mounted, else the unified one. `(root, is_v1)`.
    fn freezer(&self) -> Option<(PathBuf, bool)> {
        if self.unified_only {
            return self.layout.unified().map(|u| (u.to_path_buf(), false));
        }
        if let Some(root) = self.layout.v1_controller("freezer") {
            return Some((root, true));
        }
        self.layout.unified().map(|u| (u.to_path_buf(), false))
    }

    /// A container's directory in the freezer's hierarchy.
    pub fn freezer_dir(&self, c: &Container) -> PathBuf {
        let (root, _) = self.freezer().expect("no freezer hierarchy");
        root.join(self.rel(&c.cgroup).trim_start_matches('/'))
    }

    /// `FROZEN`, `FREEZING` or `THAWED`: v1 `freezer.state`, or v2 `cgroup.events` mapped to
    /// the same words.
    pub fn freezer_state(&self, c: &Container) -> String {
        let (_, v1) = self.freezer().expect("no freezer hierarchy");
        let dir = self.freezer_dir(c);
        if v1 {
            let p = dir.join("freezer.state");
            std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
                .trim()
                .to_owned()
        } else {
            let p = dir.join("cgroup.events");
            let t = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            if t.lines().any(|l| l.trim() == "frozen 1") {
                "FROZEN".into()
            } else {
                "THAWED".into()
            }
        }
    }

    /// The file and value that thaw a container's cgroup (v1 `freezer.state`, v2 `cgroup.freeze`).
    pub fn thaw_file(&self, c: &Container) -> (PathBuf, &'static str) {
        let (_, v1) = self.freezer().expect("no freezer hierarchy");
        let dir = self.freezer_dir(c);
        if v1 {
            (dir.join("freezer.state"), "THAWED")
        } else {
            (dir.join("cgroup.freeze"), "0")
        }
    }

    /// Thaws a container's cgroup, as a runtime does before it stops a frozen container.
    pub fn thaw(&self, c: &Container) {
        thaw_dir(self.freezer(), self.rel(&c.cgroup));
    }

    /// The pids listed in the container's `cgroup.procs` (freezer hierarchy).
    pub fn procs(&self, c: &Container) -> Vec<u32> {
        let p = self.freezer_dir(c).join("cgroup.procs");
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .split_ascii_whitespace()
            .map(|x| x.parse().expect("pid"))
            .collect()
    }

    /// `pids.current` of the container (v1 pids hierarchy, else unified): it still counts
    /// zombies, unlike `cgroup.procs`.
    pub fn pids_current(&self, c: &Container) -> u64 {
        let root = self
            .layout
            .v1_controller("pids")
            .or_else(|| self.layout.unified().map(Path::to_path_buf))
            .expect("no pids hierarchy");
        let p = root
            .join(self.rel(&c.cgroup).trim_start_matches('/'))
            .join("pids.current");
        std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .trim()
            .parse()
            .expect("pids.current")
    }

    /// Reaps a started process that is expected to exit by itself (e.g. killed by the agent):
    /// its exit status, or `None` if it is still running after `timeout` (it stays tracked and
    /// is stopped on drop).
    pub fn wait_exit(&mut self, pid: u32, timeout: Duration) -> Option<std::process::ExitStatus> {
        let pos = self.procs.iter().position(|p| p.pid == pid)?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = self.procs[pos].child.try_wait() {
                self.procs.remove(pos);
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Writes one line to the process's stdin (`swap`: see `nodeguard-testload`).
    pub fn send(&mut self, pid: u32, line: &str) {
        use std::io::Write;
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.pid == pid)
            .unwrap_or_else(|| panic!("no process {pid} of ours"));
        let stdin = p.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{line}").expect("write to stdin");
        stdin.flush().expect("flush stdin");
    }

    /// Closes the process's stdin: it reaps its children and exits.
    pub fn stop(&mut self, pid: u32) {
        if let Some(pos) = self.procs.iter().position(|p| p.pid == pid) {
            let p = self.procs.remove(pos);
            finish(p);
        }
    }

    /// The kubelet restarts a container: the old instance (thawed first, as a runtime must) is
    /// stopped and its cgroup removed; a new one with a new id and the next log number runs one
    /// idle process.
    pub fn restart(&mut self, prev: &Container) -> Container {
        self.remove_cgroup(prev);
        let next = self.container(&prev.pod, &prev.name, prev.restart + 1);
        self.spawn(&next, &["idle"]);
        next
    }

    /// Stops what runs in a container's cgroup and removes the cgroup, as the runtime does.
    pub fn remove_cgroup(&mut self, c: &Container) {
        // A frozen process cannot exit (nor die of SIGKILL on v1): thaw first.
        self.thaw(c);
        let (gone, kept): (Vec<Proc>, Vec<Proc>) = self
            .procs
            .drain(..)
            .partition(|p| p.cgroup.as_deref() == Some(c.cgroup.as_str()));
        self.procs = kept;
        gone.into_iter().for_each(finish);
        let rel = self.rel(&c.cgroup);
        let mut removed = true;
        for h in &self.hierarchies {
            removed &= rmdir_retry(&h.join(rel.trim_start_matches('/')));
        }
        // Whatever could not go now is retried on drop.
        if removed {
            self.created.retain(|p| *p != rel);
        }
    }
}

impl TestNode {
    /// Removes a pod whose containers are gone (`remove_cgroup`): its cgroup and log directory.
    pub fn remove_pod(&mut self, pod: &Pod) {
        let rel = self.rel(&pod.cgroup);
        let mut removed = true;
        for h in &self.hierarchies {
            removed &= rmdir_retry(&h.join(rel.trim_start_matches('/')));
        }
        if removed {
            self.created.retain(|p| *p != rel);
        }
        let _ = std::fs::remove_dir_all(self.pod_log_dir(pod));
    }
}

fn finish(mut p: Proc) {
    drop(p.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = p.child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Our own child: SIGKILL is allowed here and nowhere else.
    let _ = p.child.kill();
    let _ = p.child.wait();
}

fn rmdir_retry(p: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::fs::remove_dir(p) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            Err(e) if Instant::now() > deadline => {
                eprintln!("cleanup: cannot remove {}: {e}", p.display());
                return false;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Writes the thawed state into `rel`'s freezer (v1 `freezer.state`, v2 `cgroup.freeze`), if the
/// cgroup exists. Failures are reported, not fatal: this runs during cleanup.
fn thaw_dir(freezer: Option<(PathBuf, bool)>, rel: impl AsRef<Path>) {
    let Some((root, v1)) = freezer else { return };
    let rel = rel.as_ref();
    let dir = root.join(rel.strip_prefix("/").unwrap_or(rel));
    let (file, value) = if v1 {
        ("freezer.state", "THAWED")
    } else {
        ("cgroup.freeze", "0")
    };
    let p = dir.join(file);
    if !p.exists() {
        return;
    }
    if let Err(e) = std::fs::write(&p, value) {
        eprintln!("cleanup: cannot thaw {}: {e}", p.display());
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        // Whatever a guard froze (a failed test may not have thawed it) must run again before
        // its processes can be stopped.
        for d in &self.created {
            thaw_dir(self.freezer(), d);
        }
        for d in &self.created_raw {
            thaw_dir(self.freezer(), d);
        }
        for p in self.procs.drain(..) {
            finish(p);
        }
        while let Some(g) = self.guards.pop() {
            drop(g);
        }
        for d in std::mem::take(&mut self.created_raw) {
            for h in &self.hierarchies {
                let _ = rmdir_retry(&h.join(&d));
            }
        }
        // Deepest first: a parent cgroup cannot go before its children.
        let mut dirs = std::mem::take(&mut self.created);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.matches('/').count()));
        for d in dirs {
            for h in &self.hierarchies {
                let _ = rmdir_retry(&h.join(d.trim_start_matches('/')));
            }
        }
    }
}
