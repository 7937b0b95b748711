//! The agent's pod: one container with least privilege (as docs/deploy.md, "Privileges", states
//! it), and a shipped config whose host paths, state file, port and path are those of the pod.

use super::yaml::{dirname, pairs, seq, str_at, subset};
use super::Report;
use serde_norway::Value;
use std::collections::{BTreeMap, BTreeSet};

/// Capabilities docs/deploy.md justifies ("Privileges").
pub const ALLOWED_CAPS: [&str; 3] = ["SYS_PTRACE", "DAC_READ_SEARCH", "NET_ADMIN"];

pub fn container(ds: &Value) -> Option<&Value> {
    match seq(&ds["spec"]["template"]["spec"]["containers"]) {
        [c] => Some(c),
        _ => None,
    }
}

/// Least privilege, as docs/deploy.md ("Privileges") states it.
pub fn check_daemonset(ds: &Value, sa: &Value, r: &mut Report) {
    let spec = &ds["spec"]["template"]["spec"];
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    if !subset(&ds["spec"]["selector"]["matchLabels"], labels) {
        r.fail("DaemonSet selector does not match its pod labels");
    }
    let Some(c) = container(ds) else {
        r.fail("DaemonSet must have exactly one container");
        return;
    };
    let sc = &c["securityContext"];
    for (k, v) in [
        ("privileged", false),
        ("allowPrivilegeEscalation", false),
        ("readOnlyRootFilesystem", true),
    ] {
        if sc[k].as_bool() != Some(v) {
            r.fail(format!(
                "DaemonSet container securityContext.{k} must be {v}"
            ));
        }
    }
    let caps = &sc["capabilities"];
    if seq(&caps["drop"])
        .iter()
        .map(Value::as_str)
        .collect::<Vec<_>>()
        != [Some("ALL")]
    {
        r.fail("DaemonSet must drop ALL capabilities");
    }
    let extra: BTreeSet<&str> = seq(&caps["add"])
        .iter()
        .filter_map(Value::as_str)
        .filter(|c| !ALLOWED_CAPS.contains(c))
        .collect();
    if !extra.is_empty() {
        r.fail(format!(
            "DaemonSet adds capabilities beyond {ALLOWED_CAPS:?}: {extra:?}"
        ));
    }
    if str_at(&sc["seccompProfile"], "type") != "RuntimeDefault" {
        r.fail("DaemonSet container seccompProfile must be RuntimeDefault");
    }
    for k in ["hostPID", "hostNetwork"] {
        if spec[k].as_bool() != Some(true) {
            r.fail(format!("DaemonSet needs {k}: true (docs/deploy.md)"));
        }
    }
    if str_at(spec, "priorityClassName") != "system-node-critical" {
        r.fail("DaemonSet priorityClassName must be system-node-critical");
    }
    let sel = &spec["nodeSelector"];
    if pairs(sel).count() != 1
        || str_at(sel, "kubernetes.io/os") != "linux"
        || !spec["affinity"].is_null()
    {
        r.fail(
            "DaemonSet must select exactly kubernetes.io/os: linux (no arch: runs on arm64 and amd64)",
        );
    }
    let tolerates_all = seq(&spec["tolerations"])
        .iter()
        .any(|t| pairs(t).count() == 1 && str_at(t, "operator") == "Exists");
    if !tolerates_all {
        r.fail("DaemonSet must tolerate every taint");
    }
    if spec["automountServiceAccountToken"].as_bool() != Some(false)
        || sa["automountServiceAccountToken"].as_bool() != Some(false)
    {
        r.fail("no service account token may be mounted (the agent never calls the API)");
    }
    let node_name = seq(&c["env"])
        .iter()
        .find(|e| str_at(e, "name") == "NODE_NAME")
        .map(|e| str_at(&e["valueFrom"]["fieldRef"], "fieldPath"));
    if node_name != Some("spec.nodeName") {
        r.fail("NODE_NAME must come from the downward API (spec.nodeName)");
    }
    let ports = ports(c);
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let g = &c[probe]["httpGet"];
        if str_at(g, "path") != path || !ports.contains_key(str_at(g, "port")) {
            r.fail(format!("{probe} must GET {path} on a named container port"));
        }
    }
    for k in ["requests", "limits"] {
        for res in ["cpu", "memory"] {
            if c["resources"][k][res].is_null() {
                r.fail(format!("resources.{k}.{res} missing"));
            }
        }
    }
    let vols = volumes(spec);
    for m in seq(&c["volumeMounts"]) {
        let name = str_at(m, "name");
        match vols.get(name) {
            None => r.fail(format!("volumeMount {name} has no volume")),
            Some(v) => {
                let mp = str_at(m, "mountPath");
                if !v["hostPath"].is_null()
                    && mp != "/var/lib/nodeguard"
                    && m["readOnly"].as_bool() != Some(true)
                {
                    r.fail(format!(
                        "host mount {mp} must be readOnly in the base (writable only in daemonset/actions)"
                    ));
                }
            }
        }
    }
}

pub fn ports(c: &Value) -> BTreeMap<&str, i64> {
    seq(&c["ports"])
        .iter()
        .map(|p| (str_at(p, "name"), p["containerPort"].as_i64().unwrap_or(-1)))
        .collect()
}

fn volumes(spec: &Value) -> BTreeMap<&str, &Value> {
    seq(&spec["volumes"])
        .iter()
        .map(|v| (str_at(v, "name"), v))
        .collect()
}

/// The agent config: every host path it reads is mounted, the state file is on a volume, it is
/// dry-run, its port is a container port, and `--config` points into the ConfigMap's mount.
pub fn check_config(text: &str, ds: &Value, cm_name: &str, r: &mut Report) {
    let cfg: Value = match serde_norway::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            r.fail(format!("the ConfigMap's nodeguard.yaml is not YAML: {e}"));
            return;
        }
    };
    let spec = &ds["spec"]["template"]["spec"];
    let Some(c) = container(ds) else { return };
    let mounts: Vec<&str> = seq(&c["volumeMounts"])
        .iter()
        .map(|m| str_at(m, "mountPath"))
        .collect();
    let mounted = |path: &str| {
        mounts
            .iter()
            .any(|mp| path == *mp || path.starts_with(&format!("{}/", mp.trim_end_matches('/'))))
    };
    for (key, path) in pairs(&cfg["paths"]) {
        let path = path.as_str().unwrap_or("");
        if key == "proc" {
            if path != "/proc" {
                r.fail("paths.proc must be /proc (hostPID gives the host's pid namespace)");
            }
        } else if !mounted(path) {
            r.fail(format!(
                "config paths.{key}={path} is not mounted in the DaemonSet"
            ));
        }
    }
    if let Some(state) = cfg["guard"]["state_file"].as_str() {
        if !mounted(dirname(state)) {
            r.fail(format!(
                "config guard.state_file={state} is not on a mounted volume"
            ));
        }
    }
    // Absent means the default, which is dry-run.
    if !matches!(cfg["guard"]["dry_run"], Value::Null | Value::Bool(true)) {
        r.fail("the shipped config must be dry-run (guard.dry_run: true)");
    }
    let listen = cfg["listen"].as_str().unwrap_or("0.0.0.0:9913");
    let port: i64 = listen
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(-1);
    let ports = ports(c);
    if !ports.values().any(|p| *p == port) {
        r.fail(format!(
            "config listen port {port} is not a container port {ports:?}"
        ));
    }
    let Some((vol, mounted_cm)) = volumes(spec)
        .into_iter()
        .find(|(_, v)| !v["configMap"].is_null())
    else {
        r.fail("the DaemonSet mounts no ConfigMap");
        return;
    };
    let mounted_name = str_at(&mounted_cm["configMap"], "name");
    if mounted_name != cm_name {
        r.fail(format!(
            "DaemonSet mounts ConfigMap {mounted_name}, the manifest is {cm_name}"
        ));
    }
    let cm_mount = seq(&c["volumeMounts"])
        .iter()
        .find(|m| str_at(m, "name") == vol)
        .map_or("", |m| str_at(m, "mountPath"));
    let args: Vec<&str> = seq(&c["args"]).iter().filter_map(Value::as_str).collect();
    let target = args
        .iter()
        .position(|a| *a == "--config")
        .and_then(|i| args.get(i + 1));
    if !target.is_some_and(|t| t.starts_with(&format!("{cm_mount}/"))) {
        r.fail(format!(
            "--config must point into the ConfigMap mount {cm_mount}"
        ));
    }
}
