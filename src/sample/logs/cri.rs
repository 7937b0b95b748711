//! The CRI container log format (containerd, CRI-O): `<RFC3339Nano> <stream> <tag> <content>\n`.
//! Pure parsing and a streaming line counter; no I/O here.

use crate::error::ParseError;
use memchr::memchr;

/// How many bytes of a line are looked at. The header (timestamp, stream, tag) needs about 45, so
/// this leaves room for longer timestamps and tags with extra fields; the content is never read.
pub const HEADER_CAP: usize = 128;

/// Completed lines by stream. `stdout` and `stderr` count logical lines (tag `F`), so a long line
/// that the runtime split into `P` pieces counts once.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LineCounts {
    pub stdout: u64,
    pub stderr: u64,
    pub malformed: u64,
}

impl LineCounts {
    /// Logical lines of both streams; malformed lines are not log lines the workload wrote.
    pub fn total(&self) -> u64 {
        self.stdout.saturating_add(self.stderr)
    }

    pub fn add(&mut self, other: &LineCounts) {
        // Saturating: these are monotonic counters fed for the life of the agent.
        self.stdout = self.stdout.saturating_add(other.stdout);
        self.stderr = self.stderr.saturating_add(other.stderr);
        self.malformed = self.malformed.saturating_add(other.malformed);
    }

    pub fn is_zero(&self) -> bool {
        *self == LineCounts::default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// The header of one CRI line. `full` is false for a `P` piece of a line split by the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CriLine {
    pub stream: Stream,
    pub full: bool,
}

/// Why a line is malformed, as a static reason so the hot counting path never allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Malformed {
    MissingFields,
    Timestamp,
    Stream,
    MissingTag,
    Tag,
}

impl Malformed {
    fn reason(self) -> &'static str {
        match self {
            Malformed::MissingFields => "CRI log line without a space-separated header",
            Malformed::Timestamp => "CRI log line without an RFC 3339 timestamp",
            Malformed::Stream => "CRI log line with a stream other than stdout/stderr",
            Malformed::MissingTag => "CRI log line without a tag",
            Malformed::Tag => "CRI log line with a tag other than F or P",
        }
    }
}

/// Parses one CRI line, without its trailing newline, into its stream and whether it ends a
/// logical line. Only the header is examined: the content may be anything, even invalid UTF-8.
pub fn parse_line(line: &[u8]) -> Result<CriLine, ParseError> {
    classify(line).map_err(|m| ParseError::new(m.reason()))
}

/// Word-at-a-time fast path for the usual shape (it is most of the cost per line after finding
/// the newline), the byte-wise parser for everything else.
#[inline(always)]
fn classify(line: &[u8]) -> Result<CriLine, Malformed> {
    match classify_fast(line) {
        Some(parsed) => Ok(parsed),
        None => classify_slow(line),
    }
}

const SPACES: u64 = u64::from_ne_bytes([b' '; 8]);

/// Reads 8 bytes at `at`, or None past the end.
#[inline(always)]
fn word(line: &[u8], at: usize) -> Option<u64> {
    let bytes: [u8; 8] = line.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

/// Mask with the high bit set in the first byte of `w` that is a space (bits above it may be
/// spurious, which `trailing_zeros` ignores); 0 when there is none.
#[inline(always)]
fn space_mask(w: u64) -> u64 {
    let x = w ^ SPACES;
    x.wrapping_sub(0x0101_0101_0101_0101) & !x & 0x8080_8080_8080_8080
}

/// The common well-formed line in a few word loads: `None` sends anything unusual (short,
/// malformed, long timestamps) to [`classify_slow`], which it must agree with whenever it answers.
#[inline(always)]
fn classify_fast(line: &[u8]) -> Option<CriLine> {
    // `YYYY-MM-DDT`: the same shape check as the slow path.
    if !looks_like_timestamp(line.get(..20)?) {
        return None;
    }
    // No space before byte 19 (bytes 0..5 are already known non-space), so the first space, which
    // ends the timestamp, is the first one found from byte 19 on.
    if space_mask(word(line, 5)?) | space_mask(word(line, 11)?) != 0 {
        return None;
    }
    let lo = space_mask(word(line, 19)?);
    let sp = if lo != 0 {
        19 + (lo.trailing_zeros() / 8) as usize
    } else {
        let hi = space_mask(word(line, 27)?);
        if hi == 0 {
            return None;
        }
        27 + (hi.trailing_zeros() / 8) as usize
    };
    if sp < 20 {
        return None;
    }
    const OUT_F: u64 = u64::from_le_bytes(*b"stdout F");
    const OUT_P: u64 = u64::from_le_bytes(*b"stdout P");
    const ERR_F: u64 = u64::from_le_bytes(*b"stderr F");
    const ERR_P: u64 = u64::from_le_bytes(*b"stderr P");
    let (stream, full) = match word(line, sp + 1)? {
        OUT_F => (Stream::Stdout, true),
        OUT_P => (Stream::Stdout, false),
        ERR_F => (Stream::Stderr, true),
        ERR_P => (Stream::Stderr, false),
        _ => return None,
    };
    Some(CriLine { stream, full })
}

#[inline(never)]
fn classify_slow(line: &[u8]) -> Result<CriLine, Malformed> {
    let sp = memchr(b' ', line).ok_or(Malformed::MissingFields)?;
    let (ts, rest) = line.split_at(sp);
    if !looks_like_timestamp(ts) {
        return Err(Malformed::Timestamp);
    }
    // `rest` starts with the separating space.
    let (stream, rest) = match rest.get(1..7) {
        Some(b"stdout") => (Stream::Stdout, &rest[7..]),
        Some(b"stderr") => (Stream::Stderr, &rest[7..]),
        _ => return Err(Malformed::Stream),
    };
    // Tags may grow `:`-separated fields in future runtimes; only the first letter matters.
    match rest {
        [b' ', b'F', ..] => Ok(CriLine { stream, full: true }),
        [b' ', b'P', ..] => Ok(CriLine {
            stream,
            full: false,
        }),
        [b' ', b' ', ..] | [b' '] | [] => Err(Malformed::MissingTag),
        [b' ', ..] => Err(Malformed::Tag),
        // e.g. `stdoutx`: the stream field is longer than a known stream.
        _ => Err(Malformed::Stream),
    }
}

/// Cheap shape check (`YYYY-MM-DDT...`, at least the 20 bytes of `2006-01-02T15:04:05Z`) that
/// rejects foreign formats such as docker's JSON lines without parsing the date.
#[inline]
fn looks_like_timestamp(ts: &[u8]) -> bool {
    match ts {
        [y0, y1, y2, y3, b'-', _, _, b'-', _, _, b'T' | b't', ..] if ts.len() >= 20 => {
            y0.is_ascii_digit() && y1.is_ascii_digit() && y2.is_ascii_digit() && y3.is_ascii_digit()
        }
        _ => false,
    }
}

#[inline(always)]
fn tally(counts: &mut LineCounts, header: &[u8]) {
    match classify(header) {
        Ok(CriLine {
            stream: Stream::Stdout,
            full: true,
        }) => counts.stdout += 1,
        Ok(CriLine {
            stream: Stream::Stderr,
            full: true,
        }) => counts.stderr += 1,
        Ok(_) => {}
        Err(_) => counts.malformed += 1,
    }
}

/// Streaming counter over a CRI log byte stream cut into arbitrary chunks.
///
/// Memory is fixed: of an unfinished line it keeps only the first [`HEADER_CAP`] bytes (all the
/// parser looks at) and skips the rest, so a multi-megabyte line costs nothing.
#[derive(Debug, Clone)]
pub struct CriCounter {
    carry: [u8; HEADER_CAP],
    /// Non-zero exactly while inside an unfinished line: such a line has at least one byte.
    carry_len: usize,
}

impl Default for CriCounter {
    fn default() -> Self {
        CriCounter::new()
    }
}

impl CriCounter {
    pub fn new() -> Self {
        CriCounter {
            carry: [0; HEADER_CAP],
            carry_len: 0,
        }
    }

    /// Feeds the next chunk of the stream and returns the counts of the lines completed (by a
    /// `\n`) within it. An unfinished line at the end is remembered and counted when its newline
    /// arrives in a later chunk.
    pub fn feed(&mut self, chunk: &[u8]) -> LineCounts {
        let mut counts = LineCounts::default();
        let mut rest = chunk;
        if self.carry_len > 0 {
            match memchr(b'\n', rest) {
                None => {
                    self.push_carry(rest);
                    return counts;
                }
                Some(i) => {
                    self.push_carry(&rest[..i]);
                    tally(&mut counts, &self.carry[..self.carry_len]);
                    self.carry_len = 0;
                    rest = &rest[i + 1..];
                }
            }
        }
        // Lines wholly inside the chunk: parsed in place, nothing copied.
        while let Some(i) = memchr(b'\n', rest) {
            tally(&mut counts, &rest[..i.min(HEADER_CAP)]);
            rest = &rest[i + 1..];
        }
        self.push_carry(rest);
        counts
    }

    /// Forgets the unfinished line, e.g. after the file was truncated under it.
    pub fn reset(&mut self) {
        self.carry_len = 0;
    }

    /// Bytes held of the unfinished line (at most [`HEADER_CAP`]), 0 when at a line boundary.
    pub fn pending(&self) -> usize {
        self.carry_len
    }

    fn push_carry(&mut self, bytes: &[u8]) {
        let room = HEADER_CAP - self.carry_len;
        let take = bytes.len().min(room);
        self.carry[self.carry_len..self.carry_len + take].copy_from_slice(&bytes[..take]);
        self.carry_len += take;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TS: &str = "2026-07-20T04:46:01.123456789Z";

    fn line(stream: &str, tag: &str, content: &str) -> String {
        format!("{TS} {stream} {tag} {content}\n")
    }

    fn counts(stdout: u64, stderr: u64, malformed: u64) -> LineCounts {
        LineCounts {
            stdout,
            stderr,
            malformed,
        }
    }

    #[test]
    fn parses_full_and_partial_lines() {
        let l = format!("{TS} stderr F connect ETIMEDOUT 1.2.3.4:443");
        assert_eq!(
            parse_line(l.as_bytes()).unwrap(),
            CriLine {
                stream: Stream::Stderr,
                full: true
            }
        );
        let l = format!("{TS} stdout P first half");
        assert_eq!(
            parse_line(l.as_bytes()).unwrap(),
            CriLine {
                stream: Stream::Stdout,
                full: false
            }
        );
    }

    #[test]
    fn parses_empty_content_extended_tags_and_other_timestamps() {
        for l in [
            format!("{TS} stdout F"),
            format!("{TS} stdout F "),
            format!("{TS} stdout F:x:y some content"),
            "2026-07-20T04:46:01.1+05:30 stdout F hi".to_owned(),
            "2026-07-20T04:46:01Z stdout F hi".to_owned(),
        ] {
            let parsed = parse_line(l.as_bytes()).unwrap();
            assert!(parsed.full, "{l}");
            assert_eq!(parsed.stream, Stream::Stdout);
        }
        let parsed = parse_line(format!("{TS} stderr P:1 x").as_bytes()).unwrap();
        assert!(!parsed.full);
    }

    #[test]
    fn content_may_be_binary() {
        let mut l = format!("{TS} stdout F ").into_bytes();
        l.extend_from_slice(&[0xff, 0xfe, 0, b' ', b'\r']);
        assert!(parse_line(&l).unwrap().full);
    }

    #[test]
    fn rejects_malformed_lines() {
        for l in [
            "".to_owned(),
            "no-spaces-at-all".to_owned(),
            "hello world foo bar".to_owned(),
            r#"{"log":"x\n","stream":"stdout","time":"2026-07-20T04:46:01Z"}"#.to_owned(),
            "2026-07-20 stdout F short timestamp".to_owned(),
            "20x6-07-20T04:46:01.123Z stdout F bad year".to_owned(),
            format!("{TS} stdin F unknown stream"),
            format!("{TS} stdoutx F longer stream"),
            format!("{TS} stdout"),
            format!("{TS} stdout "),
            format!("{TS} stdout  double space"),
            format!("{TS} stderr X unknown tag"),
            format!("{TS} stderr f lowercase tag"),
            format!(" {TS} stdout F leading space"),
        ] {
            assert!(parse_line(l.as_bytes()).is_err(), "accepted {l:?}");
        }
    }

    #[test]
    fn fast_path_agrees_with_slow_path() {
        // Deterministic xorshift: valid lines of every timestamp length, then mutated and cut.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let zones = ["Z", "z", "+05:30", "-00:00", ""];
        let fields = [
            "stdout F",
            "stdout P",
            "stderr F",
            "stderr P",
            "stdout F:x",
            "stdin F",
        ];
        let noise = [
            b' ', b'F', b'P', b's', b'0', b'-', b'T', b':', b'x', b'\t', 0xff,
        ];
        let (mut fast_hits, mut cases) = (0, 0);
        for _ in 0..200_000 {
            let digits = (next() % 11) as usize;
            let frac = if digits == 0 {
                String::new()
            } else {
                format!(".{}", &"123456789"[..digits.min(9)])
            };
            let zone = zones[(next() % 5) as usize];
            let field = fields[(next() % 6) as usize];
            let mut l =
                format!("2026-07-20T04:46:01{frac}{zone} {field} content here").into_bytes();
            for _ in 0..next() % 4 {
                let at = (next() % 48) as usize;
                if let Some(b) = l.get_mut(at) {
                    *b = noise[(next() % noise.len() as u64) as usize];
                }
            }
            if next() % 4 == 0 {
                l.truncate((next() % 50) as usize);
            }
            cases += 1;
            if let Some(fast) = classify_fast(&l) {
                fast_hits += 1;
                assert_eq!(
                    Ok(fast),
                    classify_slow(&l),
                    "{:?}",
                    String::from_utf8_lossy(&l)
                );
            }
        }
        assert!(
            fast_hits > cases / 4,
            "fast path barely exercised: {fast_hits}/{cases}"
        );
    }

    #[test]
    fn malformed_reason_is_readable() {
        let err = parse_line(format!("{TS} stdin F x").as_bytes()).unwrap_err();
        assert!(err.0.contains("stdout/stderr"), "{err}");
    }

    #[test]
    fn counts_logical_lines_across_partial_pieces() {
        let mut c = CriCounter::new();
        let text = [
            line("stdout", "P", "a long line, "),
            line("stdout", "P", "still going, "),
            line("stderr", "F", "interleaved stderr line"),
            line("stdout", "F", "and done"),
            line("stdout", "F", "short"),
            line("stderr", "P", "a dangling piece whose end is still to come"),
        ]
        .concat();
        assert_eq!(c.feed(text.as_bytes()), counts(2, 1, 0));
        assert_eq!(c.pending(), 0);
        assert_eq!(
            c.feed(line("stderr", "F", "end").as_bytes()),
            counts(0, 1, 0)
        );
    }

    #[test]
    fn counts_malformed_lines_separately() {
        let mut c = CriCounter::new();
        let text = format!(
            "{}garbage\n\n{}{TS} stdin F x\n",
            line("stdout", "F", "ok"),
            line("stderr", "F", "ok")
        );
        assert_eq!(c.feed(text.as_bytes()), counts(1, 1, 3));
    }

    fn sample_stream() -> Vec<u8> {
        let long = "x".repeat(3 * HEADER_CAP);
        [
            line("stdout", "F", "one"),
            line("stderr", "P", &long),
            line("stderr", "F", &long),
            "not a cri line\n".to_owned(),
            line("stdout", "F", ""),
            format!("{TS} stdout F:extra {long}\n"),
            "\n".to_owned(),
            line("stderr", "F", "last"),
            format!("{TS} stdout F unfinished"),
        ]
        .concat()
        .into_bytes()
    }

    #[test]
    fn byte_by_byte_feeding_matches_one_feed() {
        let data = sample_stream();
        let mut whole = CriCounter::new();
        let expected = whole.feed(&data);
        assert_eq!(expected, counts(3, 2, 2));

        let mut bytewise = CriCounter::new();
        let mut got = LineCounts::default();
        for b in &data {
            got.add(&bytewise.feed(std::slice::from_ref(b)));
            assert!(bytewise.pending() <= HEADER_CAP);
        }
        assert_eq!(got, expected);
        assert_eq!(bytewise.pending(), whole.pending());
    }

    #[test]
    fn every_two_way_split_matches_one_feed() {
        // Covers splits inside the timestamp, the stream, the tag and the content.
        let data = sample_stream();
        let expected = CriCounter::new().feed(&data);
        for cut in 0..=data.len() {
            let mut c = CriCounter::new();
            let mut got = c.feed(&data[..cut]);
            got.add(&c.feed(&data[cut..]));
            assert_eq!(got, expected, "cut at {cut}");
        }
    }

    #[test]
    fn unfinished_line_counts_only_when_its_newline_arrives() {
        let mut c = CriCounter::new();
        assert_eq!(
            c.feed(format!("{TS} stderr F half").as_bytes()),
            counts(0, 0, 0)
        );
        assert!(c.pending() > 0);
        assert_eq!(c.feed(b" and the rest"), counts(0, 0, 0));
        assert_eq!(c.feed(b"\n"), counts(0, 1, 0));
        assert_eq!(c.pending(), 0);
        assert_eq!(c.feed(b""), counts(0, 0, 0));
    }

    #[test]
    fn long_unfinished_line_keeps_only_its_header() {
        let mut c = CriCounter::new();
        c.feed(format!("{TS} stdout F ").as_bytes());
        let filler = vec![b'y'; 1 << 20];
        for _ in 0..8 {
            assert_eq!(c.feed(&filler), counts(0, 0, 0));
            assert_eq!(c.pending(), HEADER_CAP);
        }
        assert_eq!(c.feed(b"\n"), counts(1, 0, 0));
        assert!(std::mem::size_of::<CriCounter>() <= HEADER_CAP + 32);
    }

    #[test]
    fn reset_forgets_the_unfinished_line() {
        let mut c = CriCounter::new();
        c.feed(format!("{TS} stdout F cut by trunc").as_bytes());
        c.reset();
        assert_eq!(c.pending(), 0);
        // Without the reset, this tail would have been glued to the old header.
        assert_eq!(c.feed(b"ation\n"), counts(0, 0, 1));
        assert_eq!(
            c.feed(line("stdout", "F", "fresh").as_bytes()),
            counts(1, 0, 0)
        );
    }

    #[test]
    fn line_counts_helpers() {
        let mut a = counts(1, 2, 3);
        assert_eq!(a.total(), 3);
        assert!(!a.is_zero());
        a.add(&counts(10, 20, 30));
        assert_eq!(a, counts(11, 22, 33));
        assert!(LineCounts::default().is_zero());
        let mut big = counts(u64::MAX, 0, 0);
        big.add(&counts(1, 0, 0));
        assert_eq!(big.stdout, u64::MAX);
    }
}
