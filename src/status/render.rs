//! The status screen. Every name that comes from a workload (namespace, pod, container, comm,
//! cgroup, reasons quoting them) is escaped: a control character is shown as `\xNN`, so an ESC
//! sequence in a pod name never reaches the terminal raw, and a bidi override or zero-width
//! character as `\u{NNNN}`, so a name cannot reorder or hide part of the line it sits in.

use super::{Column, Row, View};
use std::borrow::Cow;
use std::fmt::Write;

#[derive(Debug, Clone, Copy, Default)]
pub struct Style {
    /// ANSI colour (a terminal, and `NO_COLOR` unset).
    pub colour: bool,
    pub wide: bool,
    /// The terminal's columns: no line is longer (columns are shortened, elided or hidden to
    /// fit). `None` (not a terminal): every line whole.
    pub width: Option<usize>,
}

/// Control characters (C0, DEL, C1) as `\xNN`, and the invisible characters that change how a
/// line reads (see [`invisible`]) as `\u{NNNN}`; a `\` before them stays as it is.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if needs_escape(c) {
            let n = c as u32;
            if n < 0x100 {
                let _ = write!(out, "\\x{n:02x}");
            } else {
                let _ = write!(out, "\\u{{{n:04x}}}");
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control() || invisible(c)
}

/// Unicode format characters a terminal renders as nothing but that reorder or hide text
/// ("Trojan Source", CVE-2021-42574): bidi embeddings, overrides and isolates, the implicit
/// direction marks, zero-width spaces and joiners, the BOM, and the line/paragraph separators.
fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{061c}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2069}'
            | '\u{feff}'
    )
}

pub fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "Ki", "Mi", "Gi", "Ti"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b}B")
    } else if v < 10.0 {
        format!("{v:.1}{}", UNITS[u])
    } else {
        format!("{v:.0}{}", UNITS[u])
    }
}

/// `3m12s`, `1.2s`, `4h5m` (at most two units).
pub fn secs(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "-".into();
    }
    if s < 10.0 {
        return format!("{s:.1}s");
    }
    let t = s.round() as u64;
    let (d, h, m, sec) = (t / 86400, t / 3600 % 24, t / 60 % 60, t % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{sec}s"),
        (0, 0, _) => format!("{m}m{sec:02}s"),
        (0, _, _) => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h:02}h"),
    }
}

struct Paint(bool);

impl Paint {
    fn red(&self, s: &str) -> String {
        self.wrap("1;31", s)
    }
    fn yellow(&self, s: &str) -> String {
        self.wrap("1;33", s)
    }
    fn bold(&self, s: &str) -> String {
        self.wrap("1", s)
    }
    fn wrap(&self, code: &str, s: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_owned()
        }
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// One cell: its text, right-aligned or not, marked (past a rule's threshold) or not.
struct Cell {
    text: String,
    right: bool,
    marked: bool,
}

fn cells(r: &Row, wide: bool) -> Vec<Cell> {
    let m = |c: Column| r.marked.contains(&c);
    let num = |text: String, marked: bool| Cell {
        text: if marked { format!("{text}*") } else { text },
        right: true,
        marked,
    };
    let name = super::target(&r.namespace, &r.pod, &r.container);
    let mut name = escape(&name).into_owned();
    if r.stale {
        name.push('~');
    }
    let mut out = vec![
        Cell {
            text: name,
            right: false,
            marked: false,
        },
        num(
            match (r.working_set_bytes, r.limit_bytes) {
                (Some(w), Some(l)) => format!("{}/{}", bytes(w), bytes(l)),
                (Some(w), None) => format!("{}/-", bytes(w)),
                _ => "-".into(),
            },
            false,
        ),
        num(
            r.memory_percent
                .map_or_else(|| "-".into(), |p| format!("{p:.0}%")),
            m(Column::MemoryPercent),
        ),
        num(r.oom_kills.to_string(), false),
        num(r.restarts.to_string(), m(Column::Restarts)),
        num(
            r.log_lines_per_minute.to_string(),
            m(Column::LogLines) || (!wide && m(Column::StderrLines)),
        ),
        num(
            match (r.tcp, r.udp) {
                (None, None) => "-".into(),
                (t, u) => format!("{}/{}", opt(t), opt(u)),
            },
            m(Column::Tcp) || m(Column::Udp),
        ),
        num(opt(r.zombies), m(Column::Zombies)),
        num(opt(r.conntrack), m(Column::Conntrack)),
    ];
    if wide {
        out.push(num(
            r.stderr_lines_per_minute.to_string(),
            m(Column::StderrLines),
        ));
        out.push(num(opt(r.processes), false));
        out.push(Cell {
            text: escape(r.qos.as_deref().unwrap_or(&r.kind)).into_owned(),
            right: false,
            marked: false,
        });
    }
    out
}

/// Headers, and their short forms for a narrow terminal.
const HEAD: [(&str, &str); 12] = [
    ("WORKLOAD", "WORKLOAD"),
    ("MEM/LIMIT", "MEM/LIM"),
    ("MEM%", "MEM%"),
    ("OOM", "OOM"),
    ("RESTARTS", "RST"),
    ("LOG/MIN", "LOG/M"),
    ("TCP/UDP", "TCP/UDP"),
    ("ZOMBIES", "ZOMB"),
    ("CONNTRACK", "CT"),
    ("STDERR/MIN", "ERR/M"),
    ("PROCS", "PROCS"),
    ("QOS", "QOS"),
];
/// Hidden first when even short headers and an elided name do not fit (a column with a cell
/// past a threshold is never hidden): the wide extras, then the rarer symptoms.
const HIDE_ORDER: [usize; 11] = [11, 10, 9, 3, 8, 4, 6, 7, 5, 2, 1];
/// The name is elided down to this before any column is hidden.
const MIN_NAME: usize = 20;

/// `s` in at most `w` columns, its middle elided (the container name at the end stays).
fn elide(s: &str, w: usize) -> String {
    let n = s.chars().count();
    if n <= w {
        return s.to_owned();
    }
    if w == 0 {
        return String::new();
    }
    let head = (w - 1) / 2;
    let tail = w - 1 - head;
    let mut out: String = s.chars().take(head).collect();
    out.push('\u{2026}');
    out.extend(s.chars().skip(n - tail));
    out
}

/// The table, and the headers of the columns hidden to fit the width.
fn table(rows: &[Row], style: Style, paint: &Paint) -> (String, Vec<&'static str>) {
    let n = if style.wide { 12 } else { 9 };
    let body: Vec<Vec<Cell>> = rows.iter().map(|r| cells(r, style.wide)).collect();
    let natural = |i: usize, short: bool| {
        let h = if short { HEAD[i].1 } else { HEAD[i].0 };
        body.iter()
            .map(|c| c[i].text.chars().count())
            .chain([h.len()])
            .max()
            .unwrap_or(0)
    };
    let rest = |shown: &[usize], short: bool| -> usize {
        shown[1..].iter().map(|&i| natural(i, short) + 2).sum()
    };
    let mut shown: Vec<usize> = (0..n).collect();
    let mut short = false;
    let mut name_w = natural(0, false);
    let mut hidden = Vec::new();
    if let Some(w) = style.width {
        // The name is elided first, then the headers shortened, then columns hidden.
        let least = name_w.min(MIN_NAME);
        short = least + rest(&shown, false) > w;
        for &d in HIDE_ORDER.iter().filter(|&&d| d < n) {
            if least + rest(&shown, short) <= w {
                break;
            }
            if !body.iter().any(|c| c[d].marked) {
                shown.retain(|&i| i != d);
                hidden.push(HEAD[d].0);
            }
        }
        name_w = name_w.min(w.saturating_sub(rest(&shown, short)).max(least.min(w)));
    }
    let widths: Vec<usize> = (0..n)
        .map(|i| if i == 0 { name_w } else { natural(i, short) })
        .collect();
    let mut out = String::new();
    let line: Vec<String> = shown
        .iter()
        .map(|&i| {
            let h = if short { HEAD[i].1 } else { HEAD[i].0 };
            if i == 0 {
                format!("{h:<w$}", w = widths[i])
            } else {
                format!("{h:>w$}", w = widths[i])
            }
        })
        .collect();
    out.push_str(&paint.bold(line.join("  ").trim_end()));
    out.push('\n');
    for row in &body {
        let line: Vec<String> = shown
            .iter()
            .map(|&i| {
                let c = &row[i];
                let text = if i == 0 {
                    elide(&c.text, widths[i])
                } else {
                    c.text.clone()
                };
                let pad = widths[i].saturating_sub(text.chars().count());
                let padded = if c.right {
                    format!("{}{}", " ".repeat(pad), text)
                } else {
                    format!("{}{}", text, " ".repeat(pad))
                };
                if c.marked {
                    paint.red(&padded)
                } else {
                    padded
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    (out, hidden)
}

/// Columns `line` takes on a terminal: its characters less our own SGR sequences (every other
/// ESC was escaped before).
fn columns(line: &str) -> usize {
    let mut n = 0;
    let mut in_sgr = false;
    for c in line.chars() {
        match (in_sgr, c) {
            (false, '\x1b') => in_sgr = true,
            (true, 'm') => in_sgr = false,
            (true, _) => {}
            (false, _) => n += 1,
        }
    }
    n
}

/// `line` cut to `w` columns, ending with an ellipsis when cut; a colour open at the cut is
/// closed.
fn fit(line: &str, w: usize) -> String {
    if columns(line) <= w {
        return line.to_owned();
    }
    let mut out = String::new();
    let (mut n, mut in_sgr, mut coloured) = (0, false, false);
    for c in line.chars() {
        if in_sgr {
            out.push(c);
            in_sgr = c != 'm';
            continue;
        }
        if c == '\x1b' {
            in_sgr = true;
            coloured = true;
            out.push(c);
            continue;
        }
        if n + 1 >= w {
            break;
        }
        out.push(c);
        n += 1;
    }
    if w > 0 {
        out.push('\u{2026}');
    }
    if coloured {
        out.push_str("\x1b[0m");
    }
    out
}

/// The whole screen.
pub fn text(v: &View, style: Style) -> String {
    let p = Paint(style.colour);
    let mut o = String::new();
    let mode = match v.mode {
        "ENFORCING" => p.red("ENFORCING"),
        m => p.yellow(m),
    };
    let node = if v.node.is_empty() {
        String::new()
    } else {
        format!(" on {}", escape(&v.node))
    };
    let tick = v.last_tick_age_seconds.map_or_else(
        || "no tick yet".to_owned(),
        |a| format!("last tick {} ago", secs(a)),
    );
    let _ = writeln!(
        o,
        "{}{node}  {mode}  config {}  up {}  {tick}",
        p.bold("nodeguard"),
        escape(&v.config.hash),
        secs(v.uptime_seconds),
    );
    let c = &v.config;
    let mut cfg = format!(
        "config: {}, {} reload{}, {} refused",
        escape(c.file.as_deref().unwrap_or("embedded defaults")),
        c.reloads_total,
        if c.reloads_total == 1 { "" } else { "s" },
        c.reload_failures_total
    );
    if !c.last_reload_ok {
        cfg.push_str(&format!(
            ", {}",
            p.red("LAST RELOAD REFUSED (old config kept)")
        ));
    }
    if !c.restart_required.is_empty() {
        let keys: Vec<String> = c
            .restart_required
            .iter()
            .map(|k| escape(k).into_owned())
            .collect();
        cfg.push_str(&format!(", restart needed for: {}", keys.join(", ")));
    }
    let _ = writeln!(o, "{cfg}");
    let samplers: Vec<String> = v
        .samplers
        .iter()
        .map(|s| {
            let name = escape(&s.name);
            let age = s.age_seconds.map_or_else(|| "never".into(), secs);
            match (s.enabled, s.fresh) {
                (false, _) => format!("{name} off"),
                (true, true) => format!("{name} {age}"),
                (true, false) => p.red(&format!("{name} STALE {age}")),
            }
        })
        .collect();
    let _ = writeln!(o, "samplers: {}", samplers.join(", "));
    if !v.features_off.is_empty() {
        let f: Vec<String> = v
            .features_off
            .iter()
            .map(|f| match &f.reason {
                Some(r) => format!("{} ({})", escape(&f.name), escape(r)),
                None => escape(&f.name).into_owned(),
            })
            .collect();
        let _ = writeln!(o, "features off: {}", f.join("; "));
    }
    if let Some(why) = &v.not_owner {
        let _ = writeln!(
            o,
            "{}",
            p.red(&format!(
                "guard: NOT the owner, acts on nothing: {}",
                escape(why)
            ))
        );
    } else if v.state_durable == Some(false) {
        let _ = writeln!(
            o,
            "{}",
            p.red("guard: state file NOT durable, no new hold is applied")
        );
    }
    if v.thaws_pending > 0 {
        let _ = writeln!(
            o,
            "{}",
            p.red(&format!(
                "guard: {} thaws failing, retried every tick",
                v.thaws_pending
            ))
        );
    }
    let n = &v.node_line;
    let ct = match (n.conntrack_entries, n.conntrack_limit) {
        (Some(e), Some(l)) if l > 0 => {
            format!("{e}/{l} ({:.1}%)", e as f64 * 100.0 / l as f64)
        }
        (Some(e), _) => format!("{e}/-"),
        _ => "-".into(),
    };
    let pc = &n.pacing;
    let cool = if pc.cooldown_remaining_seconds > 0.0 {
        format!("cool-down {} left", secs(pc.cooldown_remaining_seconds))
    } else {
        "no cool-down".into()
    };
    let mut node_line = format!(
        "node: conntrack {ct}  zombies {}  actions {}/{} in 10m, {} left, {cool}",
        n.zombies,
        pc.actions_last_10m,
        pc.max_actions_per_10m,
        pc.max_actions_per_10m.saturating_sub(pc.actions_last_10m),
    );
    if !n.marked.is_empty() {
        let r: Vec<String> = n.marked.iter().map(|r| escape(r).into_owned()).collect();
        node_line.push_str(&format!("  {}", p.red(&format!("past: {}*", r.join(", ")))));
    }
    let _ = writeln!(o, "{node_line}");
    o.push('\n');
    let (tab, hidden) = table(&v.workloads, style, &p);
    o.push_str(&tab);
    if !hidden.is_empty() {
        let _ = writeln!(o, "(hidden to fit: {}; -o json has all)", hidden.join(", "));
    }
    if v.workloads.len() < v.workloads_total {
        let _ = writeln!(
            o,
            "({} of {} workloads shown)",
            v.workloads.len(),
            v.workloads_total
        );
    }
    o.push('\n');
    if v.pending.is_empty() {
        let _ = writeln!(o, "pending: none");
    } else {
        let _ = writeln!(
            o,
            "{}",
            p.yellow(&format!("pending ({}):", v.pending.len()))
        );
        for x in &v.pending {
            let of = x
                .for_seconds
                .map_or_else(String::new, |f| format!(" / for {}", secs(f)));
            let _ = writeln!(
                o,
                "  {}  {}  held {}{of}",
                escape(&x.rule),
                escape(&x.target),
                secs(x.held_seconds)
            );
        }
    }
    if v.breakers.is_empty() {
        let _ = writeln!(o, "breakers: none");
    } else {
        let _ = writeln!(o, "{}", p.red(&format!("breakers ({}):", v.breakers.len())));
        for b in &v.breakers {
            let hold = match (b.state.as_str(), b.hold_remaining_seconds) {
                ("open", Some(s)) => format!("hold {} left", secs(s)),
                ("open", None) => "held until a new revision".into(),
                _ => "half-open (probation)".into(),
            };
            let would = if b.would_act {
                "  (dry run: would act)"
            } else {
                ""
            };
            let _ = writeln!(
                o,
                "  {}  {}  {}  {}  {hold}{would}\n    {}",
                escape(&super::target(&b.namespace, &b.pod, &b.container)),
                escape(&b.rule),
                escape(&b.state),
                escape(&b.action),
                escape(&b.reason)
            );
        }
    }
    match style.width {
        Some(w) => o.lines().flat_map(|l| wrap(l, w)).collect(),
        None => o,
    }
}

/// A line too long for `w` columns, broken where it separates its parts (two spaces, or a
/// list's `, `) into indented continuation lines, so nothing is lost (the node line's `past:`
/// comes last); a part longer than a whole line is cut. Each returned line ends with a newline.
fn wrap(line: &str, w: usize) -> Vec<String> {
    const INDENT: &str = "    ";
    if columns(line) <= w {
        return vec![format!("{line}\n")];
    }
    // Parts with the separator that precedes them (a list's comma stays on the left).
    let mut parts: Vec<(&str, &str)> = Vec::new();
    for (i, chunk) in line.split("  ").enumerate() {
        for (j, p) in chunk.split_inclusive(", ").enumerate() {
            let sep = match (i, j) {
                (0, 0) => "",
                (_, 0) => "  ",
                _ => " ",
            };
            parts.push((
                sep,
                p.strip_suffix(' ')
                    .filter(|_| p.ends_with(", "))
                    .unwrap_or(p),
            ));
        }
    }
    let mut out = Vec::new();
    let mut cur = String::new();
    for (sep, part) in parts {
        if !cur.trim().is_empty() && columns(&cur) + sep.len() + columns(part) > w {
            out.push(fit(&cur, w) + "\n");
            cur = format!("{INDENT}{part}");
        } else {
            cur.push_str(sep);
            cur.push_str(part);
        }
    }
    out.push(fit(&cur, w) + "\n");
    out
}
