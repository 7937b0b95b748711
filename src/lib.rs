//! nodeguard: watches the symptoms a runaway container inflicts on its node and exports them.
//!
//! Data flows one way, on the `fsio` and `cgroupfs` foundation: `config` -> `discover` + `sample` (kernel reads) -> `signal` (per-workload
//! values that survive restarts, into a `model::Snapshot`) -> `rule` (held thresholds) -> `action`
//! (breakers, freeze/kill) -> `model::Published` -> `export`, `status`. Every stage passes on
//! `model` types, and no module names a stage after its own (`tests/layering.rs`).

pub mod action;
pub mod agent;
pub mod cgroupfs;
pub mod cli;
pub mod clock;
pub mod config;
pub mod discover;
pub mod error;
pub mod export;
pub mod fsio;
pub mod model;
pub mod rule;
pub mod sample;
pub mod signal;
pub mod status;
