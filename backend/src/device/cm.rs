//! The software device's connection manager (rdma_cm semantics, see the `cm_*` methods of
//! [`Device`]): listeners, connection requests and the connection state of QPs, under the
//! device's table lock.
//!
//! * A connect to one of the device's own addresses ([`CmConfig::addrs`]) never touches TCP:
//!   it finds this device's listener on the port and pairs the two QPs with the intra-host
//!   machinery when the listener's channel accepts.
//! * Any other address goes through [`TcpCm`] (the device's connection-manager thread):
//!   TCP from the device address of the peer's family, MPA request/reply, then
//!   [`Inner::attach_stream`] gives the connection to the data path.
//! * A port belongs to one listener (one channel); listeners bind the port on the device's
//!   addresses, so nothing else on the host takes it either.
//! * The peer filter ([`CmConfig::peer_filter`]) is asked for every connect (the connecting
//!   domain, the peer's address) and every incoming request (the listening domain, the
//!   requester's address); a refusal is `ConnectionRefused` or an MPA reject.
//!
//! This is a child module of `soft` (it works on its private tables).

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Weak;
use std::time::Duration;

use super::super::iwarp::cm::{CmSink, Cmd, ConnId, CrcPolicy, MpaPolicy, TcpCm, Upcall};
use super::super::iwarp::Established;
use super::*;

/// Decides whether a domain may talk to a peer address (see [`CmConfig::peer_filter`]).
pub type PeerFilter = Arc<dyn Fn(DomId, SocketAddr) -> bool + Send + Sync>;

/// Configuration of the connection manager ([`SoftDevice::with_cm`]).
#[derive(Clone)]
pub struct CmConfig {
    /// The device's addresses: listeners bind on them, connects to them stay on this host,
    /// connects elsewhere leave from the first one of the peer's family.
    pub addrs: Vec<IpAddr>,
    /// MPA CRC policy.
    pub crc: CrcPolicy,
    /// How long a TCP connect plus MPA exchange (and an incoming request, and a reply) may
    /// take before the connect fails with `ConnectUnreachable`.
    pub connect_timeout: Duration,
    /// `None` allows everything; otherwise connects to, and requests from, addresses for
    /// which it answers `false` are refused.
    pub peer_filter: Option<PeerFilter>,
    /// RDMA Reads a QP accepts outstanding / issues outstanding (advertised in MPA; at most
    /// 0x3fff).
    pub max_ird: u16,
    pub max_ord: u16,
    /// Idle time before the data path probes a silent peer host (TCP keepalive; the user
    /// timeout is twice it): a peer that died without a FIN or RST is noticed about
    /// `2 × peer_probe` later.
    pub peer_probe: Duration,
    /// Connection requests a domain keeps after their listener closed (taken by the guest,
    /// not answered yet), over all its channels. Closing a listener keeps its taken requests
    /// up to this, counting those the domain keeps already; the rest are rejected as untaken
    /// ones are (the peer gets a reject, the guest's later accept or reject of them fails:
    /// bad handle).
    pub max_kept_requests: usize,
}

/// [`CmConfig::max_kept_requests`]'s default: the backlog of a listener (16 by default, at
/// most 128 through `Listen`) times 4.
pub const DEFAULT_MAX_KEPT_REQUESTS: usize = 64;

impl Default for CmConfig {
    fn default() -> Self {
        Self {
            addrs: Vec::new(),
            crc: CrcPolicy::default(),
            connect_timeout: Duration::from_secs(10),
            peer_filter: None,
            max_ird: 16,
            max_ord: 16,
            peer_probe: super::super::iwarp::qp::DEFAULT_PEER_PROBE,
            max_kept_requests: DEFAULT_MAX_KEPT_REQUESTS,
        }
    }
}

/// Which taken requests of a closing listener its domain keeps: `taken` (the listener's
/// requests the guest took) in handle order, while the domain keeps fewer than `max`
/// (`already` before this close, over all its channels). The others are rejected.
pub(crate) fn kept_at_close(
    mut taken: Vec<ConnRequestId>,
    already: usize,
    max: usize,
) -> (Vec<ConnRequestId>, Vec<ConnRequestId>) {
    taken.sort_by_key(|r| r.0);
    let room = max.saturating_sub(already).min(taken.len());
    let rejected = taken.split_off(room);
    (taken, rejected)
}

impl CmConfig {
    /// Whether the peer filter lets `dom` talk to `peer`.
    pub fn allows(&self, dom: DomId, peer: SocketAddr) -> bool {
        self.peer_filter.as_ref().map_or(true, |f| f(dom, peer))
    }
}

impl std::fmt::Debug for CmConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmConfig")
            .field("addrs", &self.addrs)
            .field("crc", &self.crc)
            .field("connect_timeout", &self.connect_timeout)
            .field("peer_filter", &self.peer_filter.is_some())
            .field("max_ird", &self.max_ird)
            .field("max_ord", &self.max_ord)
            .field("peer_probe", &self.peer_probe)
            .finish()
    }
}

/// The running connection manager of a device.
pub(super) struct CmRuntime {
    config: CmConfig,
    tcp: TcpCm,
}

impl CmRuntime {
    pub(super) fn stop(&self) {
        self.tcp.stop();
    }
}

/// Most requests a listener keeps waiting, whatever the backlog asked.
const MAX_BACKLOG: u32 = 1024;

#[derive(Default)]
pub(super) struct CmTables {
    listeners: HashMap<ListenerId, Listener>,
    ports: HashMap<u16, ListenerId>,
    requests: HashMap<ConnRequestId, Request>,
    qps: HashMap<QpNum, QpCm>,
    conns: HashMap<ConnId, ConnUse>,
}

impl CmTables {
    /// Whether the connection manager is connecting or has connected `qp`.
    pub(super) fn has_qp(&self, qp: QpNum) -> bool {
        self.qps.contains_key(&qp)
    }
}

struct Listener {
    ch: ChannelId,
    domid: DomId,
    addr: SocketAddr,
    backlog: u32,
    requests: HashSet<ConnRequestId>,
}

#[derive(Clone, Copy)]
enum Origin {
    /// A QP of this device connecting.
    Local(QpNum),
    /// A TCP connection waiting for the reply.
    Remote(ConnId),
}

struct Request {
    listener: ListenerId,
    ch: ChannelId,
    from: Origin,
    info: CmInfo,
    /// The guest took it (asked its `CmInfo`): it outlives its listener, as a request id
    /// an rdma_cm program got survives `rdma_destroy_id` of the listening id, until it is
    /// accepted, rejected or withdrawn, or the channel closes.
    delivered: bool,
    /// Its listener closed after the guest took it: counted against
    /// [`CmConfig::max_kept_requests`] of the channel's domain.
    kept: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting at a listener of this device.
    ConnectingLocal(ConnRequestId),
    ConnectingRemote(ConnId),
    /// Accepted a remote request; the reply is on its way.
    Accepting(ConnId),
    Connected,
    /// Rejected, unreachable, disconnected.
    Ended,
}

struct QpCm {
    ch: ChannelId,
    info: CmInfo,
    phase: Phase,
}

#[derive(Clone, Copy)]
enum ConnUse {
    Request(ConnRequestId),
    Qp(QpNum),
}

/// The engine's reports reach the device through this (the engine must not keep it alive).
struct Sink(Weak<Inner>);

impl CmSink for Sink {
    fn upcall(&self, u: Upcall) {
        if let Some(inner) = self.0.upgrade() {
            inner.cm_upcall(u);
        }
    }
}

fn no_cm() -> DeviceError {
    DeviceError::NotSupported("connection manager")
}

fn check_pd(pd: &[u8]) -> DeviceResult<()> {
    if pd.len() > MAX_PRIVATE_DATA {
        return Err(inval(format!(
            "{} bytes of private data, at most {MAX_PRIVATE_DATA}",
            pd.len()
        )));
    }
    Ok(())
}

/// The QP as a connection endpoint: on `ch`, not connected or connecting.
fn free_qp(t: &mut Tables, ch: ChannelId, qp: QpNum) -> DeviceResult<Arc<Qp>> {
    if !entry(t, ch)?.qps.contains_key(&qp) {
        return Err(bad("QP", qp.0));
    }
    let q = t.qps.get(&qp).ok_or(bad("QP", qp.0))?.clone();
    if !matches!(q.state(), QpState::Reset | QpState::Init | QpState::Rtr) {
        return Err(DeviceError::ConnectionRefused(qp.0, "QP is not in Init"));
    }
    if lock(&q.send).peer_num.is_some() || t.cm.qps.contains_key(&qp) {
        return Err(DeviceError::ConnectionRefused(
            qp.0,
            "QP is already connected",
        ));
    }
    Ok(q)
}

impl SoftDevice {
    /// Starts the connection manager (its thread sleeps until there is work). Call once,
    /// right after creating the device; without it the `cm_*` calls answer `NotSupported`.
    pub fn with_cm(self, config: CmConfig) -> std::io::Result<Self> {
        let policy = MpaPolicy {
            crc: config.crc,
            max_ird: config.max_ird.min(iwarp_proto::mpa::MAX_IRD_ORD),
            max_ord: config.max_ord.min(iwarp_proto::mpa::MAX_IRD_ORD),
            timeout: config.connect_timeout,
            peer_probe: config.peer_probe,
        };
        let tcp = TcpCm::start(policy, Arc::new(Sink(Arc::downgrade(&self.inner))))?;
        if self.inner.cm.set(CmRuntime { config, tcp }).is_err() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "the connection manager is already running",
            ));
        }
        Ok(self)
    }

    fn cm(&self) -> DeviceResult<&CmRuntime> {
        self.inner.cm.get().ok_or_else(no_cm)
    }

    pub(super) fn cm_local_addrs(&self) -> Vec<IpAddr> {
        self.inner
            .cm
            .get()
            .map(|c| c.config.addrs.clone())
            .unwrap_or_default()
    }

    pub(super) fn cm_listen_impl(
        &self,
        ch: ChannelId,
        addr: SocketAddr,
        backlog: u32,
    ) -> DeviceResult<ListenerId> {
        let cm = self.cm()?;
        let ips: Vec<IpAddr> = if addr.ip().is_unspecified() {
            cm.config.addrs.clone()
        } else if cm.config.addrs.contains(&addr.ip()) {
            vec![addr.ip()]
        } else {
            return Err(inval(format!("{} is no address of this device", addr.ip())));
        };
        if ips.is_empty() {
            return Err(inval("the device has no address"));
        }
        let mut t = self.tables();
        let domid = entry(&mut t, ch)?.ch.domid;
        if addr.port() != 0 && t.cm.ports.contains_key(&addr.port()) {
            return Err(DeviceError::Busy("port"));
        }
        let sockets = bind_all(&ips, addr.port(), &t.cm.ports)?;
        let port = sockets
            .first()
            .and_then(|s| s.local_addr().ok())
            .map(|a| a.port())
            .ok_or(DeviceError::NoResources("ports"))?;
        let id = ListenerId(t.id());
        let laddr = SocketAddr::new(addr.ip(), port);
        t.cm.ports.insert(port, id);
        t.cm.listeners.insert(
            id,
            Listener {
                ch,
                domid,
                addr: laddr,
                backlog: backlog.clamp(1, MAX_BACKLOG),
                requests: HashSet::new(),
            },
        );
        cm.tcp.send(Cmd::Listen { id: id.0, sockets });
        tracing::debug!(ch = ch.0, listener = id.0, %laddr, "listening");
        Ok(id)
    }

    pub(super) fn cm_listener_addr_impl(
        &self,
        ch: ChannelId,
        l: ListenerId,
    ) -> DeviceResult<SocketAddr> {
        self.cm()?;
        let t = self.tables();
        match t.cm.listeners.get(&l) {
            Some(x) if x.ch == ch => Ok(x.addr),
            _ => Err(bad("listener", l.0)),
        }
    }

    pub(super) fn cm_close_listener_impl(&self, ch: ChannelId, l: ListenerId) -> DeviceResult<()> {
        self.cm()?;
        let mut t = self.tables();
        match t.cm.listeners.get(&l) {
            Some(x) if x.ch == ch => {}
            _ => return Err(bad("listener", l.0)),
        }
        let closed = self.inner.close_listener_locked(&mut t, l);
        drop(t);
        wait_closed(closed);
        Ok(())
    }

    pub(super) fn cm_connect_impl(
        &self,
        ch: ChannelId,
        qp: QpNum,
        peer: SocketAddr,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        check_pd(private_data)?;
        let cm = self.cm()?;
        if peer.port() == 0 || peer.ip().is_unspecified() {
            return Err(inval(format!("cannot connect to {peer}")));
        }
        let mut t = self.tables();
        let q = free_qp(&mut t, ch, qp)?;
        let domid = q.ch.domid;
        let allowed = |dom, a| cm.config.allows(dom, a);
        if !allowed(domid, peer) {
            return Err(DeviceError::ConnectionRefused(qp.0, "peer not allowed"));
        }
        let max = (cm.config.max_ird, cm.config.max_ord);
        if cm.config.addrs.contains(&peer.ip()) {
            // Intra-host: the listener of this device on that port, if any.
            let me = SocketAddr::new(peer.ip(), 0);
            let mut info = CmInfo {
                local: me,
                peer,
                private_data: Vec::new(),
                ird: max.0,
                ord: max.1,
            };
            let listener = t.cm.ports.get(&peer.port()).copied().filter(|l| {
                t.cm.listeners
                    .get(l)
                    .is_some_and(|x| x.addr.ip().is_unspecified() || x.addr.ip() == peer.ip())
            });
            // A listener with room in its backlog whose domain accepts this peer; otherwise
            // the answer a TCP RST (nobody listens) or a refusal would give.
            let listener = listener.filter(|l| {
                let x = &t.cm.listeners[l];
                x.requests.len() < x.backlog as usize && allowed(x.domid, me)
            });
            let Some(l) = listener else {
                t.cm.qps.insert(
                    qp,
                    QpCm {
                        ch,
                        info,
                        phase: Phase::Ended,
                    },
                );
                drop(t);
                q.fail(None);
                q.ch.event(EventKind::ConnectRejected, qp.0, 0);
                return Ok(());
            };
            let x = &t.cm.listeners[&l];
            let lch = x.ch;
            let req = ConnRequestId(t.id());
            let rinfo = CmInfo {
                local: peer,
                peer: me,
                private_data: private_data.to_vec(),
                ird: max.0,
                ord: max.1,
            };
            info.private_data.clear();
            t.cm.requests.insert(
                req,
                Request {
                    listener: l,
                    ch: lch,
                    from: Origin::Local(qp),
                    info: rinfo,
                    delivered: false,
                    kept: false,
                },
            );
            if let Some(x) = t.cm.listeners.get_mut(&l) {
                x.requests.insert(req);
            }
            t.cm.qps.insert(
                qp,
                QpCm {
                    ch,
                    info,
                    phase: Phase::ConnectingLocal(req),
                },
            );
            let lc = t.channels.get(&lch).map(|e| e.ch.clone());
            drop(t);
            if let Some(lc) = lc {
                lc.event(EventKind::ConnectRequest, l.0, u64::from(req.0));
            }
            return Ok(());
        }
        let Some(src) = cm
            .config
            .addrs
            .iter()
            .copied()
            .find(|a| a.is_ipv4() == peer.is_ipv4())
        else {
            return Err(inval(format!(
                "the device has no address of {peer}'s family"
            )));
        };
        let conn = cm.tcp.next_conn();
        t.cm.conns.insert(conn, ConnUse::Qp(qp));
        t.cm.qps.insert(
            qp,
            QpCm {
                ch,
                info: CmInfo {
                    local: SocketAddr::new(src, 0),
                    peer,
                    private_data: Vec::new(),
                    ird: 0,
                    ord: 0,
                },
                phase: Phase::ConnectingRemote(conn),
            },
        );
        q.set_state(QpState::Rtr);
        cm.tcp.send(Cmd::Connect {
            conn,
            src,
            peer,
            private_data: private_data.to_vec(),
        });
        Ok(())
    }

    pub(super) fn cm_accept_impl(
        &self,
        ch: ChannelId,
        req: ConnRequestId,
        qp: QpNum,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        check_pd(private_data)?;
        let cm = self.cm()?;
        let mut t = self.tables();
        match t.cm.requests.get(&req) {
            Some(r) if r.ch == ch => {}
            _ => return Err(bad("connection request", req.0)),
        }
        let q = free_qp(&mut t, ch, qp)?;
        let Some(r) = self.inner.take_request_locked(&mut t, req) else {
            return Err(bad("connection request", req.0));
        };
        match r.from {
            Origin::Local(init) => {
                let iq = t.qps.get(&init).cloned().filter(|iq| {
                    matches!(iq.state(), QpState::Reset | QpState::Init | QpState::Rtr)
                        && lock(&iq.send).peer_num.is_none()
                });
                let Some(iq) = iq else {
                    // The requester gave up (its QP left Init): nothing to pair with.
                    if let Some(c) = t.cm.qps.get_mut(&init) {
                        c.phase = Phase::Ended;
                    }
                    return Err(DeviceError::ConnectionRefused(
                        qp.0,
                        "the requester went away",
                    ));
                };
                if let Some(icm) = t.cm.qps.get_mut(&init) {
                    icm.phase = Phase::Connected;
                    icm.info.private_data = private_data.to_vec();
                }
                t.cm.qps.insert(
                    qp,
                    QpCm {
                        ch,
                        info: r.info,
                        phase: Phase::Connected,
                    },
                );
                // Pair them as connect_qp does when both ends named each other.
                {
                    let mut a = lock(&iq.send);
                    a.peer_num = Some(qp);
                    a.peer = Some(Arc::downgrade(&q));
                }
                {
                    let mut b = lock(&q.send);
                    b.peer_num = Some(init);
                    b.peer = Some(Arc::downgrade(&iq));
                }
                // Both QPs are in RTS before either end hears of it: an end that sends as soon
                // as it is established must find its peer ready (not RetryExceeded). All under
                // the tables' lock, which a Disconnect takes: it comes before or after the
                // whole, so it is never undone (a QP already in Error stays there and its end
                // hears no QpEstablished) and never told before the QpEstablished.
                let moved = [iq.advance(QpState::Rts), q.advance(QpState::Rts)];
                for ((a, b), moved) in [(&iq, &q), (&q, &iq)].into_iter().zip(moved) {
                    if moved {
                        a.ch.event(EventKind::QpEstablished, a.num.0, u64::from(b.num.0));
                    }
                    a.ch.engine.wake();
                }
                drop(t);
            }
            Origin::Remote(conn) => {
                t.cm.conns.insert(conn, ConnUse::Qp(qp));
                t.cm.qps.insert(
                    qp,
                    QpCm {
                        ch,
                        info: r.info,
                        phase: Phase::Accepting(conn),
                    },
                );
                q.set_state(QpState::Rtr);
                cm.tcp.send(Cmd::Accept {
                    conn,
                    private_data: private_data.to_vec(),
                });
            }
        }
        Ok(())
    }

    pub(super) fn cm_reject_impl(
        &self,
        ch: ChannelId,
        req: ConnRequestId,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        check_pd(private_data)?;
        self.cm()?;
        let mut t = self.tables();
        match t.cm.requests.get(&req) {
            Some(r) if r.ch == ch => {}
            _ => return Err(bad("connection request", req.0)),
        }
        self.inner.reject_request_locked(&mut t, req, private_data);
        Ok(())
    }

    pub(super) fn cm_disconnect_impl(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<()> {
        let cm = self.cm()?;
        let mut t = self.tables();
        if !entry(&mut t, ch)?.qps.contains_key(&qp) {
            return Err(bad("QP", qp.0));
        }
        let q = t.qps.get(&qp).ok_or(bad("QP", qp.0))?.clone();
        let phase = match t.cm.qps.get_mut(&qp) {
            Some(c) => std::mem::replace(&mut c.phase, Phase::Ended),
            None => {
                let s = lock(&q.send);
                if s.peer.is_some() {
                    // Paired with connect_qp: a connection all the same.
                    Phase::Connected
                } else if s.peer_num.is_some() {
                    // Half-paired with connect_qp: it named its peer, which has not named it
                    // back. Abandoned: the QP goes to Error (its work requests flush, as on
                    // a move to ERR) and its deferred Connect is answered "refused". Failed
                    // under the tables' lock, so the peer's connect_qp cannot pair with it
                    // meanwhile (it pairs only with a QP in Rtr).
                    drop(s);
                    q.fail(None);
                    drop(t);
                    return Ok(());
                } else {
                    return Err(inval("the QP has no connection"));
                }
            }
        };
        match phase {
            Phase::Ended => return Ok(()),
            Phase::ConnectingLocal(req) => {
                self.inner.take_request_locked(&mut t, req);
                drop(t);
                q.fail(None);
                q.ch.event(EventKind::ConnectUnreachable, qp.0, 0);
            }
            Phase::ConnectingRemote(conn) | Phase::Accepting(conn) => {
                t.cm.conns.remove(&conn);
                cm.tcp.send(Cmd::Abort { conn });
                drop(t);
                q.fail(None);
                q.ch.event(EventKind::ConnectUnreachable, qp.0, 0);
            }
            Phase::Connected => {
                let peer = lock(&q.send).peer.as_ref().and_then(|w| w.upgrade());
                if let Some(p) = &peer {
                    if let Some(pc) = t.cm.qps.get_mut(&p.num) {
                        pc.phase = Phase::Ended;
                    }
                }
                drop(t);
                if let Some(r) = q.remote.get() {
                    // Over TCP: the data path closes the stream and tells this end once.
                    super::iwarp::qp::disconnect(&q, r);
                } else {
                    q.fail(Some(EventKind::QpDisconnected));
                    if let Some(p) = peer.filter(|p| p.num != qp) {
                        p.fail(Some(EventKind::QpDisconnected));
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn cm_request_info_impl(
        &self,
        ch: ChannelId,
        req: ConnRequestId,
    ) -> DeviceResult<CmInfo> {
        self.cm()?;
        let mut t = self.tables();
        match t.cm.requests.get_mut(&req) {
            Some(r) if r.ch == ch => {
                r.delivered = true;
                Ok(r.info.clone())
            }
            _ => Err(bad("connection request", req.0)),
        }
    }

    pub(super) fn cm_qp_info_impl(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<CmInfo> {
        self.cm()?;
        let t = self.tables();
        match t.cm.qps.get(&qp) {
            Some(c) if c.ch == ch => Ok(c.info.clone()),
            _ => Err(bad("QP connection", qp.0)),
        }
    }
}

/// Waits (bounded) until the thread closed a listener's sockets.
pub(super) fn wait_closed(closed: Option<Receiver<()>>) {
    if let Some(rx) = closed {
        if rx.recv_timeout(Duration::from_secs(5)).is_err() {
            tracing::warn!("the connection manager did not close a listener in time");
        }
    }
}

/// Binds `port` (0: one the kernel picks, the same on every address) on every address.
fn bind_all(
    ips: &[IpAddr],
    port: u16,
    taken: &HashMap<u16, ListenerId>,
) -> DeviceResult<Vec<TcpListener>> {
    let bind = |ip: IpAddr, port: u16| -> DeviceResult<TcpListener> {
        let l = TcpListener::bind(SocketAddr::new(ip, port)).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => DeviceError::Busy("port"),
            std::io::ErrorKind::AddrNotAvailable => {
                inval(format!("{ip} is not an address of this host"))
            }
            _ => DeviceError::NoResources("sockets"),
        })?;
        l.set_nonblocking(true)
            .map_err(|_| DeviceError::NoResources("sockets"))?;
        Ok(l)
    };
    // With port 0 the port the first address got may be taken on another: try a few.
    for _ in 0..8 {
        let first = bind(ips[0], port)?;
        let chosen = first
            .local_addr()
            .map_err(|_| DeviceError::NoResources("sockets"))?
            .port();
        if taken.contains_key(&chosen) {
            continue;
        }
        let mut all = vec![first];
        let mut ok = true;
        for ip in &ips[1..] {
            match bind(*ip, chosen) {
                Ok(l) => all.push(l),
                Err(DeviceError::Busy(_)) if port == 0 => {
                    ok = false;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if ok {
            return Ok(all);
        }
    }
    Err(DeviceError::Busy("port"))
}

impl Inner {
    /// Removes a request (from its listener too) and releases its handle.
    fn take_request_locked(&self, t: &mut Tables, req: ConnRequestId) -> Option<Request> {
        let r = t.cm.requests.remove(&req)?;
        if let Some(l) = t.cm.listeners.get_mut(&r.listener) {
            l.requests.remove(&req);
        }
        if let Origin::Remote(conn) = r.from {
            t.cm.conns.remove(&conn);
        }
        t.handles.release(req.0);
        Some(r)
    }

    /// Rejects a waiting request: a local requester gets `ConnectRejected`, a remote one an
    /// MPA reject.
    fn reject_request_locked(&self, t: &mut Tables, req: ConnRequestId, pd: &[u8]) {
        let Some(r) = self.take_request_locked(t, req) else {
            return;
        };
        match r.from {
            Origin::Local(init) => {
                if let Some(c) = t.cm.qps.get_mut(&init) {
                    c.phase = Phase::Ended;
                    c.info.private_data = pd.to_vec();
                }
                if let Some(iq) = t.qps.get(&init).cloned() {
                    iq.fail(None);
                    iq.ch.event(EventKind::ConnectRejected, init.0, 0);
                }
            }
            Origin::Remote(conn) => {
                if let Some(cm) = self.cm.get() {
                    cm.tcp.send(Cmd::Reject {
                        conn,
                        private_data: pd.to_vec(),
                    });
                }
            }
        }
    }

    /// Closes a listener: its requests the guest has not taken are rejected (those it took
    /// stay until answered or the channel closes, up to [`CmConfig::max_kept_requests`] per
    /// domain), its sockets closed by the thread (wait
    /// for the answer with [`wait_closed`], without the table lock: the thread may need it).
    fn close_listener_locked(&self, t: &mut Tables, l: ListenerId) -> Option<Receiver<()>> {
        let x = t.cm.listeners.remove(&l)?;
        if t.cm.ports.get(&x.addr.port()) == Some(&l) {
            t.cm.ports.remove(&x.addr.port());
        }
        let closed = self.cm.get().map(|cm| {
            let (done, closed) = channel();
            cm.tcp.send(Cmd::CloseListener { id: l.0, done });
            closed
        });
        // Kept already by the channel's domain (all its channels: a guest cannot open
        // channels to keep more).
        let dom = t.channels.get(&x.ch).map(|c| c.ch.domid);
        let already =
            t.cm.requests
                .values()
                .filter(|r| r.kept && t.channels.get(&r.ch).map(|c| c.ch.domid) == dom)
                .count();
        let (taken, untaken): (Vec<ConnRequestId>, Vec<ConnRequestId>) = x
            .requests
            .iter()
            .partition(|req| t.cm.requests.get(req).is_some_and(|r| r.delivered));
        let max = self.cm.get().map_or(0, |cm| cm.config.max_kept_requests);
        let (kept, over) = kept_at_close(taken, already, max);
        for req in kept {
            if let Some(r) = t.cm.requests.get_mut(&req) {
                r.kept = true;
            }
        }
        if !over.is_empty() {
            tracing::info!(
                ch = x.ch.0,
                rejected = over.len(),
                max,
                "closing a listener: a domain keeps {max} taken requests at most"
            );
        }
        for req in untaken.into_iter().chain(over) {
            self.reject_request_locked(t, req, &[]);
        }
        t.handles.release(l.0);
        closed
    }

    /// A channel closes: its listeners close and its requests are rejected (also those that
    /// outlived their listener). Wait for the answers with [`wait_closed`] after dropping the
    /// table lock.
    pub(super) fn cm_close_channel_locked(
        &self,
        t: &mut Tables,
        ch: ChannelId,
    ) -> Vec<Receiver<()>> {
        let mine: Vec<ListenerId> =
            t.cm.listeners
                .iter()
                .filter(|(_, l)| l.ch == ch)
                .map(|(id, _)| *id)
                .collect();
        let closed = mine
            .into_iter()
            .filter_map(|l| self.close_listener_locked(t, l))
            .collect();
        let kept: Vec<ConnRequestId> =
            t.cm.requests
                .iter()
                .filter(|(_, r)| r.ch == ch)
                .map(|(id, _)| *id)
                .collect();
        for req in kept {
            self.reject_request_locked(t, req, &[]);
        }
        closed
    }

    /// A QP is destroyed: its connect or accept in progress ends.
    pub(super) fn cm_forget_qp_locked(&self, t: &mut Tables, qp: QpNum) {
        let Some(c) = t.cm.qps.remove(&qp) else {
            return;
        };
        match c.phase {
            Phase::ConnectingLocal(req) => {
                self.take_request_locked(t, req);
            }
            Phase::ConnectingRemote(conn) | Phase::Accepting(conn) => {
                t.cm.conns.remove(&conn);
                if let Some(cm) = self.cm.get() {
                    cm.tcp.send(Cmd::Abort { conn });
                }
            }
            Phase::Connected | Phase::Ended => {}
        }
    }

    /// The connection-manager thread reports.
    fn cm_upcall(&self, u: Upcall) {
        let Some(cm) = self.cm.get() else { return };
        let mut t = lock(&self.tables);
        match u {
            Upcall::Request {
                listener,
                conn,
                info,
            } => {
                let l = ListenerId(listener);
                let allowed = |dom, a| cm.config.allows(dom, a);
                let refuse = match t.cm.listeners.get(&l) {
                    None => Some("no listener"),
                    Some(x) if !allowed(x.domid, info.peer) => Some("peer not allowed"),
                    Some(x) if x.requests.len() >= x.backlog as usize => Some("backlog full"),
                    Some(_) => None,
                };
                if let Some(why) = refuse {
                    tracing::debug!(listener, peer = %info.peer, "connection request refused: {why}");
                    cm.tcp.send(Cmd::Reject {
                        conn,
                        private_data: Vec::new(),
                    });
                    return;
                }
                let lch = t.cm.listeners[&l].ch;
                let req = ConnRequestId(t.id());
                t.cm.conns.insert(conn, ConnUse::Request(req));
                t.cm.requests.insert(
                    req,
                    Request {
                        listener: l,
                        ch: lch,
                        from: Origin::Remote(conn),
                        info,
                        delivered: false,
                        kept: false,
                    },
                );
                if let Some(x) = t.cm.listeners.get_mut(&l) {
                    x.requests.insert(req);
                }
                let c = t.channels.get(&lch).map(|e| e.ch.clone());
                drop(t);
                if let Some(c) = c {
                    c.event(EventKind::ConnectRequest, listener, u64::from(req.0));
                }
            }
            Upcall::Established { conn, est } => {
                let Some(ConnUse::Qp(qp)) = t.cm.conns.remove(&conn) else {
                    return; // aborted meanwhile: dropping `est` closes the connection
                };
                let Some(c) = t.cm.qps.get_mut(&qp) else {
                    return;
                };
                let ch = c.ch;
                if est.role == super::super::iwarp::Role::Initiator {
                    c.info.private_data = est.peer_private.clone();
                }
                c.info.local = est.local;
                c.info.peer = est.peer;
                c.info.ird = est.ord;
                c.info.ord = est.ird;
                c.phase = Phase::Connected;
                drop(t);
                self.cm_attach(ch, qp, est);
            }
            Upcall::Rejected { conn, private_data } => {
                if let Some(ConnUse::Qp(qp)) = t.cm.conns.remove(&conn) {
                    if let Some(c) = t.cm.qps.get_mut(&qp) {
                        c.phase = Phase::Ended;
                        c.info.private_data = private_data;
                    }
                    let q = t.qps.get(&qp).cloned();
                    drop(t);
                    if let Some(q) = q {
                        q.fail(None);
                        q.ch.event(EventKind::ConnectRejected, qp.0, 0);
                    }
                }
            }
            Upcall::Failed { conn, why } => match t.cm.conns.get(&conn).copied() {
                Some(ConnUse::Request(req)) => {
                    tracing::debug!(req = req.0, "connection request withdrawn: {why}");
                    self.take_request_locked(&mut t, req);
                }
                Some(ConnUse::Qp(qp)) => {
                    t.cm.conns.remove(&conn);
                    tracing::debug!(qp = qp.0, "connect failed: {why}");
                    if let Some(c) = t.cm.qps.get_mut(&qp) {
                        c.phase = Phase::Ended;
                    }
                    let q = t.qps.get(&qp).cloned();
                    drop(t);
                    if let Some(q) = q {
                        q.fail(None);
                        q.ch.event(EventKind::ConnectUnreachable, qp.0, 0);
                    }
                }
                None => {}
            },
        }
    }

    /// Gives an established connection to the data path; if it refuses, the QP goes to
    /// Error with `ConnectUnreachable` (and the connection closes with `est`).
    fn cm_attach(&self, ch: ChannelId, qp: QpNum, est: Established) {
        if let Err(e) = self.attach_stream(ch, qp, est) {
            tracing::debug!(ch = ch.0, qp = qp.0, "attaching the connection failed: {e}");
            let mut t = lock(&self.tables);
            if let Some(c) = t.cm.qps.get_mut(&qp) {
                c.phase = Phase::Ended;
            }
            let q = t.qps.get(&qp).cloned();
            drop(t);
            if let Some(q) = q {
                q.fail(None);
                q.ch.event(EventKind::ConnectUnreachable, qp.0, 0);
            }
        }
    }
}
