//! Per-channel and per-domain counters, updated with relaxed atomics by the engine and the
//! control path.
//!
//! The counts of the engine's send path, the hot one, go to counters that have a single
//! writer and are bumped with a plain load and store instead of a locked read-modify-write
//! (docs/benchmarks.md, "Fifth round" and "Seventh round"); a snapshot adds them to the shared
//! ones. The writers: for a channel, its engine thread; for a domain, whose channels may be
//! served by any engine, each engine writes its own shard ([`Counters::with_shards`], one per
//! engine, each on its own cache line); for a QP, the holder of its send lock.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use shared_ring::abi::control::QpState;

use super::{DeviceStats, QpNum, QpStats};

/// Adds `n` to a counter that one thread at a time writes (see the module doc): a relaxed
/// load and store, no locked instruction. Readers may load it concurrently.
#[inline]
fn bump(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

/// The `ops` and `bytes` one engine's send path adds to a set of counters
/// ([`ChanStats::op_by_engine`]): written only by that engine's thread. On its own 128-byte
/// line (two lines on the CPUs that fetch lines in pairs), so that engines bumping one
/// domain's shards do not pass a line between them.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    ops: AtomicU64,
    bytes: AtomicU64,
}

/// One set of counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    ops: AtomicU64,
    bytes: AtomicU64,
    /// Per engine (by index), what its send path counted here. Empty for a set that no
    /// engine's send path bumps (the verbs device's).
    shards: Box<[Shard]>,
    errors: AtomicU64,
    notifications: AtomicU64,
    events: AtomicU64,
    copied_bytes: AtomicU64,
    channels: AtomicU64,
    pds: AtomicU64,
    mrs: AtomicU64,
    mr_bytes: AtomicU64,
    cqs: AtomicU64,
    qps: AtomicU64,
}

impl Counters {
    /// A set with one single-writer shard per engine: `engines` is the device's engine count
    /// for a domain's set (any engine may serve one of its channels), 1 for a channel's (only
    /// its engine does, and bumps shard 0).
    pub(crate) fn with_shards(engines: usize) -> Self {
        Counters {
            shards: (0..engines).map(|_| Shard::default()).collect(),
            ..Counters::default()
        }
    }

    /// Engine `idx`'s send path counts an operation: into the engine's own shard, without a
    /// locked instruction; into the shared counters (locked) if the set has no such shard.
    #[inline]
    fn op_by(&self, idx: usize, bytes: u64) {
        match self.shards.get(idx) {
            Some(s) => {
                bump(&s.ops, 1);
                bump(&s.bytes, bytes);
            }
            None => {
                self.ops.fetch_add(1, Relaxed);
                self.bytes.fetch_add(bytes, Relaxed);
            }
        }
    }

    pub(crate) fn snapshot(&self) -> DeviceStats {
        let (mut ops, mut bytes) = (self.ops.load(Relaxed), self.bytes.load(Relaxed));
        for s in self.shards.iter() {
            ops = ops.wrapping_add(s.ops.load(Relaxed));
            bytes = bytes.wrapping_add(s.bytes.load(Relaxed));
        }
        DeviceStats {
            ops,
            bytes,
            errors: self.errors.load(Relaxed),
            notifications: self.notifications.load(Relaxed),
            events: self.events.load(Relaxed),
            copied_bytes: self.copied_bytes.load(Relaxed),
            channels: self.channels.load(Relaxed),
            pds: self.pds.load(Relaxed),
            mrs: self.mrs.load(Relaxed),
            mr_bytes: self.mr_bytes.load(Relaxed),
            cqs: self.cqs.load(Relaxed),
            qps: self.qps.load(Relaxed),
        }
    }
}

/// A held resource kind.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Held {
    Channel,
    Pd,
    Mr(u64),
    Cq,
    Qp,
}

/// The counters a channel updates: its own and its domain's.
#[derive(Debug, Clone)]
pub(crate) struct ChanStats {
    pub(crate) ch: Arc<Counters>,
    pub(crate) dom: Arc<Counters>,
}

impl ChanStats {
    fn both(&self, f: impl Fn(&Counters)) {
        f(&self.ch);
        f(&self.dom);
    }
    pub(crate) fn op(&self, bytes: u64) {
        self.both(|c| {
            c.ops.fetch_add(1, Relaxed);
            c.bytes.fetch_add(bytes, Relaxed);
        });
    }
    /// [`Self::op`] from the send path of engine `engine`, the one that serves the channel
    /// (the only caller for this channel's counters, which it bumps in their shard 0; the
    /// domain's, which other engines serving the domain's other channels bump too, in the
    /// engine's own shard): no locked instruction.
    #[inline]
    pub(crate) fn op_by_engine(&self, engine: usize, bytes: u64) {
        self.ch.op_by(0, bytes);
        self.dom.op_by(engine, bytes);
    }
    pub(crate) fn error(&self) {
        self.both(|c| {
            c.errors.fetch_add(1, Relaxed);
        });
    }
    pub(crate) fn notification(&self) {
        self.both(|c| {
            c.notifications.fetch_add(1, Relaxed);
        });
    }
    /// Payload bytes the backend copied through its own memory (see
    /// [`DeviceStats::copied_bytes`](super::DeviceStats::copied_bytes)).
    pub(crate) fn copied(&self, bytes: u64) {
        self.both(|c| {
            c.copied_bytes.fetch_add(bytes, Relaxed);
        });
    }
    pub(crate) fn event(&self) {
        self.both(|c| {
            c.events.fetch_add(1, Relaxed);
        });
    }
    fn held_counter(c: &Counters, kind: Held) -> (&AtomicU64, Option<(&AtomicU64, u64)>) {
        match kind {
            Held::Channel => (&c.channels, None),
            Held::Pd => (&c.pds, None),
            Held::Mr(b) => (&c.mrs, Some((&c.mr_bytes, b))),
            Held::Cq => (&c.cqs, None),
            Held::Qp => (&c.qps, None),
        }
    }
    pub(crate) fn acquire(&self, kind: Held) {
        self.both(|c| {
            let (n, b) = Self::held_counter(c, kind);
            n.fetch_add(1, Relaxed);
            if let Some((b, v)) = b {
                b.fetch_add(v, Relaxed);
            }
        });
    }
    pub(crate) fn release(&self, kind: Held) {
        self.both(|c| {
            let (n, b) = Self::held_counter(c, kind);
            n.fetch_sub(1, Relaxed);
            if let Some((b, v)) = b {
                b.fetch_sub(v, Relaxed);
            }
        });
    }
}

/// The counters of one QP. The engine that executes a send WQE updates its QP's counters; the
/// engine that delivers to a RECV updates the receiving QP's. Relaxed atomics: no ordering
/// with the data is promised, only that every update is counted.
#[derive(Debug, Default)]
pub(crate) struct QpCounters {
    ops: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    recvs: AtomicU64,
    /// Counts of [`Self::send_locked`], written only under the QP's send lock.
    locked_ops: AtomicU64,
    locked_bytes: AtomicU64,
    locked_errors: AtomicU64,
}

impl QpCounters {
    /// A send WQE executed (`ok`: successfully, `bytes` moved).
    pub(crate) fn send(&self, ok: bool, bytes: u64) {
        self.ops.fetch_add(1, Relaxed);
        if ok {
            self.bytes.fetch_add(bytes, Relaxed);
        } else {
            self.errors.fetch_add(1, Relaxed);
        }
    }
    /// [`Self::send`] by the holder of the QP's send lock (the engine's send path, the only
    /// caller): the lock orders the writers, so no locked instruction is needed.
    #[inline]
    pub(crate) fn send_locked(&self, ok: bool, bytes: u64) {
        bump(&self.locked_ops, 1);
        if ok {
            bump(&self.locked_bytes, bytes);
        } else {
            bump(&self.locked_errors, 1);
        }
    }
    /// A RECV consumed (`ok`: successfully, `bytes` delivered into it).
    pub(crate) fn recv(&self, ok: bool, bytes: u64) {
        self.recvs.fetch_add(1, Relaxed);
        self.send(ok, bytes);
    }
    pub(crate) fn snapshot(&self, qp: QpNum, state: QpState) -> QpStats {
        QpStats {
            qp,
            state,
            ops: self
                .ops
                .load(Relaxed)
                .wrapping_add(self.locked_ops.load(Relaxed)),
            bytes: self
                .bytes
                .load(Relaxed)
                .wrapping_add(self.locked_bytes.load(Relaxed)),
            errors: self
                .errors
                .load(Relaxed)
                .wrapping_add(self.locked_errors.load(Relaxed)),
            recvs: self.recvs.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engines' single-writer counts and the shared ones add up in every snapshot: the
    /// channel's shard, each engine's shard of the domain (the last one too), and the shared
    /// counters of a set without shards.
    #[test]
    fn engine_counts_and_shared_counts_add_up() {
        let dom = Arc::new(Counters::with_shards(3));
        let a = ChanStats {
            ch: Arc::new(Counters::with_shards(1)),
            dom: dom.clone(),
        };
        let b = ChanStats {
            ch: Arc::new(Counters::with_shards(1)),
            dom: dom.clone(),
        };
        a.op_by_engine(0, 64);
        a.op_by_engine(0, 0);
        a.op(100);
        b.op_by_engine(2, 7);
        let (sa, sb, sd) = (a.ch.snapshot(), b.ch.snapshot(), dom.snapshot());
        assert_eq!((sa.ops, sa.bytes), (3, 164));
        assert_eq!((sb.ops, sb.bytes), (1, 7));
        assert_eq!((sd.ops, sd.bytes), (4, 171));
        // Each engine in its own shard, none in the shared counters.
        let per: Vec<_> = dom.shards.iter().map(|s| s.ops.load(Relaxed)).collect();
        assert_eq!(per, [2, 0, 1]);
        assert_eq!(dom.ops.load(Relaxed), 1);

        // A set without shards (or an engine beyond them) counts in the shared counters.
        let plain = ChanStats {
            ch: Arc::new(Counters::default()),
            dom: Arc::new(Counters::with_shards(1)),
        };
        plain.op_by_engine(5, 9);
        let (sp, sq) = (plain.ch.snapshot(), plain.dom.snapshot());
        assert_eq!((sp.ops, sp.bytes, sq.ops, sq.bytes), (1, 9, 1, 9));

        let q = QpCounters::default();
        q.send_locked(true, 64);
        q.send_locked(false, 64);
        q.send(true, 10);
        q.recv(false, 5);
        let s = q.snapshot(QpNum(1), QpState::Rts);
        assert_eq!((s.ops, s.bytes, s.errors, s.recvs), (4, 74, 2, 1));
    }
}
