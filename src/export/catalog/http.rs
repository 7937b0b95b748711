//! The HTTP server's bounds (`export/limits`): connections against the cap, refusals, timeouts.

use super::{names, Family, Label, Meta, Section, Type};
use crate::export::stats::{ServerStats, TimeoutReason};

use Section::Agent as S;
use Type::{Counter, Gauge};

pub const FAMILIES: &[Family<ServerStats>] = &[
    Family {
        meta: Meta {
            name: "http_connections",
            ty: Gauge,
            unit: None,
            help: "Open HTTP connections.",
            labels: &[],
            section: S,
        },
        rows: |st, out| out.add(&[], st.open()),
    },
    Family {
        meta: Meta {
            name: "http_connections_max",
            ty: Gauge,
            unit: None,
            help: "Cap on open HTTP connections (config, lowered to keep an fd reserve).",
            labels: &[],
            section: S,
        },
        rows: |st, out| out.add(&[], st.max()),
    },
    Family {
        meta: Meta {
            name: "http_connections_rejected",
            ty: Counter,
            unit: None,
            help: "Connections closed at once because the cap was reached.",
            labels: &[],
            section: S,
        },
        rows: |st, out| out.add(&[], st.rejected()),
    },
    Family {
        meta: Meta {
            name: "http_connections_timed_out",
            ty: Counter,
            unit: None,
            help: "Connections closed by a timeout, by reason.",
            labels: &[Label::of("reason", || {
                names(&TimeoutReason::ALL, |r| r.as_str())
            })],
            section: S,
        },
        rows: |st, out| {
            for r in TimeoutReason::ALL {
                out.add(&[r.as_str()], st.timed_out(r));
            }
        },
    },
    Family {
        meta: Meta {
            name: "http_accept_errors",
            ty: Counter,
            unit: None,
            help: "Failed accepts (EMFILE and the like); the server backs off after each.",
            labels: &[],
            section: S,
        },
        rows: |st, out| out.add(&[], st.accept_errors()),
    },
];
