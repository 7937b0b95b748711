//! Errors of the kernel readers, one type for all of them. Every error carries the path it came
//! from: pure parsers return a [`ParseError`] (or a `ReadError` without a path), and the I/O
//! layer that knows the path attaches it ([`ReadError::parse`], [`ReadError::at`]).

use nix::errno::Errno;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Why a read failed, coarse enough to label the `kind` of `nodeguard_sampler_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    Io,
    Permission,
    Parse,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 3] = [ErrorKind::Io, ErrorKind::Permission, ErrorKind::Parse];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Io => "io",
            ErrorKind::Permission => "permission",
            ErrorKind::Parse => "parse",
        }
    }
}

/// Cloneable (the I/O error is shared) so an outcome a helper thread hands over keeps its error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: Arc<io::Error>,
    },
    #[error("parsing {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    /// A request to the kernel on `path` (a netlink dump, say) that failed as a whole; `op` names
    /// the step.
    #[error("{op} in {path}: {failure}")]
    Request {
        path: PathBuf,
        op: &'static str,
        failure: Failure,
    },
}

/// How a kernel request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The errno of a system call, or the one the kernel answered with (netlink `NLMSG_ERROR`).
    #[error("{0}")]
    Errno(Errno),
    /// The receive buffer overran on every attempt.
    #[error("receive buffer overrun, gave up after {restarts} restarts")]
    Overrun { restarts: u32 },
    #[error("not finished after {0:?}")]
    Timeout(Duration),
}

impl ReadError {
    pub fn io(path: &Path, source: io::Error) -> Self {
        ReadError::Io {
            path: path.to_path_buf(),
            source: Arc::new(source),
        }
    }

    pub fn request(path: &Path, op: &'static str, failure: Failure) -> Self {
        ReadError::Request {
            path: path.to_path_buf(),
            op,
            failure,
        }
    }

    /// Attaches `path` to an error made where it was not known (a pure parser's); a path already
    /// there is kept.
    pub fn at(mut self, at: &Path) -> Self {
        let (ReadError::Io { path, .. }
        | ReadError::Parse { path, .. }
        | ReadError::Request { path, .. }) = &mut self;
        if path.as_os_str().is_empty() {
            *path = at.to_path_buf();
        }
        self
    }

    pub fn parse(path: &Path, err: ParseError) -> Self {
        ReadError::Parse {
            path: path.to_path_buf(),
            reason: err.0,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            ReadError::Io { source, .. } if source.kind() == io::ErrorKind::PermissionDenied => {
                ErrorKind::Permission
            }
            ReadError::Io { .. } => ErrorKind::Io,
            ReadError::Parse { .. } => ErrorKind::Parse,
            ReadError::Request {
                failure: Failure::Errno(Errno::EPERM | Errno::EACCES),
                ..
            } => ErrorKind::Permission,
            ReadError::Request { .. } => ErrorKind::Io,
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            ReadError::Io { path, .. }
            | ReadError::Parse { path, .. }
            | ReadError::Request { path, .. } => path,
        }
    }
}

/// A pure parser's complaint; the I/O layer adds the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

impl ParseError {
    pub fn new(msg: impl Into<String>) -> Self {
        ParseError(msg.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_label_what_happened() {
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        assert_eq!(
            ReadError::io(Path::new("/a"), denied).kind(),
            ErrorKind::Permission
        );
        let gone = io::Error::from(io::ErrorKind::NotFound);
        assert_eq!(ReadError::io(Path::new("/a"), gone).kind(), ErrorKind::Io);
        let bad = ReadError::parse(Path::new("/a"), ParseError::new("x"));
        assert_eq!(bad.kind(), ErrorKind::Parse);
        for (failure, kind) in [
            (Failure::Errno(Errno::EPERM), ErrorKind::Permission),
            (Failure::Errno(Errno::EACCES), ErrorKind::Permission),
            (Failure::Errno(Errno::EINVAL), ErrorKind::Io),
            (Failure::Overrun { restarts: 3 }, ErrorKind::Io),
            (Failure::Timeout(Duration::from_secs(60)), ErrorKind::Io),
        ] {
            let e = ReadError::request(Path::new("/ns"), "dump", failure);
            assert_eq!(e.kind(), kind, "{e}");
        }
    }

    #[test]
    fn the_path_is_attached_once() {
        let e = ReadError::request(Path::new(""), "dump", Failure::Errno(Errno::EPERM));
        let e = e.at(Path::new("/run/netns/a")).at(Path::new("/other"));
        assert_eq!(e.path(), Path::new("/run/netns/a"));
        assert_eq!(
            e.to_string(),
            "dump in /run/netns/a: EPERM: Operation not permitted"
        );
        let e = ReadError::parse(Path::new(""), ParseError::new("short")).at(Path::new("/p"));
        assert_eq!(e.to_string(), "parsing /p: short");
    }
}
