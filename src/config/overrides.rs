//! `--set KEY=VALUE`: one field of the YAML set from the command line, on top of the file (or the
//! embedded defaults), at start and at every reload. This is how an opt-in DaemonSet component
//! (a kustomize patch that appends to `args`) switches on the sampler it provides the mount or the
//! capability for, without replacing the user's config file.
//!
//! The value is parsed as YAML (`true`, `30s`, `[a, b]`), so it goes through the same typing and
//! validation as the file: an unknown key or a bad value is reported with the field's path.

use serde_norway::{Mapping, Value};
use std::fmt;

/// Overrides at most: they come from the pod spec, and each is applied at every reload.
pub const MAX_OVERRIDES: usize = 64;
/// Nesting of a key at most (`guard.rules.x.threshold` is 4).
const MAX_DEPTH: usize = 8;
/// Length of one `KEY=VALUE` argument at most.
const MAX_LEN: usize = 4096;

#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    /// The key as written (`samplers.kmsg.enabled`): errors and the config hash name it.
    key: String,
    path: Vec<String>,
    value: Value,
}

impl fmt::Display for Override {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = serde_norway::to_string(&self.value).unwrap_or_default();
        write!(f, "{}={}", self.key, v.trim_end())
    }
}

impl Override {
    /// Parses `KEY=VALUE` (`KEY`: dot-separated field names; `VALUE`: one YAML value).
    pub fn parse(arg: &str) -> Result<Override, String> {
        if arg.len() > MAX_LEN {
            return Err(format!("--set: longer than {MAX_LEN} bytes"));
        }
        let Some((key, value)) = arg.split_once('=') else {
            return Err(format!("--set {arg:?}: expected KEY=VALUE"));
        };
        let path: Vec<String> = key.split('.').map(str::to_owned).collect();
        if path.iter().any(|p| p.is_empty()) {
            return Err(format!(
                "--set {key:?}: expected dot-separated field names (samplers.kmsg.enabled)"
            ));
        }
        if path.len() > MAX_DEPTH {
            return Err(format!("--set {key:?}: nested deeper than {MAX_DEPTH}"));
        }
        // The same limits as a file's text (anchors and aliases included).
        crate::config::limits::check_nodes(value).map_err(|e| format!("--set {key}: {e}"))?;
        let value = serde_norway::from_str(value).map_err(|e| format!("--set {key}: {e}"))?;
        Ok(Override {
            key: key.to_owned(),
            path,
            value,
        })
    }

    pub fn parse_all(args: &[String]) -> Result<Vec<Override>, String> {
        if args.len() > MAX_OVERRIDES {
            return Err(format!("--set: more than {MAX_OVERRIDES} given"));
        }
        args.iter().map(|a| Override::parse(a)).collect()
    }

    /// `--set KEY`: the field path config errors report for this override.
    pub fn field(&self) -> String {
        format!("--set {}", self.key)
    }

    /// Sets the field in `root`, making the mappings on the way. Fails where the way is a
    /// value that is not a mapping (`--set interval.x=1`).
    pub fn apply(&self, root: &mut Value) -> Result<(), String> {
        let mut at = root;
        for (i, name) in self.path.iter().enumerate() {
            if at.is_null() {
                *at = Value::Mapping(Mapping::new());
            }
            let Value::Mapping(map) = at else {
                return Err(format!("{} is not a section", self.path[..i].join(".")));
            };
            let key = Value::String(name.clone());
            if i + 1 == self.path.len() {
                map.insert(key, self.value.clone());
                return Ok(());
            }
            at = map.entry(key).or_insert(Value::Null);
        }
        Ok(())
    }
}

/// The text hashed for `nodeguard_config_info`: the file's, then one comment line per override,
/// so the hash changes when an override does.
pub fn hashed_text(text: &str, overrides: &[Override]) -> String {
    let mut t = text.to_owned();
    for o in overrides {
        t.push_str("\n# --set ");
        t.push_str(&o.to_string());
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn with(text: &str, sets: &[&str]) -> Result<Config, String> {
        let o: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let o = Override::parse_all(&o)?;
        Config::from_yaml_with(text, &o).map_err(|e| e.to_string())
    }

    #[test]
    fn a_set_field_wins_over_the_file() {
        let text = "samplers:\n  kmsg:\n    enabled: false\n";
        assert!(!with(text, &[]).unwrap().samplers.kmsg.enabled);
        assert!(
            with(text, &["samplers.kmsg.enabled=true"])
                .unwrap()
                .samplers
                .kmsg
                .enabled
        );
    }

    #[test]
    fn missing_sections_are_made_and_values_typed() {
        let c = with("", &["interval=7s", "samplers.ports.enabled=false"]).unwrap();
        assert_eq!(c.interval, std::time::Duration::from_secs(7));
        assert!(!c.samplers.ports.enabled);
    }

    #[test]
    fn the_last_of_two_sets_of_one_key_wins() {
        let c = with("", &["interval=7s", "interval=9s"]).unwrap();
        assert_eq!(c.interval, std::time::Duration::from_secs(9));
    }

    #[test]
    fn bad_keys_and_values_name_the_field() {
        let e = with("", &["samplers.kmsg.enabeld=true"]).unwrap_err();
        assert!(e.contains("samplers.kmsg.enabeld"), "{e}");
        let e = with("", &["samplers.kmsg.enabled=maybe"]).unwrap_err();
        assert!(e.contains("samplers.kmsg.enabled"), "{e}");
        let e = with("interval: 5s\n", &["interval.x=1"]).unwrap_err();
        assert!(
            e.contains("--set interval.x: interval is not a section"),
            "{e}"
        );
        // Where the file has no such key, the typed read names it.
        let e = with("", &["interval.x=1"]).unwrap_err();
        assert!(e.contains("interval: invalid type: map"), "{e}");
        for bad in ["novalue", "=1", "a..b=1", "a.=1"] {
            let e = Override::parse(bad).unwrap_err();
            assert!(e.starts_with("--set"), "{bad}: {e}");
        }
        let deep = format!("{}=1", ["a"; 9].join("."));
        assert!(Override::parse(&deep).unwrap_err().contains("deeper"));
        let many: Vec<String> = (0..65).map(|i| format!("interval={i}s")).collect();
        assert!(Override::parse_all(&many)
            .unwrap_err()
            .contains("more than 64"));
    }

    #[test]
    fn the_hash_text_names_each_override() {
        let o = Override::parse_all(&["samplers.kmsg.enabled=true".into()]).unwrap();
        assert_eq!(
            hashed_text("a: 1\n", &o),
            "a: 1\n\n# --set samplers.kmsg.enabled=true"
        );
        assert_eq!(hashed_text("a: 1\n", &[]), "a: 1\n");
    }
}
