//! The thin I/O layer under the pure parsers: a vanished file is `Ok(None)` (churn), anything else
//! is an error that names the path.

use crate::error::{ParseError, ReadError};
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstatat, Mode};
use std::borrow::Cow;
use std::ffi::{CStr, OsStr};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

/// True for errors that mean "the object went away", which is normal churn for pids and cgroups.
pub fn is_gone(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc_enoent) if libc_enoent == nix::libc::ENOENT || libc_enoent == nix::libc::ESRCH || libc_enoent == nix::libc::ENODEV)
        || err.kind() == io::ErrorKind::NotFound
}

/// Reads a small kernel file. `Ok(None)` when it (or its directory) does not exist.
pub fn read_optional(path: &Path) -> Result<Option<String>, ReadError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if is_gone(&e) => Ok(None),
        Err(e) => Err(ReadError::io(path, e)),
    }
}

/// Reads a small file into a caller-owned buffer, avoiding an allocation per pid on hot loops.
pub fn read_into(path: &Path, buf: &mut Vec<u8>) -> Result<bool, ReadError> {
    buf.clear();
    match std::fs::File::open(path).and_then(|mut f| f.read_to_end(buf)) {
        Ok(_) => Ok(true),
        Err(e) if is_gone(&e) => Ok(false),
        Err(e) => Err(ReadError::io(path, e)),
    }
}

/// Reads and parses an optional file, attaching the path to a parse failure.
pub fn parse_optional<T>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, ParseError>,
) -> Result<Option<T>, ReadError> {
    match read_optional(path)? {
        Some(text) => parse(&text)
            .map(Some)
            .map_err(|e| ReadError::parse(path, e)),
        None => Ok(None),
    }
}

// === Regular files only: a FIFO, socket or device put where a file belongs never blocks ===

/// What a path that should have been a regular file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotRegular {
    Dir,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
    Symlink,
    Unknown,
}

impl NotRegular {
    fn of_mode(mode: nix::libc::mode_t) -> Option<NotRegular> {
        use nix::libc as c;
        Some(match mode & c::S_IFMT {
            c::S_IFREG => return None,
            c::S_IFDIR => NotRegular::Dir,
            c::S_IFIFO => NotRegular::Fifo,
            c::S_IFSOCK => NotRegular::Socket,
            c::S_IFCHR => NotRegular::CharDevice,
            c::S_IFBLK => NotRegular::BlockDevice,
            c::S_IFLNK => NotRegular::Symlink,
            _ => NotRegular::Unknown,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NotRegular::Dir => "directory",
            NotRegular::Fifo => "fifo",
            NotRegular::Socket => "socket",
            NotRegular::CharDevice => "character device",
            NotRegular::BlockDevice => "block device",
            NotRegular::Symlink => "symlink",
            NotRegular::Unknown => "unknown file type",
        }
    }
}

impl std::fmt::Display for NotRegular {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a file that must be a regular file could not be read; every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum RegularFileError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {}: not a regular file ({kind})", path.display())]
    NotRegular { path: PathBuf, kind: NotRegular },
    #[error("cannot read {}: more than the {max}-byte limit", path.display())]
    TooLarge { path: PathBuf, max: u64 },
    #[error("cannot read {}: not UTF-8 text", path.display())]
    NotUtf8 { path: PathBuf },
}

impl RegularFileError {
    fn io(path: &Path, source: io::Error) -> Self {
        RegularFileError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// The file (or its directory) does not exist: for an optional file, "none yet".
    pub(crate) fn is_gone(&self) -> bool {
        matches!(self, RegularFileError::Io { source, .. } if is_gone(source))
    }

    /// The path was refused for holding a symlink ([`open_regular_beneath`] only).
    pub(crate) fn is_refused_link(&self) -> bool {
        matches!(self, RegularFileError::Io { source, .. } if is_refused_link(source))
    }
}

/// Who asked for a regular file: the `reader` label of
/// `nodeguard_files_not_regular_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// The config file (`--config`, at start, at each reload, and `check-config`).
    Config,
    /// `<N>.log` files of the pod log tree.
    Logs,
    /// The guard's state file and release requests.
    State,
}

impl Reader {
    pub const ALL: [Reader; 3] = [Reader::Config, Reader::Logs, Reader::State];

    pub fn as_str(self) -> &'static str {
        match self {
            Reader::Config => "config",
            Reader::Logs => "logs",
            Reader::State => "state",
        }
    }
}

/// Opens refused for not being a regular file, by [`Reader`], since the process started. One
/// process-wide count, so every caller is counted without wiring its own.
static NOT_REGULAR: [std::sync::atomic::AtomicU64; 3] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 3];

/// How many opens by `reader` were refused for not being a regular file.
pub fn not_regular_total(reader: Reader) -> u64 {
    NOT_REGULAR[reader as usize].load(Ordering::Relaxed)
}

/// Opens `path` for reading if, and only if, it is a regular file, following symlinks (a
/// Kubernetes ConfigMap file is a chain of them): `open(O_RDONLY | O_NONBLOCK | O_CLOEXEC)`,
/// then `fstat` on the descriptor. A FIFO, a device or a directory planted in its place is
/// refused at once with [`RegularFileError::NotRegular`] (counted for `reader`): without
/// `O_NONBLOCK`, `open` of a FIFO waits for a writer forever. A socket cannot be opened at all
/// (`ENXIO`); it is reported as not regular too. `O_NONBLOCK` changes nothing for reads of a
/// regular file. Use it for every file a user or a workload can replace.
pub(crate) fn open_regular(path: &Path, reader: Reader) -> Result<std::fs::File, RegularFileError> {
    let opened = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    );
    let fd = match opened {
        // SAFETY: a descriptor just returned by open(2), owned by nobody else.
        Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
        Err(Errno::ENXIO) => {
            // A socket (or a device without its driver): say what it is if stat can.
            let kind = nix::sys::stat::stat(path)
                .ok()
                .and_then(|st| NotRegular::of_mode(st.st_mode));
            return Err(match kind {
                Some(kind) => refused(path, kind, reader),
                None => RegularFileError::io(path, Errno::ENXIO.into()),
            });
        }
        Err(e) => return Err(RegularFileError::io(path, e.into())),
    };
    regular_only(fd, path, reader)
}

/// [`open_regular`] for `rel` below the directory `dir`, through [`open_beneath`]: no symlink
/// is followed at any component (`is_refused_link` on the error). `shown` is the path errors name.
pub(crate) fn open_regular_beneath(
    dir: BorrowedFd<'_>,
    rel: &Path,
    shown: &Path,
    reader: Reader,
) -> Result<std::fs::File, RegularFileError> {
    match open_beneath(dir, rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK) {
        Ok(fd) => regular_only(fd, shown, reader),
        Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) => {
            let kind = fstatat(Some(dir.as_raw_fd()), rel, AtFlags::AT_SYMLINK_NOFOLLOW)
                .ok()
                .and_then(|st| NotRegular::of_mode(st.st_mode));
            Err(match kind {
                Some(kind) => refused(shown, kind, reader),
                None => RegularFileError::io(shown, e),
            })
        }
        Err(e) => Err(RegularFileError::io(shown, e)),
    }
}

/// The whole of a regular file (see [`open_regular`]), at most `max_bytes`: a larger one is
/// [`RegularFileError::TooLarge`], found by reading one byte more, never by reading it whole
/// (it may grow between `fstat` and the read).
pub(crate) fn read_regular(
    path: &Path,
    max_bytes: u64,
    reader: Reader,
) -> Result<Vec<u8>, RegularFileError> {
    let file = open_regular(path, reader)?;
    let mut out = Vec::new();
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| RegularFileError::io(path, e))?;
    if out.len() as u64 > max_bytes {
        return Err(RegularFileError::TooLarge {
            path: path.to_path_buf(),
            max: max_bytes,
        });
    }
    Ok(out)
}

/// [`read_regular`] as UTF-8 text.
pub(crate) fn read_regular_text(
    path: &Path,
    max_bytes: u64,
    reader: Reader,
) -> Result<String, RegularFileError> {
    String::from_utf8(read_regular(path, max_bytes, reader)?).map_err(|_| {
        RegularFileError::NotUtf8 {
            path: path.to_path_buf(),
        }
    })
}

fn regular_only(
    fd: OwnedFd,
    path: &Path,
    reader: Reader,
) -> Result<std::fs::File, RegularFileError> {
    let st =
        nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| RegularFileError::io(path, e.into()))?;
    match NotRegular::of_mode(st.st_mode) {
        None => Ok(std::fs::File::from(fd)),
        Some(kind) => Err(refused(path, kind, reader)),
    }
}

fn refused(path: &Path, kind: NotRegular, reader: Reader) -> RegularFileError {
    NOT_REGULAR[reader as usize].fetch_add(1, Ordering::Relaxed);
    RegularFileError::NotRegular {
        path: path.to_path_buf(),
        kind,
    }
}

// === Rooted opening: nothing below a configured root is reached through a symlink ===

/// What a directory entry is, from `d_type` or, where the filesystem does not say, `fstatat`
/// without following a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Dir,
    File,
    Symlink,
    Other,
}

/// Opens a directory named by the configuration. Its own path may hold symlinks (the operator's
/// choice); what lies below it is reached with [`open_beneath`] only.
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let fd = nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // SAFETY: a descriptor just returned by open(2), owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The number of open descriptors of a process, from its `/proc/<pid>/fd`: one open, `fstat` and
/// close where procfs gives the count as the directory's size (Linux 6.2+), instead of listing
/// one entry per descriptor (the agent holds thousands on a big node; procfs builds a dentry for
/// each listed one). Either way the directory's own descriptor, open while it is read, is counted.
/// Elsewhere (older kernels, a fixture tree) the directory is listed.
pub fn count_fds(fd_dir: &Path) -> io::Result<u64> {
    let dir = open_dir(fd_dir)?;
    let sized = nix::sys::statfs::fstatfs(&dir)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC);
    if sized {
        let st = nix::sys::stat::fstat(dir.as_raw_fd())?;
        if st.st_size > 0 {
            return Ok(st.st_size as u64);
        }
    }
    let mut n = 0u64;
    list_into(dir, |_, _, _| n += 1)?;
    Ok(n)
}

const OPENAT2_UNKNOWN: u8 = 0;
const OPENAT2_YES: u8 = 1;
const OPENAT2_NO: u8 = 2;
static OPENAT2: AtomicU8 = AtomicU8::new(OPENAT2_UNKNOWN);

/// Opens `rel` (relative, without `..`) below the directory `dir`, following no symlink at any
/// component: `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` where the kernel has it (5.6+),
/// else `openat(O_NOFOLLOW)` one component at a time. A symlink gives `ELOOP`, whatever it
/// points to; `O_CLOEXEC` and `O_NOFOLLOW` are always added.
pub fn open_beneath(dir: BorrowedFd<'_>, rel: &Path, flags: OFlag) -> io::Result<OwnedFd> {
    let use_openat2 = OPENAT2.load(Ordering::Relaxed) != OPENAT2_NO;
    open_beneath_with(dir, rel, flags, use_openat2)
}

fn open_beneath_with(
    dir: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlag,
    use_openat2: bool,
) -> io::Result<OwnedFd> {
    let comps = plain_components(rel)?;
    let flags = flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
    if use_openat2 {
        let how = OpenHow::new().flags(flags).resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
        match nix::fcntl::openat2(dir.as_raw_fd(), rel, how) {
            Ok(fd) => {
                OPENAT2.store(OPENAT2_YES, Ordering::Relaxed);
                // SAFETY: a descriptor just returned by openat2(2), owned by nobody else.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            // Kernel before 5.6, or a seccomp profile that answers EPERM for unknown syscalls
            // (EPERM is never a read-only open's answer once openat2 has worked).
            Err(Errno::ENOSYS) => OPENAT2.store(OPENAT2_NO, Ordering::Relaxed),
            Err(Errno::EPERM) if OPENAT2.load(Ordering::Relaxed) == OPENAT2_UNKNOWN => {
                let fd = open_by_components(dir, &comps, flags)?;
                OPENAT2.store(OPENAT2_NO, Ordering::Relaxed);
                return Ok(fd);
            }
            // openat2 takes at most PATH_MAX; one component at a time has no such limit.
            Err(Errno::ENAMETOOLONG) => {}
            Err(e) => return Err(e.into()),
        }
    }
    open_by_components(dir, &comps, flags)
}

/// The fallback: each directory opened with `O_NOFOLLOW | O_DIRECTORY` relative to the previous
/// one, so no component can be a symlink and, without `..`, nothing leaves `dir`.
fn open_by_components(dir: BorrowedFd<'_>, comps: &[&OsStr], flags: OFlag) -> io::Result<OwnedFd> {
    let Some((last, parents)) = comps.split_last() else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    let mut held: Option<OwnedFd> = None;
    for c in parents {
        let at = held.as_ref().map_or(dir.as_raw_fd(), |fd| fd.as_raw_fd());
        let fd = nix::fcntl::openat(
            Some(at),
            *c,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| symlink_as_eloop(e, at, c))?;
        // SAFETY: a descriptor just returned by openat(2), owned by nobody else.
        held = Some(unsafe { OwnedFd::from_raw_fd(fd) });
    }
    let at = held.as_ref().map_or(dir.as_raw_fd(), |fd| fd.as_raw_fd());
    let fd = nix::fcntl::openat(Some(at), *last, flags, Mode::empty())
        .map_err(|e| symlink_as_eloop(e, at, last))?;
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `O_NOFOLLOW | O_DIRECTORY` on a symlink fails with `ENOTDIR`, not `ELOOP` as openat2 does:
/// look at the entry so that both paths report a symlink alike.
fn symlink_as_eloop(e: Errno, at: std::os::fd::RawFd, name: &OsStr) -> io::Error {
    if e == Errno::ENOTDIR {
        if let Ok(st) = fstatat(Some(at), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            if st.st_mode & nix::libc::S_IFMT == nix::libc::S_IFLNK {
                return Errno::ELOOP.into();
            }
        }
    }
    e.into()
}

/// The components of a relative path with no `..` and no root: anything else is `EINVAL`.
fn plain_components(rel: &Path) -> io::Result<Vec<&OsStr>> {
    let mut comps = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(name) => comps.push(name),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(io::Error::from(io::ErrorKind::InvalidInput));
            }
        }
    }
    if comps.is_empty() {
        comps.push(OsStr::new("."));
    }
    Ok(comps)
}

/// True when an open below a root was refused because the path holds a symlink (or would leave
/// the root): the entry is skipped, not an error.
pub fn is_refused_link(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(e) if e == nix::libc::ELOOP || e == nix::libc::EXDEV)
}

/// Calls `f(name, kind, inode)` for each entry of the directory `dir` except `.` and `..`,
/// streaming: a directory of 100,000 entries costs no memory here.
pub fn for_each_entry(dir: BorrowedFd<'_>, f: impl FnMut(&[u8], EntryKind, u64)) -> io::Result<()> {
    // A second descriptor of the same directory: the listing moves its offset, not the caller's.
    let own = open_beneath(dir, Path::new("."), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
    list_into(own, f).map(drop)
}

/// A directory listed by [`list_into`], still open: entries below it are opened through it.
pub struct Listed(OwnedFd);

impl std::os::fd::AsFd for Listed {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// [`for_each_entry`] on a descriptor the caller gives up, without opening a second one (one
/// `openat` and `close` less per directory); the listed directory is returned open.
pub fn list_into(dir: OwnedFd, mut f: impl FnMut(&[u8], EntryKind, u64)) -> io::Result<Listed> {
    getdents(dir.as_fd(), |name, d_type, ino| {
        if let Some(kind) = entry_kind(dir.as_fd(), name, d_type) {
            f(name.to_bytes(), kind, ino);
        }
    })?;
    Ok(Listed(dir))
}

/// The kind of the entry `name` of `dir` from its `d_type`, asking `fstatat` (not following a
/// link) where the filesystem gives none. `None`: gone since the listing (churn).
pub fn entry_kind(dir: BorrowedFd<'_>, name: &CStr, d_type: u8) -> Option<EntryKind> {
    Some(match d_type {
        nix::libc::DT_DIR => EntryKind::Dir,
        nix::libc::DT_REG => EntryKind::File,
        nix::libc::DT_LNK => EntryKind::Symlink,
        nix::libc::DT_UNKNOWN => {
            let st = fstatat(Some(dir.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
            kind_of_mode(st.st_mode)
        }
        _ => EntryKind::Other,
    })
}

/// The `getdents64` buffer, one per thread, kept between listings: a glibc `DIR` stream
/// allocates 32 KiB per `opendir` and frees it at `closedir`, and those short-lived blocks,
/// hundreds per tick, left the heap fragmented (RSS grew with churn). 8 KiB is ~300 entries a
/// call; a larger directory takes more calls.
const DENTS_BUF: usize = 8 * 1024;

thread_local! {
    static DENTS: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Calls `f(name, d_type, inode)` for each entry of `dir` from its current offset to the end
/// but `.` and `..` (and entries with inode 0, as glibc's `readdir` skips them), with
/// `getdents64` (rustix's `RawDir`) into the thread's kept buffer. To list a held directory
/// again from the start, [`rewind`] it first. `f` may list other directories (it gets a buffer
/// of its own then).
pub fn getdents(dir: BorrowedFd<'_>, mut f: impl FnMut(&CStr, u8, u64)) -> io::Result<()> {
    let mut buf = DENTS.with(std::cell::Cell::take);
    buf.clear();
    buf.reserve(DENTS_BUF);
    let mut entries = rustix::fs::RawDir::new(dir, buf.spare_capacity_mut());
    let mut r = Ok(());
    while let Some(e) = entries.next() {
        match e {
            Ok(e) if e.ino() == 0 || matches!(e.file_name().to_bytes(), b"." | b"..") => {}
            Ok(e) => f(e.file_name(), d_type(e.file_type()), e.ino()),
            Err(e) => {
                r = Err(e.into());
                break;
            }
        }
    }
    DENTS.with(|b| b.set(buf));
    r
}

/// An entry's `d_type` as the `DT_*` constant the listings match on.
fn d_type(t: rustix::fs::FileType) -> u8 {
    use nix::libc as c;
    use rustix::fs::FileType as T;
    match t {
        T::RegularFile => c::DT_REG,
        T::Directory => c::DT_DIR,
        T::Symlink => c::DT_LNK,
        T::Fifo => c::DT_FIFO,
        T::Socket => c::DT_SOCK,
        T::CharacterDevice => c::DT_CHR,
        T::BlockDevice => c::DT_BLK,
        T::Unknown => c::DT_UNKNOWN,
    }
}

/// Moves a held directory's offset back to its start (`rewinddir`), to list it again.
pub fn rewind(dir: BorrowedFd<'_>) -> io::Result<()> {
    nix::unistd::lseek(dir.as_raw_fd(), 0, nix::unistd::Whence::SeekSet)?;
    Ok(())
}

fn kind_of_mode(mode: nix::libc::mode_t) -> EntryKind {
    match mode & nix::libc::S_IFMT {
        nix::libc::S_IFDIR => EntryKind::Dir,
        nix::libc::S_IFREG => EntryKind::File,
        nix::libc::S_IFLNK => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

// === Names from the filesystem as strings ===

/// A file name as a string, losslessly: valid UTF-8 is kept as it is (systemd's own `\x2d`
/// included), each byte of invalid UTF-8 becomes `\xNN` (lowercase, always >= 0x80), and a real
/// backslash is doubled only where it would otherwise read as such an escape or precede one.
/// [`unescape_name`] gives the bytes back, so a path built from the string opens the same file.
pub fn escape_name(raw: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(raw) {
        if !s.contains('\\') {
            return Cow::Borrowed(s);
        }
    }
    let mut out = String::with_capacity(raw.len() + 8);
    let mut i = 0;
    while i < raw.len() {
        let rest = &raw[i..];
        let valid = match std::str::from_utf8(rest) {
            Ok(s) => s,
            // The first `valid_up_to` bytes are UTF-8 by definition.
            Err(e) => std::str::from_utf8(&rest[..e.valid_up_to()]).unwrap_or_default(),
        };
        if valid.is_empty() {
            out.push_str(&format!("\\x{:02x}", rest[0]));
            i += 1;
            continue;
        }
        for (j, c) in valid.char_indices() {
            out.push(c);
            if c == '\\' && needs_doubling(&rest[j + 1..]) {
                out.push('\\');
            }
        }
        i += valid.len();
    }
    Cow::Owned(out)
}

/// After a real backslash: what follows would make it part of an escape when read back.
fn needs_doubling(next: &[u8]) -> bool {
    next.first() == Some(&b'\\')
        || (!next.is_empty() && !starts_valid(next))
        || hex_escape(next).is_some()
}

/// Whether `bytes` starts with a valid UTF-8 character (an invalid byte is escaped as `\xNN`).
fn starts_valid(bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(_) => true,
        Err(e) => e.valid_up_to() > 0,
    }
}

/// `xNN` with lowercase hex NN >= 0x80 at the start of `s`: the escape of one invalid byte.
fn hex_escape(s: &[u8]) -> Option<u8> {
    let [b'x', h, l, ..] = s else {
        return None;
    };
    let digit = |d: u8| match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        _ => None,
    };
    let v = digit(*h)? << 4 | digit(*l)?;
    (v >= 0x80).then_some(v)
}

/// The bytes of a name escaped by [`escape_name`].
pub fn unescape_name(s: &str) -> Cow<'_, [u8]> {
    if !s.contains('\\') {
        return Cow::Borrowed(s.as_bytes());
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' {
            if b.get(i + 1) == Some(&b'\\') {
                out.push(b'\\');
                i += 2;
                continue;
            }
            if let Some(v) = hex_escape(&b[i + 1..]) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStrExt;

    /// More entries than one buffer holds (several `getdents64` calls), listed again after a
    /// rewind on the same descriptor: the same set as `std::fs::read_dir`, each once.
    #[test]
    fn getdents_lists_what_read_dir_lists_across_buffers_and_after_a_rewind() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..700 {
            std::fs::write(dir.path().join(format!("{i:0>40}")), "").unwrap();
        }
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let mut want: Vec<Vec<u8>> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        want.sort();
        let fd = open_dir(dir.path()).unwrap();
        for _ in 0..2 {
            rewind(fd.as_fd()).unwrap();
            let mut got = Vec::new();
            let mut dirs = 0;
            getdents(fd.as_fd(), |name, d_type, ino| {
                assert_ne!(ino, 0);
                let name = name.to_bytes();
                assert!(!matches!(name, b"." | b".."));
                dirs += usize::from(d_type == nix::libc::DT_DIR);
                got.push(name.to_vec());
            })
            .unwrap();
            got.sort();
            assert_eq!(got, want);
            assert_eq!(dirs, 1);
        }
        let mut kinds = Vec::new();
        list_into(open_dir(dir.path()).unwrap(), |n, k, _| {
            if n == b"sub" {
                kinds.push(k);
            }
        })
        .unwrap();
        assert_eq!(kinds, vec![EntryKind::Dir]);
    }

    /// `f` on a helper thread, its answer awaited at most 10 s: a blocking open fails the test
    /// instead of hanging it.
    fn within_10s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("blocked: a non-regular file was opened blocking")
    }

    #[test]
    fn a_fifo_socket_device_or_directory_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::S_IRWXU).unwrap();
        let sock = dir.path().join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        // Through a symlink, as a ConfigMap mounts its files.
        std::os::unix::fs::symlink(&fifo, dir.path().join("link")).unwrap();
        let before = not_regular_total(Reader::State);
        for (name, want) in [
            ("fifo", NotRegular::Fifo),
            ("link", NotRegular::Fifo),
            ("sock", NotRegular::Socket),
            ("/dev/null", NotRegular::CharDevice),
            (".", NotRegular::Dir),
        ] {
            let path = dir.path().join(name);
            let shown = path.clone();
            let e = within_10s(move || read_regular(&shown, 100, Reader::State)).unwrap_err();
            assert!(
                matches!(&e, RegularFileError::NotRegular { kind, path: p } if *kind == want && *p == path),
                "{name}: {e:?}"
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "cannot read {}: not a regular file ({want})",
                    path.display()
                )
            );
        }
        // Other tests count too (one process-wide counter): at least these five.
        assert!(not_regular_total(Reader::State) >= before + 5);
        // The same below a directory, where the FIFO's name is a log's.
        let root = open_dir(dir.path()).unwrap();
        let e =
            open_regular_beneath(root.as_fd(), Path::new("fifo"), &fifo, Reader::Logs).unwrap_err();
        assert!(
            matches!(
                e,
                RegularFileError::NotRegular {
                    kind: NotRegular::Fifo,
                    ..
                }
            ),
            "{e:?}"
        );
        let e =
            open_regular_beneath(root.as_fd(), Path::new("link"), &fifo, Reader::Logs).unwrap_err();
        assert!(e.is_refused_link(), "{e:?}");
    }

    #[test]
    fn a_regular_file_is_read_whole_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, "0123456789").unwrap();
        std::os::unix::fs::symlink(&f, dir.path().join("link")).unwrap();
        assert_eq!(read_regular(&f, 10, Reader::Config).unwrap(), b"0123456789");
        assert_eq!(
            read_regular_text(&dir.path().join("link"), 10, Reader::Config).unwrap(),
            "0123456789"
        );
        let e = read_regular(&f, 9, Reader::Config).unwrap_err();
        assert!(
            matches!(e, RegularFileError::TooLarge { max: 9, .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("9-byte limit"), "{e}");
        let e = read_regular(&dir.path().join("none"), 9, Reader::Config).unwrap_err();
        assert!(
            e.is_gone() && e.to_string().starts_with("cannot read"),
            "{e}"
        );
        std::fs::write(&f, b"\xff").unwrap();
        let e = read_regular_text(&f, 9, Reader::Config).unwrap_err();
        assert!(matches!(e, RegularFileError::NotUtf8 { .. }), "{e:?}");
        // O_NONBLOCK does not leak into what the caller reads.
        let file = open_regular(&dir.path().join("link"), Reader::Config).unwrap();
        assert!(file.metadata().unwrap().is_file());
    }

    #[test]
    fn escaped_names_round_trip_and_keep_utf8() {
        for s in [
            "plain",
            "system-systemd\\x2dfsck.slice",
            "a\"b\nc",
            "\\",
            "é\\xC3",
        ] {
            assert_eq!(escape_name(s.as_bytes()), s, "valid UTF-8 is unchanged");
        }
        assert_eq!(escape_name(b"a\xffb"), "a\\xffb");
        // The real text `a\xff` and the byte 0xff after `a` must not meet in one string.
        assert_eq!(escape_name(b"a\\xff"), "a\\\\xff");
        assert_eq!(escape_name(b"\\\xff"), "\\\\\\xff");
        // Deterministic xorshift over short byte strings rich in `\`, `x`, hex and high bytes.
        let alphabet = b"\\xf8a0\xff\xc3\xa9\xe2\x82/ ";
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut seen = std::collections::HashMap::new();
        for _ in 0..200_000 {
            let len = (next() % 9) as usize;
            let raw: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let esc = escape_name(&raw).into_owned();
            assert_eq!(unescape_name(&esc), raw.as_slice(), "{raw:?} -> {esc:?}");
            if let Some(other) = seen.insert(esc.clone(), raw.clone()) {
                assert_eq!(other, raw, "two names escape to {esc:?}");
            }
        }
    }

    fn tree() -> (tempfile::TempDir, OwnedFd) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/f"), "in").unwrap();
        std::fs::write(dir.path().join("secret"), "out").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), root.join("a/abs")).unwrap();
        std::os::unix::fs::symlink("b/f", root.join("a/rel")).unwrap();
        std::os::unix::fs::symlink("/", root.join("up")).unwrap();
        let fd = open_dir(&root).unwrap();
        (dir, fd)
    }

    #[test]
    fn open_beneath_follows_no_symlink_with_or_without_openat2() {
        let (_dir, root) = tree();
        for use_openat2 in [true, false] {
            let open = |rel: &str, flags| {
                open_beneath_with(root.as_fd(), Path::new(rel), flags, use_openat2)
            };
            assert!(open("a/b/f", OFlag::O_RDONLY).is_ok());
            assert!(open("a/b", OFlag::O_RDONLY | OFlag::O_DIRECTORY).is_ok());
            for rel in ["a/abs", "a/rel", "up", "up/etc/passwd"] {
                let e = open(rel, OFlag::O_RDONLY).unwrap_err();
                assert!(is_refused_link(&e), "{rel} ({use_openat2}): {e}");
            }
            for rel in ["../root/a/b/f", "/etc/passwd", "a/../a/b/f"] {
                let e = open(rel, OFlag::O_RDONLY).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{rel}");
            }
        }
    }

    /// Sized (procfs) or listed (a fixture), the count is the listing's: on /proc both count
    /// the reading descriptor; other tests' threads open and close files, so retried until two
    /// readings agree.
    #[test]
    fn fd_count_is_the_listings() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["0", "1", "2"] {
            std::fs::write(dir.path().join(n), "").unwrap();
        }
        assert_eq!(count_fds(dir.path()).unwrap(), 3);
        let own = Path::new("/proc/self/fd");
        let agreed = (0..50).any(|_| {
            let listed = std::fs::read_dir(own).unwrap().count() as u64;
            count_fds(own).unwrap() == listed
        });
        assert!(agreed, "count_fds disagrees with a listing of {own:?}");
    }

    #[test]
    fn listing_reports_kinds_without_following() {
        let (dir, _) = tree();
        let a = open_dir(&dir.path().join("root/a")).unwrap();
        let mut got = Vec::new();
        for_each_entry(a.as_fd(), |name, kind, ino| {
            assert!(ino > 0);
            got.push((OsStr::from_bytes(name).to_owned(), kind));
        })
        .unwrap();
        got.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            got,
            [
                ("abs".into(), EntryKind::Symlink),
                ("b".into(), EntryKind::Dir),
                ("rel".into(), EntryKind::Symlink),
            ]
        );
    }
}

/// What holds descriptors between ticks, each bounded by its own cap and by its share of the
/// soft `RLIMIT_NOFILE`. One table, so the shares cannot add up to more than the limit: they sum
/// to 28/32, and an eighth always stays for the transient reads of a tick (`/proc`, cgroup and
/// netns files opened and closed) whatever the peers, the log trees and the cgroup tree do.
/// The agent raises its soft limit to the hard one at start (`cli.rs`): on a usual node
/// (524,288 or more) the holders' own caps bite first and these shares only guard low limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FdHolder {
    /// HTTP connections (`http.max_connections`).
    Http,
    /// Log files of the tailer.
    Logs,
    /// `/proc/<pid>/fd` directories of the socket pass.
    Sockets,
    /// cgroup memory files.
    Memory,
    /// Discovery's cgroup directories.
    Discovery,
    /// The process sampler's pids files and directories.
    Pids,
    /// Pod netns files (`nf_conntrack` stat, `sockstat`, `sockstat6`).
    Netns,
}

impl FdHolder {
    pub const ALL: [FdHolder; 7] = [
        FdHolder::Http,
        FdHolder::Logs,
        FdHolder::Sockets,
        FdHolder::Memory,
        FdHolder::Discovery,
        FdHolder::Pids,
        FdHolder::Netns,
    ];

    /// The share of the soft limit, in 32nds.
    pub const fn share_32nds(self) -> u64 {
        match self {
            FdHolder::Http => 8,
            FdHolder::Logs => 8,
            FdHolder::Sockets => 6,
            FdHolder::Memory => 3,
            FdHolder::Discovery => 1,
            FdHolder::Pids => 1,
            FdHolder::Netns => 1,
        }
    }

    /// This holder's descriptors under a soft limit of `soft` (`RLIM_INFINITY` is `u64::MAX`).
    pub fn of_limit(self, soft: u64) -> usize {
        let share = u128::from(soft) * u128::from(self.share_32nds()) / 32;
        usize::try_from(share).unwrap_or(usize::MAX)
    }

    /// `wanted`, at most this holder's share of the soft limit as it is now (1,024 assumed
    /// when it cannot be read).
    pub fn cap(self, wanted: usize) -> usize {
        use nix::sys::resource::{getrlimit, Resource};
        let soft = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
        wanted.min(self.of_limit(soft))
    }
}

#[cfg(test)]
mod fd_budget_tests {
    use super::FdHolder;

    #[test]
    fn the_shares_leave_an_eighth_of_any_limit() {
        let total: u64 = FdHolder::ALL.iter().map(|h| h.share_32nds()).sum();
        assert_eq!(total, 28);
        for soft in [64, 1024, 4096, 1_048_576] {
            let held: usize = FdHolder::ALL.iter().map(|h| h.of_limit(soft)).sum();
            assert!(held as u64 <= soft - soft / 8, "{soft}: {held}");
        }
        assert_eq!(FdHolder::Http.of_limit(1024), 256);
        assert_eq!(FdHolder::Logs.of_limit(1024), 256);
        assert_eq!(FdHolder::Sockets.of_limit(1024), 192);
        // RLIM_INFINITY: no overflow, no share to speak of.
        assert!(FdHolder::Pids.of_limit(u64::MAX) >= 1 << 40);
        assert_eq!(FdHolder::Memory.cap(0), 0);
    }
}
