//! The two text formats of `/metrics`: which one a scraper asked for (its `Accept` header), and
//! the Prometheus text format 0.0.4 derived from the OpenMetrics text that prometheus-client
//! encodes.
//!
//! Why a converter: prometheus-client (0.26) encodes only OpenMetrics (and protobuf), and no
//! maintained crate renders 0.0.4 from its registry; the `prometheus` crate would mean a second
//! metrics model beside the catalog. The OpenMetrics text of our own encoder is regular, so a
//! line-wise rewrite of it is small, pure and tested here line by line.

pub(crate) const OPENMETRICS_1: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub(crate) const OPENMETRICS_0_0_1: &str =
    "application/openmetrics-text; version=0.0.1; charset=utf-8";
pub(crate) const TEXT_0_0_4: &str = "text/plain; version=0.0.4; charset=utf-8";

// === negotiation ===

/// The format of a `/metrics` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// OpenMetrics text, labelled with the version asked for (the body is the same).
    OpenMetrics(&'static str),
    Text,
}

impl Format {
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics(ct) => ct,
            Format::Text => TEXT_0_0_4,
        }
    }
}

/// What Prometheus' own `expfmt.NegotiateIncludingOpenMetrics` answers for these `Accept` header
/// values: the clauses by quality, highest first (ties in the order sent); the first that is
/// `text/plain` (version 0.0.4 or none) or `application/openmetrics-text` (1.0.0, 0.0.1 or none)
/// wins; anything else, no header included, gets text 0.0.4. Two deliberate differences: a clause
/// with `q=0` means "not acceptable" (RFC 9110) and is skipped, and media types compare without
/// case. Protobuf is not served, so its clauses are skipped like any unknown type.
pub(crate) fn negotiate<'a>(accept: impl IntoIterator<Item = &'a str>) -> Format {
    let mut clauses: Vec<(f64, Format)> = Vec::new();
    for clause in accept.into_iter().flat_map(|h| h.split(',')) {
        let mut parts = clause.split(';');
        let media = parts.next().unwrap_or("").trim();
        let (mut q, mut version) = (1.0, None);
        for p in parts {
            let Some((k, v)) = p.split_once('=') else {
                continue;
            };
            match k.trim() {
                // A malformed q reads as 0, as in Go's ParseFloat.
                "q" => q = v.trim().parse::<f64>().unwrap_or(0.0),
                "version" => version = Some(v.trim()),
                _ => {}
            }
        }
        let format = if media.eq_ignore_ascii_case("text/plain") {
            matches!(version, None | Some("0.0.4")).then_some(Format::Text)
        } else if media.eq_ignore_ascii_case("application/openmetrics-text") {
            match version {
                Some("1.0.0") => Some(Format::OpenMetrics(OPENMETRICS_1)),
                None | Some("0.0.1") => Some(Format::OpenMetrics(OPENMETRICS_0_0_1)),
                _ => None,
            }
        } else {
            None
        };
        if let Some(f) = format.filter(|_| q > 0.0) {
            clauses.push((q, f));
        }
    }
    // Stable: equal qualities keep the order the client sent them in.
    clauses.sort_by(|a, b| b.0.total_cmp(&a.0));
    clauses.first().map_or(Format::Text, |c| c.1)
}

// === OpenMetrics -> 0.0.4 ===

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("OpenMetrics line {line}: {what}")]
pub struct ConvertError {
    pub line: usize,
    pub what: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OmType {
    Counter,
    Gauge,
    Histogram,
    GaugeHistogram,
    Summary,
    Info,
    StateSet,
    Unknown,
}

impl OmType {
    fn parse(s: &str) -> Option<OmType> {
        Some(match s {
            "counter" => OmType::Counter,
            "gauge" => OmType::Gauge,
            "histogram" => OmType::Histogram,
            "gaugehistogram" => OmType::GaugeHistogram,
            "summary" => OmType::Summary,
            "info" => OmType::Info,
            "stateset" => OmType::StateSet,
            "unknown" => OmType::Unknown,
            _ => return None,
        })
    }

    /// The 0.0.4 family name's suffix and type. A gauge histogram has no 0.0.4 type: each of its
    /// series kinds becomes a gauge family of its own (see [`Family::flush`]).
    fn text(self) -> (&'static str, &'static str) {
        match self {
            OmType::Counter => ("_total", "counter"),
            OmType::Gauge | OmType::StateSet | OmType::GaugeHistogram => ("", "gauge"),
            OmType::Info => ("_info", "gauge"),
            OmType::Histogram => ("", "histogram"),
            OmType::Summary => ("", "summary"),
            OmType::Unknown => ("", "untyped"),
        }
    }

    /// What becomes of a sample whose name is the family's plus `suffix`: `None` if it is not
    /// one of this type's, `Some(None)` to drop it (0.0.4 has no `_created`).
    fn sample(self, suffix: &str) -> Option<Option<Kind>> {
        let keep = Some(Some(Kind::Main));
        match (self, suffix) {
            (OmType::Counter, "_total") | (OmType::Info, "_info") => keep,
            (OmType::Gauge | OmType::StateSet | OmType::Unknown, "") => keep,
            (OmType::Histogram, "_bucket" | "_count" | "_sum") => keep,
            (OmType::Summary, "" | "_count" | "_sum") => keep,
            (OmType::Counter | OmType::Histogram | OmType::Summary, "_created") => Some(None),
            (OmType::GaugeHistogram, "_bucket") => Some(Some(Kind::Bucket)),
            (OmType::GaugeHistogram, "_gcount") => Some(Some(Kind::GCount)),
            (OmType::GaugeHistogram, "_gsum") => Some(Some(Kind::GSum)),
            _ => None,
        }
    }
}

/// Where a converted sample goes: the family's one body, or one of a gauge histogram's three.
#[derive(Clone, Copy)]
enum Kind {
    Main,
    Bucket,
    GCount,
    GSum,
}

/// The family being read: its descriptors until its first sample, then its samples.
struct Family<'a> {
    name: &'a str,
    ty: Option<OmType>,
    help: Option<&'a str>,
    /// The 0.0.4 header is written (at the first sample, or at the end for an empty family).
    started: bool,
    /// A gauge histogram's `_bucket`, `_gcount`, `_gsum` series, written as three families.
    split: [String; 3],
}

impl<'a> Family<'a> {
    fn new(name: &'a str) -> Family<'a> {
        Family {
            name,
            ty: None,
            help: None,
            started: false,
            split: Default::default(),
        }
    }

    fn ty(&self) -> OmType {
        self.ty.unwrap_or(OmType::Unknown)
    }

    fn header(&self, out: &mut String, suffix: &str, ty: &str) {
        if let Some(help) = self.help {
            for part in ["# HELP ", self.name, suffix, " "] {
                out.push_str(part);
            }
            help_text(out, help);
            out.push('\n');
        }
        for part in ["# TYPE ", self.name, suffix, " ", ty, "\n"] {
            out.push_str(part);
        }
    }

    fn start(&mut self, out: &mut String) {
        if !self.started && self.ty() != OmType::GaugeHistogram {
            let (suffix, ty) = self.ty().text();
            self.header(out, suffix, ty);
        }
        self.started = true;
    }

    fn flush(mut self, out: &mut String) {
        if self.ty() != OmType::GaugeHistogram {
            self.start(out);
            return;
        }
        let split = std::mem::take(&mut self.split);
        for (suffix, body) in ["_bucket", "_gcount", "_gsum"].into_iter().zip(split) {
            self.header(out, suffix, "gauge");
            out.push_str(&body);
        }
    }
}

/// OpenMetrics HELP escapes `\\`, `\n` and `\"`; 0.0.4 knows only the first two, and its parser
/// refuses any other escape. prometheus-client writes help verbatim, so a lone backslash is
/// escaped too.
fn help_text(out: &mut String, help: &str) {
    let mut chars = help.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\\') => out.push_str("\\\\"),
                Some('n') => out.push_str("\\n"),
                Some('"') => out.push('"'),
                Some(other) => {
                    out.push_str("\\\\");
                    out.push(other);
                }
                None => out.push_str("\\\\"),
            },
            c => out.push(c),
        }
    }
}

/// The end of a label set `{...}` at the start of `s` (the index after `}`), quotes and escapes
/// respected: a label value may hold `}`, ` # ` or a quote.
fn labels_end(s: &str) -> Option<usize> {
    let mut quoted = false;
    let mut bytes = s.bytes().enumerate().skip(1);
    while let Some((i, b)) = bytes.next() {
        match (quoted, b) {
            (true, b'\\') => {
                bytes.next();
            }
            (_, b'"') => quoted = !quoted,
            (false, b'}') => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// Prometheus text format 0.0.4 from OpenMetrics 1.0 text (with or without its `# EOF`):
/// - a counter family `x` is declared `x_total`, an info family `x` `x_info` (a gauge), a
///   stateset a gauge, unknown untyped; a gauge histogram's `_bucket`, `_gcount` and `_gsum`
///   series become three gauge families of those names (0.0.4 has no such type), so a scraper
///   stores the same series names from either format;
/// - `# UNIT`, `# EOF`, `_created` samples and exemplars are dropped (0.0.4 has none);
///   timestamps go from seconds to integer milliseconds;
/// - label values keep their escaping (the same three escapes in both formats); HELP is
///   re-escaped ([`help_text`]).
///
/// A line that is not well-formed OpenMetrics is an error naming it: the input is our own
/// encoder's, so that is a bug to surface, never text to pass on.
pub(crate) fn to_text(om: &str) -> Result<String, ConvertError> {
    let mut out = String::with_capacity(om.len() + om.len() / 16);
    let mut family: Option<Family> = None;
    let mut ended = false;
    for (i, line) in om.lines().enumerate() {
        let err = |what| ConvertError { line: i + 1, what };
        if ended {
            return Err(err("text after # EOF"));
        }
        if line == "# EOF" {
            ended = true;
            continue;
        }
        if let Some(d) = line.strip_prefix("# ") {
            let mut f = d.splitn(3, ' ');
            let (kind, name, rest) = (f.next(), f.next(), f.next().unwrap_or(""));
            let name = name
                .filter(|n| !n.is_empty())
                .ok_or(err("bad descriptor"))?;
            if family.as_ref().is_none_or(|f| f.name != name) {
                if let Some(done) = family.take() {
                    done.flush(&mut out);
                }
                family = Some(Family::new(name));
            }
            let Some(fam) = family.as_mut() else {
                return Err(err("bad descriptor"));
            };
            if fam.started {
                return Err(err("descriptor after the family's samples"));
            }
            match kind {
                Some("HELP") => fam.help = Some(rest),
                Some("TYPE") if fam.ty.is_none() => {
                    fam.ty = Some(OmType::parse(rest).ok_or(err("unknown type"))?);
                }
                Some("TYPE") => return Err(err("family typed twice")),
                Some("UNIT") => {}
                _ => return Err(err("unknown descriptor")),
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            return Err(err("neither a descriptor nor a sample"));
        }
        let name_end = line.find(['{', ' ']).ok_or(err("sample without a value"))?;
        let name = &line[..name_end];
        let (labels, rest) = if line[name_end..].starts_with('{') {
            let end = name_end + labels_end(&line[name_end..]).ok_or(err("unclosed labels"))?;
            (&line[name_end..end], &line[end..])
        } else {
            ("", &line[name_end..])
        };
        let rest = rest
            .strip_prefix(' ')
            .ok_or(err("no space before the value"))?;
        // Neither a value nor a timestamp holds '#': what follows " # " is an exemplar.
        let rest = rest.split_once(" # ").map_or(rest, |(v, _exemplar)| v);
        let mut fields = rest.split(' ');
        let value = fields
            .next()
            .filter(|v| !v.is_empty())
            .ok_or(err("no value"))?;
        let ts = fields.next();
        if fields.next().is_some() {
            return Err(err("trailing fields"));
        }
        let Some(fam) = family.as_mut() else {
            return Err(err("sample before any descriptor"));
        };
        let suffix = name
            .strip_prefix(fam.name)
            .ok_or(err("sample outside its family"))?;
        let Some(kind) = fam
            .ty()
            .sample(suffix)
            .ok_or(err("sample outside its family"))?
        else {
            continue;
        };
        fam.start(&mut out);
        let body = match kind {
            Kind::Main => &mut out,
            Kind::Bucket => &mut fam.split[0],
            Kind::GCount => &mut fam.split[1],
            Kind::GSum => &mut fam.split[2],
        };
        body.push_str(name);
        body.push_str(labels);
        body.push(' ');
        body.push_str(value);
        if let Some(ts) = ts {
            let secs: f64 = ts.parse().map_err(|_| err("bad timestamp"))?;
            let ms = (secs * 1000.0).round();
            if !ms.is_finite() || ms.abs() >= i64::MAX as f64 {
                return Err(err("bad timestamp"));
            }
            body.push(' ');
            body.push_str(&(ms as i64).to_string());
        }
        body.push('\n');
    }
    if let Some(done) = family.take() {
        done.flush(&mut out);
    }
    Ok(out)
}

#[cfg(test)]
#[path = "exposition_tests.rs"]
mod tests;
