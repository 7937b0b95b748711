//! The shipped DaemonSet as the kubelet runs it (tests/cri_daemonset.rs): `kubectl kustomize`
//! renders `daemonset/base` (plus components), and its pod template is turned into the CRI
//! `RunPodSandbox` and `CreateContainer` configs the kubelet would send (pkg/kubelet/kuberuntime
//! of Kubernetes 1.31): namespaces, seccomp, capabilities, the default masked and read-only
//! paths, resources as cgroup values, args, env with the downward API, configMap and hostPath
//! volumes (types checked as the kubelet checks them), `/etc/hosts` and the termination log.
//!
//! Test-only substitutions are explicit (`Substitutions`): a hostPath the test serves from its own
//! directory, or one it mounts for real; any other hostPath is refused, so the pod can never be
//! given the host's real `/var/log/pods` or state dir by accident.

#![allow(dead_code)]

use k8s_cri::v1 as cri;
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Every object of one `kubectl kustomize` run.
pub struct Rendered {
    pub objects: Vec<Value>,
    /// The YAML kustomize printed.
    pub yaml: String,
}

impl Rendered {
    pub fn find(&self, kind: &str, name: &str) -> &Value {
        self.objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in the render:\n{}", self.yaml))
    }

    pub fn daemonset(&self) -> &Value {
        self.find("DaemonSet", "nodeguard")
    }
}

/// Renders `daemonset/base` with `components` (names under `daemonset/components/`) through a
/// kustomization written in `work` (kustomize refuses absolute paths, so it names them relative).
pub fn render(repo: &Path, components: &[&str], work: &Path) -> Rendered {
    let dir = work.join(format!("kustomize-{}", components.join("-")));
    std::fs::create_dir_all(&dir).expect("kustomization dir");
    let up = "../".repeat(dir.components().count() - 1);
    let rel = |p: &str| {
        format!(
            "{up}{}/{p}",
            repo.display().to_string().trim_start_matches('/')
        )
    };
    let mut k = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n",
        rel("daemonset/base")
    );
    if !components.is_empty() {
        k.push_str("components:\n");
        for c in components {
            k.push_str(&format!(
                "  - {}\n",
                rel(&format!("daemonset/components/{c}"))
            ));
        }
    }
    std::fs::write(dir.join("kustomization.yaml"), k).expect("kustomization.yaml");
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("spawn kubectl");
    assert!(
        out.status.success(),
        "kubectl kustomize {components:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut objects = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&yaml) {
        let v: Value = serde::Deserialize::deserialize(doc).expect("rendered YAML");
        if !v.is_null() {
            objects.push(v);
        }
    }
    Rendered { objects, yaml }
}

/// Where the test serves a hostPath from, by its path in the pod spec.
pub struct Substitutions {
    /// hostPath -> the test's own directory standing in for it.
    pub served: Vec<(String, PathBuf)>,
    /// hostPaths mounted for real (the cgroup mount the agent must read and write).
    pub real: Vec<String>,
}

impl Substitutions {
    fn resolve(&self, host: &str) -> PathBuf {
        if let Some((_, p)) = self.served.iter().find(|(h, _)| h == host) {
            return p.clone();
        }
        assert!(
            self.real.iter().any(|h| h == host),
            "hostPath {host} is neither served by the test nor allowed for real: refusing to \
             mount the host's own"
        );
        PathBuf::from(host)
    }
}

/// What the kubelet knows that the pod spec does not: the node, the pod's identity and cgroup,
/// its directories, and the test's additions to the container's args.
pub struct Context<'a> {
    pub node_name: &'a str,
    pub pod_name: &'a str,
    pub uid: &'a str,
    /// `cgroup_parent`: the pod cgroup the test made, as the kubelet's cgroup manager does.
    pub cgroup_parent: String,
    pub log_directory: PathBuf,
    /// The kubelet's `pods/<uid>` dir: volumes, etc-hosts, termination log.
    pub pod_dir: PathBuf,
    /// The image id the kubelet's `IfNotPresent` check resolved.
    pub image_ref: &'a str,
    pub subst: &'a Substitutions,
    /// Appended to the container's args (each one a named deviation).
    pub extra_args: &'a [String],
}

/// A probe as declared, with the named port resolved.
#[derive(Debug, Clone)]
pub struct ProbeSpec {
    pub path: String,
    pub port: u16,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub failure_threshold: u32,
    pub success_threshold: u32,
}

/// The CRI side of the pod template.
pub struct Translated {
    pub sandbox: cri::PodSandboxConfig,
    pub container: cri::ContainerConfig,
    pub container_name: String,
    pub liveness: ProbeSpec,
    pub readiness: ProbeSpec,
    /// `terminationGracePeriodSeconds`: StopContainer's timeout.
    pub grace: i64,
    /// The hostPath checks the kubelet made (`path type -> outcome`), for the log.
    pub host_path_checks: Vec<String>,
}

/// The kubelet's default masked paths for a container that is not privileged and has the
/// default procMount (pkg/securitycontext/util.go, 1.31).
pub const DEFAULT_MASKED: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
pub const DEFAULT_READONLY: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// CPU quantity in millicores (`50m`, `0.5`, `2`).
pub fn milli_cpu(q: &str) -> i64 {
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().unwrap_or_else(|_| panic!("cpu {q:?}"));
    }
    let f: f64 = q.parse().unwrap_or_else(|_| panic!("cpu {q:?}"));
    (f * 1000.0).ceil() as i64
}

/// Memory quantity in bytes (`128Mi`, `1Gi`, `500M`, plain bytes).
pub fn bytes(q: &str) -> i64 {
    const UNITS: &[(&str, i64)] = &[
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    for (u, m) in UNITS {
        if let Some(n) = q.strip_suffix(u) {
            return n.parse::<i64>().unwrap_or_else(|_| panic!("memory {q:?}")) * m;
        }
    }
    q.parse().unwrap_or_else(|_| panic!("memory {q:?}"))
}

/// The kubelet's `MilliCPUToShares` (min 2) and `MilliCPUToQuota` (min 1000 us, period 100 ms).
pub fn cpu_shares(milli: i64) -> i64 {
    (milli * 1024 / 1000).max(2)
}
pub const CFS_PERIOD: i64 = 100_000;
pub fn cpu_quota(milli: i64) -> i64 {
    (milli * CFS_PERIOD / 1000).max(1000)
}

/// The pod cgroup's values the kubelet's cgroup manager sets for a Burstable pod (pkg/kubelet/
/// cm/helpers_linux.go `ResourceConfigForPod`): cpu shares from the summed requests, and, since
/// every container has limits, the summed CPU quota and memory limit. Cgroup v1 file names.
pub fn pod_cgroup_values(spec: &Value) -> Vec<(&'static str, &'static str, i64)> {
    let (mut req_cpu, mut lim_cpu, mut lim_mem) = (0, 0, 0);
    let (mut all_cpu, mut all_mem) = (true, true);
    for c in spec["containers"].as_array().into_iter().flatten() {
        let res = &c["resources"];
        req_cpu += res["requests"]["cpu"]
            .as_str()
            .or(res["limits"]["cpu"].as_str())
            .map_or(0, milli_cpu);
        match res["limits"]["cpu"].as_str() {
            Some(q) => lim_cpu += milli_cpu(q),
            None => all_cpu = false,
        }
        match res["limits"]["memory"].as_str() {
            Some(q) => lim_mem += bytes(q),
            None => all_mem = false,
        }
    }
    let mut out = vec![("cpu", "cpu.shares", cpu_shares(req_cpu))];
    if all_cpu {
        out.push(("cpu", "cpu.cfs_period_us", CFS_PERIOD));
        out.push(("cpu", "cpu.cfs_quota_us", cpu_quota(lim_cpu)));
    }
    if all_mem {
        out.push(("memory", "memory.limit_in_bytes", lim_mem));
    }
    out
}

/// The pod's QoS class from its containers' requests and limits (pkg/apis/core/v1/helper/qos).
pub fn qos(spec: &Value) -> nodeguard::discover::kubelet::QosClass {
    use nodeguard::discover::kubelet::QosClass;
    let mut any = false;
    let mut guaranteed = true;
    for c in spec["containers"].as_array().into_iter().flatten() {
        let (req, lim) = (&c["resources"]["requests"], &c["resources"]["limits"]);
        for r in ["cpu", "memory"] {
            any |= !req[r].is_null() || !lim[r].is_null();
            let req_or_lim = if req[r].is_null() { &lim[r] } else { &req[r] };
            guaranteed &= !lim[r].is_null() && *req_or_lim == lim[r];
        }
    }
    match (any, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        (true, false) => QosClass::Burstable,
    }
}

fn secs(v: &Value, default: u64) -> Duration {
    Duration::from_secs(v.as_u64().unwrap_or(default))
}

fn probe(c: &Value, key: &str) -> ProbeSpec {
    let p = &c[key];
    let get = &p["httpGet"];
    assert!(!get.is_null(), "{key}: only httpGet probes are translated");
    let port = match &get["port"] {
        Value::Number(n) => n.as_u64().expect("port") as u16,
        Value::String(name) => c["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name.as_str())
            .and_then(|p| p["containerPort"].as_u64())
            .unwrap_or_else(|| panic!("{key}: no container port named {name}"))
            as u16,
        other => panic!("{key}: port {other}"),
    };
    // The API server's defaults: period 10, timeout 1, thresholds 3 and 1.
    ProbeSpec {
        path: get["path"].as_str().unwrap_or("/").to_owned(),
        port,
        initial_delay: secs(&p["initialDelaySeconds"], 0),
        period: secs(&p["periodSeconds"], 10),
        timeout: secs(&p["timeoutSeconds"], 1),
        failure_threshold: p["failureThreshold"].as_u64().unwrap_or(3) as u32,
        success_threshold: p["successThreshold"].as_u64().unwrap_or(1) as u32,
    }
}

/// The kubelet's hostPath type check (pkg/volume/hostpath), `DirectoryOrCreate` making the dir
/// 0755 as it does. What it found, for the log.
fn check_host_path(path: &Path, kind: &str) -> String {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path);
    let ok = match kind {
        "" => true,
        "DirectoryOrCreate" => {
            if meta.is_err() {
                std::fs::create_dir_all(path)
                    .unwrap_or_else(|e| panic!("hostPath {}: {e}", path.display()));
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
                    .expect("chmod hostPath");
                return format!("{} {kind}: created", path.display());
            }
            meta.as_ref().is_ok_and(|m| m.is_dir())
        }
        "Directory" => meta.as_ref().is_ok_and(|m| m.is_dir()),
        "File" => meta.as_ref().is_ok_and(|m| m.is_file()),
        "CharDevice" => meta.as_ref().is_ok_and(|m| m.file_type().is_char_device()),
        "Socket" => meta.as_ref().is_ok_and(|m| m.file_type().is_socket()),
        other => panic!("hostPath type {other} is not translated"),
    };
    assert!(
        ok,
        "hostPath {} is not a {kind}: the kubelet would refuse the pod ({meta:?})",
        path.display()
    );
    format!("{} {kind}: ok", path.display())
}

/// A configMap volume as the kubelet's atomic writer projects it: the data files in a
/// timestamped dir, `..data` linking to it, and each key a link through `..data`, mode 0644.
fn project_config_map(cm: &Value, dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let ts = dir.join("..2026_12_05_00_00_00.000000001");
    std::fs::create_dir_all(&ts).expect("configMap dir");
    for (k, v) in cm["data"].as_object().expect("configMap data") {
        let f = ts.join(k);
        std::fs::write(&f, v.as_str().expect("configMap value")).expect("configMap file");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::os::unix::fs::symlink(format!("..data/{k}"), dir.join(k)).expect("key link");
    }
    std::os::unix::fs::symlink(ts.file_name().expect("ts"), dir.join("..data"))
        .expect("..data link");
}

/// The kubelet's update of a projected configMap (its atomic writer): the new files in a new
/// timestamped dir, a `..data_tmp` link to it renamed over `..data`, the old dir removed.
pub fn update_config_map(dir: &Path, key: &str, text: &str) {
    let old = std::fs::read_link(dir.join("..data")).expect("..data link");
    let ts = dir.join("..2026_12_05_00_00_01.000000002");
    std::fs::create_dir(&ts).expect("new configMap dir");
    std::fs::write(ts.join(key), text).expect("configMap file");
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(ts.file_name().expect("ts"), &tmp).expect("..data_tmp");
    std::fs::rename(&tmp, dir.join("..data")).expect("swap ..data");
    std::fs::remove_dir_all(dir.join(old)).expect("old configMap dir");
}

fn kv(pairs: &[(&str, String)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect()
}

fn seccomp(v: &Value) -> Option<cri::SecurityProfile> {
    match v["seccompProfile"]["type"].as_str() {
        Some("RuntimeDefault") => Some(cri::SecurityProfile {
            profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
            localhost_ref: String::new(),
        }),
        Some("Unconfined") => Some(cri::SecurityProfile {
            profile_type: cri::security_profile::ProfileType::Unconfined as i32,
            localhost_ref: String::new(),
        }),
        None => None,
        Some(other) => panic!("seccompProfile {other} is not translated"),
    }
}

/// The pod template of `ds` (rendered with `r`) as the kubelet's CRI configs.
pub fn translate(r: &Rendered, ctx: &Context) -> Translated {
    let ds = r.daemonset();
    let tpl = &ds["spec"]["template"];
    let spec = &tpl["spec"];
    let namespace = ds["metadata"]["namespace"]
        .as_str()
        .expect("DaemonSet namespace");
    let containers = spec["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1, "one container is translated");
    assert!(
        spec["initContainers"].is_null(),
        "init containers are not translated"
    );
    let c = &containers[0];
    let name = c["name"].as_str().expect("container name").to_owned();
    let host_net = spec["hostNetwork"] == true;
    let host_pid = spec["hostPID"] == true;
    let mode = |host: bool, otherwise: cri::NamespaceMode| {
        if host {
            cri::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    let ns_opts = cri::NamespaceOption {
        network: mode(host_net, cri::NamespaceMode::Pod),
        pid: mode(host_pid, cri::NamespaceMode::Container),
        ipc: mode(spec["hostIPC"] == true, cri::NamespaceMode::Pod),
        ..Default::default()
    };
    let psc = &spec["securityContext"];
    let csc = &c["securityContext"];
    let privileged = csc["privileged"] == true;

    // hostNetwork: the API server defaults hostPort to containerPort; the kubelet maps them.
    let ports: Vec<cri::PortMapping> = c["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let cp = p["containerPort"].as_i64().expect("containerPort") as i32;
            cri::PortMapping {
                protocol: cri::Protocol::Tcp as i32,
                container_port: cp,
                host_port: p["hostPort"]
                    .as_i64()
                    .map_or(if host_net { cp } else { 0 }, |h| h as i32),
                host_ip: String::new(),
            }
        })
        .collect();
    let mut sb_labels = kv(&[
        ("io.kubernetes.pod.name", ctx.pod_name.into()),
        ("io.kubernetes.pod.namespace", namespace.into()),
        ("io.kubernetes.pod.uid", ctx.uid.into()),
    ]);
    for (k, v) in tpl["metadata"]["labels"].as_object().into_iter().flatten() {
        sb_labels.insert(k.clone(), v.as_str().unwrap_or_default().to_owned());
    }
    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: ctx.pod_name.into(),
            uid: ctx.uid.into(),
            namespace: namespace.into(),
            attempt: 0,
        }),
        // The kubelet sends no hostname for a hostNetwork pod (the node's UTS namespace is kept;
        // runc refuses one: "unable to set hostname without a private UTS namespace").
        hostname: if host_net {
            String::new()
        } else {
            ctx.pod_name.into()
        },
        log_directory: ctx.log_directory.display().to_string(),
        // ClusterFirstWithHostNet needs a cluster DNS service, which the test node has none of:
        // no DNS config, so containerd gives the node's resolv.conf (the agent resolves nothing).
        dns_config: None,
        port_mappings: ports,
        labels: sb_labels,
        annotations: kv(&[("kubernetes.io/config.source", "api".into())]),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: ctx.cgroup_parent.clone(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(ns_opts.clone()),
                privileged,
                seccomp: seccomp(psc),
                run_as_user: psc["runAsUser"]
                    .as_i64()
                    .map(|v| cri::Int64Value { value: v }),
                run_as_group: psc["runAsGroup"]
                    .as_i64()
                    .map(|v| cri::Int64Value { value: v }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };

    // Env: literal values and the downward API fields the DaemonSet uses.
    let envs = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let value = if let Some(v) = e["value"].as_str() {
                v.to_owned()
            } else {
                match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                    Some("spec.nodeName") => ctx.node_name.into(),
                    Some("metadata.namespace") => namespace.into(),
                    Some("metadata.name") => ctx.pod_name.into(),
                    Some("metadata.uid") => ctx.uid.into(),
                    other => panic!("env {}: {other:?} is not translated", e["name"]),
                }
            };
            cri::KeyValue {
                key: e["name"].as_str().expect("env name").into(),
                value,
            }
        })
        .collect();

    // Volumes, in the order of the container's volumeMounts.
    let volumes: HashMap<&str, &Value> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| (v["name"].as_str().expect("volume name"), v))
        .collect();
    let mut mounts = Vec::new();
    let mut host_path_checks = Vec::new();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let vname = m["name"].as_str().expect("mount name");
        let v = volumes
            .get(vname)
            .unwrap_or_else(|| panic!("volumeMount {vname} has no volume"));
        let mut readonly = m["readOnly"] == true;
        let host = if let Some(cm) = v["configMap"]["name"].as_str() {
            let dir = ctx
                .pod_dir
                .join("volumes/kubernetes.io~configmap")
                .join(vname);
            if !dir.exists() {
                std::fs::create_dir_all(&dir).expect("configMap volume dir");
                project_config_map(r.find("ConfigMap", cm), &dir);
            }
            // configMap volumes are always read-only (since 1.10).
            readonly = true;
            dir
        } else if let Some(hp) = v["hostPath"]["path"].as_str() {
            let p = ctx.subst.resolve(hp);
            host_path_checks.push(format!(
                "{hp} -> {}",
                check_host_path(&p, v["hostPath"]["type"].as_str().unwrap_or(""))
            ));
            p
        } else {
            panic!("volume {vname}: only configMap and hostPath are translated")
        };
        assert!(
            m["subPath"].is_null() && m["mountPropagation"].is_null(),
            "subPath and mountPropagation are not translated"
        );
        mounts.push(cri::Mount {
            container_path: m["mountPath"].as_str().expect("mountPath").into(),
            host_path: host.display().to_string(),
            readonly,
            propagation: cri::MountPropagation::PropagationPrivate as i32,
            ..Default::default()
        });
    }
    // The kubelet's own two: the managed /etc/hosts (a hostNetwork pod gets the node's) and the
    // termination message file.
    let cdir = ctx.pod_dir.join("containers").join(&name);
    std::fs::create_dir_all(&cdir).expect("kubelet container dir");
    let hosts = ctx.pod_dir.join("etc-hosts");
    let content = if host_net {
        std::fs::read_to_string("/etc/hosts").unwrap_or_default()
    } else {
        "127.0.0.1\tlocalhost\n".to_owned()
    };
    std::fs::write(
        &hosts,
        format!("# Kubernetes-managed hosts file (host network).\n{content}"),
    )
    .expect("etc-hosts");
    mounts.push(cri::Mount {
        container_path: "/etc/hosts".into(),
        host_path: hosts.display().to_string(),
        ..Default::default()
    });
    let term = cdir.join("termination-log");
    std::fs::write(&term, "").expect("termination log");
    mounts.push(cri::Mount {
        container_path: c["terminationMessagePath"]
            .as_str()
            .unwrap_or("/dev/termination-log")
            .into(),
        host_path: term.display().to_string(),
        ..Default::default()
    });

    // Resources as the kubelet computes them (cgroup v1 names; runc maps them on v2).
    let res = &c["resources"];
    let req_cpu = res["requests"]["cpu"]
        .as_str()
        .or(res["limits"]["cpu"].as_str())
        .map_or(0, milli_cpu);
    let lim_cpu = res["limits"]["cpu"].as_str().map(milli_cpu);
    let lim_mem = res["limits"]["memory"].as_str().map(bytes);
    // A node-critical pod gets the guaranteed score (pkg/kubelet/qos/policy.go);
    // containerd's `restrict_oom_score_adj` may raise it to its own.
    let oom = if spec["priorityClassName"] == "system-node-critical" {
        -997
    } else {
        let total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches(" kB").parse::<i64>().ok())
            })
            .unwrap_or(1)
            * 1024;
        let req_mem = res["requests"]["memory"].as_str().map_or(0, bytes);
        (1000 - 1000 * req_mem / total).clamp(3, 999)
    };
    let resources = cri::LinuxContainerResources {
        cpu_period: if lim_cpu.is_some() { CFS_PERIOD } else { 0 },
        cpu_quota: lim_cpu.map_or(0, cpu_quota),
        cpu_shares: cpu_shares(req_cpu),
        memory_limit_in_bytes: lim_mem.unwrap_or(0),
        oom_score_adj: oom,
        ..Default::default()
    };

    let caps = &csc["capabilities"];
    let names = |k: &str| -> Vec<String> {
        caps[k]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c.as_str().expect("capability").to_owned())
            .collect()
    };
    let security = cri::LinuxContainerSecurityContext {
        capabilities: Some(cri::Capability {
            add_capabilities: names("add"),
            drop_capabilities: names("drop"),
            ..Default::default()
        }),
        privileged,
        namespace_options: Some(ns_opts),
        run_as_user: csc["runAsUser"]
            .as_i64()
            .or(psc["runAsUser"].as_i64())
            .map(|v| cri::Int64Value { value: v }),
        run_as_group: csc["runAsGroup"]
            .as_i64()
            .or(psc["runAsGroup"].as_i64())
            .map(|v| cri::Int64Value { value: v }),
        readonly_rootfs: csc["readOnlyRootFilesystem"] == true,
        // The kubelet: no_new_privs unless privilege escalation is allowed (unset means allowed).
        no_new_privs: csc["allowPrivilegeEscalation"] == false,
        masked_paths: if privileged {
            Vec::new()
        } else {
            DEFAULT_MASKED.iter().map(|s| (*s).to_owned()).collect()
        },
        readonly_paths: if privileged {
            Vec::new()
        } else {
            DEFAULT_READONLY.iter().map(|s| (*s).to_owned()).collect()
        },
        seccomp: seccomp(csc).or_else(|| seccomp(psc)),
        ..Default::default()
    };

    let mut args: Vec<String> = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a.as_str().expect("arg").to_owned())
        .collect();
    args.extend(ctx.extra_args.iter().cloned());
    let grace = spec["terminationGracePeriodSeconds"].as_i64().unwrap_or(30);
    let container = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.clone(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: ctx.image_ref.into(),
            ..Default::default()
        }),
        command: c["command"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| a.as_str().expect("command").to_owned())
            .collect(),
        args,
        working_dir: c["workingDir"].as_str().unwrap_or_default().into(),
        envs,
        mounts,
        labels: kv(&[
            ("io.kubernetes.container.name", name.clone()),
            ("io.kubernetes.pod.name", ctx.pod_name.into()),
            ("io.kubernetes.pod.namespace", namespace.into()),
            ("io.kubernetes.pod.uid", ctx.uid.into()),
        ]),
        annotations: kv(&[
            ("io.kubernetes.container.restartCount", "0".into()),
            (
                "io.kubernetes.container.terminationMessagePath",
                "/dev/termination-log".into(),
            ),
            (
                "io.kubernetes.pod.terminationGracePeriod",
                grace.to_string(),
            ),
        ]),
        log_path: format!("{name}/0.log"),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(resources),
            security_context: Some(security),
        }),
        ..Default::default()
    };
    Translated {
        liveness: probe(c, "livenessProbe"),
        readiness: probe(c, "readinessProbe"),
        sandbox,
        container,
        container_name: name,
        grace,
        host_path_checks,
    }
}

/// One GET from the network namespace `netns` (a thread that joins it), bounded like
/// `agent::http_get`.
pub fn get_in(netns: &Path, addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    let netns = netns.to_path_buf();
    let path = path.to_owned();
    std::thread::spawn(move || {
        let f = std::fs::File::open(&netns).ok()?;
        nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET).ok()?;
        // Prometheus's own Accept: the agent answers it with OpenMetrics, as a scrape gets.
        crate::common::agent::http_get_as(
            addr,
            &path,
            Some(crate::common::agent::ACCEPT_PROMETHEUS),
        )
        .map(|(status, _, body)| (status, body))
    })
    .join()
    .ok()
    .flatten()
}
