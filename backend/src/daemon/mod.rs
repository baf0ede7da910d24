//! The daemon: one control-plane thread runs the xenbus state machines ([`XenbusBackend`]);
//! everything that can happen reaches it as an [`Event`] on one queue — watch events
//! (forwarded by one small thread per watch), channel faults (from the control services),
//! stats changes, signals. Each event makes the state machines look at XenStore again, so the
//! loop converges whatever the order of events.
//!
//! A guest can only hurt itself: the queue coalesces (N events about one device are one
//! entry, so it is bounded by [`queue_capacity`]), each device's frontend scans are paced by a
//! token bucket ([`FRONTEND_SCAN_BURST`], [`FRONTEND_SCANS_PER_SEC`]), its stats are published
//! at most every [`STATS_MIN_INTERVAL`] under a path the daemon does not watch, and closing a
//! channel never waits on the channel's thread for long.

pub mod host;
mod metrics;
mod pacing;
mod queue;
pub mod signals;
mod watches;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xenstore_proto::client::XenbusStore;

use crate::device::{Device, DeviceAttrs};
use crate::resources::Quotas;
use crate::xenbus::{ChannelFault, ChannelOpener, DeviceId, DeviceInfo, XenbusBackend};
pub use metrics::{DaemonMetrics, MetricsSnapshot};
use pacing::TokenBucket;
use queue::{EventQueue, Pending};
use watches::WatchPump;

/// How often per-domain device counters (ops, bytes, ...) are republished when they change.
pub const STATS_INTERVAL: Duration = Duration::from_secs(2);

/// Frontend scans a device may make at once before pacing starts.
pub const FRONTEND_SCAN_BURST: u32 = 8;
/// Frontend scans per second a device gets once its burst is spent.
pub const FRONTEND_SCANS_PER_SEC: u32 = 50;
/// The shortest time between two stats publications of one device.
pub const STATS_MIN_INTERVAL: Duration = Duration::from_millis(250);

/// The most entries the event queue can hold with `devices` devices and `channels` live
/// channels: one per device and kind (backend, frontend, stats), one fault per channel, and
/// the fixed ones (rescan, release, watch lost, shutdown).
pub fn queue_capacity(devices: usize, channels: usize) -> usize {
    3 * devices + channels + 4
}

/// Something the daemon must react to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A watch fired under the backend root.
    Backend(String),
    /// A watch fired under a device's frontend node.
    Frontend(DeviceId),
    /// `@releaseDomain` fired.
    ReleaseDomain,
    /// A channel's control service reported a fault.
    Fault(DeviceId, u32, ChannelFault),
    /// A device's resource usage changed.
    StatsDirty(DeviceId),
    /// A watch stopped (its connection to XenStore is gone).
    WatchLost(String),
    /// Stop: close every channel politely and return.
    Shutdown,
}

/// Reports channel faults to the daemon (handed to the channel opener).
#[derive(Clone)]
pub struct FaultSink(Arc<EventQueue>);

impl FaultSink {
    /// Reports `fault` of channel `n` of `device`.
    pub fn report(&self, device: DeviceId, n: u32, fault: ChannelFault) {
        self.0.push(Event::Fault(device, n, fault));
    }
}

impl std::fmt::Debug for FaultSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultSink")
    }
}

/// Asks a running daemon to stop (SIGTERM does the same).
#[derive(Clone, Debug)]
pub struct ShutdownHandle(Arc<EventQueue>);

impl std::fmt::Debug for EventQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventQueue")
    }
}

impl ShutdownHandle {
    pub fn shutdown(&self) {
        self.0.push(Event::Shutdown);
    }
}

/// Why the daemon stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("XenStore: {0}")]
    XenStore(#[from] xenstore_proto::client::Error),
    #[error("XenStore watch on {0} ended (connection lost)")]
    WatchLost(String),
}

/// What the backend publishes for each device, from the device's limits and its first
/// address (guests hand it to their peers).
pub fn device_info_of(kind: &str, device: &dyn Device) -> DeviceInfo {
    DeviceInfo {
        address: device.local_addrs().first().copied(),
        ..device_info(kind, &device.attrs())
    }
}

/// What the backend publishes for each device, from the device's limits.
pub fn device_info(kind: &str, attrs: &DeviceAttrs) -> DeviceInfo {
    use shared_ring::abi::xenstore::DeviceKey;
    DeviceInfo {
        versions: vec![shared_ring::PROTOCOL_VERSION],
        kind: kind.to_owned(),
        limits: vec![
            (
                DeviceKey::MaxQpWr.as_str().into(),
                u64::from(attrs.max_qp_wr),
            ),
            (DeviceKey::MaxCqe.as_str().into(), u64::from(attrs.max_cqe)),
            (DeviceKey::MaxSge.as_str().into(), u64::from(attrs.max_sge)),
            (
                DeviceKey::MaxInline.as_str().into(),
                u64::from(attrs.max_inline),
            ),
            (
                DeviceKey::MaxMrSize.as_str().into(),
                u64::from(attrs.max_mr_pages) * xen_platform::PAGE_SIZE as u64,
            ),
        ],
        address: None,
    }
}

/// The per-domain device counters published under `stats/` next to the resource counts, and
/// the counters of each live QP of the domain under `stats/qp/<qpn>/` (`ops`, `bytes`,
/// `errors`, `recvs`, `state`).
pub fn device_stats_source(device: Arc<dyn Device>) -> crate::xenbus::StatsSource {
    Box::new(move |domid| {
        let domid = xen_platform::DomId(domid as u16);
        let s = device.domain_stats(domid);
        let qps = device
            .domain_qp_stats(domid)
            .into_iter()
            .map(|q| {
                let keys = BTreeMap::from([
                    ("ops", q.ops.to_string()),
                    ("bytes", q.bytes.to_string()),
                    ("errors", q.errors.to_string()),
                    ("recvs", q.recvs.to_string()),
                    ("state", qp_state_name(q.state).to_owned()),
                ]);
                (q.qp.0, keys)
            })
            .collect();
        crate::xenbus::StatsSnapshot {
            counters: vec![
                ("ops", s.ops),
                ("bytes", s.bytes),
                ("errors", s.errors),
                ("notifications", s.notifications),
                ("events", s.events),
                ("copied-bytes", s.copied_bytes),
            ],
            qps,
        }
    })
}

/// The name a QP state is published under (`stats/qp/<qpn>/state`).
pub fn qp_state_name(s: shared_ring::abi::control::QpState) -> &'static str {
    use shared_ring::abi::control::QpState;
    match s {
        QpState::Reset => "reset",
        QpState::Init => "init",
        QpState::Rtr => "rtr",
        QpState::Rts => "rts",
        QpState::Sqd => "sqd",
        QpState::Sqe => "sqe",
        QpState::Error => "error",
    }
}

/// The daemon's control plane.
pub struct Daemon {
    store: Arc<dyn XenbusStore>,
    xenbus: XenbusBackend,
    queue: Arc<EventQueue>,
    pumps: BTreeMap<String, WatchPump>,
    metrics: Arc<DaemonMetrics>,
    /// Per device: frontend scans allowed now.
    scan_budget: BTreeMap<DeviceId, TokenBucket>,
    /// Devices whose frontend scan waits for the budget.
    scan_deferred: BTreeSet<DeviceId>,
    /// Per device: when its stats were last written.
    stats_at: BTreeMap<DeviceId, Instant>,
    /// Devices whose stats publication waits for [`STATS_MIN_INTERVAL`].
    stats_deferred: BTreeSet<DeviceId>,
    /// When every device's counters are next looked at (they change without events).
    stats_tick: Instant,
}

impl Daemon {
    /// A daemon for backend domain `backend_domid`. `make_opener` builds the channel opener
    /// (it gets the sink through which channels report faults).
    pub fn new(
        store: Arc<dyn XenbusStore>,
        backend_domid: u32,
        info: DeviceInfo,
        defaults: Quotas,
        stats: crate::xenbus::StatsSource,
        make_opener: impl FnOnce(FaultSink) -> Box<dyn ChannelOpener>,
    ) -> Daemon {
        let metrics = Arc::new(DaemonMetrics::default());
        let store: Arc<dyn XenbusStore> =
            Arc::new(metrics::CountingStore::new(store, metrics.clone()));
        let queue = Arc::new(EventQueue::new(
            crate::xenbus::backend_root(backend_domid),
            metrics.clone(),
        ));
        let on_change = {
            let queue = queue.clone();
            Arc::new(move |id: DeviceId| queue.push(Event::StatsDirty(id)))
        };
        let opener = make_opener(FaultSink(queue.clone()));
        let xenbus = XenbusBackend::new(
            store.clone(),
            backend_domid,
            info,
            defaults,
            opener,
            on_change,
            stats,
        );
        Daemon {
            store,
            xenbus,
            queue,
            pumps: BTreeMap::new(),
            metrics,
            scan_budget: BTreeMap::new(),
            scan_deferred: BTreeSet::new(),
            stats_at: BTreeMap::new(),
            stats_deferred: BTreeSet::new(),
            stats_tick: Instant::now() + STATS_INTERVAL,
        }
    }

    /// The daemon's counters (XenStore operations, event queue length).
    pub fn metrics(&self) -> Arc<DaemonMetrics> {
        self.metrics.clone()
    }

    /// A handle that stops [`Daemon::run`].
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.queue.clone())
    }

    /// Serves until shut down (then every channel is closed politely) or until XenStore is
    /// lost (an error).
    pub fn run(mut self) -> Result<(), DaemonError> {
        let root = self.xenbus.root().to_owned();
        self.add_pump(root.clone(), Event::Backend)?;
        self.add_pump("@releaseDomain".into(), |_| Event::ReleaseDomain)?;
        tracing::info!("watching {root} and @releaseDomain");
        let outcome = self.serve();
        self.xenbus.shutdown();
        self.pumps.clear();
        tracing::info!("all channels closed; daemon stopped");
        outcome
    }

    fn serve(&mut self) -> Result<(), DaemonError> {
        self.xenbus.scan()?;
        self.sync_pumps()?;
        loop {
            let timeout = self
                .next_deadline()
                .map(|at| at.saturating_duration_since(Instant::now()));
            let batch = self.queue.take(timeout);
            tracing::trace!(?batch, "events");
            if batch.shutdown {
                tracing::info!("shutting down: closing every channel");
                return Ok(());
            }
            if let Some(path) = batch.watch_lost {
                return Err(DaemonError::WatchLost(path));
            }
            self.handle(batch)?;
            self.sync_pumps()?;
        }
    }

    /// Serves one batch of merged events, then whatever pacing held back and is now due.
    fn handle(&mut self, batch: Pending) -> Result<(), DaemonError> {
        let Pending {
            rescan,
            release_domain,
            backend,
            frontend,
            stats,
            faults,
            ..
        } = batch;
        for ((id, n), fault) in faults {
            let r = self.xenbus.channel_fault(id, n, fault);
            self.check(r)?;
        }
        if rescan {
            // Evaluates every device, frontends included.
            let r = self.xenbus.scan();
            self.check(r)?;
        } else {
            for &id in &backend {
                // The toolstack's node: never paced; evaluating includes the frontend scan.
                let r = self.xenbus.evaluate(id);
                self.check(r)?;
                self.scan_deferred.remove(&id);
            }
        }
        if release_domain {
            let r = self.xenbus.on_release_domain();
            self.check(r)?;
        }
        let now = Instant::now();
        let frontend: BTreeSet<DeviceId> = if rescan {
            BTreeSet::new()
        } else {
            frontend
                .into_iter()
                .filter(|id| !backend.contains(id))
                .chain(std::mem::take(&mut self.scan_deferred))
                .collect()
        };
        for id in frontend {
            let budget = self.scan_budget.entry(id).or_insert_with(|| {
                TokenBucket::new(FRONTEND_SCAN_BURST, FRONTEND_SCANS_PER_SEC, now)
            });
            if budget.try_take(now) {
                self.metrics.frontend_scanned();
                let r = self.xenbus.scan_frontend(id);
                self.check(r)?;
            } else {
                self.scan_deferred.insert(id);
            }
        }
        let mut due: BTreeSet<DeviceId> = stats
            .into_iter()
            .chain(std::mem::take(&mut self.stats_deferred))
            .collect();
        if now >= self.stats_tick {
            due.extend(self.xenbus.devices());
            self.stats_tick = now + STATS_INTERVAL;
        }
        for id in due {
            match self.stats_at.get(&id) {
                Some(&at) if now < at + STATS_MIN_INTERVAL => {
                    self.stats_deferred.insert(id);
                }
                _ => {
                    let r = self.xenbus.publish_stats(id);
                    if matches!(r, Ok(true)) {
                        self.metrics.stats_published();
                        self.stats_at.insert(id, now);
                    }
                    self.check(r.map(|_| ()))?;
                }
            }
        }
        self.forget_gone_devices();
        Ok(())
    }

    /// When the loop must wake up without an event: deferred work, or the stats tick while
    /// there are devices (their data-path counters change without any event, so they are
    /// looked at every [`STATS_INTERVAL`]; with no device there is nothing to look at, and an
    /// idle daemon sleeps until an event).
    fn next_deadline(&self) -> Option<Instant> {
        let scans = self
            .scan_deferred
            .iter()
            .filter_map(|id| self.scan_budget.get(id).map(TokenBucket::next_at));
        let stats = self
            .stats_deferred
            .iter()
            .filter_map(|id| self.stats_at.get(id).map(|&at| at + STATS_MIN_INTERVAL));
        let tick = (!self.xenbus.devices().is_empty()).then_some(self.stats_tick);
        scans.chain(stats).chain(tick).min()
    }

    /// Pacing state of devices the backend no longer knows is dropped.
    fn forget_gone_devices(&mut self) {
        let known: BTreeSet<DeviceId> = self.xenbus.devices().into_iter().collect();
        self.scan_budget.retain(|id, _| known.contains(id));
        self.scan_deferred.retain(|id| known.contains(id));
        self.stats_at.retain(|id, _| known.contains(id));
        self.stats_deferred.retain(|id| known.contains(id));
    }

    /// A XenStore error in one handler is logged and the loop goes on, unless the connection
    /// is gone.
    fn check(&self, r: xenstore_proto::client::Result<()>) -> Result<(), DaemonError> {
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.is_connection_lost() => Err(e.into()),
            Err(e) => {
                tracing::warn!("XenStore operation failed (will retry on the next event): {e}");
                Ok(())
            }
        }
    }

    fn add_pump(
        &mut self,
        path: String,
        map: impl Fn(String) -> Event + Send + 'static,
    ) -> Result<(), DaemonError> {
        let pump = WatchPump::start(&*self.store, &path, self.queue.clone(), map)?;
        self.pumps.insert(path, pump);
        Ok(())
    }

    /// One watch per known device's frontend node; dropped with the device.
    fn sync_pumps(&mut self) -> Result<(), DaemonError> {
        let wanted: BTreeMap<String, DeviceId> = self
            .xenbus
            .frontend_paths()
            .into_iter()
            .map(|(id, p)| (p, id))
            .collect();
        let fixed = [self.xenbus.root().to_owned(), "@releaseDomain".to_owned()];
        self.pumps
            .retain(|p, _| wanted.contains_key(p) || fixed.contains(p));
        for (path, id) in wanted {
            if !self.pumps.contains_key(&path) {
                self.add_pump(path, move |_| Event::Frontend(id))?;
            }
        }
        Ok(())
    }
}
