//! `dev_pair`'s set-up for `examples/lib_costs.rs` — one bypass channel of a `SoftDevice`, two
//! CQs (64 CQEs), two QPs (16 WQEs each way) connected to each other, two 4 KiB regions — on
//! a simulated host's grant pages instead of heap memory, to see what the pages the library
//! runs on cost by themselves. Every page is granted by dom0 and mapped by the guest, as the
//! daemon does for doorbells, queues and CQs (a memfd, `MAP_SHARED`). The device (dom0) is
//! handed dom0's mapping; the frontend's end drives either the guest's mapping of the same
//! pages ([`Views::Two`], as the library does: two virtual addresses for one physical page)
//! or dom0's mapping too ([`Views::One`]). The CQ rings are granted with `cq_access`: the daemon
//! grants them read-only, and a read-only mapping of a polled line costs time on the machine
//! measured (docs/benchmarks.md, "Seventh round, the library").

use std::sync::Arc;

use shared_ring::abi::control::access;
use shared_ring::abi::wqe::field::OWNER;
use shared_ring::abi::wqe::{Sge, WqeOpcode, WQE_LEN};
use shared_ring::cq::CqPoller;
use shared_ring::doorbell::DoorbellPage;
use shared_ring::event_ring::EVENT_RING_LEN;
use shared_ring::{SharedRegion, WqProducer, PAGE_SIZE, PROTOCOL_VERSION};
use vrdma_backend::device::testkit::{self, TestCq, TestQp};
use vrdma_backend::device::{
    ChannelMode, ChannelSetup, CqSetup, Device, EngineConfig, MrSetup, QpSetup, SoftDevice,
};
use xen_platform::sim::SimHost;
use xen_platform::{Access, DomId, Platform, PlatformKind};

/// Which mapping the frontend's end uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Views {
    /// The guest's own mapping (another virtual address than the device's).
    Two,
    /// The device's (dom0's) mapping: one virtual address for both ends.
    One,
}

/// The pair; `q1`'s WRITE (`wqe`) completes on `cq1`.
pub struct SimMemPair {
    pub dev: SoftDevice,
    pub q1: TestQp,
    pub cq1: TestCq,
    pub wqe: [u8; WQE_LEN],
    _q2: TestQp,
    _cq2: TestCq,
    _keep: Vec<SharedRegion>,
}

impl SimMemPair {
    /// Builds the pair for guest domain `guest` of `host`.
    pub fn start(host: &SimHost, guest: DomId, views: Views, cq_access: Access) -> SimMemPair {
        let open = |d: DomId| {
            Platform::open(PlatformKind::Sim {
                dir: host.dir().to_path_buf(),
                domid: d,
            })
            .unwrap()
        };
        let (p0, pg) = (open(DomId::DOM0), open(guest));
        let mut keep = Vec::new();
        // `n` pages granted by dom0 to the guest: (the device's view, the frontend's view).
        let mut pages_as = |n: usize, acc: Access| {
            let shared = p0.share_pages(guest, n, acc).unwrap();
            let refs = shared.grant_refs().to_vec();
            let back = shared.into_region().unwrap();
            let front = match views {
                Views::Two => pg
                    .map_grants(DomId::DOM0, &refs, acc)
                    .unwrap()
                    .into_region()
                    .unwrap(),
                Views::One => back.clone(),
            };
            keep.push(back.clone());
            keep.push(front.clone());
            (back, front)
        };
        // The CQ rings (read-only in the guest, as the daemon grants them; or read-write).
        let (cq_a, cq_b) = (pages_as(1, cq_access), pages_as(1, cq_access));
        let mut cq_rings = vec![cq_b, cq_a];
        let mut pages = |n: usize| pages_as(n, Access::ReadWrite);
        let dev = SoftDevice::new(EngineConfig::default()).unwrap();
        let (db_back, db_front) = pages(1);
        let (ev_back, _) = pages(EVENT_RING_LEN / PAGE_SIZE);
        let ch = dev
            .open_channel(ChannelSetup {
                domid: guest,
                doorbell: db_back,
                event_ring: ev_back,
                notifier: Arc::new(|| {}),
                mode: ChannelMode::Bypass,
                kick_source: None,
            })
            .unwrap();
        let db = DoorbellPage::open(db_front, PROTOCOL_VERSION).unwrap();
        let pd = dev.alloc_pd(ch).unwrap();
        let slot = std::cell::Cell::new(0);
        let next_slot = || slot.replace(slot.get() + 1);
        let mut cq = || {
            let (back, front) = cq_rings.pop().unwrap();
            let s = next_slot();
            let id = dev
                .create_cq(
                    ch,
                    CqSetup {
                        ring: back,
                        cqe_log2: 6,
                        doorbell_slot: s,
                    },
                )
                .unwrap();
            let poller = CqPoller::new(front.slots(0, 64).unwrap(), db.cq(s).unwrap());
            (id, front, poller)
        };
        let (c1, r1, p1) = cq();
        let (c2, r2, p2) = cq();
        let qp = |cq, pages: &mut dyn FnMut(usize) -> (SharedRegion, SharedRegion)| {
            let ((sq_back, sq_front), (rq_back, rq_front)) = (pages(1), pages(1));
            let (sq_slot, rq_slot) = (next_slot(), next_slot());
            let num = dev
                .create_qp(
                    ch,
                    QpSetup {
                        pd,
                        send_cq: cq,
                        recv_cq: cq,
                        sq: sq_back,
                        rq: rq_back,
                        sq_log2: 4,
                        rq_log2: 4,
                        sq_slot,
                        rq_slot,
                        sq_sig_all: false,
                    },
                )
                .unwrap();
            let producer = |mem: &SharedRegion, s| {
                let d = db.queue(s).unwrap();
                WqProducer::with_owner(mem.slots(0, 16).unwrap(), d.prod, d.cons, 0, OWNER)
            };
            TestQp {
                num,
                ch,
                sq: producer(&sq_front, sq_slot),
                rq: producer(&rq_front, rq_slot),
                sq_mem: sq_front,
                rq_mem: rq_front,
                kick: db.engine_kick().unwrap(),
                mediated: false,
            }
        };
        let q1 = qp(c1, &mut pages);
        let q2 = qp(c2, &mut pages);
        testkit::connect(&dev, &q1, &q2);
        let mut mr = |iova: u64| {
            let (back, _) = pages(1);
            dev.reg_mr(
                ch,
                MrSetup {
                    pd,
                    pages: back,
                    writable: true,
                    first_page_offset: 0,
                    length: PAGE_SIZE as u64,
                    iova,
                    access: access::ALL,
                },
            )
            .unwrap()
        };
        let (src, dst) = (mr(0x1000_0000), mr(0x2000_0000));
        let wqe = testkit::wqe(
            WqeOpcode::RdmaWrite,
            1,
            &[Sge {
                offset: 0,
                length: 64,
                lkey: src.lkey,
            }],
            (0x2000_0000, dst.rkey),
            0,
        )
        .to_bytes();
        let tcq = |id, ring, poller| TestCq {
            id,
            ring,
            poller,
            ch,
            mediated: false,
        };
        SimMemPair {
            cq1: tcq(c1, r1, p1),
            _cq2: tcq(c2, r2, p2),
            q1,
            _q2: q2,
            wqe,
            dev,
            _keep: keep,
        }
    }
}
