//! Container log pipeline sampling: counts the lines each container writes to its kubelet pod
//! logs, from the CRI format parser up to the rotation-safe tailer of `/var/log/pods`.
pub mod cri;
pub mod tailer;

pub use tailer::{ContainerLogSample, LineCounts, LogTailer};
