//! The agent: wires the stages together and runs the tick loop. A tick samples (discover,
//! sample), derives signals (signal) into a `Snapshot`, lets the guard step on it (rule, action),
//! and returns both as a `Published`, which the loop hands to the readers (export). `Agent::tick`
//! is synchronous so tests drive it directly.

use crate::action::cgroup::{CgroupActuator, Freezer};
use crate::action::enforce::Enforcer;
use crate::action::evidence::EvidenceRoots;
use crate::action::guard::{Guard, Reach};
use crate::action::limit::KnobRoots;
use crate::action::notify::Notifier;
use crate::action::{Actuator, DryRun};
use crate::cgroupfs::CgroupLayout;
use crate::clock::{Clock, SystemClock};
use crate::config::guard::GuardConfig;
use crate::config::{live, Config, LoadError};
use crate::discover::names::NameSource;
use crate::discover::{Discovery, DiscoveryConfig};
use crate::export::limits::{self, ServerStats};
use crate::export::metrics::{self, SharedSnapshot};
use crate::export::server::{self, Endpoints};
use crate::export::watchdog;
use crate::model::{
    AgentStats, ConfigStatus, DumpStatus, GuardStatus, NodeConntrack, Published, Snapshot,
};
use crate::sample::logs::LogTailer;
use crate::sample::memory::MemoryReader;
use crate::sample::net::sampler::{ConntrackSettings, NetSampler};
use crate::sample::oom::KmsgSource;
use crate::sample::pids::PidsReader;
use crate::sample::procs::ProcTable;
use crate::sample::selfstat::SelfReader;
use crate::sample::Samplers;
use crate::signal::{full, NodeTrends, Tracker};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, UNIX_EPOCH};

/// What a reload did.
#[derive(Debug)]
pub enum Reload {
    /// The new text is the one running (a touched file, or a SIGHUP with nothing new).
    Unchanged,
    Applied {
        previous: String,
        /// Changed fields that keep their running values until a restart.
        restart_required: Vec<&'static str>,
    },
    /// Invalid or unreadable: the running config is kept.
    Rejected { fields: String, error: LoadError },
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(
        "no cgroup hierarchy found under {0} (expected cgroup.controllers or v1 controller mounts)"
    )]
    NoCgroups(std::path::PathBuf),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// Builds the actuators a guard config asks for: (new holds, undos).
type MakeActuators = Box<dyn Fn(&GuardConfig) -> (Box<dyn Actuator>, Box<dyn Actuator>) + Send>;

pub struct Agent {
    clock: Arc<dyn Clock>,
    /// `None` when the actuators were given (tests): a reload keeps them.
    make_actuators: Option<MakeActuators>,
    config_status: ConfigStatus,
    guard: Guard,
    config: Config,
    layout: CgroupLayout,
    samplers: Samplers,
    tracker: Tracker,
    trends: NodeTrends,
    selfstat: SelfReader,
    node: String,
    ticks: u64,
    started: f64,
}

impl Agent {
    /// The agent with the actuator its config asks for: a dry run, or real cgroup writes. Thaws
    /// that undo our holds always go to the real cgroup writer, in a dry run too.
    pub fn new(config: Config, clock: Arc<dyn Clock>) -> Result<Agent, AgentError> {
        let layout = CgroupLayout::detect(&config.paths.cgroup)
            .ok_or_else(|| AgentError::NoCgroups(config.paths.cgroup.clone()))?;
        let make: MakeActuators = Box::new(move |g: &GuardConfig| {
            let writer = || -> Box<dyn Actuator> {
                Box::new(CgroupActuator::new(
                    Freezer::detect(&layout),
                    g.freeze_timeout,
                ))
            };
            let act: Box<dyn Actuator> = if g.dry_run {
                Box::new(DryRun)
            } else {
                writer()
            };
            (act, writer())
        });
        let (act, undo) = make(&config.guard);
        let mut agent = Agent::with_actuators(config, clock, act, undo)?;
        agent.make_actuators = Some(make);
        Ok(agent)
    }

    /// The agent with given actuators for new holds and for undoing them (tests record).
    pub fn with_actuators(
        config: Config,
        clock: Arc<dyn Clock>,
        act: Box<dyn Actuator>,
        undo: Box<dyn Actuator>,
    ) -> Result<Agent, AgentError> {
        let layout = CgroupLayout::detect(&config.paths.cgroup)
            .ok_or_else(|| AgentError::NoCgroups(config.paths.cgroup.clone()))?;
        let p = &config.paths;
        let discovery = Discovery::new(
            &layout,
            p.proc.clone(),
            NameSource::new(p.pod_logs.clone(), p.container_logs.clone()),
            DiscoveryConfig {
                scopes: config.discovery.scopes.clone(),
                host_workloads: config.discovery.host_workloads,
            },
        );
        let s = &config.samplers;
        let samplers = Samplers::new(
            clock.clone(),
            layout.clone(),
            discovery,
            s.memory
                .enabled
                .then(|| MemoryReader::new(layout.primary(), layout.memory_is_v2())),
            s.processes.enabled.then(|| ProcTable::new(p.proc.clone())),
            s.logs.enabled.then(|| {
                LogTailer::new(p.pod_logs.clone(), s.logs.max_bytes_per_tick)
                    .with_max_open_files(s.logs.max_open_files)
            }),
            NetSampler::new(
                p.proc.clone(),
                s.sockets.enabled,
                s.sockets.tcp_states,
                s.conntrack.enabled.then(|| ConntrackSettings {
                    trigger: s.conntrack.dump_trigger,
                    interval: s.conntrack.dump_interval,
                    host_netns: (!s.conntrack.host_netns.as_os_str().is_empty())
                        .then(|| s.conntrack.host_netns.clone()),
                }),
                clock.clone(),
            )
            .with_ports(s.ports.enabled.then_some(s.ports.trigger))
            .with_full_walk_every(s.sockets.full_walk_every),
        )
        .with_kmsg(s.kmsg.enabled.then(|| {
            KmsgSource::new(
                p.kmsg.clone(),
                s.kmsg.max_records_per_tick,
                s.kmsg.remember,
                clock.clone(),
            )
        }))
        .with_pids(
            s.processes
                .enabled
                .then(|| layout.pids_root())
                .flatten()
                .map(|root| PidsReader::new(root, p.proc.clone())),
        );
        let full_window = full::window_for(config.interval);
        let node = config.node();
        let started = unix_seconds(clock.as_ref());
        let enforcer = Enforcer::new(
            act,
            undo,
            Freezer::detect(&layout),
            config.guard.state_file.clone(),
            Notifier::new(config.guard.webhook.clone()),
        )
        .with_knob_roots(KnobRoots::detect(&layout))
        .with_evidence_roots(EvidenceRoots {
            cgroup: layout.primary(),
            proc: p.proc.clone(),
            pod_logs: p.pod_logs.clone(),
        });
        let guard = Guard::new(
            config.guard.clone(),
            clock.clone(),
            enforcer,
            node.clone(),
            Reach {
                scopes: config.discovery.scopes.clone(),
                own_namespace: config.environment.pod_namespace.clone(),
            },
        );
        Ok(Agent {
            guard,
            make_actuators: None,
            config_status: ConfigStatus {
                last_reload_ok: true,
                loaded_at: started,
                ..ConfigStatus::default()
            },
            selfstat: SelfReader::new(p.proc.clone()),
            clock,
            config,
            layout,
            samplers,
            tracker: Tracker::new().with_full_window(full_window),
            trends: NodeTrends::new(full_window),
            node,
            ticks: 0,
            started,
        })
    }

    /// What the zombie tracker did at the last tick: a full scan, a staleness pass, walks.
    pub fn zombie_work(&self) -> crate::sample::zombies::TickWork {
        self.samplers.zombie_work()
    }

    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Where the running config came from and its hash, shown in every snapshot.
    pub fn set_config_source(&mut self, file: Option<String>, text: &str) {
        self.config_status.file = file;
        self.config_status.hash = live::hash(text);
    }

    pub fn config_status(&self) -> &ConfigStatus {
        &self.config_status
    }

    pub fn guard_status(&self) -> GuardStatus {
        self.guard.status()
    }

    /// Applies a new config text: validated first (a bad one changes nothing but the failure
    /// count), then its live keys (`interval`, `guard.*` but `state_file`) are applied; the rest
    /// keeps its running values until a restart and is named in `restart_required`.
    pub fn reload(&mut self, loaded: Result<(Config, String), LoadError>) -> Reload {
        let (new, text) = match loaded {
            Ok(x) => x,
            Err(e) => {
                let fields = live::failed_fields(&e);
                self.config_status.reload_failures_total += 1;
                self.config_status.last_reload_ok = false;
                self.config_status.last_error = Some(format!("{e}"));
                return Reload::Rejected { fields, error: e };
            }
        };
        let hash = live::hash(&text);
        self.config_status.last_reload_ok = true;
        self.config_status.last_error = None;
        if hash == self.config_status.hash {
            return Reload::Unchanged;
        }
        let restart = live::restart_only_changes(&self.config, &new);
        let effective = live::effective(&self.config, new);
        if effective.guard != self.config.guard {
            let actuators = self.make_actuators.as_ref().map(|m| m(&effective.guard));
            let notifier = (effective.guard.webhook != self.config.guard.webhook)
                .then(|| effective.guard.webhook.clone());
            self.guard.reconfigure(
                effective.guard.clone(),
                actuators,
                notifier,
                self.config.environment.pod_namespace.clone(),
            );
        }
        if effective.interval != self.config.interval {
            // The trend windows were sized for the start-up interval.
            let window = full::window_for(effective.interval);
            self.tracker.set_full_window(window);
            self.trends.set_window(window);
        }
        let previous = std::mem::replace(&mut self.config_status.hash, hash);
        self.config = effective;
        let s = &mut self.config_status;
        s.reloads_total += 1;
        s.loaded_at = unix_seconds(self.clock.as_ref());
        s.restart_required = restart.clone();
        Reload::Applied {
            previous,
            restart_required: restart,
        }
    }

    /// One full pass: sample every enabled source, derive signals, build the snapshot, let the
    /// guard step on it; returns both, to be published.
    pub fn tick(&mut self) -> Published {
        let t0 = self.clock.now();
        let raw = self.samplers.sample();
        let now = self.clock.now();
        let (workloads, pods) = self.tracker.update(now, &raw);
        let net = raw.net.as_ref();
        let (conntrack_full_in, pids_full_in) =
            self.trends
                .observe(now, net.and_then(|n| n.node_conntrack), raw.node_pids);
        self.ticks += 1;
        let own = self.selfstat.sample();
        let end = self.clock.now();
        let observed = Snapshot {
            timestamp: unix_seconds(self.clock.as_ref()),
            node: self.node.clone(),
            cgroup_layout: self.layout.name().to_owned(),
            workloads,
            pods,
            node_conntrack: net
                .and_then(|n| n.node_conntrack)
                .map(|(entries, limit)| NodeConntrack { entries, limit }),
            node_conntrack_full_in_seconds: conntrack_full_in,
            node_pids: raw.node_pids,
            node_pids_full_in_seconds: pids_full_in,
            conntrack_dump: net.and_then(|n| n.dump.as_ref()).map(|d| DumpStatus {
                age_seconds: now.saturating_duration_since(d.finished).as_secs_f64(),
                duration_seconds: d.duration.as_secs_f64(),
                entries: d.entries,
                attributed: d.attributed,
                restarts: d.restarts,
            }),
            features: {
                let mut f = net.map(|n| n.features.clone()).unwrap_or_default();
                f.extend(self.samplers.features());
                f.sort_by_key(|f| f.name);
                f
            },
            kmsg: self.samplers.kmsg_status(),
            inputs: self.samplers.input_stats(),
            samplers: self.samplers.status(end, self.config.interval),
            agent: AgentStats {
                ticks_total: self.ticks,
                tick_duration_seconds: end.saturating_duration_since(t0).as_secs_f64(),
                resident_memory_bytes: own.map_or(0, |o| o.rss_bytes),
                cpu_seconds_total: own.map(|o| o.cpu_seconds),
                open_fds: own.map_or(0, |o| o.open_fds),
                start_time_seconds: self.started,
            },
            config: self.config_status.clone(),
        };
        // Rules read the finished snapshot; their verdict is published beside it.
        let guard = Some(self.guard.step(&observed));
        Published { observed, guard }
    }

    /// The fail-open thaw that does not need the agent (for a SIGTERM during a stuck tick).
    pub fn fail_open(&self) -> crate::action::enforce::FailOpen {
        self.guard.fail_open()
    }

    /// Fail open: thaw whatever the guard froze (holds are kept in the state file).
    pub fn shutdown(&mut self) {
        self.guard.shutdown();
    }
}

fn unix_seconds(clock: &dyn Clock) -> f64 {
    clock
        .wall()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Where the running config came from: a file (watched, reloaded on SIGHUP) or the defaults.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    pub file: Option<PathBuf>,
    /// The text the running config was read from (hashed for `nodeguard_config_info`).
    pub text: String,
    /// `--set` fields, applied on top of the file again at every reload.
    pub overrides: Vec<crate::config::overrides::Override>,
    /// How often the file is checked for a change (`--config-poll`, 2s); `None`: SIGHUP only.
    /// A check is one `stat` through the symlinks (a ConfigMap's `..data` swap shows as a new
    /// inode); the file is read only when that changed.
    pub poll: Option<Duration>,
}

/// What identifies the file's current content without reading it: the resolved target's device,
/// inode, size, mtime and ctime. `None` while it cannot be stat'ed.
fn file_identity(path: &Path) -> Option<(u64, u64, u64, i64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime_nsec(),
    ))
}

/// Reloads from `path` and logs the result in one line.
fn reload_from(
    agent: &mut Agent,
    path: &Path,
    overrides: &[crate::config::overrides::Override],
    trigger: &str,
) {
    match agent.reload(Config::load_file_with(path, overrides)) {
        Reload::Unchanged => {
            tracing::info!(file = %path.display(), trigger, hash = %agent.config_status().hash, "config unchanged")
        }
        Reload::Applied {
            previous,
            restart_required,
        } => {
            let hash = &agent.config_status().hash;
            if restart_required.is_empty() {
                tracing::info!(file = %path.display(), trigger, hash = %hash, previous = %previous, "config reloaded");
            } else {
                tracing::warn!(file = %path.display(), trigger, hash = %hash, previous = %previous, restart_required = %restart_required.join(", "), "config reloaded; these fields keep their running values until a restart");
            }
        }
        Reload::Rejected { fields, error } => {
            tracing::error!(file = %path.display(), trigger, fields = %fields, error = %error, "config reload rejected: keeping the running config");
        }
    }
}

/// Runs the agent until SIGTERM or SIGINT; SIGHUP, or a change of the config file, reloads it.
pub async fn run(mut config: Config, source: ConfigSource) -> anyhow::Result<()> {
    // The one read of the process environment.
    config.environment = crate::config::Environment::from_process();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut interval = config.interval;
    let listen = config.listen;
    let mut http = config.http.clone();
    let mut agent = Agent::new(config, clock)?;
    let file = source.file.clone();
    agent.set_config_source(file.as_ref().map(|p| p.display().to_string()), &source.text);
    tracing::info!(layout = agent.layout().name(), listen = %listen, interval = ?interval, config_hash = %agent.config_status().hash, "nodeguard starting");
    let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(Published::default())));
    let stats = Arc::new(ServerStats::default());
    let mut registry = metrics::registry(shared.clone());
    crate::export::info::register(&mut registry, shared.clone());
    let budget = agent.config().guard.freeze_timeout + watchdog::TICK_MARGIN;
    let tick_watch = Arc::new(watchdog::TickWatch::new(interval, budget));
    let mut live = metrics::live_registry();
    limits::register(&mut live, stats.clone(), shared.clone());
    watchdog::register(&mut live, tick_watch.clone(), shared.clone());
    let endpoints = Endpoints {
        shared: shared.clone(),
        registry: Arc::new(registry),
        live: Arc::new(live),
        watch: tick_watch.clone(),
    };
    // Read after main raised the soft limit to the hard one.
    match nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
        Ok((soft, _)) => {
            let cap = limits::connection_cap(http.max_connections, soft);
            if cap < http.max_connections {
                tracing::warn!(
                    configured = http.max_connections,
                    cap,
                    nofile = soft,
                    "http.max_connections lowered to keep 3/4 of the open file limit for the samplers"
                );
            }
            http.max_connections = cap;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the open file limit; keeping http.max_connections")
        }
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| AgentError::Listen {
            addr: listen,
            source,
        })?;
    tokio::spawn(server::serve(listener, endpoints, http, stats));

    let mut ticker = ticker_every(interval);
    let watch = source.poll.filter(|_| file.is_some());
    let mut poll = tokio::time::interval(watch.unwrap_or(Duration::from_secs(3600)));
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut seen = file.as_deref().and_then(file_identity);
    // The streams are made once: a SIGTERM, SIGINT or SIGHUP that arrives during a tick is
    // queued, not lost. Aliased: a `SignalKind` in this crate is what a rule reads.
    use tokio::signal::unix::{signal as unix_signal, SignalKind as UnixSignal};
    let mut term = unix_signal(UnixSignal::terminate())?;
    let mut int = unix_signal(UnixSignal::interrupt())?;
    let mut hup = unix_signal(UnixSignal::hangup())?;
    // The agent is either home, or out in the one blocking job (a tick or a reload) that has
    // it. The loop never awaits a job without also listening for SIGTERM: a job that hangs
    // must not keep the holds it made past the agent's end.
    let fail_open = agent.fail_open();
    let mut grace = shutdown_grace(agent.config());
    let mut home = Some(agent);
    let mut job: Option<tokio::task::JoinHandle<(Agent, Option<Published>)>> = None;
    let mut trigger: Option<&'static str> = None;
    let stop = loop {
        tokio::select! {
            _ = ticker.tick(), if job.is_none() => {
                if let Some(mut a) = home.take() {
                    // Kernel reads block: off the async runtime, one tick at a time.
                    job = Some(tokio::task::spawn_blocking(move || {
                        let snap = a.tick();
                        (a, Some(snap))
                    }));
                }
            }
            done = async {
                match job.as_mut() {
                    Some(j) => j.await,
                    None => std::future::pending().await,
                }
            }, if job.is_some() => {
                job = None;
                let (a, snap) = done?;
                match snap {
                    Some(snap) => {
                        *shared.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(snap);
                        tick_watch.completed();
                    }
                    None => {
                        // Shown at once (not at the next tick): the config in force and the
                        // guard's mode.
                        let last = metrics::latest(&shared);
                        let republished = Published {
                            observed: Snapshot {
                                config: a.config_status().clone(),
                                ..last.observed.clone()
                            },
                            guard: last.guard.as_ref().map(|_| a.guard_status()),
                        };
                        *shared.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(republished);
                        if a.config().interval != interval {
                            interval = a.config().interval;
                            ticker = ticker_every(interval);
                        }
                        grace = shutdown_grace(a.config());
                        tick_watch.set_interval(interval);
                        tick_watch.set_budget(a.config().guard.freeze_timeout + watchdog::TICK_MARGIN);
                    }
                }
                home = Some(a);
            }
            _ = hup.recv() => trigger = Some("sighup"),
            _ = poll.tick(), if watch.is_some() => {
                let now = file.as_deref().and_then(file_identity);
                if now != seen {
                    seen = now;
                    trigger = Some("file_changed");
                }
            }
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
        }
        // A reload waits for the agent to be home: between two ticks.
        if trigger.is_some() && home.is_some() {
            let t = trigger.take().unwrap_or("sighup");
            let Some(path) = file.clone() else {
                tracing::info!("SIGHUP: running on the embedded defaults, nothing to reload");
                continue;
            };
            let overrides = source.overrides.clone();
            if let Some(mut a) = home.take() {
                // Reading the file and undoing holds block: off the runtime.
                job = Some(tokio::task::spawn_blocking(move || {
                    reload_from(&mut a, &path, &overrides, t);
                    (a, None)
                }));
            }
        }
    };
    tracing::info!(signal = stop, "stopping: thawing what this agent holds");
    let agent = match (home, job) {
        (Some(a), _) => a,
        (None, Some(mut j)) => {
            // A job in progress may be in a freeze's own wait: give it that long, no longer.
            match tokio::time::timeout(grace, &mut j).await {
                Ok(done) => done?.0,
                Err(_) => {
                    let thawed = tokio::task::spawn_blocking(move || fail_open.thaw_all()).await?;
                    tracing::error!(
                        ?grace,
                        thawed,
                        "a tick is stuck: thawed what this agent holds without it; exiting"
                    );
                    return Err(anyhow::anyhow!(
                        "stopped with a tick stuck; held cgroups thawed"
                    ));
                }
            }
        }
        (None, None) => return Err(anyhow::anyhow!("the agent was lost")),
    };
    let mut agent = agent;
    tokio::task::spawn_blocking(move || agent.shutdown()).await?;
    tracing::info!("stopped");
    Ok(())
}

/// How long SIGTERM waits for a tick in progress before thawing without it: a freeze's own wait
/// (`guard.freeze_timeout`) and a little more, but well inside the kubelet's default 30 s
/// termination grace, which ends in SIGKILL.
fn shutdown_grace(config: &Config) -> Duration {
    (config.guard.freeze_timeout + Duration::from_secs(2)).min(Duration::from_secs(20))
}

/// A slow tick delays the next one instead of stacking up behind it.
fn ticker_every(interval: Duration) -> tokio::time::Interval {
    let mut t = tokio::time::interval(interval);
    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    t
}
