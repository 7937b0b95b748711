//! `lines`: CRI log lines from a real runtime.

use std::io::Write;

/// `stdout_n` lines on stdout, `stderr_n` on stderr, then one stdout line of `long` bytes.
pub fn lines(stdout_n: u64, stderr_n: u64, long: usize) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    for i in 0..stdout_n {
        writeln!(out, "out line {i}")?;
    }
    out.flush()?;
    let mut err = std::io::stderr().lock();
    for i in 0..stderr_n {
        writeln!(err, "err line {i}")?;
    }
    err.flush()?;
    if long > 0 {
        let mut line = vec![b'x'; long];
        line.push(b'\n');
        out.write_all(&line)?;
        out.flush()?;
    }
    Ok(())
}
