//! The thread serving one channel: it sleeps on the channel's event channel (and a waker for
//! closing and deferred answers), serves the control ring, kicks the device engine, and
//! watches the alive byte. It never spins.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use shared_ring::{ControlBackRing, RingError, SharedRegion};
use xen_platform::EventChannel;

use super::service::ControlService;
use crate::daemon::FaultSink;
use crate::device::{Device, Notifier};
use crate::xenbus::{ChannelFault, ChannelLink, CloseReason, DeviceId};

/// Offset of the alive byte in the ring page (`io/ring.h`'s private area, docs/split-driver.md).
pub const ALIVE_OFFSET: usize = 16;

const EVTCHN: Token = Token(0);
pub(super) const WAKE: Token = Token(1);

/// Whether the frontend process is still there (its unmap-notify clears the byte).
pub fn alive(ring_page: &SharedRegion) -> bool {
    ring_page
        .load_u32(ALIVE_OFFSET, Ordering::Acquire)
        .map(|w| w.to_le_bytes()[0] != 0)
        .unwrap_or(false)
}

/// Notifies the frontend and wakes the channel thread (a connection may have completed).
pub(super) struct ChannelNotifier {
    pub(super) evtchn: Arc<EventChannel>,
    pub(super) waker: Arc<Waker>,
}

impl Notifier for ChannelNotifier {
    fn notify(&self) {
        Notifier::notify(&*self.evtchn);
        let _ = self.waker.wake();
    }
}

pub(super) struct Running {
    pub(super) service: ControlService,
    pub(super) ring: ControlBackRing,
    pub(super) ring_page: SharedRegion,
    pub(super) evtchn: Arc<EventChannel>,
    pub(super) device: Arc<dyn Device>,
    pub(super) poll: Poll,
    pub(super) shared: Arc<Shared>,
    pub(super) faults: FaultSink,
    pub(super) device_id: DeviceId,
    pub(super) channel: u32,
}

/// What the link and the thread share.
pub(super) struct Shared {
    pub(super) stop: AtomicBool,
    pub(super) reason: Mutex<Option<CloseReason>>,
    pub(super) waker: Arc<Waker>,
}

impl Running {
    /// Registers the event channel with the poll.
    pub(super) fn register(poll: &Poll, evtchn: &EventChannel) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let fd = evtchn.as_raw_fd();
        poll.registry()
            .register(&mut SourceFd(&fd), EVTCHN, Interest::READABLE)
    }

    pub(super) fn run(mut self) {
        let mut events = Events::with_capacity(4);
        let fault = loop {
            if let Err(e) = self.serve() {
                break Some(ChannelFault::Protocol(e.to_string()));
            }
            if !alive(&self.ring_page) {
                break Some(ChannelFault::Died);
            }
            if self.shared.stop.load(Ordering::Acquire) {
                break None;
            }
            if let Err(e) = self.poll.poll(&mut events, None) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    break Some(ChannelFault::Protocol(format!(
                        "polling the event channel: {e}"
                    )));
                }
            }
            if let Err(e) = self.evtchn.consume() {
                tracing::warn!(device = %self.device_id, channel = self.channel, "event channel: {e}");
            }
            if let Some(ch) = self.service.device_channel() {
                self.device.kick(ch);
            }
        };
        let reason = match &fault {
            Some(ChannelFault::Died) => CloseReason::ProcessDied,
            Some(ChannelFault::Protocol(why)) => {
                tracing::warn!(device = %self.device_id, channel = self.channel, "closing the channel: {why}");
                CloseReason::ProtocolError(why.clone())
            }
            None => lock(&self.shared.reason)
                .clone()
                .unwrap_or(CloseReason::Shutdown),
        };
        if reason == CloseReason::ProcessDied {
            tracing::info!(device = %self.device_id, channel = self.channel, "the frontend process died (alive byte cleared)");
        }
        self.service.reclaim(&reason);
        if let Some(f) = fault {
            self.faults.report(self.device_id, self.channel, f);
        }
    }

    /// Serves every request on the ring and the deferred answers; an error is the
    /// frontend's protocol error.
    fn serve(&mut self) -> Result<(), RingError> {
        loop {
            let mut answered = false;
            while let Some(slot) = self.ring.next_request()? {
                if let Some(rsp) = self.service.handle(&slot) {
                    self.ring.write_response(&rsp)?;
                    answered = true;
                }
            }
            if self.service.has_pending() {
                for rsp in self.service.poll_pending() {
                    self.ring.write_response(&rsp)?;
                    answered = true;
                }
            }
            if answered && self.ring.push_responses_and_check_notify() {
                Notifier::notify(&*self.evtchn);
            }
            if !self.ring.final_check_for_requests()? {
                return Ok(());
            }
        }
    }
}

/// The daemon's handle on a running channel.
pub(super) struct ControlLink {
    pub(super) shared: Arc<Shared>,
    pub(super) thread: Option<JoinHandle<()>>,
}

impl ChannelLink for ControlLink {
    fn close(mut self: Box<Self>, reason: &CloseReason) {
        *lock(&self.shared.reason) = Some(reason.clone());
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.shared.waker.wake();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("a channel thread panicked; its resources were dropped with it");
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
