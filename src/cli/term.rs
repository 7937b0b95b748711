//! The terminal `status` draws on: its size, and `--watch`'s screen (the alternate screen,
//! restored on exit and on SIGINT/SIGTERM).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

/// Columns and rows of stdout's terminal; `None` when stdout is not a terminal (a pipe or a file
/// gets every line whole). `COLUMNS`/`LINES` win over the kernel's size, as for `ls`.
pub(crate) fn size() -> Option<(usize, usize)> {
    let out = std::io::stdout();
    if !out.is_terminal() {
        return None;
    }
    let ws = rustix::termios::tcgetwinsize(&out).ok();
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| (1..=10_000).contains(n))
    };
    let cols = env("COLUMNS").or(ws.map(|w| usize::from(w.ws_col)).filter(|c| *c > 0));
    let rows = env("LINES").or(ws.map(|w| usize::from(w.ws_row)).filter(|r| *r > 0));
    // A terminal that reports no size (a bare pty) is drawn as if unbounded.
    Some((cols?, rows.unwrap_or(usize::MAX)))
}

/// Enter the alternate screen and hide the cursor; leave and show it again.
pub(crate) const ENTER: &str = "\x1b[?1049h\x1b[?25l";
pub(crate) const LEAVE: &str = "\x1b[?25h\x1b[?1049l";

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: nix::libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// SIGINT and SIGTERM end the watch through [`stopped`] instead of killing the process, so the
/// terminal is given back as it was.
pub(crate) fn catch_stop() -> nix::Result<()> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let act = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for s in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { sigaction(s, &act) }?;
    }
    Ok(())
}

pub(crate) fn stopped() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// One frame redrawn in place: cursor home, each line cleared before it is drawn (so a line as
/// wide as the terminal keeps its last column), the rows below cleared. At most `rows` lines,
/// never a newline on the last row (it would scroll): a longer screen ends with how many lines
/// did not fit, so the header never scrolls away.
pub(crate) fn frame(screen: &str, rows: usize) -> String {
    let lines: Vec<&str> = screen.lines().collect();
    let rows = rows.max(1);
    let mut items: Vec<String> = Vec::new();
    if lines.len() <= rows {
        items.extend(lines.iter().map(|l| (*l).to_owned()));
    } else {
        items.extend(lines[..rows - 1].iter().map(|l| (*l).to_owned()));
        items.push(format!("... {} more lines", lines.len() - (rows - 1)));
    }
    let mut out = String::from("\x1b[H");
    for (i, l) in items.iter().enumerate() {
        out.push_str("\x1b[K");
        out.push_str(l);
        if i + 1 < items.len() {
            out.push_str("\r\n");
        }
    }
    if items.len() < rows {
        out.push_str("\r\n\x1b[J");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_drawn_in_place_and_cut_to_the_rows() {
        assert_eq!(frame("a\nb\n", 5), "\x1b[H\x1b[Ka\r\n\x1b[Kb\r\n\x1b[J");
        // Exactly the rows: no newline after the last, nothing below to clear.
        assert_eq!(frame("a\nb\n", 2), "\x1b[H\x1b[Ka\r\n\x1b[Kb");
        assert_eq!(
            frame("a\nb\nc\nd\n", 3),
            "\x1b[H\x1b[Ka\r\n\x1b[Kb\r\n\x1b[K... 2 more lines"
        );
    }
}
