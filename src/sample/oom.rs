//! Attribution of the kernel log's OOM kills to workloads, also for cgroups already gone.
//!
//! A victim's `task_memcg` is matched, nearest ancestor first, against the cgroups discovery
//! reported recently (remembered for `remember`, at most [`MAX_REMEMBERED`]), then against the
//! kubelet path grammar (pod uid + container id), so a container that lived and died between two
//! ticks is attributed too. Paths outside the configured scopes are ignored.

use super::kmsg::{KmsgPass, KmsgReader, OomKill};
use crate::clock::Clock;
use crate::discover::{Discovery, Inventory, WorkloadKind};
use crate::error::ReadError;
use crate::model::{Feature, KmsgStatus, WorkloadId};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bound on remembered cgroup paths (a node runs a few hundred containers; churn of 15 minutes
/// fits many times over). The oldest go first; `cgroups_evicted_total` counts them.
pub const MAX_REMEMBERED: usize = 16_384;

/// A failed open (no CAP_SYSLOG, no device) is retried this often.
const REOPEN_EVERY: Duration = Duration::from_secs(60);

/// One OOM event credited to a workload instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttributedOom {
    pub id: WorkloadId,
    /// The container id (or the unit's cgroup), as `Workload::instance`.
    pub instance: String,
    pub pod_uid: Option<String>,
}

#[derive(Debug, Clone)]
struct Remembered {
    id: WorkloadId,
    instance: String,
    pod_uid: Option<String>,
    seen: Instant,
}

/// Path -> workload memory, refreshed from every inventory.
#[derive(Debug)]
pub struct OomAttributor {
    remember: Duration,
    max: usize,
    paths: HashMap<String, Remembered>,
    pub evicted: u64,
}

impl OomAttributor {
    pub fn new(remember: Duration) -> Self {
        OomAttributor {
            remember,
            max: MAX_REMEMBERED,
            paths: HashMap::new(),
            evicted: 0,
        }
    }

    pub fn remembered(&self) -> usize {
        self.paths.len()
    }

    /// Remembers this tick's workloads and forgets those unseen for `remember`.
    pub fn observe(&mut self, now: Instant, inv: &Inventory) {
        for w in &inv.workloads {
            let pod_uid = match &w.kind {
                WorkloadKind::Container { pod_uid, .. } => Some(pod_uid.clone()),
                WorkloadKind::Unit => None,
            };
            self.paths.insert(
                w.cgroup.clone(),
                Remembered {
                    id: w.id.clone(),
                    instance: w.instance().to_owned(),
                    pod_uid,
                    seen: now,
                },
            );
        }
        let keep = self.remember;
        self.paths
            .retain(|_, r| now.saturating_duration_since(r.seen) < keep);
        if self.paths.len() > self.max {
            let mut by_age: Vec<(Instant, String)> = self
                .paths
                .iter()
                .map(|(p, r)| (r.seen, p.clone()))
                .collect();
            by_age.sort();
            let excess = self.paths.len() - self.max;
            for (_, p) in by_age.into_iter().take(excess) {
                self.paths.remove(&p);
                self.evicted += 1;
            }
        }
    }

    /// The workload of a victim's cgroup: the nearest remembered ancestor-or-self, else the
    /// kubelet grammar. `None` outside the scopes, for the root and for sandboxes.
    pub fn attribute(&self, task_memcg: &str, discovery: &Discovery) -> Option<AttributedOom> {
        if !discovery.in_scope(task_memcg) {
            return None;
        }
        let mut p = task_memcg;
        // Bounded by the path's depth (discovery walks at most 64 levels).
        for _ in 0..=64 {
            if p.is_empty() || p == "/" {
                break;
            }
            if let Some(r) = self.paths.get(p) {
                return Some(AttributedOom {
                    id: r.id.clone(),
                    instance: r.instance.clone(),
                    pod_uid: r.pod_uid.clone(),
                });
            }
            p = match p.rfind('/') {
                Some(i) => &p[..i],
                None => break,
            };
        }
        let (id, pod_uid, container_id) = discovery.container_of_path(task_memcg)?;
        Some(AttributedOom {
            id,
            instance: container_id,
            pod_uid: Some(pod_uid),
        })
    }
}

/// What the kernel log gave this tick.
#[derive(Debug, Default, Clone)]
pub struct KmsgTick {
    pub ooms: Vec<AttributedOom>,
}

/// The kernel-log OOM source: the reader (or why there is none), the path memory, the totals.
pub struct KmsgSource {
    path: PathBuf,
    max_records: usize,
    reader: Option<KmsgReader>,
    /// Why the device could not be opened, and when that was last tried.
    denied: Option<(Instant, String)>,
    attributor: OomAttributor,
    status: KmsgStatus,
    logged: Option<bool>,
    clock: Arc<dyn Clock>,
}

impl KmsgSource {
    pub fn new(
        path: PathBuf,
        max_records: usize,
        remember: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let mut s = KmsgSource {
            path,
            max_records,
            reader: None,
            denied: None,
            attributor: OomAttributor::new(remember),
            status: KmsgStatus::default(),
            logged: None,
            clock,
        };
        s.try_open();
        s
    }

    fn try_open(&mut self) {
        match KmsgReader::open(&self.path, self.max_records) {
            Ok(r) => {
                self.reader = Some(r);
                self.denied = None;
            }
            Err(e) => self.denied = Some((self.clock.now(), e.to_string())),
        }
        let available = self.reader.is_some();
        if self.logged != Some(available) {
            match &self.denied {
                Some((_, why)) => tracing::warn!(
                    feature = "oom_kmsg",
                    reason = %why,
                    "feature unavailable: OOM kills of containers whose cgroup is already gone are not attributed (needs CAP_SYSLOG and /dev/kmsg)"
                ),
                None if self.logged.is_some() => {
                    tracing::info!(feature = "oom_kmsg", "feature available again")
                }
                None => {}
            }
            self.logged = Some(available);
        }
    }

    /// `None` while the device cannot be read: the cgroup counters stand alone.
    pub fn pass(
        &mut self,
        inv: &Inventory,
        discovery: &Discovery,
        errors: &mut Vec<ReadError>,
    ) -> Option<KmsgTick> {
        let now = self.clock.now();
        if self.reader.is_none() {
            let due = self
                .denied
                .as_ref()
                .is_none_or(|(t, _)| now.saturating_duration_since(*t) >= REOPEN_EVERY);
            if due {
                self.try_open();
            }
        }
        let reader = self.reader.as_mut()?;
        // Only while the log is read: paths serve to attribute its records, nothing else.
        self.attributor.observe(now, inv);
        let KmsgPass {
            ooms,
            records,
            truncated,
            suppressed,
            overruns,
            limited,
            error,
        } = reader.read();
        let st = &mut self.status;
        st.records_total += records;
        st.oom_truncated_total += truncated;
        st.oom_suppressed_total += suppressed;
        st.overruns_total += overruns;
        st.read_limited_total += u64::from(limited);
        errors.extend(error);
        let mut out = KmsgTick::default();
        for k in ooms {
            if !discovery.in_scope(&k.task_memcg) {
                continue;
            }
            match self.attributor.attribute(&k.task_memcg, discovery) {
                Some(a) => {
                    log_kill(&k, Some(&a));
                    st.oom_attributed_total += 1;
                    out.ooms.push(a);
                }
                None => {
                    log_kill(&k, None);
                    st.oom_unattributed_total += 1;
                }
            }
        }
        Some(out)
    }

    pub fn feature(&self) -> Feature {
        Feature {
            name: "oom_kmsg",
            available: self.reader.is_some(),
            reason: self.denied.as_ref().map(|(_, w)| w.clone()),
        }
    }

    pub fn status(&self) -> KmsgStatus {
        KmsgStatus {
            remembered_cgroups: self.attributor.remembered() as u64,
            remembered_evicted_total: self.attributor.evicted,
            ..self.status
        }
    }
}

/// One line per OOM event: rare, and what an operator looks for first.
fn log_kill(k: &OomKill, a: Option<&AttributedOom>) {
    let comm = String::from_utf8_lossy(&k.comm);
    match a {
        Some(a) => tracing::info!(
            namespace = %a.id.namespace, pod = %a.id.pod, container = %a.id.container,
            cgroup = %k.task_memcg, comm = %comm.escape_debug(), pid = k.pid,
            "OOM kill (kernel log)"
        ),
        None => tracing::info!(
            cgroup = %k.task_memcg, comm = %comm.escape_debug(), pid = k.pid,
            "OOM kill (kernel log) outside every known workload"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroupfs::CgroupLayout;
    use crate::discover::names::NameSource;
    use crate::discover::{DiscoveryConfig, Workload};
    use crate::model::QosClass;

    const ID: &str = "4f5c1b2a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";

    fn discovery(dir: &std::path::Path, scope: &str) -> Discovery {
        let cg = dir.join("cg");
        std::fs::create_dir_all(&cg).unwrap();
        std::fs::write(cg.join("cgroup.controllers"), "memory\n").unwrap();
        let pods = dir.join("pods");
        std::fs::create_dir_all(pods.join("shop_web-0_u-1")).unwrap();
        let mut d = Discovery::new(
            &CgroupLayout::detect(&cg).unwrap(),
            dir.join("proc"),
            NameSource::new(pods, dir.join("containers")),
            DiscoveryConfig {
                scopes: vec![scope.into()],
                host_workloads: false,
            },
        );
        d.scan().unwrap();
        d
    }

    fn container(cgroup: &str, name: &str, id: &str) -> Workload {
        Workload {
            id: WorkloadId::container("shop", "web-0", name),
            kind: WorkloadKind::Container {
                pod_uid: "u-1".into(),
                container_id: id.into(),
                qos: QosClass::Burstable,
            },
            cgroup: cgroup.into(),
            subtree: vec![cgroup.into()],
        }
    }

    #[test]
    fn a_remembered_path_wins_until_it_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let d = discovery(dir.path(), "/t");
        let mut a = OomAttributor::new(Duration::from_secs(600));
        let t0 = Instant::now();
        let cg = format!("/t/kubepods/burstable/podu-1/{ID}");
        let inv = Inventory {
            workloads: vec![container(&cg, "app", ID)],
            ..Inventory::default()
        };
        a.observe(t0, &inv);
        // Gone from the next inventory, still attributed, also for a child cgroup.
        a.observe(t0 + Duration::from_secs(5), &Inventory::default());
        let got = a.attribute(&format!("{cg}/nested"), &d).unwrap();
        assert_eq!(got.id, WorkloadId::container("shop", "web-0", "app"));
        assert_eq!(got.instance, ID);
        // Forgotten: the grammar still names it (pod from the log tree, container by short id).
        a.observe(t0 + Duration::from_secs(601), &Inventory::default());
        assert_eq!(a.remembered(), 0);
        let got = a.attribute(&cg, &d).unwrap();
        assert_eq!(got.id, WorkloadId::container("shop", "web-0", &ID[..12]));
        assert_eq!(got.pod_uid.as_deref(), Some("u-1"));
        // Outside the scopes, the root, and non-container paths: nobody.
        assert_eq!(
            a.attribute(&format!("/other/kubepods/burstable/podu-1/{ID}"), &d),
            None
        );
        assert_eq!(a.attribute("/t", &d), None);
        assert_eq!(a.attribute("/t/kubepods/burstable/podu-1", &d), None);
    }

    #[test]
    fn the_memory_is_bounded_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let _d = discovery(dir.path(), "/");
        let mut a = OomAttributor::new(Duration::from_secs(600));
        a.max = 3;
        let t0 = Instant::now();
        for i in 0..5u64 {
            let inv = Inventory {
                workloads: vec![container(&format!("/c{i}"), "x", &format!("{i:012}"))],
                ..Inventory::default()
            };
            a.observe(t0 + Duration::from_secs(i), &inv);
        }
        assert_eq!((a.remembered(), a.evicted), (3, 2));
        assert!(a.paths.contains_key("/c4") && !a.paths.contains_key("/c1"));
    }

    #[test]
    fn both_driver_namings() {
        let dir = tempfile::tempdir().unwrap();
        let d = discovery(dir.path(), "/");
        let a = OomAttributor::new(Duration::from_secs(600));
        let sd = format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podu_1.slice/cri-containerd-{ID}.scope");
        let got = a.attribute(&sd, &d).unwrap();
        assert_eq!(got.id, WorkloadId::container("shop", "web-0", &ID[..12]));
        assert_eq!(got.instance, ID);
        let got = a.attribute(&format!("/kubepods/podu-1/{ID}"), &d).unwrap();
        assert_eq!(got.pod_uid.as_deref(), Some("u-1"));
    }
}
