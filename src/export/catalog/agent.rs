//! The agent's own cost and health (`sample/health`, `sample/selfstat`, `agent`): samplers,
//! ticks, the process, and the build.

use super::{names, Family, Label, Meta, Rows, Section, Type, Unit};
use crate::error::ErrorKind;
use crate::model::{Published, SamplerStatus};
use crate::sample::health::SamplerName;

use Section::Agent as S;
use Type::{Counter, Gauge};

/// The samplers, as `sampler` labels name them: the sampler registry's names.
pub const SAMPLERS: [&str; 8] = SamplerName::NAMES;
/// The source revision stamped at build time (`build.rs`), `unknown` without one.
pub const REVISION: &str = match option_env!("NODEGUARD_REVISION") {
    Some(r) if !r.is_empty() => r,
    _ => "unknown",
};
/// The cgroup layouts discovery detects (`CgroupLayout::name`).
pub const CGROUP_LAYOUTS: [&str; 3] = ["v1", "v2", "hybrid"];

const SAMPLER: Label = Label::of("sampler", || SAMPLERS.to_vec());
const KIND: Label = Label::of("kind", || names(&ErrorKind::ALL, |k| k.as_str()));

/// One row per enabled sampler.
fn enabled<'a, V: Into<super::Num>>(
    s: &'a Published,
    out: &mut Rows<'a>,
    v: fn(&SamplerStatus) -> V,
) {
    for x in s.samplers.iter().filter(|x| x.enabled) {
        out.add(&[x.name], v(x));
    }
}

pub const FAMILIES: &[Family<Published>] = &[
    Meta {
        name: "sampler_duration_seconds",
        ty: Gauge,
        unit: Some(Unit::Seconds),
        help: "Duration of the sampler's last pass.",
        labels: &[SAMPLER],
        section: S,
    }
    .with_rows(|s, out| enabled(s, out, |x| x.last_duration_seconds)),
    Meta {
        name: "sampler_cpu_seconds",
        ty: Counter,
        unit: Some(Unit::Seconds),
        help: "CPU time (user+system) spent by each sampler, its helper threads included (per-thread clock).",
        labels: &[SAMPLER],
        section: S,
    }
    .with_rows(|s, out| enabled(s, out, |x| x.cpu_seconds_total)),
    Meta {
        name: "sampler_fresh",
        ty: Gauge,
        unit: None,
        help: "1 when the sampler succeeded within the last 3 intervals.",
        labels: &[SAMPLER],
        section: S,
    }
    .with_rows(|s, out| enabled(s, out, |x| x.fresh)),
    Meta {
        name: "sampler_errors",
        ty: Counter,
        unit: None,
        help: "Failed reads by sampler and kind.",
        labels: &[SAMPLER, KIND],
        section: S,
    }
    .with_rows(|s, out| {
            for x in &s.samplers {
                for k in ErrorKind::ALL.map(ErrorKind::as_str) {
                    let e = x.errors_total.iter().find(|(n, _)| n == k);
                    out.add(&[x.name, k], e.map_or(0, |e| e.1));
                }
            }
        }),
    Meta {
        name: "tick_duration_seconds",
        ty: Gauge,
        unit: Some(Unit::Seconds),
        help: "Duration of the last whole sampling tick.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.agent.tick_duration_seconds)),
    Meta {
        name: "ticks",
        ty: Counter,
        unit: None,
        help: "Sampling ticks completed.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.agent.ticks_total)),
    Meta {
        name: "process_resident_memory_bytes",
        ty: Gauge,
        unit: Some(Unit::Bytes),
        help: "Resident memory of the agent.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.agent.resident_memory_bytes)),
    Meta {
        name: "process_cpu_seconds",
        ty: Counter,
        unit: Some(Unit::Seconds),
        help: "CPU time (user+system) used by the agent.",
        labels: &[],
        section: S,
        // Omitted until a first good read: a 0 there would read as a counter reset.
    }
    .with_rows(|s, out| {
            if let Some(v) = s.agent.cpu_seconds_total {
                out.add(&[], v);
            }
        }),
    Meta {
        name: "process_open_fds",
        ty: Gauge,
        unit: None,
        help: "Open file descriptors of the agent.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.agent.open_fds)),
    Meta {
        name: "build_info",
        ty: Gauge,
        unit: None,
        help: "Agent version, source revision and the cgroup layout it detected.",
        labels: &[
            Label::free("version"),
            Label::free("revision"),
            Label::of("cgroup_layout", || CGROUP_LAYOUTS.to_vec()),
        ],
        section: S,
    }
    .with_rows(|s, out| {
            let version = env!("CARGO_PKG_VERSION");
            out.add(&[version, REVISION, &s.cgroup_layout], 1u64);
        }),
];
