//! Test support: a frontend played on plain memory, to drive a [`Device`] in one process
//! (unit and integration tests, benchmarks). Not used by the daemon.
//!
//! Queues, CQs and doorbells are `SharedRegion::alloc` memory driven with shared-ring's
//! producer, CQ-poller and kick types, exactly as the frontend drives granted pages.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shared_ring::abi::cqe::{CqeRepr, CQE_LEN};
use shared_ring::abi::event::{EventRepr, EVENT_LEN};
use shared_ring::abi::wqe::field::OWNER;
use shared_ring::abi::wqe::{WqeData, WqeOpcode, WqeRepr, WQE_LEN};
use shared_ring::cq::CqPoller;
use shared_ring::doorbell::{DoorbellPage, EngineKick};
use shared_ring::event_ring::{self, EVENT_RING_LEN};
use shared_ring::queue::Consumer;
use shared_ring::{SharedRegion, WqProducer, PAGE_SIZE, PROTOCOL_VERSION};

use super::*;

/// How long a test waits for something that must happen before declaring a hang.
pub const HANG: Duration = Duration::from_secs(20);

/// A channel seen from the frontend.
pub struct TestChannel {
    pub id: ChannelId,
    pub doorbell: SharedRegion,
    pub db: DoorbellPage,
    pub events: Consumer<EVENT_LEN>,
    pub event_page: SharedRegion,
    /// Times the device notified the channel.
    pub notified: Arc<AtomicU64>,
    pub pd: PdId,
    pub mode: ChannelMode,
    next_slot: u32,
    next_iova: u64,
}

/// A registered region with its memory.
pub struct TestMr {
    /// The pages; the region starts `base` bytes in.
    pub mem: SharedRegion,
    pub base: usize,
    pub keys: MrKeys,
    pub iova: u64,
    pub len: u64,
}

impl TestMr {
    /// An SGE over `[offset, offset + len)` of the region.
    pub fn sge(&self, offset: u64, len: u32) -> shared_ring::abi::wqe::Sge {
        shared_ring::abi::wqe::Sge {
            offset,
            length: len,
            lkey: self.keys.lkey,
        }
    }
    pub fn fill(&self, offset: usize, data: &[u8]) {
        self.mem
            .write_bytes(self.base + offset, data)
            .expect("fill in bounds");
    }
    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem
            .read_bytes(self.base + offset, &mut v)
            .expect("read in bounds");
        v
    }
}

/// A CQ seen from the frontend.
pub struct TestCq {
    pub id: CqId,
    pub ring: SharedRegion,
    pub poller: CqPoller,
    pub ch: ChannelId,
    pub mediated: bool,
}

impl TestCq {
    /// The next completion, if any.
    pub fn poll(&mut self, dev: &dyn Device) -> Option<CqeRepr> {
        if self.mediated {
            dev.poll_cq_mediated(self.ch, self.id)
                .expect("mediated poll")
        } else {
            self.poller.poll().expect("CQE parses")
        }
    }
    /// Waits for the next completion (panics after [`HANG`]: a hang, not a timing check).
    pub fn wait(&mut self, dev: &dyn Device) -> CqeRepr {
        let start = Instant::now();
        loop {
            if let Some(c) = self.poll(dev) {
                return c;
            }
            assert!(start.elapsed() < HANG, "no completion on CQ {:?}", self.id);
            std::thread::yield_now();
        }
    }
}

/// A QP seen from the frontend.
pub struct TestQp {
    pub num: QpNum,
    pub ch: ChannelId,
    pub sq: WqProducer,
    pub rq: WqProducer,
    pub sq_mem: SharedRegion,
    pub rq_mem: SharedRegion,
    pub kick: EngineKick,
    pub mediated: bool,
}

impl TestQp {
    fn publish(&mut self, dev: &dyn Device, which: WorkQueue) {
        let q = match which {
            WorkQueue::Sq => &mut self.sq,
            WorkQueue::Rq => &mut self.rq,
        };
        if self.mediated {
            q.publish();
            dev.post_mediated(self.ch, self.num, which, q.prod_pvt())
                .expect("mediated post");
        } else if q.publish_and_check_kick(&mut self.kick) {
            dev.kick(self.ch);
        }
    }
    /// Posts raw WQE bytes to the SQ (and publishes).
    pub fn post_send_raw(&mut self, dev: &dyn Device, wqe: &[u8; WQE_LEN]) {
        self.sq.write(wqe).expect("SQ not full");
        self.publish(dev, WorkQueue::Sq);
    }
    pub fn post_send(&mut self, dev: &dyn Device, wqe: &WqeRepr) {
        self.post_send_raw(dev, &wqe.to_bytes());
    }
    pub fn post_recv(&mut self, dev: &dyn Device, wr_id: u64, sges: &[shared_ring::abi::wqe::Sge]) {
        let w = WqeRepr {
            opcode: WqeOpcode::Recv,
            flags: 0,
            wr_id,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            data: WqeData::sges(sges).expect("at most 2 SGEs"),
        };
        self.rq.write(&w.to_bytes()).expect("RQ not full");
        self.publish(dev, WorkQueue::Rq);
    }
}

impl TestChannel {
    /// Opens a channel of domain `domid` on plain memory.
    pub fn open(dev: &dyn Device, domid: u16, mode: ChannelMode) -> Self {
        Self::open_with_kick_source(dev, domid, mode, None)
    }

    /// [`TestChannel::open`] with a [`ChannelSetup::kick_source`] (the test's stand-in for the
    /// guest's event channel).
    pub fn open_with_kick_source(
        dev: &dyn Device,
        domid: u16,
        mode: ChannelMode,
        kick_source: Option<Arc<dyn super::KickSource>>,
    ) -> Self {
        let doorbell = SharedRegion::alloc(PAGE_SIZE).expect("memory");
        let event_page = SharedRegion::alloc(EVENT_RING_LEN).expect("memory");
        let notified = Arc::new(AtomicU64::new(0));
        let n = notified.clone();
        let id = dev
            .open_channel(ChannelSetup {
                domid: DomId(domid),
                doorbell: doorbell.clone(),
                event_ring: event_page.clone(),
                notifier: Arc::new(move || {
                    n.fetch_add(1, Ordering::SeqCst);
                }),
                mode,
                kick_source,
            })
            .expect("open channel");
        let db = DoorbellPage::open(doorbell.clone(), PROTOCOL_VERSION).expect("doorbell header");
        let events = event_ring::consumer(&event_page).expect("event ring");
        let pd = dev.alloc_pd(id).expect("PD");
        Self {
            id,
            doorbell,
            db,
            events,
            event_page,
            notified,
            pd,
            mode,
            next_slot: 0,
            next_iova: 0x1000_0000,
        }
    }

    fn slot(&mut self) -> u32 {
        self.next_slot += 1;
        self.next_slot - 1
    }

    /// Registers `len` bytes (in fresh pages, starting `first_page_offset` into the first).
    pub fn mr_at(
        &mut self,
        dev: &dyn Device,
        len: u64,
        access: u32,
        first_page_offset: u32,
    ) -> TestMr {
        let bytes = (first_page_offset as u64 + len)
            .div_ceil(PAGE_SIZE as u64)
            .max(1)
            * PAGE_SIZE as u64;
        let mem = SharedRegion::alloc(bytes as usize).expect("memory");
        let iova = self.next_iova + u64::from(first_page_offset);
        self.next_iova += bytes + PAGE_SIZE as u64;
        let keys = dev
            .reg_mr(
                self.id,
                MrSetup {
                    pd: self.pd,
                    pages: mem.clone(),
                    writable: true,
                    first_page_offset,
                    length: len,
                    iova,
                    access,
                },
            )
            .expect("reg_mr");
        TestMr {
            mem,
            base: first_page_offset as usize,
            keys,
            iova,
            len,
        }
    }

    pub fn mr(&mut self, dev: &dyn Device, len: u64, access: u32) -> TestMr {
        self.mr_at(dev, len, access, 0)
    }

    pub fn cq(&mut self, dev: &dyn Device, log2: u8) -> TestCq {
        let ring =
            SharedRegion::alloc(((1usize << log2) * CQE_LEN).max(PAGE_SIZE)).expect("memory");
        let slot = self.slot();
        let id = dev
            .create_cq(
                self.id,
                CqSetup {
                    ring: ring.clone(),
                    cqe_log2: log2,
                    doorbell_slot: slot,
                },
            )
            .expect("create_cq");
        let poller = CqPoller::new(
            ring.slots(0, 1 << log2).expect("slots"),
            self.db.cq(slot).expect("slot"),
        );
        TestCq {
            id,
            ring,
            poller,
            ch: self.id,
            mediated: self.mode == ChannelMode::Mediated,
        }
    }

    pub fn qp(&mut self, dev: &dyn Device, send_cq: &TestCq, recv_cq: &TestCq, log2: u8) -> TestQp {
        let n = 1usize << log2;
        let sq_mem = SharedRegion::alloc((n * WQE_LEN).max(PAGE_SIZE)).expect("memory");
        let rq_mem = SharedRegion::alloc((n * WQE_LEN).max(PAGE_SIZE)).expect("memory");
        let (sq_slot, rq_slot) = (self.slot(), self.slot());
        let num = dev
            .create_qp(
                self.id,
                QpSetup {
                    pd: self.pd,
                    send_cq: send_cq.id,
                    recv_cq: recv_cq.id,
                    sq: sq_mem.clone(),
                    rq: rq_mem.clone(),
                    sq_log2: log2,
                    rq_log2: log2,
                    sq_slot,
                    rq_slot,
                    sq_sig_all: false,
                },
            )
            .expect("create_qp");
        let q = |slot| self.db.queue(slot).expect("slot");
        let (sqd, rqd) = (q(sq_slot), q(rq_slot));
        TestQp {
            num,
            ch: self.id,
            sq: WqProducer::with_owner(
                sq_mem.slots(0, n).expect("slots"),
                sqd.prod,
                sqd.cons,
                0,
                OWNER,
            ),
            rq: WqProducer::with_owner(
                rq_mem.slots(0, n).expect("slots"),
                rqd.prod,
                rqd.cons,
                0,
                OWNER,
            ),
            sq_mem,
            rq_mem,
            kick: self.db.engine_kick().expect("kick word"),
            mediated: self.mode == ChannelMode::Mediated,
        }
    }

    /// Events written so far (consumed).
    pub fn take_events(&mut self) -> Vec<EventRepr> {
        let mut v = Vec::new();
        while let Ok(Some(b)) = self.events.pop() {
            v.push(EventRepr::from_bytes(&b).expect("event parses"));
        }
        self.events.release();
        v
    }
}

/// Connects two QPs (both ends) and waits for nothing: connection is synchronous here.
pub fn connect(dev: &dyn Device, a: &TestQp, b: &TestQp) {
    dev.connect_qp(a.ch, a.num, b.num).expect("connect a");
    if a.num != b.num {
        dev.connect_qp(b.ch, b.num, a.num).expect("connect b");
    }
}

/// Two channels of two domains, a CQ (256 CQEs) and a QP (64 WQEs each way) on each,
/// the QPs connected to each other.
pub struct TestPair {
    pub a: TestChannel,
    pub b: TestChannel,
    pub acq: TestCq,
    pub bcq: TestCq,
    pub aqp: TestQp,
    pub bqp: TestQp,
}

impl TestPair {
    pub fn connected(dev: &dyn Device, doms: (u16, u16), mode: ChannelMode) -> TestPair {
        let mut a = TestChannel::open(dev, doms.0, mode);
        let mut b = TestChannel::open(dev, doms.1, mode);
        let acq = a.cq(dev, 8);
        let bcq = b.cq(dev, 8);
        let aqp = a.qp(dev, &acq, &acq, 6);
        let bqp = b.qp(dev, &bcq, &bcq, 6);
        connect(dev, &aqp, &bqp);
        TestPair {
            a,
            b,
            acq,
            bcq,
            aqp,
            bqp,
        }
    }
}

/// A WQE with SGEs.
pub fn wqe(
    opcode: WqeOpcode,
    wr_id: u64,
    sges: &[shared_ring::abi::wqe::Sge],
    remote: (u64, u32),
    imm: u32,
) -> WqeRepr {
    WqeRepr {
        opcode,
        flags: shared_ring::abi::wqe::flags::SIGNALED,
        wr_id,
        imm_data: imm,
        remote_addr: remote.0,
        rkey: remote.1,
        data: WqeData::sges(sges).expect("at most 2 SGEs"),
    }
}

/// The benchmarks' loopback: a [`SoftDevice`] with one engine thread that never sleeps, one
/// bypass channel, a CQ of 1024 entries, a QP of 256 send slots connected to itself, and two
/// `mr_len`-byte MRs to WRITE from and to.
pub struct Loopback {
    /// The device (its engine spins for an hour before it sleeps).
    pub dev: SoftDevice,
    /// The channel the objects belong to.
    pub ch: TestChannel,
    /// Send and receive CQ of `qp`.
    pub cq: TestCq,
    /// The QP, connected to itself.
    pub qp: TestQp,
    /// The WRITEs' source.
    pub src: TestMr,
    /// The WRITEs' destination.
    pub dst: TestMr,
}

impl Loopback {
    /// Builds it (panics on failure: test support).
    pub fn new(mr_len: u64) -> Loopback {
        Self::with_spin(mr_len, Duration::from_secs(3600))
    }

    /// The same with an engine that spins for `spin` before it sleeps (`ZERO`: it sleeps as
    /// soon as a pass finds nothing to do, so an idle engine runs no instructions).
    pub fn with_spin(mr_len: u64, spin: Duration) -> Loopback {
        let dev = SoftDevice::new(EngineConfig { threads: 1, spin }).expect("software device");
        let mut ch = TestChannel::open(&dev, 1, ChannelMode::Bypass);
        let cq = ch.cq(&dev, 10);
        let qp = ch.qp(&dev, &cq, &cq, 8);
        dev.connect_qp(ch.id, qp.num, qp.num)
            .expect("connect the QP to itself");
        let src = ch.mr(&dev, mr_len, access::ALL);
        let dst = ch.mr(&dev, mr_len, access::ALL);
        Loopback {
            dev,
            ch,
            cq,
            qp,
            src,
            dst,
        }
    }

    /// A signaled RDMA WRITE of the first `len` bytes of `src` to the start of `dst`.
    pub fn write_wqe(&self, len: u32) -> [u8; WQE_LEN] {
        self.write_repr(len).to_bytes()
    }

    /// [`Self::write_wqe`] as the slot's sixteen words, built straight from the fields with
    /// `shared_ring::abi::wqe`'s builder (no `WqeRepr`), as the `vrdma` library builds the
    /// WQE of each post before `Producer::write_words` stores it: the benches call this per
    /// post.
    #[inline]
    pub fn write_wqe_words(&self, len: u32) -> [u32; WQE_LEN / 4] {
        let mut w = shared_ring::abi::wqe::WqeHead {
            opcode: WqeOpcode::RdmaWrite,
            flags: shared_ring::abi::wqe::flags::SIGNALED,
            wr_id: 1,
            imm_data: 0,
            remote_addr: self.dst.iova,
            rkey: self.dst.keys.rkey,
        }
        .words(1, 0);
        shared_ring::abi::wqe::put_sge(&mut w, 0, &self.src.sge(0, len));
        w
    }

    fn write_repr(&self, len: u32) -> WqeRepr {
        wqe(
            WqeOpcode::RdmaWrite,
            1,
            &[self.src.sge(0, len)],
            (self.dst.iova, self.dst.keys.rkey),
            0,
        )
    }
}
