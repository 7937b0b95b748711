//! OOM kills from the kernel log (`/dev/kmsg`), as cAdvisor and node-problem-detector read them.
//!
//! The runtime removes an OOM-killed container's cgroup tens of milliseconds after the kill, and on
//! v1 the kernel counts the kill only in that cgroup, so the cgroup counters lose it. The kernel's
//! `oom-kill:` summary record names the victim's memory cgroup and survives it:
//! `oom-kill:constraint=..,oom_memcg=<path>,task_memcg=<path>,task=<comm>,pid=<n>,uid=<n>`.
//! One such record is one OOM event (one OOM-killer invocation), whatever `memory.oom.group` then
//! kills with it. Parsing is pure; [`KmsgReader`] is a thin non-blocking layer on the device.

use crate::error::ReadError;
use crate::fsio::escape_name;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// One `/dev/kmsg` read returns one record; the kernel refuses buffers below 8 KiB
/// (`CONSOLE_EXT_LOG_MAX`) with EINVAL. Twice that leaves room for long dictionaries.
const RECORD_BUF: usize = 16 * 1024;

/// `TASK_COMM_LEN - 1`: the kernel never prints a longer comm.
const MAX_COMM: usize = 15;

/// Occurrences of a key considered when a hostile name repeats it: bounds the split search.
const MAX_CANDIDATES: usize = 16;

/// A record's header fields and its message (the first line, dictionary lines dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    /// `prio >> 3`: 0 for the kernel; userspace writes to /dev/kmsg can never use 0.
    pub facility: u32,
    pub seq: u64,
    /// `-`, or on kernels before 5.10 `c` (continued by the next record) / `+` (continuation).
    pub flag: u8,
    pub message: &'a [u8],
}

/// Pure: `prio,seq,ts_usec,flag[,...];message\n[ KEY=value\n]...`.
pub fn parse_header(rec: &[u8]) -> Option<Header<'_>> {
    let semi = memchr::memchr(b';', rec)?;
    let head = std::str::from_utf8(&rec[..semi]).ok()?;
    let mut it = head.split(',');
    let prio: u32 = it.next()?.parse().ok()?;
    let seq: u64 = it.next()?.parse().ok()?;
    let _ts: u64 = it.next()?.parse().ok()?;
    let flag = it.next().and_then(|f| f.bytes().next()).unwrap_or(b'-');
    let body = &rec[semi + 1..];
    let end = memchr::memchr(b'\n', body).unwrap_or(body.len());
    Some(Header {
        facility: prio >> 3,
        seq,
        flag,
        message: &body[..end],
    })
}

/// The victim of one OOM event, as the kernel named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomKill {
    /// The OOM domain (the cgroup whose limit was hit); `None` for a global (node) OOM.
    pub oom_memcg: Option<String>,
    /// The victim's memory cgroup, relative to the memory hierarchy's root (the v1 `memory`
    /// controller or the unified tree), names escaped like discovery's ([`escape_name`]).
    pub task_memcg: String,
    /// Raw bytes: a workload sets its comm to anything.
    pub comm: Vec<u8>,
    pub pid: u32,
    pub uid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Not an `oom-kill:` record.
    Other,
    Oom(OomKill),
    /// `oom_kill_process: N callbacks suppressed`: the kernel rate-limits its OOM report
    /// (`oom_rs`: 10 per 5 s node-wide) and dropped N `oom-kill:` records. Those kills are left to
    /// the cgroup counters.
    Suppressed(u64),
    /// An `oom-kill:` record cut short or not in the kernel's shape: counted, not attributed.
    Truncated,
}

/// Pure: one record's message. Only kernel records (facility 0) count: a root process may write
/// to /dev/kmsg, but the kernel forces a non-zero facility on what userspace writes.
pub fn parse_message(facility: u32, msg: &[u8]) -> Message {
    if facility != 0 {
        return Message::Other;
    }
    if let Some(n) = msg
        .strip_prefix(b"oom_kill_process: ")
        .and_then(|r| r.strip_suffix(b" callbacks suppressed"))
        .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
    {
        return Message::Suppressed(n);
    }
    let Some(body) = msg.strip_prefix(b"oom-kill:") else {
        return Message::Other;
    };
    parse_oom(body).map_or(Message::Truncated, Message::Oom)
}

/// `...,oom_memcg=M,task_memcg=T,task=C,pid=P,uid=U` (or `,global_oom,task_memcg=T,...`).
///
/// Cgroup names and the comm may themselves contain `,task=` or `,task_memcg=` (cgroup names
/// under delegation, comm through prctl), so every split is tried and the first consistent one
/// wins: both paths absolute, the victim inside the OOM domain, the comm at most 15 bytes. A
/// workload confined to its own subtree can then only move the victim within that subtree.
fn parse_oom(body: &[u8]) -> Option<OomKill> {
    let (rest, uid) = rsplit_number(body, b",uid=")?;
    let (rest, pid) = rsplit_number(rest, b",pid=")?;
    let domains = find_all(rest, b",oom_memcg=");
    for tm in find_all(rest, b",task_memcg=") {
        let t_start = tm + b",task_memcg=".len();
        // Candidate OOM domains, nearest first: global, or any `oom_memcg=` before this key.
        let mut candidates: Vec<Option<&[u8]>> = Vec::new();
        if rest[..tm].ends_with(b",global_oom") {
            candidates.push(None);
        }
        for &om in domains.iter().rev().filter(|&&om| om < tm) {
            candidates.push(Some(&rest[om + b",oom_memcg=".len()..tm]));
        }
        for domain in candidates {
            let m = domain.map(unescape);
            if m.as_ref().is_some_and(|m| !m.starts_with(b"/")) {
                continue;
            }
            for tk in find_all(&rest[t_start..], b",task=") {
                let comm = unescape(&rest[t_start + tk + b",task=".len()..]);
                let t = unescape(&rest[t_start..t_start + tk]);
                if comm.len() > MAX_COMM || !t.starts_with(b"/") {
                    continue;
                }
                let inside = m.as_ref().is_none_or(|m| {
                    m.as_slice() == b"/"
                        || t == *m
                        || (t.starts_with(m) && t.get(m.len()) == Some(&b'/'))
                });
                if !inside {
                    continue;
                }
                return Some(OomKill {
                    oom_memcg: m.as_deref().map(rel_path),
                    task_memcg: rel_path(&t),
                    comm,
                    pid,
                    uid,
                });
            }
        }
    }
    None
}

/// `(before, n)` for `<before><key><digits>` at the end of `s`.
fn rsplit_number<'a>(s: &'a [u8], key: &[u8]) -> Option<(&'a [u8], u32)> {
    let at = find_all(s, key).pop()?;
    let digits = &s[at + key.len()..];
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some((&s[..at], n))
}

/// Start offsets of `needle` in `hay`, at most [`MAX_CANDIDATES`] (the last ones kept for
/// `rsplit_number`, which needs the final occurrence).
fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    let mut out: Vec<usize> = memchr::memmem::find_iter(hay, needle).collect();
    if out.len() > MAX_CANDIDATES {
        let last = out[out.len() - 1];
        out.truncate(MAX_CANDIDATES - 1);
        out.push(last);
    }
    out
}

/// Pure: the kernel escapes bytes below 0x20, from 0x7f, and `\` itself as `\xNN`.
pub fn unescape(s: &[u8]) -> Vec<u8> {
    let hex = |d: u8| (d as char).to_digit(16).map(|v| v as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\' && s.get(i + 1) == Some(&b'x') {
            if let (Some(h), Some(l)) = (
                s.get(i + 2).copied().and_then(hex),
                s.get(i + 3).copied().and_then(hex),
            ) {
                out.push(h << 4 | l);
                i += 4;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    out
}

/// A raw cgroup path in discovery's form: each component through [`escape_name`].
fn rel_path(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    for comp in raw.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
        out.push('/');
        out.push_str(&escape_name(comp));
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

// === impl KmsgReader ===

/// What one pass over the kernel log found.
#[derive(Debug, Default)]
pub struct KmsgPass {
    pub ooms: Vec<OomKill>,
    pub records: u64,
    pub truncated: u64,
    /// `oom-kill:` records the kernel's rate limit dropped (as it reported).
    pub suppressed: u64,
    /// EPIPE: the ring overwrote records before they were read (each is one gap, of any size).
    pub overruns: u64,
    /// The per-tick bound stopped the pass before the log was drained (the rest is next tick).
    pub limited: bool,
    /// A read failed other than EAGAIN/EPIPE/EINTR: the pass stopped there.
    pub error: Option<ReadError>,
}

/// The kernel log device, opened non-blocking at its current end: records logged before the
/// agent started were counted (or missed) by the cgroup counters of their time.
#[derive(Debug)]
pub struct KmsgReader {
    path: PathBuf,
    file: File,
    max_records: usize,
    buf: Vec<u8>,
    /// A pre-5.10 record flagged `c`, waiting for its `+` continuations (at most RECORD_BUF).
    pending: Option<(u32, Vec<u8>)>,
}

impl KmsgReader {
    /// Opens `path` (O_NONBLOCK) and seeks to its end. EPERM/EACCES without CAP_SYSLOG (or with
    /// `kernel.dmesg_restrict=1` for non-root), or a device the container cannot open, is the
    /// error the caller reports as the feature being off.
    pub fn open(path: &Path, max_records: usize) -> Result<KmsgReader, ReadError> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| ReadError::io(path, e))?;
        file.seek(SeekFrom::End(0))
            .map_err(|e| ReadError::io(path, e))?;
        Ok(KmsgReader {
            path: path.to_path_buf(),
            file,
            max_records: max_records.max(1),
            buf: vec![0; RECORD_BUF],
            pending: None,
        })
    }

    /// Reads the records logged since the last pass, at most `max_records`; EAGAIN is the end.
    pub fn read(&mut self) -> KmsgPass {
        let mut pass = KmsgPass::default();
        let mut drained = false;
        let mut attempts = 0;
        // Bounded: EPIPE and EINTR also count towards the bound, so no loop outlives it.
        while attempts < self.max_records {
            attempts += 1;
            match self.file.read(&mut self.buf) {
                Ok(0) => {
                    drained = true;
                    break;
                }
                Ok(n) => {
                    pass.records += 1;
                    let rec = &self.buf[..n];
                    let Some(h) = parse_header(rec) else {
                        continue;
                    };
                    let msg = h.message.to_vec();
                    self.take(h.facility, h.flag, msg, &mut pass);
                }
                Err(e) if e.raw_os_error() == Some(nix::libc::EAGAIN) => {
                    drained = true;
                    break;
                }
                Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => pass.overruns += 1,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    pass.error = Some(ReadError::io(&self.path, e));
                    drained = true;
                    break;
                }
            }
        }
        if drained {
            self.flush(&mut pass);
        }
        pass.limited = !drained;
        pass
    }

    /// Joins pre-5.10 continuation fragments; everything else is one message.
    fn take(&mut self, facility: u32, flag: u8, msg: Vec<u8>, pass: &mut KmsgPass) {
        if flag == b'+' {
            if let Some((_, p)) = &mut self.pending {
                let room = RECORD_BUF.saturating_sub(p.len());
                p.extend_from_slice(&msg[..msg.len().min(room)]);
                return;
            }
        }
        self.flush(pass);
        if flag == b'c' {
            self.pending = Some((facility, msg));
        } else {
            count(parse_message(facility, &msg), pass);
        }
    }

    fn flush(&mut self, pass: &mut KmsgPass) {
        if let Some((facility, msg)) = self.pending.take() {
            count(parse_message(facility, &msg), pass);
        }
    }
}

fn count(m: Message, pass: &mut KmsgPass) {
    match m {
        Message::Other => {}
        Message::Oom(k) => pass.ooms.push(k),
        Message::Truncated => pass.truncated += 1,
        Message::Suppressed(n) => pass.suppressed += n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f5c1b2a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";

    fn oom(rec: &str) -> Message {
        let h = parse_header(rec.as_bytes()).expect("header");
        parse_message(h.facility, h.message)
    }

    #[test]
    fn a_real_memcg_record_with_its_dictionary_lines() {
        let rec = format!(
            "6,1187,51234567,-,caller=T4242;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/kubepods/burstable/pod12-34/{ID},task_memcg=/kubepods/burstable/pod12-34/{ID},task=stress,pid=4242,uid=0\n SUBSYSTEM=memory\n DEVICE=+memcg:x\n"
        );
        let Message::Oom(k) = oom(&rec) else {
            panic!("{:?}", oom(&rec))
        };
        let path = format!("/kubepods/burstable/pod12-34/{ID}");
        assert_eq!(k.task_memcg, path);
        assert_eq!(k.oom_memcg.as_deref(), Some(path.as_str()));
        assert_eq!((k.comm.as_slice(), k.pid, k.uid), (&b"stress"[..], 4242, 0));
        let h = parse_header(rec.as_bytes()).unwrap();
        assert_eq!((h.facility, h.seq, h.flag), (0, 1187, b'-'));
    }

    #[test]
    fn the_record_this_hybrid_host_wrote() {
        // Linux 6.18, v1 memory controller: paths relative to /sys/fs/cgroup/memory.
        let rec = "6,31270,12462280588,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/ngtest-14564-2/kubepods/pod000038e4-0003-4000-8000-000000000001/00000000000038e4000000000000000400000000000000000000000000000003,task_memcg=/ngtest-14564-2/kubepods/pod000038e4-0003-4000-8000-000000000001/00000000000038e4000000000000000400000000000000000000000000000003,task=nodeguard-testl,pid=14582,uid=0\n";
        let Message::Oom(k) = oom(rec) else { panic!() };
        assert_eq!(k.task_memcg, "/ngtest-14564-2/kubepods/pod000038e4-0003-4000-8000-000000000001/00000000000038e4000000000000000400000000000000000000000000000003");
        assert_eq!((k.comm.as_slice(), k.pid), (&b"nodeguard-testl"[..], 14582));
    }

    #[test]
    fn global_oom_and_a_child_cgroup_below_the_domain() {
        let Message::Oom(k) = oom("6,1,2,-;oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/system.slice/x.service,task=java,pid=7,uid=1000") else {
            panic!()
        };
        assert_eq!(k.oom_memcg, None);
        assert_eq!(k.task_memcg, "/system.slice/x.service");
        let Message::Oom(k) = oom("6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/a/pod,task_memcg=/a/pod/c1/nested,task=x,pid=8,uid=0") else {
            panic!()
        };
        assert_eq!(k.task_memcg, "/a/pod/c1/nested");
    }

    #[test]
    fn escaped_bytes_become_discovery_names() {
        // `\` is printed as \x5c, bytes >= 0x7f and control bytes as \xNN.
        let Message::Oom(k) = oom(
            r"6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/t,task_memcg=/t/u\xffx.scope/caf\xc3\xa9/a\x5cb,task=n\x0a\x1bx,pid=9,uid=0",
        ) else {
            panic!()
        };
        assert_eq!(k.task_memcg, "/t/u\\xffx.scope/café/a\\b");
        assert_eq!(k.comm, b"n\n\x1bx");
    }

    #[test]
    fn truncated_and_foreign_records() {
        let cut = "6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/a,task_memcg=/a/b";
        assert_eq!(oom(cut), Message::Truncated);
        assert_eq!(oom(&format!("{cut},task=x,pid=1")), Message::Truncated);
        assert_eq!(oom(&format!("{cut},task=x,pid=1,uid=")), Message::Truncated);
        // The victim outside its OOM domain is not the kernel's shape.
        assert_eq!(
            oom("6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/a,task_memcg=/b/c,task=x,pid=1,uid=0"),
            Message::Truncated
        );
        // A userspace write (facility 1, LOG_USER) never counts, whatever it says.
        assert_eq!(
            oom("14,5,6,-;oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/a,task_memcg=/a,task=x,pid=1,uid=0"),
            Message::Other
        );
        assert_eq!(
            oom("6,1,2,-;Out of memory: Killed process 1"),
            Message::Other
        );
        assert_eq!(parse_header(b"no header at all"), None);
        assert_eq!(parse_header(b"6,x,2,-;m"), None);
    }

    #[test]
    fn a_hostile_comm_or_cgroup_name_stays_inside_its_own_subtree() {
        // comm "a,task=b,pid=1" (14 bytes) is printed raw: the victim is still /p/c.
        let Message::Oom(k) = oom("6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/p/c,task_memcg=/p/c,task=a,task=b,pid=1,pid=77,uid=0") else {
            panic!()
        };
        assert_eq!(
            (k.task_memcg.as_str(), k.comm.as_slice(), k.pid),
            ("/p/c", &b"a,task=b,pid=1"[..], 77)
        );
        // A delegated cgroup named to look like another pod's path: the split that puts the
        // victim outside its domain is refused, the victim stays under /p/c.
        let evil = "/p/c/e,task_memcg=/kubepods/podX/ffffffffffff";
        let rec = format!("6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg={evil},task_memcg={evil}/v,task=x,pid=1,uid=0");
        let Message::Oom(k) = oom(&rec) else { panic!() };
        assert_eq!(k.task_memcg, format!("{evil}/v"));
        // A delegated name repeating `,oom_memcg=` cannot hide the kill: the earlier domain fits.
        let m = "/p/c/e,oom_memcg=/kubepods/podX";
        let rec = format!("6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg={m},task_memcg={m}/v,task=x,pid=1,uid=0");
        let Message::Oom(k) = oom(&rec) else { panic!() };
        assert_eq!(k.task_memcg, format!("{m}/v"));
        // A cpuset name (one component, no '/') cannot fake a domain.
        let Message::Oom(k) = oom("6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,cpuset=z,oom_memcg=q,task_memcg=q,mems_allowed=0,oom_memcg=/p/c,task_memcg=/p/c,task=x,pid=1,uid=0") else {
            panic!()
        };
        assert_eq!(k.task_memcg, "/p/c");
    }

    #[test]
    fn many_repeated_keys_are_bounded() {
        let mut rec =
            String::from("6,1,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/p,task_memcg=/p");
        for _ in 0..2000 {
            rec.push_str(",task=");
        }
        rec.push_str(",pid=1,uid=0");
        assert_eq!(oom(&rec), Message::Truncated);
    }

    #[test]
    fn pre_5_10_continuation_fragments_are_joined() {
        let dir = tempfile::tempdir().unwrap();
        // A regular file reads as one "record" per read; the joiner is exercised through take().
        let p = dir.path().join("kmsg");
        std::fs::write(&p, "").unwrap();
        let mut r = KmsgReader::open(&p, 10).unwrap();
        let mut pass = KmsgPass::default();
        r.take(
            0,
            b'c',
            b"oom-kill:constraint=CONSTRAINT_MEMCG,oom_memcg=/a".to_vec(),
            &mut pass,
        );
        r.take(0, b'+', b",task_memcg=/a/b".to_vec(), &mut pass);
        r.take(0, b'+', b",task=x,pid=3,uid=0".to_vec(), &mut pass);
        assert!(pass.ooms.is_empty());
        r.take(0, b'-', b"next".to_vec(), &mut pass);
        assert_eq!(pass.ooms.len(), 1);
        assert_eq!(pass.ooms[0].task_memcg, "/a/b");
        // A fragment never continued is parsed on its own, as truncated.
        r.take(
            0,
            b'c',
            b"oom-kill:constraint=CONSTRAINT_MEMCG".to_vec(),
            &mut pass,
        );
        r.flush(&mut pass);
        assert_eq!(pass.truncated, 1);
    }

    #[test]
    fn a_missing_device_is_an_error_with_its_path() {
        let e = KmsgReader::open(Path::new("/nonexistent/kmsg"), 10).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/kmsg"), "{e}");
    }
}
