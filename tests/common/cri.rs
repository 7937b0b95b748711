//! A private containerd driven over CRI v1 the way the kubelet drives it (tests/cri_containerd.rs).
//!
//! Everything lives in one temp dir: containerd's root, state (pod netns included), sockets,
//! config, log, runc root, the CNI config (loopback only) and the image tar. The image is built
//! here from local files (a busybox-static rootfs, `nodeguard-testload` and its libraries, and a
//! copy of it named `pause`) and imported with `ctr`; no registry is ever asked. Pod cgroups are
//! made by the test node below its unique parent, as the kubelet makes them before
//! `RunPodSandbox`; runc adds the container cgroups in every hierarchy. On drop (also when the
//! test panics) every sandbox of this containerd is stopped and removed, the containerd we
//! started is stopped, any shim still serving our socket is killed, the mounts under the temp dir
//! are detached and the cgroups under the parent are removed in every hierarchy.

#![allow(dead_code)]

use crate::common::{Container, Driver, Pod, TestNode, TESTLOAD};
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use nodeguard::discover::kubelet::QosClass;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

/// The workload image: `/testload` (entrypoint), `/pause` (the same binary), busybox in `/bin`.
pub const IMAGE: &str = "ngcri.local/testload:1";
/// A sandbox image that runs `pause`, like the kubelet's.
pub const PAUSE_IMAGE: &str = "ngcri.local/pause:1";
/// A sandbox image whose process is not `pause` (comm `testload`).
pub const OTHER_SANDBOX_IMAGE: &str = "ngcri.local/sandbox-testload:1";
/// Every CRI call and every wait below is bounded by this.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// The shims' socket dir is fixed in containerd 1.6 (`/run/containerd/s/<hash of our address>`).
const SHIM_RUN_DIR: &str = "/run/containerd";
const CONTAINER_EXITED: i32 = 2;
/// A probe's client-side deadline beyond its own timeout (the kubelet allows 2 min).
const PROBE_SLACK: Duration = Duration::from_secs(10);

/// Why the containerd tier cannot run here, if it cannot: root and the tools are needed.
pub fn unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("the containerd tier needs root (CI runs as root)".into());
    }
    for tool in [
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "runc",
        "ip",
        "tar",
        "ldd",
        "nsenter",
        "nft",
        "conntrack",
    ] {
        if which(tool).is_none() {
            return Some(format!("{tool} is not installed"));
        }
    }
    for f in [
        "/bin/busybox",
        "/usr/lib/cni/bridge",
        "/usr/lib/cni/host-local",
    ] {
        if !Path::new(f).exists() {
            return Some(format!(
                "{f} is missing (busybox-static, containernetworking-plugins)"
            ));
        }
    }
    if !Path::new("/proc/sys/net/netfilter/nf_conntrack_max").exists() {
        return Some("nf_conntrack is not loaded".into());
    }
    None
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// A sandbox this test made: its CRI id, the node's pod (names, uid, cgroup, log dir) and the
/// config every CreateContainer repeats.
pub struct CriPod {
    pub id: String,
    pub pod: Pod,
    pub config: cri::PodSandboxConfig,
}

/// A container this test made: its log file (`<log_directory>/<name>/<attempt>.log`) and the
/// `/var/log/containers`-style link to it.
#[derive(Clone)]
pub struct CriContainer {
    pub id: String,
    pub name: String,
    pub attempt: u32,
    pub log: PathBuf,
    pub link: PathBuf,
}

/// What a container runs and is given.
#[derive(Default)]
pub struct Spec<'a> {
    /// Replaces the image's entrypoint when not empty (the pod spec's `command`).
    pub command: &'a [&'a str],
    pub args: &'a [&'a str],
    pub memory_limit: Option<u64>,
}

pub struct Containerd {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    rt: tokio::runtime::Runtime,
    rs: RuntimeServiceClient<Channel>,
    /// The test node's parent cgroup name, cleaned in every hierarchy on drop.
    parent: String,
    /// Whether `/run/containerd` (where the shims put their sockets) was there before us.
    had_run_dir: bool,
    /// The network namespace containerd runs in (its "node" network), if not the test's own.
    netns: Option<PathBuf>,
    pub started_in: Duration,
}

impl Containerd {
    /// Starts containerd with `sandbox_image`, waits for its CRI service, builds and imports the
    /// images.
    pub fn start(node: &TestNode, sandbox_image: &str) -> Containerd {
        Containerd::start_in(node, sandbox_image, None)
    }

    /// `start`, with containerd (and so its shims and every `hostNetwork` pod) in the network
    /// namespace `netns` (a `/run/netns/<name>` the test made): a host-network pod then binds
    /// its ports there, never on the real node.
    pub fn start_in(node: &TestNode, sandbox_image: &str, netns: Option<PathBuf>) -> Containerd {
        let t0 = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix("ngcri-")
            .tempdir()
            .expect("tempdir");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let had_run_dir = Path::new(SHIM_RUN_DIR).exists();
        let (child, rs) = launch(dir.path(), &rt, sandbox_image, netns.as_deref());
        let mut c = Containerd {
            dir,
            child: Some(child),
            rt,
            rs,
            parent: node.name.clone(),
            had_run_dir,
            netns,
            started_in: Duration::ZERO,
        };
        c.import_images();
        c.started_in = t0.elapsed();
        c
    }

    /// Stops the containerd process (sandboxes and shims keep running, as on a real node) and
    /// starts it again on the same root and state with another sandbox image.
    pub fn restart(&mut self, sandbox_image: &str) {
        self.stop_daemon();
        let (child, rs) = launch(
            self.dir.path(),
            &self.rt,
            sandbox_image,
            self.netns.as_deref(),
        );
        self.child = Some(child);
        self.rs = rs;
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    fn call<T, F>(&self, what: &str, f: F) -> T
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match self
            .rt
            .block_on(async { tokio::time::timeout(CALL_TIMEOUT, f).await })
        {
            Ok(Ok(r)) => r.into_inner(),
            Ok(Err(s)) => panic!(
                "CRI {what}: {s}\ncontainerd log tail:\n{}",
                tail(&self.log_text(), 30)
            ),
            Err(_) => panic!("CRI {what}: no answer in {CALL_TIMEOUT:?}"),
        }
    }

    fn import_images(&self) {
        let tar = build_images(self.dir.path());
        let sock = self.socket();
        let out = Command::new("ctr")
            .args(["--address", &sock.display().to_string(), "-n", "k8s.io"])
            .args(["images", "import", &tar.display().to_string()])
            .output()
            .expect("spawn ctr");
        assert!(
            out.status.success(),
            "ctr images import: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The CRI plugin learns of imported images from containerd's events: wait for all three.
        let deadline = Instant::now() + CALL_TIMEOUT;
        for image in [IMAGE, PAUSE_IMAGE, OTHER_SANDBOX_IMAGE] {
            loop {
                let mut is = ImageServiceClient::new(self.rs_channel());
                let st = self.call(
                    "ImageStatus",
                    is.image_status(cri::ImageStatusRequest {
                        image: Some(cri::ImageSpec {
                            image: image.into(),
                            ..Default::default()
                        }),
                        verbose: false,
                    }),
                );
                if st.image.is_some() {
                    break;
                }
                assert!(Instant::now() < deadline, "CRI never saw image {image}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn rs_channel(&self) -> Channel {
        connect(&self.rt, &self.socket()).expect("CRI channel")
    }

    /// Like the kubelet: the pod cgroup and log dir first, then RunPodSandbox with
    /// `log_directory` and `cgroup_parent`, pod network namespace, per-container pid namespace.
    pub fn run_pod(&mut self, node: &mut TestNode, namespace: &str, name: &str) -> CriPod {
        self.run_pod_while(node, namespace, name, || {})
    }

    /// `run_pod`, calling `during` over and over while RunPodSandbox is in flight (the call runs
    /// on its own thread and connection): what a tick sees while runc creates the sandbox.
    pub fn run_pod_while(
        &mut self,
        node: &mut TestNode,
        namespace: &str,
        name: &str,
        mut during: impl FnMut(),
    ) -> CriPod {
        let pod = node.pod(Driver::Cgroupfs, QosClass::Burstable, namespace, name);
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: pod.uid.clone(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            hostname: name.chars().take(63).collect(),
            log_directory: node.pod_log_dir(&pod).display().to_string(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: node.rel(&pod.cgroup),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(namespaces()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let sock = self.socket();
        let req = cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let call = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let ch = connect(&rt, &sock).map_err(|e| e.to_string())?;
            let mut rs = RuntimeServiceClient::new(ch);
            rt.block_on(async {
                match tokio::time::timeout(CALL_TIMEOUT, rs.run_pod_sandbox(req)).await {
                    Ok(Ok(r)) => Ok(r.into_inner().pod_sandbox_id),
                    Ok(Err(s)) => Err(s.to_string()),
                    Err(_) => Err(format!("no answer in {CALL_TIMEOUT:?}")),
                }
            })
        });
        // Bounded by the call's own timeout.
        while !call.is_finished() {
            during();
            std::thread::sleep(Duration::from_millis(1));
        }
        let id = match call.join() {
            Ok(Ok(id)) => id,
            Ok(Err(e)) => panic!(
                "CRI RunPodSandbox: {e}\ncontainerd log tail:\n{}",
                tail(&self.log_text(), 30)
            ),
            Err(_) => panic!("RunPodSandbox thread panicked"),
        };
        CriPod { id, pod, config }
    }

    /// CreateContainer (`log_path` `<name>/<attempt>.log`), the `/var/log/containers` link, then
    /// StartContainer, as the kubelet does.
    pub fn run_container(
        &mut self,
        node: &TestNode,
        pod: &CriPod,
        name: &str,
        attempt: u32,
        spec: Spec,
    ) -> CriContainer {
        let dir = node.pod_log_dir(&pod.pod).join(name);
        std::fs::create_dir_all(&dir).expect("container log dir");
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt,
            }),
            image: Some(cri::ImageSpec {
                image: IMAGE.into(),
                ..Default::default()
            }),
            command: spec.command.iter().map(|a| a.to_string()).collect(),
            args: spec.args.iter().map(|a| a.to_string()).collect(),
            log_path: format!("{name}/{attempt}.log"),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources {
                    memory_limit_in_bytes: spec.memory_limit.map_or(0, |b| b as i64),
                    ..Default::default()
                }),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(namespaces()),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        };
        let id = self
            .call(
                "CreateContainer",
                self.rs
                    .clone()
                    .create_container(cri::CreateContainerRequest {
                        pod_sandbox_id: pod.id.clone(),
                        config: Some(config),
                        sandbox_config: Some(pod.config.clone()),
                    }),
            )
            .container_id;
        let log = dir.join(format!("{attempt}.log"));
        let link = node
            .container_logs()
            .join(crate::common::kubelet::container_log_link(
                &pod.pod.namespace,
                &pod.pod.name,
                name,
                &id,
            ));
        std::os::unix::fs::symlink(&log, &link).expect("container log link");
        self.call(
            "StartContainer",
            self.rs.clone().start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            }),
        );
        CriContainer {
            id,
            name: name.into(),
            attempt,
            log,
            link,
        }
    }

    /// Imports an OCI archive (every platform of its index) into this containerd's `k8s.io`
    /// namespace, as `import_images` does, and waits (bounded) until the CRI sees `image`; the
    /// image's id (what the kubelet passes to CreateContainer after its `IfNotPresent` check).
    pub fn import_archive(&self, tar: &Path, image: &str) -> String {
        let sock = self.socket();
        let out = Command::new("ctr")
            .args(["--address", &sock.display().to_string(), "-n", "k8s.io"])
            .args(["images", "import", "--all-platforms"])
            .arg(tar)
            .output()
            .expect("spawn ctr");
        assert!(
            out.status.success(),
            "ctr images import {}: {}{}",
            tar.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            if let Some(img) = self.image_status(image) {
                return img.id;
            }
            assert!(
                Instant::now() < deadline,
                "CRI never saw image {image} after importing {}: {}",
                tar.display(),
                String::from_utf8_lossy(&out.stdout)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// ImageStatus: the image if this containerd has it (the kubelet's `IfNotPresent` check).
    pub fn image_status(&self, image: &str) -> Option<cri::Image> {
        let mut is = ImageServiceClient::new(self.rs_channel());
        self.call(
            "ImageStatus",
            is.image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                verbose: false,
            }),
        )
        .image
    }

    /// RunPodSandbox with a config the caller built (a translated pod spec); the sandbox id.
    pub fn run_sandbox(&self, config: &cri::PodSandboxConfig) -> String {
        self.call(
            "RunPodSandbox",
            self.rs.clone().run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            }),
        )
        .pod_sandbox_id
    }

    /// CreateContainer then StartContainer with a config the caller built; the container id.
    pub fn create_and_start(
        &self,
        sandbox: &str,
        config: cri::ContainerConfig,
        sandbox_config: &cri::PodSandboxConfig,
    ) -> String {
        let id = self
            .call(
                "CreateContainer",
                self.rs
                    .clone()
                    .create_container(cri::CreateContainerRequest {
                        pod_sandbox_id: sandbox.into(),
                        config: Some(config),
                        sandbox_config: Some(sandbox_config.clone()),
                    }),
            )
            .container_id;
        self.call(
            "StartContainer",
            self.rs.clone().start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            }),
        );
        id
    }

    /// ContainerStatus by id.
    pub fn status_of(&self, id: &str) -> cri::ContainerStatus {
        self.call(
            "ContainerStatus",
            self.rs
                .clone()
                .container_status(cri::ContainerStatusRequest {
                    container_id: id.into(),
                    verbose: false,
                }),
        )
        .status
        .expect("container status")
    }

    /// StopContainer by id with the kubelet's grace period (seconds); blocks until it returns.
    pub fn stop_id(&self, id: &str, grace: i64) {
        self.call(
            "StopContainer",
            self.rs.clone().stop_container(cri::StopContainerRequest {
                container_id: id.into(),
                timeout: grace,
            }),
        );
    }

    /// StopPodSandbox then RemovePodSandbox (its containers go with it).
    pub fn remove_sandbox(&self, id: &str) {
        self.call(
            "StopPodSandbox",
            self.rs
                .clone()
                .stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: id.into(),
                }),
        );
        self.call(
            "RemovePodSandbox",
            self.rs
                .clone()
                .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                    pod_sandbox_id: id.into(),
                }),
        );
    }

    pub fn status(&self, c: &CriContainer) -> cri::ContainerStatus {
        self.call(
            "ContainerStatus",
            self.rs
                .clone()
                .container_status(cri::ContainerStatusRequest {
                    container_id: c.id.clone(),
                    verbose: false,
                }),
        )
        .status
        .expect("container status")
    }

    /// Waits (bounded) for the container to exit; its final status.
    pub fn wait_exited(&self, c: &CriContainer) -> cri::ContainerStatus {
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let st = self.status(c);
            if st.state == CONTAINER_EXITED {
                return st;
            }
            assert!(Instant::now() < deadline, "{} never exited: {st:?}", c.name);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop_container(&self, c: &CriContainer) {
        self.call(
            "StopContainer",
            self.rs.clone().stop_container(cri::StopContainerRequest {
                container_id: c.id.clone(),
                timeout: 10,
            }),
        );
    }

    /// ExecSync in the container (bounded by its timeout); panics unless it exits 0.
    pub fn exec(&self, c: &CriContainer, cmd: &[&str]) -> String {
        let r = self.call(
            "ExecSync",
            self.rs.clone().exec_sync(cri::ExecSyncRequest {
                container_id: c.id.clone(),
                cmd: cmd.iter().map(|a| a.to_string()).collect(),
                timeout: 30,
            }),
        );
        assert_eq!(
            r.exit_code,
            0,
            "exec {cmd:?} in {}: {}",
            c.name,
            String::from_utf8_lossy(&r.stderr)
        );
        String::from_utf8_lossy(&r.stdout).into_owned()
    }

    /// One exec liveness probe as the kubelet's prober runs it: ExecSync with the probe's
    /// `timeout` (whole seconds, at least 1, as the CRI takes it) on its own thread and
    /// connection, bounded on the client side by `timeout + PROBE_SLACK` (the kubelet allows
    /// `timeout + 2 min`), calling `during` meanwhile (agent ticks go on while a probe hangs).
    /// The verdict as the kubelet's exec prober reads it, and how long the call took.
    pub fn probe_while(
        &self,
        c: &CriContainer,
        cmd: &[String],
        timeout: Duration,
        mut during: impl FnMut(),
    ) -> (ProbeResult, Duration) {
        let t0 = Instant::now();
        let sock = self.socket();
        let secs = timeout.as_secs().max(1);
        let req = cri::ExecSyncRequest {
            container_id: c.id.clone(),
            cmd: cmd.to_vec(),
            timeout: secs as i64,
        };
        let deadline = Duration::from_secs(secs) + PROBE_SLACK;
        let call = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| ProbeResult::Unknown(e.to_string()))?;
            let ch = connect(&rt, &sock).map_err(|e| ProbeResult::Unknown(e.to_string()))?;
            let mut rs = RuntimeServiceClient::new(ch);
            rt.block_on(async {
                match tokio::time::timeout(deadline, rs.exec_sync(req)).await {
                    Ok(Ok(r)) => Ok(r.into_inner()),
                    // The kubelet reads DeadlineExceeded as the probe's timeout: a failure.
                    Ok(Err(s)) if s.code() == tonic::Code::DeadlineExceeded => {
                        Err(ProbeResult::TimedOut(s.message().to_owned()))
                    }
                    Ok(Err(s)) => Err(ProbeResult::Unknown(format!(
                        "{:?}: {}",
                        s.code(),
                        s.message()
                    ))),
                    Err(_) => Err(ProbeResult::TimedOut(format!(
                        "no answer in {deadline:?} (client deadline)"
                    ))),
                }
            })
        });
        // Bounded by the client deadline above.
        while !call.is_finished() {
            during();
            std::thread::sleep(Duration::from_millis(5));
        }
        let r = match call.join() {
            Ok(Ok(r)) if r.exit_code == 0 => ProbeResult::Success,
            Ok(Ok(r)) => ProbeResult::Failed(r.exit_code),
            Ok(Err(r)) => r,
            Err(_) => panic!("probe thread panicked"),
        };
        (r, t0.elapsed())
    }

    /// StopContainer with a grace period (the kubelet's kill) on its own thread and connection,
    /// bounded on the client side by the grace period plus `CALL_TIMEOUT`, calling `during`
    /// meanwhile; how long it took.
    pub fn kill_container_while(
        &self,
        c: &CriContainer,
        grace: Duration,
        mut during: impl FnMut(),
    ) -> Duration {
        let t0 = Instant::now();
        let sock = self.socket();
        let req = cri::StopContainerRequest {
            container_id: c.id.clone(),
            timeout: grace.as_secs() as i64,
        };
        let bound = grace + CALL_TIMEOUT;
        let call = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let ch = connect(&rt, &sock).map_err(|e| e.to_string())?;
            let mut rs = RuntimeServiceClient::new(ch);
            rt.block_on(async {
                match tokio::time::timeout(bound, rs.stop_container(req)).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(s)) => Err(s.to_string()),
                    Err(_) => Err(format!("no answer in {bound:?}")),
                }
            })
        });
        // Bounded by the call's own timeout.
        while !call.is_finished() {
            during();
            std::thread::sleep(Duration::from_millis(5));
        }
        match call.join() {
            Ok(Ok(())) => t0.elapsed(),
            Ok(Err(e)) => panic!(
                "CRI StopContainer: {e}\ncontainerd log tail:\n{}",
                tail(&self.log_text(), 30)
            ),
            Err(_) => panic!("StopContainer thread panicked"),
        }
    }

    /// Kubelet garbage collection of a dead container: its log file and link, then the container.
    pub fn remove_container(&self, c: &CriContainer) {
        for p in [&c.log, &c.link] {
            if let Err(e) = std::fs::remove_file(p) {
                assert!(
                    e.kind() == std::io::ErrorKind::NotFound,
                    "{}: {e}",
                    p.display()
                );
            }
        }
        self.call(
            "RemoveContainer",
            self.rs
                .clone()
                .remove_container(cri::RemoveContainerRequest {
                    container_id: c.id.clone(),
                }),
        );
    }

    /// Kubelet log rotation: rename `<attempt>.log` to `<attempt>.log.<stamp>`, then
    /// ReopenContainerLog so containerd writes a new file at the old path.
    pub fn rotate_log(&self, c: &CriContainer, stamp: &str) -> PathBuf {
        let rotated = c.log.with_extension(format!("log.{stamp}"));
        std::fs::rename(&c.log, &rotated).expect("rotate log");
        self.call(
            "ReopenContainerLog",
            self.rs
                .clone()
                .reopen_container_log(cri::ReopenContainerLogRequest {
                    container_id: c.id.clone(),
                }),
        );
        rotated
    }

    /// Pod deletion as the kubelet does it: StopContainer for each (SIGTERM, 10 s grace),
    /// StopPodSandbox, the containers' logs and links, RemovePodSandbox, the pod log dir and the
    /// pod cgroup. The containers' exit codes after their SIGTERM.
    pub fn delete_pod(
        &self,
        node: &TestNode,
        pod: &CriPod,
        containers: &[&CriContainer],
    ) -> Vec<i32> {
        let mut codes = Vec::new();
        for c in containers {
            self.stop_container(c);
            codes.push(self.wait_exited(c).exit_code);
        }
        self.call(
            "StopPodSandbox",
            self.rs
                .clone()
                .stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: pod.id.clone(),
                }),
        );
        for c in containers {
            self.remove_container(c);
        }
        self.call(
            "RemovePodSandbox",
            self.rs
                .clone()
                .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                    pod_sandbox_id: pod.id.clone(),
                }),
        );
        let dir = node.pod_log_dir(&pod.pod);
        std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        remove_tree(&node.rel(&pod.pod.cgroup));
        codes
    }

    /// The pod's address as containerd reports it (PodSandboxStatus).
    pub fn pod_ip(&self, pod: &CriPod) -> String {
        let st = self.call(
            "PodSandboxStatus",
            self.rs
                .clone()
                .pod_sandbox_status(cri::PodSandboxStatusRequest {
                    pod_sandbox_id: pod.id.clone(),
                    verbose: false,
                }),
        );
        st.status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default()
    }

    /// Pid of the sandbox's process (its cgroup's `cgroup.procs` in the freezer hierarchy).
    pub fn sandbox_pid(&self, node: &TestNode, pod: &CriPod) -> u32 {
        let cg = format!("{}/{}", pod.pod.cgroup, pod.id);
        let c = Container {
            pod: pod.pod.clone(),
            name: "POD".into(),
            id: pod.id.clone(),
            restart: 0,
            cgroup: cg,
        };
        let pids = node.procs(&c);
        assert_eq!(pids.len(), 1, "sandbox {} runs {pids:?}", pod.id);
        pids[0]
    }

    /// Waits (bounded) until the container's log file holds a line containing `needle`.
    pub fn wait_log(&self, c: &CriContainer, needle: &str) {
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let text = std::fs::read_to_string(&c.log).unwrap_or_default();
            if text.lines().any(|l| l.contains(needle)) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} never logged {needle:?}: {text:?}\n{:?}",
                c.name,
                self.status(c)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop_daemon(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Our own child: SIGTERM, then SIGKILL if it does not stop in 10 s.
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        if let Err(e) = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM) {
            eprintln!("cleanup: SIGTERM containerd {pid}: {e}");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Stops and removes every sandbox this (private) containerd knows.
    fn remove_all_sandboxes(&mut self) {
        let mut rs = self.rs.clone();
        let list = self.rt.block_on(async {
            let f = rs.list_pod_sandbox(cri::ListPodSandboxRequest { filter: None });
            tokio::time::timeout(CALL_TIMEOUT, f).await
        });
        let items = match list {
            Ok(Ok(r)) => r.into_inner().items,
            other => {
                eprintln!("cleanup: ListPodSandbox: {other:?}");
                return;
            }
        };
        for s in items {
            let id = s.id;
            let mut rs = self.rs.clone();
            let r = self.rt.block_on(async {
                let f = async {
                    rs.stop_pod_sandbox(cri::StopPodSandboxRequest {
                        pod_sandbox_id: id.clone(),
                    })
                    .await?;
                    rs.remove_pod_sandbox(cri::RemovePodSandboxRequest {
                        pod_sandbox_id: id.clone(),
                    })
                    .await
                };
                tokio::time::timeout(CALL_TIMEOUT, f).await
            });
            if !matches!(r, Ok(Ok(_))) {
                eprintln!("cleanup: sandbox {id}: {r:?}");
            }
        }
    }

    /// Shims serving our socket that outlived their sandbox (only after a failed removal).
    fn kill_our_shims(&self) {
        let sock = self.socket().display().to_string();
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return;
        };
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            let shim = args
                .first()
                .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"));
            let ours = args
                .windows(2)
                .any(|w| w[0] == b"-address" && w[1] == sock.as_bytes());
            if shim && ours {
                eprintln!("cleanup: killing leftover shim {pid}");
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }

    /// Detaches whatever is still mounted under our temp dir (rootfs, shm, netns), deepest first.
    fn unmount_all(&self) {
        let base = self.dir.path().display().to_string();
        let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return;
        };
        let mut points: Vec<String> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(&format!("{base}/")))
            .map(|m| m.replace("\\040", " "))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            if let Err(e) = nix::mount::umount2(p.as_str(), nix::mount::MntFlags::MNT_DETACH) {
                eprintln!("cleanup: umount {p}: {e}");
            }
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // A container left frozen (a failed test, a hold not released) cannot die on v1.
        thaw_tree(&format!("/{}", self.parent));
        if self.child.is_some() {
            self.remove_all_sandboxes();
        }
        self.stop_daemon();
        self.kill_our_shims();
        self.unmount_all();
        let br = bridge_name();
        // With `start_in`, the bridge is in that namespace and goes with it.
        if Path::new("/sys/class/net").join(&br).exists() {
            match Command::new("ip").args(["link", "del", &br]).status() {
                Ok(st) if st.success() => {}
                other => eprintln!("cleanup: ip link del {br}: {other:?}"),
            }
        }
        remove_tree(&format!("/{}", self.parent));
        if !self.had_run_dir {
            // Only empty dirs go: a socket left there belongs to a shim that is not ours.
            for d in [format!("{SHIM_RUN_DIR}/s"), SHIM_RUN_DIR.to_owned()] {
                let _ = std::fs::remove_dir(d);
            }
        }
    }
}

// === a kubelet's liveness prober and restarter ===

/// What the kubelet's exec prober makes of one ExecSync (pkg/probe/exec, remote runtime).
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeResult {
    Success,
    /// The command exited with this code: a failure.
    Failed(i32),
    /// DeadlineExceeded, from the runtime's own timeout or the client's deadline: a failure.
    TimedOut(String),
    /// Any other error: the kubelet's prober says `Unknown` and its worker throws the result
    /// away, neither a success nor a failure.
    Unknown(String),
    /// An HTTP probe's connection failed (refused, reset): a failure.
    HttpError(String),
}

impl ProbeResult {
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            ProbeResult::Failed(_) | ProbeResult::TimedOut(_) | ProbeResult::HttpError(_)
        )
    }
}

/// One HTTP GET as the kubelet's prober sends it, from the network namespace `netns`, on its
/// own thread (setns changes only that thread), bounded by `timeout` as a whole.
pub fn http_probe_while(
    netns: &Path,
    addr: std::net::SocketAddr,
    path: &str,
    timeout: Duration,
    mut during: impl FnMut(),
) -> (ProbeResult, Duration) {
    use std::io::{Read, Write};
    let t0 = Instant::now();
    let netns = netns.to_path_buf();
    let path = path.to_owned();
    let call = std::thread::spawn(move || -> Result<u16, (bool, String)> {
        let f = std::fs::File::open(&netns)
            .map_err(|e| (false, format!("{}: {e}", netns.display())))?;
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| (false, format!("setns: {e}")))?;
        let deadline = Instant::now() + timeout;
        let left = || {
            deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        };
        let timed_out = |e: std::io::Error| {
            let t = matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            );
            (t, e.to_string())
        };
        let mut s = std::net::TcpStream::connect_timeout(&addr, left()).map_err(timed_out)?;
        s.set_write_timeout(Some(left())).map_err(timed_out)?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: kube-probe/1.30\r\nConnection: close\r\n\r\n")
            .map_err(timed_out)?;
        let mut head = Vec::new();
        let mut buf = [0u8; 256];
        while !head.windows(2).any(|w| w == b"\r\n") {
            s.set_read_timeout(Some(left())).map_err(timed_out)?;
            let k = s.read(&mut buf).map_err(timed_out)?;
            if k == 0 || Instant::now() >= deadline {
                break;
            }
            head.extend_from_slice(&buf[..k]);
        }
        String::from_utf8_lossy(&head)
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or((
                false,
                format!("no status line: {:?}", String::from_utf8_lossy(&head)),
            ))
    });
    // Bounded by the timeout above.
    while !call.is_finished() {
        during();
        std::thread::sleep(Duration::from_millis(5));
    }
    let r = match call.join() {
        Ok(Ok(code)) if (200..400).contains(&code) => ProbeResult::Success,
        Ok(Ok(code)) => ProbeResult::Failed(i32::from(code)),
        Ok(Err((true, e))) => ProbeResult::TimedOut(e),
        Ok(Err((false, e))) => ProbeResult::HttpError(e),
        Err(_) => panic!("HTTP probe thread panicked"),
    };
    (r, t0.elapsed())
}

fn loopback(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

/// A container's exec liveness probe and its restart (policy Always), as a pod spec gives them.
#[derive(Debug, Clone)]
pub enum Probe {
    /// `exec`: ExecSync of this command; exit 0 passes.
    Exec(Vec<String>),
    /// `httpGet` on this port and path: a status in 200..400 passes. Sent from the pod's
    /// network namespace to its loopback (the test host has no route to the pod's address).
    Http { port: u16, path: String },
}

#[derive(Debug, Clone)]
pub struct Liveness {
    pub probe: Probe,
    pub initial_delay: Duration,
    pub period: Duration,
    /// `timeoutSeconds` (the CRI takes whole seconds, at least 1).
    pub timeout: Duration,
    pub failure_threshold: u32,
    /// `terminationGracePeriodSeconds`: StopContainer's timeout on a liveness kill.
    pub grace: Duration,
    /// Crash-loop back-off before every restart but the first, doubling up to `backoff_max`
    /// (the kubelet's 10 s and 5 min, scaled down by the tests).
    pub backoff: Duration,
    pub backoff_max: Duration,
}

/// One thing the kubelet-like loop did, and when.
#[derive(Debug, Clone)]
pub enum KubeletEvent {
    Probe {
        attempt: u32,
        result: ProbeResult,
        took: Duration,
        /// Consecutive failures after this probe.
        failures: u32,
    },
    /// The liveness kill: StopContainer with the grace period, and the exit it led to.
    Killed {
        attempt: u32,
        took: Duration,
        exit_code: i32,
        reason: String,
    },
    /// The next instance, `attempt = restartCount + 1`, in the same sandbox.
    Started { attempt: u32, id: String },
}

/// The kubelet's handling of one container of a pod: probes every `period` (consecutive
/// failures counted, an `Unknown` result thrown away), the kill at `failure_threshold`, then
/// the restart with `restartCount + 1` after the back-off. Driven by the test's loop (`step`):
/// nothing runs on its own.
pub struct Kubelet {
    pub liveness: Liveness,
    command: Vec<String>,
    args: Vec<String>,
    /// The pod's network namespace, where HTTP probes are sent from.
    netns: PathBuf,
    pub current: CriContainer,
    /// Instances killed so far, oldest first.
    pub dead: Vec<CriContainer>,
    pub restart_count: u32,
    failures: u32,
    next_probe: Instant,
    restart_at: Option<Instant>,
    next_backoff: Duration,
    pub events: Vec<(Instant, KubeletEvent)>,
}

impl Kubelet {
    /// Creates and starts attempt 0 of `name` running `command` (empty: the image's
    /// entrypoint) with `args`.
    pub fn start(
        ctd: &mut Containerd,
        node: &TestNode,
        pod: &CriPod,
        name: &str,
        (command, args): (&[&str], &[&str]),
        liveness: Liveness,
    ) -> Kubelet {
        let netns = PathBuf::from(format!("/proc/{}/ns/net", ctd.sandbox_pid(node, pod)));
        let current = ctd.run_container(
            node,
            pod,
            name,
            0,
            Spec {
                command,
                args,
                ..Default::default()
            },
        );
        let now = Instant::now();
        Kubelet {
            next_probe: now + liveness.initial_delay,
            liveness,
            netns,
            command: command.iter().map(|a| a.to_string()).collect(),
            args: args.iter().map(|a| a.to_string()).collect(),
            events: vec![(
                now,
                KubeletEvent::Started {
                    attempt: 0,
                    id: current.id.clone(),
                },
            )],
            current,
            dead: Vec::new(),
            restart_count: 0,
            failures: 0,
            restart_at: None,
            next_backoff: Duration::ZERO,
        }
    }

    /// One pass: a restart that is due, or a probe that is due (and the kill if it reaches
    /// the threshold). `during` runs while a CRI call is in flight. The events of this pass.
    pub fn step(
        &mut self,
        ctd: &mut Containerd,
        node: &TestNode,
        pod: &CriPod,
        mut during: impl FnMut(),
    ) -> Vec<KubeletEvent> {
        let first = self.events.len();
        let now = Instant::now();
        if let Some(at) = self.restart_at {
            if now >= at {
                self.restart(ctd, node, pod);
            }
        } else if now >= self.next_probe {
            let (result, took) = match &self.liveness.probe {
                Probe::Exec(cmd) => {
                    ctd.probe_while(&self.current, cmd, self.liveness.timeout, &mut during)
                }
                Probe::Http { port, path } => http_probe_while(
                    &self.netns,
                    loopback(*port),
                    path,
                    self.liveness.timeout,
                    &mut during,
                ),
            };
            match &result {
                ProbeResult::Success => self.failures = 0,
                r if r.is_failure() => self.failures += 1,
                _ => {}
            }
            // The kubelet's worker runs every period, from the start of the last run.
            self.next_probe = now + self.liveness.period;
            self.log(KubeletEvent::Probe {
                attempt: self.current.attempt,
                result,
                took,
                failures: self.failures,
            });
            if self.failures >= self.liveness.failure_threshold {
                self.kill(ctd, &mut during);
            }
        }
        self.events[first..]
            .iter()
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// One probe now, outside the count (the test's control that the probe itself works).
    pub fn probe_now(&self, ctd: &Containerd) -> ProbeResult {
        match &self.liveness.probe {
            Probe::Exec(cmd) => {
                ctd.probe_while(&self.current, cmd, self.liveness.timeout, || {})
                    .0
            }
            Probe::Http { port, path } => {
                http_probe_while(
                    &self.netns,
                    loopback(*port),
                    path,
                    self.liveness.timeout,
                    || {},
                )
                .0
            }
        }
    }

    fn log(&mut self, e: KubeletEvent) {
        self.events.push((Instant::now(), e));
    }

    fn kill(&mut self, ctd: &Containerd, during: &mut impl FnMut()) {
        let took = ctd.kill_container_while(&self.current, self.liveness.grace, during);
        let st = ctd.wait_exited(&self.current);
        self.log(KubeletEvent::Killed {
            attempt: self.current.attempt,
            took,
            exit_code: st.exit_code,
            reason: st.reason,
        });
        self.failures = 0;
        self.restart_at = Some(Instant::now() + self.next_backoff);
        self.next_backoff = if self.next_backoff.is_zero() {
            self.liveness.backoff
        } else {
            (self.next_backoff * 2).min(self.liveness.backoff_max)
        };
    }

    fn restart(&mut self, ctd: &mut Containerd, node: &TestNode, pod: &CriPod) {
        self.restart_at = None;
        self.restart_count += 1;
        let command: Vec<&str> = self.command.iter().map(String::as_str).collect();
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        let next = ctd.run_container(
            node,
            pod,
            &self.current.name.clone(),
            self.restart_count,
            Spec {
                command: &command,
                args: &args,
                ..Default::default()
            },
        );
        let old = std::mem::replace(&mut self.current, next);
        self.dead.push(old);
        self.next_probe = Instant::now() + self.liveness.initial_delay;
        self.log(KubeletEvent::Started {
            attempt: self.restart_count,
            id: self.current.id.clone(),
        });
    }
}

/// The CNI bridge of this test process (at most 15 bytes), deleted on drop.
/// The node's view of a CRI container (`<pod cgroup>/<id>`), for the kernel-side readers.
pub fn cg(pod: &CriPod, c: &CriContainer) -> Container {
    Container {
        pod: pod.pod.clone(),
        name: c.name.clone(),
        id: c.id.clone(),
        restart: c.attempt,
        cgroup: format!("{}/{}", pod.pod.cgroup, c.id),
    }
}

pub fn bridge_name() -> String {
    format!("ngcri{}", std::process::id())
}

fn namespaces() -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: cri::NamespaceMode::Pod as i32,
        pid: cri::NamespaceMode::Container as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// Runs `args` in the network namespace of `pid` (nsenter); its stdout, or a panic.
pub fn nsenter(pid: u32, args: &[&str]) -> String {
    let net = format!("--net=/proc/{pid}/ns/net");
    let out = Command::new("nsenter")
        .arg(&net)
        .args(args)
        .output()
        .expect("spawn nsenter");
    assert!(
        out.status.success(),
        "nsenter {net} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// IPv6 off (neighbour discovery would make entries), then a rule that needs conntrack, so the
/// pod's namespace tracks its flows; UDP entries kept 10 min so none expires mid-test.
pub fn enable_conntrack(pid: u32) {
    for k in ["all", "default", "lo", "eth0"] {
        nsenter(
            pid,
            &[
                "sysctl",
                "-q",
                "-w",
                &format!("net.ipv6.conf.{k}.disable_ipv6=1"),
            ],
        );
    }
    nsenter(pid, &["nft", "add", "table", "inet", "ngcri"]);
    nsenter(
        pid,
        &[
            "nft",
            "add",
            "chain",
            "inet",
            "ngcri",
            "out",
            "{ type filter hook output priority 0; }",
        ],
    );
    nsenter(
        pid,
        &[
            "nft", "add", "rule", "inet", "ngcri", "out", "ct", "state", "new", "counter",
        ],
    );
    for t in [
        "net.netfilter.nf_conntrack_udp_timeout=600",
        "net.netfilter.nf_conntrack_udp_timeout_stream=600",
    ] {
        nsenter(pid, &["sysctl", "-q", "-w", t]);
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Writes the config, starts containerd (its log in `containerd.log`) and connects once the CRI
/// service answers `Version` (bounded).
fn launch(
    dir: &Path,
    rt: &tokio::runtime::Runtime,
    sandbox_image: &str,
    netns: Option<&Path>,
) -> (Child, RuntimeServiceClient<Channel>) {
    let cni = dir.join("cni");
    std::fs::create_dir_all(&cni).expect("cni dir");
    // containerd's CRI wants an address on the pod's eth0, so loopback alone is refused: a
    // bridge of our own without a host address (`isGateway` false) and no route, addresses from
    // the benchmarking range (RFC 2544) held in our temp dir. Nothing is ever sent there: the
    // tests talk on the pod's loopback only.
    let conf = serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "ngcri",
        "plugins": [{
            "type": "bridge",
            "bridge": bridge_name(),
            "isGateway": false,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "198.18.0.0/24"}]],
                "dataDir": dir.join("ipam").display().to_string(),
            },
        }, {"type": "loopback"}],
    });
    std::fs::write(cni.join("10-ngcri.conflist"), conf.to_string()).expect("cni conf");
    let d = dir.display();
    let config = format!(
        r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  # The sandbox's -998 is refused where the suite itself may not lower its score (CI sandboxes).
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni"
"#
    );
    let cfg = dir.join("config.toml");
    std::fs::write(&cfg, config).expect("containerd config");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("containerd.log"))
        .expect("containerd log");
    let err = log.try_clone().expect("log fd");
    // NGCRI_LOG_LEVEL=debug puts runc's and the shims' messages in the log too.
    let level = std::env::var("NGCRI_LOG_LEVEL").unwrap_or_else(|_| "info".into());
    let mut cmd = Command::new("containerd");
    cmd.arg("--config")
        .arg(&cfg)
        .args(["--log-level", &level])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err);
    if let Some(ns) = netns {
        // Only the network namespace changes (not the mounts, as `ip netns exec` would: its
        // fresh /sys has no cgroup mounts for runc).
        let f = std::fs::File::open(ns).unwrap_or_else(|e| panic!("{}: {e}", ns.display()));
        use std::os::unix::process::CommandExt;
        // SAFETY: setns on an fd opened before the fork is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)
            });
        }
    }
    let child = cmd.spawn().expect("spawn containerd");
    // Until it is handed over, a panic here (it exits, never answers) still stops it.
    let mut guard = KillOnDrop(Some(child));
    let sock = dir.join("containerd.sock");
    let deadline = Instant::now() + CALL_TIMEOUT;
    loop {
        let child = guard.0.as_mut().expect("containerd child");
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "containerd exited {st}:\n{}",
                tail(
                    &std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default(),
                    30
                )
            );
        }
        if sock.exists() {
            if let Ok(ch) = connect(rt, &sock) {
                let mut rs = RuntimeServiceClient::new(ch);
                let v = rt.block_on(async {
                    let f = rs.version(cri::VersionRequest {
                        version: "v1".into(),
                    });
                    tokio::time::timeout(Duration::from_secs(5), f).await
                });
                if let Ok(Ok(v)) = v {
                    let v = v.into_inner();
                    eprintln!(
                        "containerd {} ({} {}), CRI {}",
                        child.id(),
                        v.runtime_name,
                        v.runtime_version,
                        v.runtime_api_version
                    );
                    let child = guard.0.take().expect("containerd child");
                    return (child, rs);
                }
            }
        }
        if Instant::now() > deadline {
            panic!("containerd's CRI service did not answer in {CALL_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Our containerd child while `launch` waits for it: killed and reaped if `launch` panics.
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn connect(rt: &tokio::runtime::Runtime, sock: &Path) -> Result<Channel, tonic::transport::Error> {
    let sock = sock.to_path_buf();
    // The URI is required by tonic and unused: the connector dials the unix socket.
    let ep = Endpoint::from_static("http://[::]:50051");
    rt.block_on(
        ep.connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let sock = sock.clone();
            async move {
                let s = tokio::net::UnixStream::connect(sock).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        })),
    )
}

/// Removes the cgroup `rel` and everything below it in every mounted hierarchy, deepest first
/// (only empty cgroups can go; runc has removed the container cgroups it made by then).
pub fn remove_tree(rel: &str) {
    let Ok(hs) = std::fs::read_dir(CGROUP_ROOT) else {
        return;
    };
    for h in hs.flatten() {
        let top = h.path().join(rel.trim_start_matches('/'));
        if top.is_dir() {
            remove_dir_tree(&top);
        }
    }
}

/// Thaws `rel` and every cgroup below it in the v1 freezer and the unified tree, if frozen.
fn thaw_tree(rel: &str) {
    for (h, file, thawed) in [
        ("freezer", "freezer.state", "THAWED"),
        ("unified", "cgroup.freeze", "0"),
        ("", "cgroup.freeze", "0"),
    ] {
        let top = Path::new(CGROUP_ROOT)
            .join(h)
            .join(rel.trim_start_matches('/'));
        thaw_dir_tree(&top, file, thawed);
    }
}

fn thaw_dir_tree(p: &Path, file: &str, thawed: &str) {
    let f = p.join(file);
    let frozen =
        std::fs::read_to_string(&f).is_ok_and(|t| matches!(t.trim(), "FROZEN" | "FREEZING" | "1"));
    if frozen {
        if let Err(e) = std::fs::write(&f, thawed) {
            eprintln!("cleanup: cannot thaw {}: {e}", f.display());
        }
    }
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                thaw_dir_tree(&e.path(), file, thawed);
            }
        }
    }
}

fn remove_dir_tree(p: &Path) {
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_dir_tree(&e.path());
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::fs::remove_dir(p) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if Instant::now() > deadline => {
                eprintln!("cleanup: cannot remove {}: {e}", p.display());
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

// === images from local files ===

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Writes `bytes` as a blob of the OCI layout at `layout`; its descriptor.
fn blob(layout: &Path, media: &str, bytes: &[u8]) -> serde_json::Value {
    let digest = sha256_hex(bytes);
    let p = layout.join("blobs/sha256").join(&digest);
    std::fs::write(&p, bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::json!({"mediaType": media, "digest": format!("sha256:{digest}"), "size": bytes.len()})
}

/// Copies a file into the rootfs at the same absolute path.
fn copy_in(rootfs: &Path, src: &Path, dst: &str) {
    let to = rootfs.join(dst.trim_start_matches('/'));
    std::fs::create_dir_all(to.parent().expect("parent")).expect("rootfs dir");
    std::fs::copy(src, &to)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", src.display(), to.display()));
}

/// The shared libraries `ldd` lists for `bin` (none for a static binary).
fn libraries(bin: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(bin).output().expect("spawn ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with('/'))
                .map(PathBuf::from)
        })
        .collect()
}

/// An OCI image layout tar with three images over one layer: the workload image, a sandbox
/// image running `/pause` (comm `pause`), and one running `/testload pause` (comm `testload`).
/// The layer holds busybox-static, testload with the libraries it links, and `/pause`.
pub fn build_images(dir: &Path) -> PathBuf {
    let work = dir.join("image");
    let rootfs = work.join("rootfs");
    let layout = work.join("layout");
    std::fs::create_dir_all(rootfs.join("bin")).expect("rootfs");
    std::fs::create_dir_all(layout.join("blobs/sha256")).expect("layout");
    for d in ["proc", "sys", "dev", "tmp", "etc"] {
        std::fs::create_dir_all(rootfs.join(d)).expect("rootfs dir");
    }
    copy_in(&rootfs, Path::new("/bin/busybox"), "/bin/busybox");
    for applet in ["sh", "cat", "sleep", "ls", "httpd"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).expect("applet");
    }
    let testload = Path::new(TESTLOAD);
    copy_in(&rootfs, testload, "/testload");
    copy_in(&rootfs, testload, "/pause");
    for lib in libraries(testload) {
        copy_in(&rootfs, &lib, &lib.display().to_string());
    }
    let layer = work.join("layer.tar");
    let st = Command::new("tar")
        .args([
            "--sort=name",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "--mtime=@0",
        ])
        .arg("-C")
        .arg(&rootfs)
        .arg("-cf")
        .arg(&layer)
        .arg(".")
        .status()
        .expect("spawn tar");
    assert!(st.success(), "tar layer: {st}");
    let layer_bytes = std::fs::read(&layer).expect("layer");
    let layer_desc = blob(
        &layout,
        "application/vnd.oci.image.layer.v1.tar",
        &layer_bytes,
    );
    let diff_id = layer_desc["digest"].clone();
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let mut manifests = Vec::new();
    for (name, entrypoint, cmd) in [
        (IMAGE, "/testload", vec!["--until-term", "idle"]),
        (PAUSE_IMAGE, "/pause", vec!["pause"]),
        (OTHER_SANDBOX_IMAGE, "/testload", vec!["pause"]),
    ] {
        let config = serde_json::json!({
            "architecture": arch,
            "os": "linux",
            "config": {"Entrypoint": [entrypoint], "Cmd": cmd, "Env": ["PATH=/bin"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        });
        let config_desc = blob(
            &layout,
            "application/vnd.oci.image.config.v1+json",
            config.to_string().as_bytes(),
        );
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": [layer_desc],
        });
        let mut desc = blob(
            &layout,
            "application/vnd.oci.image.manifest.v1+json",
            manifest.to_string().as_bytes(),
        );
        desc["annotations"] = serde_json::json!({
            "io.containerd.image.name": name,
            "org.opencontainers.image.ref.name": name.rsplit(':').next().unwrap_or("1"),
        });
        desc["platform"] = serde_json::json!({"architecture": arch, "os": "linux"});
        manifests.push(desc);
    }
    std::fs::write(
        layout.join("index.json"),
        serde_json::json!({"schemaVersion": 2, "manifests": manifests}).to_string(),
    )
    .expect("index.json");
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .expect("oci-layout");
    let tar = work.join("images.tar");
    let st = Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&tar)
        .args(["oci-layout", "index.json", "blobs"])
        .status()
        .expect("spawn tar");
    assert!(st.success(), "tar image: {st}");
    tar
}
