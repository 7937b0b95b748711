//! A pod's owner and revision, from its name alone (no API server). The breaker is keyed by the
//! owner so that a pod recreated by its controller is still the same workload; the revision tells
//! a new rollout (which resets the breaker) from a mere restart.

/// Characters Kubernetes uses for generated name suffixes and pod-template hashes
/// (`k8s.io/apimachinery/pkg/util/rand.SafeEncodeString`).
const SAFE: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn is_safe(s: &str) -> bool {
    s.bytes().all(|b| SAFE.contains(&b))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub name: String,
    pub revision: String,
}

/// Pure. Deployment pods `<deploy>-<template-hash>-<5>`: owner is the Deployment, revision the
/// pod-template hash. StatefulSet pods `<sts>-<ordinal>` and DaemonSet/Job pods `<name>-<5>`:
/// owner is the controller, revision the pod uid (a rollout recreates the pod; a crash-loop does
/// not). Anything else is its own owner.
pub fn owner_of(pod: &str, pod_uid: &str) -> Owner {
    let parts: Vec<&str> = pod.rsplitn(3, '-').collect();
    let own = |name: &str, revision: &str| Owner {
        name: name.to_owned(),
        revision: revision.to_owned(),
    };
    match parts.as_slice() {
        [suffix, hash, name]
            if suffix.len() == 5
                && is_safe(suffix)
                && (6..=10).contains(&hash.len())
                && is_safe(hash) =>
        {
            own(name, hash)
        }
        [suffix, rest @ ..] if !rest.is_empty() => {
            let name = pod
                .strip_suffix(suffix)
                .and_then(|p| p.strip_suffix('-'))
                .unwrap_or(pod);
            if suffix.bytes().all(|b| b.is_ascii_digit()) || (suffix.len() == 5 && is_safe(suffix))
            {
                own(name, pod_uid)
            } else {
                own(pod, pod_uid)
            }
        }
        _ => own(pod, pod_uid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controllers_from_pod_names() {
        assert_eq!(
            owner_of("backend-7d9f8b6c4d-x2k4q", "u1"),
            Owner {
                name: "backend".into(),
                revision: "7d9f8b6c4d".into()
            }
        );
        assert_eq!(
            owner_of("feed-relay-api-5c6d7f9b8-zq2wx", "u1"),
            Owner {
                name: "feed-relay-api".into(),
                revision: "5c6d7f9b8".into()
            }
        );
        assert_eq!(
            owner_of("postgres-0", "u2"),
            Owner {
                name: "postgres".into(),
                revision: "u2".into()
            }
        );
        assert_eq!(
            owner_of("node-exporter-7xk2p", "u3"),
            Owner {
                name: "node-exporter".into(),
                revision: "u3".into()
            }
        );
        // Not generated suffixes (vowels, uppercase): the pod is its own owner.
        assert_eq!(
            owner_of("my-app", "u4"),
            Owner {
                name: "my-app".into(),
                revision: "u4".into()
            }
        );
        assert_eq!(
            owner_of("debug", "u5"),
            Owner {
                name: "debug".into(),
                revision: "u5".into()
            }
        );
        // Same deployment, new pod from the same ReplicaSet: same owner and revision.
        assert_eq!(
            owner_of("backend-7d9f8b6c4d-bbbbb", "u9"),
            owner_of("backend-7d9f8b6c4d-x2k4q", "u1")
        );
        assert_ne!(
            owner_of("backend-5f6c7d8b9-x2k4q", "u1").revision,
            owner_of("backend-7d9f8b6c4d-x2k4q", "u1").revision
        );
    }
}
