//! The tick watchdog (`export/watchdog`): how old the last tick is, computed at scrape time.

use super::{Family, Meta, Section, Type, Unit};
use crate::export::watchdog::TickWatch;

use Section::Agent as S;
use Type::Gauge;

pub const FAMILIES: &[Family<TickWatch>] = &[
    Meta {
        name: "agent_last_tick_age_seconds",
        ty: Gauge,
        unit: Some(Unit::Seconds),
        help: "Seconds since the last tick was published (since the start before the first), computed at scrape time.",
        labels: &[],
        section: S,
    }
    .with_rows(|w, out| out.add(&[], w.age().as_secs_f64())),
    Meta {
        name: "agent_tick_stall_bound_seconds",
        ty: Gauge,
        unit: Some(Unit::Seconds),
        help: "Tick age beyond which the tick loop counts as stalled and /healthz and /readyz answer 503.",
        labels: &[],
        section: S,
    }
    .with_rows(|w, out| out.add(&[], w.bound().as_secs_f64())),
];
