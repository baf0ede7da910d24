//! The software device: control path and resource tables.
//!
//! One table lock serialises the control path (it is not on the data path); the engine works on
//! `Arc`s of the objects and the key table, so a destroy only has to unlink an object and tell
//! the engine, and memory stays mapped until the last in-flight use is over.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

use shared_ring::abi::control::{access, QpState};
use shared_ring::abi::cqe::{CqeRepr, CQE_LEN};
use shared_ring::abi::event::EVENT_LEN;
use shared_ring::abi::event::{EventKind, EventRepr};
use shared_ring::abi::wqe::{MAX_INLINE, MAX_SGE, WQE_LEN};
use shared_ring::cq::{CqPoller, CqWriter};
use shared_ring::doorbell::{DoorbellPage, EngineSleep};
use shared_ring::event_ring::{self, EVENT_RING_LEN};
use shared_ring::queue::Producer;
use shared_ring::{SharedRegion, WqConsumer, PAGE_SIZE, PROTOCOL_VERSION};

use super::engine::{self, EngineShared};
use super::mr::{KeyTable, Mr, NewMr};
use super::objects::{lock, Channel, Cq, CqState, Doorbells, Qp};
use super::stats::{ChanStats, Counters, Held};
use super::waker::{kick_token, EngineWaker};
use super::*;
use std::os::fd::{AsFd, AsRawFd};

#[path = "cm.rs"]
pub(crate) mod cm;
pub use cm::{CmConfig, PeerFilter};

/// Largest queue the device accepts (log2).
pub(crate) const MAX_LOG2: u8 = 16;

/// The software RDMA device: engine threads plus the tables of the control path.
pub struct SoftDevice {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
}

struct Inner {
    attrs: DeviceAttrs,
    tables: Mutex<Tables>,
    keys: Arc<KeyTable>,
    engines: Arc<[Arc<EngineShared>]>,
    /// The connection manager, once [`SoftDevice::with_cm`] started it.
    cm: OnceLock<cm::CmRuntime>,
}

#[derive(Default)]
struct Tables {
    handles: Handles,
    /// Channels are spread over the engines round-robin in the order they open.
    next_engine: usize,
    channels: HashMap<ChannelId, ChanEntry>,
    qps: HashMap<QpNum, Arc<Qp>>,
    domains: HashMap<DomId, Arc<Counters>>,
    mr_count: usize,
    cq_count: usize,
    pd_count: usize,
    cm: cm::CmTables,
}

impl Tables {
    fn id(&mut self) -> u32 {
        self.handles.take()
    }
}

/// The handles of a device: channels, PDs, MRs, CQs and QPs share one space, so a handle names
/// one object of one kind. A handle is a keyed permutation (a 4-round Feistel network over
/// 32 bits, keyed per device with std's random SipHash keys) of a counter: unique until the
/// counter wraps, and not sequential, so a guest cannot guess another domain's QP numbers from
/// its own. After the counter wraps, values still live are skipped: a live handle is never
/// handed out twice.
struct Handles {
    counter: u32,
    key: RandomState,
    live: HashSet<u32>,
}

impl Default for Handles {
    fn default() -> Self {
        Self {
            counter: 0,
            key: RandomState::new(),
            live: HashSet::new(),
        }
    }
}

impl Handles {
    fn permute(&self, x: u32) -> u32 {
        let (mut l, mut r) = ((x >> 16) as u16, x as u16);
        for round in 0u8..4 {
            let f = self.key.hash_one((round, r)) as u16;
            (l, r) = (r, l ^ f);
        }
        (u32::from(l) << 16) | u32::from(r)
    }

    /// A fresh handle: never 0, never one that is live. Terminates because the live handles
    /// are bounded by the device limits, far below 2^32.
    fn take(&mut self) -> u32 {
        loop {
            self.counter = self.counter.wrapping_add(1);
            let h = self.permute(self.counter);
            if h != 0 && self.live.insert(h) {
                return h;
            }
        }
    }

    /// A fresh handle that fits a 24-bit InfiniBand QP number (verbs programs print and
    /// exchange QPNs as 24-bit values, as `ibv_rc_pingpong` does): about 1 in 256 handles
    /// does; the others are given back at once.
    fn take_qpn(&mut self) -> u32 {
        loop {
            let h = self.take();
            if h < 1 << 24 {
                return h;
            }
            self.release(h);
        }
    }

    /// The object named `h` is gone: the handle may be reused once the counter comes round.
    fn release(&mut self, h: u32) {
        self.live.remove(&h);
    }
}

struct ChanEntry {
    ch: Arc<Channel>,
    pds: HashMap<PdId, u32>,
    mrs: HashMap<MrHandle, Arc<Mr>>,
    cqs: HashMap<CqId, (Arc<Cq>, u32)>,
    qps: HashMap<QpNum, (u32, u32)>,
    slots: HashSet<u32>,
}

/// What an engine of a channel is doing (tests and diagnostics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineDiag {
    /// The engine is blocked (or about to block) waiting for a kick.
    pub asleep: bool,
    /// Times it has blocked so far.
    pub sleeps: u64,
}

/// Default limits of the software device.
pub fn default_attrs() -> DeviceAttrs {
    DeviceAttrs {
        max_qp: 1 << 16,
        max_cq: 1 << 16,
        max_mr: 1 << 20,
        max_pd: 1 << 16,
        max_qp_wr: 1 << 15,
        max_cqe: 1 << 16,
        max_sge: MAX_SGE as u32,
        max_inline: MAX_INLINE as u32,
        max_mr_pages: 1 << 20,
    }
}

pub(crate) fn inval(s: impl Into<String>) -> DeviceError {
    DeviceError::InvalidArgument(s.into())
}

fn bad(what: &'static str, id: u32) -> DeviceError {
    DeviceError::BadHandle { what, id }
}

impl SoftDevice {
    /// Starts the engine threads with the default limits.
    pub fn new(config: EngineConfig) -> std::io::Result<Self> {
        Self::with_attrs(config, default_attrs())
    }

    /// Starts the engine threads with the given limits (`max_sge`, `max_inline` are capped at
    /// what the WQE format carries).
    pub fn with_attrs(config: EngineConfig, mut attrs: DeviceAttrs) -> std::io::Result<Self> {
        attrs.max_sge = attrs.max_sge.min(MAX_SGE as u32);
        attrs.max_inline = attrs.max_inline.min(MAX_INLINE as u32);
        attrs.max_qp_wr = attrs.max_qp_wr.min(1 << MAX_LOG2);
        attrs.max_cqe = attrs.max_cqe.min(1 << MAX_LOG2);
        let n = config.threads.max(1);
        let prepared = (0..n)
            .map(engine::prepare)
            .collect::<std::io::Result<Vec<_>>>()?;
        let engines: Arc<[Arc<EngineShared>]> = prepared.iter().map(|p| p.shared.clone()).collect();
        let wakers: Arc<[Arc<EngineWaker>]> = engines.iter().map(|e| e.waker.clone()).collect();
        let keys = Arc::new(KeyTable::default());
        let mut threads = Vec::with_capacity(n);
        for p in prepared {
            match engine::spawn(p, config.spin, keys.clone(), wakers.clone()) {
                Ok(t) => threads.push(t),
                Err(e) => {
                    for w in wakers.iter() {
                        w.stop();
                    }
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(Self {
            inner: Arc::new(Inner {
                attrs,
                tables: Mutex::new(Tables::default()),
                keys,
                engines,
                cm: OnceLock::new(),
            }),
            threads,
        })
    }

    /// What the engine serving `ch` is doing.
    pub fn engine_diag(&self, ch: ChannelId) -> Option<EngineDiag> {
        let t = self.tables();
        let e = &t.channels.get(&ch)?.ch.engine;
        Some(EngineDiag {
            asleep: e.asleep.load(Ordering::SeqCst),
            sleeps: e.sleeps.load(Ordering::Relaxed),
        })
    }

    /// Test support: the handle counter continues after `counter` (so a test can make it wrap
    /// with objects still live). Handles stay unique; only which ones come next changes.
    #[doc(hidden)]
    pub fn set_handle_counter(&self, counter: u32) {
        self.tables().handles.counter = counter;
    }

    /// Test support: the memory-key counter continues after `counter` (keys are counted modulo
    /// 2^31), so a test can make it wrap with regions still registered.
    #[doc(hidden)]
    pub fn set_key_counter(&self, counter: u32) {
        self.inner.keys.set_counter(counter);
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        lock(&self.inner.tables)
    }
}

impl Drop for SoftDevice {
    fn drop(&mut self) {
        if let Some(cm) = self.inner.cm.get() {
            cm.stop();
        }
        for e in self.inner.engines.iter() {
            e.waker.stop();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Doorbell pages one channel may have (slots for tens of thousands of queues).
pub const MAX_DOORBELL_PAGES: usize = 1024;

fn entry(t: &mut Tables, ch: ChannelId) -> DeviceResult<&mut ChanEntry> {
    t.channels.get_mut(&ch).ok_or(bad("channel", ch.0))
}

/// Takes a doorbell slot for a queue: in range, free; its index words are reset.
fn take_slot(e: &mut ChanEntry, slot: u32) -> DeviceResult<()> {
    take_slot_of(&lock(&e.ch.doorbells), &mut e.slots, slot)
}

/// Takes doorbell slot `slot` of a channel whose taken slots are `taken`: in range, free; its
/// index words are reset (also used by the verbs device).
pub(crate) fn take_slot_of(
    dbs: &Doorbells,
    taken: &mut HashSet<u32>,
    slot: u32,
) -> DeviceResult<()> {
    if slot >= dbs.slots() {
        return Err(inval(format!(
            "doorbell slot {slot} does not exist (the pages have {})",
            dbs.slots()
        )));
    }
    if taken.contains(&slot) {
        return Err(DeviceError::Busy("doorbell slot"));
    }
    let q = dbs.queue(slot).map_err(|e| inval(e.to_string()))?;
    q.prod.store(0, Ordering::Relaxed);
    // A CQ's words too: a slot reused by a CQ must not inherit an arm or consumer index.
    let c = dbs.cq(slot).map_err(|e| inval(e.to_string()))?;
    c.arm.store(0, Ordering::Relaxed);
    c.cons.store(0, Ordering::Relaxed);
    q.cons.store(0, Ordering::Release);
    taken.insert(slot);
    Ok(())
}

/// What a new channel's pages become: its doorbell pages (the first initialised), the
/// engine's sleep word and the event-ring producer (also used by the verbs device).
pub(crate) fn init_channel_pages(
    setup: &ChannelSetup,
) -> DeviceResult<(Doorbells, EngineSleep, Producer<EVENT_LEN>)> {
    if setup.event_ring.len() < EVENT_RING_LEN {
        return Err(inval(format!(
            "event ring of {} bytes, need {EVENT_RING_LEN}",
            setup.event_ring.len()
        )));
    }
    if shared_ring::doorbell::slots_in(setup.doorbell.len()) == 0 {
        return Err(inval("doorbell page has no slots"));
    }
    let guest_db = DoorbellPage::init(setup.doorbell.clone(), PROTOCOL_VERSION)
        .map_err(|e| inval(e.to_string()))?;
    setup
        .event_ring
        .zero(0, EVENT_RING_LEN)
        .map_err(|e| inval(e.to_string()))?;
    let events = event_ring::producer(&setup.event_ring).map_err(|e| inval(e.to_string()))?;
    let sleep = guest_db.engine_sleep().map_err(|e| inval(e.to_string()))?;
    let doorbells =
        Doorbells::new(guest_db, setup.mode).map_err(|_| DeviceError::NoResources("memory"))?;
    Ok((doorbells, sleep, events))
}

pub(crate) fn check_log2(what: &str, log2: u8, max: u32) -> DeviceResult<usize> {
    if log2 == 0 || log2 > MAX_LOG2 || (1u32 << log2) > max {
        return Err(inval(format!(
            "{what} of 2^{log2} entries is out of range (max {max})"
        )));
    }
    Ok(1usize << log2)
}

pub(crate) fn queue(
    region: &SharedRegion,
    db: &Doorbells,
    slot: u32,
    n: usize,
) -> DeviceResult<WqConsumer> {
    if region.len() < n * WQE_LEN {
        return Err(inval(format!(
            "queue of {n} WQEs needs {} bytes, the region has {}",
            n * WQE_LEN,
            region.len()
        )));
    }
    let slots = region.slots(0, n).map_err(|e| inval(e.to_string()))?;
    let q = db.queue(slot).map_err(|e| inval(e.to_string()))?;
    // Bypass: the engine finds WQEs by their phase bit (one line per WQE); mediated: by the
    // private producer index the control path moves.
    Ok(WqConsumer::with_owner(
        slots,
        q.prod,
        q.cons,
        0,
        shared_ring::abi::wqe::field::OWNER,
        !db.mediated(),
    ))
}

impl Inner {
    /// Unlinks a QP; its peer goes to Error with `QpDisconnected`.
    fn destroy_qp_locked(&self, t: &mut Tables, ch: ChannelId, num: QpNum) {
        let Some(qp) = t.qps.remove(&num) else { return };
        t.handles.release(num.0);
        self.cm_forget_qp_locked(t, num);
        if let Some(e) = t.channels.get_mut(&ch) {
            if let Some((sq, rq)) = e.qps.remove(&num) {
                e.slots.remove(&sq);
                e.slots.remove(&rq);
            }
            if let Some(n) = e.pds.get_mut(&qp.pd) {
                *n = n.saturating_sub(1);
            }
        }
        qp.destroyed.store(true, Ordering::SeqCst);
        qp.fail(None);
        if let Some(r) = qp.remote.get() {
            super::iwarp::qp::close(r);
        }
        let peer = lock(&qp.send).peer.take().and_then(|w| w.upgrade());
        if let Some(peer) = peer {
            if peer.num != num {
                peer.fail(Some(EventKind::QpDisconnected));
            }
        }
        qp.send_cq.users.fetch_sub(1, Ordering::SeqCst);
        qp.recv_cq.users.fetch_sub(1, Ordering::SeqCst);
        lock(&qp.ch.qps).retain(|q| q.num != num);
        qp.ch.stats.release(Held::Qp);
        qp.ch.engine.changed();
    }
}

impl Device for SoftDevice {
    fn attrs(&self) -> DeviceAttrs {
        self.inner.attrs
    }

    fn open_channel(&self, setup: ChannelSetup) -> DeviceResult<ChannelId> {
        let (doorbells, sleep, events) = init_channel_pages(&setup)?;
        let mut t = self.tables();
        let id = ChannelId(t.id());
        let engines = self.inner.engines.len();
        let dom = t
            .domains
            .entry(setup.domid)
            .or_insert_with(|| Arc::new(Counters::with_shards(engines)))
            .clone();
        let stats = ChanStats {
            ch: Arc::new(Counters::with_shards(1)),
            dom,
        };
        stats.acquire(Held::Channel);
        let engine = self.inner.engines[t.next_engine % self.inner.engines.len()].clone();
        t.next_engine = t.next_engine.wrapping_add(1);
        let mut ch = Channel::new(
            id,
            setup.domid,
            setup.mode,
            doorbells,
            sleep,
            events,
            setup.notifier,
            stats,
            engine.waker.clone(),
        );
        // A bypass channel's engine wakes on the guest's event channel itself (mediated posts
        // come over the control ring, whose thread wakes the engine anyway).
        if setup.mode == ChannelMode::Bypass {
            if let Some(src) = setup.kick_source {
                let fd = src.as_fd().as_raw_fd();
                match engine.registry.register(
                    &mut mio::unix::SourceFd(&fd),
                    kick_token(id),
                    mio::Interest::READABLE,
                ) {
                    Ok(()) => ch.kick_source = Some(src),
                    // Not fatal: the daemon's kicks still wake the engine.
                    Err(e) => tracing::warn!(
                        ch = id.0,
                        "the engine cannot watch the channel's event channel ({e}); kicks go through the daemon"
                    ),
                }
            }
        }
        let ch = Arc::new(ch);
        t.channels.insert(
            id,
            ChanEntry {
                ch: ch.clone(),
                pds: HashMap::new(),
                mrs: HashMap::new(),
                cqs: HashMap::new(),
                qps: HashMap::new(),
                slots: HashSet::new(),
            },
        );
        drop(t);
        lock(&engine.channels).push(ch);
        engine.waker.changed();
        tracing::debug!(ch = id.0, domid = %setup.domid, mode = ?setup.mode, "channel opened");
        Ok(id)
    }

    fn close_channel(&self, ch: ChannelId) {
        let mut t = self.tables();
        let Some(e) = t.channels.get(&ch) else { return };
        let c = e.ch.clone();
        c.closed.store(true, Ordering::SeqCst);
        let listeners = self.inner.cm_close_channel_locked(&mut t, ch);
        let Some(e) = t.channels.get(&ch) else { return };
        let qps: Vec<QpNum> = e.qps.keys().copied().collect();
        for q in qps {
            self.inner.destroy_qp_locked(&mut t, ch, q);
        }
        let Some(e) = t.channels.remove(&ch) else {
            return;
        };
        for (h, mr) in &e.mrs {
            self.inner.keys.remove(mr.lkey);
            c.stats.release(Held::Mr(mr.len));
            t.handles.release(h.0);
        }
        t.mr_count -= e.mrs.len();
        for h in e.cqs.keys() {
            c.stats.release(Held::Cq);
            t.handles.release(h.0);
        }
        t.cq_count -= e.cqs.len();
        for h in e.pds.keys() {
            c.stats.release(Held::Pd);
            t.handles.release(h.0);
        }
        t.pd_count -= e.pds.len();
        t.handles.release(ch.0);
        c.stats.release(Held::Channel);
        drop(t);
        lock(&c.qps).clear();
        let engine = &self.inner.engines[c.engine.idx];
        lock(&engine.channels).retain(|x| x.id != ch);
        if let Some(src) = &c.kick_source {
            let fd = src.as_fd().as_raw_fd();
            if let Err(e) = engine.registry.deregister(&mut mio::unix::SourceFd(&fd)) {
                tracing::warn!(ch = ch.0, "deregistering the channel's event channel: {e}");
            }
        }
        c.engine.changed();
        for closed in listeners {
            cm::wait_closed(Some(closed));
        }
        tracing::debug!(ch = ch.0, "channel closed");
    }

    fn add_doorbell_page(&self, ch: ChannelId, page: SharedRegion) -> DeviceResult<u32> {
        if shared_ring::doorbell::slots_in(page.len()) == 0 {
            return Err(inval("doorbell page has no slots"));
        }
        let mut t = self.tables();
        let e = entry(&mut t, ch)?;
        let mut dbs = lock(&e.ch.doorbells);
        if dbs.pages() >= MAX_DOORBELL_PAGES {
            return Err(DeviceError::NoResources("doorbell pages"));
        }
        let db = DoorbellPage::init(page, PROTOCOL_VERSION).map_err(|e| inval(e.to_string()))?;
        dbs.push(db).map_err(|_| DeviceError::NoResources("memory"))
    }

    fn kick(&self, ch: ChannelId) {
        let t = self.tables();
        if let Some(e) = t.channels.get(&ch) {
            e.ch.engine.wake();
        }
    }

    fn takes_kicks(&self, ch: ChannelId) -> bool {
        self.tables()
            .channels
            .get(&ch)
            .is_some_and(|e| e.ch.kick_source.is_some())
    }

    fn post_event(&self, ch: ChannelId, event: EventRepr) -> DeviceResult<()> {
        let c = entry(&mut self.tables(), ch)?.ch.clone();
        c.post(&event);
        Ok(())
    }

    fn alloc_pd(&self, ch: ChannelId) -> DeviceResult<PdId> {
        let mut t = self.tables();
        if t.pd_count >= self.inner.attrs.max_pd as usize {
            return Err(DeviceError::NoResources("protection domains"));
        }
        entry(&mut t, ch)?;
        let id = PdId(t.id());
        let e = entry(&mut t, ch)?;
        e.pds.insert(id, 0);
        e.ch.stats.acquire(Held::Pd);
        t.pd_count += 1;
        Ok(id)
    }

    fn dealloc_pd(&self, ch: ChannelId, pd: PdId) -> DeviceResult<()> {
        let mut t = self.tables();
        let e = entry(&mut t, ch)?;
        match e.pds.get(&pd) {
            None => return Err(bad("PD", pd.0)),
            Some(&n) if n > 0 => return Err(DeviceError::Busy("protection domain")),
            Some(_) => {}
        }
        e.pds.remove(&pd);
        e.ch.stats.release(Held::Pd);
        t.pd_count -= 1;
        t.handles.release(pd.0);
        Ok(())
    }

    fn reg_mr(&self, ch: ChannelId, s: MrSetup) -> DeviceResult<MrKeys> {
        let max_mr = self.inner.attrs.max_mr as usize;
        let max_bytes = u64::from(self.inner.attrs.max_mr_pages) * PAGE_SIZE as u64;
        let mut t = self.tables();
        if t.mr_count >= max_mr {
            return Err(DeviceError::NoResources("memory regions"));
        }
        let e = entry(&mut t, ch)?;
        if !e.pds.contains_key(&s.pd) {
            return Err(bad("PD", s.pd.0));
        }
        if s.access & !access::ALL != 0 {
            return Err(inval(format!("unknown access bits {:#x}", s.access)));
        }
        if s.access & (access::LOCAL_WRITE | access::REMOTE_WRITE) != 0 && !s.writable {
            return Err(inval("write access to pages mapped read-only"));
        }
        let base = s.first_page_offset as usize;
        if base >= PAGE_SIZE
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
        let mr = self
            .inner
            .keys
            .insert(
                NewMr {
                    ch,
                    pd: s.pd,
                    pages: s.pages,
                    base,
                    len: s.length,
                    iova: s.iova,
                    access: s.access,
                },
                max_mr,
            )
            .ok_or(DeviceError::NoResources("memory keys"))?;
        let handle = MrHandle(t.id());
        let e = entry(&mut t, ch)?;
        let keys = MrKeys {
            handle,
            lkey: mr.lkey,
            rkey: mr.rkey,
        };
        *e.pds.entry(s.pd).or_default() += 1;
        e.mrs.insert(handle, mr);
        e.ch.stats.acquire(Held::Mr(s.length));
        t.mr_count += 1;
        Ok(keys)
    }

    fn dereg_mr(&self, ch: ChannelId, mr: MrHandle) -> DeviceResult<()> {
        let mut t = self.tables();
        let e = entry(&mut t, ch)?;
        let m = e.mrs.remove(&mr).ok_or(bad("MR", mr.0))?;
        self.inner.keys.remove(m.lkey);
        if let Some(n) = e.pds.get_mut(&m.pd) {
            *n = n.saturating_sub(1);
        }
        e.ch.stats.release(Held::Mr(m.len));
        t.mr_count -= 1;
        t.handles.release(mr.0);
        Ok(())
    }

    fn create_cq(&self, ch: ChannelId, s: CqSetup) -> DeviceResult<CqId> {
        let n = check_log2("CQ", s.cqe_log2, self.inner.attrs.max_cqe)?;
        let mut t = self.tables();
        if t.cq_count >= self.inner.attrs.max_cq as usize {
            return Err(DeviceError::NoResources("completion queues"));
        }
        let e = entry(&mut t, ch)?;
        if s.ring.len() < n * CQE_LEN {
            return Err(inval(format!(
                "CQ of {n} CQEs needs {} bytes, the ring has {}",
                n * CQE_LEN,
                s.ring.len()
            )));
        }
        take_slot(e, s.doorbell_slot)?;
        let build = || -> Result<_, shared_ring::doorbell::DoorbellError> {
            s.ring.zero(0, n * CQE_LEN)?;
            let slots = s.ring.slots(0, n)?;
            let db = lock(&e.ch.doorbells).cq(s.doorbell_slot)?;
            let poller = (e.ch.mode == ChannelMode::Mediated)
                .then(|| Mutex::new(CqPoller::new(slots.clone(), db.clone())));
            Ok((CqWriter::new(slots, db), poller))
        };
        let (writer, poller) = match build() {
            Ok(x) => x,
            Err(err) => {
                e.slots.remove(&s.doorbell_slot);
                return Err(inval(err.to_string()));
            }
        };
        let id = CqId(t.id());
        let e = entry(&mut t, ch)?;
        let cq = Arc::new(Cq {
            id,
            ch: e.ch.clone(),
            state: Mutex::new(CqState {
                writer,
                broken: false,
            }),
            poller,
            users: Default::default(),
        });
        e.cqs.insert(id, (cq, s.doorbell_slot));
        e.ch.stats.acquire(Held::Cq);
        t.cq_count += 1;
        Ok(id)
    }

    fn destroy_cq(&self, ch: ChannelId, cq: CqId) -> DeviceResult<()> {
        let mut t = self.tables();
        let e = entry(&mut t, ch)?;
        let (c, _) = e.cqs.get(&cq).ok_or(bad("CQ", cq.0))?;
        if c.users.load(Ordering::SeqCst) > 0 {
            return Err(DeviceError::Busy("completion queue"));
        }
        if let Some((_, slot)) = e.cqs.remove(&cq) {
            e.slots.remove(&slot);
        }
        e.ch.stats.release(Held::Cq);
        t.cq_count -= 1;
        t.handles.release(cq.0);
        Ok(())
    }

    fn create_qp(&self, ch: ChannelId, s: QpSetup) -> DeviceResult<QpNum> {
        let attrs = self.inner.attrs;
        let sq_n = check_log2("SQ", s.sq_log2, attrs.max_qp_wr)?;
        let rq_n = check_log2("RQ", s.rq_log2, attrs.max_qp_wr)?;
        if s.sq_slot == s.rq_slot {
            return Err(inval("SQ and RQ need different doorbell slots"));
        }
        let mut t = self.tables();
        if t.qps.len() >= attrs.max_qp as usize {
            return Err(DeviceError::NoResources("queue pairs"));
        }
        let e = entry(&mut t, ch)?;
        if !e.pds.contains_key(&s.pd) {
            return Err(bad("PD", s.pd.0));
        }
        let send_cq = e
            .cqs
            .get(&s.send_cq)
            .ok_or(bad("CQ", s.send_cq.0))?
            .0
            .clone();
        let recv_cq = e
            .cqs
            .get(&s.recv_cq)
            .ok_or(bad("CQ", s.recv_cq.0))?
            .0
            .clone();
        take_slot(e, s.sq_slot)?;
        if let Err(err) = take_slot(e, s.rq_slot) {
            e.slots.remove(&s.sq_slot);
            return Err(err);
        }
        let db = lock(&e.ch.doorbells);
        let queues = queue(&s.sq, &db, s.sq_slot, sq_n)
            .and_then(|sq| Ok((sq, queue(&s.rq, &db, s.rq_slot, rq_n)?)));
        drop(db);
        let (sq, rq) = match queues {
            Ok(q) => q,
            Err(err) => {
                e.slots.remove(&s.sq_slot);
                e.slots.remove(&s.rq_slot);
                return Err(err);
            }
        };
        let num = QpNum(t.handles.take_qpn());
        let e = entry(&mut t, ch)?;
        let qp = Arc::new(Qp::new(
            num,
            e.ch.clone(),
            s.pd,
            send_cq.clone(),
            recv_cq.clone(),
            s.sq_sig_all,
            sq,
            rq,
        ));
        send_cq.users.fetch_add(1, Ordering::SeqCst);
        recv_cq.users.fetch_add(1, Ordering::SeqCst);
        *e.pds.entry(s.pd).or_default() += 1;
        e.qps.insert(num, (s.sq_slot, s.rq_slot));
        e.ch.stats.acquire(Held::Qp);
        let c = e.ch.clone();
        t.qps.insert(num, qp.clone());
        drop(t);
        lock(&c.qps).push(qp);
        c.engine.changed();
        Ok(num)
    }

    fn modify_qp(&self, ch: ChannelId, qp: QpNum, state: QpState) -> DeviceResult<()> {
        let mut t = self.tables();
        let e = entry(&mut t, ch)?;
        if !e.qps.contains_key(&qp) {
            return Err(bad("QP", qp.0));
        }
        let q = t.qps.get(&qp).ok_or(bad("QP", qp.0))?.clone();
        match super::qp_transition(q.state(), state)? {
            super::QpTransition::ToError => {
                q.fail(None);
                Ok(())
            }
            super::QpTransition::Stay => Ok(()),
            super::QpTransition::Set => {
                if lock(&q.send).peer_num.is_some() {
                    return Err(DeviceError::NotSupported("changing state while connecting"));
                }
                q.set_state(state);
                Ok(())
            }
        }
    }

    fn qp_state(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<QpState> {
        let mut t = self.tables();
        if !entry(&mut t, ch)?.qps.contains_key(&qp) {
            return Err(bad("QP", qp.0));
        }
        Ok(t.qps.get(&qp).ok_or(bad("QP", qp.0))?.state())
    }

    fn destroy_qp(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<()> {
        let mut t = self.tables();
        if !entry(&mut t, ch)?.qps.contains_key(&qp) {
            return Err(bad("QP", qp.0));
        }
        self.inner.destroy_qp_locked(&mut t, ch, qp);
        Ok(())
    }

    fn connect_qp(&self, ch: ChannelId, qp: QpNum, remote: QpNum) -> DeviceResult<()> {
        let mut t = self.tables();
        if !entry(&mut t, ch)?.qps.contains_key(&qp) {
            return Err(bad("QP", qp.0));
        }
        let q = t.qps.get(&qp).ok_or(bad("QP", qp.0))?.clone();
        if !matches!(q.state(), QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(DeviceError::ConnectionRefused(qp.0, "QP is not in Init"));
        }
        if t.cm.has_qp(qp) {
            return Err(DeviceError::ConnectionRefused(
                qp.0,
                "QP is connected by the connection manager",
            ));
        }
        let mut s = lock(&q.send);
        if s.peer_num.is_some() {
            return Err(DeviceError::ConnectionRefused(
                qp.0,
                "QP is already connected",
            ));
        }
        // Only the caller's QP records anything: the name it gave. Whether `remote` exists,
        // belongs to someone else or named a third QP, the answer is the same (the QP waits in
        // Rtr), so QP numbers are no oracle, and a half-open end has no handle on the other QP.
        s.peer_num = Some(remote);
        q.set_state(QpState::Rtr);
        let r = if qp == remote {
            Some(q.clone())
        } else {
            t.qps
                .get(&remote)
                .cloned()
                .filter(|r| lock(&r.send).peer_num == Some(qp) && r.state() == QpState::Rtr)
        };
        let Some(r) = r else { return Ok(()) };
        // Both ends named each other: the connection is real from here on.
        s.peer = Some(Arc::downgrade(&r));
        drop(s);
        if qp != remote {
            lock(&r.send).peer = Some(Arc::downgrade(&q));
        }
        // RTS and QpEstablished under the tables' lock, which a Disconnect takes: it comes
        // before or after the whole (a QP already failed stays in Error, unannounced).
        for (a, b) in [(&q, &r), (&r, &q)] {
            if a.advance(QpState::Rts) {
                a.ch.event(EventKind::QpEstablished, a.num.0, u64::from(b.num.0));
            }
            a.ch.engine.wake();
            if qp == remote {
                break;
            }
        }
        drop(t);
        Ok(())
    }

    fn arm_cq(&self, ch: ChannelId, cq: CqId, solicited_only: bool) -> DeviceResult<()> {
        let mut t = self.tables();
        let e = entry(&mut t, ch)?;
        let (c, _) = e.cqs.get(&cq).ok_or(bad("CQ", cq.0))?;
        let Some(p) = &c.poller else {
            return Err(DeviceError::NotMediated);
        };
        let waiting = lock(p).arm(solicited_only);
        let c = c.clone();
        drop(t);
        if waiting {
            c.ch.notify();
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
        let mut t = self.tables();
        let e = entry(&mut t, ch)?;
        if e.ch.mode != ChannelMode::Mediated {
            return Err(DeviceError::NotMediated);
        }
        let &(sq, rq) = e.qps.get(&qp).ok_or(bad("QP", qp.0))?;
        let slot = match which {
            WorkQueue::Sq => sq,
            WorkQueue::Rq => rq,
        };
        let db = lock(&e.ch.doorbells)
            .queue(slot)
            .map_err(|e| inval(e.to_string()))?;
        db.prod.store(prod, Ordering::Release);
        let q = t.qps.get(&qp).cloned();
        drop(t);
        if let Some(q) = q {
            q.ch.engine.wake();
            if which == WorkQueue::Rq {
                let peer = lock(&q.send).peer.as_ref().and_then(|w| w.upgrade());
                if let Some(p) = peer {
                    p.ch.engine.wake();
                }
            }
        }
        Ok(())
    }

    fn poll_cq_mediated(&self, ch: ChannelId, cq: CqId) -> DeviceResult<Option<CqeRepr>> {
        let mut t = self.tables();
        let e = entry(&mut t, ch)?;
        if e.ch.mode != ChannelMode::Mediated {
            return Err(DeviceError::NotMediated);
        }
        let c = e.cqs.get(&cq).ok_or(bad("CQ", cq.0))?.0.clone();
        drop(t);
        Ok(c.poll_raw().and_then(|b| CqeRepr::from_bytes(&b).ok()))
    }

    fn stats(&self, ch: ChannelId) -> DeviceStats {
        self.tables()
            .channels
            .get(&ch)
            .map(|e| e.ch.stats.ch.snapshot())
            .unwrap_or_default()
    }

    fn domain_stats(&self, domid: DomId) -> DeviceStats {
        self.tables()
            .domains
            .get(&domid)
            .map(|c| c.snapshot())
            .unwrap_or_default()
    }

    fn qp_stats(&self, ch: ChannelId) -> Vec<QpStats> {
        let t = self.tables();
        let Some(e) = t.channels.get(&ch) else {
            return Vec::new();
        };
        let mut out: Vec<QpStats> = e
            .qps
            .keys()
            .filter_map(|n| t.qps.get(n))
            .map(|q| q.counters.snapshot(q.num, q.state()))
            .collect();
        out.sort_unstable_by_key(|s| s.qp.0);
        out
    }

    fn domain_qp_stats(&self, domid: DomId) -> Vec<QpStats> {
        let t = self.tables();
        let mut out: Vec<QpStats> = t
            .qps
            .values()
            .filter(|q| q.ch.domid == domid && !q.ch.closed.load(Ordering::Relaxed))
            .map(|q| q.counters.snapshot(q.num, q.state()))
            .collect();
        out.sort_unstable_by_key(|s| s.qp.0);
        out
    }

    fn local_addrs(&self) -> Vec<std::net::IpAddr> {
        self.cm_local_addrs()
    }

    fn cm_listen(
        &self,
        ch: ChannelId,
        addr: std::net::SocketAddr,
        backlog: u32,
    ) -> DeviceResult<ListenerId> {
        self.cm_listen_impl(ch, addr, backlog)
    }

    fn cm_listener_addr(&self, ch: ChannelId, l: ListenerId) -> DeviceResult<std::net::SocketAddr> {
        self.cm_listener_addr_impl(ch, l)
    }

    fn cm_close_listener(&self, ch: ChannelId, l: ListenerId) -> DeviceResult<()> {
        self.cm_close_listener_impl(ch, l)
    }

    fn cm_connect(
        &self,
        ch: ChannelId,
        qp: QpNum,
        peer: std::net::SocketAddr,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        self.cm_connect_impl(ch, qp, peer, private_data)
    }

    fn cm_accept(
        &self,
        ch: ChannelId,
        req: ConnRequestId,
        qp: QpNum,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        self.cm_accept_impl(ch, req, qp, private_data)
    }

    fn cm_reject(
        &self,
        ch: ChannelId,
        req: ConnRequestId,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        self.cm_reject_impl(ch, req, private_data)
    }

    fn cm_disconnect(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<()> {
        self.cm_disconnect_impl(ch, qp)
    }

    fn cm_request_info(&self, ch: ChannelId, req: ConnRequestId) -> DeviceResult<CmInfo> {
        self.cm_request_info_impl(ch, req)
    }

    fn cm_qp_info(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<CmInfo> {
        self.cm_qp_info_impl(ch, qp)
    }
}

impl SoftDevice {
    /// Runs QP `qp` of channel `ch` (Reset, Init or Rtr, not connected) over an established
    /// iWARP connection. The initiator (and a responder without RTR) goes to RTS and its
    /// channel gets `QpEstablished` now; a responder that negotiated an RTR waits in Rtr for
    /// the initiator's first FPDU, then does the same. Called by the connection manager when
    /// MPA negotiation ends (tests call it with a hand-made [`super::iwarp::Established`]);
    /// the QP keeps the stream until it is destroyed.
    pub fn attach_stream(
        &self,
        ch: ChannelId,
        qp: QpNum,
        est: super::iwarp::Established,
    ) -> DeviceResult<()> {
        self.inner.attach_stream(ch, qp, est)
    }
}

impl Inner {
    /// See [`SoftDevice::attach_stream`] (the connection manager's thread has an `Inner`).
    /// If it fails, the connection manager moves the QP to Error, sends `ConnectUnreachable`
    /// and drops `est` (closing the TCP connection).
    pub(crate) fn attach_stream(
        &self,
        ch: ChannelId,
        qp: QpNum,
        est: super::iwarp::Established,
    ) -> DeviceResult<()> {
        let mut t = lock(&self.tables);
        if !entry(&mut t, ch)?.qps.contains_key(&qp) {
            return Err(bad("QP", qp.0));
        }
        let q = t.qps.get(&qp).ok_or(bad("QP", qp.0))?.clone();
        if !matches!(q.state(), QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(DeviceError::ConnectionRefused(qp.0, "QP is not in Init"));
        }
        let mut s = lock(&q.send);
        if s.peer_num.is_some() || q.remote.get().is_some() {
            return Err(DeviceError::ConnectionRefused(
                qp.0,
                "QP is already connected",
            ));
        }
        let engine = &self.engines[q.ch.engine.idx];
        let (remote, ready) = super::iwarp::qp::attach(&q, est, &engine.registry)
            .map_err(|e| inval(format!("the connection's socket: {e}")))?;
        // Connected (to the stream): no `connect_qp`, no state changes but Error from here.
        s.peer_num = Some(qp);
        drop(s);
        let _ = q.remote.set(remote);
        drop(t);
        // From here the engine runs the stream (it finds `remote` on its next pass, woken by
        // the socket's events): a responder's engine may already have read the initiator's
        // RTR and moved the QP from Rtr to Rts (with `QpEstablished`), or any engine may have
        // failed it. The state only moves forward here: storing Rtr over that Rts left the QP
        // unable to send for good (its peer's traffic still flowed in).
        #[cfg(test)]
        AFTER_HANDOVER.with(|h| {
            if let Some(f) = h.borrow().as_ref() {
                f(&q);
            }
        });
        if ready {
            if q.advance(QpState::Rts) {
                q.ch.event(EventKind::QpEstablished, qp.0, 0);
            }
        } else {
            q.advance(QpState::Rtr);
        }
        q.ch.engine.changed();
        Ok(())
    }
}

/// A hook called by [`Inner::attach_stream`] on the calling thread; see [`AFTER_HANDOVER`].
#[cfg(test)]
pub(crate) type HandoverHook = Box<dyn Fn(&Qp)>;

#[cfg(test)]
thread_local! {
    /// Test support: runs in [`Inner::attach_stream`] between handing the stream to the engine
    /// and the QP's state step, so a test can let the engine act on the stream first.
    pub(crate) static AFTER_HANDOVER: std::cell::RefCell<Option<HandoverHook>> =
        const { std::cell::RefCell::new(None) };
}
