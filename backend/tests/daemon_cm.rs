//! The control service's connection-management ops against hostile requests: foreign
//! handles, private data outside the CM page, quotas, ports and peers the `[cm]` policy does
//! not allow. Each refusal has its own status, and a refused request never reaches the device
//! (a recording device stands in for the software device's connection manager, so these tests
//! pin the daemon's policy whatever the device does).

mod daemon_common;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use daemon_common::*;
use shared_ring::abi::control::{
    CmInfoReply, CmTarget, PrivData, QpState, Reply, Request, RequestRepr, ResponseRepr, Status,
    CM_SLOT_LEN,
};
use shared_ring::abi::cqe::CqeRepr;
use shared_ring::abi::event::EventRepr;
use shared_ring::SharedRegion;
use vrdma_backend::config::Config;
use vrdma_backend::control::policy::CmPolicy;
use vrdma_backend::control::ControlService;
use vrdma_backend::device::*;
use vrdma_backend::resources::{Account, Quotas};
use vrdma_backend::xenbus::{CloseReason, DeviceId};
use xen_platform::sim::{SimHost, SimHostConfig};
use xen_platform::{Access, GrantRef, Platform};

/// A connect, accept, reject or disconnect the device was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CmCall {
    Listen(SocketAddr),
    Connect(QpNum, SocketAddr, Vec<u8>),
    Accept(ConnRequestId, QpNum, Vec<u8>),
    Reject(ConnRequestId, Vec<u8>),
    Disconnect(QpNum),
    /// An address-vector connect: the peer and this QP's send PSN (RTS; `None`: RTR).
    ConnectAv(QpNum, RemoteAv, Option<u32>),
}

#[derive(Default)]
struct CmState {
    listeners: BTreeMap<u32, (ChannelId, SocketAddr)>,
    requests: BTreeMap<u32, (ChannelId, CmInfo)>,
    calls: Vec<CmCall>,
    next: u32,
}

/// The software device with a recording connection manager: listeners bind ports in a table
/// (a port taken is `Busy`, port 0 gets the next free one from 40000), requests are what the
/// test injects, and every call that would talk to a peer is recorded.
struct RecordingCm {
    soft: SoftDevice,
    addrs: Vec<IpAddr>,
    /// Whether the device has address vectors (as the verbs device): `ConnectAv`s are
    /// recorded; without, the software device's own answer.
    av: bool,
    st: Mutex<CmState>,
}

impl RecordingCm {
    fn new() -> RecordingCm {
        RecordingCm {
            soft: SoftDevice::new(EngineConfig::default()).unwrap(),
            addrs: vec!["127.0.0.2".parse().unwrap()],
            av: false,
            st: Mutex::new(CmState::default()),
        }
    }
    fn calls(&self) -> Vec<CmCall> {
        self.st.lock().unwrap().calls.clone()
    }
    /// A connection request from `peer` with `data`, waiting at a listener of `ch`.
    fn inject_request(&self, ch: ChannelId, peer: &str, data: &[u8]) -> u32 {
        let mut st = self.st.lock().unwrap();
        st.next += 1;
        let id = st.next;
        st.requests.insert(
            id,
            (
                ch,
                CmInfo {
                    local: "127.0.0.2:5000".parse().unwrap(),
                    peer: peer.parse().unwrap(),
                    private_data: data.to_vec(),
                    ird: 4,
                    ord: 2,
                },
            ),
        );
        id
    }
}

impl Device for RecordingCm {
    fn attrs(&self) -> DeviceAttrs {
        self.soft.attrs()
    }
    fn open_channel(&self, setup: ChannelSetup) -> DeviceResult<ChannelId> {
        self.soft.open_channel(setup)
    }
    fn close_channel(&self, ch: ChannelId) {
        let mut st = self.st.lock().unwrap();
        st.listeners.retain(|_, (c, _)| *c != ch);
        st.requests.retain(|_, (c, _)| *c != ch);
        drop(st);
        self.soft.close_channel(ch)
    }
    fn add_doorbell_page(&self, ch: ChannelId, page: SharedRegion) -> DeviceResult<u32> {
        self.soft.add_doorbell_page(ch, page)
    }
    fn kick(&self, ch: ChannelId) {
        self.soft.kick(ch)
    }
    fn post_event(&self, ch: ChannelId, event: EventRepr) -> DeviceResult<()> {
        self.soft.post_event(ch, event)
    }
    fn alloc_pd(&self, ch: ChannelId) -> DeviceResult<PdId> {
        self.soft.alloc_pd(ch)
    }
    fn dealloc_pd(&self, ch: ChannelId, pd: PdId) -> DeviceResult<()> {
        self.soft.dealloc_pd(ch, pd)
    }
    fn reg_mr(&self, ch: ChannelId, setup: MrSetup) -> DeviceResult<MrKeys> {
        self.soft.reg_mr(ch, setup)
    }
    fn dereg_mr(&self, ch: ChannelId, mr: MrHandle) -> DeviceResult<()> {
        self.soft.dereg_mr(ch, mr)
    }
    fn create_cq(&self, ch: ChannelId, setup: CqSetup) -> DeviceResult<CqId> {
        self.soft.create_cq(ch, setup)
    }
    fn destroy_cq(&self, ch: ChannelId, cq: CqId) -> DeviceResult<()> {
        self.soft.destroy_cq(ch, cq)
    }
    fn create_qp(&self, ch: ChannelId, setup: QpSetup) -> DeviceResult<QpNum> {
        self.soft.create_qp(ch, setup)
    }
    fn modify_qp(&self, ch: ChannelId, qp: QpNum, state: QpState) -> DeviceResult<()> {
        self.soft.modify_qp(ch, qp, state)
    }
    fn qp_state(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<QpState> {
        self.soft.qp_state(ch, qp)
    }
    fn destroy_qp(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<()> {
        self.soft.destroy_qp(ch, qp)
    }
    fn connect_qp(&self, ch: ChannelId, qp: QpNum, remote: QpNum) -> DeviceResult<()> {
        self.soft.connect_qp(ch, qp, remote)
    }
    fn local_av(&self) -> Option<LocalAv> {
        self.av.then_some(LocalAv {
            gid: v6("127.0.0.2"),
            lid: 0,
            port: 1,
        })
    }
    /// The device's own port is its address (127.0.0.2): any QP number there is one of its
    /// QPs (the soft device numbers them).
    fn av_names_own_qp(&self, remote: &RemoteAv) -> bool {
        self.av && remote.gid == v6("127.0.0.2")
    }
    fn connect_qp_av(
        &self,
        ch: ChannelId,
        qp: QpNum,
        remote: RemoteAv,
        local_psn: Option<u32>,
    ) -> DeviceResult<()> {
        if !self.av {
            return self.soft.connect_qp_av(ch, qp, remote, local_psn);
        }
        self.st
            .lock()
            .unwrap()
            .calls
            .push(CmCall::ConnectAv(qp, remote, local_psn));
        Ok(())
    }
    fn arm_cq(&self, ch: ChannelId, cq: CqId, solicited_only: bool) -> DeviceResult<()> {
        self.soft.arm_cq(ch, cq, solicited_only)
    }
    fn post_mediated(
        &self,
        ch: ChannelId,
        qp: QpNum,
        which: WorkQueue,
        prod: u32,
    ) -> DeviceResult<()> {
        self.soft.post_mediated(ch, qp, which, prod)
    }
    fn poll_cq_mediated(&self, ch: ChannelId, cq: CqId) -> DeviceResult<Option<CqeRepr>> {
        self.soft.poll_cq_mediated(ch, cq)
    }
    fn stats(&self, ch: ChannelId) -> DeviceStats {
        self.soft.stats(ch)
    }
    fn domain_stats(&self, domid: DomId) -> DeviceStats {
        self.soft.domain_stats(domid)
    }

    fn local_addrs(&self) -> Vec<IpAddr> {
        self.addrs.clone()
    }
    fn cm_listen(
        &self,
        ch: ChannelId,
        addr: SocketAddr,
        _backlog: u32,
    ) -> DeviceResult<ListenerId> {
        let mut st = self.st.lock().unwrap();
        st.calls.push(CmCall::Listen(addr));
        let taken = |st: &CmState, p: u16| st.listeners.values().any(|(_, a)| a.port() == p);
        let port = match addr.port() {
            0 => (40000..).find(|p| !taken(&st, *p)).expect("a free port"),
            p if taken(&st, p) => return Err(DeviceError::Busy("port")),
            p => p,
        };
        st.next += 1;
        let id = st.next;
        st.listeners
            .insert(id, (ch, SocketAddr::new(addr.ip(), port)));
        Ok(ListenerId(id))
    }
    fn cm_listener_addr(&self, ch: ChannelId, l: ListenerId) -> DeviceResult<SocketAddr> {
        match self.st.lock().unwrap().listeners.get(&l.0) {
            Some((c, a)) if *c == ch => Ok(*a),
            _ => Err(DeviceError::BadHandle {
                what: "listener",
                id: l.0,
            }),
        }
    }
    fn cm_close_listener(&self, ch: ChannelId, l: ListenerId) -> DeviceResult<()> {
        let mut st = self.st.lock().unwrap();
        match st.listeners.get(&l.0) {
            Some((c, _)) if *c == ch => {
                st.listeners.remove(&l.0);
                Ok(())
            }
            _ => Err(DeviceError::BadHandle {
                what: "listener",
                id: l.0,
            }),
        }
    }
    fn cm_connect(
        &self,
        _ch: ChannelId,
        qp: QpNum,
        peer: SocketAddr,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        self.st
            .lock()
            .unwrap()
            .calls
            .push(CmCall::Connect(qp, peer, private_data.to_vec()));
        Ok(())
    }
    fn cm_accept(
        &self,
        ch: ChannelId,
        req: ConnRequestId,
        qp: QpNum,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        let mut st = self.st.lock().unwrap();
        match st.requests.get(&req.0) {
            Some((c, _)) if *c == ch => {
                st.requests.remove(&req.0);
                st.calls
                    .push(CmCall::Accept(req, qp, private_data.to_vec()));
                Ok(())
            }
            _ => Err(DeviceError::BadHandle {
                what: "connection request",
                id: req.0,
            }),
        }
    }
    fn cm_reject(
        &self,
        ch: ChannelId,
        req: ConnRequestId,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        let mut st = self.st.lock().unwrap();
        match st.requests.get(&req.0) {
            Some((c, _)) if *c == ch => {
                st.requests.remove(&req.0);
                st.calls.push(CmCall::Reject(req, private_data.to_vec()));
                Ok(())
            }
            _ => Err(DeviceError::BadHandle {
                what: "connection request",
                id: req.0,
            }),
        }
    }
    fn cm_disconnect(&self, _ch: ChannelId, qp: QpNum) -> DeviceResult<()> {
        self.st.lock().unwrap().calls.push(CmCall::Disconnect(qp));
        Ok(())
    }
    fn cm_request_info(&self, ch: ChannelId, req: ConnRequestId) -> DeviceResult<CmInfo> {
        match self.st.lock().unwrap().requests.get(&req.0) {
            Some((c, info)) if *c == ch => Ok(info.clone()),
            _ => Err(DeviceError::BadHandle {
                what: "connection request",
                id: req.0,
            }),
        }
    }
}

struct Bench {
    _tmp: tempfile::TempDir,
    _host: SimHost,
    dom0: Platform,
    guest: Platform,
    domid: u32,
    device: Arc<RecordingCm>,
    policy: Arc<CmPolicy>,
}

impl Bench {
    fn new(config: &str) -> Bench {
        Bench::with_device(config, RecordingCm::new())
    }

    /// A bench whose device has address vectors.
    fn with_av(config: &str) -> Bench {
        Bench::with_device(
            config,
            RecordingCm {
                av: true,
                ..RecordingCm::new()
            },
        )
    }

    fn with_device(config: &str, device: RecordingCm) -> Bench {
        let tmp = tempfile::Builder::new()
            .prefix("vcm")
            .tempdir_in("/tmp")
            .unwrap();
        let host = SimHost::start(SimHostConfig::new(tmp.path())).unwrap();
        let domid = host.create_domain(None, None).unwrap();
        let dom0 = platform(host.dir(), DomId::DOM0);
        let guest = platform(host.dir(), domid);
        Bench {
            _tmp: tmp,
            _host: host,
            dom0,
            guest,
            domid: u32::from(domid.0),
            device: Arc::new(device),
            policy: Arc::new(CmPolicy::new(Config::parse(config, "test").unwrap().cm)),
        }
    }

    /// An initialised channel of the bench's domain (channel number `n`).
    fn channel(&self, n: u32) -> Chan {
        let account = Account::new(self.domid, 0, Quotas::default(), Box::new(|| {}));
        let mut svc = ControlService::new(
            DeviceId {
                domid: self.domid,
                devid: 0,
            },
            n,
            self.dom0.clone(),
            self.device.clone(),
            account,
            ChannelMode::Bypass,
            Arc::new(|| {}),
        )
        .with_cm_policy(self.policy.clone());
        assert_eq!(
            call(&mut svc, Request::Init { version: 2 }).status,
            Status::Ok
        );
        let ch = svc.device_channel().unwrap();
        Chan { svc, ch }
    }
}

struct Chan {
    svc: ControlService,
    ch: ChannelId,
}

impl Chan {
    fn call(&mut self, request: Request) -> ResponseRepr {
        call(&mut self.svc, request)
    }
    fn status(&mut self, request: Request) -> Status {
        self.call(request).status
    }
    /// A QP (with its PD and CQ).
    fn qp(&mut self) -> u32 {
        let Reply::Handle(pd) = self.call(Request::AllocPd).reply else {
            panic!()
        };
        let Reply::Cq { cq, .. } = self.call(Request::CreateCq { cqe_log2: 4 }).reply else {
            panic!()
        };
        let r = self.call(Request::CreateQp {
            pd,
            send_cq: cq,
            recv_cq: cq,
            sq_log2: 4,
            rq_log2: 4,
        });
        let Reply::Qp { qp, .. } = r.reply else {
            panic!("{r:?}")
        };
        qp
    }
    fn listen(&mut self, port: u16) -> ResponseRepr {
        self.call(Request::Listen {
            port,
            backlog: 0,
            addr: [0; 16],
        })
    }
    fn connect(&mut self, qp: u32, ip: &str, port: u16, private: PrivData) -> Status {
        self.status(Request::Connect {
            qp,
            port,
            addr: v6(ip),
            remote_qpn: 0,
            private,
        })
    }
    /// The CM page, mapped as the guest maps it.
    fn cm_page(&mut self, guest: &Platform) -> SharedRegion {
        let Reply::CmPage {
            gref,
            slots,
            slot_len,
        } = self.call(Request::CmPage).reply
        else {
            panic!()
        };
        assert_eq!((slots, slot_len as usize), (16, CM_SLOT_LEN));
        guest
            .map_grants(DomId::DOM0, &[GrantRef(gref)], Access::ReadWrite)
            .unwrap()
            .into_region()
            .unwrap()
    }
}

fn call(svc: &mut ControlService, request: Request) -> ResponseRepr {
    let rsp = svc
        .handle(&RequestRepr { req_id: 1, request }.to_bytes())
        .expect("an immediate answer");
    ResponseRepr::parse(&rsp).unwrap()
}

fn v6(ip: &str) -> [u8; 16] {
    match ip.parse::<IpAddr>().unwrap() {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

fn listener_of(r: &ResponseRepr) -> (u32, u16) {
    match r.reply {
        Reply::Listener { listener, port } => (listener, port),
        _ => panic!("not a listener: {r:?}"),
    }
}

#[test]
fn listen_ports_follow_allowed_ports_and_the_backend_addresses() {
    let b = Bench::new("");
    let mut a = b.channel(0);
    // No list: privileged ports are refused before the device is asked.
    assert_eq!(a.listen(80).status, Status::NotPermitted);
    assert!(b.device.calls().is_empty(), "{:?}", b.device.calls());
    let (_, port) = listener_of(&a.listen(5000));
    assert_eq!(port, 5000);
    // The port is taken (by any channel): AddressInUse.
    let mut c = b.channel(1);
    assert_eq!(c.listen(5000).status, Status::AddressInUse);
    // Port 0: the device chooses, and the answer says which.
    let (_, port) = listener_of(&c.listen(0));
    assert_eq!(port, 40000);
    // Only the backend's addresses can be listened on.
    assert_eq!(
        a.status(Request::Listen {
            port: 5001,
            backlog: 1,
            addr: v6("127.0.0.9"),
        }),
        Status::NotPermitted
    );
    let r = a.call(Request::Listen {
        port: 5001,
        backlog: 1,
        addr: v6("127.0.0.2"),
    });
    assert_eq!(listener_of(&r).1, 5001);

    let b = Bench::new("[cm]\nallowed-ports = [\"6000-6001\", 80]");
    let mut a = b.channel(0);
    assert_eq!(a.listen(5000).status, Status::NotPermitted);
    assert!(b.device.calls().is_empty());
    // A listed privileged port is allowed.
    assert_eq!(listener_of(&a.listen(80)).1, 80);
    // Port 0 takes the first free allowed port, then the next; then there is none.
    assert_eq!(listener_of(&a.listen(0)).1, 6000);
    assert_eq!(listener_of(&a.listen(0)).1, 6001);
    assert_eq!(a.listen(0).status, Status::AddressInUse);
}

#[test]
fn listener_quota_is_per_domain_across_channels_and_comes_back() {
    let b = Bench::new("[cm]\nmax-listeners = 2");
    let mut a = b.channel(0);
    let mut c = b.channel(1);
    let (l1, _) = listener_of(&a.listen(5000));
    listener_of(&c.listen(5001));
    assert_eq!(a.listen(5002).status, Status::QuotaExceeded);
    assert_eq!(c.listen(5002).status, Status::QuotaExceeded);
    // A listener of another channel is not this channel's to close.
    assert_eq!(
        c.status(Request::CloseListener { listener: l1 }),
        Status::BadHandle
    );
    assert_eq!(
        a.status(Request::CloseListener { listener: l1 }),
        Status::Ok
    );
    assert_eq!(
        a.status(Request::CloseListener { listener: l1 }),
        Status::BadHandle
    );
    listener_of(&c.listen(5002));
    assert_eq!(b.policy.usage(b.domid).listeners, 2);
    // Reclaiming a channel gives its listeners back.
    c.svc.reclaim(&CloseReason::Shutdown);
    assert_eq!(b.policy.usage(b.domid).listeners, 0);
    drop(a);
    assert_eq!(b.policy.usage(b.domid).listeners, 0);
}

#[test]
fn connects_to_peers_not_allowed_are_refused_before_the_device_is_asked() {
    let b =
        Bench::new("[cm]\nallowed-peers = [\"127.0.0.0/8\"]\n[cm.domain.999]\nallowed-peers = []");
    let mut a = b.channel(0);
    let qp = a.qp();
    assert_eq!(
        a.connect(qp, "10.0.0.1", 4791, PrivData::NONE),
        Status::NotPermitted
    );
    assert_eq!(
        a.connect(qp, "::1", 4791, PrivData::NONE),
        Status::NotPermitted
    );
    assert!(b.device.calls().is_empty(), "{:?}", b.device.calls());
    // Nonsense targets are invalid, not forbidden.
    assert_eq!(
        a.connect(qp, "::", 4791, PrivData::NONE),
        Status::InvalidArgument
    );
    assert_eq!(
        a.connect(qp, "127.0.0.3", 0, PrivData::NONE),
        Status::InvalidArgument
    );
    assert_eq!(a.connect(qp, "127.0.0.3", 4791, PrivData::NONE), Status::Ok);
    assert_eq!(
        b.device.calls(),
        vec![CmCall::Connect(
            QpNum(qp),
            "127.0.0.3:4791".parse().unwrap(),
            vec![]
        )]
    );
    // Connecting twice is Busy.
    assert_eq!(
        a.connect(qp, "127.0.0.3", 4791, PrivData::NONE),
        Status::Busy
    );
    // An incoming request from a peer not allowed cannot be accepted.
    let qp2 = a.qp();
    let req = b.device.inject_request(a.ch, "10.1.1.1:3333", b"hi");
    assert_eq!(
        a.status(Request::Accept {
            request: req,
            qp: qp2,
            private: PrivData::NONE
        }),
        Status::NotPermitted
    );
    assert!(!b
        .device
        .calls()
        .iter()
        .any(|c| matches!(c, CmCall::Accept(..))));
}

fn connect_av(qp: u32, gid: &str, remote_qpn: u32) -> Request {
    av(qp, gid, remote_qpn, 0, true)
}

/// The RTR step of [`connect_av`].
fn rtr_av(qp: u32, gid: &str, remote_qpn: u32) -> Request {
    av(qp, gid, remote_qpn, 0, false)
}

/// An address vector to `gid` (empty: all-zero) and `remote_qpn` with `lid`: the move to RTS
/// (both PSNs) when `rts`, else the RTR step (no send PSN).
fn av(qp: u32, gid: &str, remote_qpn: u32, lid: u16, rts: bool) -> Request {
    Request::ConnectAv {
        qp,
        remote_qpn,
        gid: if gid.is_empty() { [0; 16] } else { v6(gid) },
        rq_psn: 0x12_3456,
        sq_psn: if rts { 0xab_cdef } else { 0 },
        lid,
        path_mtu: 3,
        rts,
    }
}

#[test]
fn address_vector_connects_are_checked_against_allowed_peers() {
    let b = Bench::with_av("[cm]\nallowed-peers = [\"127.0.0.0/8\", \"fd00::/8\"]");
    let mut a = b.channel(0);
    let qp = a.qp();
    // A GID outside allowed-peers (IPv4-mapped: checked as the IPv4 address; other GIDs as
    // IPv6 addresses), or none at all (a LID-only address vector) is refused, and the device
    // never sees it.
    for gid in ["::ffff:10.77.0.9", "fe80::1", "::ffff:7f00:1:0", ""] {
        assert_eq!(
            a.status(rtr_av(qp, gid, 0x99)),
            Status::NotPermitted,
            "{gid}"
        );
        assert_eq!(
            a.status(connect_av(qp, gid, 0x99)),
            Status::NotPermitted,
            "{gid}"
        );
    }
    assert!(b.device.calls().is_empty(), "{:?}", b.device.calls());
    // A foreign QP is a bad handle.
    assert_eq!(
        a.status(connect_av(qp + 1000, "127.0.0.3", 0x99)),
        Status::BadHandle
    );
    // Allowed: the device gets the whole address vector, answered at once.
    assert_eq!(a.status(rtr_av(qp, "127.0.0.3", 0x99)), Status::Ok);
    assert_eq!(a.status(connect_av(qp, "127.0.0.3", 0x99)), Status::Ok);
    let qp2 = a.qp();
    assert_eq!(a.status(connect_av(qp2, "fd00::7", 0x98)), Status::Ok);
    assert_eq!(
        b.device.calls(),
        vec![
            CmCall::ConnectAv(
                QpNum(qp),
                RemoteAv {
                    gid: v6("127.0.0.3"),
                    lid: 0,
                    qpn: 0x99,
                    psn: 0x12_3456,
                    mtu: 3
                },
                None
            ),
            CmCall::ConnectAv(
                QpNum(qp),
                RemoteAv {
                    gid: v6("127.0.0.3"),
                    lid: 0,
                    qpn: 0x99,
                    psn: 0x12_3456,
                    mtu: 3
                },
                Some(0xab_cdef)
            ),
            CmCall::ConnectAv(
                QpNum(qp2),
                RemoteAv {
                    gid: v6("fd00::7"),
                    lid: 0,
                    qpn: 0x98,
                    psn: 0x12_3456,
                    mtu: 3
                },
                Some(0xab_cdef)
            )
        ]
    );
    // Per-domain lists apply: an empty one allows nothing.
    let b = Bench::with_av(&format!(
        "[cm]\nallowed-peers = [\"127.0.0.0/8\"]\n[cm.domain.{}]\nallowed-peers = []",
        Bench::with_av("").domid
    ));
    let mut a = b.channel(0);
    let qp = a.qp();
    assert_eq!(
        a.status(connect_av(qp, "127.0.0.3", 0x99)),
        Status::NotPermitted
    );
    assert!(b.device.calls().is_empty(), "{:?}", b.device.calls());
}

#[test]
fn a_lid_routed_address_vector_is_refused_under_allowed_peers() {
    // InfiniBand routes by the LID: an allowed GID beside a LID would reach the LID's node,
    // so with an allowed-peers list a non-zero LID is refused; without a list it is allowed.
    let with_lid = |qp, lid| av(qp, "127.0.0.3", 0x99, lid, true);
    let b = Bench::with_av("[cm]\nallowed-peers = [\"127.0.0.0/8\"]");
    let mut a = b.channel(0);
    let qp = a.qp();
    assert_eq!(a.status(with_lid(qp, 7)), Status::NotPermitted);
    assert!(b.device.calls().is_empty(), "{:?}", b.device.calls());
    assert_eq!(a.status(with_lid(qp, 0)), Status::Ok);
    let b = Bench::with_av("");
    let mut a = b.channel(0);
    let qp = a.qp();
    assert_eq!(a.status(with_lid(qp, 7)), Status::Ok);
    assert_eq!(b.device.calls().len(), 1, "{:?}", b.device.calls());
}

#[test]
fn an_address_vector_naming_a_qp_of_this_backend_is_a_pairing() {
    // Guests share the device's port and GIDs: an address vector naming this backend's own
    // GID and another guest's QP number must not move the QP to RTR at it one-sidedly (the
    // QP could then send into the other guest's QP). It is a pairing: answered only when the
    // other QP names this one back, and the device never gets the one-sided RTR.
    let b = Bench::with_av("[cm]\nallowed-peers = [\"127.0.0.0/8\"]");
    let mut a = b.channel(0);
    let mut v = b.channel(1);
    let (qa, qv) = (a.qp(), v.qp());
    let rsp = a.svc.handle(
        &RequestRepr {
            req_id: 7,
            request: rtr_av(qa, "127.0.0.2", qv),
        }
        .to_bytes(),
    );
    assert!(
        rsp.is_none(),
        "answered before the other QP named it: {rsp:?}"
    );
    assert_eq!(
        a.status(connect_av(qa, "127.0.0.2", qv)),
        Status::Ok,
        "the RTS step"
    );
    assert!(b.device.calls().is_empty(), "{:?}", b.device.calls());
    assert!(
        a.svc.poll_pending().is_empty(),
        "still waiting for its peer"
    );
    assert_eq!(
        b.device.soft.qp_state(a.ch, QpNum(qa)).unwrap(),
        QpState::Rtr
    );
    // The other QP names it back: both are connected, and the deferred RTR is answered.
    let rsp = v.svc.handle(
        &RequestRepr {
            req_id: 8,
            request: rtr_av(qv, "127.0.0.2", qa),
        }
        .to_bytes(),
    );
    assert!(rsp.is_none(), "{rsp:?}");
    let answered = a.svc.poll_pending();
    assert_eq!(answered.len(), 1);
    assert_eq!(
        ResponseRepr::parse(&answered[0]).unwrap().status,
        Status::Ok
    );
    assert_eq!(
        b.device.soft.qp_state(v.ch, QpNum(qv)).unwrap(),
        QpState::Rts
    );
    assert!(b.device.calls().is_empty(), "{:?}", b.device.calls());
}

#[test]
fn without_address_vectors_a_foreign_gid_is_not_supported() {
    // The software device pairs QPs of this backend only: a GID of another host is
    // NotSupported (after the peer check: a forbidden one stays NotPermitted).
    let b = Bench::new("[cm]\nallowed-peers = [\"127.0.0.0/8\"]");
    let mut a = b.channel(0);
    let qp = a.qp();
    assert_eq!(
        a.status(rtr_av(qp, "127.0.0.3", 0x99)),
        Status::NotSupported
    );
    assert_eq!(
        a.status(connect_av(qp, "10.0.0.1", 0x99)),
        Status::NotPermitted
    );
    // Its own address (or none) pairs with a QP of this backend, answered when connected.
    let rsp = a.svc.handle(
        &RequestRepr {
            req_id: 7,
            request: rtr_av(qp, "127.0.0.2", 0x99),
        }
        .to_bytes(),
    );
    assert!(rsp.is_none(), "a pairing waits for its peer: {rsp:?}");
}

#[test]
fn connect_quota_counts_connects_in_flight() {
    let b = Bench::new("[cm]\nmax-connects = 1");
    let mut a = b.channel(0);
    let (q1, q2) = (a.qp(), a.qp());
    assert_eq!(a.connect(q1, "127.0.0.3", 4791, PrivData::NONE), Status::Ok);
    assert_eq!(
        a.connect(q2, "127.0.0.3", 4791, PrivData::NONE),
        Status::QuotaExceeded
    );
    assert_eq!(a.svc.cm_connects_in_flight(), 1);
    // The first connect failed (its QP went to Error): it no longer counts.
    assert_eq!(
        a.status(Request::ModifyQp {
            qp: q1,
            state: QpState::Error
        }),
        Status::Ok
    );
    assert_eq!(a.connect(q2, "127.0.0.3", 4791, PrivData::NONE), Status::Ok);
    // Destroying a connecting QP gives its connect back.
    assert_eq!(a.status(Request::DestroyQp { qp: q2 }), Status::Ok);
    assert_eq!(b.policy.usage(b.domid).connects, 0);

    // The quota is the domain's: a connect of one channel that is over is given back by
    // that channel's thread (it polls while connects are in flight), not by the next connect
    // of another channel.
    let q3 = a.qp();
    let mut c = b.channel(1);
    let q4 = c.qp();
    assert_eq!(a.connect(q3, "127.0.0.3", 4791, PrivData::NONE), Status::Ok);
    assert_eq!(
        c.connect(q4, "127.0.0.3", 4791, PrivData::NONE),
        Status::QuotaExceeded
    );
    assert_eq!(
        a.status(Request::ModifyQp {
            qp: q3,
            state: QpState::Error
        }),
        Status::Ok
    );
    assert!(a.svc.has_pending(), "a connect in flight wants polling");
    assert!(a.svc.poll_pending().is_empty(), "nothing to answer");
    assert!(!a.svc.has_pending());
    assert_eq!(c.connect(q4, "127.0.0.3", 4791, PrivData::NONE), Status::Ok);
}

#[test]
fn private_data_travels_through_the_cm_page_only() {
    let b = Bench::new("");
    let mut a = b.channel(0);
    let qp = a.qp();
    // Private data without a CM page is an invalid argument; nothing reaches the device.
    let some = PrivData { slot: 0, len: 5 };
    assert_eq!(
        a.connect(qp, "127.0.0.3", 4791, some),
        Status::InvalidArgument
    );
    assert!(b.device.calls().is_empty());
    // A slot past the page does not even parse.
    let mut raw = RequestRepr {
        req_id: 1,
        request: Request::Connect {
            qp,
            port: 4791,
            addr: v6("127.0.0.3"),
            remote_qpn: 0,
            private: PrivData { slot: 15, len: 255 },
        },
    }
    .to_bytes();
    raw[36] = 16;
    let r = ResponseRepr::parse(&a.svc.handle(&raw).unwrap()).unwrap();
    assert_eq!(r.status, Status::BadRequest);

    // With the page: 255 bytes in the last slot arrive at the device as written.
    let page = a.cm_page(&b.guest);
    let data: Vec<u8> = (0..255u32).map(|i| (i * 7 + 1) as u8).collect();
    page.write_bytes(15 * CM_SLOT_LEN, &data).unwrap();
    page.write_bytes(15 * CM_SLOT_LEN + 255, &[0xee]).unwrap(); // not part of it
    assert_eq!(
        a.connect(qp, "127.0.0.3", 4791, PrivData { slot: 15, len: 255 }),
        Status::Ok
    );
    assert_eq!(
        b.device.calls(),
        vec![CmCall::Connect(
            QpNum(qp),
            "127.0.0.3:4791".parse().unwrap(),
            data.clone()
        )]
    );
    // The same page again (one page per channel, charged once).
    let again = a.svc.granted_pages();
    let _ = a.cm_page(&b.guest);
    assert_eq!(a.svc.granted_pages(), again);

    // A request's addresses and private data come back through CmInfo into the named slot.
    let req = b
        .device
        .inject_request(a.ch, "127.0.0.5:3333", b"hello from B");
    let r = a.call(Request::CmInfo {
        target: CmTarget::Request(req),
        slot: 2,
    });
    assert_eq!(
        r.reply,
        Reply::CmInfo(CmInfoReply {
            local_addr: v6("127.0.0.2"),
            local_port: 5000,
            remote_addr: v6("127.0.0.5"),
            remote_port: 3333,
            private_len: 12,
            ird: 4,
            ord: 2,
        })
    );
    let mut got = [0u8; 12];
    page.read_bytes(2 * CM_SLOT_LEN, &mut got).unwrap();
    assert_eq!(&got, b"hello from B");
    // Accept and reject carry their private data; a request answered is gone.
    let qp2 = a.qp();
    page.write_bytes(3 * CM_SLOT_LEN, b"welcome").unwrap();
    assert_eq!(
        a.status(Request::Accept {
            request: req,
            qp: qp2,
            private: PrivData { slot: 3, len: 7 }
        }),
        Status::Ok
    );
    assert_eq!(
        a.status(Request::Reject {
            request: req,
            private: PrivData::NONE
        }),
        Status::BadHandle
    );
    let req2 = b.device.inject_request(a.ch, "127.0.0.5:3334", b"");
    page.write_bytes(4 * CM_SLOT_LEN, b"no").unwrap();
    assert_eq!(
        a.status(Request::Reject {
            request: req2,
            private: PrivData { slot: 4, len: 2 }
        }),
        Status::Ok
    );
    let calls = b.device.calls();
    assert_eq!(
        &calls[1..],
        &[
            CmCall::Accept(ConnRequestId(req), QpNum(qp2), b"welcome".to_vec()),
            CmCall::Reject(ConnRequestId(req2), b"no".to_vec()),
        ]
    );
}

#[test]
fn foreign_handles_are_bad_handles() {
    let b = Bench::new("");
    let mut a = b.channel(0);
    let mut c = b.channel(1);
    let theirs = c.qp();
    let req = b.device.inject_request(c.ch, "127.0.0.5:3333", b"");
    let mine = a.qp();
    assert_eq!(
        a.connect(theirs, "127.0.0.3", 4791, PrivData::NONE),
        Status::BadHandle
    );
    assert_eq!(
        a.status(Request::Disconnect { qp: theirs }),
        Status::BadHandle
    );
    assert_eq!(
        a.status(Request::Accept {
            request: req,
            qp: theirs,
            private: PrivData::NONE
        }),
        Status::BadHandle
    );
    // Another channel's request, with this channel's QP.
    assert_eq!(
        a.status(Request::Accept {
            request: req,
            qp: mine,
            private: PrivData::NONE
        }),
        Status::BadHandle
    );
    assert_eq!(
        a.status(Request::Reject {
            request: req,
            private: PrivData::NONE
        }),
        Status::BadHandle
    );
    assert_eq!(
        a.status(Request::CmInfo {
            target: CmTarget::Qp(theirs),
            slot: 0
        }),
        Status::BadHandle
    );
    assert!(b.device.calls().is_empty(), "{:?}", b.device.calls());
    // An address-vector connect is intra-host: no port, no private data, no foreign address.
    assert_eq!(
        a.status(Request::Connect {
            qp: mine,
            port: 4791,
            addr: [0; 16],
            remote_qpn: theirs,
            private: PrivData::NONE
        }),
        Status::InvalidArgument
    );
    assert_eq!(
        a.status(Request::Connect {
            qp: mine,
            port: 0,
            addr: v6("10.0.0.1"),
            remote_qpn: theirs,
            private: PrivData::NONE
        }),
        Status::InvalidArgument
    );
}
