//! Property tests of every parser the agent runs on text it does not control: none may panic
//! (release aborts on panic), and where a reference exists the parser must agree with it.
//!
//! Bounded and deterministic: a fixed seed and a fixed number of cases per target, so the suite
//! is reproducible; `PROPTEST_CASES=100000 PROPTEST_RNG_SEED=$RANDOM cargo test --test fuzz`
//! runs a longer, new search. A failure prints its minimal input: add it to the regressions
//! below (no failure-persistence files).

use nodeguard::action::state;
use nodeguard::cgroupfs::parse_procs;
use nodeguard::config::Config;
use nodeguard::discover::{kubelet, names};
use nodeguard::sample::logs::cri::{self, CriCounter, LineCounts, HEADER_CAP};
use nodeguard::sample::net::{addrs, conntrack, ctnetlink, inet, sockets, sockstat};
use nodeguard::sample::procs;
use nodeguard::sample::{kmsg, memory};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};

/// Cases per target unless `PROPTEST_CASES` says otherwise; seed fixed unless
/// `PROPTEST_RNG_SEED` says otherwise.
fn config(cases: u32) -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(0x6e6f_6465_6775_6172);
    }
    c.failure_persistence = None;
    c
}

/// Text made of the tokens a parser looks for, numbers, whitespace and arbitrary characters, so
/// that random input reaches past the first check.
fn text(tokens: &'static [&'static str], max: usize) -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => proptest::sample::select(tokens).prop_map(str::to_owned),
        2 => any::<u64>().prop_map(|n| n.to_string()),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => "[0-9a-fA-F]{1,20}",
        3 => proptest::sample::select(&[" ", "  ", "\t", "\n", "\n\n", ":", "-", "_", "."][..])
            .prop_map(str::to_owned),
        1 => any::<String>(),
    ];
    proptest::collection::vec(piece, 0..max).prop_map(|v| v.concat())
}

fn bytes(tokens: &'static [&'static str], max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => text(tokens, max).prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 0..max * 4),
    ]
}

// === cgroup files ===

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn memory_files(t in text(&["max", "anon", "file", "inactive_file", "oom_kill", "oom", "low", "high", "total_inactive_file", "under_oom"], 30)) {
        let _ = memory::parse_u64(&t);
        let _ = memory::parse_limit(&t);
        for key in ["inactive_file", "oom_kill", "total_inactive_file", "under_oom"] {
            let _ = memory::parse_keyed(&t, key);
        }
        let _ = memory::oom_events(&t);
    }

    #[test]
    fn kmsg_records(b in bytes(&["6,", "14,", ",-;", ";", "oom-kill:", "constraint=CONSTRAINT_MEMCG", ",oom_memcg=", ",global_oom", ",task_memcg=", ",task=", ",pid=", ",uid=", "/", "\\x", "\\x5c", "\n ", "/kubepods/burstable/pod1/"], 40)) {
        if let Some(h) = kmsg::parse_header(&b) {
            if let kmsg::Message::Oom(k) = kmsg::parse_message(h.facility, h.message) {
                // Whatever the text, the victim is an absolute path and the comm fits the kernel's.
                prop_assert!(k.task_memcg.starts_with('/'));
                prop_assert!(k.comm.len() <= 15);
            }
        }
        let _ = kmsg::parse_message(0, &b);
        let _ = kmsg::unescape(&b);
    }

    #[test]
    fn memory_keyed_finds_the_value(pairs in proptest::collection::vec(("[a-z_]{1,12}", any::<u64>()), 1..20), pick in any::<prop::sample::Index>()) {
        let text: String = pairs.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
        let (key, _) = &pairs[pick.index(pairs.len())];
        // The first line with that key wins.
        let want = pairs.iter().find(|(k, _)| k == key).map(|(_, v)| *v);
        prop_assert_eq!(memory::parse_keyed(&text, key).unwrap(), want);
        let n = pairs[0].1;
        prop_assert_eq!(memory::parse_u64(&format!("{n}\n")).unwrap(), n);
    }

    #[test]
    fn cgroup_procs(t in text(&["1", "42", "4294967295", "4294967296", "-1"], 40)) {
        let _ = parse_procs(&t);
    }

    #[test]
    fn cgroup_procs_reads_every_pid(pids in proptest::collection::vec(any::<u32>(), 0..50)) {
        let text: String = pids.iter().map(|p| format!("{p}\n")).collect();
        prop_assert_eq!(parse_procs(&text), pids);
    }
}

// === /proc/<pid> ===

/// A kernel-shaped stat line: comm of up to 16 bytes of anything but NUL, 52 fields.
fn stat_line() -> impl Strategy<Value = (Vec<u8>, procs::Stat)> {
    (
        any::<u32>(),
        proptest::collection::vec(1u8..=255, 0..16),
        proptest::sample::select(&['R', 'S', 'D', 'Z', 'T', 't', 'X', 'I'][..]),
        any::<u32>(),
        proptest::collection::vec(any::<u64>(), 4),
    )
        .prop_map(|(pid, comm, state, ppid, n)| {
            let mut fields: Vec<String> = (4..=52).map(|i| (i * 7).to_string()).collect();
            let at = |k: usize| k - 4;
            fields[at(4)] = ppid.to_string();
            fields[at(14)] = n[0].to_string();
            fields[at(15)] = n[1].to_string();
            fields[at(22)] = n[2].to_string();
            fields[at(24)] = n[3].to_string();
            let mut line = format!("{pid} (").into_bytes();
            line.extend_from_slice(&comm);
            line.extend_from_slice(format!(") {state} {}\n", fields.join(" ")).as_bytes());
            let want = procs::Stat {
                pid,
                comm: String::from_utf8_lossy(&comm).into_owned(),
                state,
                ppid,
                utime: n[0],
                stime: n[1],
                starttime: n[2],
                rss: n[3],
            };
            (line, want)
        })
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn proc_stat(b in bytes(&["(", ")", ") ", " (", "((", "))", "R", "Z", "S", "0::", "1", "-1"], 60)) {
        let _ = procs::parse_stat(&b);
        let _ = procs::parse_stat_fields(&b);
        let _ = procs::parse_unified_path(&String::from_utf8_lossy(&b));
    }

    #[test]
    fn proc_stat_reads_every_field((line, want) in stat_line()) {
        prop_assert_eq!(procs::parse_stat_fields(&line).unwrap(), want);
    }

    #[test]
    fn proc_stat_cut_anywhere((line, _) in stat_line(), cut in any::<prop::sample::Index>()) {
        let _ = procs::parse_stat_fields(&line[..cut.index(line.len() + 1)]);
    }
}

// === network namespaces ===

const SOCKSTAT: &str = "sockets: used 6\nTCP: inuse 3 orphan 0 tw 1 alloc 5 mem 233\nUDP: inuse 1 mem 0\nUDPLITE: inuse 0\nRAW: inuse 0\nFRAG: inuse 0 memory 0\n";
const SOCKSTAT6: &str =
    "TCP6: inuse 1\nUDP6: inuse 1\nUDPLITE6: inuse 0\nRAW6: inuse 0\nFRAG6: inuse 0 memory 0\n";
const CT_STAT: &str = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n0000001d  00000000 00000000 00000000 00000000 0000001e 00000000 00000000 00000000 00000000 00000000 00000000 00000000  00000000 00000000 00000000 00000000\n";

/// Real text with random bytes overwritten, inserted or cut.
fn mutated(seed: &'static str) -> impl Strategy<Value = String> {
    proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 0..8).prop_map(
        move |edits| {
            let mut b = seed.as_bytes().to_vec();
            for (at, byte, op) in edits {
                let i = at.index(b.len() + 1);
                match op {
                    0 if i < b.len() => b[i] = byte,
                    1 => b.insert(i, byte),
                    _ => b.truncate(i),
                }
            }
            String::from_utf8_lossy(&b).into_owned()
        },
    )
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn sockstat_files(t in prop_oneof![
        text(&["sockets:", "used", "TCP:", "UDP:", "TCP6:", "UDP6:", "inuse", "orphan", "tw", "alloc", "mem"], 40),
        mutated(SOCKSTAT),
        mutated(SOCKSTAT6),
    ]) {
        let _ = sockstat::parse_sockstat(&t);
        let _ = sockstat::parse_sockstat6(&t);
    }

    #[test]
    fn nf_conntrack_files(t in prop_oneof![
        text(&["entries", "searched", "found", "ffffffff", "0000001d"], 40),
        mutated(CT_STAT),
    ]) {
        let _ = conntrack::parse_stat_entries(&t);
        let _ = conntrack::parse_count(&t);
        let _ = conntrack::parse_max(&t);
    }

    #[test]
    fn net_tcp_tables(b in bytes(&["sl", "0:", "0100007F:1F90", "0A", "00000000:00000000", "00:00000000", "00000000", "25447", "\n   1: "], 60)) {
        let _ = inet::for_each_socket(&b, |_, _| {});
    }

    #[test]
    fn net_tcp_reads_every_line(socks in proptest::collection::vec((any::<u8>(), any::<u64>()), 0..40)) {
        let mut t = String::from("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n");
        for (i, (st, inode)) in socks.iter().enumerate() {
            t.push_str(&format!("{i:4}: 0100007F:1F90 00000000:0000 {st:02X} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1 000000006b991b81 100 0 0 10 0   \n"));
        }
        let mut got = Vec::new();
        inet::for_each_socket(t.as_bytes(), |i, s| got.push((s, i))).unwrap();
        prop_assert_eq!(got, socks);
    }

    #[test]
    fn addresses_and_links(t in text(&["|-- ", "/32 host LOCAL", "+-- ", "10.0.0.1", "127.0.0.1", "fe80", "00000000000000000000000000000001", "socket:[", "net:[", "]", "TCP", "UDPv6"], 40)) {
        let _ = addrs::parse_fib_trie_locals(&t);
        let _ = addrs::parse_if_inet6(&t);
        let _ = sockets::parse_socket_link(t.as_bytes());
        let _ = sockets::parse_netns_link(t.as_bytes());
        let _ = sockets::parse_proto_name(t.as_bytes());
    }

    #[test]
    fn socket_links_round_trip(inode in any::<u64>()) {
        prop_assert_eq!(sockets::parse_socket_link(format!("socket:[{inode}]").as_bytes()), Some(inode));
        prop_assert_eq!(sockets::parse_netns_link(format!("net:[{inode}]").as_bytes()), Some(inode));
    }
}

// === ctnetlink ===

fn nla(ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&((4 + payload.len()) as u16).to_ne_bytes());
    v.extend_from_slice(&ty.to_ne_bytes());
    v.extend_from_slice(payload);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}

fn nlmsg(ty: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
    v.extend_from_slice(&ty.to_ne_bytes());
    v.extend_from_slice(&2u16.to_ne_bytes());
    v.extend_from_slice(&7u32.to_ne_bytes());
    v.extend_from_slice(&4242u32.to_ne_bytes());
    v.extend_from_slice(payload);
    while v.len() % 4 != 0 {
        v.push(0);
    }
    v
}

const NESTED: u16 = 0x8000;
const CT_NEW: u16 = 1 << 8;

/// A random attribute tree using conntrack's attribute numbers, so parsing goes deep.
fn nla_tree() -> impl Strategy<Value = Vec<u8>> {
    let leaf = (0u16..6, proptest::collection::vec(any::<u8>(), 0..20))
        .prop_map(|(ty, payload)| nla(ty, &payload));
    leaf.prop_recursive(4, 64, 6, |inner| {
        (0u16..4, proptest::collection::vec(inner, 0..4))
            .prop_map(|(ty, kids)| nla(ty | NESTED, &kids.concat()))
    })
}

fn tuple(which: u16, src: [u8; 4], dst: [u8; 4], proto: u8) -> Vec<u8> {
    let ip = [nla(1, &src), nla(2, &dst)].concat();
    let pr = nla(1, &[proto]);
    nla(
        which | NESTED,
        &[nla(1 | NESTED, &ip), nla(2 | NESTED, &pr)].concat(),
    )
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn ctnetlink_random_bytes(b in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = ctnetlink::parse_messages(&b, |_| {});
    }

    #[test]
    fn ctnetlink_random_messages(
        msgs in proptest::collection::vec(
            (proptest::sample::select(&[1u16, 2, 3, 4, CT_NEW, CT_NEW | 1, 0x200][..]),
             proptest::collection::vec(nla_tree(), 0..4),
             any::<bool>()),
            0..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut buf = Vec::new();
        for (ty, attrs, family) in &msgs {
            let mut p = vec![if *family { 2 } else { 10 }, 0, 0, 0];
            p.extend(attrs.concat());
            buf.extend(nlmsg(*ty, &p));
        }
        let _ = ctnetlink::parse_messages(&buf, |_| {});
        let _ = ctnetlink::parse_messages(&buf[..cut.index(buf.len() + 1)], |_| {});
    }

    #[test]
    fn ctnetlink_reads_every_entry(entries in proptest::collection::vec((any::<[u8; 4]>(), any::<[u8; 4]>(), any::<u8>()), 0..20)) {
        let mut buf = Vec::new();
        for (s, d, proto) in &entries {
            let attrs = [tuple(1, *s, *d, *proto), tuple(2, *d, *s, *proto)].concat();
            buf.extend(nlmsg(CT_NEW, &[&[2u8, 0, 0, 0][..], &attrs].concat()));
        }
        buf.extend(nlmsg(3, &0u32.to_ne_bytes()));
        let mut got = Vec::new();
        let walk = ctnetlink::parse_messages(&buf, |t| got.push((t.src, t.dst, t.proto, t.reply_src))).unwrap();
        prop_assert_eq!(walk.entries, entries.len() as u64);
        let want: Vec<_> = entries.iter().map(|(s, d, p)| ((*s).into(), (*d).into(), *p, (*d).into())).collect();
        prop_assert_eq!(got, want);
    }
}

// === kubelet names ===

const ID: &str = "4f5c1b2a9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";

fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(
            &[
                "kubepods",
                "kubepods.slice",
                "burstable",
                "besteffort",
                "kubepods-burstable.slice",
                "kubepods-besteffort.slice",
                "kubepods-pod",
                "kubepods-burstable-pod",
                ".slice",
                ".scope",
                "cri-containerd-",
                "crio-",
                "crio-conmon-",
                "docker-",
                "pod",
                "",
            ][..]
        )
        .prop_map(str::to_owned),
        (
            proptest::sample::select(
                &[
                    "kubepods-burstable-pod",
                    "pod",
                    "cri-containerd-",
                    "docker-",
                    ""
                ][..]
            ),
            "[0-9a-f_-]{0,40}",
            proptest::sample::select(&["", ".slice", ".scope"][..]),
        )
            .prop_map(|(a, b, c)| format!("{a}{b}{c}")),
        Just(format!("cri-containerd-{ID}.scope")),
        any::<String>(),
    ]
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn kubelet_cgroup_names(parts in proptest::collection::vec(component(), 0..6)) {
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let _ = kubelet::kubepods_index(&parts);
        let _ = kubelet::parse(&parts);
        if let Some(i) = kubelet::kubepods_index(&parts) {
            let _ = kubelet::parse(&parts[i..]);
        }
    }

    #[test]
    fn pod_dirs_and_container_links(t in text(&["_", "-", ".log", "default", "web-5d9c7b8f6-x7kqp", "3f6c2a1e-8b4d", ID], 12)) {
        let _ = names::parse_pod_dir(&t);
        let _ = names::parse_container_link(&t);
    }

    #[test]
    fn pod_dirs_and_container_links_round_trip(
        ns in "[a-z0-9][a-z0-9-]{0,20}", pod in "[a-z0-9][a-z0-9.-]{0,30}",
        c in "[a-z0-9][a-z0-9-]{0,20}", uid in "[0-9a-f-]{1,36}", id in "[0-9a-f]{1,64}",
    ) {
        let dir = format!("{ns}_{pod}_{uid}");
        let (p, u) = names::parse_pod_dir(&dir).unwrap();
        prop_assert_eq!((p.namespace.as_str(), p.pod.as_str(), u), (ns.as_str(), pod.as_str(), uid.as_str()));
        let link = format!("{pod}_{ns}_{c}-{id}.log");
        let (n, i) = names::parse_container_link(&link).unwrap();
        prop_assert_eq!(
            (n.namespace.as_str(), n.pod.as_str(), n.container.as_str(), i),
            (ns.as_str(), pod.as_str(), c.as_str(), id.as_str())
        );
    }
}

// === CRI log lines ===

/// The CRI format as the docs state it, written for clarity (one byte at a time).
fn reference_line(line: &[u8]) -> Option<(bool, bool)> {
    let sp = line.iter().position(|b| *b == b' ')?;
    let ts = &line[..sp];
    let shape = ts.len() >= 20
        && ts[..4].iter().all(u8::is_ascii_digit)
        && ts[4] == b'-'
        && ts[7] == b'-'
        && (ts[10] == b'T' || ts[10] == b't');
    if !shape {
        return None;
    }
    let rest = &line[sp + 1..];
    let stderr = match rest.get(..6)? {
        b"stdout" => false,
        b"stderr" => true,
        _ => return None,
    };
    match rest.get(6..8)? {
        b" F" => Some((stderr, true)),
        b" P" => Some((stderr, false)),
        _ => None,
    }
}

fn reference_counts(data: &[u8]) -> LineCounts {
    let mut c = LineCounts::default();
    for line in data
        .split(|b| *b == b'\n')
        .take(data.iter().filter(|b| **b == b'\n').count())
    {
        match reference_line(&line[..line.len().min(HEADER_CAP)]) {
            Some((false, true)) => c.stdout += 1,
            Some((true, true)) => c.stderr += 1,
            Some((_, false)) => {}
            None => c.malformed += 1,
        }
    }
    c
}

fn cri_stream() -> impl Strategy<Value = Vec<u8>> {
    let header = proptest::sample::select(
        &[
            "2026-07-20T04:46:01.123456789Z stdout F ",
            "2026-07-20T04:46:01.12345678Z stderr F ",
            "2026-07-20T04:46:01Z stdout P ",
            "2026-07-20T04:46:01.1+05:30 stderr P ",
            "2026-07-20t04:46:01.123Z stdout F",
            "2026-07-20T04:46:01.123Z stdin F ",
            "2026-07-20 stdout F ",
            "2026-07-20T04:46:01.123456789Z stdout X ",
            "2026-07-20T04:46:01.123456789Z stdoutx F ",
            "2026-07-20T04:46:01.123456789Z stderr  ",
            "2026-07-20T04:46:01.123456789Z stderr",
            "20x6-07-20T04:46:01.123456789Z stdout F ",
            "{\"log\":\"x\"} ",
            "",
        ][..],
    );
    let content = prop_oneof![
        3 => "[ -~]{0,60}",
        1 => proptest::collection::vec(any::<u8>(), 0..200).prop_map(|v| String::from_utf8_lossy(&v).into_owned()),
        1 => (1usize..3000).prop_map(|n| "x".repeat(n)),
    ];
    proptest::collection::vec((header, content, any::<bool>()), 0..60).prop_map(|lines| {
        let mut out = Vec::new();
        for (h, c, nl) in lines {
            out.extend_from_slice(h.as_bytes());
            out.extend_from_slice(c.as_bytes());
            if nl {
                out.push(b'\n');
            }
        }
        out
    })
}

proptest! {
    #![proptest_config(config(1000))]

    #[test]
    fn cri_lines_match_the_reference(line in prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..80),
        cri_stream(),
    ]) {
        let line: Vec<u8> = line.into_iter().filter(|b| *b != b'\n').collect();
        let got = cri::parse_line(&line).ok().map(|l| (l.stream == cri::Stream::Stderr, l.full));
        prop_assert_eq!(got, reference_line(&line));
    }

    /// The counter's word-at-a-time fast path and its chunk carry-over against the byte-wise
    /// reference, on the same bytes cut at random points.
    #[test]
    fn cri_counter_chunked_matches_the_reference(data in cri_stream(), cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..12)) {
        let want = reference_counts(&data);
        prop_assert_eq!(CriCounter::new().feed(&data), want);
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(data.len() + 1)).collect();
        at.push(0);
        at.push(data.len());
        at.sort_unstable();
        let mut c = CriCounter::new();
        let mut got = LineCounts::default();
        for w in at.windows(2) {
            got.add(&c.feed(&data[w[0]..w[1]]));
        }
        prop_assert_eq!(got, want);
    }
}

// === config and state ===

proptest! {
    #![proptest_config(config(500))]

    #[test]
    fn config_loader(t in prop_oneof![
        text(&["listen:", "interval:", "guard:", "rules:", "samplers:", "paths:", "- ", "  ", "[", "]", "{", "}", ",", "&a ", "*a", "!tag ", "'", "\"", "#", "|", ">", "---", "5s", ".nan", ".inf", "400000000000y", "until_new_revision"], 60),
        mutated(nodeguard::config::DEFAULT_YAML),
    ]) {
        let _ = Config::from_yaml(&t);
    }

    #[test]
    fn state_loader(t in prop_oneof![
        text(&["{", "}", "[", "]", ",", ":", "\"version\"", "1", "\"breakers\"", "\"saved_at\"", "1e300", "-1e308", "NaN", "null", "\"hold_until\""], 60),
        mutated(STATE),
    ]) {
        let _ = state::parse(&t);
    }
}

const STATE: &str = r#"{"version":1,"saved_at":1700000000.5,"breakers":[{"id":{"namespace":"shop","owner":"web","container":"app"},"rule":"log-flood","action":"freeze","state":"open","pod":"web-1","revision":"5d9c","reason":"x","value":700.0,"threshold":599.0,"since":1700000000.0,"hold_until":1700000900.0,"probation_until":null,"hold_seconds":900.0,"trips":1,"acted":[{"cgroup":"/kubepods/x","inode":42}]}]}"#;

// === regressions: the concrete inputs of issue 9 ===

#[test]
fn regression_stat_text_that_panicked_procfs_core() {
    for t in [&b"(x) R 1"[..], b") (", b"1 (x)", b"1 x) R", b"(", b")"] {
        assert!(procs::parse_stat(t).is_err());
    }
}

#[test]
fn regression_overflowing_and_non_finite_config_values() {
    for (yaml, path) in [
        ("guard: {freeze_timeout: 400000000000y}", "guard.freeze_timeout"),
        ("guard: {max_hold: 400000000000y}", "guard.max_hold"),
        ("guard: {probation: 400000000000y}", "guard.probation"),
        ("guard: {cooldown: 400000000000y}", "guard.cooldown"),
        ("guard: {max_actions_per_10m: 4294967295}", "guard.max_actions_per_10m"),
        ("samplers: {conntrack: {dump_interval: 400000000000y}}", "samplers.conntrack.dump_interval"),
        ("samplers: {conntrack: {dump_trigger: .nan}}", "samplers.conntrack.dump_trigger"),
        ("interval: 400000000000y", "interval"),
        ("guard: {rules: [{name: a, signal: tcp_sockets, above: 1, action: freeze, hold: 400000000000y}]}", "guard.rules[0].hold"),
        ("guard: {rules: [{name: a, signal: tcp_sockets, above: .inf, action: report}]}", "guard.rules[0].above"),
        ("guard: {rules: [{name: a, signal: tcp_sockets, above: 1, clear_below: .nan, action: report}]}", "guard.rules[0].clear_below"),
        ("guard: {rules: [{name: a, signal: tcp_sockets, above: 1, for: 400000000000y, action: report}]}", "guard.rules[0].for"),
        ("guard: {rules: [{name: a, signal: tcp_sockets, above: 1, clear_for: 400000000000y, action: report}]}", "guard.rules[0].clear_for"),
        ("guard: {rules: [{name: a, signal: node_zombies, above: 1, contributor_floor: .nan, action: report}]}", "guard.rules[0].contributor_floor"),
        ("guard: {rules: [{name: a, restart_loop: {burst_restarts: 3, burst_window: 400000000000y, bursts: 3, window: 400000000000y}, action: report}]}", "guard.rules[0].restart_loop.burst_window"),
    ] {
        let errs = Config::from_yaml(yaml).expect_err(yaml).0;
        assert!(errs.iter().any(|e| e.path == path), "{yaml}: {errs:?}");
    }
}

#[test]
fn regression_deep_nesting_is_rejected_at_once() {
    for t in ["[".repeat(100_000), "{a: ".repeat(25_000)] {
        let errs = Config::from_yaml(&t).unwrap_err().0;
        assert_eq!(errs[0].path, "(document)");
    }
}
