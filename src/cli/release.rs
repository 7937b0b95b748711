//! `nodeguard release`: checks the target against what the agent holds (its state file), drops a
//! request into `<state dir>/release/`, and waits for the outcome the agent writes beside it.

use super::EXIT_USAGE;
use crate::action::breaker::BreakerState;
use crate::action::lock::{self, Holder};
use crate::action::state::{self, ReleaseOutcome, ReleaseRequest, ReleaseVerdict};
use crate::config::Config;
use crate::status::render::escape;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// No outcome in time: no agent took the request (withdrawn), or it took it and did not answer.
pub(crate) const EXIT_NO_ANSWER: u8 = 2;

/// How long to wait by default: three agent intervals (the request is read at the next tick),
/// at least 10 s (a slow tick on a loaded node).
pub(crate) fn default_wait(interval: Duration) -> Duration {
    (interval * 3).max(Duration::from_secs(10))
}

/// `namespace/pod/container`, or a unit name (namespace empty, pod and container the unit).
pub(crate) fn parse_target(workload: &str, rule: Option<String>) -> Result<ReleaseRequest, String> {
    let parts: Vec<&str> = workload.split('/').collect();
    let (namespace, pod, container) = match parts.as_slice() {
        [ns, pod, c] if !pod.is_empty() && !c.is_empty() => (*ns, *pod, *c),
        [unit] if !unit.is_empty() => ("", *unit, *unit),
        _ => {
            return Err(format!(
                "expected namespace/pod/container or a unit name, got {:?}",
                escape(workload)
            ))
        }
    };
    Ok(ReleaseRequest {
        namespace: namespace.into(),
        pod: pod.into(),
        container: container.into(),
        rule,
    })
}

fn shown(r: &ReleaseRequest) -> String {
    let t = if r.namespace.is_empty() {
        r.pod.clone()
    } else {
        format!("{}/{}/{}", r.namespace, r.pod, r.container)
    };
    let rule = r
        .rule
        .as_deref()
        .map_or_else(String::new, |n| format!(" (rule {})", escape(n)));
    format!("{}{rule}", escape(&t))
}

/// What the state file holds, one line each, with the command that releases it.
fn held_lines(held: &[state::PersistedBreaker]) -> String {
    let mut out = String::new();
    for b in held {
        let owner = if b.id.namespace.is_empty() {
            b.id.owner.clone()
        } else {
            format!("{}/{}/{}", b.id.namespace, b.id.owner, b.id.container)
        };
        let pod = if b.id.namespace.is_empty() {
            b.id.owner.clone()
        } else {
            format!("{}/{}/{}", b.id.namespace, b.pod, b.id.container)
        };
        out.push_str(&format!(
            "  {}  rule {}  {} {}  (nodeguard release {} --rule {})\n",
            escape(&pod),
            escape(&b.rule),
            match b.state {
                BreakerState::Open => "open",
                BreakerState::HalfOpen => "half-open",
            },
            b.action.as_str(),
            escape(&owner),
            escape(&b.rule),
        ));
    }
    out
}

pub(crate) fn run(c: &Config, req: ReleaseRequest, wait: Option<Duration>) -> ExitCode {
    let state_file = &c.guard.state_file;
    let held = match state::load(state_file) {
        Ok(Some(f)) => f.breakers,
        Ok(None) => Vec::new(),
        Err(e) => {
            eprintln!("nodeguard release: cannot read what the agent holds: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !held.iter().any(|b| req.matches(&b.id, &b.pod, &b.rule)) {
        if held.is_empty() {
            eprintln!(
                "nodeguard release: nothing matches {}: nothing is held on this node (state file {})",
                shown(&req),
                state_file.display()
            );
        } else {
            eprint!(
                "nodeguard release: nothing held matches {}; held on this node (state file {}):\n{}",
                shown(&req),
                state_file.display(),
                held_lines(&held)
            );
        }
        return ExitCode::FAILURE;
    }
    if agent_state(state_file) == "no agent is running" {
        eprintln!(
            "nodeguard release: no agent is running (state lock {} is free): the request is \
             applied only when one starts",
            lock::lock_path(state_file).display()
        );
    }
    let sent = match state::request_release(state_file, &req) {
        Ok(p) => p,
        Err(e) => {
            let dir = state::release_dir(state_file);
            eprintln!(
                "nodeguard release: cannot write the release request into {}: {e}; nothing was \
                 released. The agent reads releases from that directory only. Free it (or stop \
                 the agent: on SIGTERM it thaws everything it holds).",
                dir.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let Some(wait) = wait else {
        println!(
            "release of {} requested ({}); the agent applies it at its next tick",
            shown(&req),
            sent.display()
        );
        return ExitCode::SUCCESS;
    };
    let t0 = Instant::now();
    loop {
        match state::take_release_outcome(&sent) {
            Ok(Some(o)) => return report(&req, &o),
            Ok(None) => {}
            Err(e) => {
                eprintln!("nodeguard release: {e}");
                return ExitCode::FAILURE;
            }
        }
        if t0.elapsed() >= wait {
            return timed_out(&sent, &req, wait, &agent_state(state_file));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether an agent runs, as the state lock tells, in words.
fn agent_state(state_file: &Path) -> String {
    match lock::holder(state_file) {
        Ok(Holder::Agent { pid }) => format!("the agent, pid {pid}, did not answer"),
        Ok(Holder::Free) => "no agent is running".to_owned(),
        Err(e) => format!("the agent did not answer; {e}"),
    }
}

/// No outcome in time: the request is withdrawn if still there, so it is not applied by surprise
/// later.
fn timed_out(sent: &Path, req: &ReleaseRequest, wait: Duration, agent: &str) -> ExitCode {
    let wait = humantime::format_duration(wait);
    match std::fs::remove_file(sent) {
        Ok(()) => eprintln!(
            "nodeguard release: no outcome for the release of {} within {wait} ({agent}): \
             request withdrawn, nothing was released",
            shown(req)
        ),
        Err(_) => eprintln!(
            "nodeguard release: the agent took the release of {} but reported no outcome within \
             {wait}; see `nodeguard breakers`",
            shown(req)
        ),
    }
    ExitCode::from(EXIT_NO_ANSWER)
}

fn report(req: &ReleaseRequest, o: &ReleaseOutcome) -> ExitCode {
    match o.verdict {
        ReleaseVerdict::Released => {
            for b in &o.released {
                let t = if b.namespace.is_empty() {
                    b.container.clone()
                } else {
                    format!("{}/{}/{}", b.namespace, b.pod, b.container)
                };
                println!(
                    "released {}: rule {} ({}) undone",
                    escape(&t),
                    escape(&b.rule),
                    escape(&b.action)
                );
            }
            ExitCode::SUCCESS
        }
        ReleaseVerdict::NotHeld => {
            eprintln!(
                "nodeguard release: {} is not held any more (its hold ended, or it was released, \
                 before the agent read the request): nothing to do",
                shown(req)
            );
            ExitCode::FAILURE
        }
        ReleaseVerdict::Refused => {
            eprintln!(
                "nodeguard release: the agent refused the release of {}: {}",
                shown(req),
                escape(o.reason.as_deref().unwrap_or("no reason given"))
            );
            ExitCode::FAILURE
        }
    }
}

/// Usage errors of the target, as the other bad arguments.
pub(crate) fn usage(e: &str) -> ExitCode {
    eprintln!("nodeguard release: {e}");
    ExitCode::from(EXIT_USAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_or_are_refused() {
        assert_eq!(
            parse_target("feeds/backend/relay", None).unwrap(),
            ReleaseRequest {
                namespace: "feeds".into(),
                pod: "backend".into(),
                container: "relay".into(),
                rule: None
            }
        );
        let unit = parse_target("cron.service", Some("zombies".into())).unwrap();
        assert_eq!(
            (unit.pod.as_str(), unit.container.as_str()),
            ("cron.service", "cron.service")
        );
        for bad in ["", "a/b", "a//c", "a/b/", "a/b/c/d"] {
            assert!(parse_target(bad, None).is_err(), "{bad:?}");
        }
        assert!(parse_target("a/\u{1b}[2J", None)
            .unwrap_err()
            .contains("\\x1b[2J"));
    }

    #[test]
    fn the_default_wait_is_three_intervals_at_least_10s() {
        assert_eq!(
            default_wait(Duration::from_secs(1)),
            Duration::from_secs(10)
        );
        assert_eq!(
            default_wait(Duration::from_secs(5)),
            Duration::from_secs(15)
        );
    }
}
