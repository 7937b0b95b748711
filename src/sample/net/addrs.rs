//! Local unicast addresses of a network namespace, read from another namespace's view of procfs
//! (`/proc/<pid>/net/...`) so the agent never has to enter the pod's namespace.
//!
//! Both parsers are lenient: a line they do not understand is skipped, since a missing address only
//! degrades attribution while a hard error would drop the whole pod.

use std::net::{Ipv4Addr, Ipv6Addr};

/// Addresses of `/32 host LOCAL` leaves in `/proc/<pid>/net/fib_trie`, sorted and deduplicated
/// (the trie is printed once per table and `Main`/`Local` share it when no policy rules exist).
/// Loopback (127.0.0.0/8) is skipped; broadcast leaves are `BROADCAST`, not `LOCAL`, so never match.
pub fn parse_fib_trie_locals(text: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut leaf: Option<Ipv4Addr> = None;
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(addr) = t.strip_prefix("|-- ") {
            leaf = addr.trim().parse().ok();
        } else if t.starts_with('/') {
            // `/32 host LOCAL` and possibly a trailing `tos=N`; one leaf may list several prefixes.
            let mut f = t.split_ascii_whitespace();
            let (len, _scope, kind) = (f.next(), f.next(), f.next());
            if let (Some(ip), Some("/32"), Some("LOCAL")) = (leaf, len, kind) {
                if !ip.is_loopback() {
                    out.push(ip);
                }
            }
        } else {
            // A table header (`Main:`) or an inner node (`+-- 10.0.0.0/8 ...`) ends the leaf.
            leaf = None;
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// IFA_F_DADFAILED: duplicate address detection failed, the kernel will not use the address.
const IFA_F_DADFAILED: u8 = 0x08;

/// Addresses in `/proc/<pid>/net/if_inet6` (`addr ifindex plen scope flags name`, hex), sorted and
/// deduplicated, without loopback `::1`, link-local `fe80::/10` and DAD-failed addresses.
pub fn parse_if_inet6(text: &str) -> Vec<Ipv6Addr> {
    let mut out = Vec::new();
    for line in text.lines() {
        let mut f = line.split_ascii_whitespace();
        let (Some(hex), Some(flags)) = (f.next(), f.nth(3)) else {
            continue;
        };
        if hex.len() != 32 {
            continue;
        }
        let (Ok(bits), Ok(flags)) = (u128::from_str_radix(hex, 16), u8::from_str_radix(flags, 16))
        else {
            continue;
        };
        let ip = Ipv6Addr::from(bits);
        let link_local = ip.segments()[0] & 0xffc0 == 0xfe80;
        if ip.is_loopback() || link_local || flags & IFA_F_DADFAILED != 0 {
            continue;
        }
        out.push(ip);
    }
    out.sort_unstable();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured on Linux 6.18 in a netns with lo up and a veth holding 10.77.0.2/24 and
    // 10.77.1.5/32 (no policy rules, so Main and Local print the same trie).
    const FIB_TRIE: &str = "Main:
  +-- 0.0.0.0/1 2 0 2
     +-- 10.77.0.0/23 2 0 1
        +-- 10.77.0.0/30 2 0 2
           |-- 10.77.0.0
              /24 link UNICAST
           |-- 10.77.0.2
              /32 host LOCAL
        |-- 10.77.0.255
           /32 link BROADCAST
        |-- 10.77.1.5
           /32 host LOCAL
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
Local:
  +-- 0.0.0.0/1 2 0 2
     +-- 10.77.0.0/23 2 0 1
        +-- 10.77.0.0/30 2 0 2
           |-- 10.77.0.0
              /24 link UNICAST
           |-- 10.77.0.2
              /32 host LOCAL
        |-- 10.77.0.255
           /32 link BROADCAST
        |-- 10.77.1.5
           /32 host LOCAL
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
";

    // Same netns: veth with fd00:77::2/64 and its link-local address, plus lo.
    const IF_INET6: &str = "fe80000000000000345796fffe1e4eca 05 40 20 80     ngv1
00000000000000000000000000000001 01 80 10 80       lo
fd000077000000000000000000000002 05 40 00 80     ngv1
";

    #[test]
    fn fib_trie_real_sample() {
        assert_eq!(
            parse_fib_trie_locals(FIB_TRIE),
            vec![Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 1, 5)]
        );
    }

    #[test]
    fn fib_trie_multi_prefix_leaf_and_tos() {
        // A leaf that is both a subnet route and a local address; a prefix line with tos.
        let text = "Local:\n  +-- 10.0.0.0/8 2 0 2\n     |-- 10.0.0.1\n        /24 link UNICAST\n        /32 host LOCAL tos=4\n";
        assert_eq!(
            parse_fib_trie_locals(text),
            vec![Ipv4Addr::new(10, 0, 0, 1)]
        );
        // A prefix line right after an inner node belongs to no leaf.
        let orphan = "  +-- 10.0.0.0/8 2 0 2\n        /32 host LOCAL\n";
        assert!(parse_fib_trie_locals(orphan).is_empty());
    }

    #[test]
    fn fib_trie_never_panics() {
        for s in [
            "",
            "|-- ",
            "|-- x\n/32 host LOCAL",
            "/",
            "|-- 1.2.3.4\n/32",
            "\u{0}/32 host",
        ] {
            let _ = parse_fib_trie_locals(s);
        }
        assert!(parse_fib_trie_locals("|-- 1.2.3.4\n  /32\n").is_empty());
    }

    #[test]
    fn if_inet6_real_sample() {
        let want: Ipv6Addr = "fd00:77::2".parse().unwrap();
        assert_eq!(parse_if_inet6(IF_INET6), vec![want]);
    }

    #[test]
    fn if_inet6_skips_dadfailed_and_garbage() {
        let text = "20010db8000000000000000000000001 02 40 00 88 eth0
short 02 40 00 80 eth0
zz010db8000000000000000000000001 02 40 00 80 eth0
20010db8000000000000000000000002 02 40 00
20010db8000000000000000000000003 02 40 00 80 eth0
";
        let want: Ipv6Addr = "2001:db8::3".parse().unwrap();
        assert_eq!(parse_if_inet6(text), vec![want]);
    }
}
