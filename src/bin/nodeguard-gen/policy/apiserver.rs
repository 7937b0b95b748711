//! The API server's semantic rules for our pod, which schema validation cannot see (a schema
//! types each field alone; these rules relate fields). Checked on every rendered DaemonSet: each
//! component that changes the pod alone on the base, and all of them together
//! (`nodeguard-gen semantics`, run by scripts/ship-check), so a combination the API server would
//! refuse fails here first, as the `kmsg` component once did ("cannot set
//! `allowPrivilegeEscalation` to false and `privileged` to true").
//!
//! Each rule names its function in kubernetes `pkg/apis/core/validation/validation.go`. The few
//! the API server does not check but that stop the pod later are marked: (kubelet) refuses to
//! start the container or fails its probe, (runtime) containerd refuses CreateContainer, (ours)
//! a rule of this project. Only the rules that matter for a pod like ours are here.

use super::yaml::{pairs, seq, str_at};
use super::Report;
use serde_norway::Value;
use std::collections::BTreeSet;

/// Linux capability names as the pod spec writes them (include/uapi/linux/capability.h, 0..=40,
/// without `CAP_`); ten lines do not justify a crate.
const CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// `supportedHostPathTypes` (validateHostPathType); "" is the unset type.
const HOST_PATH_TYPES: [&str; 8] = [
    "",
    "DirectoryOrCreate",
    "Directory",
    "FileOrCreate",
    "File",
    "Socket",
    "CharDevice",
    "BlockDevice",
];

/// `validEnvDownwardAPIFieldPathExpressions` (validateEnvVarValueFrom); labels and annotations
/// by key are handled apart (validateObjectFieldSelector, subscripted paths).
const ENV_FIELD_PATHS: [&str; 9] = [
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
];

/// Every DaemonSet of a rendered stream, checked; `what` names the render in each finding.
/// False when the stream is not YAML or has no DaemonSet (nothing was checked).
pub(crate) fn check_rendered(text: &str, what: &str, r: &mut Report) -> bool {
    let docs = match super::yaml::docs(text) {
        Ok(d) => d,
        Err(e) => {
            r.fail(format!("{what}: not YAML: {e}"));
            return false;
        }
    };
    let mut n = 0;
    for d in docs.iter().filter(|d| str_at(d, "kind") == "DaemonSet") {
        n += 1;
        let before = r.errors.len();
        let name = str_at(&d["metadata"], "name");
        check_pod_spec(
            &d["spec"]["template"]["spec"],
            &format!("{what}: DaemonSet {name}: spec.template.spec"),
            r,
        );
        if r.errors.len() == before {
            r.ok(format!(
                "{what}: DaemonSet {name}: the API server's pod rules hold"
            ));
        }
    }
    if n == 0 {
        r.fail(format!("{what}: renders no DaemonSet"));
    }
    n > 0
}

/// The rules on one pod spec; findings are prefixed with `at` and the field path, as the API
/// server names them.
pub(crate) fn check_pod_spec(spec: &Value, at: &str, r: &mut Report) {
    let mut fail = |path: String, msg: &str| r.fail(format!("{at}.{path}: {msg}"));
    let volumes = check_volumes(spec, &mut fail);
    let host_network = spec["hostNetwork"].as_bool() == Some(true);
    let pod_sc = &spec["securityContext"];
    let mut names = BTreeSet::new();
    let mut port_names = BTreeSet::new();
    for list in ["initContainers", "containers"] {
        for (i, c) in seq(&spec[list]).iter().enumerate() {
            let p = format!("{list}[{i}]");
            // validateContainers: a DNS-1123 label, unique in the pod.
            let name = str_at(c, "name");
            if !is_dns1123_label(name) {
                fail(
                    format!("{p}.name"),
                    &format!("{name:?} is not a DNS-1123 label"),
                );
            } else if !names.insert(name) {
                fail(
                    format!("{p}.name"),
                    &format!("duplicate container name {name:?}"),
                );
            }
            check_ports(c, &p, host_network, &mut port_names, &mut fail);
            check_security_context(&c["securityContext"], pod_sc, &p, &mut fail);
            check_mounts(c, &p, &volumes, &mut fail);
            check_env(c, &p, &mut fail);
            if list == "containers" {
                for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                    if !c[probe].is_null() {
                        check_probe(&c[probe], probe, c, &format!("{p}.{probe}"), &mut fail);
                    }
                }
            }
        }
    }
    if seq(&spec["containers"]).is_empty() {
        fail("containers".into(), "Required value (validateContainers)");
    }
}

/// ValidateVolumes: names are unique DNS-1123 labels; validateHostPathVolumeSource and
/// validateHostPathType: an absolute path without `..` and a supported type. Returns the names.
fn check_volumes<'a>(spec: &'a Value, fail: &mut impl FnMut(String, &str)) -> BTreeSet<&'a str> {
    let mut names = BTreeSet::new();
    for (i, v) in seq(&spec["volumes"]).iter().enumerate() {
        let p = format!("volumes[{i}]");
        let name = str_at(v, "name");
        if !is_dns1123_label(name) {
            fail(
                format!("{p}.name"),
                &format!("{name:?} is not a DNS-1123 label"),
            );
        } else if !names.insert(name) {
            fail(
                format!("{p}.name"),
                &format!("duplicate volume name {name:?}"),
            );
        }
        let hp = &v["hostPath"];
        if hp.is_null() {
            continue;
        }
        let path = str_at(hp, "path");
        if path.is_empty() {
            fail(format!("{p}.hostPath.path"), "Required value");
        } else if path.split('/').any(|s| s == "..") {
            fail(
                format!("{p}.hostPath.path"),
                "must not contain '..' (validatePathNoBacksteps)",
            );
        } else if !path.starts_with('/') {
            // (kubelet) a relative host path resolves against nothing meaningful.
            fail(format!("{p}.hostPath.path"), "must be absolute (kubelet)");
        }
        let ty = match &hp["type"] {
            Value::Null => Some(""),
            t => t.as_str(),
        };
        if !ty.is_some_and(|t| HOST_PATH_TYPES.contains(&t)) {
            fail(
                format!("{p}.hostPath.type"),
                &format!(
                    "Unsupported value {:?}: supported values {HOST_PATH_TYPES:?} (validateHostPathType)",
                    hp["type"]
                ),
            );
        }
    }
    names
}

/// validateContainerPorts: numbers in range, IANA_SVC_NAME names unique in the pod, a known
/// protocol; validatePodHostNetworkDeps: under hostNetwork a hostPort, if set, equals the
/// containerPort (a template may leave it 0: it is defaulted to the containerPort).
fn check_ports<'a>(
    c: &'a Value,
    p: &str,
    host_network: bool,
    names: &mut BTreeSet<&'a str>,
    fail: &mut impl FnMut(String, &str),
) {
    for (j, port) in seq(&c["ports"]).iter().enumerate() {
        let pp = format!("{p}.ports[{j}]");
        let cp = port["containerPort"].as_i64();
        if !cp.is_some_and(|n| (1..=65535).contains(&n)) {
            fail(
                format!("{pp}.containerPort"),
                "must be between 1 and 65535, inclusive",
            );
        }
        let hp = port["hostPort"].as_i64().unwrap_or(0);
        if hp != 0 && !(1..=65535).contains(&hp) {
            fail(
                format!("{pp}.hostPort"),
                "must be between 1 and 65535, inclusive",
            );
        }
        if host_network && hp != 0 && Some(hp) != cp {
            fail(
                format!("{pp}.hostPort"),
                "must match `containerPort` when `hostNetwork` is true (validatePodHostNetworkDeps)",
            );
        }
        if let Some(name) = port["name"].as_str() {
            if !is_iana_svc_name(name) {
                fail(
                    format!("{pp}.name"),
                    &format!("{name:?} is not an IANA_SVC_NAME (ValidatePortName)"),
                );
            } else if !names.insert(name) {
                fail(format!("{pp}.name"), &format!("Duplicate value {name:?}"));
            }
        }
        let proto = match &port["protocol"] {
            Value::Null => Some("TCP"),
            v => v.as_str(),
        };
        if !matches!(proto, Some("TCP" | "UDP" | "SCTP")) {
            fail(
                format!("{pp}.protocol"),
                "Unsupported value: TCP, UDP or SCTP",
            );
        }
    }
}

/// ValidateSecurityContext: privileged, or an added CAP_SYS_ADMIN (compared as that literal
/// string upstream), with allowPrivilegeEscalation false; capability names (runtime: containerd
/// refuses an unknown one); runAsNonRoot with uid 0 (kubelet: verifyRunAsNonRoot refuses to start
/// the container); readOnlyRootFilesystem stated (ours: the pod never writes its image).
fn check_security_context(
    sc: &Value,
    pod_sc: &Value,
    p: &str,
    fail: &mut impl FnMut(String, &str),
) {
    let sp = format!("{p}.securityContext");
    let no_escalation = sc["allowPrivilegeEscalation"].as_bool() == Some(false);
    if no_escalation && sc["privileged"].as_bool() == Some(true) {
        fail(
            sp.clone(),
            "cannot set `allowPrivilegeEscalation` to false and `privileged` to true (ValidateSecurityContext)",
        );
    }
    let add = seq(&sc["capabilities"]["add"]);
    if no_escalation && add.iter().any(|c| c.as_str() == Some("CAP_SYS_ADMIN")) {
        fail(
            sp.clone(),
            "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN (ValidateSecurityContext)",
        );
    }
    for list in ["add", "drop"] {
        for (k, cap) in seq(&sc["capabilities"][list]).iter().enumerate() {
            let name = cap.as_str().unwrap_or("");
            let known = CAPABILITIES.contains(&name) || (name == "ALL");
            if !known {
                let hint = if name.starts_with("CAP_") {
                    " (written without CAP_ in a pod spec)"
                } else {
                    ""
                };
                fail(
                    format!("{sp}.capabilities.{list}[{k}]"),
                    &format!("unknown capability {name:?}{hint} (runtime)"),
                );
            }
        }
    }
    // The container's value wins over the pod's (the kubelet's effective security context).
    let eff = |k: &str| match &sc[k] {
        Value::Null => &pod_sc[k],
        v => v,
    };
    if eff("runAsNonRoot").as_bool() == Some(true) && eff("runAsUser").as_i64() == Some(0) {
        fail(
            sp.clone(),
            "runAsNonRoot: true with runAsUser: 0 (kubelet: verifyRunAsNonRoot refuses to start it)",
        );
    }
    if sc["readOnlyRootFilesystem"].as_bool().is_none() {
        fail(
            format!("{sp}.readOnlyRootFilesystem"),
            "must be stated (ours)",
        );
    }
}

/// ValidateVolumeMounts: each names a declared volume, has a mountPath, unique in the container
/// and without `..`.
fn check_mounts(c: &Value, p: &str, volumes: &BTreeSet<&str>, fail: &mut impl FnMut(String, &str)) {
    let mut paths = BTreeSet::new();
    for (k, m) in seq(&c["volumeMounts"]).iter().enumerate() {
        let mp = format!("{p}.volumeMounts[{k}]");
        let name = str_at(m, "name");
        if !volumes.contains(name) {
            fail(format!("{mp}.name"), &format!("Not found: {name:?}"));
        }
        let path = str_at(m, "mountPath");
        if path.is_empty() {
            fail(format!("{mp}.mountPath"), "Required value");
        } else if !paths.insert(path) {
            fail(
                format!("{mp}.mountPath"),
                &format!("{path:?}: must be unique"),
            );
        } else if path.split('/').any(|s| s == "..") {
            fail(format!("{mp}.mountPath"), "must not contain '..'");
        }
    }
}

/// ValidateEnv: C-identifier-like names; validateEnvVarValueFrom: one source; a fieldRef's path
/// in the supported set (validateObjectFieldSelector), apiVersion v1 when given.
fn check_env(c: &Value, p: &str, fail: &mut impl FnMut(String, &str)) {
    for (k, e) in seq(&c["env"]).iter().enumerate() {
        let ep = format!("{p}.env[{k}]");
        let name = str_at(e, "name");
        if !is_env_var_name(name) {
            fail(
                format!("{ep}.name"),
                &format!("invalid name {name:?} (IsEnvVarName)"),
            );
        }
        let from = &e["valueFrom"];
        if from.is_null() {
            continue;
        }
        if pairs(from).count() != 1 {
            fail(
                format!("{ep}.valueFrom"),
                "must have exactly one source (validateEnvVarValueFrom)",
            );
        }
        let fr = &from["fieldRef"];
        if fr.is_null() {
            continue;
        }
        let path = str_at(fr, "fieldPath");
        let subscripted = ["metadata.labels['", "metadata.annotations['"]
            .iter()
            .any(|pre| path.starts_with(pre) && path.ends_with("']") && path.len() > pre.len() + 2);
        if !ENV_FIELD_PATHS.contains(&path) && !subscripted {
            fail(
                format!("{ep}.valueFrom.fieldRef.fieldPath"),
                &format!("Unsupported value {path:?} (validEnvDownwardAPIFieldPathExpressions)"),
            );
        }
        if !matches!(fr["apiVersion"].as_str(), None | Some("v1")) {
            fail(
                format!("{ep}.valueFrom.fieldRef.apiVersion"),
                "must be v1 (validateObjectFieldSelector)",
            );
        }
    }
}

/// validateProbe and validateHandler: exactly one handler; validateHTTPGetAction: a path (ours:
/// absolute, the kubelet appends it to host:port), a port number or name (ValidatePortNumOrName;
/// a name must be a declared container port, or the kubelet's probe fails: "couldn't find port"),
/// scheme HTTP or HTTPS. Counts: validateContainers wants successThreshold 1 for liveness and
/// startup probes; upstream only refuses negatives (0 is defaulted to 1), ours wants >= 1 stated
/// so the manifest says what runs.
fn check_probe(
    probe: &Value,
    kind: &str,
    c: &Value,
    pp: &str,
    fail: &mut impl FnMut(String, &str),
) {
    let handlers: Vec<&str> = ["exec", "httpGet", "tcpSocket", "grpc"]
        .into_iter()
        .filter(|h| !probe[*h].is_null())
        .collect();
    match handlers[..] {
        [] => fail(
            pp.to_owned(),
            "must specify a handler type (validateHandler)",
        ),
        [_] => {}
        [_, second, ..] => fail(
            format!("{pp}.{second}"),
            "may not specify more than 1 handler type (validateHandler)",
        ),
    }
    let declared: BTreeSet<&str> = seq(&c["ports"])
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    let port_ok = |port: &Value| -> Option<String> {
        match port {
            Value::Number(n) if n.as_i64().is_some_and(|n| (1..=65535).contains(&n)) => None,
            Value::Number(_) => {
                Some("must be between 1 and 65535, inclusive (ValidatePortNumOrName)".into())
            }
            Value::String(s) if is_iana_svc_name(s) => (!declared.contains(s.as_str()))
                .then(|| format!("names no container port: {s:?} (kubelet)")),
            other => Some(format!(
                "{other:?} is neither a port number nor an IANA_SVC_NAME (ValidatePortNumOrName)"
            )),
        }
    };
    if !probe["httpGet"].is_null() {
        let g = &probe["httpGet"];
        let path = str_at(g, "path");
        if !path.starts_with('/') {
            fail(
                format!("{pp}.httpGet.path"),
                &format!("{path:?}: must be an absolute path (ours; upstream requires it set)"),
            );
        }
        if let Some(msg) = port_ok(&g["port"]) {
            fail(format!("{pp}.httpGet.port"), &msg);
        }
        if !matches!(g["scheme"].as_str(), None | Some("HTTP" | "HTTPS")) {
            fail(
                format!("{pp}.httpGet.scheme"),
                "Unsupported value: HTTP or HTTPS",
            );
        }
    }
    if !probe["tcpSocket"].is_null() {
        if let Some(msg) = port_ok(&probe["tcpSocket"]["port"]) {
            fail(format!("{pp}.tcpSocket.port"), &msg);
        }
    }
    if !probe["exec"].is_null() && seq(&probe["exec"]["command"]).is_empty() {
        fail(format!("{pp}.exec.command"), "Required value");
    }
    for k in [
        "timeoutSeconds",
        "periodSeconds",
        "successThreshold",
        "failureThreshold",
    ] {
        if let Some(v) = probe.get(k) {
            if v.as_i64().is_none_or(|n| n < 1) {
                fail(
                    format!("{pp}.{k}"),
                    "must be at least 1 (ours; negative: ValidateNonnegativeField)",
                );
            }
        }
    }
    if !matches!(probe["initialDelaySeconds"].as_i64(), None | Some(0..)) {
        fail(
            format!("{pp}.initialDelaySeconds"),
            "must be greater than or equal to 0 (ValidateNonnegativeField)",
        );
    }
    if kind != "readinessProbe" && !matches!(probe["successThreshold"].as_i64(), None | Some(1)) {
        fail(
            format!("{pp}.successThreshold"),
            "must be 1 for liveness and startup probes (validateContainers)",
        );
    }
}

/// IsDNS1123Label: 1-63 of [a-z0-9-], alphanumeric at both ends.
fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    let end = |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (1..=63).contains(&b.len()) && b.iter().all(inner) && end(b.first()) && end(b.last())
}

/// IsValidPortName (IANA_SVC_NAME): 1-15 of [a-z0-9-], a letter somewhere, no `-` at either end,
/// no `--`.
fn is_iana_svc_name(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=15).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.iter().any(u8::is_ascii_lowercase)
        && !s.starts_with('-')
        && !s.ends_with('-')
        && !s.contains("--")
}

/// IsEnvVarName: `[-._a-zA-Z][-._a-zA-Z0-9]*`.
fn is_env_var_name(s: &str) -> bool {
    let ok = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_');
    s.bytes()
        .next()
        .is_some_and(|c| ok(c) && !c.is_ascii_digit())
        && s.bytes().all(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod like the shipped base (trimmed): every rule holds.
    const POD: &str = r#"
hostNetwork: true
securityContext: {seccompProfile: {type: RuntimeDefault}}
containers:
  - name: nodeguard
    env:
      - name: NODE_NAME
        valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
      - name: POD_NAMESPACE
        valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
      - name: APP
        valueFrom: {fieldRef: {fieldPath: "metadata.labels['app']"}}
    ports: [{name: metrics, containerPort: 9913, protocol: TCP}]
    livenessProbe:
      httpGet: {path: /healthz, port: metrics}
      periodSeconds: 10
      timeoutSeconds: 2
      failureThreshold: 3
    readinessProbe:
      httpGet: {path: /readyz, port: 9913}
      successThreshold: 2
    securityContext:
      privileged: false
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      runAsUser: 0
      runAsNonRoot: false
      capabilities: {drop: [ALL], add: [SYS_PTRACE, DAC_READ_SEARCH, NET_ADMIN]}
    volumeMounts:
      - {name: config, mountPath: /etc/nodeguard, readOnly: true}
      - {name: cgroup, mountPath: /host/sys/fs/cgroup, readOnly: true}
volumes:
  - {name: config, configMap: {name: nodeguard-config}}
  - {name: cgroup, hostPath: {path: /sys/fs/cgroup, type: Directory}}
"#;

    /// The findings on POD after `edit`.
    fn findings(edit: impl FnOnce(&mut Value)) -> Vec<String> {
        let mut pod: Value = serde_norway::from_str(POD).unwrap();
        edit(&mut pod);
        let mut r = Report::default();
        check_pod_spec(&pod, "spec.template.spec", &mut r);
        r.errors
    }

    fn c0(pod: &mut Value) -> &mut Value {
        &mut pod["containers"][0]
    }

    /// Exactly one finding, at `path`, containing `msg`.
    fn one(errors: &[String], path: &str, msg: &str) {
        assert_eq!(errors.len(), 1, "{errors:#?}");
        let want = format!("spec.template.spec.{path}: ");
        assert!(
            errors[0].starts_with(&want) && errors[0].contains(msg),
            "want {want}..{msg}, got {errors:#?}"
        );
    }

    #[test]
    fn the_base_pod_passes() {
        assert_eq!(findings(|_| {}), Vec::<String>::new());
    }

    /// The kmsg regression: the component set `privileged: true` over the base's
    /// `allowPrivilegeEscalation: false`; with escalation allowed too it passes.
    #[test]
    fn privileged_without_escalation_is_refused() {
        let e = findings(|p| c0(p)["securityContext"]["privileged"] = true.into());
        one(
            &e,
            "containers[0].securityContext",
            "cannot set `allowPrivilegeEscalation` to false and `privileged` to true",
        );
        let e = findings(|p| {
            c0(p)["securityContext"]["privileged"] = true.into();
            c0(p)["securityContext"]["allowPrivilegeEscalation"] = true.into();
        });
        assert_eq!(e, Vec::<String>::new());
        // Upstream compares the literal "CAP_SYS_ADMIN"; "SYS_ADMIN" (the ports component) passes.
        let e = findings(|p| {
            let add = &mut c0(p)["securityContext"]["capabilities"]["add"];
            add.as_sequence_mut().unwrap().push("SYS_ADMIN".into());
        });
        assert_eq!(e, Vec::<String>::new());
        let e = findings(|p| {
            let add = &mut c0(p)["securityContext"]["capabilities"]["add"];
            add.as_sequence_mut().unwrap().push("CAP_SYS_ADMIN".into());
        });
        assert_eq!(e.len(), 2, "{e:#?}");
        assert!(e[0].contains("`capabilities.Add` CAP_SYS_ADMIN"), "{e:#?}");
        assert!(
            e[1].contains(
                "capabilities.add[3]: unknown capability \"CAP_SYS_ADMIN\" (written without CAP_"
            ),
            "{e:#?}"
        );
    }

    #[test]
    fn capability_names_must_be_known() {
        let e = findings(|p| {
            c0(p)["securityContext"]["capabilities"]["add"][1] = "DAC_READSEARCH".into();
        });
        one(
            &e,
            "containers[0].securityContext.capabilities.add[1]",
            "unknown capability \"DAC_READSEARCH\"",
        );
    }

    #[test]
    fn run_as_non_root_with_uid_0_is_refused_also_from_the_pod() {
        let e = findings(|p| c0(p)["securityContext"]["runAsNonRoot"] = true.into());
        one(&e, "containers[0].securityContext", "verifyRunAsNonRoot");
        let e = findings(|p| {
            c0(p)["securityContext"]
                .as_mapping_mut()
                .unwrap()
                .remove("runAsNonRoot");
            p["securityContext"]["runAsNonRoot"] = true.into();
        });
        one(&e, "containers[0].securityContext", "verifyRunAsNonRoot");
        let e = findings(|p| {
            c0(p)["securityContext"]
                .as_mapping_mut()
                .unwrap()
                .remove("readOnlyRootFilesystem");
        });
        one(
            &e,
            "containers[0].securityContext.readOnlyRootFilesystem",
            "must be stated",
        );
    }

    #[test]
    fn host_path_types_and_paths() {
        let e = findings(|p| p["volumes"][1]["hostPath"]["type"] = "Dir".into());
        one(&e, "volumes[1].hostPath.type", "Unsupported value");
        let e = findings(|p| p["volumes"][1]["hostPath"]["type"] = "CharDevice".into());
        assert_eq!(e, Vec::<String>::new());
        let e = findings(|p| p["volumes"][1]["hostPath"]["path"] = "/sys/../etc".into());
        one(&e, "volumes[1].hostPath.path", "'..'");
    }

    #[test]
    fn host_network_host_port_must_equal_the_container_port() {
        let e = findings(|p| c0(p)["ports"][0]["hostPort"] = 9914.into());
        one(
            &e,
            "containers[0].ports[0].hostPort",
            "must match `containerPort`",
        );
        let e = findings(|p| c0(p)["ports"][0]["hostPort"] = 9913.into());
        assert_eq!(e, Vec::<String>::new());
        let e = findings(|p| {
            c0(p)["ports"][0]["hostPort"] = 9914.into();
            p["hostNetwork"] = false.into();
        });
        assert_eq!(e, Vec::<String>::new());
    }

    #[test]
    fn probes() {
        let e = findings(|p| {
            c0(p)["livenessProbe"]["tcpSocket"] = serde_norway::from_str("{port: 9913}").unwrap();
        });
        one(
            &e,
            "containers[0].livenessProbe.tcpSocket",
            "more than 1 handler",
        );
        let e = findings(|p| {
            c0(p)["livenessProbe"]
                .as_mapping_mut()
                .unwrap()
                .remove("httpGet");
        });
        one(
            &e,
            "containers[0].livenessProbe",
            "must specify a handler type",
        );
        let e = findings(|p| c0(p)["livenessProbe"]["httpGet"]["port"] = "metric".into());
        one(
            &e,
            "containers[0].livenessProbe.httpGet.port",
            "names no container port",
        );
        let e = findings(|p| c0(p)["livenessProbe"]["httpGet"]["port"] = 70000.into());
        one(
            &e,
            "containers[0].livenessProbe.httpGet.port",
            "between 1 and 65535",
        );
        let e = findings(|p| c0(p)["livenessProbe"]["httpGet"]["port"] = "Metrics_1".into());
        one(
            &e,
            "containers[0].livenessProbe.httpGet.port",
            "IANA_SVC_NAME",
        );
        let e = findings(|p| c0(p)["livenessProbe"]["httpGet"]["path"] = "healthz".into());
        one(&e, "containers[0].livenessProbe.httpGet.path", "absolute");
        let e = findings(|p| c0(p)["livenessProbe"]["successThreshold"] = 2.into());
        one(
            &e,
            "containers[0].livenessProbe.successThreshold",
            "must be 1",
        );
        let e = findings(|p| {
            c0(p)["startupProbe"] =
                serde_norway::from_str("{exec: {command: [true]}, successThreshold: 3}").unwrap();
        });
        one(
            &e,
            "containers[0].startupProbe.successThreshold",
            "must be 1",
        );
        for k in ["timeoutSeconds", "periodSeconds", "failureThreshold"] {
            let e = findings(|p| c0(p)["livenessProbe"][k] = 0.into());
            one(
                &e,
                &format!("containers[0].livenessProbe.{k}"),
                "at least 1",
            );
        }
    }

    #[test]
    fn mounts_need_declared_volumes_and_unique_paths() {
        let e = findings(|p| c0(p)["volumeMounts"][1]["name"] = "cgroups".into());
        one(
            &e,
            "containers[0].volumeMounts[1].name",
            "Not found: \"cgroups\"",
        );
        let e = findings(|p| c0(p)["volumeMounts"][1]["mountPath"] = "/etc/nodeguard".into());
        one(
            &e,
            "containers[0].volumeMounts[1].mountPath",
            "must be unique",
        );
    }

    #[test]
    fn env_field_paths_and_names() {
        let e = findings(|p| {
            c0(p)["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] = "spec.node".into();
        });
        one(
            &e,
            "containers[0].env[0].valueFrom.fieldRef.fieldPath",
            "Unsupported value \"spec.node\"",
        );
        let e = findings(|p| {
            c0(p)["env"][2]["valueFrom"]["fieldRef"]["fieldPath"] = "metadata.labels".into();
        });
        one(
            &e,
            "containers[0].env[2].valueFrom.fieldRef.fieldPath",
            "Unsupported",
        );
        let e = findings(|p| c0(p)["env"][0]["name"] = "1NODE".into());
        one(&e, "containers[0].env[0].name", "IsEnvVarName");
    }

    #[test]
    fn names_are_dns_labels_and_iana_service_names() {
        let e = findings(|p| c0(p)["name"] = "Nodeguard".into());
        one(&e, "containers[0].name", "DNS-1123");
        // 16 characters: one over IANA_SVC_NAME's 15 (the probe naming it then fails too).
        let e = findings(|p| c0(p)["ports"][0]["name"] = "metrics-endpoint".into());
        assert!(
            e[0].contains("ports[0].name: \"metrics-endpoint\" is not an IANA_SVC_NAME"),
            "{e:#?}"
        );
        for ok in ["metrics", "m-1", "a"] {
            assert!(is_iana_svc_name(ok), "{ok}");
        }
        for bad in ["", "1234", "-m", "m-", "m--x", "M"] {
            assert!(!is_iana_svc_name(bad), "{bad}");
        }
        assert!(is_dns1123_label("a-1") && !is_dns1123_label("a_1") && !is_dns1123_label(""));
    }

    /// The rendered kmsg component before its fix, as `kubectl kustomize` printed it: refused.
    #[test]
    fn the_old_kmsg_render_is_refused_and_a_stream_without_daemonset_fails() {
        let mut pod: Value = serde_norway::from_str(POD).unwrap();
        c0(&mut pod)["securityContext"]["privileged"] = true.into();
        let mut ds: Value = serde_norway::from_str(
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: nodeguard}\n",
        )
        .unwrap();
        ds["spec"]["template"]["spec"] = pod;
        let text = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: nodeguard}}\n---\n{}",
            serde_norway::to_string(&ds).unwrap()
        );
        let mut r = Report::default();
        assert!(check_rendered(&text, "base+kmsg", &mut r));
        one_prefixed(&r.errors, "base+kmsg: DaemonSet nodeguard: spec.template.spec.containers[0].securityContext: cannot set");
        let mut r = Report::default();
        assert!(!check_rendered("kind: Namespace\n", "x", &mut r));
        assert!(r.has("x: renders no DaemonSet"), "{:?}", r.errors);
    }

    fn one_prefixed(errors: &[String], prefix: &str) {
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert!(errors[0].starts_with(prefix), "{errors:#?}");
    }
}
