//! Per-channel and per-domain counters, updated with relaxed atomics by the engine and the
//! control path.
//!
//! The counts of the engine's send path, the hot one, go to counters that have a single
//! writer (the channel's engine thread; for a QP, the holder of its send lock) and are bumped
//! with a plain load and store instead of a locked read-modify-write (docs/benchmarks.md,
//! "Fifth round"); a snapshot adds them to the shared ones.

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

/// One set of counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    ops: AtomicU64,
    bytes: AtomicU64,
    /// `ops` and `bytes` of the channel's engine's send path ([`ChanStats::op_by_engine`]):
    /// written only by that thread.
    engine_ops: AtomicU64,
    engine_bytes: AtomicU64,
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
    pub(crate) fn snapshot(&self) -> DeviceStats {
        DeviceStats {
            ops: self
                .ops
                .load(Relaxed)
                .wrapping_add(self.engine_ops.load(Relaxed)),
            bytes: self
                .bytes
                .load(Relaxed)
                .wrapping_add(self.engine_bytes.load(Relaxed)),
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
    /// [`Self::op`] from the send path of the engine that serves the channel (its only
    /// caller for this channel's counters: the channel's own counters are bumped without a
    /// locked instruction; the domain's, shared with the domain's other channels and engines,
    /// with one).
    #[inline]
    pub(crate) fn op_by_engine(&self, bytes: u64) {
        bump(&self.ch.engine_ops, 1);
        bump(&self.ch.engine_bytes, bytes);
        self.dom.ops.fetch_add(1, Relaxed);
        self.dom.bytes.fetch_add(bytes, Relaxed);
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

    /// The engine's single-writer counts and the shared ones add up in every snapshot.
    #[test]
    fn engine_counts_and_shared_counts_add_up() {
        let dom = Arc::new(Counters::default());
        let a = ChanStats {
            ch: Arc::new(Counters::default()),
            dom: dom.clone(),
        };
        let b = ChanStats {
            ch: Arc::new(Counters::default()),
            dom: dom.clone(),
        };
        a.op_by_engine(64);
        a.op_by_engine(0);
        a.op(100);
        b.op_by_engine(7);
        let (sa, sb, sd) = (a.ch.snapshot(), b.ch.snapshot(), dom.snapshot());
        assert_eq!((sa.ops, sa.bytes), (3, 164));
        assert_eq!((sb.ops, sb.bytes), (1, 7));
        assert_eq!((sd.ops, sd.bytes), (4, 171));

        let q = QpCounters::default();
        q.send_locked(true, 64);
        q.send_locked(false, 64);
        q.send(true, 10);
        q.recv(false, 5);
        let s = q.snapshot(QpNum(1), QpState::Rts);
        assert_eq!((s.ops, s.bytes, s.errors, s.recvs), (4, 74, 2, 1));
    }
}
