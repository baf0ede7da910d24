//! Connection management, rdma_cm style: listen on a port of the backend's address, connect a
//! QP to `ip:port` with private data, accept or reject requests (with private data),
//! disconnect. Every call blocks until the backend's answer, and the calls that wait for a
//! peer take a timeout.
//!
//! ```no_run
//! # fn main() -> vrdma::Result<()> {
//! # use std::time::Duration;
//! let ctx = vrdma::Context::open()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64)?;
//! // passive side
//! let listener = ctx.listen(7471, 8)?;
//! let req = listener.get_request(Some(Duration::from_secs(10)))?;
//! let mut qp = pd.create_qp(&cq, &cq).build()?;
//! let info = req.accept(&mut qp, b"welcome")?;
//! // active side (another guest): qp.connect_to("127.0.0.2:7471".parse()?, b"hello", t)?
//! # Ok(()) }
//! ```
//!
//! Private data (up to [`MAX_PRIVATE_DATA`] bytes) travels through the channel's CM page
//! (docs/protocol.md "Connection management"): one page the backend grants on first use, 16
//! slots of 256 bytes; each call in flight holds its own slot. Results arrive as events on the
//! channel's event ring: a call that waits for one takes it, the others stay for
//! [`crate::Context::async_events`].

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use shared_ring::abi::control::{
    CmInfoReply, CmTarget, PrivData, Reply, Request, CM_SLOTS, CM_SLOT_LEN,
};
use shared_ring::abi::event::EventKind;
use shared_ring::SharedRegion;
use xen_platform::Access;

use crate::context::{Context, CtxInner};
use crate::error::{Error, Result};
use crate::qp::{QpConnector, QueuePair};
use crate::AsyncEvent;

/// Most private data bytes a connect, accept or reject carries.
pub const MAX_PRIVATE_DATA: usize = shared_ring::abi::control::MAX_PRIVATE_DATA;

/// Both ends of a connection and what the peer said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmInfo {
    /// This end (the backend's address and port).
    pub local: SocketAddr,
    /// The peer.
    pub peer: SocketAddr,
    /// The peer's private data: its connect request's (at a listener), its accept's or
    /// reject's (at the connecting QP).
    pub private_data: Vec<u8>,
    /// RDMA Reads the peer accepts outstanding (negotiated once established).
    pub ird: u16,
    /// RDMA Reads the peer may have outstanding (negotiated once established).
    pub ord: u16,
}

/// The channel's CM page as this process maps it, with its free slots.
pub(crate) struct CmPage {
    region: SharedRegion,
    /// Bit `i` set: slot `i` is free.
    free: Mutex<u32>,
    freed: Condvar,
}

/// The CM page of a context, mapped on first use.
#[derive(Default)]
pub(crate) struct CmPageCell(Mutex<Option<Arc<CmPage>>>);

/// A CM page slot held by one call.
struct Slot {
    page: Arc<CmPage>,
    index: u8,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut f = self.page.free.lock().unwrap_or_else(|e| e.into_inner());
        *f |= 1 << self.index;
        self.page.freed.notify_one();
    }
}

fn page(ctx: &CtxInner) -> Result<Arc<CmPage>> {
    let mut cell = ctx.cm.0.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = &*cell {
        return Ok(p.clone());
    }
    let Reply::CmPage {
        gref,
        slots,
        slot_len,
    } = ctx.chan.call(Request::CmPage)?
    else {
        return Err(Error::protocol("CmPage answered without a page"));
    };
    if slots != u32::from(CM_SLOTS) || slot_len as usize != CM_SLOT_LEN {
        return Err(Error::protocol(format!(
            "CM page of {slots} slots of {slot_len} bytes (the protocol's is {CM_SLOTS} of \
             {CM_SLOT_LEN})"
        )));
    }
    let region = crate::shm::map(
        &ctx.chan.platform,
        ctx.chan.backend,
        &[gref],
        Access::ReadWrite,
    )?;
    let p = Arc::new(CmPage {
        region,
        free: Mutex::new((1u32 << CM_SLOTS) - 1),
        freed: Condvar::new(),
    });
    *cell = Some(p.clone());
    Ok(p)
}

/// A free slot of the CM page (waiting, up to the control timeout, while all are in use).
fn slot(ctx: &CtxInner) -> Result<Slot> {
    let page = page(ctx)?;
    let deadline = Instant::now() + ctx.chan.control.timeout();
    let mut f = page.free.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if *f != 0 {
            let index = f.trailing_zeros() as u8;
            *f &= !(1 << index);
            drop(f);
            return Ok(Slot { page, index });
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Timeout {
                what: "a free CM page slot (16 connection-management calls in flight)".into(),
                timeout_ms: ctx.chan.control.timeout().as_millis() as u64,
            });
        }
        f = page
            .freed
            .wait_timeout(f, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Private data written into a slot of its own (none for empty data).
fn stage(ctx: &CtxInner, data: &[u8]) -> Result<(Option<Slot>, PrivData)> {
    if data.len() > MAX_PRIVATE_DATA {
        return Err(Error::InvalidArgument(format!(
            "{} bytes of private data: at most {MAX_PRIVATE_DATA}",
            data.len()
        )));
    }
    if data.is_empty() {
        return Ok((None, PrivData::NONE));
    }
    let s = slot(ctx)?;
    s.page
        .region
        .write_bytes(usize::from(s.index) * CM_SLOT_LEN, data)?;
    let p = PrivData {
        slot: s.index,
        len: data.len() as u8,
    };
    Ok((Some(s), p))
}

/// `CmInfo` of a request or a QP, with the private data read out of the CM page.
fn info(ctx: &CtxInner, target: CmTarget) -> Result<CmInfo> {
    let s = slot(ctx)?;
    let reply = ctx.chan.call(Request::CmInfo {
        target,
        slot: s.index,
    })?;
    let Reply::CmInfo(CmInfoReply {
        local_addr,
        local_port,
        remote_addr,
        remote_port,
        private_len,
        ird,
        ord,
    }) = reply
    else {
        return Err(Error::protocol(format!("CmInfo answered with {reply:?}")));
    };
    let mut private_data = vec![0u8; usize::from(private_len)];
    s.page
        .region
        .read_bytes(usize::from(s.index) * CM_SLOT_LEN, &mut private_data)?;
    Ok(CmInfo {
        local: SocketAddr::new(ip_or_unspecified(local_addr), local_port),
        peer: SocketAddr::new(ip_or_unspecified(remote_addr), remote_port),
        private_data,
        ird,
        ord,
    })
}

/// An address as the protocol carries it: `None` when unspecified; IPv4-mapped is IPv4.
pub(crate) fn ip_of(addr: [u8; 16]) -> Option<IpAddr> {
    let v6 = Ipv6Addr::from(addr);
    if v6.is_unspecified() {
        return None;
    }
    Some(
        v6.to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
    )
}

fn ip_or_unspecified(addr: [u8; 16]) -> IpAddr {
    ip_of(addr).unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED))
}

fn addr_bytes(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

fn deadline_of(timeout: Option<Duration>) -> Option<Instant> {
    timeout.map(|t| Instant::now() + t)
}

impl Context {
    /// Listens on `port` of the backend's address (`port` 0: the backend chooses; see
    /// [`Listener::local_addr`]). `backlog` bounds the requests waiting for an answer (0: the
    /// backend's default). The backend's policy decides which ports a domain may use
    /// ([`crate::Status::NotPermitted`]); a port taken is [`crate::Status::AddressInUse`].
    pub fn listen(&self, port: u16, backlog: u32) -> Result<Listener> {
        self.listen_inner(None, port, backlog)
    }

    /// [`Context::listen`] on one of the backend's addresses.
    pub fn listen_on(&self, addr: SocketAddr, backlog: u32) -> Result<Listener> {
        self.listen_inner(Some(addr.ip()), addr.port(), backlog)
    }

    fn listen_inner(&self, ip: Option<IpAddr>, port: u16, backlog: u32) -> Result<Listener> {
        let ctx = &self.inner;
        let reply = ctx.chan.call(Request::Listen {
            port,
            backlog,
            addr: ip.map_or([0; 16], addr_bytes),
        })?;
        let Reply::Listener { listener, port } = reply else {
            return Err(Error::protocol(format!("Listen answered with {reply:?}")));
        };
        let ip = ip
            .or_else(|| ip_of(ctx.chan.backend_addr))
            .unwrap_or(IpAddr::V6(Ipv6Addr::UNSPECIFIED));
        Ok(Listener {
            ctx: ctx.clone(),
            handle: listener,
            addr: SocketAddr::new(ip, port),
        })
    }
}

/// A listening endpoint; closed when dropped (requests still waiting are rejected).
pub struct Listener {
    ctx: Arc<CtxInner>,
    handle: u32,
    addr: SocketAddr,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("handle", &self.handle)
            .field("addr", &self.addr)
            .finish()
    }
}

impl Listener {
    /// Where peers connect: the backend's address and the bound port.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The backend's handle.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// The next connection request, waiting up to `timeout` (forever with `None`); no request
    /// in time is [`Error::Timeout`].
    /// A request whose peer gave up before it was read is skipped.
    pub fn get_request(&self, timeout: Option<Duration>) -> Result<ConnRequest> {
        let chan = &self.ctx.chan;
        let handle = self.handle;
        let deadline = deadline_of(timeout);
        let pick = move |e: &AsyncEvent| e.kind == EventKind::ConnectRequest && e.handle == handle;
        loop {
            let Some(ev) = chan.wait_event(&pick, deadline)? else {
                return Err(Error::Timeout {
                    what: format!("a connection request at {}", self.addr),
                    timeout_ms: timeout.unwrap_or_default().as_millis() as u64,
                });
            };
            let id = u32::try_from(ev.detail)
                .map_err(|_| Error::protocol(format!("connection request id {}", ev.detail)))?;
            match info(&self.ctx, CmTarget::Request(id)) {
                Ok(info) => {
                    return Ok(ConnRequest {
                        ctx: self.ctx.clone(),
                        id,
                        info,
                        answered: false,
                    })
                }
                // Withdrawn (the peer closed or timed out) before we looked.
                Err(e) if e.status() == Some(shared_ring::abi::control::Status::BadHandle) => {
                    tracing::debug!(listener = handle, request = id, "request withdrawn: {e}");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if !self.ctx.chan.is_lost() {
            if let Err(e) = self.ctx.chan.call(Request::CloseListener {
                listener: self.handle,
            }) {
                tracing::warn!(listener = self.handle, "closing a listener: {e}");
            }
        }
    }
}

/// A peer asking to connect; answer with [`ConnRequest::accept`] or [`ConnRequest::reject`]
/// (dropped unanswered, it is rejected without private data).
pub struct ConnRequest {
    ctx: Arc<CtxInner>,
    id: u32,
    info: CmInfo,
    answered: bool,
}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnRequest")
            .field("id", &self.id)
            .field("info", &self.info)
            .finish()
    }
}

impl ConnRequest {
    /// The peer asking.
    pub fn peer(&self) -> SocketAddr {
        self.info.peer
    }
    /// The peer's private data.
    pub fn private_data(&self) -> &[u8] {
        &self.info.private_data
    }
    /// Addresses, private data, IRD/ORD of the request.
    pub fn info(&self) -> &CmInfo {
        &self.info
    }

    /// Accepts the connection on `qp` (not connected yet) with `private_data` for the peer,
    /// and waits (up to the context's control timeout) until it is established.
    pub fn accept(self, qp: &mut QueuePair, private_data: &[u8]) -> Result<CmInfo> {
        self.accept_on(qp.ctx_inner(), qp.handle(), private_data)
    }

    /// [`ConnRequest::accept`] through the QP's [`QpConnector`]: the QP itself stays free for
    /// other threads (posting receives) while this waits.
    pub fn accept_with(self, qp: &QpConnector, private_data: &[u8]) -> Result<CmInfo> {
        self.accept_on(qp.ctx_inner(), qp.handle(), private_data)
    }

    fn accept_on(mut self, ctx: &CtxInner, handle: u32, private_data: &[u8]) -> Result<CmInfo> {
        if !std::ptr::eq(ctx, &*self.ctx) {
            return Err(Error::InvalidArgument(
                "the QP belongs to another context than the listener".into(),
            ));
        }
        let (slot, private) = stage(&self.ctx, private_data)?;
        self.ctx.chan.call(Request::Accept {
            request: self.id,
            qp: handle,
            private,
        })?;
        drop(slot);
        self.answered = true;
        let timeout = self.ctx.chan.control.timeout();
        wait_established(&self.ctx, handle, self.info.peer, Some(timeout))
    }

    /// Refuses the connection, with `private_data` for the peer.
    pub fn reject(mut self, private_data: &[u8]) -> Result<()> {
        let (slot, private) = stage(&self.ctx, private_data)?;
        self.answered = true;
        self.ctx.chan.call(Request::Reject {
            request: self.id,
            private,
        })?;
        drop(slot);
        Ok(())
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        if !self.answered && !self.ctx.chan.is_lost() {
            let _ = self.ctx.chan.call(Request::Reject {
                request: self.id,
                private: PrivData::NONE,
            });
        }
    }
}

/// How long a connect or accept whose `QpDisconnected` came first waits for its
/// `QpEstablished` (the backend sends it right after, to this end's channel).
const LATE_ESTABLISHED: Duration = Duration::from_secs(2);

/// Waits for the outcome of a connect or accept on QP `handle`.
fn wait_established(
    ctx: &CtxInner,
    handle: u32,
    peer: SocketAddr,
    timeout: Option<Duration>,
) -> Result<CmInfo> {
    let pick = move |e: &AsyncEvent| {
        e.handle == handle
            && matches!(
                e.kind,
                EventKind::QpEstablished
                    | EventKind::ConnectRejected
                    | EventKind::ConnectUnreachable
                    | EventKind::QpDisconnected
                    | EventKind::QpFatal
            )
    };
    let Some(ev) = ctx.chan.wait_event(&pick, deadline_of(timeout))? else {
        return Err(Error::Timeout {
            what: format!("the connection of QP {handle} with {peer}"),
            timeout_ms: timeout.unwrap_or_default().as_millis() as u64,
        });
    };
    match ev.kind {
        EventKind::QpEstablished => info(ctx, CmTarget::Qp(handle)),
        EventKind::QpDisconnected => {
            // The backend tells the two ends one after the other: a peer that ends the
            // connection as soon as it hears of it can have this end's `QpDisconnected` queued
            // before its `QpEstablished` (intra-host accept). rdma_cm reports ESTABLISHED then
            // DISCONNECTED: wait (bounded) for that `QpEstablished`, and leave the
            // disconnection pending for whoever waits for it. Without one (the peer went
            // away before establishment, e.g. an iWARP responder never got the RTR) the
            // connection failed.
            let est =
                move |e: &AsyncEvent| e.handle == handle && e.kind == EventKind::QpEstablished;
            let late = Instant::now() + LATE_ESTABLISHED;
            let until = deadline_of(timeout).map_or(late, |d| d.min(late));
            match ctx.chan.wait_event(&est, Some(until))? {
                Some(_) => {
                    ctx.chan.requeue_event(ev);
                    info(ctx, CmTarget::Qp(handle))
                }
                None => Err(Error::ConnectionLost {
                    qp: handle,
                    what: "QpDisconnected before the connection was established".into(),
                }),
            }
        }
        EventKind::ConnectRejected => {
            // The reject's private data, when the peer sent any (none when nobody listens).
            let private_data = info(ctx, CmTarget::Qp(handle))
                .map(|i| i.private_data)
                .unwrap_or_default();
            Err(Error::ConnectRejected { peer, private_data })
        }
        EventKind::ConnectUnreachable => Err(Error::Unreachable { peer }),
        kind => Err(Error::ConnectionLost {
            qp: handle,
            what: format!("{kind:?} before the connection was established"),
        }),
    }
}

/// `Connect` of QP `handle` to a listener at `peer`, waiting for the outcome.
fn connect_qp(
    ctx: &CtxInner,
    handle: u32,
    peer: SocketAddr,
    private_data: &[u8],
    timeout: Duration,
) -> Result<CmInfo> {
    let (slot, private) = stage(ctx, private_data)?;

    ctx.chan.call(Request::Connect {
        qp: handle,
        port: peer.port(),
        addr: addr_bytes(peer.ip()),
        remote_qpn: 0,
        private,
    })?;
    drop(slot);
    let r = wait_established(ctx, handle, peer, Some(timeout));
    if matches!(r, Err(Error::Timeout { .. })) {
        let _ = ctx.chan.call(Request::Disconnect { qp: handle });
    }
    r
}

impl QpConnector {
    /// [`QueuePair::connect_to`] through the QP's connector: the QP itself stays free for other
    /// threads (posting receives) while this waits.
    pub fn connect_to(
        &self,
        peer: SocketAddr,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<CmInfo> {
        connect_qp(self.ctx_inner(), self.handle(), peer, private_data, timeout)
    }
}

impl QueuePair {
    /// Connects this QP (not connected yet) to a listener at `peer` with `private_data`, and
    /// waits up to `timeout` for the outcome: the connection's [`CmInfo`] (with the peer's
    /// accept private data), or [`Error::ConnectRejected`] (with the peer's reject private
    /// data), [`Error::Unreachable`], [`Error::Timeout`] (the connect is abandoned). A peer the
    /// backend's policy does not allow is [`crate::Status::NotPermitted`].
    pub fn connect_to(
        &mut self,
        peer: SocketAddr,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<CmInfo> {
        connect_qp(self.ctx_inner(), self.handle(), peer, private_data, timeout)
    }

    /// Ends the QP's connection (or abandons its connect): the QP goes to Error (its work
    /// requests are flushed) and both ends get a `QpDisconnected` event.
    pub fn disconnect(&mut self) -> Result<()> {
        self.ctx_inner()
            .chan
            .call(Request::Disconnect { qp: self.handle() })?;
        Ok(())
    }

    /// The QP's connection: addresses, the peer's private data, IRD/ORD.
    pub fn cm_info(&self) -> Result<CmInfo> {
        info(self.ctx_inner(), CmTarget::Qp(self.handle()))
    }

    /// Waits up to `timeout` (forever with `None`) for the QP's connection to end (a
    /// `QpDisconnected` or `QpFatal` event, which this takes); false on timeout.
    pub fn wait_disconnected(&self, timeout: Option<Duration>) -> Result<bool> {
        let handle = self.handle();
        let pick = move |e: &AsyncEvent| {
            e.handle == handle && matches!(e.kind, EventKind::QpDisconnected | EventKind::QpFatal)
        };
        Ok(self
            .ctx_inner()
            .chan
            .wait_event(&pick, deadline_of(timeout))?
            .is_some())
    }
}
