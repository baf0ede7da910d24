//! The daemon: one control-plane thread runs the xenbus state machines ([`XenbusBackend`]);
//! everything that can happen reaches it as an [`Event`] on one queue — watch events
//! (forwarded by one small thread per watch), channel faults (from the control services),
//! stats changes, signals. Each event makes the state machines look at XenStore again, so the
//! loop converges whatever the order of events.

pub mod host;
pub mod signals;
mod watches;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xenstore_proto::client::XenbusStore;

use crate::device::{Device, DeviceAttrs};
use crate::resources::Quotas;
use crate::xenbus::{ChannelFault, ChannelOpener, DeviceId, DeviceInfo, XenbusBackend};
use watches::WatchPump;

/// How often per-domain device counters (ops, bytes, ...) are republished when they change.
pub const STATS_INTERVAL: Duration = Duration::from_secs(2);

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
pub struct FaultSink(Sender<Event>);

impl FaultSink {
    /// Reports `fault` of channel `n` of `device`.
    pub fn report(&self, device: DeviceId, n: u32, fault: ChannelFault) {
        // A closed queue means the daemon is already gone; nothing left to tell.
        let _ = self.0.send(Event::Fault(device, n, fault));
    }
}

impl std::fmt::Debug for FaultSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultSink")
    }
}

/// Asks a running daemon to stop (SIGTERM does the same).
#[derive(Clone, Debug)]
pub struct ShutdownHandle(Sender<Event>);

impl ShutdownHandle {
    pub fn shutdown(&self) {
        let _ = self.0.send(Event::Shutdown);
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

/// What the backend publishes for each device, from the device's limits.
pub fn device_info(kind: &str, attrs: &DeviceAttrs) -> DeviceInfo {
    DeviceInfo {
        versions: vec![shared_ring::PROTOCOL_VERSION],
        kind: kind.to_owned(),
        limits: vec![
            ("max-qp-wr".into(), u64::from(attrs.max_qp_wr)),
            ("max-cqe".into(), u64::from(attrs.max_cqe)),
            ("max-sge".into(), u64::from(attrs.max_sge)),
            ("max-inline".into(), u64::from(attrs.max_inline)),
            (
                "max-mr-size".into(),
                u64::from(attrs.max_mr_pages) * xen_platform::PAGE_SIZE as u64,
            ),
        ],
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
    tx: Sender<Event>,
    rx: Receiver<Event>,
    pumps: BTreeMap<String, WatchPump>,
    dirty: Arc<Mutex<BTreeSet<DeviceId>>>,
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
        let (tx, rx) = mpsc::channel();
        let dirty: Arc<Mutex<BTreeSet<DeviceId>>> = Arc::default();
        let on_change = {
            let tx = tx.clone();
            let dirty = dirty.clone();
            Arc::new(move |id: DeviceId| {
                // Coalesce: one event per device until the daemon publishes.
                if lock(&dirty).insert(id) {
                    let _ = tx.send(Event::StatsDirty(id));
                }
            })
        };
        let opener = make_opener(FaultSink(tx.clone()));
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
            tx,
            rx,
            pumps: BTreeMap::new(),
            dirty,
        }
    }

    /// A handle that stops [`Daemon::run`].
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.tx.clone())
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
            let event = match self.rx.recv_timeout(STATS_INTERVAL) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => {
                    for id in self.xenbus.devices() {
                        let r = self.xenbus.publish_stats(id);
                        self.check(r)?;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            };
            tracing::trace!(?event, "event");
            let result = match event {
                Event::Shutdown => {
                    tracing::info!("shutting down: closing every channel");
                    return Ok(());
                }
                Event::WatchLost(path) => return Err(DaemonError::WatchLost(path)),
                Event::Backend(path) => self.xenbus.on_backend_path(&path),
                Event::Frontend(id) => self.xenbus.scan_frontend(id),
                Event::ReleaseDomain => self.xenbus.on_release_domain(),
                Event::Fault(id, n, fault) => self.xenbus.channel_fault(id, n, fault),
                Event::StatsDirty(id) => {
                    lock(&self.dirty).remove(&id);
                    self.xenbus.publish_stats(id)
                }
            };
            self.check(result)?;
            self.sync_pumps()?;
        }
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
        let pump = WatchPump::start(&*self.store, &path, self.tx.clone(), map)?;
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
