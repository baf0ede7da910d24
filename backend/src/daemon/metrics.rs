//! What the daemon's control plane costs, counted where it is spent: XenStore operations made
//! through the daemon's connection, and the length of its event queue (now and at its highest).
//! Read by tests and logs; a guest storming XenStore must not be able to move them without bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use xenstore_proto::client::{NodeOps, Result, WatchEvents, XenbusStore};
use xenstore_proto::wire::Perms;

/// The daemon's counters (relaxed atomics: they are statistics, not synchronisation).
#[derive(Debug, Default)]
pub struct DaemonMetrics {
    xenstore_ops: AtomicU64,
    queue_len: AtomicU64,
    queue_high_water: AtomicU64,
    frontend_scans: AtomicU64,
    stats_publications: AtomicU64,
}

/// A copy of [`DaemonMetrics`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// XenStore requests sent by the control plane (a transaction counts its start, each
    /// operation in it, and its end; a watch counts one).
    pub xenstore_ops: u64,
    /// Entries waiting in the event queue now.
    pub queue_len: u64,
    /// The most entries the event queue ever held.
    pub queue_high_water: u64,
    /// Re-scans of a device's frontend node (channels included).
    pub frontend_scans: u64,
    /// Stats publications that wrote to XenStore.
    pub stats_publications: u64,
}

impl DaemonMetrics {
    pub fn snapshot(&self) -> MetricsSnapshot {
        MetricsSnapshot {
            xenstore_ops: self.xenstore_ops.load(Ordering::Relaxed),
            queue_len: self.queue_len.load(Ordering::Relaxed),
            queue_high_water: self.queue_high_water.load(Ordering::Relaxed),
            frontend_scans: self.frontend_scans.load(Ordering::Relaxed),
            stats_publications: self.stats_publications.load(Ordering::Relaxed),
        }
    }

    pub(super) fn set_queue_len(&self, n: usize) {
        let n = n as u64;
        self.queue_len.store(n, Ordering::Relaxed);
        self.queue_high_water.fetch_max(n, Ordering::Relaxed);
    }

    pub(super) fn frontend_scanned(&self) {
        self.frontend_scans.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn stats_published(&self) {
        self.stats_publications.fetch_add(1, Ordering::Relaxed);
    }

    fn op(&self) {
        self.xenstore_ops.fetch_add(1, Ordering::Relaxed);
    }
}

/// A [`XenbusStore`] that counts every request it forwards.
pub(super) struct CountingStore {
    inner: Arc<dyn XenbusStore>,
    metrics: Arc<DaemonMetrics>,
}

impl CountingStore {
    pub(super) fn new(inner: Arc<dyn XenbusStore>, metrics: Arc<DaemonMetrics>) -> CountingStore {
        CountingStore { inner, metrics }
    }
}

/// Node operations counted on `metrics`, on a connection or inside a transaction.
struct Counted<'a> {
    ops: &'a dyn NodeOps,
    metrics: &'a DaemonMetrics,
}

macro_rules! counted_node_ops {
    ($field:ident) => {
        fn read(&self, path: &str) -> Result<Vec<u8>> {
            self.metrics.op();
            self.$field.read(path)
        }
        fn write(&self, path: &str, value: &[u8]) -> Result<()> {
            self.metrics.op();
            self.$field.write(path, value)
        }
        fn mkdir(&self, path: &str) -> Result<()> {
            self.metrics.op();
            self.$field.mkdir(path)
        }
        fn rm(&self, path: &str) -> Result<()> {
            self.metrics.op();
            self.$field.rm(path)
        }
        fn directory(&self, path: &str) -> Result<Vec<String>> {
            self.metrics.op();
            self.$field.directory(path)
        }
        fn get_perms(&self, path: &str) -> Result<Perms> {
            self.metrics.op();
            self.$field.get_perms(path)
        }
        fn set_perms(&self, path: &str, perms: &Perms) -> Result<()> {
            self.metrics.op();
            self.$field.set_perms(path, perms)
        }
    };
}

impl NodeOps for Counted<'_> {
    counted_node_ops!(ops);
}

impl NodeOps for CountingStore {
    counted_node_ops!(inner);
}

impl XenbusStore for CountingStore {
    fn watch(&self, path: &str) -> Result<Box<dyn WatchEvents>> {
        self.metrics.op();
        self.inner.watch(path)
    }

    fn transact(&self, f: &mut dyn FnMut(&dyn NodeOps) -> Result<()>) -> Result<()> {
        let metrics = &*self.metrics;
        self.inner.transact(&mut |ops| {
            // Start and end of this attempt (a retried transaction counts again).
            metrics.op();
            metrics.op();
            f(&Counted { ops, metrics })
        })
    }

    fn get_domain_path(&self, domid: u32) -> Result<String> {
        self.metrics.op();
        self.inner.get_domain_path(domid)
    }
}
