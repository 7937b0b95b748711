//! The breaker state file: written atomically on every transition, read back at start so holds
//! survive an agent restart (and frozen cgroups of expired holds get thawed).

pub use super::breaker::{ActedCgroup, Limited};
use super::breaker::{BreakerId, BreakerState};
use crate::error::{ParseError, ReadError};
use crate::fsio::{self, Reader, RegularFileError};
use crate::model::ActionKind;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistedBreaker {
    pub id: BreakerId,
    pub rule: String,
    pub action: ActionKind,
    pub state: BreakerState,
    pub pod: String,
    pub revision: String,
    pub reason: String,
    pub value: f64,
    pub threshold: f64,
    /// Unix seconds.
    pub since: f64,
    pub hold_until: Option<f64>,
    pub probation_until: Option<f64>,
    pub hold_seconds: f64,
    pub trips: u64,
    pub acted: Vec<ActedCgroup>,
    #[serde(default)]
    pub spared_pods: Vec<String>,
    /// Limits the breaker set (restored on release, re-applied at start while due).
    #[serde(default)]
    pub limited: Vec<Limited>,
    /// The ladder's step in force.
    #[serde(default)]
    pub step: usize,
    #[serde(default)]
    pub evidence: Option<crate::model::Evidence>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StateFile {
    pub version: u32,
    pub saved_at: f64,
    pub breakers: Vec<PersistedBreaker>,
    /// Every cgroup the agent froze and has not thawed yet, written before each freeze: after a
    /// crash, whatever is listed here and held by no breaker is thawed.
    #[serde(default)]
    pub frozen: Vec<ActedCgroup>,
    /// Every limit the agent set and has not restored, written before each write: after a
    /// crash, whatever is listed here and held by no breaker is restored.
    #[serde(default)]
    pub limits: Vec<Limited>,
}

pub const VERSION: u32 = 1;

/// Unix seconds a persisted instant may take: 1970 to ~5138. Anything else was not written by
/// us, and must not reach `Instant` arithmetic.
const MAX_UNIX: f64 = 1e11;
/// Longest hold a state file may carry: ten years (config caps every duration far below).
const MAX_HOLD_SECONDS: f64 = 10.0 * 366.0 * 86400.0;

fn check(field: &str, v: f64, lo: f64, hi: f64) -> Result<(), ParseError> {
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(())
    } else {
        Err(ParseError::new(format!(
            "{field} = {v} is outside {lo}..={hi}"
        )))
    }
}

impl StateFile {
    /// Every number is range-checked before anything is computed from it.
    fn validate(&self) -> Result<(), ParseError> {
        if self.version != VERSION {
            return Err(ParseError::new(format!(
                "unsupported state version {}",
                self.version
            )));
        }
        check("saved_at", self.saved_at, 0.0, MAX_UNIX)?;
        for (i, b) in self.breakers.iter().enumerate() {
            let f = |name: &str| format!("breakers[{i}].{name}");
            check(&f("since"), b.since, 0.0, MAX_UNIX)?;
            if let Some(t) = b.hold_until {
                check(&f("hold_until"), t, 0.0, MAX_UNIX)?;
            }
            if let Some(t) = b.probation_until {
                check(&f("probation_until"), t, 0.0, MAX_UNIX)?;
            }
            check(&f("hold_seconds"), b.hold_seconds, 0.0, MAX_HOLD_SECONDS)?;
            check(&f("value"), b.value, f64::MIN, f64::MAX)?;
            check(&f("threshold"), b.threshold, f64::MIN, f64::MAX)?;
        }
        Ok(())
    }
}

pub fn parse(text: &str) -> Result<StateFile, ParseError> {
    let s: StateFile = serde_json::from_str(text).map_err(|e| ParseError::new(e.to_string()))?;
    s.validate()?;
    Ok(s)
}

/// The cgroups a state file says we froze, read leniently from a file that does not parse as a
/// whole (out-of-range numbers, a newer version): enough to thaw them, nothing more.
pub fn salvage_acted(text: &str) -> Vec<ActedCgroup> {
    salvage(text, "acted", "frozen")
}

/// The limits a state file says we set, read as leniently as [`salvage_acted`].
pub fn salvage_limits(text: &str) -> Vec<Limited> {
    salvage(text, "limited", "limits")
}

/// Every record that still reads as a `T` in the breakers' `per_breaker` lists and the file's
/// `ledger` list of a state file's JSON.
fn salvage<T: serde::de::DeserializeOwned>(text: &str, per_breaker: &str, ledger: &str) -> Vec<T> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new();
    };
    let lists = v
        .get("breakers")
        .and_then(|b| b.as_array())
        .into_iter()
        .flatten()
        .filter_map(|b| b.get(per_breaker))
        .chain(v.get(ledger));
    lists
        .filter_map(|l| l.as_array())
        .flatten()
        .filter_map(|a| serde_json::from_value::<T>(a.clone()).ok())
        .collect()
}

/// `Ok(None)` when there is no state file yet.
pub fn load(path: &Path) -> Result<Option<StateFile>, ReadError> {
    match read_text(path) {
        Ok(text) => parse(&text)
            .map(Some)
            .map_err(|e| ReadError::parse(path, e)),
        Err(e) if e.is_gone() => Ok(None),
        Err(e) => Err(ReadError::io(path, std::io::Error::other(e))),
    }
}

/// The state file's text: a regular file only, opened without blocking (a FIFO planted in its
/// place must not hang the start or a tick), bounded.
pub(crate) fn read_text(path: &Path) -> Result<String, RegularFileError> {
    fsio::read_regular_text(path, MAX_STATE_BYTES, Reader::State)
}

/// Moves an unreadable state file aside (never overwritten by the next save) and returns where.
pub fn quarantine(path: &Path, unix_now: u64) -> std::io::Result<PathBuf> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state");
    let aside = path.with_file_name(format!("{name}.corrupt-{unix_now}"));
    std::fs::rename(path, &aside)?;
    Ok(aside)
}

/// Write to a temp file beside it, fsync, rename over, fsync the directory: a crash leaves the
/// old or the new file, never half of one. The temp file's name is unique to this writer (pid and
/// a sequence number), created exclusively and without following symlinks, so neither a second
/// writer nor a link planted beside it can redirect or interleave the write.
pub fn save(path: &Path, state: &StateFile) -> std::io::Result<()> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        "{}{}.{}",
        temp_prefix(path),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = serde_json::to_vec_pretty(state)
        .map_err(std::io::Error::other)
        .and_then(|body| write_new(&tmp, &body, true))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        // A full disk must not also fill up with our half-written temp files.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Writes a new file exclusively (never one that exists, never through a link), fsynced when
/// asked: the temp files of the state and of release requests.
fn write_new(path: &Path, body: &[u8], sync: bool) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)?;
    f.write_all(body)?;
    if sync {
        f.sync_all()?;
    }
    Ok(())
}

/// `.<name>.tmp.`: what every temp file of `path` starts with.
fn temp_prefix(path: &Path) -> String {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("state");
    format!(".{name}.tmp.")
}

/// Temp files of writers that died before their rename; called by the lock's new holder, the
/// only writer there is. Unlink never follows a link.
pub fn remove_stale_temps(path: &Path) {
    let dir = path.parent().unwrap_or(Path::new("."));
    let prefix = temp_prefix(path);
    let legacy = prefix.trim_end_matches('.').to_owned();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) || *name == legacy {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Larger than any state file we write (a breaker is ~1 KiB; breakers are bounded by rules and
/// workloads).
const MAX_STATE_BYTES: u64 = 64 << 20;
/// A release request is one small JSON object.
const MAX_RELEASE_BYTES: u64 = 64 << 10;

/// A hand release, dropped by `nodeguard release` into `<state dir>/release/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRequest {
    pub namespace: String,
    /// Pod name or owner name (or unit name on a plain host).
    pub pod: String,
    pub container: String,
    /// Only this rule's breaker; all of the workload's when absent.
    pub rule: Option<String>,
}

pub fn release_dir(state_path: &Path) -> PathBuf {
    state_path
        .parent()
        .unwrap_or(Path::new("."))
        .join("release")
}

pub fn request_release(state_path: &Path, req: &ReleaseRequest) -> std::io::Result<PathBuf> {
    let dir = release_dir(state_path);
    std::fs::create_dir_all(&dir)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let path = dir.join(format!("{nanos}-{}.json", std::process::id()));
    let tmp = dir.join(format!(".{nanos}-{}.tmp", std::process::id()));
    let written = serde_json::to_vec(req)
        .map_err(std::io::Error::other)
        .and_then(|body| write_new(&tmp, &body, false))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        // Nothing half-written is left for the agent (or a full disk) to keep.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(path)
}

/// Takes every pending release request (and removes its file); a request that cannot be read is
/// taken too, as refused, so its sender hears why.
pub fn take_releases(state_path: &Path) -> Vec<TakenRelease> {
    let dir = release_dir(state_path);
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let p = e.path();
        match p.extension().and_then(|x| x.to_str()) {
            Some("json") => {}
            Some("outcome") => {
                prune_outcome(&p);
                continue;
            }
            _ => continue,
        }
        let request = match fsio::read_regular_text(&p, MAX_RELEASE_BYTES, Reader::State)
            .map(|t| serde_json::from_str::<ReleaseRequest>(&t))
        {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => {
                tracing::warn!(path = %p.display(), error = %e, "ignoring a malformed release request");
                Err(format!("malformed request: {e}"))
            }
            Err(e) => {
                tracing::warn!(path = %p.display(), error = %e, "cannot read a release request");
                Err(format!("unreadable request: {e}"))
            }
        };
        if let Err(e) = std::fs::remove_file(&p) {
            tracing::warn!(path = %p.display(), error = %e, "cannot remove a release request");
        }
        out.push(TakenRelease { path: p, request });
    }
    out
}

/// One request taken from the release directory.
#[derive(Debug, Clone, PartialEq)]
pub struct TakenRelease {
    /// Where it was: its outcome is written beside it ([`outcome_path`]).
    pub path: PathBuf,
    pub request: Result<ReleaseRequest, String>,
}

/// What the agent did with a release request, written beside it for `nodeguard release`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseOutcome {
    pub verdict: ReleaseVerdict,
    /// The breakers released (their holds undone; a failed thaw is retried every tick).
    #[serde(default)]
    pub released: Vec<ReleasedBreaker>,
    /// Why it was refused.
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseVerdict {
    Released,
    /// Nothing matched when the agent read it: the hold ended (or was released) in between.
    NotHeld,
    Refused,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleasedBreaker {
    pub rule: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub action: String,
}

impl ReleaseRequest {
    /// The breaker of `id` (its pod now `pod`) under `rule` is one this request releases. The
    /// agent and the CLI's check before sending both use this.
    pub fn matches(&self, id: &BreakerId, pod: &str, rule: &str) -> bool {
        id.namespace == self.namespace
            && (id.owner == self.pod || pod == self.pod)
            && id.container == self.container
            && self.rule.as_deref().is_none_or(|r| r == rule)
    }
}

/// `<request>.outcome`: inside the release directory, whatever the request was named.
pub fn outcome_path(request: &Path) -> PathBuf {
    request.with_extension("outcome")
}

/// Outcomes nobody read (`release --no-wait`, a CLI that gave up) are removed after this.
const OUTCOME_KEEP: std::time::Duration = std::time::Duration::from_secs(600);

fn prune_outcome(p: &Path) {
    let old = std::fs::symlink_metadata(p)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_none_or(|age| age > OUTCOME_KEEP);
    if old {
        let _ = std::fs::remove_file(p);
    }
}

/// Writes a request's outcome atomically (temp file, rename) beside it. The release directory
/// must be a real directory: a link there is not followed out of the state directory.
pub fn write_release_outcome(request: &Path, outcome: &ReleaseOutcome) -> std::io::Result<()> {
    let dir = request.parent().unwrap_or(Path::new("."));
    if !std::fs::symlink_metadata(dir)?.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    let path = outcome_path(request);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("x");
    let tmp = dir.join(format!(".{name}.tmp"));
    let written = serde_json::to_vec(outcome)
        .map_err(std::io::Error::other)
        .and_then(|body| write_new(&tmp, &body, false))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The outcome of the request sent to `request`, once the agent wrote it (then removed: it is
/// read once). `Ok(None)` while there is none.
pub fn take_release_outcome(request: &Path) -> Result<Option<ReleaseOutcome>, ReadError> {
    let path = outcome_path(request);
    match fsio::read_regular_text(&path, MAX_RELEASE_BYTES, Reader::State) {
        Ok(text) => {
            let o = serde_json::from_str(&text)
                .map_err(|e| ReadError::parse(&path, ParseError::new(e.to_string())))?;
            let _ = std::fs::remove_file(&path);
            Ok(Some(o))
        }
        Err(e) if e.is_gone() => Ok(None),
        Err(e) => Err(ReadError::io(&path, std::io::Error::other(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_atomic_replace() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        assert_eq!(load(&path).unwrap(), None);
        let s = StateFile {
            version: VERSION,
            saved_at: 1.5,
            breakers: vec![PersistedBreaker {
                id: BreakerId {
                    namespace: "feeds".into(),
                    owner: "backend".into(),
                    container: "relay".into(),
                },
                rule: "log-flood".into(),
                action: ActionKind::Freeze,
                state: BreakerState::Open,
                pod: "backend-7d9f8b6c4d-x2k4q".into(),
                revision: "7d9f8b6c4d".into(),
                reason: "log_lines_per_minute 1900 > 600 for 60s".into(),
                value: 1900.0,
                threshold: 600.0,
                since: 100.0,
                hold_until: Some(1000.0),
                probation_until: None,
                hold_seconds: 900.0,
                trips: 1,
                acted: vec![ActedCgroup {
                    cgroup: "/kubepods/x".into(),
                    inode: 42,
                }],
                spared_pods: vec!["backend-7d9f8b6c4d-bbbbb".into()],
                limited: vec![Limited {
                    cgroup: ActedCgroup {
                        cgroup: "/kubepods/x".into(),
                        inode: 43,
                    },
                    knob: super::super::breaker::Knob::PidsMax,
                    value: "12".into(),
                    previous: "max".into(),
                }],
                step: 1,
                evidence: None,
            }],
            frozen: vec![],
            limits: vec![],
        };
        save(&path, &s).unwrap();
        assert_eq!(load(&path).unwrap(), Some(s.clone()));
        save(
            &path,
            &StateFile {
                version: VERSION,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(load(&path).unwrap().unwrap().breakers.len(), 0);
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1,
            "no temp file left"
        );
        std::fs::write(&path, "{not json").unwrap();
        assert!(matches!(load(&path), Err(ReadError::Parse { .. })));
    }

    #[test]
    fn a_link_planted_at_a_temp_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let path = dir.path().join("state.json");
        // The names this writer would use next, and the old fixed one.
        let pid = std::process::id();
        let mut planted = vec![dir.path().join(".state.json.tmp")];
        planted.extend((0..64).map(|i| dir.path().join(format!(".state.json.tmp.{pid}.{i}"))));
        for p in &planted {
            std::os::unix::fs::symlink(&victim, p).unwrap();
        }
        let s = StateFile {
            version: VERSION,
            ..Default::default()
        };
        // Refused (the name exists) rather than followed.
        let _ = save(&path, &s);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        // The lock's new holder clears them: links, never their targets.
        remove_stale_temps(&path);
        assert!(planted
            .iter()
            .all(|p| std::fs::symlink_metadata(p).is_err()));
        save(&path, &s).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(load(&path).unwrap(), Some(s));
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
    }

    #[test]
    fn a_fifo_in_place_of_the_state_file_or_a_release_request_never_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = load(&path).unwrap_err();
        assert!(e.to_string().contains("regular"), "{e}");
        let rel = release_dir(&path);
        std::fs::create_dir_all(&rel).unwrap();
        nix::unistd::mkfifo(&rel.join("1-1.json"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let taken = take_releases(&path);
        assert_eq!(taken.len(), 1);
        assert!(taken[0].request.as_ref().unwrap_err().contains("regular"));
        assert!(
            !rel.join("1-1.json").exists(),
            "taken away, not left to block again"
        );
    }

    #[test]
    fn numbers_out_of_range_are_refused_but_the_frozen_cgroups_are_salvaged() {
        let good = r#"{"version":1,"saved_at":100.0,"breakers":[{"id":{"namespace":"n","owner":"o","container":"c"},"rule":"r","action":"freeze","state":"open","pod":"p","revision":"v","reason":"x","value":1.0,"threshold":0.5,"since":SINCE,"hold_until":UNTIL,"probation_until":null,"hold_seconds":HOLD,"trips":1,"acted":[{"cgroup":"/kubepods/x","inode":7}]}]}"#;
        let make = |since: &str, until: &str, hold: &str| {
            good.replace("SINCE", since)
                .replace("UNTIL", until)
                .replace("HOLD", hold)
        };
        assert!(parse(&make("50.0", "1000.0", "900.0")).is_ok());
        for (since, until, hold, field) in [
            ("50.0", "1e300", "900.0", "hold_until"),
            ("-1e308", "1000.0", "900.0", "since"),
            ("50.0", "1000.0", "1e300", "hold_seconds"),
            ("50.0", "1000.0", "-1.0", "hold_seconds"),
        ] {
            let text = make(since, until, hold);
            let e = parse(&text).unwrap_err();
            assert!(e.0.contains(field), "{e}");
            assert_eq!(
                salvage_acted(&text),
                vec![ActedCgroup {
                    cgroup: "/kubepods/x".into(),
                    inode: 7
                }]
            );
        }
        assert!(salvage_acted("{not json").is_empty());
    }

    #[test]
    fn release_requests_are_taken_once() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state.json");
        let req = ReleaseRequest {
            namespace: "feeds".into(),
            pod: "backend".into(),
            container: "relay".into(),
            rule: None,
        };
        let sent = request_release(&state, &req).unwrap();
        assert_eq!(
            take_releases(&state),
            vec![TakenRelease {
                path: sent.clone(),
                request: Ok(req)
            }]
        );
        assert!(take_releases(&state).is_empty());
        // Its outcome, written beside it, is read once; a link in the release dir's place is
        // not written through.
        assert_eq!(take_release_outcome(&sent).unwrap(), None);
        let o = ReleaseOutcome {
            verdict: ReleaseVerdict::NotHeld,
            released: vec![],
            reason: None,
        };
        write_release_outcome(&sent, &o).unwrap();
        assert!(take_releases(&state).is_empty(), "a fresh outcome is kept");
        assert_eq!(take_release_outcome(&sent).unwrap(), Some(o.clone()));
        assert_eq!(take_release_outcome(&sent).unwrap(), None);
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let linked = dir.path().join("linked/state.json");
        std::fs::create_dir(dir.path().join("linked")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, release_dir(&linked)).unwrap();
        let planted = release_dir(&linked).join("1-1.json");
        assert!(write_release_outcome(&planted, &o).is_err());
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}
