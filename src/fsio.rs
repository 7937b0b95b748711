//! The thin I/O layer under the pure parsers: a vanished file is `Ok(None)` (churn), anything else
//! is an error that names the path.

use crate::error::{ParseError, ReadError};
use std::io::{self, Read};
use std::path::Path;

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
