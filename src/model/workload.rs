//! What a workload is: the identity metrics and breakers are keyed by, and where its cgroup lives.

use serde::Serialize;
use std::fmt;

/// The identity of a workload across container restarts: the labels `namespace`, `pod`,
/// `container`. Plain-host units have an empty namespace and pod and the unit name as container.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct WorkloadId {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

impl WorkloadId {
    pub fn container(namespace: &str, pod: &str, container: &str) -> Self {
        WorkloadId {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
            container: container.to_owned(),
        }
    }

    pub fn unit(name: &str) -> Self {
        WorkloadId::container("", "", name)
    }
}

impl fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() && self.pod.is_empty() {
            write!(f, "{}", self.container)
        } else {
            write!(f, "{}/{}/{}", self.namespace, self.pod, self.container)
        }
    }
}

/// The pod's QoS class, from its cgroup path (guaranteed pods sit directly under `kubepods`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "guaranteed",
            QosClass::Burstable => "burstable",
            QosClass::BestEffort => "besteffort",
        }
    }
}
