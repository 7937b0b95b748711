//! Network-namespace readers: socket counts, per-socket states, conntrack usage and local addresses.
//! Procfs parsers are pure (`&str`/`&[u8]` in, values out); `ctnetlink` streams the conntrack table.
//! Everything under `/proc/<pid>/net` describes a whole netns, not one container (KERNEL-TRAPS.md).

pub mod addrs;
pub mod conntrack;
pub mod ctnetlink;
pub mod dump;
pub mod fdcache;
pub mod inet;
pub mod nsfiles;
pub mod ports;
pub mod sampler;
pub mod sockdiag;
pub mod sockets;
pub mod sockstat;
