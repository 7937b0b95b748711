//! Policy checks of what ships, in tested Rust (`nodeguard-gen policy`, called by
//! scripts/ship-check): the structure of the kustomizations and the objects they make
//! ([`manifests`]), the alert rules and their runbooks ([`alerts`]), the Dockerfile and its build
//! context ([`dockerfile`]), the rendered GitOps example ([`gitops`]), the API server's semantic
//! rules on every rendered pod ([`apiserver`]), and the paths the docs name ([`docpaths`]). The tools that check
//! against outside definitions (kubernetes-validate, checkov, promtool, vmalert, amtool) stay in
//! the script; this is the part that is ours.

pub mod alerts;
pub mod apiserver;
pub mod dockerfile;
pub mod docpaths;
pub mod gitops;
pub mod manifests;
pub mod pod;
pub mod yaml;

/// Findings of one check run: every failure is printed as it is found and kept.
#[derive(Debug, Default)]
pub struct Report {
    pub errors: Vec<String>,
}

impl Report {
    pub fn fail(&mut self, msg: impl Into<String>) {
        let msg = msg.into();
        println!("  FAIL {msg}");
        self.errors.push(msg);
    }

    pub fn ok(&self, msg: impl std::fmt::Display) {
        println!("  ok   {msg}");
    }

    pub fn note(&self, msg: impl std::fmt::Display) {
        println!("  {msg}");
    }

    /// True when some failure contains `needle` (tests).
    #[cfg(test)]
    pub fn has(&self, needle: &str) -> bool {
        self.errors.iter().any(|e| e.contains(needle))
    }
}
