//! The control-ring service of a channel (docs/protocol.md §1, docs/backend.md "The control
//! service").
//!
//! - [`ControlOpener`] makes live channels for the xenbus state machine: it maps the guest's
//!   ring page read-write, checks the alive byte, binds the event channel and starts a thread
//!   that serves the ring.
//! - [`service::ControlService`] answers every op with full validation; it is driven one slot
//!   at a time, so tests feed it hostile slots directly.
//! - [`pages`]: page lists in both directions (guest grants for MRs, backend pages for
//!   queues).

mod channel;
pub mod pages;
pub mod policy;
pub mod service;

use std::sync::Arc;

use shared_ring::ControlBackRing;
use xen_platform::{Access, DomId, EvtchnPort, GrantRef, Platform, UnmapNotify};

use crate::daemon::FaultSink;
use crate::device::Device;
use crate::resources::budget::HostBudget;
use crate::xenbus::{ChannelLink, ChannelOpener, ChannelRequest};
pub use channel::{alive, ALIVE_OFFSET, CLOSE_WAIT};

/// Offset of the backend's alive byte in the control-ring page (the first of `io/ring.h`'s
/// pad bytes, docs/split-driver.md): set to 1 once the ring is mapped, cleared by the
/// mapping's unmap-notify (which also signals the guest) when this process goes away.
pub const BACKEND_ALIVE_OFFSET: usize = 20;
use channel::{ChannelNotifier, ControlLink, Running, Shared};
pub use service::ControlService;

/// Opens channels on a platform and device.
pub struct ControlOpener {
    platform: Platform,
    device: Arc<dyn Device>,
    faults: FaultSink,
    budget: Arc<HostBudget>,
    cm: Arc<policy::CmPolicy>,
}

impl ControlOpener {
    /// An opener whose host page budgets are the defaults (`[host]` of docs/backend.md) on
    /// this platform's limits.
    pub fn new(platform: Platform, device: Arc<dyn Device>, faults: FaultSink) -> ControlOpener {
        let limits = crate::config::HostConfig::default().budget_or_unlimited(&platform);
        ControlOpener::with_budget(platform, device, faults, Arc::new(HostBudget::new(limits)))
    }

    /// An opener charging every channel's pages to `budget` (one per daemon: it is host-wide).
    pub fn with_budget(
        platform: Platform,
        device: Arc<dyn Device>,
        faults: FaultSink,
        budget: Arc<HostBudget>,
    ) -> ControlOpener {
        ControlOpener {
            platform,
            device,
            faults,
            budget,
            cm: Arc::new(policy::CmPolicy::default()),
        }
    }

    /// Applies the daemon's connection-management policy (one per daemon: its quotas are
    /// per domain) to every channel.
    pub fn with_cm_policy(mut self, cm: Arc<policy::CmPolicy>) -> ControlOpener {
        self.cm = cm;
        self
    }
}

impl ChannelOpener for ControlOpener {
    fn open(&mut self, req: ChannelRequest) -> Result<Box<dyn ChannelLink>, String> {
        let domid = u16::try_from(req.device.domid)
            .ok()
            .map(DomId)
            .filter(|d| d.is_normal())
            .ok_or_else(|| format!("domain {} is not a normal domain", req.device.domid))?;
        let mapping = self
            .platform
            .map_grants(domid, &[GrantRef(req.ring_ref)], Access::ReadWrite)
            .map_err(|e| {
                format!(
                    "cannot map the control ring (grant {} of domain {domid}) read-write: {e}",
                    req.ring_ref
                )
            })?;
        let evtchn = self
            .platform
            .bind_interdomain(domid, EvtchnPort(req.event_channel))
            .map_err(|e| {
                format!(
                    "cannot bind event channel {} of domain {domid}: {e}",
                    req.event_channel
                )
            })?;
        // When our mapping goes (this process exits or is killed, or the channel closes), the
        // platform clears our alive byte and signals the guest: it learns its backend is gone.
        mapping
            .set_unmap_notify(UnmapNotify {
                clear_byte: Some(BACKEND_ALIVE_OFFSET),
                event: Some(evtchn.local_port()),
            })
            .map_err(|e| format!("cannot set unmap-notify on the control ring mapping: {e}"))?;
        let ring_page = mapping
            .into_region()
            .map_err(|e| format!("control ring mapping: {e}"))?;
        if !alive(&ring_page) {
            return Err(format!(
                "the control ring's alive byte (offset {ALIVE_OFFSET}) is 0: set it to 1 before state 3"
            ));
        }
        let ring =
            ControlBackRing::new(ring_page.clone()).map_err(|e| format!("control ring: {e}"))?;
        ring_page
            .store_u32(
                BACKEND_ALIVE_OFFSET,
                1,
                std::sync::atomic::Ordering::Release,
            )
            .map_err(|e| format!("control ring: {e}"))?;
        let evtchn = Arc::new(evtchn);
        let poll = mio::Poll::new().map_err(|e| format!("poll: {e}"))?;
        let waker = Arc::new(
            mio::Waker::new(poll.registry(), channel::WAKE).map_err(|e| format!("waker: {e}"))?,
        );
        Running::register(&poll, &evtchn).map_err(|e| format!("poll: {e}"))?;
        let served = Arc::new(std::sync::atomic::AtomicU32::new(ring.req_cons()));
        let kicks = Arc::new(channel::EvtchnKicks {
            evtchn: evtchn.clone(),
            ring_page: ring_page.clone(),
            served: served.clone(),
            waker: waker.clone(),
        });
        let notifier = Arc::new(ChannelNotifier {
            evtchn: evtchn.clone(),
            waker: waker.clone(),
        });
        let service = ControlService::new(
            req.device,
            req.channel,
            self.platform.clone(),
            self.device.clone(),
            req.account.clone(),
            req.mode,
            notifier,
        )
        .with_budget(self.budget.clone())
        .with_cm_policy(self.cm.clone())
        .with_kick_source(kicks);
        let shared = Arc::new(Shared::new(waker));
        let running = Running {
            service,
            ring,
            ring_page,
            evtchn,
            device: self.device.clone(),
            poll,
            shared: shared.clone(),
            faults: self.faults.clone(),
            device_id: req.device,
            channel: req.channel,
            served,
        };
        let thread = std::thread::Builder::new()
            .name(format!(
                "vrdma-ch{}.{}.{}",
                req.device.domid, req.device.devid, req.channel
            ))
            .spawn(move || running.run())
            .map_err(|e| format!("cannot start the channel's thread: {e}"))?;
        Ok(Box::new(ControlLink {
            shared,
            thread: Some(thread),
        }))
    }
}
