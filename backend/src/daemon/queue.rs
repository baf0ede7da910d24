//! The daemon's event queue, coalescing: an event only says "look at this again", so N events
//! about one device are one entry (a dirty flag per device and kind). The queue therefore
//! never holds more than [`super::queue_capacity`] entries, however fast a guest makes
//! XenStore fire: nothing is dropped, repeats merge.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::metrics::DaemonMetrics;
use super::Event;
use crate::xenbus::{paths, ChannelFault, DeviceId};

/// Everything waiting, merged. Taken whole by the daemon.
#[derive(Debug, Default)]
pub(super) struct Pending {
    pub(super) shutdown: bool,
    pub(super) watch_lost: Option<String>,
    /// Something changed under the backend root that names no device: scan it all.
    pub(super) rescan: bool,
    pub(super) release_domain: bool,
    /// Devices whose backend node changed.
    pub(super) backend: BTreeSet<DeviceId>,
    /// Devices whose frontend node (or a channel under it) changed.
    pub(super) frontend: BTreeSet<DeviceId>,
    /// Devices whose counters changed.
    pub(super) stats: BTreeSet<DeviceId>,
    /// The first fault each channel reported.
    pub(super) faults: BTreeMap<(DeviceId, u32), ChannelFault>,
}

impl Pending {
    pub(super) fn len(&self) -> usize {
        usize::from(self.shutdown)
            + usize::from(self.watch_lost.is_some())
            + usize::from(self.rescan)
            + usize::from(self.release_domain)
            + self.backend.len()
            + self.frontend.len()
            + self.stats.len()
            + self.faults.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Shared by the watch forwarders, the channels' fault sinks, the resource accounts and the
/// daemon thread.
pub(super) struct EventQueue {
    root: String,
    pending: Mutex<Pending>,
    ready: Condvar,
    metrics: Arc<DaemonMetrics>,
}

impl EventQueue {
    /// A queue for the backend watching `root`.
    pub(super) fn new(root: String, metrics: Arc<DaemonMetrics>) -> EventQueue {
        EventQueue {
            root,
            pending: Mutex::default(),
            ready: Condvar::new(),
            metrics,
        }
    }

    /// Adds `event`, merged with what is already waiting.
    pub(super) fn push(&self, event: Event) {
        let mut p = lock(&self.pending);
        match event {
            Event::Shutdown => p.shutdown = true,
            Event::WatchLost(path) => {
                p.watch_lost.get_or_insert(path);
            }
            Event::ReleaseDomain => p.release_domain = true,
            Event::Backend(path) => match paths::device_of(&self.root, &path) {
                Some(id) => {
                    p.backend.insert(id);
                }
                None => p.rescan = true,
            },
            Event::Frontend(id) => {
                p.frontend.insert(id);
            }
            Event::StatsDirty(id) => {
                p.stats.insert(id);
            }
            Event::Fault(id, n, fault) => {
                p.faults.entry((id, n)).or_insert(fault);
            }
        }
        self.metrics.set_queue_len(p.len());
        drop(p);
        self.ready.notify_one();
    }

    /// Everything waiting, after waiting up to `timeout` for something (`None`: no limit).
    pub(super) fn take(&self, timeout: Option<Duration>) -> Pending {
        let mut p = lock(&self.pending);
        if p.is_empty() {
            p = match timeout {
                None => self
                    .ready
                    .wait_while(p, |p| p.is_empty())
                    .unwrap_or_else(|e| e.into_inner()),
                Some(t) => {
                    self.ready
                        .wait_timeout_while(p, t, |p| p.is_empty())
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
        let taken = std::mem::take(&mut *p);
        self.metrics.set_queue_len(0);
        taken
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_merge_into_one_entry_per_device_and_kind() {
        let metrics = Arc::new(DaemonMetrics::default());
        let root = paths::backend_root(0);
        let q = EventQueue::new(root.clone(), metrics.clone());
        let a = DeviceId { domid: 3, devid: 0 };
        let b = DeviceId { domid: 4, devid: 0 };
        for i in 0..10_000 {
            q.push(Event::Frontend(a));
            q.push(Event::StatsDirty(a));
            q.push(Event::Backend(format!("{root}/3/0/x{i}")));
            q.push(Event::Fault(a, 0, ChannelFault::Died));
        }
        q.push(Event::Frontend(b));
        q.push(Event::Backend(root.clone()));
        assert_eq!(metrics.snapshot().queue_high_water, 6);
        assert!(6 <= super::super::queue_capacity(2, 1));
        let p = q.take(Some(Duration::ZERO));
        assert_eq!(p.frontend, BTreeSet::from([a, b]));
        assert_eq!(p.backend, BTreeSet::from([a]));
        assert_eq!(p.stats, BTreeSet::from([a]));
        assert_eq!(p.faults.len(), 1);
        assert!(p.rescan);
        assert!(q.take(Some(Duration::ZERO)).is_empty());
        assert_eq!(metrics.snapshot().queue_len, 0);
    }
}
