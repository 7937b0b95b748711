//! `/proc/<pid>/fd` by hand: its path without formatting, whether `st_size` is the fd count
//! (Linux 6.2+), a socket's protocol from its `system.sockprotoname` xattr, and the error of a
//! directory the agent may not read.

use super::*;

/// The decimal digits of `n`, without allocating a `String`.
pub(super) fn itoa(n: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(16);
    let mut digits = [0u8; 10];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
    out
}

pub(super) fn push_error(
    dir: &Path,
    e: Errno,
    errors: &mut Vec<ReadError>,
    denied: &mut Option<String>,
) {
    let err = ReadError::io(dir, e.into());
    if err.kind() == crate::error::ErrorKind::Permission {
        *denied = Some(err.to_string());
    }
    errors.push(err);
}

pub(super) fn fd_dir(proc_root: &Path, pid: u32) -> PathBuf {
    let mut p = proc_root.to_path_buf();
    p.push(pid.to_string());
    p.push("fd");
    p
}

/// True when `st_size` of a procfs fd directory is its fd count (Linux 6.2+): checked on the
/// agent's own, which holds at least stdin..stderr. A fixture tree (not procfs) is walked in full.
pub(super) fn fd_count_in_size(proc_root: &Path) -> bool {
    let is_proc = nix::sys::statfs::statfs(proc_root)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC);
    is_proc && stat(&proc_root.join("self/fd")).is_ok_and(|st| st.st_size > 0)
}

/// The protocol of the socket behind `dir/name`, from its `system.sockprotoname` xattr; `None`
/// when it was closed in between.
pub(super) fn socket_proto(buf: &mut Vec<u8>, dir: &Path, name: &CStr) -> Option<Proto> {
    buf.clear();
    buf.extend_from_slice(dir.as_os_str().as_bytes());
    buf.push(b'/');
    buf.extend_from_slice(name.to_bytes());
    buf.push(0);
    let path = CStr::from_bytes_with_nul(buf).ok()?;
    let mut val = [0u8; 32];
    // SAFETY: both strings are NUL-terminated, the buffer is valid for its length.
    let n = unsafe {
        nix::libc::getxattr(
            path.as_ptr(),
            c"system.sockprotoname".as_ptr(),
            val.as_mut_ptr().cast(),
            val.len(),
        )
    };
    (n > 0).then(|| parse_proto_name(&val[..n as usize]))
}

/// `getxattrat(2)`, Linux 6.13+ (the same number on every architecture).
const SYS_GETXATTRAT: nix::libc::c_long = 464;

/// `struct xattr_args` of `getxattrat(2)`.
#[repr(C)]
struct XattrArgs {
    value: u64,
    size: u32,
    flags: u32,
}

/// As [`socket_proto`], the xattr read relative to the open fd directory `dfd`
/// (`getxattrat(2)`): no lookup of `/proc/<pid>/fd` from the root per new socket, which was
/// most of the call. On an error it asks [`socket_proto`] (same answer, by path); `*at` is
/// cleared when the kernel has no such call (before 6.13) or a seccomp filter refuses it.
pub(super) fn socket_proto_at(
    at: &mut bool,
    dfd: BorrowedFd<'_>,
    buf: &mut Vec<u8>,
    dir: &Path,
    name: &CStr,
) -> Option<Proto> {
    if *at {
        let mut val = [0u8; 32];
        let mut args = XattrArgs {
            value: val.as_mut_ptr() as u64,
            size: val.len() as u32,
            flags: 0,
        };
        // SAFETY: both strings are NUL-terminated; `args` points at a buffer valid for its
        // size and is passed with its own size.
        let n = unsafe {
            nix::libc::syscall(
                SYS_GETXATTRAT,
                dfd.as_raw_fd(),
                name.as_ptr(),
                0 as nix::libc::c_uint,
                c"system.sockprotoname".as_ptr(),
                &mut args as *mut XattrArgs,
                std::mem::size_of::<XattrArgs>(),
            )
        };
        if n > 0 {
            let n = usize::try_from(n).unwrap_or(0).min(val.len());
            return Some(parse_proto_name(&val[..n]));
        }
        // errno only means something after a failed call (an empty value is `n == 0`).
        if n < 0 && matches!(Errno::last(), Errno::ENOSYS | Errno::EPERM | Errno::EINVAL) {
            *at = false;
        }
    }
    socket_proto(buf, dir, name)
}
