//! Per-channel and per-domain counters, updated with relaxed atomics by the engine and the
//! control path.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use shared_ring::abi::control::QpState;

use super::{DeviceStats, QpNum, QpStats};

/// One set of counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    ops: AtomicU64,
    bytes: AtomicU64,
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
            ops: self.ops.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
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
    /// A RECV consumed (`ok`: successfully, `bytes` delivered into it).
    pub(crate) fn recv(&self, ok: bool, bytes: u64) {
        self.recvs.fetch_add(1, Relaxed);
        self.send(ok, bytes);
    }
    pub(crate) fn snapshot(&self, qp: QpNum, state: QpState) -> QpStats {
        QpStats {
            qp,
            state,
            ops: self.ops.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            errors: self.errors.load(Relaxed),
            recvs: self.recvs.load(Relaxed),
        }
    }
}
