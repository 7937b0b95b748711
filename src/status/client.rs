//! A one-request HTTP/1.1 GET over `std::net`: `nodeguard status` asks the local agent for
//! `/api/state` once (per `--watch` round); no async client is needed for that.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Largest `/api/state` body read (a 110-pod node answers about 1 MB).
pub const MAX_BODY: u64 = 64 << 20;
const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{url}: not an http://host:port address")]
    BadUrl { url: String },
    #[error("cannot reach the agent at {url}: {source}")]
    Unreachable {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the agent at {url} answered {status}")]
    Status { url: String, status: String },
    #[error("the agent at {url} sent a response that is not HTTP/1.1 with a body")]
    Malformed { url: String },
}

/// `http://host:port[/...]` or `host:port` -> the address and the host header.
pub fn parse_url(url: &str) -> Result<(SocketAddr, String), FetchError> {
    let bad = || FetchError::BadUrl {
        url: url.to_owned(),
    };
    let rest = url.strip_prefix("http://").unwrap_or(url);
    if rest.contains("://") {
        return Err(bad());
    }
    let host = rest.split('/').next().unwrap_or_default();
    let addr = host
        .to_socket_addrs()
        .map_err(|_| bad())?
        .next()
        .ok_or_else(bad)?;
    Ok((addr, host.to_owned()))
}

/// The body of a 200 answer to `GET path`.
pub fn get(url: &str, path: &str) -> Result<Vec<u8>, FetchError> {
    let (addr, host) = parse_url(url)?;
    let unreachable = |source| FetchError::Unreachable {
        url: url.to_owned(),
        source,
    };
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(unreachable)?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(unreachable)?;
    s.set_write_timeout(Some(TIMEOUT)).map_err(unreachable)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .map_err(unreachable)?;
    let mut buf = Vec::new();
    s.take(MAX_BODY)
        .read_to_end(&mut buf)
        .map_err(unreachable)?;
    let malformed = || FetchError::Malformed {
        url: url.to_owned(),
    };
    let end = memchr::memmem::find(&buf, b"\r\n\r\n").ok_or_else(malformed)?;
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| malformed())?;
    let status = head.lines().next().unwrap_or_default();
    let mut parts = status.splitn(3, ' ');
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(malformed());
    }
    if parts.next() != Some("200") {
        return Err(FetchError::Status {
            url: url.to_owned(),
            status: status.to_owned(),
        });
    }
    Ok(buf[end + 4..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let (a, h) = parse_url("http://127.0.0.1:9913/").unwrap();
        assert_eq!(
            (a.to_string().as_str(), h.as_str()),
            ("127.0.0.1:9913", "127.0.0.1:9913")
        );
        assert!(parse_url("127.0.0.1:1").is_ok());
        assert!(parse_url("https://127.0.0.1:1").is_err());
        assert!(parse_url("nowhere").is_err());
    }

    #[test]
    fn a_closed_port_is_unreachable() {
        // Bound then dropped: nothing listens there now.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = get(&format!("127.0.0.1:{port}"), "/api/state").unwrap_err();
        assert!(matches!(e, FetchError::Unreachable { .. }), "{e}");
    }
}
