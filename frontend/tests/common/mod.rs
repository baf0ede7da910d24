//! A simulated host in this process (grants and event channels from `SimHost`, XenStore from
//! the embedded server), a toolstack attach, and a scripted fake backend speaking the channel
//! contract of `docs/split-driver.md`: enough to test the frontend alone.

#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shared_ring::abi::control::{Op, Reply, Request, RequestRepr, ResponseRepr, Status};
use shared_ring::abi::cqe::CQE_LEN;
use shared_ring::abi::page_dir::PageList;
use shared_ring::abi::wqe::WQE_LEN;
use shared_ring::cq::CqWriter;
use shared_ring::doorbell::DoorbellPage;
use shared_ring::{ControlBackRing, SharedRegion, WqConsumer, PAGE_SIZE};
use xen_platform::sim::{SimHost, SimHostConfig};
use xen_platform::{Access, DomId, EventChannel, Platform, PlatformKind};
use xenstore_proto::client::{Client, NodeOps, XenbusStore};
use xenstore_proto::server::Server;
use xenstore_proto::wire::{Perm, PermKind, Perms};

/// Where the backend's alive byte is in the control-ring page (docs/split-driver.md).
pub const BACKEND_ALIVE_OFFSET: usize = 20;

pub struct World {
    pub host: SimHost,
    pub xs: Server,
    pub guest: DomId,
    pub dom0: Platform,
    pub dom0_store: Client,
    pub _tmp: tempfile::TempDir,
}

impl World {
    pub fn new() -> World {
        let tmp = tempfile::Builder::new().prefix("vf").tempdir().unwrap();
        let host = SimHost::start(SimHostConfig::new(tmp.path().join("h"))).unwrap();
        let guest = host.create_domain(Some("guest"), None).unwrap();
        let xs = host.xenstore_server().clone();
        let dom0 = Platform::open(PlatformKind::Sim {
            dir: host.dir().to_path_buf(),
            domid: DomId(0),
        })
        .unwrap();
        let dom0_store = Client::from_unix_stream(xs.connect(0).unwrap()).unwrap();
        World {
            host,
            xs,
            guest,
            dom0,
            dom0_store,
            _tmp: tmp,
        }
    }

    pub fn guest_platform(&self) -> Platform {
        Platform::open(PlatformKind::Sim {
            dir: self.host.dir().to_path_buf(),
            domid: self.guest,
        })
        .unwrap()
    }

    pub fn guest_store(&self) -> Arc<dyn XenbusStore> {
        Arc::new(self.guest_platform().xenstore().unwrap())
    }

    pub fn front_dir(&self) -> String {
        format!("/local/domain/{}/device/vrdma/0", self.guest.0)
    }
    pub fn back_dir(&self) -> String {
        format!("/local/domain/0/backend/vrdma/{}/0", self.guest.0)
    }

    /// Writes the device nodes as the toolstack does (one transaction).
    pub fn attach(&self) {
        let d = self.guest.0 as u32;
        let (front, back) = (self.front_dir(), self.back_dir());
        self.dom0_store
            .transaction(|tx| {
                tx.write(&back, "")?;
                tx.set_perms(
                    &back,
                    &Perms(vec![
                        Perm::new(PermKind::None, 0),
                        Perm::new(PermKind::Read, d),
                    ]),
                )?;
                tx.write(&format!("{back}/frontend"), &front)?;
                tx.write(&format!("{back}/frontend-id"), d.to_string())?;
                tx.write(&format!("{back}/online"), "1")?;
                tx.write(&format!("{back}/state"), "1")?;
                tx.write(&front, "")?;
                tx.set_perms(
                    &front,
                    &Perms(vec![
                        Perm::new(PermKind::None, d),
                        Perm::new(PermKind::Read, 0),
                    ]),
                )?;
                tx.write(&format!("{front}/backend"), &back)?;
                tx.write(&format!("{front}/backend-id"), "0")?;
                tx.write(&format!("{front}/state"), "1")?;
                Ok(())
            })
            .unwrap();
    }
}

/// A CQ the fake backend made.
pub struct FakeCq {
    pub writer: CqWriter,
    pub slot: u32,
}

/// A QP the fake backend made.
pub struct FakeQp {
    pub qp_num: u32,
    pub sq: WqConsumer,
    pub rq: WqConsumer,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub posted_send: Vec<u32>,
    pub connected_to: Option<(u32, [u8; 16])>,
}

/// What the fake backend holds for one channel; tests inspect and drive it.
#[derive(Default)]
pub struct BackState {
    pub doorbell: Option<DoorbellPage>,
    pub doorbell_gref: u32,
    /// The event ring's producer side (after `Init`).
    pub events: Option<shared_ring::queue::Producer<{ shared_ring::abi::event::EVENT_LEN }>>,
    pub cqs: HashMap<u32, FakeCq>,
    pub qps: HashMap<u32, FakeQp>,
    pub mrs: HashMap<u32, (u32, u64)>,
    pub pds: HashSet<u32>,
    pub next_handle: u32,
    pub next_slot: u32,
    pub ops: Vec<Op>,
    /// Statuses to answer instead of serving, per op (one each).
    pub fail_next: HashMap<Op, Status>,
    pub quota_qps: Option<usize>,
    /// The GID table `QueryGid` answers (`None`: `NotSupported`, as the software device).
    pub gids: Option<Vec<([u8; 16], u32)>>,
    pub closed: bool,
    /// Mediated `PostSend` runs the toy engine.
    pub mediated_engine: bool,
    pub evtchn: Option<Arc<EventChannel>>,
    /// Mediated mode: CQEs waiting for `PollCq`, per CQ.
    pub mediated_cqes: HashMap<u32, std::collections::VecDeque<[u8; 32]>>,
    keep: Vec<SharedRegion>,
}

impl BackState {
    /// A toy engine step: every published SEND-queue WQE completes at once, successfully,
    /// as a CQE on the QP's send CQ (bypass) or in the mediated queue. Returns how many.
    pub fn run_engine(&mut self, mediated: bool) -> usize {
        let mut n = 0;
        let mut done = Vec::new();
        for q in self.qps.values_mut() {
            while let Ok(Some(raw)) = q.sq.pop() {
                let wr_id = u64::from_le_bytes(raw[8..16].try_into().unwrap());
                done.push((q.send_cq, q.qp_num, wr_id));
            }
            q.sq.release();
        }
        for (cq, qp_num, wr_id) in done {
            let cqe = shared_ring::abi::cqe::CqeRepr {
                wr_id,
                status: shared_ring::abi::cqe::CqeStatus::Success,
                opcode: shared_ring::abi::cqe::CqeOpcode::Send,
                byte_len: 0,
                imm_data: 0,
                qp_num,
                vendor_err: 0,
                flags: 0,
            };
            if mediated {
                self.mediated_cqes
                    .entry(cq)
                    .or_default()
                    .push_back(cqe.to_bytes());
            } else if let Some(c) = self.cqs.get_mut(&cq) {
                c.writer.write_repr(&cqe).unwrap();
            }
            n += 1;
        }
        n
    }
}

impl BackState {
    fn handle(&mut self) -> u32 {
        self.next_handle += 1;
        self.next_handle
    }
    fn slot(&mut self) -> u32 {
        let s = self.next_slot;
        self.next_slot += 1;
        s
    }
    /// Notifies the frontend (armed CQ, async event).
    pub fn notify(&self) {
        if let Some(e) = &self.evtchn {
            e.notify().unwrap();
        }
    }
}

pub struct FakeBackend {
    pub state: Arc<Mutex<BackState>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for FakeBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl FakeBackend {
    /// Starts serving the world's device: InitWait, then one channel (the first to appear).
    pub fn start(w: &World) -> FakeBackend {
        let store = Client::from_unix_stream(w.xs.connect(0).unwrap()).unwrap();
        let back = w.back_dir();
        store.write(&format!("{back}/versions"), "2").unwrap();
        store.write(&format!("{back}/kind"), "fake").unwrap();
        store.write(&format!("{back}/max-inline"), "32").unwrap();
        store.write(&format!("{back}/state"), "2").unwrap();
        let state = Arc::new(Mutex::new(BackState::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, st2) = (state.clone(), stop.clone());
        let platform = w.dom0.clone();
        let guest = w.guest;
        let front = w.front_dir();
        let thread = std::thread::spawn(move || {
            serve(store, platform, guest, front, back, s2, st2);
        });
        FakeBackend {
            state,
            stop,
            thread: Some(thread),
        }
    }
}

fn serve(
    store: Client,
    platform: Platform,
    guest: DomId,
    front: String,
    back: String,
    state: Arc<Mutex<BackState>>,
    stop: Arc<AtomicBool>,
) {
    // Wait for a channel to be Initialised (the first one seen, whatever its index).
    let (fchan, bchan) = loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let names = store
            .directory(&format!("{front}/channel"))
            .unwrap_or_default();
        let ready = names.into_iter().find(|n| {
            store
                .read_opt(&format!("{front}/channel/{n}/state"))
                .unwrap()
                .as_deref()
                == Some(b"3")
        });
        if let Some(n) = ready {
            break (
                format!("{front}/channel/{n}"),
                format!("{back}/channel/{n}"),
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let nonce = store.read_opt(&format!("{fchan}/nonce")).unwrap();
    let ring_ref = store.read_u32(&format!("{fchan}/ring-ref")).unwrap();
    let port = store.read_u32(&format!("{fchan}/event-channel")).unwrap();
    let evtchn = Arc::new(
        platform
            .bind_interdomain(guest, xen_platform::EvtchnPort(port))
            .unwrap(),
    );
    let mapping = platform
        .map_grants(
            guest,
            &[xen_platform::GrantRef(ring_ref)],
            Access::ReadWrite,
        )
        .unwrap();
    // As the real backend: an alive byte the platform clears (and an event) when we unmap.
    mapping
        .set_unmap_notify(xen_platform::UnmapNotify {
            clear_byte: Some(BACKEND_ALIVE_OFFSET),
            event: Some(evtchn.local_port()),
        })
        .unwrap();
    let ring = mapping.into_region().unwrap();
    ring.store_u32(BACKEND_ALIVE_OFFSET, 1, Ordering::Release)
        .unwrap();
    state.lock().unwrap().evtchn = Some(evtchn.clone());
    let mut ring = ControlBackRing::new(ring).unwrap();
    store
        .transaction(|t| {
            if let Some(n) = &nonce {
                t.write(&format!("{bchan}/nonce"), n)?;
            }
            t.write(&format!("{bchan}/state"), "4")
        })
        .unwrap();
    while !stop.load(Ordering::Relaxed) {
        let mut notify = false;
        while let Some(raw) = ring.next_request().unwrap() {
            let req = RequestRepr::parse(&raw).unwrap();
            let rsp = answer(&platform, guest, &state, &req);
            ring.write_response(&rsp.to_bytes()).unwrap();
            notify |= ring.push_responses_and_check_notify();
        }
        if notify {
            evtchn.notify().unwrap();
        }
        let fstate = store.read_opt(&format!("{fchan}/state")).unwrap();
        if matches!(fstate.as_deref(), Some(b"5") | Some(b"6") | None) {
            store.write(&format!("{bchan}/state"), "5").unwrap();
            state.lock().unwrap().closed = true;
            store.write(&format!("{bchan}/state"), "6").unwrap();
            return;
        }
        if !ring.final_check_for_requests().unwrap() {
            let _ = evtchn.wait_timeout(Some(Duration::from_millis(5)));
        }
    }
}

fn share(platform: &Platform, guest: DomId, n: usize, access: Access) -> (SharedRegion, Vec<u32>) {
    let p = platform.share_pages(guest, n, access).unwrap();
    let grefs = p.grant_refs().iter().map(|g| g.0).collect();
    (p.into_region().unwrap(), grefs)
}

fn answer(
    platform: &Platform,
    guest: DomId,
    state: &Mutex<BackState>,
    req: &RequestRepr,
) -> ResponseRepr {
    let mut st = state.lock().unwrap();
    let op = req.request.op();
    st.ops.push(op);
    let ok = |reply| ResponseRepr {
        req_id: req.req_id,
        op,
        status: Status::Ok,
        reply,
    };
    if let Some(s) = st.fail_next.remove(&op) {
        return ResponseRepr::error(req.req_id, op, s);
    }
    match req.request {
        Request::Init { .. } => {
            let (db, dbg) = share(platform, guest, 1, Access::ReadWrite);
            let (ev, evg) = share(platform, guest, 1, Access::ReadWrite);
            let page = DoorbellPage::init(db.clone(), shared_ring::PROTOCOL_VERSION).unwrap();
            let slots = page.slots();
            st.doorbell = Some(page);
            st.doorbell_gref = dbg[0];
            st.events = Some(shared_ring::event_ring::producer(&ev).unwrap());
            st.keep.push(db);
            st.keep.push(ev);
            ok(Reply::Init {
                version: 2,
                doorbell_gref: dbg[0],
                event_gref: evg[0],
                doorbell_slots: slots,
            })
        }
        Request::AllocPd => {
            let h = st.handle();
            st.pds.insert(h);
            ok(Reply::Handle(h))
        }
        Request::DeallocPd { pd } => {
            st.pds.remove(&pd);
            ok(Reply::Empty)
        }
        Request::RegMr { length, iova, .. } => {
            let h = st.handle();
            st.mrs.insert(h, (length as u32, iova));
            ok(Reply::Mr {
                mr: h,
                lkey: h | 0x100,
                rkey: h | 0x200,
            })
        }
        Request::DeregMr { mr } => {
            st.mrs.remove(&mr);
            ok(Reply::Empty)
        }
        Request::CreateCq { cqe_log2 } => {
            let n = 1usize << cqe_log2;
            let pages = (n * CQE_LEN).div_ceil(PAGE_SIZE);
            let (r, grefs) = share(platform, guest, pages, Access::ReadOnly);
            let h = st.handle();
            let slot = st.slot();
            let db = st.doorbell.as_ref().unwrap().cq(slot).unwrap();
            let writer = CqWriter::new(r.slots(0, n).unwrap(), db);
            st.keep.push(r);
            st.cqs.insert(h, FakeCq { writer, slot });
            ok(Reply::Cq {
                cq: h,
                doorbell_slot: slot,
                cqe_log2,
                pages: PageList::inline(&grefs).unwrap(),
                doorbell_gref: st.doorbell_gref,
            })
        }
        Request::DestroyCq { cq } => {
            st.cqs.remove(&cq);
            ok(Reply::Empty)
        }
        Request::CreateQp {
            send_cq,
            recv_cq,
            sq_log2,
            rq_log2,
            ..
        } => {
            if st.quota_qps.is_some_and(|q| st.qps.len() >= q) {
                return ResponseRepr::error(req.req_id, op, Status::QuotaExceeded);
            }
            let sq_pages = (WQE_LEN << sq_log2).div_ceil(PAGE_SIZE);
            let rq_pages = (WQE_LEN << rq_log2).div_ceil(PAGE_SIZE);
            let (r, grefs) = share(platform, guest, sq_pages + rq_pages, Access::ReadWrite);
            let h = st.handle();
            let (ss, rs) = (st.slot(), st.slot());
            let db = st.doorbell.clone().unwrap();
            let (sqd, rqd) = (db.queue(ss).unwrap(), db.queue(rs).unwrap());
            // Follows the producer index (as mediated mode does); WQEs come out with their
            // owner (phase) word zeroed.
            let owner = shared_ring::abi::wqe::field::OWNER;
            let sq = WqConsumer::with_owner(
                r.slots(0, 1 << sq_log2).unwrap(),
                sqd.prod,
                sqd.cons,
                0,
                owner,
                false,
            );
            let rq = WqConsumer::with_owner(
                r.slots(sq_pages * PAGE_SIZE, 1 << rq_log2).unwrap(),
                rqd.prod,
                rqd.cons,
                0,
                owner,
                false,
            );
            let list = if grefs.len() <= 4 {
                PageList::inline(&grefs).unwrap()
            } else {
                panic!("fake backend: use small queues");
            };
            st.keep.push(r);
            st.qps.insert(
                h,
                FakeQp {
                    qp_num: 1000 + h,
                    sq,
                    rq,
                    send_cq,
                    recv_cq,
                    posted_send: vec![],
                    connected_to: None,
                },
            );
            ok(Reply::Qp {
                qp: h,
                qp_num: 1000 + h,
                sq_slot: ss,
                rq_slot: rs,
                sq_log2,
                rq_log2,
                pages: list,
                doorbell_gref: st.doorbell_gref,
            })
        }
        Request::DestroyQp { qp } => {
            st.qps.remove(&qp);
            ok(Reply::Empty)
        }
        Request::Connect {
            qp,
            addr,
            remote_qpn,
            ..
        } => match st.qps.get_mut(&qp) {
            Some(q) => {
                q.connected_to = Some((remote_qpn, addr));
                ok(Reply::Empty)
            }
            None => ResponseRepr::error(req.req_id, op, Status::BadHandle),
        },
        Request::PostSend { qp, prod } => match st.qps.get_mut(&qp) {
            Some(q) => {
                q.posted_send.push(prod);
                if st.mediated_engine {
                    st.run_engine(true);
                }
                ok(Reply::Empty)
            }
            None => ResponseRepr::error(req.req_id, op, Status::BadHandle),
        },
        Request::PollCq { cq } => ok(Reply::Poll(
            st.mediated_cqes.get_mut(&cq).and_then(|q| q.pop_front()),
        )),
        Request::QueryGid { index, .. } => match &st.gids {
            Some(t) => match t.get(index as usize) {
                Some(&(gid, gid_type)) => ok(Reply::Gid {
                    gid,
                    gid_type,
                    count: t.len() as u32,
                }),
                None => ResponseRepr::error(req.req_id, op, Status::InvalidArgument),
            },
            None => ResponseRepr::error(req.req_id, op, Status::NotSupported),
        },
        _ => ResponseRepr::error(req.req_id, op, Status::NotSupported),
    }
}
