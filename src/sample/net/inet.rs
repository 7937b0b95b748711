//! `/proc/<pid>/net/{tcp,tcp6,udp,udp6}`: one line per socket of the whole network namespace.
//!
//! Only the state (column 4, hex) and inode (column 10, decimal) are extracted, without allocating:
//! a busy node's table has tens of thousands of lines and is re-read every tick.

use crate::error::ParseError;

/// Calls `f(inode, state)` for every socket line of a tcp/udp table. The header line (first token
/// `sl`) and blank lines are skipped; trailing padding spaces are tolerated. Inode 0 (TIME_WAIT,
/// orphans: no owning file) is passed through so the caller can count those separately.
pub fn for_each_socket(text: &[u8], mut f: impl FnMut(u64, u8)) -> Result<(), ParseError> {
    let mut start = 0usize;
    let mut lineno = 0usize;
    while start < text.len() {
        // memchr finds line ends with SIMD; only the first 10 columns of a line are tokenized.
        let end = memchr::memchr(b'\n', &text[start..]).map_or(text.len(), |i| start + i);
        let line = &text[start..end];
        start = end + 1;
        lineno += 1;
        let mut tokens = Tokens { rest: line };
        let Some(first) = tokens.next() else {
            continue;
        };
        if first == b"sl" {
            continue;
        }
        // Columns after `sl`: local, remote, st, tx:rx, tr:when, retrnsmt, uid, timeout, inode.
        let state = tokens.nth(2);
        let inode = tokens.nth(5);
        let (Some(state), Some(inode)) = (state, inode) else {
            return Err(ParseError::new(format!(
                "line {lineno}: fewer than 10 columns"
            )));
        };
        let state = parse_hex_u8(state).ok_or_else(|| {
            ParseError::new(format!(
                "line {lineno}: bad state {:?}",
                String::from_utf8_lossy(state)
            ))
        })?;
        let inode = parse_dec_u64(inode).ok_or_else(|| {
            ParseError::new(format!(
                "line {lineno}: bad inode {:?}",
                String::from_utf8_lossy(inode)
            ))
        })?;
        f(inode, state);
    }
    Ok(())
}

/// Space/tab-separated tokens of one line, without allocating.
struct Tokens<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let is_space = |b: &u8| b.is_ascii_whitespace();
        let begin = self.rest.iter().position(|b| !is_space(b))?;
        let rest = &self.rest[begin..];
        let len = rest.iter().position(is_space).unwrap_or(rest.len());
        self.rest = &rest[len..];
        Some(&rest[..len])
    }
}

fn parse_hex_u8(s: &[u8]) -> Option<u8> {
    if s.is_empty() || s.len() > 2 {
        return None;
    }
    s.iter().try_fold(0u8, |acc, &b| {
        let d = (b as char).to_digit(16)?;
        Some(acc << 4 | d as u8)
    })
}

fn parse_dec_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |acc, &b| {
        if !b.is_ascii_digit() {
            return None;
        }
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// Name of a kernel TCP state number (`include/net/tcp_states.h`), "unknown" for others.
pub fn tcp_state_name(state: u8) -> &'static str {
    match state {
        1 => "established",
        2 => "syn_sent",
        3 => "syn_recv",
        4 => "fin_wait1",
        5 => "fin_wait2",
        6 => "time_wait",
        7 => "close",
        8 => "close_wait",
        9 => "last_ack",
        10 => "listen",
        11 => "closing",
        12 => "new_syn_recv",
        13 => "bound_inactive",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured in a netns on Linux 6.18 (trailing spaces kept): listener, both ends of an
    // established connection, one TIME_WAIT.
    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode                                                     
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 25447 1 000000006b991b81 100 0 0 10 0                     
   1: 0100007F:1F90 0100007F:A706 01 00000000:00000000 00:00000000 00000000     0        0 25449 1 0000000024996da1 20 0 0 10 -1                     
   2: 0100007F:A706 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 25448 2 0000000087526fc6 20 0 0 10 -1                     
   3: 0100007F:A712 0100007F:1F90 06 00000000:00000000 03:00001751 00000000     0        0 0 3 00000000406c8ad6                                      
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:2382 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 25452 1 000000001cf9d45a 100 0 0 10 0
";
    const UDP: &str = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops            
 5975: 02004D0A:14E9 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 25453 2 0000000055c0c99f 0         
";
    const UDP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
 5975: 770000FD000000000000000002000000:14E9 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 25454 2 000000000b5b7c79 0
";

    fn collect(text: &str) -> Vec<(u64, u8)> {
        let mut v = Vec::new();
        for_each_socket(text.as_bytes(), |i, s| v.push((i, s))).unwrap();
        v
    }

    #[test]
    fn parses_real_tables() {
        assert_eq!(
            collect(TCP),
            vec![(25447, 10), (25449, 1), (25448, 1), (0, 6)]
        );
        assert_eq!(collect(TCP6), vec![(25452, 10)]);
        assert_eq!(collect(UDP), vec![(25453, 7)]);
        assert_eq!(collect(UDP6), vec![(25454, 7)]);
        assert_eq!(tcp_state_name(10), "listen");
        assert_eq!(tcp_state_name(6), "time_wait");
        assert_eq!(tcp_state_name(12), "new_syn_recv");
        assert_eq!(tcp_state_name(0), "unknown");
    }

    #[test]
    fn header_only_and_empty_are_fine() {
        assert!(collect("").is_empty());
        assert!(collect(TCP.lines().next().unwrap()).is_empty());
        assert!(collect("\n\n  \n").is_empty());
    }

    #[test]
    fn malformed_lines_are_errors() {
        let short = "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000\n";
        assert!(for_each_socket(short.as_bytes(), |_, _| {}).is_err());
        let bad_state = TCP.replace(" 0A ", " ZZ ");
        assert!(for_each_socket(bad_state.as_bytes(), |_, _| {}).is_err());
        let bad_inode = TCP.replace(" 25447 ", " 25x47 ");
        assert!(for_each_socket(bad_inode.as_bytes(), |_, _| {}).is_err());
        let overflow = TCP.replace(" 25447 ", " 99999999999999999999999 ");
        assert!(for_each_socket(overflow.as_bytes(), |_, _| {}).is_err());
    }

    #[test]
    fn never_panics_on_arbitrary_bytes() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let alphabet = b" 0A:\n\x00\xffsl1";
                    alphabet[(seed % alphabet.len() as u64) as usize]
                })
                .collect();
            let _ = for_each_socket(&bytes, |_, _| {});
        }
    }

    /// Cost is measured in benches/parsers.rs, never asserted here; this checks the count.
    #[test]
    fn thirty_thousand_lines_are_all_visited() {
        let row = TCP.lines().nth(2).unwrap();
        let mut text = String::from(TCP.lines().next().unwrap());
        text.push('\n');
        for _ in 0..30_000 {
            text.push_str(row);
            text.push('\n');
        }
        let mut n = 0u32;
        for_each_socket(text.as_bytes(), |_, _| n += 1).unwrap();
        assert_eq!(n, 30_000);
    }
}
