//! [`VerbsDevice`]: the backend's [`Device`] on a real RDMA device through libibverbs.
//!
//! * Channels are set up as the software device sets them up (`soft::init_channel_pages`,
//!   `soft::take_slot_of`, `soft::queue`): the guest sees the same doorbell page, event ring,
//!   queues and CQ rings whichever device serves it.
//! * One HCA PD per guest PD; a guest MR's mapped pages are registered with the HCA at the
//!   guest's iova (`ibv_reg_mr_iova2`), so remote peers address guest memory in the guest's
//!   own address space and the HCA DMAs straight into it. The registration is dropped before
//!   the mapping on every path: [`MrEntry`]'s fields drop in order (registration, then pages).
//! * One HCA CQ per guest CQ (all on one completion channel), one HCA RC QP per guest QP; the
//!   guest's QP number is the HCA's.
//! * One relay thread (see [`relay`]) moves guest WQEs to the HCA and HCA completions to the
//!   guest's CQs; it sleeps in `mio` on its waker (kicks, control-path changes) and the
//!   completion channel's fd.
//!
//! Partial (issue 13): connections are loopback pairs of QPs of this device
//! ([`Device::connect_qp`]), address vectors ([`Device::connect_qp_av`]: the guest's
//! `ConnectAv`, its peer checked by the daemon), or rdma_cm
//! on librdmacm ([`cm`], started by [`VerbsDevice::with_cm`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use shared_ring::abi::control::{access, DeviceAttrs, QpState};
use shared_ring::abi::cqe::{CqeOpcode, CqeRepr, CqeStatus, CQE_LEN};
use shared_ring::abi::event::{EventKind, EventRepr, EVENT_LEN};
use shared_ring::abi::wqe::{WqeRepr, MAX_INLINE, MAX_SGE};
use shared_ring::cq::{CqPoller, CqWriter};
use shared_ring::doorbell::EngineSleep;
use shared_ring::queue::Producer;
use shared_ring::{WqConsumer, PAGE_SIZE};

use super::abi::*;
use super::probe::{port_av, rtr_to_rts, to_init, to_rtr, to_rts, PortAv};
use super::relay::{self, KeyEntry, KeyMap, Pending, Queue};
use super::{CompChannel, Context, VerbsError, VerbsLib};
use crate::device::objects::{lock, Doorbells};
use crate::device::soft::{check_log2, init_channel_pages, inval, queue, take_slot_of};
use crate::device::stats::{ChanStats, Counters, Held, QpCounters};
use crate::device::waker::EngineWaker;
use crate::device::{
    default_attrs, ChannelId, ChannelMode, ChannelSetup, CqId, CqSetup, Device, DeviceError,
    DeviceResult, DeviceStats, DomId, EngineConfig, LocalAv, MrHandle, MrKeys, MrSetup, Notifier,
    PdId, QpNum, QpSetup, QpStats, RemoteAv, WorkQueue,
};

#[path = "cm.rs"]
mod cm;
pub use cm::{LIBRDMACM_ENV, LIBRDMACM_SONAME};

/// The completion channel's token (the waker has `Token(0)`).
const COMP: Token = Token(1);

/// Limits of the verbs device: the HCA's (`ibv_query_device`), bounded by the software
/// device's defaults and by what vrdma's WQE format carries.
pub fn attrs_of(hca: &ibv_device_attr, port: &ibv_port_attr) -> DeviceAttrs {
    let d = default_attrs();
    let pos = |v: i32| u32::try_from(v).unwrap_or(0);
    let _ = port;
    DeviceAttrs {
        max_qp: pos(hca.max_qp).min(d.max_qp),
        max_cq: pos(hca.max_cq).min(d.max_cq),
        max_mr: pos(hca.max_mr).min(d.max_mr),
        max_pd: pos(hca.max_pd).min(d.max_pd),
        // Power-of-two queues: the largest one the HCA can hold.
        max_qp_wr: prev_pow2(pos(hca.max_qp_wr)).min(d.max_qp_wr),
        max_cqe: prev_pow2(pos(hca.max_cqe)).min(d.max_cqe),
        max_sge: pos(hca.max_sge).min(MAX_SGE as u32),
        max_inline: d.max_inline.min(MAX_INLINE as u32),
        max_mr_pages: u32::try_from(hca.max_mr_size / PAGE_SIZE as u64)
            .unwrap_or(u32::MAX)
            .min(d.max_mr_pages),
    }
}

fn prev_pow2(v: u32) -> u32 {
    if v == 0 {
        0
    } else {
        1 << (31 - v.leading_zeros())
    }
}

fn hca_err(what: &'static str) -> impl Fn(VerbsError) -> DeviceError {
    move |e| {
        tracing::warn!("verbs device: {what}: {e}");
        match e.errno() {
            Some(libc::ENOMEM) => DeviceError::NoResources(what),
            // Not EIO as `DeviceLost`: the guest library then gives up the whole channel, and
            // a driver fails one command with EIO (mlx5's firmware INT_ERR) on a live device.
            // The loss itself comes from the async fd (`Inner::device_lost`).
            _ => DeviceError::InvalidArgument(format!("{what}: {e}")),
        }
    }
}

fn bad(what: &'static str, id: u32) -> DeviceError {
    DeviceError::BadHandle { what, id }
}

/// vrdma access bits → `IBV_ACCESS_*`.
fn ibv_access(a: u32) -> u32 {
    let mut out = 0;
    for (ours, theirs) in [
        (access::LOCAL_WRITE, IBV_ACCESS_LOCAL_WRITE),
        (access::REMOTE_WRITE, IBV_ACCESS_REMOTE_WRITE),
        (access::REMOTE_READ, IBV_ACCESS_REMOTE_READ),
    ] {
        if a & ours != 0 {
            out |= theirs;
        }
    }
    out
}

/// A registered region. Field order is drop order: the HCA registration goes before the
/// mapping it covers is released.
struct MrEntry {
    _registration: super::Mr,
    /// Recorded with the keeper until the registration is gone (see [`super::keeper`]).
    _kept: super::keeper::Kept,
    lkey: u32,
    pd: PdId,
    len: u64,
    _pages: shared_ring::SharedRegion,
}

struct VCq {
    hca: super::Cq,
    writer: Mutex<(CqWriter, bool)>,
    /// Mediated mode: the backend's poller of the guest ring.
    poller: Option<Mutex<CqPoller>>,
    slot: u32,
    users: std::sync::atomic::AtomicU32,
    /// Requests posted whose completion goes to this CQ and has not been polled: kept below
    /// the HCA CQ's capacity, so the HCA CQ never overflows (every send is signaled there).
    inflight: std::sync::atomic::AtomicUsize,
}

/// The relay's state of one queue.
struct WqRelay {
    wq: WqConsumer,
    pending: VecDeque<Pending>,
    next_seq: u64,
    cap: usize,
    /// A WQE refused before posting, completed once the requests before it are.
    stalled: Option<CqeRepr>,
}

struct VQp {
    num: QpNum,
    pd: PdId,
    hca: super::Qp,
    send_cq: Arc<VCq>,
    recv_cq: Arc<VCq>,
    sig_all: bool,
    state: Mutex<QpState>,
    /// The QP this one named in `connect_qp` or `connect_qp_av`.
    peer: Mutex<Option<QpNum>>,
    /// The address vector of `connect_qp_av` (the HCA QP is in RTR or RTS towards it).
    av: Mutex<Option<RemoteAv>>,
    sq: Mutex<WqRelay>,
    rq: Mutex<WqRelay>,
    slots: (u32, u32),
    /// Its completions as the relay passed them on (`domain_qp_stats`; flushes not counted).
    counters: QpCounters,
}

#[derive(Default)]
struct Res {
    pds: HashMap<PdId, (super::Pd, u32)>,
    mrs: HashMap<MrHandle, MrEntry>,
    cqs: HashMap<CqId, Arc<VCq>>,
    qps: HashMap<QpNum, Arc<VQp>>,
    slots: HashSet<u32>,
}

struct VChan {
    id: ChannelId,
    domid: DomId,
    mode: ChannelMode,
    doorbells: Mutex<Doorbells>,
    sleep: Mutex<EngineSleep>,
    events: Mutex<Producer<EVENT_LEN>>,
    notifier: Arc<dyn Notifier>,
    stats: ChanStats,
    closed: AtomicBool,
    /// The lkeys the relay translates (its own lock: read on every post).
    keys: Mutex<KeyMap>,
    res: Mutex<Res>,
}

impl VChan {
    fn notify(&self) {
        if !self.closed.load(Ordering::Relaxed) {
            self.stats.notification();
            self.notifier.notify();
        }
    }

    fn post(&self, ev: &EventRepr) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        self.stats.event();
        let mut p = lock(&self.events);
        match p.write(&ev.to_bytes()) {
            Ok(_) => {
                p.publish();
                drop(p);
                self.notify();
            }
            Err(e) => tracing::debug!(ch = self.id.0, ?ev, "event dropped: {e}"),
        }
    }
}

#[derive(Default)]
struct Tables {
    next: u32,
    channels: HashMap<ChannelId, Arc<VChan>>,
    /// Which channel each QP belongs to (QP numbers are the HCA's).
    qps: HashMap<QpNum, ChannelId>,
    domains: HashMap<DomId, Arc<Counters>>,
    pds: usize,
    mrs: usize,
    cqs: usize,
}

impl Tables {
    /// A fresh handle for channels, PDs, MRs and CQs (QPs are numbered by the HCA).
    fn id(&mut self) -> u32 {
        self.next = self.next.wrapping_add(1).max(1);
        self.next
    }
}

struct Inner {
    ctx: Context,
    av: PortAv,
    attrs: DeviceAttrs,
    comp: CompChannel,
    /// Releases the registrations if this process dies holding them (see [`super::keeper`]).
    keeper: super::keeper::Keeper,
    waker: Arc<EngineWaker>,
    spin: Duration,
    tables: Mutex<Tables>,
    /// Mediated posts, kicks and control changes bump this so the relay looks again.
    poked: AtomicBool,
    /// Guest CQs gone from their channel whose HCA CQ the relay destroys: `ibv_destroy_cq`
    /// waits until every completion event the kernel reported for the CQ was acknowledged,
    /// and only the relay reads the completion channel, so it drains the channel first.
    graveyard: Mutex<Vec<Arc<VCq>>>,
    /// The guest QPs the async-event thread looked at, dropped by the relay: if the guest
    /// destroyed one meanwhile, the thread's reference is the last one, and `ibv_destroy_qp`
    /// waits until every async event read for the QP is acknowledged — never on the thread
    /// that reads and acknowledges them.
    morgue: Mutex<Vec<Arc<VQp>>>,
    /// The device was reported lost (`DEVICE_FATAL`, or the async fd failed).
    lost: AtomicBool,
}

/// The backend's device on a real RDMA device (issue 13; partial, see the module docs).
pub struct VerbsDevice {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
    /// Reads the device's asynchronous events ([`Inner::watch_async`]).
    async_thread: Option<JoinHandle<()>>,
    cm: std::sync::OnceLock<cm::VerbsCm>,
}

impl VerbsDevice {
    /// The address vector towards `remote`: the port's current GID table (its first 256
    /// entries; RoCE GIDs follow the netdev's addresses) and active MTU.
    fn remote_av(&self, remote: &RemoteAv) -> Result<PortAv, String> {
        let pattr = self
            .inner
            .ctx
            .query_port(self.inner.av.port)
            .map_err(|e| e.to_string())?;
        let gids = self.port_gids(&pattr);
        super::av::remote_av(&self.inner.av, remote, pattr.active_mtu, &gids)
    }

    /// The port's non-zero GIDs with their types, its first 256 entries; none on
    /// InfiniBand without a GID of its own.
    fn port_gids(&self, pattr: &super::abi::ibv_port_attr) -> Vec<super::PortGid> {
        let inner = &self.inner;
        if inner.av.gid.is_none() {
            return Vec::new();
        }
        inner.ctx.gid_table(inner.av.port, pattr)
    }

    /// Opens port `port` of device `ibdev` (it must be ACTIVE) and starts the relay thread.
    pub fn open(
        lib: &VerbsLib,
        ibdev: &str,
        port: u8,
        config: EngineConfig,
    ) -> Result<Self, VerbsError> {
        let ctx = lib.open_device(ibdev)?;
        if ctx.transport_type() == IBV_TRANSPORT_IWARP {
            return Err(VerbsError::Invalid(format!(
                "{ibdev} is an iWARP device, not supported yet (rdma_cm connects on siw, but \
                 guest memory is registered at the guest's iova, which siw ignores)"
            )));
        }
        let hca = ctx.query_device()?;
        let pattr = ctx.query_port(port)?;
        let av = port_av(&ctx, port, None)?;
        let attrs = attrs_of(&hca, &pattr);
        let comp = ctx.create_comp_channel()?;
        let keeper = super::keeper::Keeper::start(ctx.cmd_fd(), attrs.max_mr as usize)
            .map_err(|e| VerbsError::call("starting the registration keeper (clone)", e))?;
        let fd = comp.fd().as_raw_fd();
        set_nonblocking(fd)?;
        let poll = Poll::new().map_err(|e| VerbsError::call("mio::Poll::new", e))?;
        poll.registry()
            .register(&mut SourceFd(&fd), COMP, Interest::READABLE)
            .map_err(|e| VerbsError::call("epoll_ctl", e))?;
        let waker = Arc::new(
            EngineWaker::new(0, &poll).map_err(|e| VerbsError::call("mio::Waker::new", e))?,
        );
        let inner = Arc::new(Inner {
            ctx,
            av,
            attrs,
            comp,
            keeper,
            waker,
            spin: config.spin,
            tables: Mutex::new(Tables::default()),
            poked: AtomicBool::new(false),
            graveyard: Mutex::new(Vec::new()),
            morgue: Mutex::new(Vec::new()),
            lost: AtomicBool::new(false),
        });
        inner.ctx.set_async_nonblocking()?;
        let run = inner.clone();
        let thread = std::thread::Builder::new()
            .name(format!("vrdma-relay-{ibdev}"))
            .spawn(move || run.relay(poll))
            .map_err(|e| VerbsError::call("spawning the relay thread", e))?;
        let run = inner.clone();
        let async_thread = match std::thread::Builder::new()
            .name(format!("vrdma-async-{ibdev}"))
            .spawn(move || run.watch_async())
        {
            Ok(t) => t,
            Err(e) => {
                inner.waker.stop();
                let _ = thread.join();
                return Err(VerbsError::call("spawning the async event thread", e));
            }
        };
        tracing::info!(device = ibdev, port, ?attrs, "verbs device open");
        Ok(Self {
            inner,
            thread: Some(thread),
            async_thread: Some(async_thread),
            cm: std::sync::OnceLock::new(),
        })
    }

    /// The HCA's name.
    pub fn name(&self) -> &str {
        self.inner.ctx.name()
    }
}

fn set_nonblocking(fd: std::os::fd::RawFd) -> Result<(), VerbsError> {
    // SAFETY: the completion channel's fd, open as long as the channel (kept by `Inner`).
    let bfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::io::ioctl_fionbio(bfd, true)
        .map_err(|e| VerbsError::call("ioctl(FIONBIO) on the completion channel", e.into()))
}

impl Drop for VerbsDevice {
    fn drop(&mut self) {
        if let Some(cm) = self.cm.get() {
            cm.stop();
        }
        self.inner.waker.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(t) = self.async_thread.take() {
            let _ = t.join();
        }
        let morgue = std::mem::take(&mut *lock(&self.inner.morgue));
        drop(morgue);
        // Everything the channels hold goes now (registrations before mappings, QPs before
        // CQs and PDs), not when the last Arc of `inner` happens to go.
        let chans: Vec<ChannelId> = lock(&self.inner.tables).channels.keys().copied().collect();
        for c in chans {
            self.close_channel(c);
        }
        // The relay is gone: bury what it left (nothing holds the CQs any more).
        self.inner.bury(&[]);
    }
}

impl Inner {
    fn chan(&self, ch: ChannelId) -> DeviceResult<Arc<VChan>> {
        lock(&self.tables)
            .channels
            .get(&ch)
            .cloned()
            .ok_or(bad("channel", ch.0))
    }

    fn poke(&self) {
        self.poked.store(true, Ordering::SeqCst);
        self.waker.wake();
    }

    // ---- the relay ----------------------------------------------------------------------

    fn relay(self: Arc<Self>, mut poll: Poll) {
        let mut events = Events::with_capacity(16);
        let mut idle_since = Instant::now();
        while !self.waker.stop.load(Ordering::SeqCst) {
            // The async thread's QPs: destroyed here if the guest's are gone (out of the
            // lock: `ibv_destroy_qp` is not made under it).
            let morgue = std::mem::take(&mut *lock(&self.morgue));
            drop(morgue);
            let chans: Vec<Arc<VChan>> = lock(&self.tables).channels.values().cloned().collect();
            self.bury(&chans);
            self.poked.store(false, Ordering::SeqCst);
            let mut work = self.pass(&chans);
            if work {
                idle_since = Instant::now();
                continue;
            }
            if idle_since.elapsed() < self.spin {
                std::hint::spin_loop();
                continue;
            }
            // Arm everything, then look once more (the kick protocol of docs/protocol.md).
            self.waker.asleep.store(true, Ordering::SeqCst);
            for c in &chans {
                lock(&c.sleep).prepare_sleep();
            }
            let cqs: Vec<super::Cq> = chans
                .iter()
                .flat_map(|c| {
                    lock(&c.res)
                        .cqs
                        .values()
                        .map(|q| q.hca.clone())
                        .collect::<Vec<_>>()
                })
                .collect();
            for cq in &cqs {
                if let Err(e) = cq.req_notify(false) {
                    tracing::warn!("ibv_req_notify_cq: {e}");
                }
            }
            work = self.pass(&chans) || self.poked.load(Ordering::SeqCst);
            if !work {
                self.waker.sleeps.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = poll.poll(&mut events, None) {
                    if e.kind() != std::io::ErrorKind::Interrupted {
                        tracing::error!("verbs relay: poll failed: {e}");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                // Drain the completion channel (non-blocking fd) and acknowledge; CQs gone to
                // the graveyard meanwhile may have an event too (they were armed).
                let buried: Vec<super::Cq> = lock(&self.graveyard)
                    .iter()
                    .map(|c| c.hca.clone())
                    .collect();
                let refs: Vec<&super::Cq> = cqs.iter().chain(&buried).collect();
                while self.comp.get_cq_event(&refs).is_ok() {}
                for cq in &refs {
                    cq.ack_events();
                }
            }
            self.waker.asleep.store(false, Ordering::SeqCst);
            for c in &chans {
                lock(&c.sleep).wake();
            }
            idle_since = Instant::now();
        }
    }

    /// The async-event thread: waits (bounded, to see `stop`) for the non-blocking async fd,
    /// then reads every event there is ([`Context::next_async_event`] copies and
    /// acknowledges each before any lock is taken) and forwards it ([`Self::async_event`]).
    /// When the fd reports an error or hang-up, or `ibv_get_async_event` fails with `EIO` or
    /// `ENODEV` (the device was removed or died: a driver that can disassociate, mlx4/mlx5,
    /// then polls `EPOLLERR` and reads fail with `EIO`), the device is lost
    /// ([`Self::device_lost`]) and the thread ends; other failures are retried with a
    /// growing pause.
    fn watch_async(self: Arc<Self>) {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        // SAFETY: the context's async fd, open as long as the context (`self` holds it).
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.ctx.async_fd()) };
        let tick = Timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        // A transient failure (poll's ENOMEM, a read failing otherwise than the device's
        // removal) is retried after a pause that doubles up to 1 s (the stop waits for at most
        // that), logged each time.
        const FIRST_PAUSE: Duration = Duration::from_millis(200);
        let mut pause = FIRST_PAUSE;
        let stop = &self.waker.stop;
        let transient = |what: &str, e: &dyn std::fmt::Display, pause: &mut Duration| {
            tracing::warn!("verbs device async events: {what}: {e}; again in {pause:?}");
            // In slices, so that the device's stop does not wait for the pause.
            let until = Instant::now() + *pause;
            while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            *pause = (*pause * 2).min(Duration::from_secs(1));
        };
        while !self.waker.stop.load(Ordering::SeqCst) {
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            match poll(&mut fds, Some(&tick)) {
                Ok(0) => {
                    // A quiet tick: whatever failed before works again.
                    pause = FIRST_PAUSE;
                    continue;
                }
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    transient("poll on the async fd", &e, &mut pause);
                    continue;
                }
            }
            let broken = fds[0]
                .revents()
                .intersects(PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL);
            loop {
                match self.ctx.next_async_event() {
                    Ok(Some(ev)) => {
                        pause = FIRST_PAUSE;
                        self.async_event(&ev);
                    }
                    Ok(None) if broken => {
                        return self.device_lost("the async fd reports an error and no event")
                    }
                    Ok(None) => break,
                    Err(e) if e.errno() == Some(libc::EINTR) => continue,
                    Err(e) if broken || matches!(e.errno(), Some(libc::EIO | libc::ENODEV)) => {
                        return self.device_lost(&e.to_string())
                    }
                    Err(e) => {
                        transient("ibv_get_async_event", &e, &mut pause);
                        break;
                    }
                }
            }
        }
    }

    /// The device is gone (`why`): unless a `DEVICE_FATAL` said so already, every QP fails
    /// and every channel gets `DeviceLost`, once.
    fn device_lost(&self, why: &str) {
        if self.lost.swap(true, Ordering::SeqCst) {
            tracing::error!("verbs device lost ({why}); its async events end");
            return;
        }
        tracing::error!("verbs device lost ({why}): DeviceLost to every channel");
        self.apply(super::events::Action::All {
            kind: EventKind::DeviceLost,
            detail: 0,
            fail: true,
        });
    }

    /// Forwards one asynchronous event of the device to the guests it concerns
    /// ([`super::events::action`]).
    fn async_event(&self, ev: &super::AsyncEvent) {
        use super::events::Action;
        let act = super::events::action(ev, self.av.port);
        let name = super::events::name(ev.kind);
        if act == Action::Ignore {
            tracing::info!(event = %name, element = ?ev.element, "device event (not forwarded)");
            return;
        }
        tracing::info!(event = %name, element = ?ev.element, "device event: {act:?}");
        if ev.kind == IBV_EVENT_DEVICE_FATAL && self.lost.swap(true, Ordering::SeqCst) {
            return;
        }
        self.apply(act);
    }

    /// Applies one action of [`super::events::action`].
    fn apply(&self, act: super::events::Action) {
        use super::events::Action;
        let chans: Vec<Arc<VChan>> = lock(&self.tables).channels.values().cloned().collect();
        match act {
            Action::Qp {
                qpn,
                kind,
                detail,
                fail,
            } => {
                let found = {
                    let t = lock(&self.tables);
                    t.qps
                        .get(&QpNum(qpn))
                        .and_then(|ch| t.channels.get(ch).cloned())
                };
                let Some(c) = found else { return };
                let Some(q) = lock(&c.res).qps.get(&QpNum(qpn)).cloned() else {
                    return;
                };
                if fail {
                    fail_qp(&c, &q, false);
                }
                c.post(&EventRepr {
                    kind,
                    handle: qpn,
                    detail,
                });
                lock(&self.morgue).push(q);
            }
            Action::Cq { handle } => {
                for c in &chans {
                    let (cqs, qps): (Vec<CqId>, Vec<Arc<VQp>>) = {
                        let r = lock(&c.res);
                        let cqs: Vec<CqId> = r
                            .cqs
                            .iter()
                            .filter(|(_, v)| v.hca.handle() == handle)
                            .map(|(id, _)| *id)
                            .collect();
                        let hit = |v: &Arc<VCq>| {
                            cqs.iter()
                                .any(|id| r.cqs.get(id).is_some_and(|x| Arc::ptr_eq(x, v)))
                        };
                        let qps = r
                            .qps
                            .values()
                            .filter(|q| hit(&q.send_cq) || hit(&q.recv_cq))
                            .cloned()
                            .collect();
                        (cqs, qps)
                    };
                    for cq in cqs {
                        c.post(&EventRepr {
                            kind: EventKind::CqOverrun,
                            handle: cq.0,
                            detail: 0,
                        });
                    }
                    for q in &qps {
                        fail_qp(c, q, true);
                    }
                    lock(&self.morgue).extend(qps);
                }
            }
            Action::All { kind, detail, fail } => {
                for c in &chans {
                    if fail {
                        let qps: Vec<Arc<VQp>> = lock(&c.res).qps.values().cloned().collect();
                        for q in &qps {
                            fail_qp(c, q, false);
                        }
                        lock(&self.morgue).extend(qps);
                    }
                    c.post(&EventRepr {
                        kind,
                        handle: 0,
                        detail,
                    });
                }
            }
            Action::Ignore => {}
        }
        self.poke();
    }

    /// Destroys the HCA CQs of the graveyard that nothing else holds any more (their QPs are
    /// gone, so no completion and no new event can come): drains the completion channel
    /// (non-blocking), acknowledges every event, then drops them.
    fn bury(&self, chans: &[Arc<VChan>]) {
        let dead: Vec<Arc<VCq>> = {
            let mut g = lock(&self.graveyard);
            if g.is_empty() {
                return;
            }
            let (dead, keep) = std::mem::take(&mut *g)
                .into_iter()
                .partition(|c| Arc::strong_count(c) == 1);
            *g = keep;
            dead
        };
        if dead.is_empty() {
            return;
        }
        let live: Vec<super::Cq> = chans
            .iter()
            .flat_map(|c| {
                lock(&c.res)
                    .cqs
                    .values()
                    .map(|q| q.hca.clone())
                    .collect::<Vec<_>>()
            })
            .collect();
        let refs: Vec<&super::Cq> = live.iter().chain(dead.iter().map(|c| &c.hca)).collect();
        while self.comp.get_cq_event(&refs).is_ok() {}
        for cq in &refs {
            cq.ack_events();
        }
        drop(refs);
        drop(dead);
    }

    /// One pass over every channel: posts, then completions. Whether anything moved.
    fn pass(&self, chans: &[Arc<VChan>]) -> bool {
        let mut work = false;
        for c in chans {
            if c.closed.load(Ordering::SeqCst) {
                continue;
            }
            let (qps, cqs) = {
                let r = lock(&c.res);
                (
                    r.qps.values().cloned().collect::<Vec<_>>(),
                    r.cqs.values().cloned().collect::<Vec<_>>(),
                )
            };
            for q in &qps {
                work |= relay_queue(c, q, Queue::Rq);
                work |= relay_queue(c, q, Queue::Sq);
            }
            for cq in &cqs {
                work |= drain_cq(c, cq, &qps);
            }
        }
        work
    }
}

/// Counts a completion of `q` in its counters (a flush is not an operation): a receive's
/// (RECV, or RECV consumed by a WRITE with immediate) as consumed, any other as a send WQE
/// executed; the bytes are the CQE's (a receive's as the HCA reports it, a send-side WQE's
/// payload: `relay::cqe_of`), as the channel's counters.
fn count(q: &QpCounters, cqe: &CqeRepr) {
    let ok = cqe.status == CqeStatus::Success;
    match (cqe.status, cqe.opcode) {
        (CqeStatus::WrFlushError, _) => {}
        (_, CqeOpcode::Recv | CqeOpcode::RecvRdmaWithImm) => q.recv(ok, u64::from(cqe.byte_len)),
        _ => q.send(ok, u64::from(cqe.byte_len)),
    }
}

/// Writes a CQE to a guest CQ and notifies if it is armed. A full or broken CQ drops it, sends
/// `CqOverrun` once and puts the QP in Error.
fn write_cqe(c: &VChan, cq: &VCq, q: &VQp, cqe: &CqeRepr) {
    // A completion the guest's CQ cannot take is an error of the QP, as of the channel.
    let dropped = CqeRepr {
        status: CqeStatus::GeneralError,
        ..*cqe
    };
    let mut w = lock(&cq.writer);
    if w.1 {
        c.stats.error();
        count(&q.counters, &dropped);
        return;
    }
    if let Err(e) = w.0.write_repr(cqe) {
        tracing::debug!(ch = c.id.0, "CQ overrun: {e}");
        w.1 = true;
        drop(w);
        c.stats.error();
        count(&q.counters, &dropped);
        c.post(&EventRepr {
            kind: EventKind::CqOverrun,
            handle: 0,
            detail: 0,
        });
        fail_qp(c, q, true);
        return;
    }
    count(&q.counters, cqe);
    if cqe.status == CqeStatus::Success {
        c.stats.op(u64::from(cqe.byte_len));
    } else if cqe.status != CqeStatus::WrFlushError {
        c.stats.error();
    }
    let solicited = cqe.status != CqeStatus::Success
        || cqe.flags & shared_ring::abi::cqe::flags::SOLICITED != 0;
    let notify = w.0.notify_needed(solicited);
    drop(w);
    if notify {
        c.notify();
    }
}

/// Moves a QP to Error: the HCA flushes what it holds; the relay flushes the rest.
fn fail_qp(c: &VChan, q: &VQp, fatal: bool) {
    let mut st = lock(&q.state);
    if *st == QpState::Error {
        return;
    }
    *st = QpState::Error;
    drop(st);
    let attr = ibv_qp_attr {
        qp_state: IBV_QPS_ERR,
        ..Default::default()
    };
    if let Err(e) = q.hca.modify(&attr, IBV_QP_STATE) {
        tracing::warn!(qp = q.num.0, "moving the HCA QP to Error: {e}");
    }
    if fatal {
        c.post(&EventRepr {
            kind: EventKind::QpFatal,
            handle: q.num.0,
            detail: 0,
        });
    }
}

/// Moves the guest's newly published WQEs of one queue to the HCA. Whether anything moved.
fn relay_queue(c: &VChan, q: &VQp, which: Queue) -> bool {
    let (m, cq) = match which {
        Queue::Sq => (&q.sq, &q.send_cq),
        Queue::Rq => (&q.rq, &q.recv_cq),
    };
    let mut r = lock(m);
    let mut work = false;
    if r.pending.is_empty() {
        if let Some(cqe) = r.stalled.take() {
            write_cqe(c, cq, q, &cqe);
            fail_qp(c, q, false);
            work = true;
        }
    }
    loop {
        if r.stalled.is_some()
            || r.pending.len() >= r.cap
            || cq.inflight.load(Ordering::Relaxed)
                >= usize::try_from(cq.hca.capacity()).unwrap_or(0)
        {
            break;
        }
        let state = *lock(&q.state);
        // Sends wait for RTS; receives may be posted from Init on.
        if which == Queue::Sq && !matches!(state, QpState::Rts | QpState::Error) {
            break;
        }
        let slot = match r.wq.pop() {
            Ok(Some(s)) => s,
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(ch = c.id.0, qp = q.num.0, "garbage queue index: {e}");
                drop(r);
                fail_qp(c, q, true);
                return true;
            }
        };
        r.wq.release();
        work = true;
        let parsed = WqeRepr::from_bytes(&slot);
        let (wr_id, opcode) = match &parsed {
            Ok(w) => (
                w.wr_id,
                match which {
                    Queue::Sq => relay::send_cqe_opcode(w.opcode),
                    Queue::Rq => CqeOpcode::Recv,
                },
            ),
            // The wr_id field of a garbage WQE is still the guest's (bytes 8..16).
            Err(_) => (
                u64::from_le_bytes(slot[8..16].try_into().unwrap_or([0; 8])),
                match which {
                    Queue::Sq => CqeOpcode::Send,
                    Queue::Rq => CqeOpcode::Recv,
                },
            ),
        };
        if state == QpState::Error {
            // After a failure every WQE completes flushed, in order behind the HCA's.
            let cqe = relay::local_cqe(wr_id, opcode, CqeStatus::WrFlushError, q.num.0);
            if r.pending.is_empty() {
                write_cqe(c, cq, q, &cqe);
            } else {
                r.stalled = Some(cqe);
            }
            continue;
        }
        let result = parsed.map_err(|_| CqeStatus::BadWqe).and_then(|w| {
            let keys = lock(&c.keys);
            match which {
                Queue::Sq => relay::translate_send(&w, &keys, q.pd).map(Ok),
                Queue::Rq => relay::translate_recv(&w, &keys, q.pd).map(Err),
            }
            .map(|wr| (w, wr))
        });
        let (w, wr) = match result {
            Ok(x) => x,
            Err(status) => {
                let cqe = relay::local_cqe(wr_id, opcode, status, q.num.0);
                if r.pending.is_empty() {
                    write_cqe(c, cq, q, &cqe);
                    fail_qp(c, q, false);
                } else {
                    r.stalled = Some(cqe);
                }
                continue;
            }
        };
        let seq = r.next_seq;
        let hca_id = relay::hca_wr_id(which, seq);
        let posted = match wr {
            Ok(mut s) => {
                let mut ibv = s.as_ibv(hca_id);
                // SAFETY: one request whose SGEs lie in HCA registrations of this QP's PD
                // (translated from the channel's key table, bounds checked) over mappings
                // kept alive by their `MrEntry`; inline bytes live in `s` across the call.
                unsafe { q.hca.post_send(&mut ibv) }
            }
            Err(mut rw) => {
                let mut ibv = rw.as_ibv(hca_id);
                // SAFETY: as above.
                unsafe { q.hca.post_recv(&mut ibv) }
            }
        };
        match posted {
            Ok(()) => {
                if let shared_ring::abi::wqe::WqeData::Inline { len, .. } = &w.data {
                    // The one copy of the data path: inline bytes, out of the guest's WQE.
                    c.stats.copied(u64::from(*len));
                }
                cq.inflight.fetch_add(1, Ordering::Relaxed);
                r.next_seq += 1;
                r.pending.push_back(Pending {
                    seq,
                    wr_id: w.wr_id,
                    opcode,
                    signaled: which == Queue::Rq
                        || q.sig_all
                        || w.flags & shared_ring::abi::wqe::flags::SIGNALED != 0,
                    len: w.data.total_len(),
                });
            }
            Err((_, e)) => {
                tracing::debug!(qp = q.num.0, "HCA refused a work request: {e}");
                let cqe =
                    relay::local_cqe(wr_id, opcode, CqeStatus::LocalQpOperationError, q.num.0);
                if r.pending.is_empty() {
                    write_cqe(c, cq, q, &cqe);
                    fail_qp(c, q, false);
                } else {
                    r.stalled = Some(cqe);
                }
            }
        }
    }
    work
}

/// Moves the HCA's completions of one CQ to the guest's. Whether anything moved.
fn drain_cq(c: &VChan, cq: &Arc<VCq>, qps: &[Arc<VQp>]) -> bool {
    let mut wcs = [ibv_wc::default(); 16];
    let mut work = false;
    loop {
        let n = match cq.hca.poll(&mut wcs) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(ch = c.id.0, "ibv_poll_cq: {e}");
                return work;
            }
        };
        if n == 0 {
            return work;
        }
        work = true;
        cq.inflight.fetch_sub(
            n.min(cq.inflight.load(Ordering::Relaxed)),
            Ordering::Relaxed,
        );
        for wc in &wcs[..n] {
            let Some(q) = qps.iter().find(|q| q.num.0 == wc.qp_num) else {
                continue; // a QP destroyed meanwhile
            };
            let (which, seq) = relay::split_wr_id(wc.wr_id);
            let m = match which {
                Queue::Sq => &q.sq,
                Queue::Rq => &q.rq,
            };
            let p = {
                let mut r = lock(m);
                match r.pending.front() {
                    Some(p) if p.seq == seq => r.pending.pop_front(),
                    _ => None,
                }
            };
            let Some(p) = p else {
                tracing::warn!(qp = q.num.0, wr = wc.wr_id, "completion out of order");
                continue;
            };
            let cqe = relay::cqe_of(wc, &p, q.num.0);
            if cqe.status != CqeStatus::Success {
                if cqe.status != CqeStatus::WrFlushError {
                    // The HCA moved its QP to Error; the guest's follows.
                    *lock(&q.state) = QpState::Error;
                }
            } else if !p.signaled {
                c.stats.op(u64::from(cqe.byte_len));
                count(&q.counters, &cqe);
                continue;
            }
            write_cqe(c, cq, q, &cqe);
        }
    }
}

impl Device for VerbsDevice {
    fn attrs(&self) -> DeviceAttrs {
        self.inner.attrs
    }

    fn open_channel(&self, setup: ChannelSetup) -> DeviceResult<ChannelId> {
        if self.inner.lost.load(Ordering::SeqCst) {
            // A channel opened after the loss would never hear of it.
            return Err(DeviceError::DeviceLost);
        }
        let (doorbells, sleep, events) = init_channel_pages(&setup)?;
        let mut t = lock(&self.inner.tables);
        if self.inner.lost.load(Ordering::SeqCst) {
            // Again under the lock `device_lost` snapshots the channels under: a channel
            // inserted after that snapshot must see the flag.
            return Err(DeviceError::DeviceLost);
        }
        let id = ChannelId(t.id());
        let dom = t.domains.entry(setup.domid).or_default().clone();
        let stats = ChanStats {
            ch: Arc::new(Counters::default()),
            dom,
        };
        stats.acquire(Held::Channel);
        t.channels.insert(
            id,
            Arc::new(VChan {
                id,
                domid: setup.domid,
                mode: setup.mode,
                doorbells: Mutex::new(doorbells),
                sleep: Mutex::new(sleep),
                events: Mutex::new(events),
                notifier: setup.notifier,
                stats,
                closed: AtomicBool::new(false),
                keys: Mutex::new(KeyMap::new()),
                res: Mutex::new(Res::default()),
            }),
        );
        drop(t);
        self.inner.poke();
        Ok(id)
    }

    fn close_channel(&self, ch: ChannelId) {
        self.cm_forget_channel(ch);
        let mut t = lock(&self.inner.tables);
        let Some(c) = t.channels.remove(&ch) else {
            return;
        };
        c.closed.store(true, Ordering::SeqCst);
        let res = std::mem::take(&mut *lock(&c.res));
        lock(&c.keys).clear();
        for q in res.qps.keys() {
            t.qps.remove(q);
            c.stats.release(Held::Qp);
        }
        t.mrs -= res.mrs.len();
        t.cqs -= res.cqs.len();
        t.pds -= res.pds.len();
        drop(t);
        for m in res.mrs.values() {
            c.stats.release(Held::Mr(m.len));
        }
        for _ in 0..res.cqs.len() {
            c.stats.release(Held::Cq);
        }
        for _ in 0..res.pds.len() {
            c.stats.release(Held::Pd);
        }
        c.stats.release(Held::Channel);
        // QPs first (each holds its CQs and PD), then registrations (before their mappings),
        // then CQs and PDs. The relay may still hold Arcs of QPs/CQs for the rest of a pass.
        let Res {
            qps, mrs, cqs, pds, ..
        } = res;
        drop(qps);
        drop(mrs);
        // HCA CQs are destroyed by the relay (see `Inner::bury`); PDs once their QPs and MRs
        // are gone (each holds its PD).
        lock(&self.inner.graveyard).extend(cqs.into_values());
        drop(pds);
        self.inner.poke();
    }

    fn add_doorbell_page(
        &self,
        ch: ChannelId,
        page: shared_ring::SharedRegion,
    ) -> DeviceResult<u32> {
        if shared_ring::doorbell::slots_in(page.len()) == 0 {
            return Err(inval("doorbell page has no slots"));
        }
        let c = self.inner.chan(ch)?;
        let mut dbs = lock(&c.doorbells);
        if dbs.pages() >= crate::device::MAX_DOORBELL_PAGES {
            return Err(DeviceError::NoResources("doorbell pages"));
        }
        let db = shared_ring::doorbell::DoorbellPage::init(page, shared_ring::PROTOCOL_VERSION)
            .map_err(|e| inval(e.to_string()))?;
        dbs.push(db).map_err(|_| DeviceError::NoResources("memory"))
    }

    fn kick(&self, ch: ChannelId) {
        if lock(&self.inner.tables).channels.contains_key(&ch) {
            self.inner.poke();
        }
    }

    fn post_event(&self, ch: ChannelId, event: EventRepr) -> DeviceResult<()> {
        self.inner.chan(ch)?.post(&event);
        Ok(())
    }

    fn alloc_pd(&self, ch: ChannelId) -> DeviceResult<PdId> {
        let c = self.inner.chan(ch)?;
        let mut t = lock(&self.inner.tables);
        if t.pds >= self.inner.attrs.max_pd as usize {
            return Err(DeviceError::NoResources("protection domains"));
        }
        let pd = self.inner.ctx.alloc_pd().map_err(hca_err("ibv_alloc_pd"))?;
        let id = PdId(t.id());
        t.pds += 1;
        lock(&c.res).pds.insert(id, (pd, 0));
        c.stats.acquire(Held::Pd);
        Ok(id)
    }

    fn dealloc_pd(&self, ch: ChannelId, pd: PdId) -> DeviceResult<()> {
        let c = self.inner.chan(ch)?;
        let mut r = lock(&c.res);
        match r.pds.get(&pd) {
            None => return Err(bad("PD", pd.0)),
            Some((_, n)) if *n > 0 => return Err(DeviceError::Busy("protection domain")),
            Some(_) => {}
        }
        r.pds.remove(&pd);
        drop(r);
        lock(&self.inner.tables).pds -= 1;
        c.stats.release(Held::Pd);
        Ok(())
    }

    fn reg_mr(&self, ch: ChannelId, s: MrSetup) -> DeviceResult<MrKeys> {
        let attrs = self.inner.attrs;
        let max_bytes = u64::from(attrs.max_mr_pages) * PAGE_SIZE as u64;
        let c = self.inner.chan(ch)?;
        if s.access & !access::ALL != 0 {
            return Err(inval(format!("unknown access bits {:#x}", s.access)));
        }
        if s.access & (access::LOCAL_WRITE | access::REMOTE_WRITE) != 0 && !s.writable {
            return Err(inval("write access to pages mapped read-only"));
        }
        let base = s.first_page_offset as usize;
        if base >= PAGE_SIZE
            || s.length == 0
            || s.length > max_bytes
            || (base as u64).saturating_add(s.length) > s.pages.len() as u64
            || s.iova.checked_add(s.length).is_none()
        {
            return Err(inval(format!(
                "region of {} bytes at offset {base} does not fit {} mapped bytes",
                s.length,
                s.pages.len()
            )));
        }
        let mut t = lock(&self.inner.tables);
        if t.mrs >= attrs.max_mr as usize {
            return Err(DeviceError::NoResources("memory regions"));
        }
        let mut r = lock(&c.res);
        let hca_pd = r.pds.get(&s.pd).ok_or(bad("PD", s.pd.0))?.0.clone();
        // The region's first byte in this process: the mapping's address plus the offset.
        let addr = s.pages.dma_addr().as_ptr().wrapping_add(base);
        let len = usize::try_from(s.length).map_err(|_| inval("region too long"))?;
        // SAFETY: `addr..addr+len` lies inside the mapping `s.pages` (checked above), which the
        // `MrEntry` keeps (and drops after the registration); this process touches that memory
        // only through `SharedRegion`'s accessors.
        let mr = unsafe { hca_pd.reg_mr_iova(addr, len, s.iova, ibv_access(s.access)) }
            .map_err(hca_err("ibv_reg_mr_iova2"))?;
        // At most max_mr registrations (checked above), as many slots: never None.
        let kept = self
            .inner
            .keeper
            .track(mr.handle())
            .ok_or(DeviceError::NoResources("memory regions"))?;
        let handle = MrHandle(t.id());
        t.mrs += 1;
        // The guest's lkey is the relay's own key (translated on every post); its rkey is the
        // HCA's, so remote peers use it as it is.
        let lkey = handle.0;
        let rkey = mr.rkey();
        lock(&c.keys).insert(
            lkey,
            KeyEntry {
                pd: s.pd,
                hca_lkey: mr.lkey(),
                iova: s.iova,
                len: s.length,
                access: s.access,
            },
        );
        if let Some(p) = r.pds.get_mut(&s.pd) {
            p.1 += 1;
        }
        r.mrs.insert(
            handle,
            MrEntry {
                _registration: mr,
                _kept: kept,
                lkey,
                pd: s.pd,
                len: s.length,
                _pages: s.pages,
            },
        );
        c.stats.acquire(Held::Mr(s.length));
        Ok(MrKeys { handle, lkey, rkey })
    }

    fn dereg_mr(&self, ch: ChannelId, mr: MrHandle) -> DeviceResult<()> {
        let c = self.inner.chan(ch)?;
        let mut r = lock(&c.res);
        let m = r.mrs.remove(&mr).ok_or(bad("MR", mr.0))?;
        lock(&c.keys).remove(&m.lkey);
        if let Some(p) = r.pds.get_mut(&m.pd) {
            p.1 = p.1.saturating_sub(1);
        }
        drop(r);
        c.stats.release(Held::Mr(m.len));
        // Deregistered, then unmapped (field order of MrEntry).
        drop(m);
        lock(&self.inner.tables).mrs -= 1;
        Ok(())
    }

    fn create_cq(&self, ch: ChannelId, s: CqSetup) -> DeviceResult<CqId> {
        let n = check_log2("CQ", s.cqe_log2, self.inner.attrs.max_cqe)?;
        let c = self.inner.chan(ch)?;
        if s.ring.len() < n * CQE_LEN {
            return Err(inval(format!(
                "CQ of {n} CQEs needs {} bytes, the ring has {}",
                n * CQE_LEN,
                s.ring.len()
            )));
        }
        let mut t = lock(&self.inner.tables);
        if t.cqs >= self.inner.attrs.max_cq as usize {
            return Err(DeviceError::NoResources("completion queues"));
        }
        let mut r = lock(&c.res);
        take_slot_of(&lock(&c.doorbells), &mut r.slots, s.doorbell_slot)?;
        let build = || -> Result<_, shared_ring::doorbell::DoorbellError> {
            s.ring.zero(0, n * CQE_LEN)?;
            let slots = s.ring.slots(0, n)?;
            let db = lock(&c.doorbells).cq(s.doorbell_slot)?;
            let poller = (c.mode == ChannelMode::Mediated)
                .then(|| Mutex::new(CqPoller::new(slots.clone(), db.clone())));
            Ok((CqWriter::new(slots, db), poller))
        };
        let built = build().map_err(|e| inval(e.to_string())).and_then(|x| {
            let hca = self
                .inner
                .ctx
                .create_cq(n as i32, Some(&self.inner.comp))
                .map_err(hca_err("ibv_create_cq"))?;
            Ok((x, hca))
        });
        let ((writer, poller), hca) = match built {
            Ok(x) => x,
            Err(e) => {
                r.slots.remove(&s.doorbell_slot);
                return Err(e);
            }
        };
        let id = CqId(t.id());
        t.cqs += 1;
        r.cqs.insert(
            id,
            Arc::new(VCq {
                hca,
                writer: Mutex::new((writer, false)),
                poller,
                slot: s.doorbell_slot,
                users: Default::default(),
                inflight: Default::default(),
            }),
        );
        c.stats.acquire(Held::Cq);
        Ok(id)
    }

    fn destroy_cq(&self, ch: ChannelId, cq: CqId) -> DeviceResult<()> {
        let c = self.inner.chan(ch)?;
        let mut r = lock(&c.res);
        let v = r.cqs.get(&cq).ok_or(bad("CQ", cq.0))?;
        if v.users.load(Ordering::SeqCst) > 0 {
            return Err(DeviceError::Busy("completion queue"));
        }
        let slot = v.slot;
        if let Some(v) = r.cqs.remove(&cq) {
            lock(&self.inner.graveyard).push(v);
        }
        r.slots.remove(&slot);
        drop(r);
        self.inner.poke();
        c.stats.release(Held::Cq);
        lock(&self.inner.tables).cqs -= 1;
        Ok(())
    }

    fn create_qp(&self, ch: ChannelId, s: QpSetup) -> DeviceResult<QpNum> {
        let attrs = self.inner.attrs;
        let sq_n = check_log2("SQ", s.sq_log2, attrs.max_qp_wr)?;
        let rq_n = check_log2("RQ", s.rq_log2, attrs.max_qp_wr)?;
        if s.sq_slot == s.rq_slot {
            return Err(inval("SQ and RQ need different doorbell slots"));
        }
        let c = self.inner.chan(ch)?;
        let mut t = lock(&self.inner.tables);
        if t.qps.len() >= attrs.max_qp as usize {
            return Err(DeviceError::NoResources("queue pairs"));
        }
        let mut r = lock(&c.res);
        let pd = r.pds.get(&s.pd).ok_or(bad("PD", s.pd.0))?.0.clone();
        let send_cq = r.cqs.get(&s.send_cq).ok_or(bad("CQ", s.send_cq.0))?.clone();
        let recv_cq = r.cqs.get(&s.recv_cq).ok_or(bad("CQ", s.recv_cq.0))?.clone();
        {
            let dbs = lock(&c.doorbells);
            take_slot_of(&dbs, &mut r.slots, s.sq_slot)?;
            if let Err(e) = take_slot_of(&dbs, &mut r.slots, s.rq_slot) {
                r.slots.remove(&s.sq_slot);
                return Err(e);
            }
        }
        let release = |r: &mut Res| {
            r.slots.remove(&s.sq_slot);
            r.slots.remove(&s.rq_slot);
        };
        let queues = {
            let dbs = lock(&c.doorbells);
            queue(&s.sq, &dbs, s.sq_slot, sq_n)
                .and_then(|sq| Ok((sq, queue(&s.rq, &dbs, s.rq_slot, rq_n)?)))
        };
        let (sq, rq) = match queues {
            Ok(x) => x,
            Err(e) => {
                release(&mut r);
                return Err(e);
            }
        };
        let init = ibv_qp_init_attr {
            cap: ibv_qp_cap {
                max_send_wr: sq_n as u32,
                max_recv_wr: rq_n as u32,
                max_send_sge: MAX_SGE as u32,
                max_recv_sge: MAX_SGE as u32,
                max_inline_data: attrs.max_inline,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        let hca = match pd
            .create_qp(&send_cq.hca, &recv_cq.hca, init)
            .map_err(hca_err("ibv_create_qp"))
            .and_then(|qp| {
                to_init(&qp, self.inner.av.port).map_err(hca_err("ibv_modify_qp(INIT)"))?;
                Ok(qp)
            }) {
            Ok(q) => q,
            Err(e) => {
                release(&mut r);
                return Err(e);
            }
        };
        let num = QpNum(hca.qp_num());
        let cap = hca.cap();
        let wq = |wq: WqConsumer, cap: u32| {
            Mutex::new(WqRelay {
                wq,
                pending: VecDeque::new(),
                next_seq: 0,
                cap: cap as usize,
                stalled: None,
            })
        };
        let qp = Arc::new(VQp {
            num,
            pd: s.pd,
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            sig_all: s.sq_sig_all,
            state: Mutex::new(QpState::Init),
            peer: Mutex::new(None),
            av: Mutex::new(None),
            sq: wq(sq, cap.max_send_wr.min(sq_n as u32)),
            rq: wq(rq, cap.max_recv_wr.min(rq_n as u32)),
            slots: (s.sq_slot, s.rq_slot),
            hca,
            counters: QpCounters::default(),
        });
        send_cq.users.fetch_add(1, Ordering::SeqCst);
        recv_cq.users.fetch_add(1, Ordering::SeqCst);
        if let Some(p) = r.pds.get_mut(&s.pd) {
            p.1 += 1;
        }
        r.qps.insert(num, qp);
        t.qps.insert(num, ch);
        drop(r);
        drop(t);
        c.stats.acquire(Held::Qp);
        self.inner.poke();
        Ok(num)
    }

    fn modify_qp(&self, ch: ChannelId, qp: QpNum, state: QpState) -> DeviceResult<()> {
        let c = self.inner.chan(ch)?;
        let q = lock(&c.res).qps.get(&qp).cloned().ok_or(bad("QP", qp.0))?;
        let cur = *lock(&q.state);
        match crate::device::qp_transition(cur, state)? {
            crate::device::QpTransition::ToError => {
                fail_qp(&c, &q, false);
                self.inner.poke();
                Ok(())
            }
            crate::device::QpTransition::Stay => Ok(()),
            // The HCA QP stays in INIT (receives can be posted) until it is connected.
            crate::device::QpTransition::Set => {
                if lock(&q.peer).is_some() {
                    return Err(DeviceError::NotSupported("changing state while connecting"));
                }
                *lock(&q.state) = state;
                Ok(())
            }
        }
    }

    fn qp_state(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<QpState> {
        let c = self.inner.chan(ch)?;
        let q = lock(&c.res).qps.get(&qp).cloned().ok_or(bad("QP", qp.0))?;
        let s = *lock(&q.state);
        Ok(s)
    }

    fn destroy_qp(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<()> {
        self.cm_forget_qp(ch, qp);
        let c = self.inner.chan(ch)?;
        let mut t = lock(&self.inner.tables);
        let mut r = lock(&c.res);
        let q = r.qps.remove(&qp).ok_or(bad("QP", qp.0))?;
        t.qps.remove(&qp);
        r.slots.remove(&q.slots.0);
        r.slots.remove(&q.slots.1);
        if let Some(p) = r.pds.get_mut(&q.pd) {
            p.1 = p.1.saturating_sub(1);
        }
        q.send_cq.users.fetch_sub(1, Ordering::SeqCst);
        q.recv_cq.users.fetch_sub(1, Ordering::SeqCst);
        drop(r);
        drop(t);
        c.stats.release(Held::Qp);
        // The HCA QP is destroyed with the last Arc (the relay may hold one for a pass); its
        // peer sees its requests fail (retry exceeded), as a remote peer would.
        drop(q);
        self.inner.poke();
        Ok(())
    }

    /// Loopback pairs only (both QPs on this device): when both ends named each other, both
    /// HCA QPs go RTR/RTS addressed at each other through the device's port.
    fn connect_qp(&self, ch: ChannelId, qp: QpNum, remote: QpNum) -> DeviceResult<()> {
        let t = lock(&self.inner.tables);
        let c = t.channels.get(&ch).cloned().ok_or(bad("channel", ch.0))?;
        let q = lock(&c.res).qps.get(&qp).cloned().ok_or(bad("QP", qp.0))?;
        if !matches!(
            *lock(&q.state),
            QpState::Reset | QpState::Init | QpState::Rtr
        ) {
            return Err(DeviceError::ConnectionRefused(qp.0, "QP is not in Init"));
        }
        {
            let mut p = lock(&q.peer);
            if p.is_some() {
                return Err(DeviceError::ConnectionRefused(
                    qp.0,
                    "QP is already connected",
                ));
            }
            *p = Some(remote);
        }
        *lock(&q.state) = QpState::Rtr;
        // As the software device: whether `remote` exists or named us is no answer to give.
        let r = t
            .qps
            .get(&remote)
            .and_then(|rc| t.channels.get(rc))
            .and_then(|rc| Some((rc.clone(), lock(&rc.res).qps.get(&remote).cloned()?)))
            .filter(|(_, r)| {
                *lock(&r.peer) == Some(qp)
                    && *lock(&r.state) == QpState::Rtr
                    && lock(&r.av).is_none()
            });
        drop(t);
        let Some((rc, r)) = r else { return Ok(()) };
        let av = self.inner.av;
        // Random first PSNs: the guests share the port's GIDs, so a QP number is all a
        // stranger's packets would need besides the PSN; a predictable PSN would give it away.
        let (psn_q, psn_r) = (random_psn(), random_psn());
        let res = to_rts(&q.hca, r.num.0, &av, psn_q, psn_r).and_then(|()| {
            if qp == remote {
                Ok(())
            } else {
                to_rts(&r.hca, q.num.0, &av, psn_r, psn_q)
            }
        });
        if let Err(e) = res {
            tracing::warn!(qp = qp.0, remote = remote.0, "connecting on the HCA: {e}");
            fail_qp(&c, &q, true);
            fail_qp(&rc, &r, true);
            return Err(DeviceError::ConnectionRefused(
                qp.0,
                "the device refused the address",
            ));
        }
        for (x, xc, y) in [(&q, &c, &r), (&r, &rc, &q)] {
            *lock(&x.state) = QpState::Rts;
            xc.post(&EventRepr {
                kind: EventKind::QpEstablished,
                handle: x.num.0,
                detail: u64::from(y.num.0),
            });
            if qp == remote {
                break;
            }
        }
        self.inner.poke();
        Ok(())
    }

    /// A QP of this device (any channel) addressed through this device's own port: its LID,
    /// or one of its GIDs (the guests share the port's GIDs with each other and with dom0).
    fn av_names_own_qp(&self, remote: &RemoteAv) -> bool {
        if !lock(&self.inner.tables)
            .qps
            .contains_key(&QpNum(remote.qpn))
        {
            return false;
        }
        let av = self.inner.av;
        if remote.lid != 0 && remote.lid == av.lid {
            return true;
        }
        if remote.gid == [0; 16] {
            return false;
        }
        if av.gid.is_some_and(|g| g.raw() == remote.gid) {
            return true;
        }
        match self.inner.ctx.query_port(av.port) {
            Ok(pattr) => self.port_gids(&pattr).iter().any(|g| g.gid == remote.gid),
            // Unknown: treat it as ours (a pairing), the safe side.
            Err(_) => true,
        }
    }

    /// The port's GID table (`super::av::guest_table`: its own GID first, with types).
    fn gid_table(&self) -> Vec<([u8; 16], u32)> {
        let inner = &self.inner;
        match inner.ctx.query_port(inner.av.port) {
            Ok(pattr) => super::av::guest_table(
                &inner.ctx.gid_table(inner.av.port, &pattr),
                inner.av.gid_index,
                self.cm_addrs().first().copied(),
            ),
            Err(e) => {
                tracing::warn!("the GID table: {e}");
                Vec::new()
            }
        }
    }

    fn local_av(&self) -> Option<LocalAv> {
        let av = self.inner.av;
        Some(LocalAv {
            gid: av.gid.map(|g| g.raw()).unwrap_or([0; 16]),
            lid: av.lid,
            port: av.port,
        })
    }

    /// RTR (and RTS with `local_psn`) towards `remote` through this device's port (RoCE: a
    /// global route, hop limit 1, from the port's GID of the peer's family:
    /// [`super::av::remote_av`]). The daemon checked the peer against the domain's allowed
    /// peers before. Repeating a step already made towards the same peer is no error (the
    /// guest library may send the RTR after the RTS: it sends its RTR from a thread).
    fn connect_qp_av(
        &self,
        ch: ChannelId,
        qp: QpNum,
        remote: RemoteAv,
        local_psn: Option<u32>,
    ) -> DeviceResult<()> {
        if remote.psn > 0xff_ffff
            || local_psn.is_some_and(|p| p > 0xff_ffff)
            || remote.qpn > 0xff_ffff
        {
            return Err(inval("PSNs and QP numbers are 24 bits"));
        }
        let c = self.inner.chan(ch)?;
        let q = lock(&c.res).qps.get(&qp).cloned().ok_or(bad("QP", qp.0))?;
        let state = *lock(&q.state);
        let have = *lock(&q.av);
        match (state, have) {
            (QpState::Reset | QpState::Init | QpState::Rtr, None) => {
                {
                    let mut p = lock(&q.peer);
                    if p.is_some() {
                        return Err(DeviceError::ConnectionRefused(
                            qp.0,
                            "QP is already connecting",
                        ));
                    }
                    *p = Some(QpNum(remote.qpn));
                }
                let av = match self.remote_av(&remote) {
                    Ok(av) => av,
                    Err(why) => {
                        *lock(&q.peer) = None;
                        tracing::warn!(qp = qp.0, "RTR by address vector: {why}");
                        return Err(DeviceError::ConnectionRefused(
                            qp.0,
                            "the device cannot reach that address vector (see the backend's \
                             log)",
                        ));
                    }
                };
                if let Err(e) = to_rtr(&q.hca, remote.qpn, &av, remote.psn) {
                    tracing::warn!(qp = qp.0, "RTR by address vector: {e}");
                    fail_qp(&c, &q, false);
                    self.inner.poke();
                    return Err(DeviceError::ConnectionRefused(
                        qp.0,
                        "the device refused the address vector",
                    ));
                }
                *lock(&q.av) = Some(remote);
                *lock(&q.state) = QpState::Rtr;
            }
            (QpState::Rtr | QpState::Rts, Some(a)) if a == remote => {}
            (QpState::Rtr | QpState::Rts, Some(_)) => {
                return Err(DeviceError::ConnectionRefused(
                    qp.0,
                    "QP is connected to another address vector",
                ))
            }
            _ => return Err(DeviceError::ConnectionRefused(qp.0, "QP is not in Init")),
        }
        let Some(psn) = local_psn else {
            return Ok(());
        };
        if *lock(&q.state) == QpState::Rts {
            return Ok(());
        }
        if let Err(e) = rtr_to_rts(&q.hca, psn) {
            tracing::warn!(qp = qp.0, "RTS by address vector: {e}");
            fail_qp(&c, &q, false);
            self.inner.poke();
            return Err(DeviceError::ConnectionRefused(
                qp.0,
                "the device refused the move to RTS",
            ));
        }
        *lock(&q.state) = QpState::Rts;
        c.post(&EventRepr {
            kind: EventKind::QpEstablished,
            handle: qp.0,
            detail: u64::from(remote.qpn),
        });
        self.inner.poke();
        Ok(())
    }

    fn arm_cq(&self, ch: ChannelId, cq: CqId, solicited_only: bool) -> DeviceResult<()> {
        let c = self.inner.chan(ch)?;
        let v = lock(&c.res).cqs.get(&cq).cloned().ok_or(bad("CQ", cq.0))?;
        let Some(p) = &v.poller else {
            return Err(DeviceError::NotMediated);
        };
        if lock(p).arm(solicited_only) {
            c.notify();
        }
        Ok(())
    }

    fn post_mediated(
        &self,
        ch: ChannelId,
        qp: QpNum,
        which: WorkQueue,
        prod: u32,
    ) -> DeviceResult<()> {
        let c = self.inner.chan(ch)?;
        if c.mode != ChannelMode::Mediated {
            return Err(DeviceError::NotMediated);
        }
        let q = lock(&c.res).qps.get(&qp).cloned().ok_or(bad("QP", qp.0))?;
        let slot = match which {
            WorkQueue::Sq => q.slots.0,
            WorkQueue::Rq => q.slots.1,
        };
        let db = lock(&c.doorbells)
            .queue(slot)
            .map_err(|e| inval(e.to_string()))?;
        db.prod.store(prod, Ordering::Release);
        self.inner.poke();
        Ok(())
    }

    fn poll_cq_mediated(&self, ch: ChannelId, cq: CqId) -> DeviceResult<Option<CqeRepr>> {
        let c = self.inner.chan(ch)?;
        if c.mode != ChannelMode::Mediated {
            return Err(DeviceError::NotMediated);
        }
        let v = lock(&c.res).cqs.get(&cq).cloned().ok_or(bad("CQ", cq.0))?;
        let Some(p) = &v.poller else {
            return Err(DeviceError::NotMediated);
        };
        let raw = lock(p).poll_raw();
        Ok(raw.and_then(|b| CqeRepr::from_bytes(&b).ok()))
    }

    fn stats(&self, ch: ChannelId) -> DeviceStats {
        lock(&self.inner.tables)
            .channels
            .get(&ch)
            .map(|c| c.stats.ch.snapshot())
            .unwrap_or_default()
    }

    /// The channel's QPs, by QP number, with what the relay passed on.
    fn qp_stats(&self, ch: ChannelId) -> Vec<QpStats> {
        let chans: Vec<Arc<VChan>> = lock(&self.inner.tables)
            .channels
            .get(&ch)
            .filter(|c| !c.closed.load(Ordering::Relaxed))
            .cloned()
            .into_iter()
            .collect();
        qp_stats_of(&chans)
    }

    /// The domain's QPs on open channels, by QP number, with what the relay passed on.
    fn domain_qp_stats(&self, domid: DomId) -> Vec<QpStats> {
        let chans: Vec<Arc<VChan>> = lock(&self.inner.tables)
            .channels
            .values()
            .filter(|c| c.domid == domid && !c.closed.load(Ordering::Relaxed))
            .cloned()
            .collect();
        qp_stats_of(&chans)
    }

    fn domain_stats(&self, domid: DomId) -> DeviceStats {
        lock(&self.inner.tables)
            .domains
            .get(&domid)
            .map(|c| c.snapshot())
            .unwrap_or_default()
    }

    cm::cm_methods!();
}

/// The counters of the QPs of `chans`, by QP number (the tables' lock not held: each
/// channel's resources are locked in turn, and no QP reference leaves the lock, so a QP the
/// guest destroys meanwhile is never destroyed on the caller's thread).
fn qp_stats_of(chans: &[Arc<VChan>]) -> Vec<QpStats> {
    let mut out: Vec<QpStats> = chans
        .iter()
        .flat_map(|c| {
            lock(&c.res)
                .qps
                .values()
                .map(|q| q.counters.snapshot(q.num, *lock(&q.state)))
                .collect::<Vec<_>>()
        })
        .collect();
    out.sort_unstable_by_key(|s| s.qp.0);
    out
}

/// A random 24-bit packet sequence number (std's per-instance random hash keys, seeded from
/// the OS: no dependency for 24 bits that only need to be unguessable to another guest).
fn random_psn() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    (h.finish() & 0xff_ffff) as u32
}

#[cfg(test)]
#[path = "device_tests.rs"]
mod fake_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-QP counters (`vrdmactl stats`' qp rows) count what the relay passes on: a
    /// send WQE's completion, a receive's as consumed, an error as an error; a flush is no
    /// operation.
    #[test]
    fn a_qp_s_counters_count_its_completions_but_not_flushes() {
        let cqe = |status, opcode, byte_len| CqeRepr {
            wr_id: 1,
            status,
            opcode,
            byte_len,
            imm_data: 0,
            qp_num: 7,
            vendor_err: 0,
            flags: 0,
        };
        let q = QpCounters::default();
        count(&q, &cqe(CqeStatus::Success, CqeOpcode::RdmaWrite, 4096));
        count(&q, &cqe(CqeStatus::Success, CqeOpcode::Recv, 64));
        count(&q, &cqe(CqeStatus::Success, CqeOpcode::RecvRdmaWithImm, 0));
        count(
            &q,
            &cqe(CqeStatus::RemoteAccessError, CqeOpcode::RdmaRead, 0),
        );
        count(&q, &cqe(CqeStatus::WrFlushError, CqeOpcode::Send, 0));
        count(&q, &cqe(CqeStatus::WrFlushError, CqeOpcode::Recv, 0));
        let s = q.snapshot(QpNum(7), QpState::Error);
        assert_eq!(
            (s.ops, s.bytes, s.errors, s.recvs),
            (4, 4096 + 64, 1, 2),
            "{s:?}"
        );
    }

    #[test]
    fn attrs_are_the_hcas_bounded_by_the_soft_defaults_and_the_wqe_format() {
        let d = default_attrs();
        let hca = ibv_device_attr {
            max_qp: 100,
            max_cq: i32::MAX,
            max_mr: -1,
            max_pd: 7,
            max_qp_wr: 1000,
            max_cqe: 5000,
            max_sge: 30,
            max_mr_size: 1 << 20,
            ..Default::default()
        };
        let a = attrs_of(&hca, &ibv_port_attr::default());
        assert_eq!(a.max_qp, 100);
        assert_eq!(a.max_cq, d.max_cq);
        assert_eq!(
            a.max_mr, 0,
            "a negative HCA limit is no resource, not a huge one"
        );
        assert_eq!(a.max_pd, 7);
        assert_eq!(a.max_qp_wr, 512);
        assert_eq!(a.max_cqe, 4096);
        assert_eq!(a.max_sge, MAX_SGE as u32);
        assert_eq!(a.max_inline, MAX_INLINE as u32);
        assert_eq!(a.max_mr_pages, (1 << 20) / PAGE_SIZE as u32);
    }

    #[test]
    fn access_bits_map_to_ibv_access() {
        assert_eq!(ibv_access(0), 0);
        assert_eq!(
            ibv_access(access::LOCAL_WRITE | access::REMOTE_WRITE | access::REMOTE_READ),
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ
        );
        assert_eq!(ibv_access(access::REMOTE_READ), IBV_ACCESS_REMOTE_READ);
    }
}
