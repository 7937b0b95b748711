//! The rendered GitOps example (`kubectl kustomize daemonset/examples/gitops`) and the ArgoCD
//! Application that points at it; and the two YAML reshapes the script needs (CRD objects split
//! off for the schema validator, a rule object's spec for promtool and vmalert).

use super::manifests::is_crd;
use super::yaml::{self, seq, str_at};
use super::Report;
use serde_norway::Value;

/// The objects of a rendered overlay that have a Kubernetes schema, as one YAML stream, and how
/// many CRD objects were left out.
pub fn split_crds(text: &str) -> Result<(String, usize), String> {
    let docs = yaml::docs(text).map_err(|e| e.to_string())?;
    let core: Vec<&Value> = docs.iter().filter(|d| !is_crd(d)).collect();
    Ok((yaml::dump_all(&core)?, docs.len() - core.len()))
}

/// A rule object's `spec` (its groups), as a rule file.
pub fn spec_of(text: &str) -> Result<String, String> {
    let v: Value = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    if v["spec"].is_null() {
        return Err("no spec".to_owned());
    }
    serde_norway::to_string(&v["spec"]).map_err(|e| e.to_string())
}

pub fn check(
    rendered: &str,
    prefix_source: &Value,
    app: &Value,
    is_file: impl Fn(&str) -> bool,
    r: &mut Report,
) {
    let docs = match yaml::docs(rendered) {
        Ok(d) => d,
        Err(e) => return r.fail(format!("the rendered GitOps example is not YAML: {e}")),
    };
    let mut kinds: Vec<&str> = docs.iter().map(|d| str_at(d, "kind")).collect();
    kinds.sort_unstable();
    for k in ["DaemonSet", "VMPodScrape", "VMRule", "ConfigMap"] {
        if !kinds.contains(&k) {
            r.fail(format!("the GitOps example renders no {k}"));
        }
    }
    if docs.iter().any(|d| {
        str_at(d, "kind") == "ConfigMap"
            && str_at(&d["metadata"], "name") == "nodeguard-runbook-url"
    }) {
        r.fail("the local-config runbook ConfigMap would be applied");
    }
    let prefix = str_at(&prefix_source["data"], "prefix");
    let urls: Vec<&str> = docs
        .iter()
        .filter(|d| str_at(d, "kind") == "VMRule")
        .flat_map(|d| seq(&d["spec"]["groups"]))
        .flat_map(|g| seq(&g["rules"]))
        .filter(|x| x["alert"].is_string())
        .map(|x| str_at(&x["annotations"], "runbook_url"))
        .collect();
    let want = format!("{prefix}/docs/runbooks/");
    let bad: Vec<&&str> = urls
        .iter()
        .filter(|u| !u.starts_with(&want) || !is_file(&u[prefix.len() + 1..]))
        .collect();
    if prefix.is_empty() || urls.is_empty() || !bad.is_empty() {
        r.fail(format!(
            "runbook prefix not replaced everywhere: {:?}",
            &bad[..bad.len().min(3)]
        ));
    }
    let spec = &app["spec"];
    if (str_at(app, "apiVersion"), str_at(app, "kind")) != ("argoproj.io/v1alpha1", "Application") {
        r.fail("application.yaml is not an argoproj.io/v1alpha1 Application");
    }
    let path = str_at(&spec["source"], "path");
    if !is_file(&format!("{path}/kustomization.yaml")) {
        r.fail(format!(
            "the Application's source.path {path:?} is not a kustomization of this repository"
        ));
    }
    for k in ["repoURL", "targetRevision"] {
        if str_at(&spec["source"], k).is_empty() {
            r.fail(format!("the Application has no source.{k}"));
        }
    }
    if str_at(&spec["destination"], "server").is_empty() || str_at(spec, "project").is_empty() {
        r.fail("the Application needs spec.project and spec.destination.server");
    }
    if !seq(&spec["syncPolicy"]["syncOptions"])
        .iter()
        .any(|o| o.as_str() == Some("ServerSideApply=true"))
    {
        r.fail("the Application must sync server-side (the dashboard ConfigMap is large)");
    }
    r.ok(format!(
        "examples/gitops renders {} objects ({}); {} runbook links under {prefix}",
        docs.len(),
        kinds.join(", "),
        urls.len()
    ));
    r.ok(format!(
        "examples/argocd/application.yaml: Application -> {path}"
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const APP: &str = "apiVersion: argoproj.io/v1alpha1\nkind: Application\nspec:\n  project: default\n  source: {repoURL: r, targetRevision: t, path: daemonset/examples/gitops}\n  destination: {server: s}\n  syncPolicy: {syncOptions: [ServerSideApply=true]}\n";

    fn rendered(url: &str) -> String {
        format!(
            "kind: DaemonSet\n---\nkind: VMPodScrape\n---\nkind: ConfigMap\nmetadata: {{name: c}}\n---\nkind: VMRule\nspec:\n  groups:\n    - rules:\n        - alert: A\n          annotations: {{runbook_url: '{url}'}}\n"
        )
    }

    fn is_file(p: &str) -> bool {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(p).is_file()
    }

    fn prefix() -> Value {
        serde_norway::from_str("data: {prefix: 'https://x.example/nodeguard'}").unwrap()
    }

    #[test]
    fn a_replaced_prefix_passes_and_a_stale_one_fails() {
        let app: Value = serde_norway::from_str(APP).unwrap();
        let mut r = Report::default();
        let ok = rendered("https://x.example/nodeguard/docs/runbooks/NodeguardActionTaken.md");
        check(&ok, &prefix(), &app, is_file, &mut r);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let stale =
            rendered("https://git.example.org/you/nodeguard/docs/runbooks/NodeguardActionTaken.md");
        check(&stale, &prefix(), &app, is_file, &mut r);
        assert!(r.has("runbook prefix not replaced"), "{:?}", r.errors);
    }

    #[test]
    fn an_application_without_server_side_apply_fails() {
        let app: Value =
            serde_norway::from_str(&APP.replace("ServerSideApply=true", "Prune=true")).unwrap();
        let mut r = Report::default();
        check(&rendered(""), &prefix(), &app, is_file, &mut r);
        assert!(r.has("sync server-side"), "{:?}", r.errors);
    }

    #[test]
    fn crds_are_split_off_and_specs_extracted() {
        let (core, n) = split_crds(
            "apiVersion: v1\nkind: Service\n---\napiVersion: operator.victoriametrics.com/v1beta1\nkind: VMRule\n",
        )
        .unwrap();
        assert_eq!(n, 1);
        assert!(core.contains("kind: Service") && !core.contains("VMRule"));
        let spec = spec_of("kind: VMRule\nspec:\n  groups: []\n").unwrap();
        assert_eq!(spec.trim(), "groups: []");
    }
}
