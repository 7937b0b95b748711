//! The alert rules, kubernetes-mixin style: a severity, a static summary, a templated
//! description, a runbook under one replaceable prefix that quotes the rule's current expression,
//! only metrics of the catalog (`nodeguard::export::catalog`, which docs/metrics.md is checked
//! against), and a unit test where each alert fires and one where it stays silent.
//! Also: every Alertmanager inhibit rule we ship is sourced by one of our alerts.

use super::yaml::{self, metric_names, seq, str_at};
use super::Report;
use serde_norway::Value;
use std::collections::BTreeSet;
use std::path::Path;

pub const RULES: &str = "daemonset/rules/nodeguard.rules.yaml";
const TESTS: &str = "daemonset/rules/tests";
const RUNBOOKS: &str = "docs/runbooks";
const INHIBIT: &str = "daemonset/examples/alertmanager/alertmanager.yaml";

/// What the checks read from the repository.
pub struct Inputs {
    pub rules: Value,
    /// The names queries use for the catalog's families (`nodeguard_..._total` for counters).
    pub documented: BTreeSet<String>,
    /// Runbook pages: alert name -> text.
    pub runbooks: Vec<(String, String)>,
    /// The promtool unit test files.
    pub tests: Vec<Value>,
}

impl Inputs {
    pub fn load(repo: &Path) -> Result<Inputs, String> {
        let mut runbooks = Vec::new();
        for name in sorted_dir(repo, RUNBOOKS)? {
            if let Some(alert) = name.strip_suffix(".md") {
                runbooks.push((
                    alert.to_owned(),
                    yaml::read(repo, &format!("{RUNBOOKS}/{name}"))?,
                ));
            }
        }
        let mut tests = Vec::new();
        for name in sorted_dir(repo, TESTS)? {
            if name.ends_with(".yaml") {
                tests.push(yaml::load(repo, &format!("{TESTS}/{name}"))?);
            }
        }
        Ok(Inputs {
            rules: yaml::load(repo, RULES)?,
            documented: nodeguard::export::catalog::exposed_names()
                .into_iter()
                .collect(),
            runbooks,
            tests,
        })
    }
}

fn sorted_dir(repo: &Path, rel: &str) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = std::fs::read_dir(repo.join(rel))
        .map_err(|e| format!("{rel}: {e}"))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub fn check_alerts(inp: &Inputs, r: &mut Report) {
    let alerts: Vec<&Value> = seq(&inp.rules["groups"])
        .iter()
        .flat_map(|g| seq(&g["rules"]))
        .filter(|x| x["alert"].is_string())
        .collect();
    let names: BTreeSet<&str> = alerts.iter().map(|a| str_at(a, "alert")).collect();
    let mut prefixes = BTreeSet::new();
    for a in &alerts {
        let name = str_at(a, "alert");
        if !["critical", "warning", "info"].contains(&str_at(&a["labels"], "severity")) {
            r.fail(format!(
                "{name}: severity must be critical, warning or info"
            ));
        }
        let ann = &a["annotations"];
        let url = str_at(ann, "runbook_url");
        let (prefix, page) = url.split_once("/docs/runbooks/").unwrap_or((url, ""));
        prefixes.insert(prefix.to_owned());
        let local = format!("{RUNBOOKS}/{name}.md");
        let runbook = inp.runbooks.iter().find(|(n, _)| n == name).map(|(_, t)| t);
        match runbook {
            Some(text) if prefix.starts_with("https://") && page == format!("{name}.md") => {
                if !words(text).contains(&words(str_at(a, "expr"))) {
                    r.fail(format!(
                        "{name}: {local} does not quote the rule's current expression"
                    ));
                }
            }
            _ => r.fail(format!(
                "{name}: runbook_url {url:?} is not <https prefix>/{local} of an existing page"
            )),
        }
        for k in ["summary", "description"] {
            if str_at(ann, k).is_empty() {
                r.fail(format!("{name}: no {k}"));
            }
        }
        if str_at(ann, "summary").contains("{{") {
            r.fail(format!(
                "{name}: summary must be a static headline (values go in description)"
            ));
        }
        if !str_at(ann, "description").contains("{{") {
            r.fail(format!(
                "{name}: description must carry the values ({{{{ $labels.x }}}}, {{{{ $value }}}})"
            ));
        }
        for m in metric_names(str_at(a, "expr")) {
            if !inp.documented.contains(m) {
                r.fail(format!(
                    "{name}: {m} is not in the metric catalog (src/export/catalog, docs/metrics.md)"
                ));
            }
        }
    }
    if prefixes.len() != 1 {
        r.fail(format!(
            "runbook_url prefixes differ (one replaceable prefix): {prefixes:?}"
        ));
    }
    for (page, _) in &inp.runbooks {
        if !names.contains(page.as_str()) {
            r.fail(format!("{RUNBOOKS}/{page}.md: no alert of that name"));
        }
    }
    let (mut fires, mut silent) = (BTreeSet::new(), BTreeSet::new());
    for t in inp.tests.iter().flat_map(|f| seq(&f["tests"])) {
        for a in seq(&t["alert_rule_test"]) {
            let fired = !seq(&a["exp_alerts"]).is_empty();
            (if fired { &mut fires } else { &mut silent }).insert(str_at(a, "alertname"));
        }
    }
    for name in &names {
        if !fires.contains(name) {
            r.fail(format!("{name}: no unit test where it fires"));
        }
        if !silent.contains(name) {
            r.fail(format!("{name}: no unit test where it stays silent"));
        }
    }
    r.ok(format!(
        "{} alerts: severity, static summary, templated description, runbook under {} quoting the expression, documented metrics, fired and silent in tests",
        alerts.len(),
        prefixes.iter().next().map_or("?", String::as_str)
    ));
}

/// Every inhibit rule of the Alertmanager example is sourced by a nodeguard alert.
pub fn check_inhibit(rules: &Value, am: &Value, r: &mut Report) {
    let mut ours: BTreeSet<&str> = seq(&rules["groups"])
        .iter()
        .flat_map(|g| seq(&g["rules"]))
        .filter_map(|x| x["alert"].as_str())
        .collect();
    // The agent's own webhook alert (action::notify), sent without a rule.
    ours.insert("NodeguardBreaker");
    let inhibit = seq(&am["inhibit_rules"]);
    let mut bad = 0;
    for rule in inhibit {
        let src: Vec<&str> = seq(&rule["source_matchers"])
            .iter()
            .filter_map(Value::as_str)
            .filter_map(|m| m.strip_prefix("alertname="))
            .map(|v| v.trim_matches('"'))
            .collect();
        if !src.first().is_some_and(|s| ours.contains(s)) {
            r.fail(format!(
                "inhibit rule source {src:?} is not a nodeguard alert"
            ));
            bad += 1;
        }
    }
    if bad == 0 {
        r.ok(format!(
            "{} inhibit rules, each sourced by a nodeguard alert",
            inhibit.len()
        ));
    }
}

pub fn run(repo: &Path, r: &mut Report) -> Result<(), String> {
    let inp = Inputs::load(repo)?;
    check_alerts(&inp, r);
    check_inhibit(&inp.rules, &yaml::load(repo, INHIBIT)?, r);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> Inputs {
        Inputs::load(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap()
    }

    fn first_alert(inp: &mut Inputs) -> &mut Value {
        let groups = inp.rules["groups"].as_sequence_mut().unwrap();
        groups
            .iter_mut()
            .flat_map(|g| g["rules"].as_sequence_mut().unwrap().iter_mut())
            .find(|x| x["alert"].is_string())
            .unwrap()
    }

    #[test]
    fn the_shipped_rules_pass() {
        let inp = shipped();
        // The catalog's names, as queries write them.
        assert!(inp
            .documented
            .contains("nodeguard_container_oom_kills_total"));
        assert!(!inp.documented.contains("nodeguard_"));
        let mut r = Report::default();
        check_alerts(&inp, &mut r);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        let am = yaml::load(Path::new(env!("CARGO_MANIFEST_DIR")), INHIBIT).unwrap();
        check_inhibit(&inp.rules, &am, &mut r);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
    }

    #[test]
    fn annotation_conventions_are_enforced() {
        let mut inp = shipped();
        let a = first_alert(&mut inp);
        a["annotations"]["summary"] = "{{ $labels.pod }} is bad".into();
        a["annotations"]["description"] = "static".into();
        a["labels"]["severity"] = "page".into();
        let mut r = Report::default();
        check_alerts(&inp, &mut r);
        assert!(r.has("summary must be a static headline"), "{:?}", r.errors);
        assert!(r.has("description must carry the values"), "{:?}", r.errors);
        assert!(r.has("severity must be"), "{:?}", r.errors);
    }

    #[test]
    fn runbooks_must_exist_and_quote_the_expression() {
        let mut inp = shipped();
        let a = first_alert(&mut inp);
        a["expr"] = "nodeguard_up == 7".into();
        let name = str_at(a, "alert").to_owned();
        let mut r = Report::default();
        check_alerts(&inp, &mut r);
        assert!(
            r.has(&format!("{name}: docs/runbooks/{name}.md does not quote")),
            "{:?}",
            r.errors
        );

        let mut inp = shipped();
        first_alert(&mut inp)["annotations"]["runbook_url"] = "http://x/docs/runbooks/y.md".into();
        let mut r = Report::default();
        check_alerts(&inp, &mut r);
        assert!(r.has("is not <https prefix>"), "{:?}", r.errors);
        assert!(r.has("prefixes differ"), "{:?}", r.errors);
    }

    #[test]
    fn metrics_must_be_documented_and_alerts_tested() {
        let mut inp = shipped();
        first_alert(&mut inp)["expr"] = "nodeguard_made_up_total > 0".into();
        inp.tests.clear();
        let mut r = Report::default();
        check_alerts(&inp, &mut r);
        assert!(
            r.has("nodeguard_made_up_total is not in the metric catalog"),
            "{:?}",
            r.errors
        );
        assert!(r.has("no unit test where it fires"), "{:?}", r.errors);
        assert!(
            r.has("no unit test where it stays silent"),
            "{:?}",
            r.errors
        );
    }

    #[test]
    fn inhibit_rules_need_our_source() {
        let inp = shipped();
        let am: Value = serde_norway::from_str(
            "inhibit_rules:\n  - source_matchers: [alertname=\"KubePodCrashLooping\"]\n",
        )
        .unwrap();
        let mut r = Report::default();
        check_inhibit(&inp.rules, &am, &mut r);
        assert!(r.has("KubePodCrashLooping"), "{:?}", r.errors);
    }
}
