//! Per-pod-netns procfs files held open and re-read with `pread` each tick: a pod's conntrack
//! entry count (`net/stat/nf_conntrack`), `sockstat` and `sockstat6`, plus its local addresses,
//! cached. Opening `/proc/<pid>/net/<file>` walks the path and resolves the task's namespace each
//! time; an open file is bound to the namespace (not the pid), so re-reading it from offset 0 is
//! what the namespace holds now. Files of a namespace not seen in a tick are closed with it (an
//! open file keeps its namespace alive).
//!
//! Addresses (`fib_trie`, `if_inet6`) are only needed to attribute a conntrack dump, and a pod's
//! addresses are set up by its CNI when the sandbox starts: they are read when the namespace is
//! new, while it has none, when a dump is about to be requested, and otherwise every
//! [`ADDR_REFRESH`] (the staleness bound of the exported `addresses`).

use super::addrs::{parse_fib_trie_locals, parse_if_inet6};
use crate::error::{ParseError, ReadError};
use crate::fsio::{is_gone, read_optional};
use std::collections::HashMap;
use std::fs::File;
use std::net::IpAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A namespace's cached addresses are read again after this long.
pub const ADDR_REFRESH: Duration = Duration::from_secs(60);

/// Namespaces whose files are held (3 descriptors each), at most, and at most 1/32 of the
/// soft `RLIMIT_NOFILE` in descriptors (`fsio::FdHolder`). Pod namespaces are made by the orchestrator, not by
/// workloads (a kubelet allows 110 pods by default); beyond the bound files are opened by path
/// each tick, as before (exact, slower).
pub const MAX_HELD_NETNS: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsFile {
    Conntrack,
    Sockstat,
    Sockstat6,
}

impl NsFile {
    fn rel(self) -> &'static str {
        match self {
            NsFile::Conntrack => "net/stat/nf_conntrack",
            NsFile::Sockstat => "net/sockstat",
            NsFile::Sockstat6 => "net/sockstat6",
        }
    }

    fn index(self) -> usize {
        match self {
            NsFile::Conntrack => 0,
            NsFile::Sockstat => 1,
            NsFile::Sockstat6 => 2,
        }
    }
}

struct Held {
    seen: u64,
    files: [Option<File>; 3],
    /// Addresses and when they were read.
    addrs: Option<(Instant, Vec<IpAddr>)>,
}

pub struct NetnsFiles {
    proc_root: PathBuf,
    tick: u64,
    by_ns: HashMap<u64, Held>,
    max: usize,
    buf: Vec<u8>,
}

impl NetnsFiles {
    pub fn new(proc_root: PathBuf) -> Self {
        // Three descriptors a namespace, within the netns files' share of the fd limit.
        let share = crate::fsio::FdHolder::Netns.cap(usize::MAX) / 3;
        NetnsFiles {
            proc_root,
            tick: 0,
            by_ns: HashMap::new(),
            max: MAX_HELD_NETNS.min(share),
            buf: Vec::with_capacity(4096),
        }
    }

    /// Tests: a smaller bound.
    pub fn with_max(mut self, max: usize) -> Self {
        self.max = max;
        self
    }

    /// Starts a tick: namespaces not [`touch`](Self::touch)ed before [`end_tick`](Self::end_tick)
    /// are let go.
    pub fn begin_tick(&mut self) {
        self.tick += 1;
    }

    pub fn end_tick(&mut self) {
        let tick = self.tick;
        self.by_ns.retain(|_, h| h.seen == tick);
    }

    /// Namespaces held now.
    pub fn held(&self) -> usize {
        self.by_ns.len()
    }

    /// Marks `ns` as alive this tick, holding its files when there is room.
    fn touch(&mut self, ns: u64) -> bool {
        let tick = self.tick;
        if let Some(h) = self.by_ns.get_mut(&ns) {
            h.seen = tick;
            return true;
        }
        if self.by_ns.len() >= self.max {
            return false;
        }
        self.by_ns.insert(
            ns,
            Held {
                seen: tick,
                files: [None, None, None],
                addrs: None,
            },
        );
        true
    }

    /// Parses `file` of netns `ns` (entered through `pid`); `Ok(None)` when it does not exist (the
    /// pid exited, or the module is not loaded).
    pub fn parse<T>(
        &mut self,
        ns: u64,
        pid: u32,
        file: NsFile,
        parse: impl FnOnce(&str) -> Result<T, ParseError>,
    ) -> Result<Option<T>, ReadError> {
        let path = self.proc_root.join(pid.to_string()).join(file.rel());
        let held = self.touch(ns);
        let mut buf = std::mem::take(&mut self.buf);
        let read = if held {
            let slot = self.by_ns.get_mut(&ns).map(|h| &mut h.files[file.index()]);
            read_held(slot, &path, &mut buf)
        } else {
            read_once(&path, &mut buf)
        };
        let out = match read {
            Ok(true) => match std::str::from_utf8(&buf) {
                Ok(t) => parse(t).map(Some).map_err(|e| ReadError::parse(&path, e)),
                Err(_) => Err(ReadError::parse(&path, ParseError::new("not UTF-8"))),
            },
            Ok(false) => Ok(None),
            Err(e) => Err(e),
        };
        self.buf = buf;
        out
    }

    /// The namespace's local addresses: cached, read again when `force`, when none are known,
    /// and every [`ADDR_REFRESH`].
    pub fn addresses(
        &mut self,
        ns: u64,
        pid: u32,
        now: Instant,
        force: bool,
    ) -> Result<Vec<IpAddr>, ReadError> {
        let held = self.touch(ns);
        if held && !force {
            if let Some((at, a)) = self.by_ns.get(&ns).and_then(|h| h.addrs.as_ref()) {
                if !a.is_empty() && now.saturating_duration_since(*at) < ADDR_REFRESH {
                    return Ok(a.clone());
                }
            }
        }
        let a = read_addresses(&self.proc_root, pid)?;
        if let Some(h) = self.by_ns.get_mut(&ns) {
            h.addrs = Some((now, a.clone()));
        }
        Ok(a)
    }
}

/// Reads the held file from offset 0, opening it first if it is not held yet.
fn read_held(
    slot: Option<&mut Option<File>>,
    path: &Path,
    buf: &mut Vec<u8>,
) -> Result<bool, ReadError> {
    let Some(slot) = slot else {
        return read_once(path, buf);
    };
    if slot.is_none() {
        match File::open(path) {
            Ok(f) => *slot = Some(f),
            Err(e) if is_gone(&e) => return Ok(false),
            Err(e) => return Err(ReadError::io(path, e)),
        }
    }
    let Some(f) = slot.as_ref() else {
        return Ok(false);
    };
    match pread_all(f, buf) {
        Ok(()) => Ok(true),
        Err(e) => {
            // Opened again next tick.
            *slot = None;
            if is_gone(&e) {
                Ok(false)
            } else {
                Err(ReadError::io(path, e))
            }
        }
    }
}

fn read_once(path: &Path, buf: &mut Vec<u8>) -> Result<bool, ReadError> {
    match File::open(path) {
        Ok(f) => match pread_all(&f, buf) {
            Ok(()) => Ok(true),
            Err(e) if is_gone(&e) => Ok(false),
            Err(e) => Err(ReadError::io(path, e)),
        },
        Err(e) if is_gone(&e) => Ok(false),
        Err(e) => Err(ReadError::io(path, e)),
    }
}

/// The whole file from offset 0 (a seq file starts over at 0: a fresh snapshot).
fn pread_all(f: &File, buf: &mut Vec<u8>) -> std::io::Result<()> {
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        match f.read_at(&mut chunk, buf.len() as u64) {
            Ok(0) => return Ok(()),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn read_addresses(proc_root: &Path, pid: u32) -> Result<Vec<IpAddr>, ReadError> {
    let dir = proc_root.join(pid.to_string()).join("net");
    let mut out: Vec<IpAddr> = Vec::new();
    if let Some(t) = read_optional(&dir.join("fib_trie"))? {
        out.extend(parse_fib_trie_locals(&t).into_iter().map(IpAddr::V4));
    }
    if let Some(t) = read_optional(&dir.join("if_inet6"))? {
        out.extend(parse_if_inet6(&t).into_iter().map(IpAddr::V6));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::net::sockstat::parse_sockstat;

    fn fixture() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("42/net");
        std::fs::create_dir_all(net.join("stat")).unwrap();
        std::fs::write(
            net.join("sockstat"),
            "sockets: used 5\nTCP: inuse 3 orphan 0 tw 1 alloc 4 mem 1\nUDP: inuse 2 mem 0\n",
        )
        .unwrap();
        std::fs::write(
            net.join("fib_trie"),
            "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 10.1.2.3\n        /32 host LOCAL\n",
        )
        .unwrap();
        let root = dir.path().to_path_buf();
        (dir, root)
    }

    #[test]
    fn held_files_are_read_again_from_the_start() {
        let (_d, root) = fixture();
        let mut f = NetnsFiles::new(root.clone());
        f.begin_tick();
        let s = f
            .parse(7, 42, NsFile::Sockstat, parse_sockstat)
            .unwrap()
            .unwrap();
        assert_eq!(s.tcp_inuse, 3);
        assert_eq!(f.parse(7, 42, NsFile::Sockstat6, |_| Ok(())).unwrap(), None);
        f.end_tick();
        assert_eq!(f.held(), 1);
        // Rewritten in place (same inode): the held file shows the new text.
        let p = root.join("42/net/sockstat");
        let text =
            "sockets: used 5\nTCP: inuse 9 orphan 0 tw 1 alloc 4 mem 1\nUDP: inuse 2 mem 0\n";
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .and_then(|mut w| std::io::Write::write_all(&mut w, text.as_bytes()))
            .unwrap();
        f.begin_tick();
        let s = f
            .parse(7, 42, NsFile::Sockstat, parse_sockstat)
            .unwrap()
            .unwrap();
        assert_eq!(s.tcp_inuse, 9);
        f.end_tick();
        // A namespace not seen in a tick is let go.
        f.begin_tick();
        f.end_tick();
        assert_eq!(f.held(), 0);
    }

    #[test]
    fn beyond_the_bound_files_are_read_by_path() {
        let (_d, root) = fixture();
        let mut f = NetnsFiles::new(root).with_max(0);
        f.begin_tick();
        let s = f
            .parse(7, 42, NsFile::Sockstat, parse_sockstat)
            .unwrap()
            .unwrap();
        assert_eq!(s.udp_inuse, 2);
        assert_eq!(f.held(), 0);
    }

    #[test]
    fn parse_errors_name_the_path() {
        let (_d, root) = fixture();
        let mut f = NetnsFiles::new(root);
        f.begin_tick();
        let e = f
            .parse(7, 42, NsFile::Sockstat, |_| -> Result<(), _> {
                Err(ParseError::new("no"))
            })
            .unwrap_err();
        assert!(e.path().ends_with("42/net/sockstat"), "{e}");
    }

    #[test]
    fn addresses_are_cached_until_forced_or_stale() {
        let (_d, root) = fixture();
        let mut f = NetnsFiles::new(root.clone());
        let t0 = Instant::now();
        f.begin_tick();
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(f.addresses(7, 42, t0, false).unwrap(), vec![ip]);
        let trie = root.join("42/net/fib_trie");
        std::fs::write(
            &trie,
            "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 10.9.9.9\n        /32 host LOCAL\n",
        )
        .unwrap();
        let new: IpAddr = "10.9.9.9".parse().unwrap();
        assert_eq!(
            f.addresses(7, 42, t0 + Duration::from_secs(5), false)
                .unwrap(),
            vec![ip]
        );
        assert_eq!(
            f.addresses(7, 42, t0 + Duration::from_secs(5), true)
                .unwrap(),
            vec![new]
        );
        std::fs::write(&trie, "Main:\n").unwrap();
        assert_eq!(
            f.addresses(7, 42, t0 + Duration::from_secs(10), false)
                .unwrap(),
            vec![new]
        );
        assert_eq!(
            f.addresses(7, 42, t0 + ADDR_REFRESH * 2, false).unwrap(),
            Vec::<IpAddr>::new()
        );
        // None known: read every time.
        std::fs::write(
            &trie,
            "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 10.1.2.3\n        /32 host LOCAL\n",
        )
        .unwrap();
        assert_eq!(
            f.addresses(7, 42, t0 + ADDR_REFRESH * 2, false).unwrap(),
            vec![ip]
        );
    }

    #[test]
    fn procfs_seq_files_read_again_with_pread() {
        // The agent's own namespace: two reads of a held sockstat both parse.
        let mut f = NetnsFiles::new("/proc".into());
        let pid = std::process::id();
        for _ in 0..2 {
            f.begin_tick();
            assert!(f
                .parse(1, pid, NsFile::Sockstat, parse_sockstat)
                .unwrap()
                .is_some());
            f.end_tick();
        }
        assert_eq!(f.held(), 1);
    }
}
