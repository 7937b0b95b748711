//! Attribution: from the per-pid socket lists to per-workload counts. The kept totals (each
//! workload's distinct sockets, recomputed only where its (pid, generation) list changed; one
//! inode map of protocols and holders for sockets several workloads hold) and the per-tick pass
//! they fall back to (`attribute`). Part of [`SocketCache`]; the walk that fills the lists is
//! in `mod.rs`.

use super::*;

/// A workload kept between ticks: the distinct sockets of its pids and their totals.
pub(super) struct Kept {
    pub(super) seen: u64,
    /// Its index this tick.
    pub(super) index: usize,
    /// (pid, generation) of the pids `sockets` was made of.
    pub(super) sig: Vec<(u32, u64)>,
    /// Distinct socket inodes, sorted.
    pub(super) sockets: Vec<u64>,
    pub(super) tcp: u64,
    pub(super) udp: u64,
}

/// What is known of a socket inode: its protocol, and the `n` kept workloads holding it (`first`
/// one of them; all of them in `shared` when there are several; `n == 0`: remembered only). One
/// map for both, not a protocol map and a holders map beside it; the protocol rides in the top
/// two bits of the count, so a bucket is 16 bytes (24 with a field of its own: ~260 KiB more at
/// 20,000 sockets).
#[derive(Clone, Copy)]
pub(super) struct Known {
    pub(super) first: u32,
    bits: u32,
}

/// The holder count's bits; it never comes near (one per kept workload).
const N_MASK: u32 = (1 << 30) - 1;

impl Known {
    pub(super) fn remembered(proto: Proto) -> Self {
        let p = match proto {
            Proto::Tcp => 1,
            Proto::Udp => 2,
            Proto::Other => 0,
        };
        Known {
            first: 0,
            bits: p << 30,
        }
    }

    pub(super) fn proto(&self) -> Proto {
        match self.bits >> 30 {
            1 => Proto::Tcp,
            2 => Proto::Udp,
            _ => Proto::Other,
        }
    }

    pub(super) fn n(&self) -> u32 {
        self.bits & N_MASK
    }

    pub(super) fn set_n(&mut self, n: u32) {
        self.bits = (self.bits & !N_MASK) | n.min(N_MASK);
    }
}

impl SocketCache {
    /// The kept entry of workload `key`, marked seen; `None` when it was already seen this tick.
    pub(super) fn wl_entry(&mut self, key: &str, tick: u64) -> Option<u32> {
        if let Some(&w) = self.wl_ids.get(key) {
            let e = self.wl.get_mut(w as usize)?.as_mut()?;
            if e.seen == tick {
                return None;
            }
            e.seen = tick;
            return Some(w);
        }
        let e = Kept {
            seen: tick,
            index: 0,
            sig: Vec::new(),
            sockets: Vec::new(),
            tcp: 0,
            udp: 0,
        };
        let w = match self.wl_free.pop() {
            Some(w) => {
                self.wl[w as usize] = Some(e);
                w
            }
            None => {
                self.wl.push(Some(e));
                u32::try_from(self.wl.len() - 1).ok()?
            }
        };
        self.wl_ids.insert(key.to_owned(), w);
        Some(w)
    }

    /// Drops every kept workload (a tick attributed per tick): rebuilt from the per-pid lists
    /// on the next incremental tick.
    pub(super) fn clear_kept(&mut self) {
        self.wl.clear();
        self.wl_free.clear();
        self.wl_ids.clear();
        for k in self.protos.values_mut() {
            k.first = 0;
            k.set_n(0);
        }
        self.shared = InoMap::default();
        self.rebuild = true;
    }

    /// Recomputes the distinct sockets of each workload whose (pid, generation) list changed,
    /// and lets go of the workloads not seen this tick: per socket only where something changed.
    pub(super) fn update_kept(
        &mut self,
        wids: &[u32],
        contrib: &[Contrib],
        starts: &[usize],
        tick: u64,
    ) {
        let mut union = std::mem::take(&mut self.union_buf);
        for (i, &wid) in wids.iter().enumerate() {
            let cs = &contrib[starts[i]..starts[i + 1]];
            let Some(mut e) = self.wl.get_mut(wid as usize).and_then(Option::take) else {
                continue;
            };
            e.index = i;
            let same = e.sig.len() == cs.len()
                && e.sig
                    .iter()
                    .zip(cs)
                    .all(|(s, c)| s.0 == c.pid && s.1 == c.gen);
            if !same {
                e.sig.clear();
                e.sig.extend(cs.iter().map(|c| (c.pid, c.gen)));
                union.clear();
                for c in cs {
                    if let Some(p) = self.pids.get(&c.pid) {
                        union.extend_from_slice(&p.sockets);
                    }
                }
                union.sort_unstable();
                union.dedup();
                self.diff(wid, &e.sockets, &union);
                let (mut tcp, mut udp) = (0, 0);
                for ino in &union {
                    match self.protos.get(ino).filter(|k| k.n() > 0).map(Known::proto) {
                        Some(Proto::Tcp) => tcp += 1,
                        Some(Proto::Udp) => udp += 1,
                        _ => {}
                    }
                }
                (e.tcp, e.udp) = (tcp, udp);
                std::mem::swap(&mut e.sockets, &mut union);
            }
            self.wl[wid as usize] = Some(e);
        }
        let gone: Vec<(String, u32)> = self
            .wl_ids
            .iter()
            .filter(|(_, &w)| {
                self.wl
                    .get(w as usize)
                    .and_then(Option::as_ref)
                    .is_none_or(|e| e.seen != tick)
            })
            .map(|(k, &w)| (k.clone(), w))
            .collect();
        for (key, wid) in gone {
            self.wl_ids.remove(&key);
            if let Some(e) = self.wl.get_mut(wid as usize).and_then(Option::take) {
                self.diff(wid, &e.sockets, &[]);
            }
            self.wl_free.push(wid);
        }
        union.clear();
        self.union_buf = union;
        for ino in std::mem::take(&mut self.unheld) {
            if self.protos.get(&ino).is_some_and(|k| k.n() == 0) {
                self.protos.remove(&ino);
            }
        }
        if self.rebuild {
            // After a per-tick pass: protocols of sockets closed since are not held by anyone.
            self.protos.retain(|_, k| k.n() > 0);
            self.rebuild = false;
        }
    }

    /// Moves workload `wid` from holding `old` to holding `new` (both sorted, distinct).
    pub(super) fn diff(&mut self, wid: u32, old: &[u64], new: &[u64]) {
        let (mut a, mut b) = (0, 0);
        while a < old.len() || b < new.len() {
            match (old.get(a), new.get(b)) {
                (Some(o), Some(n)) if o == n => {
                    a += 1;
                    b += 1;
                }
                (Some(&o), Some(&n)) if o < n => {
                    self.unhold(o, wid);
                    a += 1;
                }
                (Some(&o), None) => {
                    self.unhold(o, wid);
                    a += 1;
                }
                (_, Some(&n)) => {
                    self.hold(n, wid);
                    b += 1;
                }
                (None, None) => break,
            }
        }
    }

    pub(super) fn hold(&mut self, ino: u64, wid: u32) {
        // Learnt by this tick's walk, or remembered; unknown counts nothing.
        let spilled = self.spill.get(&ino).copied().unwrap_or(Proto::Other);
        let k = self
            .protos
            .entry(ino)
            .or_insert_with(|| Known::remembered(spilled));
        if k.n() == 0 {
            k.first = wid;
            k.set_n(1);
            return;
        }
        k.set_n(k.n() + 1);
        let first = k.first;
        self.shared
            .entry(ino)
            .or_insert_with(|| vec![first])
            .push(wid);
    }

    pub(super) fn unhold(&mut self, ino: u64, wid: u32) {
        let Some(h) = self.protos.get_mut(&ino).filter(|k| k.n() > 0) else {
            return;
        };
        h.set_n(h.n() - 1);
        if h.n() == 0 {
            self.shared.remove(&ino);
            // Its protocol goes at the end of the tick unless another workload took it up
            // (a pid moved between workloads).
            self.unheld.push(ino);
            return;
        }
        if let Some(ws) = self.shared.get_mut(&ino) {
            ws.retain(|&w| w != wid);
            h.first = ws.first().copied().unwrap_or(h.first);
            if ws.len() < 2 {
                self.shared.remove(&ino);
            }
        }
    }

    /// This tick's counts from the kept totals: a socket several workloads hold counts for the
    /// first of them by this tick's order, as a full pass would count it.
    pub(super) fn resolve(&self, wids: &[u32], out: &mut Attribution) {
        let kept = |w: u32| self.wl.get(w as usize).and_then(Option::as_ref);
        for (i, &w) in wids.iter().enumerate() {
            if let (Some(e), Some(c)) = (kept(w), out.counts.get_mut(&i)) {
                (c.tcp, c.udp) = (e.tcp, e.udp);
            }
        }
        let first_of = |ws: &[u32]| ws.iter().filter_map(|&w| kept(w)).map(|e| e.index).min();
        for (ino, ws) in &self.shared {
            let proto = self.protos.get(ino).map_or(Proto::Other, Known::proto);
            if proto == Proto::Other {
                continue;
            }
            let Some(first) = first_of(ws) else { continue };
            for e in ws.iter().filter_map(|&w| kept(w)) {
                if e.index == first {
                    continue;
                }
                if let Some(c) = out.counts.get_mut(&e.index) {
                    match proto {
                        Proto::Tcp => c.tcp = c.tcp.saturating_sub(1),
                        _ => c.udp = c.udp.saturating_sub(1),
                    }
                }
            }
        }
        if self.want_owner {
            let mut owner = InoMap::with_capacity_and_hasher(self.protos.len(), Default::default());
            for (&ino, h) in self.protos.iter().filter(|(_, k)| k.n() > 0) {
                let i = match self.shared.get(&ino) {
                    Some(ws) => first_of(ws),
                    None => kept(h.first).map(|e| e.index),
                };
                if let Some(i) = i {
                    owner.insert(ino, i);
                }
            }
            out.owner = owner;
        }
    }
}

pub(super) fn attribute(
    i: usize,
    sockets: &[u64],
    protos: &InoMap<Known>,
    spill: &InoMap<Proto>,
    out: &mut Attribution,
) {
    let (mut tcp, mut udp) = (0, 0);
    for &ino in sockets {
        match out.owner.entry(ino) {
            std::collections::hash_map::Entry::Occupied(_) => continue,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(i);
            }
        }
        match protos
            .get(&ino)
            .map(Known::proto)
            .or_else(|| spill.get(&ino).copied())
        {
            Some(Proto::Tcp) => tcp += 1,
            Some(Proto::Udp) => udp += 1,
            _ => {}
        }
    }
    let c = out.counts.entry(i).or_default();
    c.tcp += tcp;
    c.udp += udp;
}
