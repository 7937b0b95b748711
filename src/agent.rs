//! The agent: wires the stages together (sample -> signal -> snapshot -> export) and runs the
//! tick loop. `Agent::tick` is synchronous so tests drive it directly.

use crate::action::cgroup::{CgroupActuator, Freezer};
use crate::action::enforce::Enforcer;
use crate::action::guard::Guard;
use crate::action::notify::Notifier;
use crate::action::{Actuator, DryRun};
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::discover::names::NameSource;
use crate::discover::{CgroupLayout, Discovery, DiscoveryConfig};
use crate::export::limits::{self, ServerStats};
use crate::export::metrics::{self, SharedSnapshot};
use crate::export::server::{self, Endpoints};
use crate::sample::logs::LogTailer;
use crate::sample::memory::MemoryReader;
use crate::sample::net::sampler::{ConntrackSettings, NetSampler};
use crate::sample::pids::PidsReader;
use crate::sample::procs::ProcTable;
use crate::sample::selfstat::SelfReader;
use crate::sample::Samplers;
use crate::signal::{full, NodeTrends, Tracker};
use crate::snapshot::{AgentStats, DumpStatus, NodeConntrack, Snapshot};
use std::sync::{Arc, RwLock};
use std::time::UNIX_EPOCH;

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

pub struct Agent {
    clock: Arc<dyn Clock>,
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
        let writer = || {
            Box::new(CgroupActuator::new(
                Freezer::detect(&layout),
                config.guard.freeze_timeout,
            ))
        };
        let act: Box<dyn Actuator> = if config.guard.dry_run {
            Box::new(DryRun)
        } else {
            writer()
        };
        let undo = writer();
        Agent::with_actuators(config, clock, act, undo)
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
            .with_ports(s.ports.enabled.then_some(s.ports.trigger)),
        )
        .with_pids(
            s.processes
                .enabled
                .then(|| layout.pids_root())
                .flatten()
                .map(|root| PidsReader::new(root, p.proc.clone())),
        );
        let full_window = full::window_for(config.interval);
        let node = if config.node_name.is_empty() {
            std::env::var("NODE_NAME").unwrap_or_default()
        } else {
            config.node_name.clone()
        };
        let started = unix_seconds(clock.as_ref());
        let enforcer = Enforcer::new(
            act,
            undo,
            Freezer::detect(&layout),
            config.guard.state_file.clone(),
            Notifier::new(Some(config.guard.webhook_url.clone())),
        );
        let guard = Guard::new(
            config.guard.clone(),
            clock.clone(),
            enforcer,
            node.clone(),
            std::env::var("POD_NAMESPACE").ok(),
        );
        Ok(Agent {
            guard,
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

    pub fn layout(&self) -> &CgroupLayout {
        &self.layout
    }

    /// One full pass: sample every enabled source, derive signals, build the snapshot.
    pub fn tick(&mut self) -> Snapshot {
        let t0 = self.clock.now();
        let raw = self.samplers.sample();
        let now = self.clock.now();
        let (workloads, pods) = self.tracker.update(now, &raw);
        let net = raw.net.as_ref();
        let (conntrack_full_in, pids_full_in) =
            self.trends
                .observe(now, net.and_then(|n| n.node_conntrack), raw.node_pids);
        self.ticks += 1;
        let own = self.selfstat.read().ok().flatten().unwrap_or_default();
        let end = self.clock.now();
        let mut snap = Snapshot {
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
            features: net.map(|n| n.features.clone()).unwrap_or_default(),
            inputs: self.samplers.input_stats(),
            samplers: self
                .samplers
                .health
                .iter()
                .map(|h| h.status(end, self.config.interval))
                .collect(),
            agent: AgentStats {
                ticks_total: self.ticks,
                tick_duration_seconds: end.saturating_duration_since(t0).as_secs_f64(),
                resident_memory_bytes: own.rss_bytes,
                cpu_seconds_total: own.cpu_seconds,
                open_fds: own.open_fds,
                start_time_seconds: self.started,
            },
            guard: None,
        };
        // Rules read the finished snapshot; their verdicts join it for export.
        snap.guard = Some(self.guard.step(&snap));
        snap
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

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let interval = config.interval;
    let listen = config.listen;
    let mut http = config.http.clone();
    let mut agent = Agent::new(config, clock)?;
    tracing::info!(layout = agent.layout().name(), listen = %listen, interval = ?interval, "nodeguard starting");

    let shared: SharedSnapshot = Arc::new(RwLock::new(Arc::new(Snapshot::default())));
    let stats = Arc::new(ServerStats::default());
    let mut registry = metrics::registry(shared.clone());
    limits::register(&mut registry, stats.clone(), shared.clone());
    let endpoints = Endpoints {
        shared: shared.clone(),
        registry: Arc::new(registry),
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

    let mut ticker = tokio::time::interval(interval);
    // A slow tick delays the next one instead of stacking up behind it.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Both streams are made once: a signal that arrives during a tick is queued, not lost.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                // Kernel reads block: run them off the async runtime, one tick at a time.
                let (a, snap) = tokio::task::spawn_blocking(move || {
                    let snap = agent.tick();
                    (agent, snap)
                }).await?;
                agent = a;
                *shared.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(snap);
            }
            _ = term.recv() => { tracing::info!("SIGTERM: stopping"); break; }
            _ = int.recv() => { tracing::info!("SIGINT: stopping"); break; }
        }
    }
    tokio::task::spawn_blocking(move || agent.shutdown()).await?;
    Ok(())
}
