//! The daemonset/ tree: every kustomization's references exist and every manifest is listed; the
//! objects they make are one agent with least privilege (as docs/deploy.md states it), a config
//! whose host paths are mounted, a headless Service and scrape objects that select the agent, rule
//! objects equal to the rule file, the dashboard ConfigMap equal to dashboards/nodeguard.json, and
//! checkov skips that give a reason.

use super::pod::{check_config, check_daemonset, container, ports};
use super::yaml::{self, basename, dirname, join, pairs, seq, str_at, subset};
use super::Report;
use serde_norway::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

pub const ROOT: &str = "daemonset";
const CRD_GROUPS: [&str; 2] = ["operator.victoriametrics.com/", "monitoring.coreos.com/"];

/// Every YAML file of daemonset/ that holds Kubernetes objects (rules/ holds rule groups;
/// examples/ is checked on its own), by repository-relative path.
pub struct Tree {
    pub docs: BTreeMap<String, Vec<Value>>,
}

impl Tree {
    pub fn load(repo: &Path, r: &mut Report) -> Tree {
        let mut docs = BTreeMap::new();
        let mut stack = vec![ROOT.to_owned()];
        while let Some(dir) = stack.pop() {
            if dir == format!("{ROOT}/rules") || dir == format!("{ROOT}/examples") {
                continue;
            }
            let entries = match std::fs::read_dir(repo.join(&dir)) {
                Ok(e) => e,
                Err(e) => {
                    r.fail(format!("{dir}: {e}"));
                    continue;
                }
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let rel = format!("{dir}/{name}");
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(rel);
                } else if name.ends_with(".yaml") || name.ends_with(".yml") {
                    match yaml::read(repo, &rel)
                        .and_then(|t| yaml::docs(&t).map_err(|e| format!("{rel}: not YAML: {e}")))
                    {
                        Ok(d) => {
                            docs.insert(rel, d);
                        }
                        Err(e) => r.fail(e),
                    }
                }
            }
        }
        Tree { docs }
    }
}

/// What the kustomizations reference, and the objects they make.
#[derive(Default)]
pub struct Layout {
    pub kustomizations: Vec<String>,
    pub referenced: BTreeSet<String>,
    pub patches: BTreeSet<String>,
    /// The ConfigMaps of configMapGenerator entries, as kustomize would make them (before it
    /// adds the content hash to the name).
    pub generated: Vec<(String, Value)>,
    /// Kustomizations to render (components only through them), and the GitOps example.
    pub builds: Vec<String>,
}

impl Layout {
    pub fn new(repo: &Path, tree: &Tree, r: &mut Report) -> Layout {
        let mut l = Layout::default();
        let mut gen_files = BTreeSet::new();
        l.kustomizations = tree
            .docs
            .keys()
            .filter(|p| basename(p) == "kustomization.yaml")
            .cloned()
            .collect();
        for k in &l.kustomizations {
            let Some(d) = tree.docs[k].first() else {
                r.fail(format!("{k}: empty"));
                continue;
            };
            let base = dirname(k);
            let want = if base.starts_with(&format!("{ROOT}/components/")) {
                "Component"
            } else {
                "Kustomization"
            };
            if str_at(d, "kind") != want {
                r.fail(format!("{k}: kind is not {want}"));
            }
            for c in seq(&d["components"]).iter().filter_map(Value::as_str) {
                let ck = format!("{}/kustomization.yaml", join(base, c));
                let kind = yaml::load(repo, &ck).map(|v| str_at(&v, "kind").to_owned());
                if kind.as_deref() != Ok("Component") {
                    r.fail(format!(
                        "{k}: component {c} is not a directory with a Component kustomization.yaml"
                    ));
                }
            }
            for res in seq(&d["resources"]).iter().filter_map(Value::as_str) {
                let p = join(base, res);
                let full = repo.join(&p);
                if full.is_dir() {
                    if !full.join("kustomization.yaml").is_file() {
                        r.fail(format!(
                            "{k}: resource {res} is a directory without kustomization.yaml"
                        ));
                    }
                } else if !full.is_file() {
                    r.fail(format!("{k}: resource {res} does not exist"));
                } else {
                    l.referenced.insert(p);
                }
            }
            // configMapGenerator: its files are data, not objects; the ConfigMap it makes (named
            // with a content hash by kustomize, which rewrites the references) is checked like
            // a listed one.
            for g in seq(&d["configMapGenerator"]) {
                let mut data = serde_norway::Mapping::new();
                for f in seq(&g["files"]).iter().filter_map(Value::as_str) {
                    let (key, rel) = f.rsplit_once('=').unwrap_or((basename(f), f));
                    let fp = join(base, rel);
                    match std::fs::read_to_string(repo.join(&fp)) {
                        Ok(text) => {
                            data.insert(key.into(), text.into());
                            gen_files.insert(fp);
                        }
                        Err(_) => {
                            r.fail(format!("{k}: configMapGenerator file {rel} does not exist"))
                        }
                    }
                }
                let mut meta = serde_norway::Mapping::new();
                meta.insert("name".into(), g["name"].clone());
                if !g["namespace"].is_null() {
                    meta.insert("namespace".into(), g["namespace"].clone());
                }
                if !g["options"]["labels"].is_null() {
                    meta.insert("labels".into(), g["options"]["labels"].clone());
                }
                let mut cm = serde_norway::Mapping::new();
                cm.insert("apiVersion".into(), "v1".into());
                cm.insert("kind".into(), "ConfigMap".into());
                cm.insert("metadata".into(), meta.into());
                cm.insert("data".into(), data.into());
                l.generated.push((k.clone(), cm.into()));
            }
            for pt in seq(&d["patches"]) {
                let rel = str_at(pt, "path");
                let p = join(base, rel);
                if !repo.join(&p).is_file() {
                    r.fail(format!("{k}: patch {rel} does not exist"));
                }
                l.patches.insert(p);
            }
            r.ok(format!(
                "{k}: {} resources, {} components, {} patches",
                seq(&d["resources"]).len(),
                seq(&d["components"]).len(),
                seq(&d["patches"]).len()
            ));
            if str_at(d, "kind") == "Kustomization" {
                l.builds.push(base.to_owned());
            }
        }
        for p in tree.docs.keys() {
            let listed = l.kustomizations.contains(p)
                || l.referenced.contains(p)
                || l.patches.contains(p)
                || gen_files.contains(p);
            if !listed {
                r.fail(format!("{p}: not listed in any kustomization.yaml"));
            }
        }
        l.builds.push(format!("{ROOT}/examples/gitops"));
        l
    }

    /// Every object: generated ConfigMaps first, then the listed files' documents.
    pub fn objects<'a>(&'a self, tree: &'a Tree) -> Vec<(&'a str, &'a Value)> {
        let mut out: Vec<(&str, &Value)> = self
            .generated
            .iter()
            .map(|(p, d)| (p.as_str(), d))
            .collect();
        for p in &self.referenced {
            for d in tree.docs.get(p).into_iter().flatten() {
                out.push((p, d));
            }
        }
        out
    }

    /// Listed files that hold only core Kubernetes objects (schema-checked by the script).
    pub fn core_files(&self, tree: &Tree) -> Vec<String> {
        self.referenced
            .iter()
            .filter(|p| tree.docs.get(*p).into_iter().flatten().all(|d| !is_crd(d)))
            .cloned()
            .collect()
    }
}

/// Components that patch the DaemonSet (they change the pod), by directory: each is rendered
/// alone on the base and all together ([`combinations`]).
pub fn pod_components(tree: &Tree) -> Vec<String> {
    let prefix = format!("{ROOT}/components/");
    tree.docs
        .iter()
        .filter(|(p, _)| p.starts_with(&prefix) && basename(p) == "kustomization.yaml")
        .filter(|(_, d)| {
            d.first().is_some_and(|k| {
                seq(&k["patches"])
                    .iter()
                    .any(|pt| str_at(&pt["target"], "kind") == "DaemonSet")
            })
        })
        .map(|(p, _)| dirname(p).to_owned())
        .collect()
}

/// The kustomizations that render the base with each pod component alone, all of them, and all
/// in reverse order (they must compose in any order): (name, kustomization.yaml text), every
/// path relative to the directory the file is written to, `up` being that directory's way back
/// to the repository root (kustomize refuses absolute paths).
pub fn combinations(components: &[String], up: &str) -> Vec<(String, String)> {
    let text = |comps: &[&String]| {
        let mut t = format!(
            "# Generated by nodeguard-gen policy: rendered by scripts/ship-check.\n\
             apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - {up}/{ROOT}/base\ncomponents:\n"
        );
        for c in comps {
            t.push_str(&format!("  - {up}/{c}\n"));
        }
        t
    };
    let mut out: Vec<(String, String)> = components
        .iter()
        .map(|c| (format!("base+{}", basename(c)), text(&[c])))
        .collect();
    if components.len() > 1 {
        let all: Vec<&String> = components.iter().collect();
        out.push(("base+all".to_owned(), text(&all)));
        let rev: Vec<&String> = components.iter().rev().collect();
        out.push(("base+all-reversed".to_owned(), text(&rev)));
    }
    out
}

/// `to` relative to the directory `from` (both absolute, already canonical).
pub fn relative(from: &Path, to: &Path) -> String {
    let f: Vec<_> = from.components().collect();
    let t: Vec<_> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_owned(); f.len() - common];
    parts.extend(
        t[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    if parts.is_empty() {
        ".".to_owned()
    } else {
        parts.join("/")
    }
}

pub fn is_crd(d: &Value) -> bool {
    let api = str_at(d, "apiVersion");
    CRD_GROUPS.iter().any(|g| api.starts_with(g))
}

fn by_kind<'a>(objs: &[(&'a str, &'a Value)], kind: &str) -> Vec<(&'a str, &'a Value)> {
    objs.iter()
        .filter(|(_, d)| str_at(d, "kind") == kind)
        .copied()
        .collect()
}

fn one<'a>(objs: &[(&'a str, &'a Value)], kind: &str, r: &mut Report) -> Option<&'a Value> {
    let xs = by_kind(objs, kind);
    if xs.len() != 1 {
        r.fail(format!("expected exactly one {kind}, found {}", xs.len()));
        return None;
    }
    Some(xs[0].1)
}

/// The checks on the objects. Returns the agent config text of the ConfigMap (for
/// `nodeguard check-config`).
pub fn check_objects(
    objs: &[(&str, &Value)],
    source_groups: &Value,
    dashboard_json: &serde_json::Value,
    r: &mut Report,
) -> Option<String> {
    let ns = one(objs, "Namespace", r);
    let ds = one(objs, "DaemonSet", r);
    let cm = by_kind(objs, "ConfigMap")
        .into_iter()
        .find(|(_, d)| str_at(&d["metadata"], "name") == "nodeguard-config")
        .map(|(_, d)| d);
    if cm.is_none() {
        r.fail("no ConfigMap nodeguard-config (the agent config)");
    }
    let svc = one(objs, "Service", r);
    let sa = one(objs, "ServiceAccount", r);
    let (Some(ns), Some(ds), Some(cm), Some(svc), Some(sa)) = (ns, ds, cm, svc, sa) else {
        return None;
    };
    let nsname = str_at(&ns["metadata"], "name");
    for (p, d) in objs {
        if str_at(d, "kind") != "Namespace" && str_at(&d["metadata"], "namespace") != nsname {
            r.fail(format!(
                "{p}: {} {} is not in namespace {nsname}",
                str_at(d, "kind"),
                str_at(&d["metadata"], "name")
            ));
        }
    }
    check_daemonset(ds, sa, r);
    let cfg = str_at(&cm["data"], "nodeguard.yaml").to_owned();
    check_config(&cfg, ds, str_at(&cm["metadata"], "name"), r);
    check_selection(ds, svc, objs, r);
    for kind in ["VMRule", "PrometheusRule"] {
        check_rule_object(kind, objs, source_groups, r);
    }
    check_dashboard(objs, dashboard_json, r);
    check_checkov_skips(objs, r);
    Some(cfg)
}

/// The Service and the scrape objects select the agent's pods and its metrics port.
pub fn check_selection(ds: &Value, svc: &Value, objs: &[(&str, &Value)], r: &mut Report) {
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    let ports = container(ds).map(ports).unwrap_or_default();
    if str_at(&svc["spec"], "clusterIP") != "None" {
        r.fail("the Service must be headless");
    }
    if !subset(&svc["spec"]["selector"], labels) {
        r.fail("Service selector does not match the agent's pods");
    }
    for kind in ["VMPodScrape", "PodMonitor"] {
        let xs = by_kind(objs, kind);
        if xs.is_empty() {
            r.fail(format!("no {kind} in any kustomization"));
        }
        for (p, d) in xs {
            let s = &d["spec"];
            if !subset(&s["selector"]["matchLabels"], labels) {
                r.fail(format!("{p}: selector does not match the agent's pods"));
            }
            for ep in seq(&s["podMetricsEndpoints"]) {
                let port = str_at(ep, "port");
                if !ports.contains_key(port) {
                    r.fail(format!("{p}: port {port} is not a named container port"));
                }
                let relabel = seq(&ep["relabelConfigs"])
                    .iter()
                    .chain(seq(&ep["relabelings"]));
                let job = relabel.into_iter().any(|x| {
                    str_at(x, "targetLabel") == "job" && str_at(x, "replacement") == "nodeguard"
                });
                if !job {
                    r.fail(format!(
                        "{p}: must set job=nodeguard (the agent-health alerts select it)"
                    ));
                }
                if ep["honorLabels"].as_bool() != Some(true) {
                    r.fail(format!(
                        "{p}: honorLabels must be true (the agent's namespace/pod/container labels)"
                    ));
                }
            }
            r.ok(format!("{p}: {kind} checked (CRD: no schema)"));
        }
    }
}

/// A rule object (no published schema here): the structure the operators' CRDs require, and
/// exactly the groups of the rule file.
pub fn check_rule_object(kind: &str, objs: &[(&str, &Value)], source: &Value, r: &mut Report) {
    let xs = by_kind(objs, kind);
    let [(p, d)] = xs[..] else {
        r.fail(format!("expected exactly one {kind}, found {}", xs.len()));
        return;
    };
    let groups = &d["spec"]["groups"];
    if groups != source {
        r.fail(format!(
            "{p}: spec.groups differ from rules/nodeguard.rules.yaml (run cargo run --bin nodeguard-gen)"
        ));
        return;
    }
    let names: Vec<&str> = seq(groups).iter().map(|g| str_at(g, "name")).collect();
    if names.iter().collect::<BTreeSet<_>>().len() != names.len() {
        r.fail(format!("{p}: group names repeat: {names:?}"));
    }
    let mut n = 0;
    for g in seq(groups) {
        for rule in seq(&g["rules"]) {
            n += 1;
            let what = rule["alert"].as_str().or(rule["record"].as_str());
            if what.is_none() || !rule["expr"].is_string() {
                r.fail(format!(
                    "{p}: group {}: a rule without alert/record or expr",
                    str_at(g, "name")
                ));
            }
            let what = what.unwrap_or("?");
            for k in ["for", "keep_firing_for"] {
                if let Some(v) = rule.get(k) {
                    let s = v
                        .as_str()
                        .map(str::to_owned)
                        .unwrap_or_else(|| format!("{v:?}"));
                    if !yaml::is_duration(&s) {
                        r.fail(format!("{p}: {what}: {k} {s:?} is not a duration"));
                    }
                }
            }
            for k in ["labels", "annotations"] {
                if !pairs(&rule[k]).all(|(_, v)| v.is_string()) {
                    r.fail(format!("{p}: {what}: every {k} value must be a string"));
                }
            }
        }
    }
    r.ok(format!(
        "{p}: {kind}, {} groups, {n} rules, equal to the rule file",
        names.len()
    ));
}

/// The dashboard ConfigMap: what the Grafana sidecar selects, holding exactly the dashboard.
pub fn check_dashboard(objs: &[(&str, &Value)], json: &serde_json::Value, r: &mut Report) {
    let Some((_, dash)) = by_kind(objs, "ConfigMap")
        .into_iter()
        .find(|(_, d)| str_at(&d["metadata"], "name") == "nodeguard-dashboard")
    else {
        r.fail("no ConfigMap nodeguard-dashboard");
        return;
    };
    if str_at(&dash["metadata"]["labels"], "grafana_dashboard") != "1" {
        r.fail(
            "nodeguard-dashboard: label grafana_dashboard must be \"1\" (the sidecar's default)",
        );
    }
    let body = str_at(&dash["data"], "nodeguard.json");
    if serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .as_ref()
        != Some(json)
    {
        r.fail("nodeguard-dashboard: data differs from dashboards/nodeguard.json");
    }
    // Client-side apply copies the object into an annotation capped at 256 KiB.
    if body.len() > 200 * 1024 {
        r.fail(format!(
            "nodeguard-dashboard: {} bytes, over 200 KiB",
            body.len()
        ));
    }
    r.ok(format!(
        "nodeguard-dashboard: grafana_dashboard=1, {} bytes, equal to dashboards/nodeguard.json",
        body.len()
    ));
}

/// checkov skips carry the check id and a reason of at least 20 characters.
pub fn check_checkov_skips(objs: &[(&str, &Value)], r: &mut Report) {
    for (p, d) in objs {
        for (k, v) in pairs(&d["metadata"]["annotations"]) {
            if !k.starts_with("checkov.io/skip") {
                continue;
            }
            let v = v.as_str().unwrap_or("");
            match checkov_skip(v) {
                Some((id, reason)) => r.note(format!("skip {id}: {reason}")),
                None => r.fail(format!(
                    "{p}: {k} must be CKV_..=<reason of at least 20 characters>: {v:?}"
                )),
            }
        }
    }
}

/// `CKV_K8S_<n>=<reason>` or `CKV2_K8S_<n>=<reason>`, the reason at least 20 characters.
fn checkov_skip(v: &str) -> Option<(&str, &str)> {
    let (id, reason) = v.split_once('=')?;
    let n = id
        .strip_prefix("CKV_K8S_")
        .or_else(|| id.strip_prefix("CKV2_K8S_"))?;
    let ok = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && reason.chars().count() >= 20;
    ok.then_some((id, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    struct Shipped {
        tree: Tree,
        layout: Layout,
        groups: Value,
        json: serde_json::Value,
    }

    fn shipped() -> Shipped {
        let mut r = Report::default();
        let tree = Tree::load(repo(), &mut r);
        let layout = Layout::new(repo(), &tree, &mut r);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let groups =
            yaml::load(repo(), "daemonset/rules/nodeguard.rules.yaml").unwrap()["groups"].clone();
        let json = serde_json::from_str(&yaml::read(repo(), "dashboards/nodeguard.json").unwrap())
            .unwrap();
        Shipped {
            tree,
            layout,
            groups,
            json,
        }
    }

    /// The checks on the shipped objects after `edit` changed the object of `kind`.
    fn check_edited(kind: &str, edit: impl FnOnce(&mut Value)) -> Report {
        let s = shipped();
        let mut objs: Vec<(String, Value)> = s
            .layout
            .objects(&s.tree)
            .into_iter()
            .map(|(p, d)| (p.to_owned(), d.clone()))
            .collect();
        let target = objs
            .iter_mut()
            .find(|(_, d)| str_at(d, "kind") == kind)
            .expect("kind shipped");
        edit(&mut target.1);
        let refs: Vec<(&str, &Value)> = objs.iter().map(|(p, d)| (p.as_str(), d)).collect();
        let mut r = Report::default();
        check_objects(&refs, &s.groups, &s.json, &mut r);
        r
    }

    fn c0(ds: &mut Value) -> &mut Value {
        &mut ds["spec"]["template"]["spec"]["containers"][0]
    }

    #[test]
    fn the_shipped_tree_passes() {
        let s = shipped();
        let mut r = Report::default();
        let cfg = check_objects(&s.layout.objects(&s.tree), &s.groups, &s.json, &mut r);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert!(cfg.unwrap().contains("dry_run"));
        let core = s.layout.core_files(&s.tree);
        assert!(core.iter().any(|p| p == "daemonset/base/daemonset.yaml"));
        assert!(!core.iter().any(|p| p.contains("vmrule")));
        assert!(s
            .layout
            .builds
            .iter()
            .any(|b| b == "daemonset/examples/gitops"));
    }

    #[test]
    fn privilege_changes_are_caught() {
        let r = check_edited("DaemonSet", |d| {
            c0(d)["securityContext"]["privileged"] = true.into();
        });
        assert!(
            r.has("securityContext.privileged must be false"),
            "{:?}",
            r.errors
        );
        let r = check_edited("DaemonSet", |d| {
            let add = &mut c0(d)["securityContext"]["capabilities"]["add"];
            add.as_sequence_mut().unwrap().push("SYS_ADMIN".into());
        });
        assert!(r.has("beyond") && r.has("SYS_ADMIN"), "{:?}", r.errors);
        let r = check_edited("DaemonSet", |d| {
            d["spec"]["template"]["spec"]["hostPID"] = false.into();
        });
        assert!(r.has("needs hostPID: true"), "{:?}", r.errors);
        let r = check_edited("DaemonSet", |d| {
            for m in c0(d)["volumeMounts"].as_sequence_mut().unwrap() {
                m.as_mapping_mut().unwrap().remove("readOnly");
            }
        });
        assert!(r.has("must be readOnly in the base"), "{:?}", r.errors);
        let r = check_edited("DaemonSet", |d| {
            c0(d)["env"] = Value::Sequence(vec![]);
        });
        assert!(r.has("NODE_NAME"), "{:?}", r.errors);
    }

    #[test]
    fn the_config_must_match_the_pod() {
        let r = check_edited("ConfigMap", |d| {
            let text =
                str_at(&d["data"], "nodeguard.yaml").replace("dry_run: true", "dry_run: false");
            d["data"]["nodeguard.yaml"] = text.into();
        });
        assert!(r.has("must be dry-run"), "{:?}", r.errors);
        let r = check_edited("ConfigMap", |d| {
            let text: String = str_at(&d["data"], "nodeguard.yaml")
                .lines()
                .map(|l| {
                    if l.starts_with("listen:") {
                        "listen: 0.0.0.0:1234\n".to_owned()
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect();
            d["data"]["nodeguard.yaml"] = text.into();
        });
        assert!(r.has("listen port 1234"), "{:?}", r.errors);
        let r = check_edited("DaemonSet", |d| {
            c0(d)["args"] = Value::Sequence(vec!["--config".into(), "/tmp/x.yaml".into()]);
        });
        assert!(r.has("--config must point into"), "{:?}", r.errors);
    }

    #[test]
    fn objects_must_select_the_agent_and_carry_their_sources() {
        let r = check_edited("Service", |d| {
            d["spec"]["selector"]["app.kubernetes.io/name"] = "other".into();
        });
        assert!(r.has("Service selector"), "{:?}", r.errors);
        let r = check_edited("VMRule", |d| {
            d["spec"]["groups"][0]["rules"][0]["expr"] = "vector(1)".into();
        });
        assert!(r.has("spec.groups differ"), "{:?}", r.errors);
        let r = check_edited("VMPodScrape", |d| {
            d["spec"]["podMetricsEndpoints"][0]["honorLabels"] = false.into();
        });
        assert!(r.has("honorLabels must be true"), "{:?}", r.errors);
        let r = check_edited("DaemonSet", |d| {
            d["metadata"]["annotations"]["checkov.io/skip1"] = "CKV_K8S_17=because".into();
        });
        assert!(r.has("checkov.io/skip1 must be"), "{:?}", r.errors);
    }

    #[test]
    fn the_dashboard_configmap_must_hold_the_dashboard() {
        let s = shipped();
        let objs = s.layout.objects(&s.tree);
        let mut r = Report::default();
        check_dashboard(&objs, &serde_json::json!({"title": "other"}), &mut r);
        assert!(r.has("data differs"), "{:?}", r.errors);
    }

    #[test]
    fn an_unlisted_manifest_is_caught() {
        let mut r = Report::default();
        let mut tree = Tree::load(repo(), &mut r);
        tree.docs.insert(
            "daemonset/base/stray.yaml".to_owned(),
            yaml::docs("kind: ConfigMap\n").unwrap(),
        );
        Layout::new(repo(), &tree, &mut r);
        assert!(
            r.has("daemonset/base/stray.yaml: not listed"),
            "{:?}",
            r.errors
        );
    }

    #[test]
    fn pod_components_are_rendered_alone_and_together() {
        let s = shipped();
        let comps = pod_components(&s.tree);
        assert_eq!(
            comps,
            [
                "daemonset/components/actions",
                "daemonset/components/kmsg",
                "daemonset/components/ports"
            ]
        );
        let combos = combinations(&comps, "../../r");
        let names: Vec<&str> = combos.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "base+actions",
                "base+kmsg",
                "base+ports",
                "base+all",
                "base+all-reversed"
            ]
        );
        let k: Value = serde_norway::from_str(&combos[1].1).unwrap();
        assert_eq!(str_at(&k, "kind"), "Kustomization");
        assert_eq!(k["resources"][0], "../../r/daemonset/base");
        assert_eq!(k["components"][0], "../../r/daemonset/components/kmsg");
        let rev: Value = serde_norway::from_str(&combos[4].1).unwrap();
        assert_eq!(rev["components"][0], "../../r/daemonset/components/ports");
        assert_eq!(seq(&rev["components"]).len(), 3);
        assert_eq!(
            relative(Path::new("/tmp/w/combos/x"), Path::new("/work/repo")),
            "../../../../work/repo"
        );
        assert_eq!(relative(Path::new("/a/b"), Path::new("/a/b")), ".");
    }

    #[test]
    fn checkov_skip_grammar() {
        assert_eq!(
            checkov_skip("CKV2_K8S_6=a reason that is long enough"),
            Some(("CKV2_K8S_6", "a reason that is long enough"))
        );
        assert_eq!(checkov_skip("CKV_K8S_6=short"), None);
        assert_eq!(checkov_skip("CKV_K8S_=a reason that is long enough"), None);
        assert_eq!(checkov_skip("CKV_AWS_1=a reason that is long enough"), None);
    }
}
