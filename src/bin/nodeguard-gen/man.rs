//! The man pages (`docs/man/`), from the CLI's own clap definition (clap_mangen): `nodeguard.1`
//! and one page per subcommand, so a flag is never documented differently from how it parses.

use clap::CommandFactory;
use nodeguard::cli::{Cli, ENVIRONMENT};

pub const DIR: &str = "docs/man";

/// Roff text: a backslash and a hyphen escaped, no line starting with a control character.
fn roff_text(s: &str) -> String {
    let t = s.replace('\\', "\\e").replace('-', "\\-");
    if t.starts_with(['.', '\'']) {
        format!("\\&{t}")
    } else {
        t
    }
}

fn render(man: &clap_mangen::Man, top: bool) -> Result<String, String> {
    let mut out = Vec::new();
    let io = |e: std::io::Error| e.to_string();
    man.render_title(&mut out).map_err(io)?;
    man.render_name_section(&mut out).map_err(io)?;
    man.render_synopsis_section(&mut out).map_err(io)?;
    man.render_description_section(&mut out).map_err(io)?;
    man.render_options_section(&mut out).map_err(io)?;
    if top {
        man.render_subcommands_section(&mut out).map_err(io)?;
        out.extend_from_slice(b".SH ENVIRONMENT\n");
        for (name, what) in ENVIRONMENT {
            out.extend_from_slice(
                format!(".TP\n\\fB{}\\fR\n{}\n", roff_text(name), roff_text(what)).as_bytes(),
            );
        }
        out.extend_from_slice(b".SH \"SEE ALSO\"\n");
        let mut see = Vec::new();
        for sub in Cli::command().get_subcommands() {
            see.push(format!(
                "\\fBnodeguard\\-{}\\fR(1)",
                roff_text(sub.get_name())
            ));
        }
        out.extend_from_slice(format!("{}\n", see.join(", ")).as_bytes());
        // Only the top command carries a version (clap_mangen panics on a subcommand's).
        man.render_version_section(&mut out).map_err(io)?;
    }
    String::from_utf8(out).map_err(|e| e.to_string())
}

/// Every page: its path under the repository, and its text.
pub fn pages() -> Result<Vec<(String, String)>, String> {
    // `after_help` (the environment list) is rendered as its own ENVIRONMENT section instead.
    let mut cmd = Cli::command()
        .disable_help_subcommand(true)
        .after_help(None::<&str>);
    cmd.build();
    let mut pages = vec![(
        format!("{DIR}/nodeguard.1"),
        render(&clap_mangen::Man::new(cmd.clone()), true)?,
    )];
    for sub in cmd.get_subcommands() {
        let man = clap_mangen::Man::new(sub.clone());
        pages.push((
            format!("{DIR}/{}", man.get_filename()),
            render(&man, false)?,
        ));
    }
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_per_subcommand_and_the_environment_documented() {
        let pages = pages().unwrap();
        let names: Vec<&str> = pages.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "docs/man/nodeguard.1",
                "docs/man/nodeguard-check-config.1",
                "docs/man/nodeguard-default-config.1",
                "docs/man/nodeguard-breakers.1",
                "docs/man/nodeguard-release.1",
                "docs/man/nodeguard-status.1",
                "docs/man/nodeguard-completions.1",
            ]
        );
        let main = &pages[0].1;
        assert!(
            main.contains(".SH ENVIRONMENT\n.TP\n\\fBNODEGUARD_LOG\\fR\n"),
            "{main}"
        );
        assert!(!main.contains("EXTRA"), "{main}");
        assert!(pages[4].1.contains("\\-\\-no\\-wait"), "{}", pages[4].1);
    }

    /// `--check` compares the pages it generates; a page left from a removed subcommand is
    /// caught here.
    #[test]
    fn every_committed_page_is_generated() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(DIR);
        let generated: Vec<String> = pages().unwrap().into_iter().map(|(n, _)| n).collect();
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let rel = format!("{DIR}/{}", e.file_name().to_string_lossy());
            assert!(
                generated.contains(&rel),
                "{rel} is not generated any more: remove it"
            );
        }
    }
}
