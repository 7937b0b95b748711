//! The contract layer: the value types that cross from one stage to the next. It depends on
//! nothing else in the crate (std and serde only), so every stage may name it and it names none.
//!
//! - `workload`: who a workload is (`WorkloadId`, `QosClass`).
//! - `snapshot`: what one tick observed (`Snapshot` and its parts), and what the agent publishes
//!   (`Published`: the snapshot and the guard's verdict on it).
//! - `rule`: what a rule is, as configured (`Rule`, `SignalKind`, `ThresholdSpec`, ...).
//! - `guard`: the guard's view of itself (`GuardStatus`, `BreakerView`, ...).

mod guard;
mod rule;
mod snapshot;
mod workload;

pub use guard::*;
pub use rule::*;
pub use snapshot::*;
pub use workload::*;
