//! The CRI container log format (containerd, CRI-O): `<RFC3339Nano> <stream> <tag> <content>\n`.
//! Pure parsing and a streaming line counter; no I/O here.

use crate::error::ParseError;
pub use crate::model::{LineCounts, Stream};
use memchr::memchr;

/// How many bytes of a line are looked at. The header (timestamp, stream, tag) needs about 45, so
/// this leaves room for longer timestamps and tags with extra fields; the content is never read.
pub const HEADER_CAP: usize = 128;

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
    let (stream, full) = match fields_word(line)? {
        OUT_F => (Stream::Stdout, true),
        OUT_P => (Stream::Stdout, false),
        ERR_F => (Stream::Stderr, true),
        ERR_P => (Stream::Stderr, false),
        _ => return None,
    };
    Some(CriLine { stream, full })
}

const OUT_F: u64 = u64::from_le_bytes(*b"stdout F");
const OUT_P: u64 = u64::from_le_bytes(*b"stdout P");
const ERR_F: u64 = u64::from_le_bytes(*b"stderr F");
const ERR_P: u64 = u64::from_le_bytes(*b"stderr P");

/// The 8 bytes after the timestamp's space (`stdout F` in a well-formed line), found with a few
/// word loads; `None` for short lines and unusual timestamps (the slow path decides those).
#[inline(always)]
fn fields_word(line: &[u8]) -> Option<u64> {
    let (w0, w5, w11, w19) = (
        word(line, 0)?,
        word(line, 5)?,
        word(line, 11)?,
        word(line, 19)?,
    );
    // `YYYY-MM-DDT` as in `looks_like_timestamp`, and no space before byte 19 (the shortest
    // timestamp has 20 bytes), tested together so that a valid line takes a single branch.
    let dashes = w0 & 0xff00_00ff_0000_0000 == u64::from_le_bytes(*b"\0\0\0\0-\0\0-");
    let year = w0 & 0xffff_ffff;
    let digits =
        (year & 0xf0f0_f0f0 == 0x3030_3030) & ((year + 0x0606_0606) & 0xf0f0_f0f0 == 0x3030_3030);
    let t = (w5 >> 40) as u8 | 0x20 == b't';
    if !(dashes & digits & t) | (space_mask(w5) | space_mask(w11) != 0) {
        return None;
    }
    // The first space, which ends the timestamp, is the first one from byte 19 on.
    let lo = space_mask(w19);
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
    word(line, sp + 1)
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
    // The stream and tag alternate unpredictably line by line, so they pick a word to compare
    // and increments instead of branches: the one branch left is taken for every valid line.
    if let Some(w) = fields_word(header) {
        let err = usize::from((w >> 24) as u8 == b'e');
        let part = usize::from((w >> 56) as u8 == b'P');
        const WORDS: [u64; 4] = [OUT_F, ERR_F, OUT_P, ERR_P];
        if w == WORDS[err | part << 1] {
            counts.stdout += ((err | part) ^ 1) as u64;
            counts.stderr += (err & (part ^ 1)) as u64;
            return;
        }
    }
    tally_slow(counts, header);
}

#[inline(never)]
fn tally_slow(counts: &mut LineCounts, header: &[u8]) {
    match classify_slow(header) {
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

/// Bytes examined per newline mask.
const BLOCK: usize = 64;

/// Bit `i` set when `block[i]` is a newline. SSE2 and NEON are baseline on x86_64 and aarch64.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn newline_mask(block: &[u8; BLOCK]) -> u64 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_set1_epi8,
    };
    // SAFETY: the four unaligned 16-byte loads stay inside the 64-byte array.
    unsafe {
        let nl = _mm_set1_epi8(b'\n' as i8);
        let p = block.as_ptr().cast::<__m128i>();
        let m = |i: usize| {
            _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_loadu_si128(p.add(i)), nl)) as u16 as u64
        };
        m(0) | m(1) << 16 | m(2) << 32 | m(3) << 48
    }
}

#[cfg(all(target_arch = "aarch64", target_endian = "little"))]
#[inline(always)]
fn newline_mask(block: &[u8; BLOCK]) -> u64 {
    use std::arch::aarch64::{
        vandq_u8, vceqq_u8, vdupq_n_u8, vgetq_lane_u64, vld1q_u8, vpaddq_u8, vreinterpretq_u64_u8,
    };
    // SAFETY: the four 16-byte loads stay inside the 64-byte array.
    unsafe {
        // One bit per lane, then three pairwise adds fold 64 lanes into 64 bits (simdjson's
        // movemask for NEON).
        let bits = vld1q_u8([1u8, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128].as_ptr());
        let nl = vdupq_n_u8(b'\n');
        let p = block.as_ptr();
        let m = |i: usize| vandq_u8(vceqq_u8(vld1q_u8(p.add(16 * i)), nl), bits);
        let lo = vpaddq_u8(m(0), m(1));
        let hi = vpaddq_u8(m(2), m(3));
        let all = vpaddq_u8(lo, hi);
        vgetq_lane_u64::<0>(vreinterpretq_u64_u8(vpaddq_u8(all, all)))
    }
}

#[cfg(not(any(
    target_arch = "x86_64",
    all(target_arch = "aarch64", target_endian = "little")
)))]
#[inline(always)]
fn newline_mask(block: &[u8; BLOCK]) -> u64 {
    newline_mask_scalar(block)
}

/// Reference for the SIMD masks, and the mask on other architectures.
#[allow(dead_code)]
fn newline_mask_scalar(block: &[u8; BLOCK]) -> u64 {
    block
        .iter()
        .enumerate()
        .fold(0, |m, (i, &b)| m | u64::from(b == b'\n') << i)
}

/// Blocks without a newline after which the line counts as long and memchr strides over it.
const LONG_LINE_BLOCKS: usize = 4;

/// The index of every newline in a byte string, in order. A memchr call per line costs more
/// than classifying the line when lines are short; a 64-byte mask costs a few instructions and
/// then one bit per line. Inside a long line, memchr's wide loop is faster: it takes over after
/// [`LONG_LINE_BLOCKS`] blocks without a newline.
struct Newlines<'a> {
    hay: &'a [u8],
    /// Newlines of the block starting at `base` not yet returned.
    mask: u64,
    base: usize,
    /// Where the next block starts.
    next: usize,
    /// Consecutive blocks without a newline.
    empty: usize,
}

impl<'a> Newlines<'a> {
    fn new(hay: &'a [u8]) -> Self {
        Newlines {
            hay,
            mask: 0,
            base: 0,
            next: 0,
            empty: 0,
        }
    }

    /// The next newline from `self.next` on by memchr; the scan goes on after it.
    #[inline(never)]
    fn stride(&mut self) -> Option<usize> {
        let rest = self.hay.get(self.next..)?;
        let i = self.next + memchr(b'\n', rest)?;
        self.next = i + 1;
        self.empty = 0;
        Some(i)
    }
}

impl Iterator for Newlines<'_> {
    type Item = usize;

    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        loop {
            if self.mask != 0 {
                let i = self.base + self.mask.trailing_zeros() as usize;
                self.mask &= self.mask - 1;
                return Some(i);
            }
            let block = self
                .hay
                .get(self.next..self.next + BLOCK)
                .and_then(|b| <&[u8; BLOCK]>::try_from(b).ok());
            let Some(block) = block else {
                // Fewer than BLOCK bytes left.
                return self.stride();
            };
            self.mask = newline_mask(block);
            self.base = self.next;
            self.next += BLOCK;
            if self.mask != 0 {
                self.empty = 0;
            } else {
                self.empty += 1;
                if self.empty >= LONG_LINE_BLOCKS {
                    return self.stride();
                }
            }
        }
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
        let mut start = 0;
        for nl in Newlines::new(rest) {
            let line = &rest[start..nl];
            tally(&mut counts, &line[..line.len().min(HEADER_CAP)]);
            start = nl + 1;
        }
        self.push_carry(&rest[start..]);
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

    /// Deterministic xorshift for the randomised equivalence tests below.
    fn rng(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    #[test]
    fn newline_mask_matches_the_scalar_reference() {
        let mut next = rng(0x2545_f491_4f6c_dd1d);
        for density in [1, 4, 16, 64, 256] {
            for _ in 0..2_000 {
                let mut block = [0u8; BLOCK];
                for b in block.iter_mut() {
                    *b = if next() % density == 0 {
                        b'\n'
                    } else {
                        next() as u8
                    };
                }
                assert_eq!(
                    newline_mask(&block),
                    newline_mask_scalar(&block),
                    "{block:?}"
                );
            }
        }
        assert_eq!(newline_mask(&[b'\n'; BLOCK]), u64::MAX);
        let mut last = [0u8; BLOCK];
        last[BLOCK - 1] = b'\n';
        assert_eq!(newline_mask(&last), 1 << 63);
    }

    #[test]
    fn newlines_finds_every_newline_whatever_the_line_lengths() {
        let mut next = rng(0x9e37_79b9_7f4a_7c15);
        // Lengths around the block size and the long-line switch, and far beyond it.
        let spans = [1, 2, 15, 63, 64, 65, 130, 255, 256, 257, 1000, 5000];
        for round in 0..400 {
            let mut hay = Vec::new();
            while hay.len() < 6_000 {
                let len = spans[(next() % spans.len() as u64) as usize] + (next() % 3) as usize;
                hay.extend((0..len).map(|_| b'a' + (next() % 26) as u8));
                hay.push(b'\n');
            }
            // Sometimes no trailing newline, sometimes a leading offset that misaligns blocks.
            if round % 3 == 0 {
                hay.extend_from_slice(b"tail without newline");
            }
            let hay = &hay[round % 70..];
            let want: Vec<usize> = memchr::memchr_iter(b'\n', hay).collect();
            let got: Vec<usize> = Newlines::new(hay).collect();
            assert_eq!(got, want, "round {round}");
        }
        assert_eq!(Newlines::new(b"").count(), 0);
        assert_eq!(Newlines::new(&[b'x'; 1000]).count(), 0);
        assert_eq!(Newlines::new(&[b'\n'; 1000]).count(), 1000);
    }

    /// The counter before block-wise newline search: one memchr per line.
    fn reference_counts(data: &[u8]) -> (LineCounts, usize) {
        let mut counts = LineCounts::default();
        let mut rest = data;
        while let Some(i) = memchr(b'\n', rest) {
            match parse_line(&rest[..i.min(HEADER_CAP)]) {
                Ok(CriLine { full: false, .. }) => {}
                Ok(CriLine {
                    stream: Stream::Stdout,
                    ..
                }) => counts.stdout += 1,
                Ok(CriLine {
                    stream: Stream::Stderr,
                    ..
                }) => counts.stderr += 1,
                Err(_) => counts.malformed += 1,
            }
            rest = &rest[i + 1..];
        }
        (counts, rest.len().min(HEADER_CAP))
    }

    #[test]
    fn feed_matches_the_per_line_reference_on_mixed_streams() {
        let mut next = rng(0x1234_5678_9abc_def1);
        let headers = [
            "2026-07-20T04:46:01.123456789Z stdout F ",
            "2026-07-20T04:46:01.12345678Z stderr F ",
            "2026-07-20T04:46:01Z stdout P ",
            "2026-07-20T04:46:01.1+05:30 stderr P ",
            "2026-07-20T04:46:01.123Z stdin F ",
            "2026-07-20 stdout F ",
            "{\"log\":\"x\"} ",
            "",
        ];
        for round in 0..60 {
            let mut data = Vec::new();
            while data.len() < 40_000 {
                let h = headers[(next() % headers.len() as u64) as usize];
                data.extend_from_slice(h.as_bytes());
                let len = match next() % 10 {
                    0 => (next() % 3000) as usize,
                    1 => 0,
                    _ => (next() % 150) as usize,
                };
                data.extend((0..len).map(|_| b' ' + (next() % 90) as u8));
                data.push(b'\n');
            }
            data.extend_from_slice(headers[round % 2].as_bytes());
            let (want, pending) = reference_counts(&data);
            let mut whole = CriCounter::new();
            assert_eq!(whole.feed(&data), want, "round {round}");
            assert_eq!(whole.pending(), pending);
            // Random chunking, as reads of a growing file cut it.
            let mut c = CriCounter::new();
            let mut got = LineCounts::default();
            let mut at = 0;
            while at < data.len() {
                let end = (at + 1 + (next() % 9000) as usize).min(data.len());
                got.add(&c.feed(&data[at..end]));
                at = end;
            }
            assert_eq!(got, want, "round {round}, chunked");
            assert_eq!(c.pending(), pending);
        }
    }
}
