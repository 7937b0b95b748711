//! `limit_connections` (issue 22): a `BPF_PROG_TYPE_CGROUP_SOCK_ADDR` program on a container's
//! cgroup v2 directory refuses its new outbound connects (`connect()` fails with EPERM), while
//! established connections and listening sockets keep working; detach restores.
//!
//! Raw `bpf(2)` with hand-assembled instructions: no BTF (Raspberry Pi OS kernels have none), no
//! bytecode build step, no loader crate (docs/design.md, "Containment: limit_connections").
//! Attachments are held by the cgroup, not by our fds: they survive a SIGKILLed agent, so
//! `detach_all_ours` finds ours by program name and releases them on the next start.

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::libc;
use nix::sys::stat::Mode;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

// === bpf(2) numbers (include/uapi/linux/bpf.h) ===

const BPF_MAP_CREATE: u32 = 0;
const BPF_MAP_LOOKUP_ELEM: u32 = 1;
const BPF_PROG_LOAD: u32 = 5;
const BPF_PROG_ATTACH: u32 = 8;
const BPF_PROG_DETACH: u32 = 9;
const BPF_PROG_GET_FD_BY_ID: u32 = 13;
const BPF_OBJ_GET_INFO_BY_FD: u32 = 15;
const BPF_PROG_QUERY: u32 = 16;

const BPF_PROG_TYPE_CGROUP_SOCK_ADDR: u32 = 18;
const BPF_MAP_TYPE_CGROUP_STORAGE: u32 = 19;
const BPF_F_ALLOW_MULTI: u32 = 2;
/// At most this many programs per attach type on one cgroup (`BPF_CGROUP_MAX_PROGS`).
const MAX_PROGS: usize = 64;

const HELPER_KTIME_GET_NS: i32 = 5;
const HELPER_GET_LOCAL_STORAGE: i32 = 81;

/// What `BPF_PROG_LOAD` is told the programs are under; they call no GPL-only helper.
const LICENSE: &[u8] = b"Apache-2.0\0";
/// Verifier log of a rejected load, kept in the error.
const LOG_SIZE: usize = 64 * 1024;
/// Attempts of the rate program's compare-and-swap before it refuses (the unrolled loop).
const CAS_ATTEMPTS: usize = 4;

/// The hooks a limiter attaches to. `sendmsg4/6` (unconnected UDP) are deliberately not among
/// them: that hook also sees every reply a UDP server in the cgroup sends (a DNS server answers
/// with `sendto`), and cannot tell a reply from a new flow, so refusing it would break listening
/// sockets. A connected UDP socket (the glibc resolver's) goes through `connect4/6` and is
/// refused; an unconnected `sendto` to a new peer is not (docs/design.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Connect4,
    Connect6,
}

impl Hook {
    pub const ALL: [Hook; 2] = [Hook::Connect4, Hook::Connect6];

    fn attach_type(self) -> u32 {
        match self {
            Hook::Connect4 => 10, // BPF_CGROUP_INET4_CONNECT
            Hook::Connect6 => 11, // BPF_CGROUP_INET6_CONNECT
        }
    }

    /// The program name (`prog_name`, at most 15 bytes): how `detach_all_ours` knows ours.
    pub fn prog_name(self) -> &'static str {
        match self {
            Hook::Connect4 => "ng_connect4",
            Hook::Connect6 => "ng_connect6",
        }
    }
}

// === Errors ===

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("bpf({op}): {errno}")]
    Sys { op: &'static str, errno: Errno },
    #[error("bpf(BPF_PROG_LOAD) {name}: {errno}; verifier log: {log}")]
    Load {
        name: &'static str,
        errno: Errno,
        log: String,
    },
    #[error("bpf({op}) on {}: {errno}", path.display())]
    Cgroup {
        op: &'static str,
        path: PathBuf,
        errno: Errno,
    },
    #[error("{}: not a cgroup v2 directory (cgroup BPF attaches to the unified tree only)", path.display())]
    NotV2 { path: PathBuf },
    #[error("limit_connections policy: {0}")]
    Policy(String),
}

// === Instructions ===

/// A BPF register. R1-R5 are clobbered by calls; R6-R9 are kept; R10 is the frame pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Reg {
    R0 = 0,
    R1,
    R2,
    R3,
    R4,
    R5,
    R6,
    R7,
    R8,
    R9,
    R10,
}

const CLS_LD: u8 = 0x00;
const CLS_LDX: u8 = 0x01;
const CLS_STX: u8 = 0x03;
const CLS_JMP: u8 = 0x05;
const CLS_ALU64: u8 = 0x07;
const SZ_DW: u8 = 0x18;
const MODE_IMM: u8 = 0x00;
const MODE_MEM: u8 = 0x60;
const MODE_ATOMIC: u8 = 0xc0;
const SRC_K: u8 = 0x00;
const SRC_X: u8 = 0x08;
const ALU_ADD: u8 = 0x00;
const ALU_SUB: u8 = 0x10;
const ALU_MOV: u8 = 0xb0;
const JMP_JEQ: u8 = 0x10;
const JMP_JGT: u8 = 0x20;
const JMP_JGE: u8 = 0x30;
const JMP_CALL: u8 = 0x80;
const JMP_EXIT: u8 = 0x90;
/// `BPF_CMPXCHG` (`0xf0 | BPF_FETCH`).
const ATOMIC_CMPXCHG: i32 = 0xf1;
/// `src_reg` of a `ld_imm64` whose immediate is a map fd (`BPF_PSEUDO_MAP_FD`).
const PSEUDO_MAP_FD: u8 = 1;

/// One `struct bpf_insn`, as the kernel reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Insn {
    pub code: u8,
    /// `dst_reg:4, src_reg:4`, in the bitfield order of the target's byte order.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    const fn raw(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        let regs = if cfg!(target_endian = "little") {
            (src << 4) | (dst & 0x0f)
        } else {
            (dst << 4) | (src & 0x0f)
        };
        Insn {
            code,
            regs,
            off,
            imm,
        }
    }

    pub const fn mov_imm(dst: Reg, imm: i32) -> Insn {
        Insn::raw(CLS_ALU64 | ALU_MOV | SRC_K, dst as u8, 0, 0, imm)
    }

    pub const fn mov(dst: Reg, src: Reg) -> Insn {
        Insn::raw(CLS_ALU64 | ALU_MOV | SRC_X, dst as u8, src as u8, 0, 0)
    }

    pub const fn add_imm(dst: Reg, imm: i32) -> Insn {
        Insn::raw(CLS_ALU64 | ALU_ADD | SRC_K, dst as u8, 0, 0, imm)
    }

    pub const fn sub(dst: Reg, src: Reg) -> Insn {
        Insn::raw(CLS_ALU64 | ALU_SUB | SRC_X, dst as u8, src as u8, 0, 0)
    }

    /// `dst = *(u64 *)(src + off)`.
    pub const fn load_dw(dst: Reg, src: Reg, off: i16) -> Insn {
        Insn::raw(CLS_LDX | SZ_DW | MODE_MEM, dst as u8, src as u8, off, 0)
    }

    /// `r0 = cmpxchg((u64 *)(dst + off), r0, src)`: stores `src` if the word equals R0; R0 gets
    /// the old word either way.
    pub const fn cmpxchg_dw(dst: Reg, src: Reg, off: i16) -> Insn {
        Insn::raw(
            CLS_STX | SZ_DW | MODE_ATOMIC,
            dst as u8,
            src as u8,
            off,
            ATOMIC_CMPXCHG,
        )
    }

    /// Conditional jump on two registers, `off` instructions past the next one.
    pub const fn jump(op: u8, dst: Reg, src: Reg, off: i16) -> Insn {
        Insn::raw(CLS_JMP | op | SRC_X, dst as u8, src as u8, off, 0)
    }

    pub const fn call(helper: i32) -> Insn {
        Insn::raw(CLS_JMP | JMP_CALL, 0, 0, 0, helper)
    }

    pub const fn exit() -> Insn {
        Insn::raw(CLS_JMP | JMP_EXIT, 0, 0, 0, 0)
    }

    /// `dst = imm` for a full 64-bit value: two instruction slots.
    pub const fn ld_imm64(dst: Reg, imm: u64) -> [Insn; 2] {
        Insn::ld_imm64_src(dst, 0, imm)
    }

    /// `dst = &map` from a map fd, resolved by the kernel at load.
    pub const fn ld_map_fd(dst: Reg, fd: i32) -> [Insn; 2] {
        Insn::ld_imm64_src(dst, PSEUDO_MAP_FD, fd as u32 as u64)
    }

    const fn ld_imm64_src(dst: Reg, src: u8, imm: u64) -> [Insn; 2] {
        [
            Insn::raw(
                CLS_LD | SZ_DW | MODE_IMM,
                dst as u8,
                src,
                0,
                imm as u32 as i32,
            ),
            Insn::raw(0, 0, 0, 0, (imm >> 32) as u32 as i32),
        ]
    }
}

/// A forward jump target of `Asm`.
#[derive(Debug, Clone, Copy)]
struct Label(usize);

/// A tiny assembler: instructions plus forward jumps to labels, resolved by `finish`.
#[derive(Debug, Default)]
struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    fixups: Vec<(usize, Label)>,
}

impl Asm {
    fn push(&mut self, i: Insn) {
        self.insns.push(i);
    }

    fn extend(&mut self, i: [Insn; 2]) {
        self.insns.extend(i);
    }

    fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    fn bind(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }

    fn jump(&mut self, op: u8, dst: Reg, src: Reg, to: Label) {
        self.fixups.push((self.insns.len(), to));
        self.push(Insn::jump(op, dst, src, 0));
    }

    fn finish(mut self) -> Result<Vec<Insn>, BpfError> {
        for (at, l) in &self.fixups {
            let target = self.labels[l.0]
                .ok_or_else(|| BpfError::Policy(format!("unbound label {}", l.0)))?;
            let off = i16::try_from(target as i64 - *at as i64 - 1)
                .map_err(|_| BpfError::Policy("jump out of range".into()))?;
            self.insns[*at].off = off;
        }
        Ok(self.insns)
    }
}

// === Policy and programs ===

/// What a limited cgroup may still do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Every new connect is refused.
    Refuse,
    /// At most `burst` connects at once, refilled at `per_second` (GCRA: a token bucket in one
    /// word), per attached cgroup, IPv4 and IPv6 together.
    Rate { per_second: u32, burst: u32 },
}

impl Policy {
    /// `(interval between connects, tolerance)` in ns, for `Rate`.
    fn rate_ns(self) -> Result<Option<(u64, u64)>, BpfError> {
        let Policy::Rate { per_second, burst } = self else {
            return Ok(None);
        };
        if !(1..=1_000_000).contains(&per_second) {
            return Err(BpfError::Policy(format!(
                "per_second {per_second}: between 1 and 1000000"
            )));
        }
        if !(1..=1_000_000).contains(&burst) {
            return Err(BpfError::Policy(format!(
                "burst {burst}: between 1 and 1000000"
            )));
        }
        let interval = 1_000_000_000 / u64::from(per_second);
        Ok(Some((interval, interval * u64::from(burst))))
    }
}

fn refuse_program() -> Vec<Insn> {
    vec![Insn::mov_imm(Reg::R0, 0), Insn::exit()]
}

/// GCRA over the attached cgroup's storage word `tat` (the theoretical arrival time, ns):
/// `next = max(tat, now) + interval`; refused if `next - now > limit`, else `tat = next` by
/// compare-and-swap, retried `CAS_ATTEMPTS` times, then refused (contention is a storm).
fn rate_program(map_fd: i32, interval: u64, limit: u64) -> Result<Vec<Insn>, BpfError> {
    let interval = i32::try_from(interval)
        .map_err(|_| BpfError::Policy(format!("interval {interval} ns too long")))?;
    let mut a = Asm::default();
    let (refuse, allow) = (a.label(), a.label());
    a.extend(Insn::ld_map_fd(Reg::R1, map_fd));
    a.push(Insn::mov_imm(Reg::R2, 0));
    a.push(Insn::call(HELPER_GET_LOCAL_STORAGE));
    a.push(Insn::mov(Reg::R7, Reg::R0));
    a.push(Insn::call(HELPER_KTIME_GET_NS));
    a.push(Insn::mov(Reg::R8, Reg::R0));
    a.extend(Insn::ld_imm64(Reg::R6, limit));
    for _ in 0..CAS_ATTEMPTS {
        let keep = a.label();
        a.push(Insn::load_dw(Reg::R0, Reg::R7, 0));
        a.push(Insn::mov(Reg::R3, Reg::R0));
        a.push(Insn::mov(Reg::R9, Reg::R0));
        a.jump(JMP_JGE, Reg::R9, Reg::R8, keep);
        a.push(Insn::mov(Reg::R9, Reg::R8));
        a.bind(keep);
        a.push(Insn::add_imm(Reg::R9, interval));
        a.push(Insn::mov(Reg::R1, Reg::R9));
        a.push(Insn::sub(Reg::R1, Reg::R8));
        a.jump(JMP_JGT, Reg::R1, Reg::R6, refuse);
        a.push(Insn::cmpxchg_dw(Reg::R7, Reg::R9, 0));
        a.jump(JMP_JEQ, Reg::R0, Reg::R3, allow);
    }
    a.bind(refuse);
    a.push(Insn::mov_imm(Reg::R0, 0));
    a.push(Insn::exit());
    a.bind(allow);
    a.push(Insn::mov_imm(Reg::R0, 1));
    a.push(Insn::exit());
    a.finish()
}

// === bpf(2) ===

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Default)]
struct GetFdByIdAttr {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The head of `struct bpf_prog_info`, up to the name.
#[repr(C)]
#[derive(Default)]
struct ProgInfo {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
}

/// `bpf(cmd, attr, sizeof attr)`. Every attr type above is `repr(C)` with explicit padding, so
/// no byte the kernel reads is uninitialised.
fn bpf<T>(cmd: u32, attr: &mut T) -> Result<i64, Errno> {
    // SAFETY: `attr` is a live, fully initialised `repr(C)` prefix of `union bpf_attr` of exactly
    // `size_of::<T>()` bytes; the buffers its pointer fields name are borrowed by the caller for
    // the duration of the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            libc::c_long::from(cmd as i32),
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_long,
        )
    };
    if r < 0 {
        Err(Errno::last())
    } else {
        Ok(r)
    }
}

/// `bpf` for a command that returns a new fd.
fn bpf_fd<T>(cmd: u32, attr: &mut T) -> Result<OwnedFd, Errno> {
    let fd = bpf(cmd, attr)?;
    let fd = i32::try_from(fd).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel just returned this fd for us to own; nothing else holds it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn name16(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    let n = name.len().min(15);
    out[..n].copy_from_slice(&name.as_bytes()[..n]);
    out
}

fn fd_u32(fd: BorrowedFd<'_>) -> u32 {
    fd.as_raw_fd() as u32
}

/// Loads a program; a rejected load is retried with a verifier log to report the reason.
fn load_program(name: &'static str, hook: Hook, insns: &[Insn]) -> Result<OwnedFd, BpfError> {
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
        insn_cnt: u32::try_from(insns.len())
            .map_err(|_| BpfError::Policy("program too long".into()))?,
        insns: insns.as_ptr() as u64,
        license: LICENSE.as_ptr() as u64,
        prog_name: name16(name),
        expected_attach_type: hook.attach_type(),
        ..Default::default()
    };
    let first = match bpf_fd(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => return Ok(fd),
        Err(e) => e,
    };
    let mut log = vec![0u8; LOG_SIZE];
    attr.log_level = 1;
    attr.log_size = LOG_SIZE as u32;
    attr.log_buf = log.as_mut_ptr() as u64;
    match bpf_fd(BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => Ok(fd),
        Err(errno) => {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            // The reason is at the end of the log.
            let tail: String = {
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(8)..].join(" | ")
            };
            let log = if tail.is_empty() {
                format!("(no log; first attempt: {first})")
            } else {
                tail
            };
            Err(BpfError::Load { name, errno, log })
        }
    }
}

fn prog_info(fd: BorrowedFd<'_>) -> Result<ProgInfo, BpfError> {
    let mut info = ProgInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: fd_u32(fd),
        info_len: std::mem::size_of::<ProgInfo>() as u32,
        info: &mut info as *mut ProgInfo as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map_err(|errno| BpfError::Sys {
        op: "BPF_OBJ_GET_INFO_BY_FD",
        errno,
    })?;
    Ok(info)
}

/// Ids of the programs attached directly (not inherited) to a cgroup for one hook.
fn query(dir: BorrowedFd<'_>, path: &Path, hook: Hook) -> Result<Vec<u32>, BpfError> {
    let mut ids = vec![0u32; MAX_PROGS];
    let mut attr = QueryAttr {
        target_fd: fd_u32(dir),
        attach_type: hook.attach_type(),
        prog_ids: ids.as_mut_ptr() as u64,
        prog_cnt: MAX_PROGS as u32,
        ..Default::default()
    };
    bpf(BPF_PROG_QUERY, &mut attr).map_err(|errno| BpfError::Cgroup {
        op: "BPF_PROG_QUERY",
        path: path.to_path_buf(),
        errno,
    })?;
    ids.truncate((attr.prog_cnt as usize).min(MAX_PROGS));
    Ok(ids)
}

fn attach_prog(dir: BorrowedFd<'_>, prog: BorrowedFd<'_>, hook: Hook) -> Result<(), Errno> {
    let mut attr = AttachAttr {
        target_fd: fd_u32(dir),
        attach_bpf_fd: fd_u32(prog),
        attach_type: hook.attach_type(),
        attach_flags: BPF_F_ALLOW_MULTI,
        ..Default::default()
    };
    bpf(BPF_PROG_ATTACH, &mut attr).map(drop)
}

/// Detaches one program; one that is not (or no longer) attached is released already.
fn detach_prog(dir: BorrowedFd<'_>, prog: BorrowedFd<'_>, hook: Hook) -> Result<(), Errno> {
    let mut attr = AttachAttr {
        target_fd: fd_u32(dir),
        attach_bpf_fd: fd_u32(prog),
        attach_type: hook.attach_type(),
        ..Default::default()
    };
    match bpf(BPF_PROG_DETACH, &mut attr) {
        Ok(_) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Opens a cgroup v2 directory (the handle every attach, query and detach goes through).
fn open_v2(path: &Path) -> Result<OwnedFd, BpfError> {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| BpfError::Cgroup {
        op: "open",
        path: path.to_path_buf(),
        errno,
    })?;
    // SAFETY: `open` just returned this fd; we are its only owner.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    match nix::sys::statfs::fstatfs(&fd) {
        Ok(s) if s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC => Ok(fd),
        Ok(_) => Err(BpfError::NotV2 {
            path: path.to_path_buf(),
        }),
        Err(errno) => Err(BpfError::Cgroup {
            op: "fstatfs",
            path: path.to_path_buf(),
            errno,
        }),
    }
}

// === impl ConnectLimiter ===

struct Prog {
    hook: Hook,
    fd: OwnedFd,
    id: u32,
}

/// The loaded programs, once per agent; attached to any number of cgroups.
pub struct ConnectLimiter {
    policy: Policy,
    progs: Vec<Prog>,
    /// The rate bucket: `BPF_MAP_TYPE_CGROUP_STORAGE` keyed by cgroup id alone, so each
    /// attached cgroup has one word shared by its connect4 and connect6 programs (Linux 5.9+),
    /// allocated on attach and freed on detach: bounded by the attachments, no eviction.
    bucket: Option<OwnedFd>,
}

impl std::fmt::Debug for ConnectLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectLimiter")
            .field("policy", &self.policy)
            .field("prog_ids", &self.prog_ids())
            .finish()
    }
}

/// One held cgroup: its directory handle (a cgroup recreated at the same path is not this one).
#[derive(Debug)]
#[must_use = "an attachment stays in the kernel until `detach`"]
pub struct Attachment {
    pub path: PathBuf,
    dir: OwnedFd,
}

impl Attachment {
    /// The cgroup id (the v2 directory's inode number), the key of its rate bucket.
    pub fn cgroup_id(&self) -> Result<u64, BpfError> {
        nix::sys::stat::fstat(self.dir.as_raw_fd())
            .map(|s| s.st_ino)
            .map_err(|errno| BpfError::Cgroup {
                op: "fstat",
                path: self.path.clone(),
                errno,
            })
    }
}

impl ConnectLimiter {
    pub fn load(policy: Policy) -> Result<ConnectLimiter, BpfError> {
        let rate = policy.rate_ns()?;
        let bucket = match rate {
            None => None,
            Some(_) => {
                let mut attr = MapCreateAttr {
                    map_type: BPF_MAP_TYPE_CGROUP_STORAGE,
                    key_size: 8,
                    value_size: 8,
                    map_name: name16("ng_bucket"),
                    ..Default::default()
                };
                Some(
                    bpf_fd(BPF_MAP_CREATE, &mut attr).map_err(|errno| BpfError::Sys {
                        op: "BPF_MAP_CREATE cgroup_storage",
                        errno,
                    })?,
                )
            }
        };
        let insns = match (rate, &bucket) {
            (Some((interval, limit)), Some(map)) => rate_program(map.as_raw_fd(), interval, limit)?,
            _ => refuse_program(),
        };
        let mut progs = Vec::with_capacity(Hook::ALL.len());
        for hook in Hook::ALL {
            let fd = load_program(hook.prog_name(), hook, &insns)?;
            let id = prog_info(fd.as_fd())?.id;
            progs.push(Prog { hook, fd, id });
        }
        Ok(ConnectLimiter {
            policy,
            progs,
            bucket,
        })
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The kernel ids of our programs (what `BPF_PROG_QUERY` lists).
    pub fn prog_ids(&self) -> Vec<u32> {
        self.progs.iter().map(|p| p.id).collect()
    }

    /// Attaches both programs to a cgroup v2 directory. Idempotent: a program already attached
    /// there stays (re-assert each tick by calling it again; the kernel refuses the same program
    /// twice with an EINVAL that says nothing, so the attachments are queried first). If the
    /// second attach fails, the first is undone, unless it was there before.
    pub fn attach(&self, cgroup_dir: &Path) -> Result<Attachment, BpfError> {
        let dir = open_v2(cgroup_dir)?;
        let mut new = Vec::new();
        for p in &self.progs {
            if query(dir.as_fd(), cgroup_dir, p.hook)?.contains(&p.id) {
                continue;
            }
            match attach_prog(dir.as_fd(), p.fd.as_fd(), p.hook) {
                Ok(()) => new.push(p),
                Err(errno) => {
                    for done in new {
                        if let Err(e) = detach_prog(dir.as_fd(), done.fd.as_fd(), done.hook) {
                            tracing::warn!(path = %cgroup_dir.display(), error = %e,
                                "limit_connections: undo of a partial attach failed");
                        }
                    }
                    return Err(BpfError::Cgroup {
                        op: "BPF_PROG_ATTACH",
                        path: cgroup_dir.to_path_buf(),
                        errno,
                    });
                }
            }
        }
        Ok(Attachment {
            path: cgroup_dir.to_path_buf(),
            dir,
        })
    }

    /// The release: detaches both programs (one already gone counts as released).
    pub fn detach(&self, a: Attachment) -> Result<(), BpfError> {
        let mut first = None;
        for p in &self.progs {
            if let Err(errno) = detach_prog(a.dir.as_fd(), p.fd.as_fd(), p.hook) {
                first.get_or_insert(BpfError::Cgroup {
                    op: "BPF_PROG_DETACH",
                    path: a.path.clone(),
                    errno,
                });
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Whether both of this limiter's programs are attached to the cgroup now (the tick's check
    /// that nobody detached them).
    pub fn is_attached(&self, a: &Attachment) -> Result<bool, BpfError> {
        for p in &self.progs {
            if !query(a.dir.as_fd(), &a.path, p.hook)?.contains(&p.id) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The bucket word of an attached cgroup under `Rate` (the theoretical arrival time in
    /// `CLOCK_MONOTONIC` ns; 0 before its first connect); `None` under `Refuse`.
    pub fn bucket(&self, a: &Attachment) -> Result<Option<u64>, BpfError> {
        let Some(map) = &self.bucket else {
            return Ok(None);
        };
        let key = a.cgroup_id()?;
        let mut value = 0u64;
        let mut attr = MapElemAttr {
            map_fd: fd_u32(map.as_fd()),
            key: &key as *const u64 as u64,
            value: &mut value as *mut u64 as u64,
            ..Default::default()
        };
        bpf(BPF_MAP_LOOKUP_ELEM, &mut attr).map_err(|errno| BpfError::Cgroup {
            op: "BPF_MAP_LOOKUP_ELEM",
            path: a.path.clone(),
            errno,
        })?;
        Ok(Some(value))
    }
}

/// Ids of the programs attached directly to a cgroup v2 directory for a hook (any owner).
pub fn attached_ids(cgroup_dir: &Path, hook: Hook) -> Result<Vec<u32>, BpfError> {
    let dir = open_v2(cgroup_dir)?;
    query(dir.as_fd(), cgroup_dir, hook)
}

/// Detaches every program named like ours (`ng_connect4`/`ng_connect6`, of the cgroup
/// sock_addr type) from a cgroup, whoever loaded it: the clean-up after a crashed agent, whose
/// attachments outlived it. Returns how many were detached.
pub fn detach_all_ours(cgroup_dir: &Path) -> Result<usize, BpfError> {
    let dir = open_v2(cgroup_dir)?;
    let mut n = 0;
    for hook in Hook::ALL {
        for id in query(dir.as_fd(), cgroup_dir, hook)? {
            let mut attr = GetFdByIdAttr {
                id,
                ..Default::default()
            };
            let prog = match bpf_fd(BPF_PROG_GET_FD_BY_ID, &mut attr) {
                Ok(fd) => fd,
                // Detached and freed since the query.
                Err(Errno::ENOENT) => continue,
                Err(errno) => {
                    return Err(BpfError::Sys {
                        op: "BPF_PROG_GET_FD_BY_ID",
                        errno,
                    })
                }
            };
            let info = prog_info(prog.as_fd())?;
            if info.prog_type != BPF_PROG_TYPE_CGROUP_SOCK_ADDR
                || info.name != name16(hook.prog_name())
            {
                continue;
            }
            detach_prog(dir.as_fd(), prog.as_fd(), hook).map_err(|errno| BpfError::Cgroup {
                op: "BPF_PROG_DETACH",
                path: cgroup_dir.to_path_buf(),
                errno,
            })?;
            n += 1;
        }
    }
    Ok(n)
}

/// Whether cgroup connect programs can be loaded here, with the reason if not (for
/// `nodeguard doctor`): `unified` is the cgroup v2 root, `None` where none is mounted.
pub fn available(unified: Option<&Path>) -> Result<(), String> {
    let Some(root) = unified else {
        return Err("no cgroup v2 tree mounted: cgroup BPF attaches to v2 directories only".into());
    };
    match nix::sys::statfs::statfs(root) {
        Ok(s) if s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC => {}
        Ok(_) => return Err(format!("{} is not a cgroup v2 mount", root.display())),
        Err(e) => return Err(format!("{}: {e}", root.display())),
    }
    match load_program("ng_probe", Hook::Connect4, &refuse_program()) {
        Ok(_) => Ok(()),
        Err(BpfError::Load { errno, .. }) => Err(match errno {
            Errno::ENOSYS => "kernel without bpf(2) (CONFIG_BPF_SYSCALL)".into(),
            Errno::EPERM | Errno::EACCES => {
                "no CAP_BPF or CAP_SYS_ADMIN (or bpf(2) is blocked by seccomp or LSM)".into()
            }
            Errno::EINVAL => {
                "kernel lacks cgroup sock_addr programs (CONFIG_CGROUP_BPF, Linux 4.17+)".into()
            }
            e => format!("bpf(BPF_PROG_LOAD) of a cgroup/connect4 program: {e}"),
        }),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(i: &[Insn]) -> Vec<u8> {
        // SAFETY: `Insn` is `repr(C)`, 8 bytes with no padding; the slice is live.
        unsafe { std::slice::from_raw_parts(i.as_ptr() as *const u8, std::mem::size_of_val(i)) }
            .to_vec()
    }

    #[test]
    fn insn_is_eight_bytes() {
        assert_eq!(std::mem::size_of::<Insn>(), 8);
        assert_eq!(std::mem::size_of::<ProgLoadAttr>(), 72);
        assert_eq!(std::mem::size_of::<MapCreateAttr>(), 44);
        assert_eq!(std::mem::size_of::<QueryAttr>(), 32);
        assert_eq!(std::mem::size_of::<ProgInfo>(), 80);
        assert_eq!(std::mem::size_of::<MapElemAttr>(), 32);
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn encodings_match_the_kernel_s() {
        // What `bpftool prog dump xlated opcodes` shows for the same instructions.
        assert_eq!(
            bytes(&refuse_program()),
            [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(&[Insn::mov(Reg::R7, Reg::R0)]),
            [0xbf, 0x07, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(&[Insn::load_dw(Reg::R0, Reg::R7, 8)]),
            [0x79, 0x70, 8, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(&[Insn::add_imm(Reg::R9, 500)]),
            [0x07, 0x09, 0, 0, 0xf4, 0x01, 0, 0]
        );
        assert_eq!(
            bytes(&[Insn::sub(Reg::R1, Reg::R8)]),
            [0x1f, 0x81, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(&[Insn::cmpxchg_dw(Reg::R7, Reg::R9, 0)]),
            [0xdb, 0x97, 0, 0, 0xf1, 0, 0, 0]
        );
        assert_eq!(
            bytes(&[Insn::jump(JMP_JGT, Reg::R1, Reg::R6, -3)]),
            [0x2d, 0x61, 0xfd, 0xff, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(&[Insn::call(HELPER_KTIME_GET_NS)]),
            [0x85, 0, 0, 0, 5, 0, 0, 0]
        );
        assert_eq!(
            bytes(&Insn::ld_map_fd(Reg::R1, 7)),
            [0x18, 0x11, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            bytes(&Insn::ld_imm64(Reg::R6, 0x1_0000_0002)),
            [0x18, 0x06, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]
        );
    }

    #[test]
    fn every_rate_jump_lands_inside_and_forward() {
        let p = rate_program(3, 500_000_000, 1_500_000_000).expect("assembles");
        let exits: Vec<usize> = (0..p.len()).filter(|&i| p[i] == Insn::exit()).collect();
        assert_eq!(exits.len(), 2);
        let mut jumps = 0;
        for (i, insn) in p.iter().enumerate() {
            let op = insn.code & 0xf0;
            if insn.code & 0x07 == CLS_JMP && ![JMP_CALL, JMP_EXIT].contains(&op) {
                jumps += 1;
                let to = i as i64 + 1 + i64::from(insn.off);
                assert!(
                    to > i as i64 + 1 && (to as usize) < p.len(),
                    "jump {i} -> {to}"
                );
            }
        }
        assert_eq!(jumps, 3 * CAS_ATTEMPTS);
        // The last CAS falls through to refuse: `r0 = 0; exit`.
        assert_eq!(p[exits[0] - 1], Insn::mov_imm(Reg::R0, 0));
        assert_eq!(p[exits[1] - 1], Insn::mov_imm(Reg::R0, 1));
    }

    #[test]
    fn rate_policy_is_bounded() {
        let r = |per_second, burst| Policy::Rate { per_second, burst }.rate_ns();
        assert_eq!(r(2, 3).ok().flatten(), Some((500_000_000, 1_500_000_000)));
        assert!(r(0, 3).is_err());
        assert!(r(2, 0).is_err());
        assert!(r(1_000_001, 1).is_err());
        assert_eq!(Policy::Refuse.rate_ns().ok().flatten(), None);
    }

    #[test]
    fn names_fit_the_kernel_s_sixteen_bytes() {
        for h in Hook::ALL {
            assert!(h.prog_name().len() < 16);
            assert_eq!(name16(h.prog_name())[h.prog_name().len()], 0);
        }
    }

    /// The one kernel check here: a rejected program's error carries the verifier's reason.
    /// Root (or CI) only; elsewhere it cannot load anything and says so.
    #[test]
    fn a_rejected_load_carries_the_verifier_s_reason() {
        let ci = std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"));
        if !nix::unistd::geteuid().is_root() {
            assert!(!ci, "CI must run as root");
            eprintln!("SKIP: loading BPF needs root");
            return;
        }
        // `exit` with R0 never written.
        match load_program("ng_bad", Hook::Connect4, &[Insn::exit()]) {
            Err(BpfError::Load { errno, log, .. }) => {
                assert_eq!(errno, Errno::EACCES, "{log}");
                assert!(log.contains("R0 !read_ok"), "{log}");
            }
            other => panic!("expected a verifier rejection, got {other:?}"),
        }
    }
}
