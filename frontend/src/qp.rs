//! Queue pairs: creation, connection, and the post path.
//!
//! Bypass post path, in full: build the 64-byte WQE on the stack, copy it into the next send
//! or receive queue slot (granted page), release-store the producer index in the doorbell page,
//! full fence, read the engine's sleep word; only if the engine announced a sleep we have not
//! kicked yet, notify the event channel (the one system call, once per engine sleep).

use std::sync::Arc;

use shared_ring::abi::control::{Reply, Request, MAX_QUEUE_LOG2};
use shared_ring::abi::wqe::{
    self, flags, Sge, WqeData, WqeOpcode, WqeRepr, MAX_INLINE, MAX_SGE, WQE_LEN,
};
use shared_ring::doorbell::EngineKick;
use shared_ring::queue::QueueError;
use shared_ring::{SharedRegion, WqProducer, PAGE_SIZE};
use xen_platform::Access;

use crate::channel::pages_for;
use crate::context::{CtxInner, Mode};
use crate::cq::{CompletionQueue, CqShared};
use crate::error::{Error, Result};
use crate::mr::{MrSlice, RemoteMr};
use crate::pd::{PdInner, ProtectionDomain};

/// Where a queue pair can be reached: the backend's address and the QP number. Hand it to the
/// peer (`Display`/`FromStr` give `addr/qp_num`; the address is the backend's XenStore
/// `address`, `::` when it publishes none, meaning "this backend").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpEndpoint {
    pub addr: [u8; 16],
    pub qp_num: u32,
}

impl std::fmt::Display for QpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = std::net::Ipv6Addr::from(self.addr);
        write!(f, "{a}/{}", self.qp_num)
    }
}

impl std::str::FromStr for QpEndpoint {
    type Err = Error;
    fn from_str(s: &str) -> Result<QpEndpoint> {
        let bad = || Error::InvalidArgument(format!("{s:?} is not ADDRESS/QPN"));
        let (a, q) = s.trim().rsplit_once('/').ok_or_else(bad)?;
        Ok(QpEndpoint {
            addr: crate::channel::parse_addr(a).ok_or_else(bad)?,
            qp_num: q.parse().map_err(|_| bad())?,
        })
    }
}

/// An RC peer by address vector, as `ibv_modify_qp` names it at RTR (and RTS), for
/// [`QpConnector::connect_av`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressVector {
    /// The peer port's GID (RoCE: its IPv6 or IPv4-mapped address); all zero: no global
    /// route (InfiniBand: the LID; the software device: this backend).
    pub gid: [u8; 16],
    pub lid: u16,
    /// The peer QP's number.
    pub qp_num: u32,
    /// The peer's first send PSN (this QP's receive PSN).
    pub rq_psn: u32,
    /// ibverbs' `enum ibv_mtu` (1: 256 … 5: 4096); 0: the device's.
    pub path_mtu: u8,
}

/// What a send-queue work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    Send,
    SendWithImm(u32),
    Write(RemoteMr),
    WriteWithImm(RemoteMr, u32),
    Read(RemoteMr),
}

/// Where a send work request's data is.
#[derive(Debug, Clone, Copy)]
pub enum WrData<'a> {
    /// Scatter/gather entries over registered memory (at most [`MAX_SGE`]).
    Sges(&'a [MrSlice<'a>]),
    /// Bytes copied into the WQE itself (at most the QP's max inline, ≤ [`MAX_INLINE`]).
    Inline(&'a [u8]),
}

/// A send-queue work request with every option (the `post_*` helpers cover the usual cases).
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    pub wr_id: u64,
    pub op: SendOp,
    pub data: WrData<'a>,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Ask for a solicited event at the receiver.
    pub solicited: bool,
    /// Wait for earlier RDMA READs first.
    pub fence: bool,
}

/// Options for a new queue pair.
pub struct QueuePairBuilder<'a> {
    pd: &'a ProtectionDomain,
    send_cq: &'a CompletionQueue,
    recv_cq: &'a CompletionQueue,
    sq_size: u32,
    rq_size: u32,
    max_inline: u32,
}

impl<'a> QueuePairBuilder<'a> {
    pub(crate) fn new(
        pd: &'a ProtectionDomain,
        send_cq: &'a CompletionQueue,
        recv_cq: &'a CompletionQueue,
    ) -> Self {
        QueuePairBuilder {
            pd,
            send_cq,
            recv_cq,
            sq_size: 128,
            rq_size: 128,
            max_inline: MAX_INLINE as u32,
        }
    }
    /// Send queue slots (rounded up to a power of two; default 128).
    pub fn sq_size(mut self, n: u32) -> Self {
        self.sq_size = n;
        self
    }
    /// Receive queue slots (rounded up to a power of two; default 128).
    pub fn rq_size(mut self, n: u32) -> Self {
        self.rq_size = n;
        self
    }
    /// Largest inline send (default and maximum [`MAX_INLINE`], or the backend's `max-inline`).
    pub fn max_inline(mut self, n: u32) -> Self {
        self.max_inline = n;
        self
    }

    /// Creates the queue pair (not yet connected).
    pub fn build(self) -> Result<QueuePair> {
        let ctx = &self.pd.inner.ctx;
        let log2 = |n: u32, what: &str| -> Result<u8> {
            let l = n.max(1).next_power_of_two().trailing_zeros();
            if l > u32::from(MAX_QUEUE_LOG2) {
                return Err(Error::InvalidArgument(format!(
                    "{what} of {n} slots is larger than the protocol allows (2^{MAX_QUEUE_LOG2})"
                )));
            }
            Ok(l as u8)
        };
        let inline_cap = ctx
            .chan
            .limits
            .max_inline
            .map_or(MAX_INLINE as u32, |m| m.min(MAX_INLINE as u32));
        if self.max_inline > inline_cap {
            return Err(Error::InvalidArgument(format!(
                "max inline {} exceeds the device's {inline_cap}",
                self.max_inline
            )));
        }
        for cq in [self.send_cq, self.recv_cq] {
            if !Arc::ptr_eq(&cq.shared.ctx, ctx) {
                return Err(Error::InvalidArgument(
                    "the CQ belongs to another context".into(),
                ));
            }
        }
        let reply = ctx.chan.call(Request::CreateQp {
            pd: self.pd.inner.handle,
            send_cq: self.send_cq.shared.handle,
            recv_cq: self.recv_cq.shared.handle,
            sq_log2: log2(self.sq_size, "a send queue")?,
            rq_log2: log2(self.rq_size, "a receive queue")?,
        })?;
        let Reply::Qp {
            qp,
            qp_num,
            sq_slot,
            rq_slot,
            sq_log2,
            rq_log2,
            pages,
            doorbell_gref,
        } = reply
        else {
            return Err(Error::protocol(format!("CreateQp answered with {reply:?}")));
        };
        let made = (|| {
            let sq_len = WQE_LEN << sq_log2;
            let rq_len = WQE_LEN << rq_log2;
            let sq_pages = pages_for(sq_len);
            let want = sq_pages + pages_for(rq_len);
            if pages.n_pages() as usize != want {
                return Err(Error::protocol(format!(
                    "CreateQp granted {} pages for queues needing {want}",
                    pages.n_pages()
                )));
            }
            let region = ctx.chan.map_page_list(&pages, Access::ReadWrite)?;
            let (sq_page, sq_k) = ctx.chan.doorbell_slot(sq_slot, doorbell_gref)?;
            let (rq_page, rq_k) = ctx.chan.doorbell_slot(rq_slot, doorbell_gref)?;
            let sq_db = sq_page.queue(sq_k)?;
            let rq_db = rq_page.queue(rq_k)?;
            let sq = WqProducer::with_owner(
                region.slots::<WQE_LEN>(0, 1usize << sq_log2)?,
                sq_db.prod,
                sq_db.cons,
                0,
                shared_ring::abi::wqe::field::OWNER,
            );
            let rq = WqProducer::with_owner(
                region.slots::<WQE_LEN>(sq_pages * PAGE_SIZE, 1usize << rq_log2)?,
                rq_db.prod,
                rq_db.cons,
                0,
                shared_ring::abi::wqe::field::OWNER,
            );
            let kick = ctx.chan.doorbell.engine_kick()?;
            Ok((region, sq, rq, kick))
        })();
        let (region, sq, rq, kick) = match made {
            Ok(v) => v,
            Err(e) => {
                let _ = ctx.chan.call(Request::DestroyQp { qp });
                return Err(e);
            }
        };
        Ok(QueuePair {
            shared: Arc::new(QpShared {
                pd: self.pd.inner.clone(),
                handle: qp,
                _send_cq: self.send_cq.shared.clone(),
                _recv_cq: self.recv_cq.shared.clone(),
                _pages: region,
            }),
            ctx: ctx.clone(),
            sq,
            rq,
            kick,
            qp_num,
            max_inline: self.max_inline,
            max_sge: ctx
                .chan
                .limits
                .max_sge
                .map_or(MAX_SGE, |m| (m as usize).min(MAX_SGE)),
            mode: ctx.mode,
        })
    }
}

/// Connects a [`QueuePair`] from any thread ([`QueuePair::connector`]).
pub struct QpConnector {
    shared: Arc<QpShared>,
}

impl QpConnector {
    pub(crate) fn ctx_inner(&self) -> &CtxInner {
        self.shared.ctx()
    }

    /// The QP's handle.
    pub(crate) fn handle(&self) -> u32 {
        self.shared.handle
    }

    /// Same as [`QueuePair::connect`].
    pub fn connect(&self, remote: &QpEndpoint) -> Result<()> {
        let chan = &self.shared.ctx().chan;
        let addr = if remote.addr == chan.backend_addr {
            [0; 16]
        } else {
            remote.addr
        };
        chan.call(Request::Connect {
            qp: self.shared.handle,
            port: 0,
            addr,
            remote_qpn: remote.qp_num,
            private: shared_ring::abi::control::PrivData::NONE,
        })?;
        Ok(())
    }
}

impl QpConnector {
    /// Connects by address vector (`ConnectAv`): with `sq_psn` `None` the QP goes to RTR,
    /// with `Some(psn)` on to RTS (first send PSN `psn`). The backend checks the peer
    /// against the domain's allowed peers (`NotPermitted`). On a device with address
    /// vectors (the verbs device) the answer comes at once; the software device pairs with
    /// QP `av.qp_num` of this backend at RTR (answered when that QP names this one) and
    /// refuses another host's GID (`NotSupported`).
    pub fn connect_av(&self, av: &AddressVector, sq_psn: Option<u32>) -> Result<()> {
        self.shared.ctx().chan.call(Request::ConnectAv {
            qp: self.shared.handle,
            remote_qpn: av.qp_num,
            gid: av.gid,
            rq_psn: av.rq_psn,
            sq_psn: sq_psn.unwrap_or(0),
            lid: av.lid,
            path_mtu: av.path_mtu,
            rts: sq_psn.is_some(),
        })?;
        Ok(())
    }
}

struct QpShared {
    pd: Arc<PdInner>,
    handle: u32,
    _send_cq: Arc<CqShared>,
    _recv_cq: Arc<CqShared>,
    _pages: SharedRegion,
}

impl QpShared {
    fn ctx(&self) -> &CtxInner {
        &self.pd.ctx
    }
}

impl Drop for QpShared {
    fn drop(&mut self) {
        let chan = &self.pd.ctx.chan;
        if !chan.is_lost() {
            if let Err(e) = chan.call(Request::DestroyQp { qp: self.handle }) {
                tracing::warn!(qp = self.handle, "destroying a QP: {e}");
            }
        }
    }
}

/// A reliable-connected queue pair.
pub struct QueuePair {
    shared: Arc<QpShared>,
    /// The context (also `shared.pd.ctx`), one load from the post path's lost-channel check
    /// instead of three dependent ones.
    ctx: Arc<CtxInner>,
    sq: WqProducer,
    rq: WqProducer,
    kick: EngineKick,
    qp_num: u32,
    max_inline: u32,
    max_sge: usize,
    mode: Mode,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("handle", &self.shared.handle)
            .field("qp_num", &self.qp_num)
            .finish()
    }
}

#[derive(Clone, Copy)]
enum Queue {
    Send,
    Recv,
}

impl QueuePair {
    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }
    /// The backend's handle.
    pub fn handle(&self) -> u32 {
        self.shared.handle
    }
    /// The context the QP belongs to (connection management).
    pub(crate) fn ctx_inner(&self) -> &CtxInner {
        self.shared.ctx()
    }

    /// Where a peer connects to this QP.
    pub fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            addr: self.shared.ctx().chan.backend_addr,
            qp_num: self.qp_num,
        }
    }

    /// Connects to the peer QP at `remote` (both sides connect to each other's endpoint, as
    /// RC QPs do). Ready to send when it returns. A peer on the same backend is paired by QP
    /// number (`Connect` with address `::` and `remote_qpn`).
    pub fn connect(&mut self, remote: &QpEndpoint) -> Result<()> {
        self.connector().connect(remote)
    }

    /// Moves the QP to Error (`ModifyQp`): its posted work requests are flushed. For a QP
    /// with no connection to end (never connected, or its connect was refused);
    /// [`QueuePair::disconnect`] ends a connection.
    pub fn set_error(&mut self) -> Result<()> {
        self.shared.ctx().chan.call(Request::ModifyQp {
            qp: self.shared.handle,
            state: shared_ring::abi::control::QpState::Error,
        })?;
        Ok(())
    }

    /// A handle that connects this QP from another thread. The backend answers a pairing
    /// `Connect` only once both ends have named each other, so a program that connects one end
    /// before telling the peer its QP number (as `ibv_rc_pingpong`'s server does) must not
    /// wait for the answer on its own thread.
    pub fn connector(&self) -> QpConnector {
        QpConnector {
            shared: self.shared.clone(),
        }
    }

    /// Posts a receive buffer.
    pub fn post_recv(&mut self, local: &[MrSlice<'_>], wr_id: u64) -> Result<()> {
        let head = WqeHead {
            opcode: WqeOpcode::Recv,
            flags: flags::SIGNALED,
            wr_id,
            imm_data: 0,
            remote: None,
        };
        let words = sge_words(&head, local.iter().map(MrSlice::sge), self.max_sge)?;
        self.post_words(Queue::Recv, &words)
    }

    /// SEND of `local` (signaled).
    pub fn post_send(&mut self, local: &[MrSlice<'_>], wr_id: u64) -> Result<()> {
        self.post_send_wr(&SendWr::new(wr_id, SendOp::Send, WrData::Sges(local)))
    }

    /// SEND with immediate data.
    pub fn post_send_with_imm(
        &mut self,
        local: &[MrSlice<'_>],
        imm: u32,
        wr_id: u64,
    ) -> Result<()> {
        self.post_send_wr(&SendWr::new(
            wr_id,
            SendOp::SendWithImm(imm),
            WrData::Sges(local),
        ))
    }

    /// SEND of bytes carried in the WQE (no memory region needed; at most the QP's max inline).
    pub fn post_send_inline(&mut self, data: &[u8], wr_id: u64) -> Result<()> {
        self.post_send_wr(&SendWr::new(wr_id, SendOp::Send, WrData::Inline(data)))
    }

    /// RDMA WRITE of `local` to `remote`.
    #[inline]
    pub fn post_write(
        &mut self,
        local: &[MrSlice<'_>],
        remote: RemoteMr,
        wr_id: u64,
    ) -> Result<()> {
        let head = WqeHead {
            opcode: WqeOpcode::RdmaWrite,
            flags: flags::SIGNALED,
            wr_id,
            imm_data: 0,
            remote: Some(remote),
        };
        self.post_send_sge_slices(&head, local)
    }

    /// RDMA WRITE with immediate data (consumes a receive at the peer).
    pub fn post_write_with_imm(
        &mut self,
        local: &[MrSlice<'_>],
        remote: RemoteMr,
        imm: u32,
        wr_id: u64,
    ) -> Result<()> {
        self.post_send_wr(&SendWr::new(
            wr_id,
            SendOp::WriteWithImm(remote, imm),
            WrData::Sges(local),
        ))
    }

    /// RDMA READ of `remote` into `local`.
    pub fn post_read(&mut self, local: &[MrSlice<'_>], remote: RemoteMr, wr_id: u64) -> Result<()> {
        self.post_send_wr(&SendWr::new(
            wr_id,
            SendOp::Read(remote),
            WrData::Sges(local),
        ))
    }

    /// Posts any send-queue work request. The WQE is built straight as its sixteen words
    /// ([`sge_words`], [`inline_words`]) and stored into the slot: no `WqeRepr` on the way.
    #[inline]
    pub fn post_send_wr(&mut self, wr: &SendWr<'_>) -> Result<()> {
        match wr.data {
            WrData::Sges(s) => self.post_send_sge_slices(&WqeHead::of(wr), s),
            WrData::Inline(b) => {
                let words = inline_words(&WqeHead::of(wr), b, self.max_inline)?;
                self.post_words(Queue::Send, &words)
            }
        }
    }

    /// A send WQE over `local`, built as words and posted.
    #[inline(always)]
    fn post_send_sge_slices(&mut self, head: &WqeHead, local: &[MrSlice<'_>]) -> Result<()> {
        let words = sge_words(head, local.iter().map(MrSlice::sge), self.max_sge)?;
        self.post_words(Queue::Send, &words)
    }

    /// Posts a send-queue work request whose local data are raw SGEs (`lkey` of a region of
    /// [`ProtectionDomain::reg_grants`](crate::ProtectionDomain::reg_grants), `offset` from
    /// its first byte); the backend checks them. `inline` data, if given, replaces the SGEs.
    #[allow(clippy::too_many_arguments)]
    pub fn post_send_sges(
        &mut self,
        wr_id: u64,
        op: SendOp,
        sges: &[shared_ring::abi::wqe::Sge],
        inline: Option<&[u8]>,
        signaled: bool,
        solicited: bool,
        fence: bool,
    ) -> Result<()> {
        let (opcode, imm, remote) = match op {
            SendOp::Send => (WqeOpcode::Send, 0, None),
            SendOp::SendWithImm(i) => (WqeOpcode::SendWithImm, i, None),
            SendOp::Write(r) => (WqeOpcode::RdmaWrite, 0, Some(r)),
            SendOp::WriteWithImm(r, i) => (WqeOpcode::RdmaWriteWithImm, i, Some(r)),
            SendOp::Read(r) => (WqeOpcode::RdmaRead, 0, Some(r)),
        };
        let data = match inline {
            Some(b) => {
                if b.len() > self.max_inline as usize || opcode == WqeOpcode::RdmaRead {
                    return Err(Error::InvalidArgument(format!(
                        "{} inline bytes: over the QP's max inline {} or on an RDMA READ",
                        b.len(),
                        self.max_inline
                    )));
                }
                WqeData::inline(b)?
            }
            None => self.raw_sges(sges)?,
        };
        let mut fl = 0;
        if signaled {
            fl |= flags::SIGNALED;
        }
        if solicited {
            fl |= flags::SOLICITED;
        }
        if fence {
            fl |= flags::FENCE;
        }
        let wqe = WqeRepr {
            opcode,
            flags: fl,
            wr_id,
            imm_data: imm,
            remote_addr: remote.map_or(0, |r| r.addr),
            rkey: remote.map_or(0, |r| r.rkey),
            data,
        };
        self.post(Queue::Send, &wqe)
    }

    /// Posts a receive buffer given as raw SGEs (see [`QueuePair::post_send_sges`]).
    pub fn post_recv_sges(
        &mut self,
        sges: &[shared_ring::abi::wqe::Sge],
        wr_id: u64,
    ) -> Result<()> {
        let wqe = WqeRepr {
            opcode: WqeOpcode::Recv,
            flags: flags::SIGNALED,
            wr_id,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            data: self.raw_sges(sges)?,
        };
        self.post(Queue::Recv, &wqe)
    }

    /// The QP's largest inline send.
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }

    fn raw_sges(&self, sges: &[shared_ring::abi::wqe::Sge]) -> Result<WqeData> {
        if sges.len() > self.max_sge {
            return Err(self.too_many_sges(sges.len()));
        }
        Ok(WqeData::sges(sges)?)
    }

    fn too_many_sges(&self, n: usize) -> Error {
        too_many_sges(n, self.max_sge)
    }

    /// Writes one WQE into a raw slot, bypassing every client-side check. For tests of the
    /// backend's validation (garbage WQEs must give error completions, never a crash).
    #[doc(hidden)]
    pub fn post_raw_send_slot(&mut self, slot: &[u8; WQE_LEN]) -> Result<()> {
        self.post_bytes(Queue::Send, slot)
    }

    /// The send queue's producer and the engine's kick word, for benchmarks that drive the
    /// library's own rings with shared-ring's code (`examples/lib_costs.rs`: which part of the
    /// round trip is the library's and which the memory's). Not for applications: a post made
    /// this way skips every check and the lost-channel test; kick with
    /// [`QueuePair::raw_kick`] when `publish_and_check_kick` says so.
    #[doc(hidden)]
    pub fn raw_send_queue(&mut self) -> (&mut WqProducer, &mut EngineKick) {
        (&mut self.sq, &mut self.kick)
    }

    /// Notifies the engine (see [`QueuePair::raw_send_queue`]).
    #[doc(hidden)]
    pub fn raw_kick(&self) -> Result<()> {
        self.ctx.chan.kick()
    }

    /// Posts a WQE: its sixteen words stored straight into the slot (no byte buffer).
    #[inline]
    fn post(&mut self, q: Queue, wqe: &WqeRepr) -> Result<()> {
        self.post_words(q, &wqe.to_words())
    }

    /// Posts a WQE given as its words.
    #[inline]
    fn post_words(&mut self, q: Queue, words: &[u32; WQE_LEN / 4]) -> Result<()> {
        self.post_with(q, |p| p.write_words(words))
    }

    #[inline]
    fn post_bytes(&mut self, q: Queue, slot: &[u8; WQE_LEN]) -> Result<()> {
        self.post_with(q, |p| p.write(slot))
    }

    /// Writes a slot with `write`, then publishes it (bypass: the producer index and the kick
    /// check; mediated: a `PostSend`/`PostRecv` request).
    #[inline]
    fn post_with(
        &mut self,
        q: Queue,
        write: impl FnOnce(&mut WqProducer) -> std::result::Result<u32, QueueError>,
    ) -> Result<()> {
        let chan = &self.ctx.chan;
        chan.check_lost()?;
        let p = match q {
            Queue::Send => &mut self.sq,
            Queue::Recv => &mut self.rq,
        };
        write(p).map_err(|e| queue_error(q, e))?;
        match self.mode {
            Mode::Bypass => {
                if p.publish_and_check_kick(&mut self.kick) {
                    chan.kick()?;
                }
            }
            Mode::Mediated => {
                p.publish();
                let prod = p.prod_pvt();
                let qp = self.shared.handle;
                chan.call(match q {
                    Queue::Send => Request::PostSend { qp, prod },
                    Queue::Recv => Request::PostRecv { qp, prod },
                })?;
            }
        }
        Ok(())
    }
}

#[cold]
#[inline(never)]
fn too_long_for_remote(len: u64, remote: u64) -> Error {
    Error::InvalidArgument(format!(
        "{len} bytes do not fit the {remote}-byte remote region"
    ))
}

#[cold]
#[inline(never)]
fn too_many_sges(n: usize, max: usize) -> Error {
    Error::InvalidArgument(format!("{n} SGEs exceed the maximum of {max}"))
}

#[cold]
#[inline(never)]
fn inline_too_long(n: usize, max: u32) -> Error {
    Error::InvalidArgument(format!("{n} inline bytes exceed the QP's max inline {max}"))
}

#[cold]
#[inline(never)]
fn inline_on_read() -> Error {
    Error::InvalidArgument("an RDMA READ cannot have inline data".into())
}

/// A work request's WQE fields other than its data.
#[derive(Debug, Clone, Copy)]
struct WqeHead {
    opcode: WqeOpcode,
    /// [`flags`] bits other than `INLINE` (the data sets it).
    flags: u8,
    wr_id: u64,
    imm_data: u32,
    remote: Option<RemoteMr>,
}

impl WqeHead {
    #[inline(always)]
    fn of(wr: &SendWr<'_>) -> WqeHead {
        let (opcode, imm_data, remote) = match wr.op {
            SendOp::Send => (WqeOpcode::Send, 0, None),
            SendOp::SendWithImm(i) => (WqeOpcode::SendWithImm, i, None),
            SendOp::Write(r) => (WqeOpcode::RdmaWrite, 0, Some(r)),
            SendOp::WriteWithImm(r, i) => (WqeOpcode::RdmaWriteWithImm, i, Some(r)),
            SendOp::Read(r) => (WqeOpcode::RdmaRead, 0, Some(r)),
        };
        let mut flags = 0;
        if wr.signaled {
            flags |= flags::SIGNALED;
        }
        if wr.solicited {
            flags |= flags::SOLICITED;
        }
        if wr.fence {
            flags |= flags::FENCE;
        }
        WqeHead {
            opcode,
            flags,
            wr_id: wr.wr_id,
            imm_data,
            remote,
        }
    }

    /// The WQE's words with this head and the data's counts (`shared_ring::abi::wqe`'s
    /// builder, [`wqe::WqeHead::words`]); the payload words are left to the caller.
    #[inline(always)]
    fn words(&self, flags: u8, num_sge: u8, inline_len: u8) -> [u32; WQE_LEN / 4] {
        let (remote_addr, rkey) = self.remote.map_or((0, 0), |r| (r.addr, r.rkey));
        wqe::WqeHead {
            opcode: self.opcode,
            flags,
            wr_id: self.wr_id,
            imm_data: self.imm_data,
            remote_addr,
            rkey,
        }
        .words(num_sge, inline_len)
    }

    /// A remote region too short for `len` bytes is refused here, as the backend would.
    #[inline(always)]
    fn check_remote(&self, len: u64) -> Result<()> {
        match self.remote {
            Some(r) if len > r.len => Err(too_long_for_remote(len, r.len)),
            _ => Ok(()),
        }
    }
}

/// The words of a WQE whose data are `sges` (at most `max_sge`, itself at most [`MAX_SGE`]):
/// what `WqeRepr { data: WqeData::Sges { .. }, .. }.to_words()` gives, with the library's
/// checks (SGE count; the remote region's length for RDMA), built without the `WqeRepr`
/// and its SGE array (the post path: `examples/lib_costs.rs`).
#[inline(always)]
fn sge_words(
    head: &WqeHead,
    sges: impl ExactSizeIterator<Item = Sge>,
    max_sge: usize,
) -> Result<[u32; WQE_LEN / 4]> {
    let n = sges.len();
    if n > max_sge || n > MAX_SGE {
        return Err(too_many_sges(n, max_sge));
    }
    let mut words = head.words(head.flags & !flags::INLINE, n as u8, 0);
    let mut total = 0u64;
    for (i, s) in sges.take(MAX_SGE).enumerate() {
        wqe::put_sge(&mut words, i, &s);
        total += u64::from(s.length);
    }
    head.check_remote(total)?;
    Ok(words)
}

/// The words of a WQE carrying `data` inline (at most `max_inline`, itself at most
/// [`MAX_INLINE`]; never on an RDMA READ): what `WqeRepr { data: WqeData::Inline { .. }, .. }
/// .to_words()` gives, with the library's checks.
#[inline]
fn inline_words(head: &WqeHead, data: &[u8], max_inline: u32) -> Result<[u32; WQE_LEN / 4]> {
    if data.len() > max_inline as usize {
        return Err(inline_too_long(data.len(), max_inline));
    }
    if head.opcode == WqeOpcode::RdmaRead {
        return Err(inline_on_read());
    }
    // `max_inline` never exceeds MAX_INLINE (`build` checks), so this only refuses what the
    // protocol cannot carry.
    let WqeData::Inline { bytes, len } = WqeData::inline(data)? else {
        unreachable!("WqeData::inline gives inline data");
    };
    let mut words = head.words(head.flags | flags::INLINE, 0, len);
    wqe::put_inline(&mut words, &bytes);
    head.check_remote(u64::from(len))?;
    Ok(words)
}

#[cold]
#[inline(never)]
fn queue_error(q: Queue, e: QueueError) -> Error {
    let name = match q {
        Queue::Send => "send queue",
        Queue::Recv => "receive queue",
    };
    match e {
        QueueError::Full { size } => Error::QueueFull { queue: name, size },
        e => Error::protocol(format!("{name}: {e}")),
    }
}

impl<'a> SendWr<'a> {
    /// A signaled request without solicited or fence flags.
    pub fn new(wr_id: u64, op: SendOp, data: WrData<'a>) -> Self {
        SendWr {
            wr_id,
            op,
            data,
            signaled: true,
            solicited: false,
            fence: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data of a request, for [`reference`].
    enum Data<'a> {
        Sges(&'a [Sge]),
        Inline(&'a [u8]),
    }

    /// The send WQE as the general path builds it (the library's post path before the word
    /// builders): a `WqeRepr` with `WqeData`, its checks in their order, then `to_words`.
    fn reference(
        wr: &SendWr<'_>,
        data: &Data<'_>,
        max_sge: usize,
        max_inline: u32,
    ) -> Result<[u32; 16]> {
        let (opcode, imm, remote) = match wr.op {
            SendOp::Send => (WqeOpcode::Send, 0, None),
            SendOp::SendWithImm(i) => (WqeOpcode::SendWithImm, i, None),
            SendOp::Write(r) => (WqeOpcode::RdmaWrite, 0, Some(r)),
            SendOp::WriteWithImm(r, i) => (WqeOpcode::RdmaWriteWithImm, i, Some(r)),
            SendOp::Read(r) => (WqeOpcode::RdmaRead, 0, Some(r)),
        };
        let data = match *data {
            Data::Sges(list) => {
                if list.len() > max_sge || list.len() > MAX_SGE {
                    return Err(too_many_sges(list.len(), max_sge));
                }
                WqeData::sges(list)?
            }
            Data::Inline(b) => {
                if b.len() > max_inline as usize {
                    return Err(Error::InvalidArgument(format!(
                        "{} inline bytes exceed the QP's max inline {}",
                        b.len(),
                        max_inline
                    )));
                }
                if opcode == WqeOpcode::RdmaRead {
                    return Err(Error::InvalidArgument(
                        "an RDMA READ cannot have inline data".into(),
                    ));
                }
                WqeData::inline(b)?
            }
        };
        if let Some(r) = remote {
            if data.total_len() > r.len {
                return Err(too_long_for_remote(data.total_len(), r.len));
            }
        }
        let mut fl = 0;
        if wr.signaled {
            fl |= flags::SIGNALED;
        }
        if wr.solicited {
            fl |= flags::SOLICITED;
        }
        if wr.fence {
            fl |= flags::FENCE;
        }
        Ok(WqeRepr {
            opcode,
            flags: fl,
            wr_id: wr.wr_id,
            imm_data: imm,
            remote_addr: remote.map_or(0, |r| r.addr),
            rkey: remote.map_or(0, |r| r.rkey),
            data,
        }
        .to_words())
    }

    fn same(a: Result<[u32; 16]>, b: Result<[u32; 16]>, what: &str) {
        match (a, b) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{what}"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{what}"),
            (a, b) => panic!("{what}: fast {a:?}, general {b:?}"),
        }
    }

    /// The word builders of the post path give the general path's WQE words, or its error,
    /// for every op, flag combination, SGE count (0 to past `MAX_SGE`, against QP limits of
    /// 1 and 2), inline length (0 to past `MAX_INLINE`, against several QP limits) and
    /// remote length (shorter, equal, longer than the data).
    #[test]
    fn word_builders_give_the_general_paths_wqe() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut oks, mut errs) = (0, 0);
        for i in 0..4000 {
            let r = next();
            let remote = RemoteMr {
                addr: next(),
                len: r % 200,
                rkey: (r >> 8) as u32,
            };
            let op = match i % 5 {
                0 => SendOp::Send,
                1 => SendOp::SendWithImm((r >> 16) as u32),
                2 => SendOp::Write(remote),
                3 => SendOp::WriteWithImm(remote, (r >> 24) as u32),
                _ => SendOp::Read(remote),
            };
            let wr = SendWr {
                wr_id: next(),
                op,
                data: WrData::Inline(&[]),
                signaled: r & 1 != 0,
                solicited: r & 2 != 0,
                fence: r & 4 != 0,
            };
            let head = WqeHead::of(&wr);
            // SGEs.
            let sges: Vec<Sge> = (0..(r >> 32) % 4)
                .map(|_| {
                    let v = next();
                    Sge {
                        offset: v,
                        length: (v >> 40) as u32 % 150,
                        lkey: (v >> 8) as u32,
                    }
                })
                .collect();
            let max_sge = 1 + (r >> 36) as usize % MAX_SGE;
            let fast = sge_words(&head, sges.iter().copied(), max_sge);
            let general = reference(&wr, &Data::Sges(&sges), max_sge, MAX_INLINE as u32);
            if general.is_ok() {
                oks += 1;
            } else {
                errs += 1;
            }
            same(fast, general, &format!("{wr:?} {sges:?} max_sge {max_sge}"));
            // Inline.
            let mut bytes = [0u8; MAX_INLINE + 8];
            for c in bytes.chunks_exact_mut(8) {
                c.copy_from_slice(&next().to_le_bytes());
            }
            let data = &bytes[..(r >> 40) as usize % (MAX_INLINE + 8)];
            let max_inline =
                [0, 16, MAX_INLINE as u32, MAX_INLINE as u32 + 8][(r >> 48) as usize % 4];
            let wr_inline = SendWr {
                data: WrData::Inline(data),
                ..wr
            };
            same(
                inline_words(&WqeHead::of(&wr_inline), data, max_inline),
                reference(&wr_inline, &Data::Inline(data), MAX_SGE, max_inline),
                &format!("{wr_inline:?} max_inline {max_inline}"),
            );
        }
        // Both outcomes were exercised, many times.
        assert!(oks > 500 && errs > 500, "{oks} built, {errs} refused");
    }

    /// `post_recv`'s words: a signaled RECV over the SGEs, no remote, as `WqeRepr` gives them.
    #[test]
    fn recv_words_are_a_signaled_recv() {
        let sges = [
            Sge {
                offset: 0x1234_5678_9abc,
                length: 77,
                lkey: 9,
            },
            Sge {
                offset: 3,
                length: 1 << 20,
                lkey: 10,
            },
        ];
        for n in 0..=MAX_SGE {
            let head = WqeHead {
                opcode: WqeOpcode::Recv,
                flags: flags::SIGNALED,
                wr_id: 0xfeed_0000 + n as u64,
                imm_data: 0,
                remote: None,
            };
            let want = WqeRepr {
                opcode: WqeOpcode::Recv,
                flags: flags::SIGNALED,
                wr_id: head.wr_id,
                imm_data: 0,
                remote_addr: 0,
                rkey: 0,
                data: WqeData::sges(&sges[..n]).unwrap(),
            };
            assert_eq!(
                sge_words(&head, sges[..n].iter().copied(), MAX_SGE).unwrap(),
                want.to_words()
            );
        }
    }
}
