//! Errors of the kernel readers. Every error carries the path it came from.

use std::io;
use std::path::{Path, PathBuf};

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

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("parsing {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
}

impl ReadError {
    pub fn io(path: &Path, source: io::Error) -> Self {
        ReadError::Io {
            path: path.to_path_buf(),
            source,
        }
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
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            ReadError::Io { path, .. } | ReadError::Parse { path, .. } => path,
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
