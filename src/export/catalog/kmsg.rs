//! The kernel-log OOM reader (`sample/kmsg`, `sample/oom`): records read, how `oom-kill:`
//! records were attributed, and the bounds that bit.

use super::{Family, Label, Meta, Rows, Section, Type};
use crate::model::{KmsgStatus, Published};

use Section::Agent as S;
use Type::{Counter, Gauge};

/// What became of an `oom-kill:` record (`kmsg_oom_records_total{result}`).
pub const OOM_RESULTS: [&str; 4] = ["container", "unattributed", "truncated", "suppressed"];

/// The reader's single series, while it reads.
fn node<'a>(s: &'a Published, out: &mut Rows<'a>, v: fn(&KmsgStatus) -> u64) {
    if let Some(k) = &s.kmsg {
        out.add(&[], v(k));
    }
}

pub const FAMILIES: &[Family<Published>] = &[
    Meta {
        name: "kmsg_records",
        ty: Counter,
        unit: None,
        help: "Kernel log records read (samplers.kmsg).",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |k| k.records_total)),
    Meta {
        name: "kmsg_oom_records",
        ty: Counter,
        unit: None,
        help: "Kernel oom-kill: records in the discovery scopes: credited to a workload (container), naming none (unattributed), cut short (truncated); suppressed: records the kernel's rate limit dropped, node-wide.",
        labels: &[Label::of("result", || OOM_RESULTS.to_vec())],
        section: S,
    }
    .with_rows(|s, out| {
            if let Some(k) = &s.kmsg {
                let by = [
                    k.oom_attributed_total,
                    k.oom_unattributed_total,
                    k.oom_truncated_total,
                    k.oom_suppressed_total,
                ];
                for (r, v) in OOM_RESULTS.into_iter().zip(by) {
                    out.add(&[r], v);
                }
            }
        }),
    Meta {
        name: "kmsg_overruns",
        ty: Counter,
        unit: None,
        help: "Kernel log ring overruns (EPIPE): records overwritten before they were read.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |k| k.overruns_total)),
    Meta {
        name: "kmsg_read_limited",
        ty: Counter,
        unit: None,
        help: "Ticks whose kernel log pass stopped at samplers.kmsg.max_records_per_tick.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |k| k.read_limited_total)),
    Meta {
        name: "kmsg_remembered_cgroups",
        ty: Gauge,
        unit: None,
        help: "Cgroup paths of recent workloads kept to attribute OOM kills after the cgroup is gone.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |k| k.remembered_cgroups)),
    Meta {
        name: "kmsg_remembered_evicted",
        ty: Counter,
        unit: None,
        help: "Remembered cgroup paths dropped at the bound (16,384) before their time.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| node(s, out, |k| k.remembered_evicted_total)),
];
