//! The decider across restarts and reloads: what it writes to the state file, how it rebuilds
//! from one, the fail-open shutdown, and a reloaded guard configuration.

use super::super::breaker::Knob;
use super::*;

impl Decider {
    /// Fail open at shutdown: undo every hold. The breakers keep their cgroups in the state
    /// file, so a restarted agent re-applies holds that are still due.
    pub fn shutdown(&mut self, now: Instant, wall: SystemTime) -> Vec<Command> {
        let mut out: Vec<Command> = self
            .breakers
            .values()
            .flat_map(|b| {
                let frozen = b.acted.iter().cloned().map(HoldRecord::Frozen);
                frozen.chain(b.limited.iter().cloned().map(HoldRecord::Limited))
            })
            .map(Command::Undo)
            .collect();
        out.push(Command::Persist(self.state(now, wall)));
        out
    }

    /// The breakers as the state file records them.
    pub(super) fn state(&self, now: Instant, wall: SystemTime) -> StateFile {
        let at = |t: Instant| wall_of(now, wall, t);
        let breakers = self
            .breakers
            .values()
            .map(|b| PersistedBreaker {
                id: b.id.clone(),
                rule: self.cfg.rules[b.rule].name.clone(),
                action: b.action,
                state: b.state,
                pod: b.pod.clone(),
                revision: b.revision.clone(),
                reason: b.reason.clone(),
                value: b.value,
                threshold: b.threshold,
                since: at(b.opened_at),
                hold_until: b.hold_until.map(at),
                probation_until: b.probation_until.map(at),
                hold_seconds: b.hold.as_secs_f64(),
                trips: b.trips,
                acted: b.acted.clone(),
                spared_pods: b.spared_pods.iter().cloned().collect(),
                limited: b.limited.clone(),
                step: b.step,
                evidence: b.evidence.clone(),
            })
            .collect();
        StateFile {
            version: state::VERSION,
            saved_at: unix(wall),
            breakers,
            // The enforcer adds what it froze and limited.
            frozen: Vec::new(),
            limits: Vec::new(),
        }
    }

    /// Rebuilds the breakers of a state file read at start. Holds still due are re-applied when
    /// enforcing; in a dry run, and for expired holds, their cgroups are thawed (for real).
    pub fn restore(&mut self, now: Instant, wall: SystemTime, file: StateFile) -> Vec<Command> {
        self.at(now, wall);
        let mut out = Vec::new();
        let mut holds = Vec::new();
        let wall_now = unix(wall);
        // Persisted numbers are range-checked by `state::parse`; the arithmetic saturates anyway.
        let at = |t: f64| {
            let d = Duration::try_from_secs_f64((t - wall_now).abs()).unwrap_or(Duration::ZERO);
            if t >= wall_now {
                later(now, d)
            } else {
                now.checked_sub(d).unwrap_or(now)
            }
        };
        for p in file.breakers {
            let Some(rule) = self.cfg.rules.iter().position(|r| r.name == p.rule) else {
                tracing::warn!(rule = %p.rule, "a persisted breaker's rule no longer exists: dropping it");
                let frozen = p.acted.into_iter().map(HoldRecord::Frozen);
                let limits = p.limited.into_iter().map(HoldRecord::Limited);
                out.extend(frozen.chain(limits).map(Command::Undo));
                continue;
            };
            let mut b = Breaker {
                id: p.id,
                rule,
                action: p.action,
                state: p.state,
                pod: p.pod,
                revision: p.revision,
                reason: p.reason,
                value: p.value,
                threshold: p.threshold,
                opened_at: at(p.since),
                hold_until: p.hold_until.map(at),
                probation_until: p.probation_until.map(at),
                hold: Duration::try_from_secs_f64(p.hold_seconds).unwrap_or(Duration::ZERO),
                trips: p.trips,
                acted: p.acted,
                limited: p.limited,
                step: p
                    .step
                    .min(self.cfg.rules[rule].ladder.len().saturating_sub(1)),
                step_since: now,
                checked_value: p.value,
                evidence: p.evidence,
                enforced: HashSet::new(),
                spared_pods: p.spared_pods.into_iter().collect(),
            };
            // Restored under today's config: narrowed out of the scopes or protected since,
            // the breaker is released (and what it held thawed).
            if let Some(why) = self.protected_breaker(&b) {
                tracing::info!(rule = %p.rule, namespace = %b.id.namespace, owner = %b.id.owner, container = %b.id.container, why, "a persisted breaker is not ours to hold any more: released");
                undo_all(&mut b, &mut out);
                let e = self.event(&b, "released", why, Duration::ZERO);
                out.push(Command::Notify(e));
                continue;
            }
            let acted = std::mem::take(&mut b.acted);
            let limited = std::mem::take(&mut b.limited);
            let due = b.state == BreakerState::Open && b.hold_until.is_none_or(|t| t > now);
            let hold = due && b.action != ActionKind::Report && !self.cfg.dry_run;
            let key = (b.id.clone(), rule);
            for c in acted {
                if hold {
                    holds.push(Command::Hold {
                        ticket: Ticket::Restored(key.clone()),
                        action: ActionKind::Freeze,
                        rel: c.cgroup,
                        ino: Some(c.inode),
                        instance: String::new(),
                        setting: Setting::None,
                    });
                } else {
                    out.push(Command::Undo(HoldRecord::Frozen(c)));
                }
            }
            // A limit is re-applied with its value and the value it first replaced (an agent
            // killed mid-hold left ours in the knob).
            for l in limited {
                if hold {
                    holds.push(Command::Hold {
                        ticket: Ticket::Restored(key.clone()),
                        action: limit_action(l.knob),
                        rel: l.cgroup.cgroup.clone(),
                        ino: None,
                        instance: String::new(),
                        setting: Setting::Restore(l),
                    });
                } else {
                    out.push(Command::Undo(HoldRecord::Limited(l)));
                }
            }
            let outcome = if !due {
                "hold expired"
            } else if self.cfg.dry_run && b.action != ActionKind::Report {
                "dry run: hold kept, cgroups thawed"
            } else {
                "hold re-applied"
            };
            out.push(Command::Notify(self.event(
                &b,
                "restored",
                outcome,
                Duration::ZERO,
            )));
            self.breakers.insert(key, b);
        }
        out.push(Command::Persist(self.state(now, wall)));
        out.extend(holds);
        out
    }

    /// A reloaded guard configuration. Breakers follow their rule by name; one whose rule is
    /// gone, or now takes another action, is released (its cgroups thawed), as a restart does
    /// for a missing rule. A change of `dry_run` undoes every hold and lets the next tick
    /// re-apply open breakers through the new actuator, as a restart would. Unchanged rules keep
    /// their progress and pins; the others start again. Pacing keeps the actions already taken.
    pub fn reconfigure(
        &mut self,
        now: Instant,
        wall: SystemTime,
        cfg: GuardConfig,
        protected_namespaces: Vec<String>,
    ) -> Vec<Command> {
        self.at(now, wall);
        let mut out = Vec::new();
        let mode_changed = cfg.dry_run != self.cfg.dry_run;
        // Protection as the new config has it, for the breakers that stay.
        let next = Decider::scoped(
            cfg.clone(),
            self.node.clone(),
            protected_namespaces.clone(),
            self.scopes.clone(),
        );
        let protected_now = |b: &Breaker| next.protected_breaker(b).is_some();
        // Old index -> new index, for the rules whose whole definition is unchanged.
        let same: HashMap<usize, usize> = self
            .cfg
            .rules
            .iter()
            .enumerate()
            .filter_map(|(j, r)| Some((j, cfg.rules.iter().position(|n| n == r)?)))
            .collect();
        for ((id, r), mut b) in std::mem::take(&mut self.breakers) {
            let name = &self.cfg.rules[r].name;
            let to = cfg.rules.iter().position(|n| n.name == *name);
            let why = match to {
                None => Some("rule removed by a config reload"),
                Some(i) if !cfg.rules[i].ladder.contains(&b.action) => {
                    Some("rule's action changed by a config reload")
                }
                Some(_) => protected_now(&b).then_some("protected by a config reload"),
            };
            match (to, why) {
                (Some(i), None) => {
                    if mode_changed {
                        undo_all(&mut b, &mut out);
                    }
                    b.rule = i;
                    self.breakers.insert((id, i), b);
                }
                (_, why) => {
                    undo_all(&mut b, &mut out);
                    let why = why.unwrap_or_default();
                    tracing::info!(rule = %name, namespace = %b.id.namespace, owner = %b.id.owner, container = %b.id.container, why, "breaker released by a config reload");
                    out.push(Command::Notify(self.event(
                        &b,
                        "released",
                        why,
                        Duration::ZERO,
                    )));
                }
            }
        }
        // The enforcer keeps pins by key: keep those whose key still names the same rule.
        let pins: Vec<Pin> = self.pins.keys().cloned().collect();
        for pin in pins {
            if same.get(&pin.0) != Some(&pin.0) {
                self.pins.remove(&pin);
                out.push(Command::Unpin(pin));
            }
        }
        let engine = std::mem::replace(&mut self.engine, RuleEngine::new(Vec::new()));
        self.engine = engine.carry_over(cfg.rules.clone());
        self.throttle
            .set_limits(cfg.cooldown, cfg.max_actions_per_10m);
        self.pending.clear();
        self.quiet.clear();
        self.protected_namespaces = protected_namespaces;
        self.cfg = cfg;
        if mode_changed {
            // The alert's `dry_run` label changes: the notifier resolves the old one.
            let why = if self.cfg.dry_run {
                "dry run turned on"
            } else {
                "dry run turned off"
            };
            let events: Vec<Command> = self
                .breakers
                .values()
                .map(|b| Command::Notify(self.event(b, "mode_changed", why, Duration::ZERO)))
                .collect();
            out.extend(events);
        }
        out.push(Command::Persist(self.state(now, wall)));
        out
    }
}

/// The action that sets a knob.
fn limit_action(knob: Knob) -> ActionKind {
    match knob {
        Knob::MemoryHigh => ActionKind::ThrottleMemory,
        Knob::PidsMax => ActionKind::LimitPids,
        Knob::CpuMax | Knob::CpuCfsQuota => ActionKind::ThrottleCpu,
        Knob::Connect => ActionKind::LimitConnections,
    }
}
