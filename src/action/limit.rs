//! The knobs of the limit actions: which file in which hierarchy each one turns on this host, the
//! value a setting writes, and writing it so that the value kept is the one the kernel shows
//! (`memory.high` reads back rounded to a page; a comparison with what we asked would see a
//! rewrite at every tick).

use super::breaker::Knob;
use super::cgroup::CgroupHandle;
use super::decide::Setting;
use crate::cgroupfs::CgroupLayout;
use crate::model::ActionKind;
use std::path::{Path, PathBuf};

/// The hierarchies the knobs live in, from the host's layout.
#[derive(Debug, Clone, Default)]
pub struct KnobRoots {
    /// The v2 tree when memory is accounted there (pure v2): `memory.high` has no v1 twin.
    pub memory_v2: Option<PathBuf>,
    /// `pids.max`: the v1 pids controller on v1 and hybrid hosts, else the v2 tree.
    pub pids: Option<PathBuf>,
    /// `cpu.max` in the v2 tree (pure v2), or the v1 cpu controller's `cpu.cfs_quota_us`.
    pub cpu: Option<(PathBuf, Knob)>,
    /// The v2 tree, where cgroup BPF programs attach (on hybrid hosts too).
    pub unified: Option<PathBuf>,
}

impl KnobRoots {
    pub fn detect(layout: &CgroupLayout) -> KnobRoots {
        let v2 = layout.memory_is_v2();
        KnobRoots {
            memory_v2: v2.then(|| layout.primary()),
            pids: layout.pids_root(),
            cpu: match layout.v1_controller("cpu") {
                Some(root) => Some((root, Knob::CpuCfsQuota)),
                None if v2 => Some((layout.primary(), Knob::CpuMax)),
                None => None,
            },
            unified: layout.unified().map(Path::to_path_buf),
        }
    }

    /// The knob `action` turns here and the root of its hierarchy, or why it cannot here.
    pub fn knob(&self, action: ActionKind) -> Result<(Knob, &Path), String> {
        let missing = |what: &str| Err(format!("{} needs {what}", action.as_str()));
        match action {
            ActionKind::ThrottleMemory => match &self.memory_v2 {
                Some(r) => Ok((Knob::MemoryHigh, r)),
                None => missing("cgroup v2 memory (memory.high); this host accounts memory in v1"),
            },
            ActionKind::LimitPids => match &self.pids {
                Some(r) => Ok((Knob::PidsMax, r)),
                None => missing("the pids controller"),
            },
            ActionKind::ThrottleCpu => match &self.cpu {
                Some((r, k)) => Ok((*k, r)),
                None => missing("the cpu controller"),
            },
            ActionKind::LimitConnections => match &self.unified {
                Some(r) => Ok((Knob::Connect, r)),
                None => missing("a cgroup v2 tree to attach its filter to"),
            },
            a => Err(format!("{} is not a limit", a.as_str())),
        }
    }

    /// The root a knob of a record lives in.
    pub fn root(&self, knob: Knob) -> Option<&Path> {
        match knob {
            Knob::MemoryHigh => self.memory_v2.as_deref(),
            Knob::PidsMax => self.pids.as_deref(),
            Knob::CpuMax | Knob::CpuCfsQuota => self.cpu.as_ref().map(|(r, _)| r.as_path()),
            Knob::Connect => self.unified.as_deref(),
        }
    }
}

/// The CFS period a v2 `cpu.max` is written with (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;
/// The CFS minimum quota.
const CPU_MIN_QUOTA_US: u64 = 1_000;

/// Pure: what a setting writes into a knob. `period_us` is the cgroup's v1 CFS period.
pub fn value(knob: Knob, setting: &Setting, period_us: u64) -> Result<String, String> {
    let quota =
        |cores: f64, period: u64| ((cores * period as f64).round() as u64).max(CPU_MIN_QUOTA_US);
    match (knob, setting) {
        (_, Setting::Restore(l)) => Ok(l.value.clone()),
        (Knob::MemoryHigh, Setting::Bytes(b)) => Ok(b.to_string()),
        (Knob::PidsMax, Setting::Tasks(n)) => Ok(n.max(&1).to_string()),
        (Knob::CpuMax, Setting::Cores(c)) => {
            Ok(format!("{} {CPU_PERIOD_US}", quota(*c, CPU_PERIOD_US)))
        }
        (Knob::CpuCfsQuota, Setting::Cores(c)) => Ok(quota(*c, period_us).to_string()),
        (Knob::Connect, Setting::Connects(0)) => Ok("refuse".to_owned()),
        (Knob::Connect, Setting::Connects(n)) => Ok(format!("rate:{n}")),
        (Knob::MemoryHigh, Setting::None) => Err("no working set was read for it".to_owned()),
        (Knob::PidsMax, Setting::None) => Err("no task count was read for it".to_owned()),
        (k, s) => Err(format!("{k:?} cannot be set from {s:?}")),
    }
}

/// Pure: the connect policy a `connect` value names.
pub fn connect_policy(value: &str) -> Option<super::connect_limit::Policy> {
    use super::connect_limit::Policy;
    if value == "refuse" {
        return Some(Policy::Refuse);
    }
    let n: u32 = value.strip_prefix("rate:")?.parse().ok()?;
    Some(Policy::Rate {
        per_second: n,
        burst: n,
    })
}

/// The v1 CFS period of a cgroup (100 ms when it cannot be read).
pub fn cfs_period(h: &CgroupHandle) -> u64 {
    h.read_file("cpu.cfs_period_us")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(CPU_PERIOD_US)
}

/// Reads a file knob, trimmed.
pub fn read(h: &CgroupHandle, knob: Knob) -> std::io::Result<String> {
    match knob.file() {
        Some(f) => Ok(h.read_file(f)?.trim().to_owned()),
        None => Ok(String::new()),
    }
}

/// Writes a file knob and returns what the kernel shows for it now.
pub fn write(h: &CgroupHandle, knob: Knob, value: &str) -> std::io::Result<String> {
    match knob.file() {
        Some(f) => {
            h.write_file(f, value)?;
            read(h, knob)
        }
        None => Ok(value.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_per_knob() {
        assert_eq!(
            value(Knob::MemoryHigh, &Setting::Bytes(104_857_600), 0),
            Ok("104857600".into())
        );
        assert_eq!(value(Knob::PidsMax, &Setting::Tasks(0), 0), Ok("1".into()));
        assert_eq!(
            value(Knob::CpuMax, &Setting::Cores(0.1), 0),
            Ok("10000 100000".into())
        );
        assert_eq!(
            value(Knob::CpuMax, &Setting::Cores(0.001), 0),
            Ok("1000 100000".into()),
            "never under the CFS minimum"
        );
        assert_eq!(
            value(Knob::CpuCfsQuota, &Setting::Cores(0.5), 50_000),
            Ok("25000".into())
        );
        assert_eq!(
            value(Knob::Connect, &Setting::Connects(0), 0),
            Ok("refuse".into())
        );
        assert_eq!(
            value(Knob::Connect, &Setting::Connects(20), 0),
            Ok("rate:20".into())
        );
        assert!(value(Knob::MemoryHigh, &Setting::None, 0).is_err());
        assert!(value(Knob::PidsMax, &Setting::Cores(1.0), 0).is_err());
        assert_eq!(
            connect_policy("rate:20"),
            Some(super::super::connect_limit::Policy::Rate {
                per_second: 20,
                burst: 20
            })
        );
        assert_eq!(connect_policy("rate:x"), None);
    }

    #[test]
    fn what_each_layout_offers() {
        let hybrid = CgroupLayout::Hybrid {
            root: "/nonexistent-ng".into(),
            unified: "/nonexistent-ng/unified".into(),
        };
        let r = KnobRoots::detect(&hybrid);
        assert!(r
            .knob(ActionKind::ThrottleMemory)
            .unwrap_err()
            .contains("v1"));
        assert_eq!(
            r.knob(ActionKind::LimitConnections).unwrap().0,
            Knob::Connect
        );
        let v2 = CgroupLayout::Unified {
            root: "/sys/fs/cgroup".into(),
        };
        let r = KnobRoots::detect(&v2);
        assert_eq!(
            r.knob(ActionKind::ThrottleMemory).unwrap().0,
            Knob::MemoryHigh
        );
        assert_eq!(r.knob(ActionKind::ThrottleCpu).unwrap().0, Knob::CpuMax);
        assert_eq!(r.knob(ActionKind::LimitPids).unwrap().0, Knob::PidsMax);
    }
}
