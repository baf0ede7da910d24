//! The verbs device's connection manager: the `cm_*` calls of [`Device`] (rdma_cm semantics,
//! docs/protocol.md "Connection management: control ops") on rdma-core's librdmacm in dom0.
//!
//! * librdmacm is loaded at run time ([`RdmaCm::open`]: `librdmacm.so.1`, or
//!   `$VRDMA_LIBRDMACM`); a host without it starts the device without a connection manager
//!   and says which package to install (`librdmacm1`).
//! * One `rdma_cm_id` per listener, per waiting request and per connecting or connected QP,
//!   all on one event channel read by one thread (`vrdma-cm-<ibdev>`).
//! * The relay owns the HCA QP made for the guest QP, so the ids carry no QP (`id->qp` is
//!   NULL): the QP number goes in `rdma_conn_param.qp_num`, and the QP is moved to RTR/RTS
//!   here with the attributes `rdma_init_qp_attr` gives — before `rdma_accept` on the
//!   passive side, on `RDMA_CM_EVENT_CONNECT_RESPONSE` (then `rdma_establish`) on the active
//!   side, as librdmacm does itself for an id that has a QP.
//! * Events map onto the guest's event ring as the software device's do: `ConnectRequest`
//!   at the listener, `QpEstablished` (detail: the peer's QP number) on both ends,
//!   `ConnectRejected` (the peer rejected, or nothing listens: IB CM's reject),
//!   `ConnectUnreachable` (address, route or connect error, no answer, abandoned connect),
//!   `QpDisconnected`. A QP whose connect failed or whose connection ended is in Error.
//! * Policy: the control service checks `[cm]`'s port rules, quotas and allowed peers on every
//!   listen and connect whatever the device (`control::service`); this device also asks
//!   [`CmConfig::allows`] (built by `Config::cm_device_config` from the same policy) on every
//!   connect and every incoming request, as the software device does.
//!
//! IB CM private data has fixed sizes: a request carries at most 56 bytes, a reply 196, a
//! reject 148, and the receiver gets the whole field (the sender's bytes, then zeros) — what
//! rdma_cm reports on RoCE and InfiniBand.
//!
//! Lock order: the connection manager's table, then the device's (`tables`, a channel's
//! `res`, a QP's `state`). `destroy_qp` and `close_channel` call in here before taking theirs.
//!
//! This is a child module of `device` (it works on the device's private types).

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ptr::NonNull;

use verbs_abi::cma::*;

use super::*;
use crate::device::{CmConfig, CmInfo, ConnRequestId, ListenerId, MAX_PRIVATE_DATA};

/// The soname loaded when `$VRDMA_LIBRDMACM` is not set.
pub const LIBRDMACM_SONAME: &str = "librdmacm.so.1";
/// Overrides the path of librdmacm.
pub const LIBRDMACM_ENV: &str = "VRDMA_LIBRDMACM";

/// IB CM private data of a request (92 bytes less rdma_cm's 36-byte header), a reply and a
/// reject.
pub const REQ_PRIVATE_DATA: usize = 56;
pub const REP_PRIVATE_DATA: usize = 196;
pub const REJ_PRIVATE_DATA: usize = 148;

const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;
const EADDRINUSE: i32 = 98;
const EAGAIN: i32 = 11;
/// Most requests a listener keeps waiting, whatever the backlog asked.
const MAX_BACKLOG: u32 = 1024;
/// The event thread's stop waker.
const STOP: Token = Token(0);
const EVENTS: Token = Token(1);

type Sa = *mut sockaddr;

struct CmFns {
    create_event_channel: unsafe extern "C" fn() -> *mut rdma_event_channel,
    destroy_event_channel: unsafe extern "C" fn(*mut rdma_event_channel),
    create_id: unsafe extern "C" fn(
        *mut rdma_event_channel,
        *mut *mut rdma_cm_id,
        *mut c_void,
        rdma_port_space,
    ) -> c_int,
    destroy_id: unsafe extern "C" fn(*mut rdma_cm_id) -> c_int,
    bind_addr: unsafe extern "C" fn(*mut rdma_cm_id, Sa) -> c_int,
    listen: unsafe extern "C" fn(*mut rdma_cm_id, c_int) -> c_int,
    resolve_addr: unsafe extern "C" fn(*mut rdma_cm_id, Sa, Sa, c_int) -> c_int,
    resolve_route: unsafe extern "C" fn(*mut rdma_cm_id, c_int) -> c_int,
    connect: unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int,
    accept: unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int,
    reject: unsafe extern "C" fn(*mut rdma_cm_id, *const c_void, u8) -> c_int,
    disconnect: unsafe extern "C" fn(*mut rdma_cm_id) -> c_int,
    establish: unsafe extern "C" fn(*mut rdma_cm_id) -> c_int,
    get_cm_event: unsafe extern "C" fn(*mut rdma_event_channel, *mut *mut rdma_cm_event) -> c_int,
    ack_cm_event: unsafe extern "C" fn(*mut rdma_cm_event) -> c_int,
    init_qp_attr: unsafe extern "C" fn(*mut rdma_cm_id, *mut ibv_qp_attr, *mut c_int) -> c_int,
}

/// librdmacm, loaded at run time.
pub struct RdmaCm {
    fns: CmFns,
    // Dropped last (field order): the function pointers point into it.
    _lib: libloading::Library,
}

impl RdmaCm {
    /// Loads `$VRDMA_LIBRDMACM` if set, else `librdmacm.so.1`.
    pub fn open() -> Result<RdmaCm, VerbsError> {
        let path = match std::env::var_os(LIBRDMACM_ENV) {
            Some(p) if !p.is_empty() => p,
            _ => LIBRDMACM_SONAME.into(),
        };
        let shown = std::path::Path::new(&path).display().to_string();
        // SAFETY: loading runs librdmacm's initialisers, which set up its own state only;
        // RTLD_NOW resolves everything up front so a broken install fails here.
        let lib = unsafe {
            libloading::os::unix::Library::open(
                Some(&path),
                libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_LOCAL,
            )
        }
        .map_err(|e| VerbsError::RdmacmMissing {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let lib: libloading::Library = lib.into();
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: looked up by its C name and given the C signature rdma_cma.h
                // declares (the structures' layouts are checked by verbs-abi's C test); used
                // only while `_lib` keeps the library mapped.
                let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                    VerbsError::Symbol {
                        path: shown.clone(),
                        symbol: $name,
                        reason: e.to_string(),
                    }
                })?;
                *s
            }};
        }
        let fns = CmFns {
            create_event_channel: sym!("rdma_create_event_channel"),
            destroy_event_channel: sym!("rdma_destroy_event_channel"),
            create_id: sym!("rdma_create_id"),
            destroy_id: sym!("rdma_destroy_id"),
            bind_addr: sym!("rdma_bind_addr"),
            listen: sym!("rdma_listen"),
            resolve_addr: sym!("rdma_resolve_addr"),
            resolve_route: sym!("rdma_resolve_route"),
            connect: sym!("rdma_connect"),
            accept: sym!("rdma_accept"),
            reject: sym!("rdma_reject"),
            disconnect: sym!("rdma_disconnect"),
            establish: sym!("rdma_establish"),
            get_cm_event: sym!("rdma_get_cm_event"),
            ack_cm_event: sym!("rdma_ack_cm_event"),
            init_qp_attr: sym!("rdma_init_qp_attr"),
        };
        Ok(RdmaCm { fns, _lib: lib })
    }
}

/// librdmacm returns -1 with errno set.
fn cm_call(op: &'static str, rc: c_int) -> Result<(), VerbsError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(VerbsError::call(op, super::super::dl::rc_error(rc)))
    }
}

/// An `rdma_cm_id` this module created or was given (owned: destroyed exactly once, by
/// [`Shared::destroy`]).
struct Id(NonNull<rdma_cm_id>);

// SAFETY: librdmacm ids may be used from any thread (librdmacm locks internally); the handle
// is only passed to librdmacm calls and read for its device and addresses.
unsafe impl Send for Id {}

impl Id {
    fn key(&self) -> usize {
        self.0.as_ptr() as usize
    }
    fn raw(&self) -> *mut rdma_cm_id {
        self.0.as_ptr()
    }
}

/// A socket address in the C layout rdma_cm takes.
fn to_c(a: SocketAddr) -> rdma_sockaddr {
    match a {
        SocketAddr::V4(v) => rdma_sockaddr {
            sin: sockaddr_in {
                sin_family: AF_INET,
                sin_port: v.port().to_be(),
                sin_addr: u32::from_ne_bytes(v.ip().octets()),
                sin_zero: [0; 8],
            },
        },
        SocketAddr::V6(v) => rdma_sockaddr {
            sin6: sockaddr_in6 {
                sin6_family: AF_INET6,
                sin6_port: v.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: v.ip().octets(),
                sin6_scope_id: v.scope_id(),
            },
        },
    }
}

/// The address in a C socket address (`None` for another family).
fn from_c(a: &rdma_sockaddr) -> Option<SocketAddr> {
    // SAFETY: every member of the union starts with the 16-bit family; the member read next
    // is the one the family names, and all of them are plain data.
    unsafe {
        match a.addr.sa_family {
            AF_INET => Some(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(a.sin.sin_addr.to_ne_bytes())),
                u16::from_be(a.sin.sin_port),
            )),
            AF_INET6 => {
                let ip = Ipv6Addr::from(a.sin6.sin6_addr);
                let ip = match ip.to_ipv4_mapped() {
                    Some(v4) => IpAddr::V4(v4),
                    None => IpAddr::V6(ip),
                };
                Some(SocketAddr::new(ip, u16::from_be(a.sin6.sin6_port)))
            }
            _ => None,
        }
    }
}

/// The addresses of a live id: (local, peer).
fn addrs_of(id: *mut rdma_cm_id) -> (Option<SocketAddr>, Option<SocketAddr>) {
    // SAFETY: a live id (the caller's); its route is plain data librdmacm keeps updated.
    let r = unsafe { &(*id).route.addr };
    (from_c(&r.src), from_c(&r.dst))
}

/// The name of the RDMA device an id is bound to, if any.
fn device_of(id: *mut rdma_cm_id) -> Option<String> {
    // SAFETY: a live id; `verbs` is NULL or librdmacm's open context of the device, whose
    // `device` stays valid while the id lives.
    unsafe {
        let v = (*id).verbs;
        if v.is_null() || (*v).device.is_null() {
            return None;
        }
        Some(super::super::c_string(&(*(*v).device).name))
    }
}

/// The IP addresses in a port's GID table (RoCE: IPv4-mapped and global IPv6 GIDs).
fn gid_addrs(ctx: &Context, port: u8) -> Vec<IpAddr> {
    let n = ctx.query_port(port).map(|p| p.gid_tbl_len).unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..n.min(256) {
        let Ok(g) = ctx.query_gid(port, i) else {
            continue;
        };
        let ip = Ipv6Addr::from(g.raw());
        let ip = match ip.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None if ip.is_unspecified() || ip.segments()[0] & 0xffc0 == 0xfe80 => continue,
            None => IpAddr::V6(ip),
        };
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// `rdma_resolve_addr`/`rdma_resolve_route` under way.
    Resolving,
    /// `rdma_connect` sent, waiting for the reply.
    Connecting,
    /// `rdma_accept` sent, waiting for the RTU.
    Accepting,
    Connected,
    /// Rejected, unreachable or disconnected (the id is gone).
    Ended,
}

#[derive(Clone, Copy)]
enum Owner {
    Listener(ListenerId),
    Request(ConnRequestId),
    Qp(QpNum),
}

struct Listener {
    ch: ChannelId,
    domid: DomId,
    id: Id,
    addr: SocketAddr,
    backlog: u32,
    requests: HashSet<ConnRequestId>,
}

struct Request {
    listener: ListenerId,
    ch: ChannelId,
    id: Id,
    info: CmInfo,
    peer_qpn: u32,
    /// The guest asked its `CmInfo` (took the request): it outlives its listener.
    delivered: bool,
    /// The listener's domain (kept requests are bounded per domain).
    domid: DomId,
    /// Its listener closed after the guest took it: counted against the domain's
    /// [`CmConfig::max_kept_requests`].
    kept: bool,
}

struct QpConn {
    ch: ChannelId,
    id: Option<Id>,
    phase: Phase,
    info: CmInfo,
    /// Connecting: the request's private data, sent once the route is resolved.
    request: Vec<u8>,
    peer_qpn: u32,
}

#[derive(Default)]
struct CmState {
    next: u32,
    ids: HashMap<usize, Owner>,
    listeners: HashMap<ListenerId, Listener>,
    requests: HashMap<ConnRequestId, Request>,
    qps: HashMap<QpNum, QpConn>,
}

impl CmState {
    fn id(&mut self) -> u32 {
        self.next = self.next.wrapping_add(1).max(1);
        self.next
    }

    /// The `CmInfo` of request `req` of channel `ch`, which the guest thereby takes.
    fn take_info(&mut self, ch: ChannelId, req: ConnRequestId) -> Option<CmInfo> {
        match self.requests.get_mut(&req) {
            Some(r) if r.ch == ch => {
                r.delivered = true;
                Some(r.info.clone())
            }
            _ => None,
        }
    }

    /// Removes listener `l`; returns it with its requests the guest has not taken, which the
    /// caller rejects. The taken ones stay until the guest answers them or closes its
    /// channel, as rdma_cm keeps a request id handed to the program after its listening id
    /// is destroyed (protocol.md, "Connection management: control ops").
    /// A domain keeps at most `max_kept` taken requests of closed listeners, over all its
    /// channels ([`CmConfig::max_kept_requests`]); those over it are rejected too.
    fn close_listener(
        &mut self,
        l: ListenerId,
        max_kept: usize,
    ) -> Option<(Listener, Vec<ConnRequestId>)> {
        let x = self.listeners.remove(&l)?;
        self.ids.remove(&x.id.key());
        let already = self
            .requests
            .values()
            .filter(|r| r.kept && r.domid == x.domid)
            .count();
        let (taken, mut rejected): (Vec<ConnRequestId>, Vec<ConnRequestId>) = x
            .requests
            .iter()
            .partition(|r| self.requests.get(r).is_some_and(|r| r.delivered));
        let (kept, over) = crate::device::soft::cm::kept_at_close(taken, already, max_kept);
        for req in kept {
            if let Some(r) = self.requests.get_mut(&req) {
                r.kept = true;
            }
        }
        rejected.extend(over);
        Some((x, rejected))
    }
}

struct Shared {
    lib: RdmaCm,
    /// iWARP (MPA private data: up to [`MAX_PRIVATE_DATA`] each way, delivered exactly)
    /// rather than IB CM's fixed sizes.
    iwarp: bool,
    chan: NonNull<rdma_event_channel>,
    config: CmConfig,
    addrs: Vec<IpAddr>,
    ibdev: String,
    st: Mutex<CmState>,
    stop: AtomicBool,
}

// SAFETY: the event channel is used from any thread through librdmacm (thread-safe); the rest
// is Send + Sync data.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: every id on the channel was destroyed by `VerbsCm::stop`; destroyed once.
        unsafe { (self.lib.fns.destroy_event_channel)(self.chan.as_ptr()) };
    }
}

/// The running connection manager of a [`VerbsDevice`].
pub(super) struct VerbsCm {
    shared: Arc<Shared>,
    waker: mio::Waker,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn refused(qp: QpNum, why: &'static str) -> DeviceError {
    DeviceError::ConnectionRefused(qp.0, why)
}

fn check_len(pd: &[u8], max: usize, what: &str) -> DeviceResult<()> {
    if pd.len() > max.min(MAX_PRIVATE_DATA) {
        return Err(inval(format!(
            "{} bytes of private data in a{what}, at most {max} on this device",
            pd.len()
        )));
    }
    Ok(())
}

fn ms(d: Duration) -> c_int {
    c_int::try_from(d.as_millis()).unwrap_or(c_int::MAX).max(1)
}

impl Shared {
    /// The most private data a message may carry: IB CM's `ib` on RoCE and InfiniBand.
    fn limit(&self, ib: usize) -> usize {
        if self.iwarp {
            MAX_PRIVATE_DATA
        } else {
            ib
        }
    }

    fn destroy(&self, id: Id) {
        // SAFETY: an id of this channel, destroyed once (the `Id` is consumed); its events
        // were acknowledged by the event thread before it took the table lock.
        let rc = unsafe { (self.lib.fns.destroy_id)(id.raw()) };
        if rc != 0 {
            tracing::warn!(err = %super::super::dl::last_errno(), "rdma_destroy_id failed");
        }
    }

    fn create_id(&self) -> DeviceResult<Id> {
        let mut id = std::ptr::null_mut();
        // SAFETY: a live event channel and a valid out-pointer.
        let rc = unsafe {
            (self.lib.fns.create_id)(
                self.chan.as_ptr(),
                &mut id,
                std::ptr::null_mut(),
                RDMA_PS_TCP,
            )
        };
        cm_call("rdma_create_id", rc).map_err(hca_err("rdma_create_id"))?;
        NonNull::new(id)
            .map(Id)
            .ok_or(DeviceError::NoResources("rdma_cm ids"))
    }

    /// `rdma_init_qp_attr` for `state`, applied to the HCA QP.
    fn move_qp(&self, id: &Id, qp: &VQp, state: u32) -> Result<(), VerbsError> {
        let mut attr = ibv_qp_attr {
            qp_state: state,
            ..Default::default()
        };
        let mut mask: c_int = 0;
        // SAFETY: a live id and valid out-structs of the header's layout.
        let rc = unsafe { (self.lib.fns.init_qp_attr)(id.raw(), &mut attr, &mut mask) };
        cm_call("rdma_init_qp_attr", rc)?;
        if mask == 0 {
            // iWARP: iw_cm gives nothing to set, the kernel moves the QP itself.
            return Ok(());
        }
        qp.hca.modify(&attr, u32::try_from(mask).unwrap_or(0))
    }

    /// RTR then RTS with the connection's attributes.
    fn to_rts(&self, id: &Id, qp: &VQp) -> Result<(), VerbsError> {
        self.move_qp(id, qp, IBV_QPS_RTR)?;
        self.move_qp(id, qp, IBV_QPS_RTS)
    }

    fn conn_param(pd: &[u8], qpn: u32) -> rdma_conn_param {
        rdma_conn_param {
            private_data: if pd.is_empty() {
                std::ptr::null()
            } else {
                pd.as_ptr().cast()
            },
            private_data_len: u8::try_from(pd.len()).unwrap_or(u8::MAX),
            responder_resources: RDMA_MAX_RESP_RES,
            initiator_depth: RDMA_MAX_INIT_DEPTH,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: 0,
            qp_num: qpn,
        }
    }

    fn qp_of(inner: &Inner, ch: ChannelId, qp: QpNum) -> Option<(Arc<VChan>, Arc<VQp>)> {
        let c = inner.chan(ch).ok()?;
        let q = lock(&c.res).qps.get(&qp).cloned()?;
        Some((c, q))
    }

    /// Ends a QP's connect or connection: id gone, QP in Error, `kind` posted.
    fn end_qp(&self, inner: &Inner, st: &mut CmState, qp: QpNum, kind: EventKind) {
        let Some(qc) = st.qps.get_mut(&qp) else {
            return;
        };
        if qc.phase == Phase::Ended {
            return;
        }
        qc.phase = Phase::Ended;
        let ch = qc.ch;
        if let Some(id) = qc.id.take() {
            st.ids.remove(&id.key());
            self.destroy(id);
        }
        if let Some((c, q)) = Self::qp_of(inner, ch, qp) {
            fail_qp(&c, &q, false);
            c.post(&EventRepr {
                kind,
                handle: qp.0,
                detail: 0,
            });
        }
        inner.poke();
    }

    fn drop_request(&self, st: &mut CmState, req: ConnRequestId, reject: bool) {
        let Some(r) = st.requests.remove(&req) else {
            return;
        };
        st.ids.remove(&r.id.key());
        if let Some(l) = st.listeners.get_mut(&r.listener) {
            l.requests.remove(&req);
        }
        if reject {
            // SAFETY: a live id of a connect request; no private data.
            unsafe { (self.lib.fns.reject)(r.id.raw(), std::ptr::null(), 0) };
        }
        self.destroy(r.id);
    }

    // ---- the event thread -----------------------------------------------------------------

    fn run(self: Arc<Self>, inner: Arc<Inner>, mut poll: Poll) {
        let mut events = Events::with_capacity(8);
        while !self.stop.load(Ordering::SeqCst) {
            for _ in 0..64 {
                let mut ev = std::ptr::null_mut();
                // SAFETY: a live channel (non-blocking fd) and a valid out-pointer.
                let rc = unsafe { (self.lib.fns.get_cm_event)(self.chan.as_ptr(), &mut ev) };
                if rc != 0 || ev.is_null() {
                    let e = super::super::dl::last_errno();
                    if e.raw_os_error() != Some(EAGAIN) {
                        tracing::warn!("rdma_get_cm_event: {e}");
                    }
                    break;
                }
                // Copied, then acknowledged before any lock is taken (`rdma_destroy_id`
                // waits for its id's events to be acknowledged).
                // SAFETY: the event librdmacm just returned, valid until acknowledged.
                let e = unsafe { Event::copy(ev) };
                // SAFETY: the event just returned, acknowledged once.
                unsafe { (self.lib.fns.ack_cm_event)(ev) };
                self.handle(&inner, e);
            }
            if let Err(e) = poll.poll(&mut events, Some(Duration::from_millis(500))) {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!("verbs cm: poll failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    fn handle(&self, inner: &Inner, e: Event) {
        let mut st = lock(&self.st);
        if e.kind == RDMA_CM_EVENT_CONNECT_REQUEST {
            return self.request(inner, &mut st, e);
        }
        let owner = st.ids.get(&e.id).copied();
        tracing::debug!(kind = e.kind, status = e.status, "rdma_cm event");
        match owner {
            Some(Owner::Qp(qp)) => self.qp_event(inner, &mut st, qp, e),
            Some(Owner::Request(req)) => match e.kind {
                // The requester gave up or went away before the answer.
                RDMA_CM_EVENT_DISCONNECTED
                | RDMA_CM_EVENT_CONNECT_ERROR
                | RDMA_CM_EVENT_UNREACHABLE
                | RDMA_CM_EVENT_REJECTED
                | RDMA_CM_EVENT_DEVICE_REMOVAL => self.drop_request(&mut st, req, false),
                _ => {}
            },
            Some(Owner::Listener(_)) | None => {}
        }
    }

    fn request(&self, inner: &Inner, st: &mut CmState, e: Event) {
        // SAFETY: the new id of a connect request, ours from now on (destroyed once below or
        // when the request is answered).
        let id = match NonNull::new(e.id as *mut rdma_cm_id) {
            Some(p) => Id(p),
            None => return,
        };
        let l = match st.ids.get(&e.listen_id) {
            Some(Owner::Listener(l)) => *l,
            _ => {
                // A listener closed meanwhile.
                // SAFETY: a live request id; no private data.
                unsafe { (self.lib.fns.reject)(id.raw(), std::ptr::null(), 0) };
                return self.destroy(id);
            }
        };
        let (local, peer) = addrs_of(id.raw());
        let Some(lst) = st.listeners.get(&l) else {
            // SAFETY: a live request id; no private data.
            unsafe { (self.lib.fns.reject)(id.raw(), std::ptr::null(), 0) };
            return self.destroy(id);
        };
        let peer = peer.unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0));
        let refuse = if !self.config.allows(lst.domid, peer) {
            Some("peer not allowed ([cm] allowed-peers)")
        } else if lst.requests.len() >= lst.backlog as usize {
            Some("backlog full")
        } else {
            None
        };
        if let Some(why) = refuse {
            tracing::info!(listener = l.0, %peer, "connect request refused: {why}");
            // SAFETY: a live request id; no private data.
            unsafe { (self.lib.fns.reject)(id.raw(), std::ptr::null(), 0) };
            return self.destroy(id);
        }
        let ch = lst.ch;
        let domid = lst.domid;
        let local = local.unwrap_or(lst.addr);
        let req = ConnRequestId(st.id());
        st.ids.insert(id.key(), Owner::Request(req));
        if let Some(lst) = st.listeners.get_mut(&l) {
            lst.requests.insert(req);
        }
        st.requests.insert(
            req,
            Request {
                listener: l,
                ch,
                id,
                info: CmInfo {
                    local,
                    peer,
                    private_data: e.private,
                    ird: u16::from(e.responder_resources),
                    ord: u16::from(e.initiator_depth),
                },
                peer_qpn: e.qp_num,
                delivered: false,
                domid,
                kept: false,
            },
        );
        if let Ok(c) = inner.chan(ch) {
            c.post(&EventRepr {
                kind: EventKind::ConnectRequest,
                handle: l.0,
                detail: u64::from(req.0),
            });
        }
    }

    fn qp_event(&self, inner: &Inner, st: &mut CmState, qpn: QpNum, e: Event) {
        let Some(qc) = st.qps.get_mut(&qpn) else {
            return;
        };
        let phase = qc.phase;
        let ch = qc.ch;
        let unreachable =
            |s: &Self, st: &mut CmState| s.end_qp(inner, st, qpn, EventKind::ConnectUnreachable);
        match (e.kind, phase) {
            (RDMA_CM_EVENT_ADDR_RESOLVED, Phase::Resolving) => {
                let Some(id) = qc.id.as_ref() else { return };
                if device_of(id.raw()).as_deref() != Some(self.ibdev.as_str()) {
                    tracing::info!(qp = qpn.0, "the peer's route leaves by another device");
                    return unreachable(self, st);
                }
                let t = ms(self.config.connect_timeout);
                // SAFETY: a live id whose address is resolved.
                let rc = unsafe { (self.lib.fns.resolve_route)(id.raw(), t) };
                if let Err(err) = cm_call("rdma_resolve_route", rc) {
                    tracing::info!(qp = qpn.0, "{err}");
                    unreachable(self, st);
                }
            }
            (RDMA_CM_EVENT_ROUTE_RESOLVED, Phase::Resolving) => {
                let Some(id) = qc.id.as_ref() else { return };
                if let (Some(l), _) = addrs_of(id.raw()) {
                    qc.info.local = l;
                }
                let mut p = Self::conn_param(&qc.request, qpn.0);
                // SAFETY: a live id with its route; the private data outlives the call.
                let rc = unsafe { (self.lib.fns.connect)(id.raw(), &mut p) };
                match cm_call("rdma_connect", rc) {
                    Ok(()) => qc.phase = Phase::Connecting,
                    Err(err) => {
                        tracing::info!(qp = qpn.0, "{err}");
                        unreachable(self, st);
                    }
                }
            }
            (RDMA_CM_EVENT_CONNECT_RESPONSE, Phase::Connecting) => {
                qc.info.private_data = e.private;
                qc.info.ird = u16::from(e.responder_resources);
                qc.info.ord = u16::from(e.initiator_depth);
                qc.peer_qpn = e.qp_num;
                let Some((c, q)) = Self::qp_of(inner, ch, qpn) else {
                    return unreachable(self, st);
                };
                let Some(id) = qc.id.as_ref() else { return };
                let up = self.to_rts(id, &q).and_then(|()| {
                    // SAFETY: a live id whose reply arrived; the QP is in RTS.
                    let rc = unsafe { (self.lib.fns.establish)(id.raw()) };
                    cm_call("rdma_establish", rc)
                });
                if let Err(err) = up {
                    tracing::warn!(qp = qpn.0, "completing the connection: {err}");
                    return unreachable(self, st);
                }
                qc.phase = Phase::Connected;
                established(inner, &c, &q, e.qp_num);
            }
            // iWARP's active side: iw_cm moved the QP to RTS on the MPA reply and reports
            // ESTABLISHED directly (no CONNECT_RESPONSE, no QP numbers on the wire).
            (RDMA_CM_EVENT_ESTABLISHED, Phase::Connecting) => {
                qc.info.private_data = e.private;
                qc.info.ird = u16::from(e.responder_resources);
                qc.info.ord = u16::from(e.initiator_depth);
                qc.peer_qpn = e.qp_num;
                qc.phase = Phase::Connected;
                match Self::qp_of(inner, ch, qpn) {
                    Some((c, q)) => established(inner, &c, &q, e.qp_num),
                    None => unreachable(self, st),
                }
            }
            (RDMA_CM_EVENT_ESTABLISHED, Phase::Accepting) => {
                qc.phase = Phase::Connected;
                let peer = qc.peer_qpn;
                match Self::qp_of(inner, ch, qpn) {
                    Some((c, q)) => established(inner, &c, &q, peer),
                    None => unreachable(self, st),
                }
            }
            (RDMA_CM_EVENT_REJECTED, Phase::Resolving | Phase::Connecting) => {
                tracing::info!(qp = qpn.0, reason = e.status, "connect rejected");
                qc.info.private_data = e.private;
                self.end_qp(inner, st, qpn, EventKind::ConnectRejected);
            }
            (RDMA_CM_EVENT_DISCONNECTED | RDMA_CM_EVENT_DEVICE_REMOVAL, Phase::Connected) => {
                self.end_qp(inner, st, qpn, EventKind::QpDisconnected)
            }
            (
                RDMA_CM_EVENT_ADDR_ERROR
                | RDMA_CM_EVENT_ROUTE_ERROR
                | RDMA_CM_EVENT_UNREACHABLE
                | RDMA_CM_EVENT_CONNECT_ERROR
                | RDMA_CM_EVENT_REJECTED
                | RDMA_CM_EVENT_DISCONNECTED
                | RDMA_CM_EVENT_DEVICE_REMOVAL,
                Phase::Resolving | Phase::Connecting | Phase::Accepting,
            ) => {
                tracing::info!(
                    qp = qpn.0,
                    kind = e.kind,
                    status = e.status,
                    "connect failed"
                );
                unreachable(self, st);
            }
            _ => {}
        }
    }
}

/// The connection is up: the guest's QP is in RTS and both its ends hear of it.
fn established(inner: &Inner, c: &VChan, q: &VQp, peer_qpn: u32) {
    *lock(&q.peer) = Some(QpNum(peer_qpn));
    {
        let mut s = lock(&q.state);
        if *s == QpState::Error {
            return;
        }
        *s = QpState::Rts;
    }
    c.post(&EventRepr {
        kind: EventKind::QpEstablished,
        handle: q.num.0,
        detail: u64::from(peer_qpn),
    });
    inner.poke();
}

/// What the event thread keeps of an `rdma_cm_event` (read before it is acknowledged).
struct Event {
    id: usize,
    listen_id: usize,
    kind: u32,
    status: i32,
    private: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
    qp_num: u32,
}

impl Event {
    /// # Safety
    /// `ev` is an event returned by `rdma_get_cm_event`, not yet acknowledged.
    unsafe fn copy(ev: *mut rdma_cm_event) -> Event {
        // SAFETY: the caller's event; plain data.
        let e = unsafe { &*ev };
        // SAFETY: connection events carry `param.conn` (the UD member is never used here).
        let conn = unsafe { e.param.conn };
        let private = if conn.private_data.is_null() || conn.private_data_len == 0 {
            Vec::new()
        } else {
            // SAFETY: librdmacm's buffer of `private_data_len` bytes, valid until the ack.
            unsafe {
                std::slice::from_raw_parts(
                    conn.private_data.cast::<u8>(),
                    usize::from(conn.private_data_len),
                )
            }
            .to_vec()
        };
        Event {
            id: e.id as usize,
            listen_id: e.listen_id as usize,
            kind: e.event,
            status: e.status,
            private,
            responder_resources: conn.responder_resources,
            initiator_depth: conn.initiator_depth,
            qp_num: conn.qp_num,
        }
    }
}

impl VerbsCm {
    fn start(inner: Arc<Inner>, config: CmConfig) -> Result<VerbsCm, VerbsError> {
        let lib = RdmaCm::open()?;
        // SAFETY: no arguments; NULL on failure.
        let chan = NonNull::new(unsafe { (lib.fns.create_event_channel)() }).ok_or_else(|| {
            VerbsError::call("rdma_create_event_channel", super::super::dl::last_errno())
        })?;
        let ibdev = inner.ctx.name().to_owned();
        let addrs = if config.addrs.is_empty() {
            gid_addrs(&inner.ctx, inner.av.port)
        } else {
            config.addrs.clone()
        };
        let iwarp = inner.ctx.transport_type() == IBV_TRANSPORT_IWARP;
        let shared = Arc::new(Shared {
            lib,
            iwarp,
            chan,
            config,
            addrs,
            ibdev: ibdev.clone(),
            st: Mutex::new(CmState::default()),
            stop: AtomicBool::new(false),
        });
        // SAFETY: a live channel; reading its fd field.
        let fd = unsafe { (*chan.as_ptr()).fd };
        set_nonblocking(fd)?;
        let poll = Poll::new().map_err(|e| VerbsError::call("mio::Poll::new", e))?;
        poll.registry()
            .register(&mut SourceFd(&fd), EVENTS, Interest::READABLE)
            .map_err(|e| VerbsError::call("epoll_ctl", e))?;
        let waker = mio::Waker::new(poll.registry(), STOP)
            .map_err(|e| VerbsError::call("mio::Waker::new", e))?;
        let run = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("vrdma-cm-{ibdev}"))
            .spawn(move || run.run(inner, poll))
            .map_err(|e| VerbsError::call("spawning the connection manager thread", e))?;
        tracing::info!(device = %ibdev, addrs = ?shared.addrs, "rdma_cm connection manager up");
        Ok(VerbsCm {
            shared,
            waker,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Stops the event thread and destroys every id (connections end: the peers hear
    /// DREQs or rejects).
    pub(super) fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        let mut st = lock(&self.shared.st);
        let st = std::mem::take(&mut *st);
        for (_, r) in st.requests {
            // SAFETY: a live request id; no private data.
            unsafe { (self.shared.lib.fns.reject)(r.id.raw(), std::ptr::null(), 0) };
            self.shared.destroy(r.id);
        }
        for (_, q) in st.qps {
            if let Some(id) = q.id {
                self.shared.destroy(id);
            }
        }
        for (_, l) in st.listeners {
            self.shared.destroy(l.id);
        }
    }

    /// `destroy_qp`'s hook: the QP's connection ends (the peer hears a DREQ).
    pub(super) fn forget_qp(&self, ch: ChannelId, qp: QpNum) {
        let mut st = lock(&self.shared.st);
        if st.qps.get(&qp).map(|q| q.ch) != Some(ch) {
            return;
        }
        if let Some(q) = st.qps.remove(&qp) {
            if let Some(id) = q.id {
                st.ids.remove(&id.key());
                self.shared.destroy(id);
            }
        }
    }

    /// `close_channel`'s hook: its listeners, requests and connections go.
    pub(super) fn forget_channel(&self, ch: ChannelId) {
        let mut st = lock(&self.shared.st);
        let reqs: Vec<ConnRequestId> = st
            .requests
            .iter()
            .filter(|(_, r)| r.ch == ch)
            .map(|(k, _)| *k)
            .collect();
        for r in reqs {
            self.shared.drop_request(&mut st, r, true);
        }
        let ls: Vec<ListenerId> = st
            .listeners
            .iter()
            .filter(|(_, l)| l.ch == ch)
            .map(|(k, _)| *k)
            .collect();
        for l in ls {
            if let Some(l) = st.listeners.remove(&l) {
                st.ids.remove(&l.id.key());
                self.shared.destroy(l.id);
            }
        }
        let qps: Vec<QpNum> = st
            .qps
            .iter()
            .filter(|(_, q)| q.ch == ch)
            .map(|(k, _)| *k)
            .collect();
        for q in qps {
            if let Some(q) = st.qps.remove(&q) {
                if let Some(id) = q.id {
                    st.ids.remove(&id.key());
                    self.shared.destroy(id);
                }
            }
        }
    }
}

impl VerbsDevice {
    /// Starts the connection manager on librdmacm (a thread that sleeps until rdma_cm has an
    /// event). `config.addrs` empty: the device's addresses are its port's GIDs that are IP
    /// addresses (RoCE). Call once, right after opening; without it the `cm_*` calls answer
    /// `NotSupported`.
    pub fn with_cm(self, config: CmConfig) -> Result<Self, VerbsError> {
        let cm = VerbsCm::start(self.inner.clone(), config)?;
        if self.cm.set(cm).is_err() {
            return Err(VerbsError::Invalid(
                "the connection manager is already running".into(),
            ));
        }
        Ok(self)
    }

    fn vcm(&self) -> DeviceResult<&Shared> {
        self.cm
            .get()
            .map(|c| &*c.shared)
            .ok_or(DeviceError::NotSupported("connection manager"))
    }

    /// A QP of `ch` free to connect: in Reset, Init or Rtr, not connected or connecting.
    fn free_qp(
        &self,
        st: &CmState,
        ch: ChannelId,
        qp: QpNum,
    ) -> DeviceResult<(Arc<VChan>, Arc<VQp>)> {
        let c = self.inner.chan(ch)?;
        let q = lock(&c.res).qps.get(&qp).cloned().ok_or(bad("QP", qp.0))?;
        if !matches!(
            *lock(&q.state),
            QpState::Reset | QpState::Init | QpState::Rtr
        ) {
            return Err(refused(qp, "QP is not in Init"));
        }
        if lock(&q.peer).is_some() || st.qps.contains_key(&qp) {
            return Err(refused(qp, "QP is already connected"));
        }
        Ok((c, q))
    }

    fn domid_of(&self, c: &VChan) -> Option<DomId> {
        lock(&self.inner.tables)
            .domains
            .iter()
            .find(|(_, d)| Arc::ptr_eq(d, &c.stats.dom))
            .map(|(k, _)| *k)
    }

    /// The most private data a connect request, an accept and a reject may carry on this
    /// device (IB CM's 56/196/148 bytes on RoCE and InfiniBand, 255 each on iWARP); `None`
    /// without a connection manager.
    pub fn cm_private_data_limits(&self) -> Option<(usize, usize, usize)> {
        let s = self.vcm().ok()?;
        Some((
            s.limit(REQ_PRIVATE_DATA),
            s.limit(REP_PRIVATE_DATA),
            s.limit(REJ_PRIVATE_DATA),
        ))
    }

    pub(super) fn cm_addrs(&self) -> Vec<IpAddr> {
        self.vcm().map(|s| s.addrs.clone()).unwrap_or_default()
    }

    pub(super) fn cm_listen_impl(
        &self,
        ch: ChannelId,
        addr: SocketAddr,
        backlog: u32,
    ) -> DeviceResult<ListenerId> {
        let s = self.vcm()?;
        let ip = if addr.ip().is_unspecified() {
            *s.addrs
                .first()
                .ok_or_else(|| inval("the device has no address"))?
        } else if s.addrs.contains(&addr.ip()) {
            addr.ip()
        } else {
            return Err(inval(format!("{} is no address of this device", addr.ip())));
        };
        let c = self.inner.chan(ch)?;
        let domid = self.domid_of(&c).ok_or(bad("channel", ch.0))?;
        let mut st = lock(&s.st);
        let id = s.create_id()?;
        let mut sa = to_c(SocketAddr::new(ip, addr.port()));
        // SAFETY: a live id and a socket address of its family's size inside the union.
        let rc = unsafe { (s.lib.fns.bind_addr)(id.raw(), &mut sa.addr) };
        if let Err(e) = cm_call("rdma_bind_addr", rc) {
            s.destroy(id);
            return Err(match e.errno() {
                Some(EADDRINUSE) => DeviceError::Busy("port"),
                _ => inval(format!("binding {ip}:{}: {e}", addr.port())),
            });
        }
        if device_of(id.raw()).as_deref() != Some(s.ibdev.as_str()) {
            s.destroy(id);
            return Err(inval(format!("{ip} is not on RDMA device {}", s.ibdev)));
        }
        let backlog = backlog.clamp(1, MAX_BACKLOG);
        // SAFETY: a live, bound id.
        let rc = unsafe { (s.lib.fns.listen)(id.raw(), backlog as c_int) };
        if let Err(e) = cm_call("rdma_listen", rc) {
            s.destroy(id);
            return Err(match e.errno() {
                Some(EADDRINUSE) => DeviceError::Busy("port"),
                _ => inval(format!("listening on {ip}:{}: {e}", addr.port())),
            });
        }
        let bound = addrs_of(id.raw())
            .0
            .unwrap_or(SocketAddr::new(ip, addr.port()));
        let l = ListenerId(st.id());
        st.ids.insert(id.key(), Owner::Listener(l));
        st.listeners.insert(
            l,
            Listener {
                ch,
                domid,
                id,
                addr: bound,
                backlog,
                requests: HashSet::new(),
            },
        );
        Ok(l)
    }

    pub(super) fn cm_listener_addr_impl(
        &self,
        ch: ChannelId,
        l: ListenerId,
    ) -> DeviceResult<SocketAddr> {
        let s = self.vcm()?;
        let st = lock(&s.st);
        match st.listeners.get(&l) {
            Some(x) if x.ch == ch => Ok(x.addr),
            _ => Err(bad("listener", l.0)),
        }
    }

    pub(super) fn cm_close_listener_impl(&self, ch: ChannelId, l: ListenerId) -> DeviceResult<()> {
        let s = self.vcm()?;
        let mut st = lock(&s.st);
        if st.listeners.get(&l).map(|x| x.ch) != Some(ch) {
            return Err(bad("listener", l.0));
        }
        if let Some((x, untaken)) = st.close_listener(l, s.config.max_kept_requests) {
            for r in untaken {
                s.drop_request(&mut st, r, true);
            }
            s.destroy(x.id);
        }
        Ok(())
    }

    pub(super) fn cm_connect_impl(
        &self,
        ch: ChannelId,
        qp: QpNum,
        peer: SocketAddr,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        let s = self.vcm()?;
        check_len(private_data, s.limit(REQ_PRIVATE_DATA), " connect request")?;
        let mut st = lock(&s.st);
        let (c, q) = self.free_qp(&st, ch, qp)?;
        let domid = self.domid_of(&c).ok_or(bad("channel", ch.0))?;
        if !s.config.allows(domid, peer) {
            return Err(refused(qp, "the peer is not allowed for this domain"));
        }
        let src = s
            .addrs
            .iter()
            .find(|a| a.is_ipv4() == peer.is_ipv4())
            .copied()
            .ok_or_else(|| refused(qp, "the device has no address of the peer's family"))?;
        let id = s.create_id()?;
        let mut from = to_c(SocketAddr::new(src, 0));
        let mut to = to_c(peer);
        let t = ms(s.config.connect_timeout);
        // SAFETY: a live id and two socket addresses of their family's size.
        let rc = unsafe { (s.lib.fns.resolve_addr)(id.raw(), &mut from.addr, &mut to.addr, t) };
        if let Err(e) = cm_call("rdma_resolve_addr", rc) {
            tracing::info!(qp = qp.0, %peer, "{e}");
            s.destroy(id);
            return Err(refused(qp, "no route to the peer"));
        }
        // The QP belongs to the connection manager now (modify_qp refuses to move it).
        *lock(&q.peer) = Some(QpNum(0));
        if *lock(&q.state) == QpState::Reset {
            *lock(&q.state) = QpState::Init;
        }
        st.ids.insert(id.key(), Owner::Qp(qp));
        st.qps.insert(
            qp,
            QpConn {
                ch,
                id: Some(id),
                phase: Phase::Resolving,
                info: CmInfo {
                    local: SocketAddr::new(src, 0),
                    peer,
                    private_data: Vec::new(),
                    ird: 0,
                    ord: 0,
                },
                request: private_data.to_vec(),
                peer_qpn: 0,
            },
        );
        Ok(())
    }

    pub(super) fn cm_accept_impl(
        &self,
        ch: ChannelId,
        req: ConnRequestId,
        qp: QpNum,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        let s = self.vcm()?;
        check_len(private_data, s.limit(REP_PRIVATE_DATA), "n accept")?;
        let mut st = lock(&s.st);
        if st.requests.get(&req).map(|r| r.ch) != Some(ch) {
            return Err(bad("connection request", req.0));
        }
        let (_, q) = self.free_qp(&st, ch, qp)?;
        let Some(r) = st.requests.remove(&req) else {
            return Err(bad("connection request", req.0));
        };
        if let Some(l) = st.listeners.get_mut(&r.listener) {
            l.requests.remove(&req);
        }
        st.ids.remove(&r.id.key());
        let mut p = Shared::conn_param(private_data, qp.0);
        let up = s.to_rts(&r.id, &q).and_then(|()| {
            // SAFETY: a live request id; the QP is in RTS; the private data outlives the call.
            let rc = unsafe { (s.lib.fns.accept)(r.id.raw(), &mut p) };
            cm_call("rdma_accept", rc)
        });
        if let Err(e) = up {
            tracing::warn!(qp = qp.0, "accepting: {e}");
            // SAFETY: a live request id; no private data.
            unsafe { (s.lib.fns.reject)(r.id.raw(), std::ptr::null(), 0) };
            s.destroy(r.id);
            let attr = ibv_qp_attr {
                qp_state: IBV_QPS_RESET,
                ..Default::default()
            };
            // Back to where the guest left it (Init), so it can try again.
            let _ = q
                .hca
                .modify(&attr, IBV_QP_STATE)
                .and_then(|()| super::super::probe::to_init(&q.hca, self.inner.av.port));
            return Err(refused(
                qp,
                "the device refused the connection's attributes",
            ));
        }
        *lock(&q.peer) = Some(QpNum(r.peer_qpn));
        st.ids.insert(r.id.key(), Owner::Qp(qp));
        st.qps.insert(
            qp,
            QpConn {
                ch,
                id: Some(r.id),
                phase: Phase::Accepting,
                info: r.info,
                request: Vec::new(),
                peer_qpn: r.peer_qpn,
            },
        );
        Ok(())
    }

    pub(super) fn cm_reject_impl(
        &self,
        ch: ChannelId,
        req: ConnRequestId,
        private_data: &[u8],
    ) -> DeviceResult<()> {
        let s = self.vcm()?;
        check_len(private_data, s.limit(REJ_PRIVATE_DATA), " reject")?;
        let mut st = lock(&s.st);
        if st.requests.get(&req).map(|r| r.ch) != Some(ch) {
            return Err(bad("connection request", req.0));
        }
        let Some(r) = st.requests.remove(&req) else {
            return Err(bad("connection request", req.0));
        };
        if let Some(l) = st.listeners.get_mut(&r.listener) {
            l.requests.remove(&req);
        }
        st.ids.remove(&r.id.key());
        let pd = if private_data.is_empty() {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: a live request id; `private_data` outlives the call.
        let rc = unsafe { (s.lib.fns.reject)(r.id.raw(), pd, private_data.len() as u8) };
        if let Err(e) = cm_call("rdma_reject", rc) {
            tracing::info!(req = req.0, "{e}");
        }
        s.destroy(r.id);
        Ok(())
    }

    pub(super) fn cm_disconnect_impl(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<()> {
        let s = self.vcm()?;
        let mut st = lock(&s.st);
        let phase = match st.qps.get(&qp) {
            Some(q) if q.ch == ch => q.phase,
            _ => {
                // Not the connection manager's: as on the software device, a QP paired by
                // `connect_qp` (or an address vector) is disconnected all the same.
                let c = self.inner.chan(ch)?;
                let q = lock(&c.res).qps.get(&qp).cloned().ok_or(bad("QP", qp.0))?;
                if lock(&q.peer).is_none() {
                    return Err(inval("the QP has no connection"));
                }
                if *lock(&q.state) != QpState::Error {
                    fail_qp(&c, &q, false);
                    c.post(&EventRepr {
                        kind: EventKind::QpDisconnected,
                        handle: qp.0,
                        detail: 0,
                    });
                    self.inner.poke();
                }
                return Ok(());
            }
        };
        match phase {
            Phase::Ended => Ok(()),
            Phase::Connected => {
                if let Some(id) = st.qps.get(&qp).and_then(|q| q.id.as_ref()) {
                    // SAFETY: a live, connected id (sends the DREQ).
                    unsafe { (s.lib.fns.disconnect)(id.raw()) };
                }
                s.end_qp(&self.inner, &mut st, qp, EventKind::QpDisconnected);
                Ok(())
            }
            Phase::Resolving | Phase::Connecting | Phase::Accepting => {
                s.end_qp(&self.inner, &mut st, qp, EventKind::ConnectUnreachable);
                Ok(())
            }
        }
    }

    pub(super) fn cm_request_info_impl(
        &self,
        ch: ChannelId,
        req: ConnRequestId,
    ) -> DeviceResult<CmInfo> {
        let s = self.vcm()?;
        let mut st = lock(&s.st);
        st.take_info(ch, req)
            .ok_or(bad("connection request", req.0))
    }

    pub(super) fn cm_qp_info_impl(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<CmInfo> {
        let s = self.vcm()?;
        let st = lock(&s.st);
        match st.qps.get(&qp) {
            Some(q) if q.ch == ch => Ok(q.info.clone()),
            _ => Err(bad("QP", qp.0)),
        }
    }

    /// `destroy_qp`'s and `close_channel`'s hooks (called before they take any lock).
    pub(super) fn cm_forget_qp(&self, ch: ChannelId, qp: QpNum) {
        if let Some(c) = self.cm.get() {
            c.forget_qp(ch, qp);
        }
    }

    pub(super) fn cm_forget_channel(&self, ch: ChannelId) {
        if let Some(c) = self.cm.get() {
            c.forget_channel(ch);
        }
    }
}

/// The `cm_*` methods of `impl Device for VerbsDevice` (expanded there, so that device.rs
/// carries one line for them).
macro_rules! cm_methods {
    () => {
        fn local_addrs(&self) -> Vec<std::net::IpAddr> {
            self.cm_addrs()
        }
        fn cm_listen(
            &self,
            ch: ChannelId,
            addr: std::net::SocketAddr,
            backlog: u32,
        ) -> DeviceResult<crate::device::ListenerId> {
            self.cm_listen_impl(ch, addr, backlog)
        }
        fn cm_listener_addr(
            &self,
            ch: ChannelId,
            l: crate::device::ListenerId,
        ) -> DeviceResult<std::net::SocketAddr> {
            self.cm_listener_addr_impl(ch, l)
        }
        fn cm_close_listener(
            &self,
            ch: ChannelId,
            l: crate::device::ListenerId,
        ) -> DeviceResult<()> {
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
            req: crate::device::ConnRequestId,
            qp: QpNum,
            private_data: &[u8],
        ) -> DeviceResult<()> {
            self.cm_accept_impl(ch, req, qp, private_data)
        }
        fn cm_reject(
            &self,
            ch: ChannelId,
            req: crate::device::ConnRequestId,
            private_data: &[u8],
        ) -> DeviceResult<()> {
            self.cm_reject_impl(ch, req, private_data)
        }
        fn cm_disconnect(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<()> {
            self.cm_disconnect_impl(ch, qp)
        }
        fn cm_request_info(
            &self,
            ch: ChannelId,
            req: crate::device::ConnRequestId,
        ) -> DeviceResult<crate::device::CmInfo> {
            self.cm_request_info_impl(ch, req)
        }
        fn cm_qp_info(&self, ch: ChannelId, qp: QpNum) -> DeviceResult<crate::device::CmInfo> {
            self.cm_qp_info_impl(ch, qp)
        }
    };
}
pub(super) use cm_methods;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_through_the_c_layout() {
        for a in [
            "10.77.0.1:18515",
            "[fe80::1]:7",
            "[2001:db8::5]:65535",
            "127.0.0.1:0",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(from_c(&to_c(a)), Some(a));
        }
        // An IPv4-mapped IPv6 address (how rdma_cm may report a RoCE v2 peer) is the IPv4 one.
        let mapped: SocketAddr = "[::ffff:10.77.0.2]:9".parse().unwrap();
        assert_eq!(from_c(&to_c(mapped)), Some("10.77.0.2:9".parse().unwrap()));
        let sa = to_c("1.2.3.4:258".parse().unwrap());
        // SAFETY: the IPv4 member was written.
        let sin = unsafe { sa.sin };
        assert_eq!(
            sin.sin_port.to_ne_bytes(),
            [1, 2],
            "port in network byte order"
        );
        assert_eq!(sin.sin_addr.to_ne_bytes(), [1, 2, 3, 4]);
    }

    #[test]
    fn private_data_is_bounded_by_the_ib_cm_sizes() {
        assert!(check_len(&[0; REQ_PRIVATE_DATA], REQ_PRIVATE_DATA, "").is_ok());
        assert!(check_len(&[0; REQ_PRIVATE_DATA + 1], REQ_PRIVATE_DATA, "").is_err());
        assert!(check_len(&[0; REP_PRIVATE_DATA + 1], REP_PRIVATE_DATA, "").is_err());
        assert!(check_len(&[0; REJ_PRIVATE_DATA], REJ_PRIVATE_DATA, "").is_ok());
    }

    fn request(st: &mut CmState, l: ListenerId, ch: ChannelId) -> ConnRequestId {
        let req = ConnRequestId(st.id());
        st.listeners.get_mut(&l).unwrap().requests.insert(req);
        let a: SocketAddr = "10.77.0.1:7".parse().unwrap();
        st.requests.insert(
            req,
            Request {
                listener: l,
                ch,
                // Never dereferenced: the table alone is tested.
                id: Id(NonNull::dangling()),
                info: CmInfo {
                    local: a,
                    peer: a,
                    private_data: Vec::new(),
                    ird: 0,
                    ord: 0,
                },
                peer_qpn: 0,
                delivered: false,
                domid: st.listeners.get(&l).map_or(DomId(0), |x| x.domid),
                kept: false,
            },
        );
        req
    }

    /// CloseListener rejects the requests the guest has not taken; those it took (asked their
    /// `CmInfo`) stay, answerable, as on the software device.
    #[test]
    fn closing_a_listener_keeps_the_requests_the_guest_took() {
        let mut st = CmState::default();
        let ch = ChannelId(1);
        let l = ListenerId(st.id());
        let a: SocketAddr = "10.77.0.1:7".parse().unwrap();
        st.listeners.insert(
            l,
            Listener {
                ch,
                domid: DomId(1),
                id: Id(NonNull::dangling()),
                addr: a,
                backlog: 8,
                requests: HashSet::new(),
            },
        );
        let taken = request(&mut st, l, ch);
        let waiting = request(&mut st, l, ch);
        assert!(
            st.take_info(ChannelId(2), taken).is_none(),
            "another channel's"
        );
        assert!(st.take_info(ch, taken).is_some());
        let (_, untaken) = st.close_listener(l, 8).unwrap();
        assert_eq!(untaken, vec![waiting]);
        assert!(!st.listeners.contains_key(&l));
        assert!(st.take_info(ch, taken).is_some(), "the taken request stays");
    }

    /// A domain keeps at most `max_kept` taken requests of closed listeners, over all its
    /// channels (a second channel of the domain does not get more; another domain does).
    #[test]
    fn a_channel_keeps_a_bounded_number_of_taken_requests() {
        let mut st = CmState::default();
        let a: SocketAddr = "10.77.0.1:7".parse().unwrap();
        let mut rejected = Vec::new();
        let mut all = Vec::new();
        for (ch, domid) in [(1, 1), (2, 1), (3, 2)] {
            let ch = ChannelId(ch);
            let l = ListenerId(st.id());
            st.listeners.insert(
                l,
                Listener {
                    ch,
                    domid: DomId(domid),
                    id: Id(NonNull::dangling()),
                    addr: a,
                    backlog: 8,
                    requests: HashSet::new(),
                },
            );
            for _ in 0..2 {
                let r = request(&mut st, l, ch);
                st.take_info(ch, r).unwrap();
                all.push(r);
            }
            let (_, mut out) = st.close_listener(l, 3).unwrap();
            out.sort_by_key(|r| r.0);
            rejected.push(out);
        }
        assert_eq!(rejected, vec![vec![], vec![all[3]], vec![]]);
    }

    #[test]
    fn a_missing_librdmacm_names_its_package() {
        std::env::set_var(LIBRDMACM_ENV, "/nonexistent/librdmacm.so.1");
        let e = RdmaCm::open().err().expect("no such library");
        std::env::remove_var(LIBRDMACM_ENV);
        let msg = e.to_string();
        assert!(msg.contains("librdmacm1"), "{msg}");
        assert!(msg.contains("/nonexistent/librdmacm.so.1"), "{msg}");
    }
}
