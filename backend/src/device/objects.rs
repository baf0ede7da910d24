//! The device's objects as the engine sees them: channels, CQs and QPs, with the locks that
//! guard their shared-memory endpoints.
//!
//! Lock order (deadlock freedom): the control path's table lock, then a remote QP's connection
//! (`iwarp::RemoteQp::conn`), then QP send sides (several only under the table lock), then QP
//! receive sides, then CQs, then a channel's event ring.
//! The engine holds at most one send side (its own QP's) and one receive side (its peer's).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use shared_ring::abi::control::QpState;
use shared_ring::abi::cqe::{CqeRepr, CqeStatus, CQE_LEN};
use shared_ring::abi::event::{EventKind, EventRepr, EVENT_LEN};
use shared_ring::abi::wqe::{WqeRepr, MAX_SGE, WQE_LEN};
use shared_ring::cq::{CqPoller, CqWriter};
use shared_ring::doorbell::{CqDoorbell, DoorbellError, DoorbellPage, EngineSleep, QueueDoorbell};
use shared_ring::queue::{PhaseProbe, Producer};
use shared_ring::{SharedWord, WqConsumer};

use super::mr::Seg;
use super::stats::{ChanStats, QpCounters};
use super::waker::EngineWaker;
use super::{ChannelId, ChannelMode, CqId, DomId, Notifier, PdId, QpNum};

/// Locks a mutex, recovering from poisoning: the protected state is plain data that stays
/// consistent between statements, and a panic elsewhere must not stop the device.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The doorbell pages of a channel. Slots are numbered across pages: the first page's slots
/// come first, then the second's, and so on.
///
/// In bypass mode the engine follows the guest's pages. In mediated mode every guest page has a
/// private twin whose producer indexes and CQ words only the control path writes
/// ([`super::Device::post_mediated`], [`super::Device::poll_cq_mediated`]); the consumer indexes
/// of the send and receive queues are still written to the guest's page, so the frontend sees
/// its queue slots free up.
pub(crate) struct Doorbells {
    guest: Vec<DoorbellPage>,
    /// Mediated mode: one private page per guest page.
    private: Option<Vec<DoorbellPage>>,
}

impl Doorbells {
    /// The pages of a channel in `mode`, starting with the guest's (initialised) first page.
    pub(crate) fn new(first: DoorbellPage, mode: ChannelMode) -> Result<Self, DoorbellError> {
        let mut d = Doorbells {
            guest: Vec::new(),
            private: (mode == ChannelMode::Mediated).then(Vec::new),
        };
        d.push(first)?;
        Ok(d)
    }

    /// Adds an initialised guest page; returns the number of its first slot.
    pub(crate) fn push(&mut self, page: DoorbellPage) -> Result<u32, DoorbellError> {
        let first = self.slots();
        if let Some(private) = &mut self.private {
            // Same slot count as the guest page: 128-byte header, 128 bytes per slot.
            let len = (128 + page.slots() as usize * 128).next_multiple_of(shared_ring::PAGE_SIZE);
            let region = shared_ring::SharedRegion::alloc(len)?;
            private.push(DoorbellPage::init(region, shared_ring::PROTOCOL_VERSION)?);
        }
        self.guest.push(page);
        Ok(first)
    }

    /// Whether the engine follows private producer indexes (mediated mode).
    pub(crate) fn mediated(&self) -> bool {
        self.private.is_some()
    }

    /// Slots of all pages.
    pub(crate) fn slots(&self) -> u32 {
        self.guest.iter().map(DoorbellPage::slots).sum()
    }

    /// Pages so far.
    pub(crate) fn pages(&self) -> usize {
        self.guest.len()
    }

    /// (page, slot within the page) of a channel slot.
    fn locate(&self, slot: u32) -> Result<(usize, u32), DoorbellError> {
        let mut s = slot;
        for (i, p) in self.guest.iter().enumerate() {
            if s < p.slots() {
                return Ok((i, s));
            }
            s -= p.slots();
        }
        Err(DoorbellError::NoSuchSlot {
            slot,
            slots: self.slots(),
        })
    }

    /// The index words the engine follows for a send or receive queue.
    pub(crate) fn queue(&self, slot: u32) -> Result<QueueDoorbell, DoorbellError> {
        let (page, k) = self.locate(slot)?;
        let guest = self.guest[page].queue(k)?;
        Ok(match &self.private {
            None => guest,
            Some(private) => QueueDoorbell {
                prod: private[page].queue(k)?.prod,
                cons: guest.cons,
            },
        })
    }

    /// The words the engine follows for a CQ.
    pub(crate) fn cq(&self, slot: u32) -> Result<CqDoorbell, DoorbellError> {
        let (page, k) = self.locate(slot)?;
        match &self.private {
            None => self.guest[page].cq(k),
            Some(private) => private[page].cq(k),
        }
    }
}

/// A channel as the engine sees it.
pub(crate) struct Channel {
    pub(crate) id: ChannelId,
    pub(crate) domid: DomId,
    pub(crate) mode: ChannelMode,
    /// The channel's doorbell pages (the first one at open, more on demand).
    pub(crate) doorbells: Mutex<Doorbells>,
    /// The engine's sleep word in the guest's doorbell page (only the owning engine uses it).
    pub(crate) sleep: Mutex<EngineSleep>,
    events: Mutex<Producer<EVENT_LEN>>,
    notifier: Arc<dyn Notifier>,
    pub(crate) stats: ChanStats,
    pub(crate) engine: Arc<EngineWaker>,
    /// QPs the engine serves (snapshot taken when `engine.generation` changes).
    pub(crate) qps: Mutex<Vec<Arc<Qp>>>,
    pub(crate) closed: AtomicBool,
    /// The guest's event channel, registered with the engine's poller (bypass channels whose
    /// daemon gave one); kept open here until the channel is closed and it is deregistered.
    pub(crate) kick_source: Option<Arc<dyn super::KickSource>>,
}

impl Channel {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: ChannelId,
        domid: DomId,
        mode: ChannelMode,
        doorbells: Doorbells,
        sleep: EngineSleep,
        events: Producer<EVENT_LEN>,
        notifier: Arc<dyn Notifier>,
        stats: ChanStats,
        engine: Arc<EngineWaker>,
    ) -> Self {
        Self {
            id,
            domid,
            mode,
            doorbells: Mutex::new(doorbells),
            sleep: Mutex::new(sleep),
            events: Mutex::new(events),
            notifier,
            stats,
            engine,
            qps: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            kick_source: None,
        }
    }

    pub(crate) fn notify(&self) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        self.stats.notification();
        self.notifier.notify();
    }

    /// Writes an async event and notifies; a full (or garbled) ring drops it.
    pub(crate) fn event(&self, kind: EventKind, handle: u32, detail: u64) {
        self.post(&EventRepr {
            kind,
            handle,
            detail,
        });
    }

    pub(crate) fn post(&self, ev: &EventRepr) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        self.stats.event();
        let written = {
            let mut p = lock(&self.events);
            match p.write(&ev.to_bytes()) {
                Ok(_) => {
                    p.publish();
                    true
                }
                Err(e) => {
                    tracing::debug!(ch = self.id.0, ?ev, "event dropped: {e}");
                    false
                }
            }
        };
        if written {
            self.notify();
        } else {
            self.stats.error();
        }
    }
}

/// The writer state of a CQ.
pub(crate) struct CqState {
    pub(crate) writer: CqWriter,
    /// Overrun (or garbage consumer index): completions are dropped from now on.
    pub(crate) broken: bool,
}

/// A completion queue.
pub(crate) struct Cq {
    pub(crate) id: CqId,
    pub(crate) ch: Arc<Channel>,
    pub(crate) state: Mutex<CqState>,
    /// Mediated mode: the backend polls on the frontend's behalf.
    pub(crate) poller: Option<Mutex<CqPoller>>,
    /// QPs using the CQ.
    pub(crate) users: AtomicU32,
}

impl Cq {
    /// Writes a completion; `false` if it was lost (the CQ overflowed now or before).
    pub(crate) fn complete(&self, cqe: &CqeRepr, solicited: bool) -> bool {
        let notify = {
            let mut s = lock(&self.state);
            if s.broken {
                drop(s);
                self.ch.stats.error();
                return false;
            }
            match s.writer.write_repr(cqe) {
                Ok(_) => s
                    .writer
                    .notify_needed(solicited || cqe.status != CqeStatus::Success),
                Err(e) => {
                    s.broken = true;
                    drop(s);
                    tracing::debug!(ch = self.ch.id.0, cq = self.id.0, "CQ in error: {e}");
                    self.ch.stats.error();
                    self.ch.event(EventKind::CqOverrun, self.id.0, 0);
                    return false;
                }
            }
        };
        if notify {
            self.ch.notify();
        }
        true
    }

    /// Mediated poll.
    pub(crate) fn poll_raw(&self) -> Option<[u8; CQE_LEN]> {
        self.poller.as_ref().and_then(|p| lock(p).poll_raw())
    }
}

/// Resolved segments of a WQE (the regions stay mapped while they are held).
pub(crate) type SegList = [Option<Seg>; MAX_SGE];

/// What a partly executed WQE does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    /// RDMA WRITE or READ: a copy between resolved segments.
    Copy,
    /// SEND into the RECV reserved at the peer (`RecvSide::reserved`).
    Send,
    /// RDMA WRITE with immediate: the data, then a RECV consumed for the immediate.
    WriteImm,
}

/// A WQE being executed over several passes, with every range resolved and checked at its
/// start (the segments keep their regions mapped until it is over).
pub(crate) struct Active {
    pub(crate) wqe: WqeRepr,
    pub(crate) kind: Kind,
    pub(crate) src: SegList,
    pub(crate) dst: SegList,
    pub(crate) len: usize,
    pub(crate) done: usize,
}

/// Send-side state of a QP (the engine that owns the QP's channel is its only user on the
/// data path).
pub(crate) struct SendSide {
    pub(crate) sq: WqConsumer,
    /// The head WQE, copied out and parsed, waiting for a RECV at the peer.
    pub(crate) pending: Option<WqeRepr>,
    /// The head WQE, partly executed: a message larger than one pass's byte budget moves over
    /// several passes (the SQ waits behind it, so completions stay in order).
    pub(crate) active: Option<Active>,
    pub(crate) peer: Option<Weak<Qp>>,
    pub(crate) peer_num: Option<QpNum>,
}

/// Receive-side state of a QP (used by whichever engine delivers to it).
pub(crate) struct RecvSide {
    pub(crate) rq: WqConsumer,
    /// A RECV taken off the queue for a SEND that is still being copied in over several
    /// passes (the receive lock is held per piece, not across the message). It completes
    /// before any later RECV: with the message, or flushed if this QP goes to Error first.
    pub(crate) reserved: Option<[u8; WQE_LEN]>,
}

/// `Qp::sq_idle_at` when the send side has work of its own (a blocked or partly executed WQE).
pub(crate) const SQ_BUSY: u64 = u64::MAX;

/// What [`Qp::sq_quiet`] looks at: the next WQE's phase (bypass) or the producer index word
/// the engine follows (mediated).
enum SqWatch {
    Phase(PhaseProbe<WQE_LEN>),
    Index(SharedWord),
}

/// A queue pair.
pub(crate) struct Qp {
    pub(crate) num: QpNum,
    /// How the engine tells, without the send lock, that a WQE was published after the SQ
    /// consumer index it recorded ([`Qp::sq_quiet`]).
    sq_watch: SqWatch,
    /// Written by the owning engine only, under the send lock: the SQ consumer index when it
    /// last left the send side with nothing to do, or [`SQ_BUSY`].
    sq_idle_at: AtomicU64,
    pub(crate) ch: Arc<Channel>,
    pub(crate) pd: PdId,
    state: AtomicU32,
    pub(crate) send_cq: Arc<Cq>,
    pub(crate) recv_cq: Arc<Cq>,
    pub(crate) sig_all: bool,
    pub(crate) send: Mutex<SendSide>,
    pub(crate) recv: Mutex<RecvSide>,
    /// Engine index + 1 of an engine whose QP waits for a RECV here (0: none).
    pub(crate) rnr_waiter: AtomicUsize,
    pub(crate) destroyed: AtomicBool,
    /// The QP's own work counters (relaxed atomics; see [`QpCounters`]).
    pub(crate) counters: QpCounters,
    /// Set once when the QP runs over a TCP stream to another host (`iwarp`): the engine
    /// drives it through its connection instead of a local peer.
    pub(crate) remote: OnceLock<Arc<super::iwarp::RemoteQp>>,
}

pub(crate) fn state_from(v: u32) -> QpState {
    QpState::from_u32(v).unwrap_or(QpState::Error)
}

impl Qp {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        num: QpNum,
        ch: Arc<Channel>,
        pd: PdId,
        send_cq: Arc<Cq>,
        recv_cq: Arc<Cq>,
        sig_all: bool,
        sq: WqConsumer,
        rq: WqConsumer,
    ) -> Self {
        Self {
            num,
            sq_watch: match sq.phase_probe() {
                Some(p) => SqWatch::Phase(p),
                None => SqWatch::Index(sq.prod_word().clone()),
            },
            sq_idle_at: AtomicU64::new(SQ_BUSY),
            ch,
            pd,
            state: AtomicU32::new(QpState::Init as u32),
            send_cq,
            recv_cq,
            sig_all,
            send: Mutex::new(SendSide {
                sq,
                pending: None,
                active: None,
                peer: None,
                peer_num: None,
            }),
            recv: Mutex::new(RecvSide { rq, reserved: None }),
            rnr_waiter: AtomicUsize::new(0),
            destroyed: AtomicBool::new(false),
            counters: QpCounters::default(),
            remote: OnceLock::new(),
        }
    }

    /// Owning engine, send lock held: records whether the send side is idle (nothing but the
    /// SQ to look at, and the SQ consumed up to `s`'s consumer index).
    pub(crate) fn note_send_side(&self, s: &SendSide) {
        let at = if s.pending.is_none() && s.active.is_none() {
            u64::from(s.sq.cons_pvt())
        } else {
            SQ_BUSY
        };
        self.sq_idle_at.store(at, Ordering::Relaxed);
    }

    /// Owning engine: whether a pass over the send side would find nothing to do, without
    /// taking the send lock — it was idle when the engine left it and no WQE was published
    /// since (one load of the QP's own line, one of the next WQE's — or of the producer
    /// index's in mediated mode).
    #[inline]
    pub(crate) fn sq_quiet(&self) -> bool {
        let at = self.sq_idle_at.load(Ordering::Relaxed);
        if at == SQ_BUSY {
            return false;
        }
        match &self.sq_watch {
            SqWatch::Phase(p) => !p.published(at as u32),
            SqWatch::Index(prod) => u64::from(prod.load(Ordering::Acquire)) == at,
        }
    }

    pub(crate) fn state(&self) -> QpState {
        state_from(self.state.load(Ordering::Acquire))
    }

    /// Sets a state other than Error (control path).
    pub(crate) fn set_state(&self, s: QpState) {
        self.state.store(s as u32, Ordering::Release);
    }

    /// Control path: moves the QP forward to `to` (Reset, Init, Rtr, Rts in that order), never
    /// back and never out of Error: an engine may have moved it on meanwhile. `true` if this
    /// call moved it.
    pub(crate) fn advance(&self, to: QpState) -> bool {
        self.state
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                let now = state_from(v);
                (now != QpState::Error && (now as u32) < (to as u32)).then_some(to as u32)
            })
            .is_ok()
    }

    /// Moves the QP to Error (once): the owning engine flushes its queues on its next pass.
    /// `event` is sent to the QP's channel when this call made the transition.
    pub(crate) fn fail(&self, event: Option<EventKind>) -> bool {
        let prev = self.state.swap(QpState::Error as u32, Ordering::AcqRel);
        if prev == QpState::Error as u32 {
            return false;
        }
        tracing::debug!(domid = %self.ch.domid, ch = self.ch.id.0, qp = self.num.0, "QP to Error");
        if let Some(kind) = event {
            if !self.destroyed.load(Ordering::Relaxed) {
                self.ch.event(kind, self.num.0, 0);
            }
        }
        self.ch.engine.wake();
        true
    }
}
