//! Export: the Prometheus registry over the last snapshot, and the HTTP server.

pub mod catalog;
pub(crate) mod exposition;
pub mod info;
pub mod limits;
pub mod metrics;
pub mod server;
pub mod stats;
pub mod watchdog;
