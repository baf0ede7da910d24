//! The thread serving one channel: it sleeps on the channel's event channel (and a waker for
//! closing and deferred answers), serves the control ring, kicks the device engine, and
//! watches the alive byte. It never spins. Once the device's engine watches the event channel
//! itself ([`Device::takes_kicks`]), the thread sleeps on its waker alone and the engine wakes
//! it ([`EvtchnKicks`]) for a control request or the frontend's death: a kick for the engine
//! no longer wakes this thread.
//!
//! Closing takes bounded time whatever the guest does: the thread serves at most one ring's
//! worth of requests per wake-up and checks the stop flag before each request, so it stops
//! after the request in hand (one request's work is bounded by the guest's quotas); the daemon
//! waits for it at most [`CLOSE_WAIT`], then leaves it to reclaim on its own.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use shared_ring::xen_ring::header;
use shared_ring::{ControlBackRing, RingError, SharedRegion};
use xen_platform::EventChannel;

use super::service::ControlService;
use crate::daemon::FaultSink;
use crate::device::{Device, KickSource, Notifier};
use crate::xenbus::{ChannelFault, ChannelLink, CloseReason, DeviceId};

/// Offset of the alive byte in the ring page (`io/ring.h`'s private area, docs/split-driver.md).
pub const ALIVE_OFFSET: usize = 16;

/// How long closing a channel waits for its thread to finish reclaiming before the daemon
/// moves on (the thread then reclaims on its own; nothing is reclaimed twice).
pub const CLOSE_WAIT: Duration = Duration::from_millis(50);

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

/// The channel's event channel as the device's engine watches it
/// ([`crate::device::KickSource`]): the engine consumes the events, and wakes this channel's
/// thread when one may have been for it — a control request it has not served, or the
/// frontend's death (the alive byte cleared).
pub(super) struct EvtchnKicks {
    pub(super) evtchn: Arc<EventChannel>,
    pub(super) ring_page: SharedRegion,
    /// The thread's `req_cons` when it last went idle (stale values are lower: an extra
    /// wake-up, never a lost one).
    pub(super) served: Arc<AtomicU32>,
    pub(super) waker: Arc<Waker>,
}

impl std::os::fd::AsFd for EvtchnKicks {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.evtchn.as_fd()
    }
}

impl KickSource for EvtchnKicks {
    fn fired(&self) {
        if let Err(e) = self.evtchn.consume() {
            tracing::warn!("event channel: {e}");
        }
        // The guest published `req_prod` before it notified, so it is seen here; a value
        // that is garbage wakes the thread too, which reports the protocol error.
        let prod = self
            .ring_page
            .load_u32(header::REQ_PROD, Ordering::Acquire)
            .unwrap_or(0);
        if prod != self.served.load(Ordering::Acquire) || !alive(&self.ring_page) {
            let _ = self.waker.wake();
        }
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
    /// Shared with the channel's [`EvtchnKicks`]: `req_cons` when the thread last went idle.
    pub(super) served: Arc<AtomicU32>,
}

/// What the link and the thread share.
pub(super) struct Shared {
    pub(super) stop: AtomicBool,
    pub(super) reason: Mutex<Option<CloseReason>>,
    pub(super) waker: Arc<Waker>,
    /// Set (and signalled) once the thread has reclaimed everything.
    pub(super) done: Mutex<bool>,
    pub(super) done_cv: Condvar,
}

impl Shared {
    pub(super) fn new(waker: Arc<Waker>) -> Shared {
        Shared {
            stop: AtomicBool::new(false),
            reason: Mutex::new(None),
            waker,
            done: Mutex::new(false),
            done_cv: Condvar::new(),
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
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
        // Whether the device's engine watches the event channel (then this thread does not:
        // it is woken through its waker by `EvtchnKicks` when an event was for it).
        let mut handed_over = false;
        let fault = loop {
            let more = match self.serve() {
                Ok(more) => more,
                Err(e) => break Some(ChannelFault::Protocol(e.to_string())),
            };
            self.served.store(self.ring.req_cons(), Ordering::Release);
            let engine_watches = self
                .service
                .device_channel()
                .is_some_and(|ch| self.device.takes_kicks(ch));
            if engine_watches != handed_over {
                if let Err(e) = self.watch_evtchn(!engine_watches) {
                    break Some(ChannelFault::Protocol(format!(
                        "polling the event channel: {e}"
                    )));
                }
                handed_over = engine_watches;
                // Events consumed by neither side meanwhile are looked at once more.
                if handed_over && !alive(&self.ring_page) {
                    break Some(ChannelFault::Died);
                }
            }
            if !alive(&self.ring_page) {
                break Some(ChannelFault::Died);
            }
            if self.shared.stopping() {
                break None;
            }
            // With requests left over, only look for events; otherwise sleep until one.
            let timeout = if more {
                Some(Duration::ZERO)
            } else {
                // A waiting Connect is answered at its deadline even if nothing else happens.
                self.service
                    .next_deadline()
                    .map(|d| d.saturating_duration_since(std::time::Instant::now()))
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    break Some(ChannelFault::Protocol(format!(
                        "polling the event channel: {e}"
                    )));
                }
            }
            if handed_over {
                continue;
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
        *lock(&self.shared.done) = true;
        self.shared.done_cv.notify_all();
    }

    /// Starts (`watch`) or stops watching the event channel in this thread's poll.
    fn watch_evtchn(&self, watch: bool) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let fd = self.evtchn.as_raw_fd();
        if watch {
            Self::register(&self.poll, &self.evtchn)
        } else {
            self.poll.registry().deregister(&mut SourceFd(&fd))
        }
    }

    /// Serves the requests on the ring (at most one ring's worth, so a frontend that keeps
    /// publishing cannot keep the thread here) and the deferred answers, stopping early when
    /// the channel is being closed. Returns whether requests are left; an error is the
    /// frontend's protocol error.
    fn serve(&mut self) -> Result<bool, RingError> {
        let mut budget = self.ring.size();
        loop {
            let mut answered = false;
            while budget > 0 && !self.shared.stopping() {
                let Some(slot) = self.ring.next_request()? else {
                    break;
                };
                budget -= 1;
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
            if self.shared.stopping() {
                return Ok(false);
            }
            if budget == 0 {
                // Ask for a notification before sleeping, or the next request is never seen.
                return self.ring.final_check_for_requests();
            }
            if !self.ring.final_check_for_requests()? {
                return Ok(false);
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
    /// Stops the thread and waits at most [`CLOSE_WAIT`] for it to reclaim; a thread still in
    /// the middle of a request finishes it, then reclaims by itself (detached).
    fn close(mut self: Box<Self>, reason: &CloseReason) {
        *lock(&self.shared.reason) = Some(reason.clone());
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.shared.waker.wake();
        let (done, _) = self
            .shared
            .done_cv
            .wait_timeout_while(lock(&self.shared.done), CLOSE_WAIT, |done| !*done)
            .unwrap_or_else(|e| e.into_inner());
        let done = *done;
        let Some(t) = self.thread.take() else {
            return;
        };
        if done {
            if t.join().is_err() {
                tracing::error!("a channel thread panicked; its resources were dropped with it");
            }
        } else {
            tracing::warn!(
                thread = t.thread().name().unwrap_or("?"),
                "the channel's thread is still busy with a request after {CLOSE_WAIT:?}; it reclaims the channel when that request ends"
            );
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
