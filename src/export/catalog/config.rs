//! The configuration in force and its reloads (`config::live`), read from the snapshot's
//! `config`, which a reload republishes at once.

use super::{Family, Label, Meta, Section, Type, Unit};
use crate::model::Published;

use Section::Agent as S;
use Type::{Counter, Gauge};

pub const FAMILIES: &[Family<Published>] = &[
    Meta {
        name: "config_info",
        ty: Gauge,
        unit: None,
        help: "The configuration in force: the first 16 hex digits of the SHA-256 of its text.",
        labels: &[Label::free("hash")],
        section: S,
    }
    .with_rows(|s, out| out.add(&[&s.config.hash], 1u64)),
    Meta {
        name: "config_reloads",
        ty: Counter,
        unit: None,
        help: "Reloads that changed the configuration in force (SIGHUP or a change of the file).",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.config.reloads_total)),
    Meta {
        name: "config_reload_failures",
        ty: Counter,
        unit: None,
        help: "Reloads refused (invalid or unreadable file); the running configuration is kept.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.config.reload_failures_total)),
    Meta {
        name: "config_last_reload_success",
        ty: Gauge,
        unit: None,
        help: "1 when the last reload attempt succeeded (or none was made), 0 when it was refused.",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.config.last_reload_ok)),
    Meta {
        name: "config_last_reload_success_timestamp_seconds",
        ty: Gauge,
        unit: Some(Unit::Seconds),
        help: "Unix time the configuration in force was loaded (the start, or the last reload).",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], s.config.loaded_at)),
    Meta {
        name: "config_restart_required",
        ty: Gauge,
        unit: None,
        help:
            "1 when the file changes keys that apply only at a restart (listen, http, paths, ...).",
        labels: &[],
        section: S,
    }
    .with_rows(|s, out| out.add(&[], !s.config.restart_required.is_empty())),
];
