//! The host-scope conntrack dump, on its own thread: at most one in flight, started only when the
//! tick asks for it (node usage above the trigger, interval elapsed), result picked up by a later
//! tick. The tick never waits for it.

use super::ctnetlink::ConntrackDump;
use crate::clock::Clock;
use crate::error::ReadError;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Pod addresses to attribute entries to, by pod uid.
pub type PodAddresses = Vec<(String, Vec<IpAddr>)>;

#[derive(Debug, Clone)]
pub struct DumpResult {
    pub finished: Instant,
    pub duration: Duration,
    pub entries: u64,
    pub attributed: u64,
    pub restarts: u32,
    /// Entries per pod uid.
    pub by_pod: HashMap<String, u64>,
}

#[derive(Debug, Clone)]
pub enum DumpOutcome {
    Done(DumpResult),
    Failed(ReadError),
}

/// Pure: which pod an entry belongs to. The original source is the pod for its own outgoing
/// flows (before SNAT); the reply source is the pod for flows DNAT'd to it (Service -> pod); the
/// original destination for unNATed inbound flows.
pub fn attribute(t: &super::ctnetlink::CtTuple, addrs: &HashMap<IpAddr, usize>) -> Option<usize> {
    addrs
        .get(&t.src)
        .or_else(|| addrs.get(&t.reply_src))
        .or_else(|| addrs.get(&t.dst))
        .copied()
}

/// The last outcome and its sequence number, so each outcome is consumed once.
/// The CPU time the dump took on the worker thread rides along, charged when picked up.
type Last = Arc<Mutex<Option<(u64, DumpOutcome, Duration)>>>;

pub struct DumpWorker {
    tx: SyncSender<PodAddresses>,
    busy: Arc<AtomicBool>,
    last: Last,
}

impl DumpWorker {
    /// `netns`: the namespace file whose table is dumped; `None` for the agent's own.
    pub fn spawn(netns: Option<PathBuf>, clock: Arc<dyn Clock>) -> std::io::Result<DumpWorker> {
        let (tx, rx) = sync_channel::<PodAddresses>(1);
        let busy = Arc::new(AtomicBool::new(false));
        let last = Arc::new(Mutex::new(None));
        let (b, l) = (busy.clone(), last.clone());
        std::thread::Builder::new()
            .name("conntrack-dump".into())
            .spawn(move || run(rx, netns, clock, b, l))?;
        Ok(DumpWorker { tx, busy, last })
    }

    /// Starts a dump unless one is in flight. Returns whether it was started.
    pub fn request(&self, pods: PodAddresses) -> bool {
        if self.busy.swap(true, Ordering::AcqRel) {
            return false;
        }
        match self.tx.try_send(pods) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.busy.store(false, Ordering::Release);
                false
            }
        }
    }

    pub fn in_flight(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    pub fn last(&self) -> Option<(u64, DumpOutcome, Duration)> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn run(
    rx: Receiver<PodAddresses>,
    netns: Option<PathBuf>,
    clock: Arc<dyn Clock>,
    busy: Arc<AtomicBool>,
    last: Last,
) {
    let mut socket: Option<ConntrackDump> = None;
    let mut seq = 0;
    while let Ok(pods) = rx.recv() {
        let cpu = crate::sample::health::thread_cpu();
        let outcome = dump_once(&mut socket, netns.as_deref(), clock.as_ref(), &pods);
        let cpu = crate::sample::health::thread_cpu().saturating_sub(cpu);
        seq += 1;
        *last.lock().unwrap_or_else(|p| p.into_inner()) = Some((seq, outcome, cpu));
        busy.store(false, Ordering::Release);
    }
}

fn dump_once(
    socket: &mut Option<ConntrackDump>,
    netns: Option<&std::path::Path>,
    clock: &dyn Clock,
    pods: &PodAddresses,
) -> DumpOutcome {
    let start = clock.now();
    let sock = match socket {
        Some(s) => s,
        None => {
            let opened = match netns {
                Some(p) => ConntrackDump::open_in(p),
                None => ConntrackDump::open(),
            };
            match opened {
                Ok(s) => socket.insert(s),
                Err(e) => return DumpOutcome::Failed(e),
            }
        }
    };
    let mut index = HashMap::new();
    for (i, (_, addrs)) in pods.iter().enumerate() {
        for a in addrs {
            index.insert(*a, i);
        }
    }
    let mut counts = vec![0u64; pods.len()];
    let mut attributed = 0;
    let mut visitor = Attributor {
        index: &index,
        counts: &mut counts,
        attributed: &mut attributed,
    };
    match sock.dump_with(&mut visitor) {
        Ok(stats) => {
            let finished = clock.now();
            DumpOutcome::Done(DumpResult {
                finished,
                duration: finished.saturating_duration_since(start),
                entries: stats.entries,
                attributed,
                restarts: stats.restarts,
                by_pod: pods
                    .iter()
                    .zip(counts)
                    .map(|((uid, _), n)| (uid.clone(), n))
                    .collect(),
            })
        }
        Err(e) => DumpOutcome::Failed(e),
    }
}

struct Attributor<'a> {
    index: &'a HashMap<IpAddr, usize>,
    counts: &'a mut Vec<u64>,
    attributed: &'a mut u64,
}

impl super::ctnetlink::CtVisitor for Attributor<'_> {
    fn entry(&mut self, t: &super::ctnetlink::CtTuple) {
        if let Some(i) = attribute(t, self.index) {
            self.counts[i] += 1;
            *self.attributed += 1;
        }
    }

    // An overrun restarts the dump from the first entry: start counting again.
    fn restart(&mut self) {
        self.counts.iter_mut().for_each(|c| *c = 0);
        *self.attributed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::super::ctnetlink::CtTuple;
    use super::*;

    fn t(src: &str, dst: &str, rsrc: &str, rdst: &str) -> CtTuple {
        CtTuple {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            proto: 6,
            reply_src: rsrc.parse().unwrap(),
            reply_dst: rdst.parse().unwrap(),
        }
    }

    #[test]
    fn attribution_by_pod_address() {
        let idx = HashMap::from([
            ("10.42.0.7".parse().unwrap(), 0usize),
            ("10.42.0.9".parse().unwrap(), 1usize),
        ]);
        // Pod egress, SNAT'd to the node address.
        assert_eq!(
            attribute(&t("10.42.0.7", "1.2.3.4", "1.2.3.4", "192.168.1.10"), &idx),
            Some(0)
        );
        // Service -> pod: DNAT, the reply comes from the pod.
        assert_eq!(
            attribute(
                &t("192.168.1.20", "10.43.0.1", "10.42.0.9", "192.168.1.20"),
                &idx
            ),
            Some(1)
        );
        // Direct inbound to a pod address.
        assert_eq!(
            attribute(
                &t("192.168.1.20", "10.42.0.9", "10.42.0.9", "192.168.1.20"),
                &idx
            ),
            Some(1)
        );
        assert_eq!(
            attribute(
                &t(
                    "192.168.1.20",
                    "192.168.1.10",
                    "192.168.1.10",
                    "192.168.1.20"
                ),
                &idx
            ),
            None
        );
    }
}
