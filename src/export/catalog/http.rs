//! The HTTP server's bounds (`export/limits`): connections against the cap, refusals, timeouts.

use super::{names, Family, Label, Meta, Section, Type, Unit};
use crate::export::stats::{ServerStats, TimeoutReason};

use Section::Agent as S;
use Type::{Counter, Gauge};

pub const FAMILIES: &[Family<ServerStats>] = &[
    Meta {
        name: "http_connections",
        ty: Gauge,
        unit: None,
        help: "Open HTTP connections.",
        labels: &[],
        section: S,
    }
    .with_rows(|st, out| out.add(&[], st.open())),
    Meta {
        name: "http_connections_max",
        ty: Gauge,
        unit: None,
        help: "Cap on open HTTP connections (config, lowered to keep an fd reserve).",
        labels: &[],
        section: S,
    }
    .with_rows(|st, out| out.add(&[], st.max())),
    Meta {
        name: "http_connections_rejected",
        ty: Counter,
        unit: None,
        help: "Connections closed at once because the cap was reached.",
        labels: &[],
        section: S,
    }
    .with_rows(|st, out| out.add(&[], st.rejected())),
    Meta {
        name: "http_connections_timed_out",
        ty: Counter,
        unit: None,
        help: "Connections closed by a timeout, by reason.",
        labels: &[Label::of("reason", || {
            names(&TimeoutReason::ALL, |r| r.as_str())
        })],
        section: S,
    }
    .with_rows(|st, out| {
        for r in TimeoutReason::ALL {
            out.add(&[r.as_str()], st.timed_out(r));
        }
    }),
    Meta {
        name: "http_accept_errors",
        ty: Counter,
        unit: None,
        help: "Failed accepts (EMFILE and the like); the server backs off after each.",
        labels: &[],
        section: S,
    }
    .with_rows(|st, out| out.add(&[], st.accept_errors())),
    Meta {
        name: "http_connections_evicted",
        ty: Counter,
        unit: None,
        help:
            "Connections closed at the cap to let a new one in: the oldest waiting for a request.",
        labels: &[],
        section: S,
    }
    .with_rows(|st, out| out.add(&[], st.evicted())),
    Meta {
        name: "http_responses_cut",
        ty: Counter,
        unit: None,
        help: "Responses cut because their body was too many snapshots old (a slow reader).",
        labels: &[],
        section: S,
    }
    .with_rows(|st, out| out.add(&[], st.cut())),
    Meta {
        name: "http_response_bodies_bytes",
        ty: Gauge,
        unit: Some(Unit::Bytes),
        help: "Bytes of rendered /metrics and /api/state bodies alive (cached or being sent).",
        labels: &[],
        section: S,
    }
    .with_rows(|st, out| out.add(&[], st.body_bytes())),
];
