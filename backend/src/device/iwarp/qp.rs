//! A QP whose peer is at the other end of a TCP stream: its connection state, how the
//! engine drives it (one pass: receive, transmit, complete), its completions in SQ order and
//! its end (Terminate, reset, close, flush).
//!
//! Everything here runs on the engine thread that owns the QP's channel, under the
//! connection lock (lock order: table, connection, send side, receive side, CQs); the control
//! path takes the connection lock only to attach and to close the socket.

use std::collections::VecDeque;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use iwarp_proto::fpdu;
use iwarp_proto::message::MessageRepr;
use iwarp_proto::rdmap::{Opcode, ReadRequestRepr};
use iwarp_proto::terminate::{layer, TermCode, TerminateRepr};
use iwarp_proto::WireError;
use mio::{Interest, Registry, Token};
use shared_ring::abi::control::QpState;
use shared_ring::abi::cqe::{CqeOpcode, CqeStatus};
use shared_ring::abi::event::EventKind;
use shared_ring::abi::wqe::WQE_LEN;

use super::rx::Rx;
use super::tx::{Payload, Tx};
use super::{Established, Role, Rtr};
use crate::device::exec::{self, Ctx};
use crate::device::mr::Seg;
use crate::device::objects::{lock, Qp, SegList};

/// A send WQE between its start and its completion (completions leave in SQ order).
pub(crate) struct Inflight {
    pub(crate) wr_id: u64,
    pub(crate) opcode: CqeOpcode,
    pub(crate) signaled: bool,
    pub(crate) len: u64,
    /// `None` while it runs.
    pub(crate) status: Option<CqeStatus>,
}

/// An RDMA Read this QP sent and waits for the response of (ORD bounds them).
pub(crate) struct OutRead {
    /// The READ's [`Inflight`] (`None`: the RTR read of connection setup).
    pub(crate) seq: Option<u64>,
    /// Where the response goes: the READ's local SGEs, resolved when it was sent.
    pub(crate) segs: SegList,
    pub(crate) len: u64,
    pub(crate) got: u64,
    /// The sink STag and TO the request named; the responses must carry them.
    pub(crate) stag: u32,
    pub(crate) base_to: u64,
}

/// An RDMA Read the peer asked for, to answer in order (IRD bounds them).
pub(crate) struct InRead {
    pub(crate) src: Option<Seg>,
    pub(crate) stag: u32,
    pub(crate) to: u64,
    pub(crate) len: u64,
}

/// The RECV an incoming SEND is being placed into.
pub(crate) struct CurRecv {
    pub(crate) raw: [u8; WQE_LEN],
    pub(crate) segs: SegList,
    pub(crate) cap: u64,
}

/// Most send WQEs a connection keeps between start and completion: the SQ's size (a slot
/// is given back when its WQE starts, so this is what bounds a guest's backlog).
fn inflight_cap(qp: &Qp) -> usize {
    lock(&qp.send).sq.size() as usize
}

/// The connection of a remote QP.
pub(crate) struct Conn {
    pub(crate) sock: mio::net::TcpStream,
    pub(crate) crc: bool,
    /// Largest ULPDU, so that an FPDU fills at most one segment of the path MSS
    /// (`fpdu::mulpdu`), as the socket last reported it ([`Conn::refresh_mulpdu`]).
    pub(crate) mulpdu: usize,
    /// Bytes of multi-FPDU messages still to start before the socket's MSS is read again.
    pub(crate) mss_look: usize,
    pub(crate) ird: usize,
    pub(crate) ord: usize,
    /// Responder: nothing is sent before the initiator's first FPDU (its RTR) arrived.
    pub(crate) wait_rtr: bool,
    pub(crate) tx: Tx,
    pub(crate) rx: Rx,
    pub(crate) inflight: VecDeque<Inflight>,
    /// Sequence number of the next [`Inflight`].
    pub(crate) next_seq: u64,
    pub(crate) orq: VecDeque<OutRead>,
    pub(crate) irq: VecDeque<InRead>,
    /// The SQ's head: a READ waiting for ORD room.
    pub(crate) held: Option<shared_ring::abi::wqe::WqeRepr>,
    /// Next MSN to send, per untagged queue (send, read request, terminate).
    pub(crate) msn: [u32; 3],
    /// Next MSN expected, per untagged queue.
    pub(crate) expect: [u32; 3],
    pub(crate) recv: Option<CurRecv>,
    /// A Terminate is queued or arrived: nothing more is sent, the socket closes once the
    /// queued bytes are out.
    pub(crate) closing: bool,
    /// The socket is shut: no more I/O.
    pub(crate) dead: bool,
    /// `QpDisconnected` was posted.
    pub(crate) told: bool,
}

/// A remote QP: its socket's readiness (set from `mio` events, cleared when a read or write
/// comes up short) and its connection.
pub(crate) struct RemoteQp {
    pub(crate) token: Token,
    pub(crate) rx_ready: AtomicBool,
    pub(crate) tx_ready: AtomicBool,
    /// The peer closed its end or the socket failed (seen even while a SEND that waits for
    /// its RECV keeps the stream unread).
    pub(crate) hup: AtomicBool,
    pub(crate) conn: Mutex<Conn>,
}

/// What a readiness event of a socket said.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Readiness {
    rx: bool,
    tx: bool,
    hup: bool,
}

impl Readiness {
    pub(crate) fn of(ev: &mio::event::Event) -> Self {
        Readiness {
            rx: ev.is_readable() || ev.is_read_closed() || ev.is_error(),
            tx: ev.is_writable() || ev.is_write_closed() || ev.is_error(),
            hup: ev.is_read_closed() || ev.is_error(),
        }
    }
}

impl RemoteQp {
    /// Records a readiness event of the socket.
    pub(crate) fn mark(&self, what: Readiness) {
        if what.rx {
            self.rx_ready.store(true, Ordering::Relaxed);
        }
        if what.tx {
            self.tx_ready.store(true, Ordering::Relaxed);
        }
        if what.hup {
            self.hup.store(true, Ordering::Relaxed);
        }
    }
}

/// Bytes of multi-FPDU messages between two reads of the socket's MSS
/// ([`Conn::refresh_mulpdu`]).
pub(crate) const MSS_LOOK_BYTES: usize = 1 << 20;

/// The MULPDU for the MSS the socket reports (`TCP_MAXSEG`).
fn mulpdu_of(mss: usize) -> usize {
    fpdu::mulpdu(mss.clamp(256, 65532))
}

/// Idle time before a silent peer is probed, unless `[cm] peer-probe-s` says otherwise (a
/// dead one is noticed about twice this later).
pub const DEFAULT_PEER_PROBE: std::time::Duration = std::time::Duration::from_secs(10);

/// The keepalive of a stream whose peer is probed after `probe` of silence: then every
/// quarter of it, four times (a peer that never answers is declared dead about `2 × probe`
/// after the stream went quiet); and the user timeout for unacknowledged bytes, `2 × probe`.
pub(crate) fn keepalive_of(
    probe: std::time::Duration,
) -> (socket2::TcpKeepalive, std::time::Duration) {
    let ka = socket2::TcpKeepalive::new()
        .with_time(probe)
        .with_interval(probe / 4)
        .with_retries(4);
    (ka, probe * 2)
}

/// Takes over an established stream for `qp`: non-blocking, `TCP_NODELAY`, FPDUs sized to the
/// MSS, registered with the owning engine's poller; the initiator's RTR is queued as the
/// first FPDU. Returns the remote QP and whether it may go to RTS now (a responder waiting
/// for the RTR may not).
pub(crate) fn attach(
    qp: &Qp,
    est: Established,
    registry: &Registry,
) -> std::io::Result<(Arc<RemoteQp>, bool)> {
    let std = est.stream;
    std.set_nonblocking(true)?;
    std.set_nodelay(true)?;
    let sref = socket2::SockRef::from(&std);
    let mss = sref.tcp_mss().unwrap_or(1460) as usize;
    // A peer host that dies without a FIN or RST: keepalive probes notice an idle stream,
    // the user timeout one with unacknowledged bytes; either ends in a socket error.
    let (probe, user_timeout) = keepalive_of(est.peer_probe);
    if let Err(e) = sref
        .set_tcp_keepalive(&probe)
        .and_then(|()| sref.set_tcp_user_timeout(Some(user_timeout)))
    {
        tracing::debug!(qp = qp.num.0, "keepalive not set: {e}");
    }
    let mut sock = mio::net::TcpStream::from_std(std);
    let token = Token(qp.num.0 as usize);
    registry.register(&mut sock, token, Interest::READABLE | Interest::WRITABLE)?;
    let wait_rtr = est.role == Role::Responder && est.rtr != Rtr::None;
    let mut c = Conn {
        sock,
        crc: est.crc,
        mulpdu: mulpdu_of(mss),
        mss_look: 0,
        ird: usize::from(est.ird.max(1)),
        ord: usize::from(est.ord.max(1)),
        wait_rtr,
        tx: Tx::default(),
        rx: Rx::default(),
        inflight: VecDeque::new(),
        next_seq: 0,
        orq: VecDeque::new(),
        irq: VecDeque::new(),
        held: None,
        msn: [1; 3],
        expect: [1; 3],
        recv: None,
        closing: false,
        dead: false,
        told: false,
    };
    if est.role == Role::Initiator {
        match est.rtr {
            Rtr::None => {}
            Rtr::Write => {
                let m = MessageRepr::tagged(Opcode::Write, true, 0, 0);
                c.tx.fpdu(c.crc, &m, Payload::None)
                    .map_err(std::io::Error::other)?;
            }
            Rtr::Read => {
                let empty = ReadRequestRepr {
                    sink_stag: 0,
                    sink_to: 0,
                    size: 0,
                    source_stag: 0,
                    source_to: 0,
                };
                let m = read_request(&mut c, empty);
                c.tx.fpdu(c.crc, &m, Payload::None)
                    .map_err(std::io::Error::other)?;
                c.orq.push_back(OutRead {
                    seq: None,
                    segs: [None, None],
                    len: 0,
                    got: 0,
                    stag: 0,
                    base_to: 0,
                });
            }
        }
    }
    let r = Arc::new(RemoteQp {
        token,
        rx_ready: AtomicBool::new(true),
        tx_ready: AtomicBool::new(true),
        hup: AtomicBool::new(false),
        conn: Mutex::new(c),
    });
    Ok((r, !wait_rtr))
}

/// The next Read Request (consumes an MSN of the read queue).
pub(crate) fn read_request(c: &mut Conn, request: ReadRequestRepr) -> MessageRepr<'static> {
    let msn = c.msn[1];
    c.msn[1] = msn.wrapping_add(1);
    MessageRepr::read_request(msn, request)
}

/// The completion status a requester gives its failed work request when the peer
/// terminated the stream with `code` (the statuses of the intra-host path).
fn status_of(code: TermCode) -> CqeStatus {
    match (code.layer, code.etype) {
        (layer::RDMAP, 1) | (layer::DDP, 1) => CqeStatus::RemoteAccessError,
        (layer::DDP, 2) => CqeStatus::RemoteInvalidRequest,
        _ => CqeStatus::RemoteOperationError,
    }
}

/// Control path: the QP is destroyed (or its channel closed): the socket closes now, so the
/// peer sees the end of the stream.
pub(crate) fn close(r: &RemoteQp) {
    let mut c = lock(&r.conn);
    if !c.dead {
        c.dead = true;
        let _ = c.sock.shutdown(Shutdown::Both);
    }
}

/// Control path: the application disconnects a remote QP (`cm_disconnect`): the socket closes
/// now, so the peer sees the end of the stream, the QP goes to Error and its channel gets
/// `QpDisconnected` — once: the end of the stream the engine then sees tells nobody again.
pub(crate) fn disconnect(qp: &Qp, r: &RemoteQp) {
    lock(&r.conn).disconnected(qp, &"disconnected by this end");
}

impl Conn {
    /// Before a message of `len` bytes is cut: FPDUs follow the MSS the socket reports now
    /// (`TCP_MAXSEG`, Linux's current `mss_cache`, which siw also reads per WQE), not only
    /// the one it reported at attach. Right after the handshake Linux bounds the MSS by half
    /// the largest window the peer has advertised so far: on loopback 32 741 of 65 483 until
    /// the peer's window grows, so FPDUs cut to the first value were half as long as the
    /// path allows for the whole connection (twice the FPDUs, headers and `readv`s per
    /// byte). Read only for messages longer than one FPDU, once per [`MSS_LOOK_BYTES`] of
    /// them (the first one at once): no system call on the small-message path.
    pub(crate) fn refresh_mulpdu(&mut self, len: usize) {
        if len <= self.mulpdu {
            return;
        }
        if self.mss_look > len {
            self.mss_look -= len;
            return;
        }
        self.mss_look = MSS_LOOK_BYTES;
        if let Ok(mss) = socket2::SockRef::from(&self.sock).tcp_mss() {
            self.mulpdu = mulpdu_of(mss as usize);
        }
    }

    /// Starts tracking a send WQE; returns its sequence number.
    pub(crate) fn push_inflight(&mut self, wr_id: u64, opcode: CqeOpcode, signaled: bool) -> u64 {
        self.inflight.push_back(Inflight {
            wr_id,
            opcode,
            signaled,
            len: 0,
            status: None,
        });
        self.next_seq += 1;
        self.next_seq - 1
    }

    fn get(&mut self, seq: u64) -> Option<&mut Inflight> {
        let front = self.next_seq - self.inflight.len() as u64;
        let i = seq.checked_sub(front)?;
        self.inflight.get_mut(usize::try_from(i).ok()?)
    }

    /// A send WQE ended (its bytes are out, its Read Response arrived, or it failed).
    pub(crate) fn mark(&mut self, seq: u64, status: CqeStatus, len: u64) {
        if let Some(f) = self.get(seq) {
            if f.status.is_none() {
                f.status = Some(status);
                f.len = len;
            }
        }
    }

    pub(crate) fn set_len(&mut self, seq: u64, len: u64) {
        if let Some(f) = self.get(seq) {
            f.len = len;
        }
    }

    /// The peer ended the connection (or it broke): QP to Error, `QpDisconnected` once.
    pub(crate) fn disconnected(&mut self, qp: &Qp, why: &dyn std::fmt::Display) {
        tracing::debug!(qp = qp.num.0, "iWARP stream ended: {why}");
        if !self.dead {
            self.dead = true;
            let _ = self.sock.shutdown(Shutdown::Both);
        }
        qp.fail(None);
        self.tell(qp);
    }

    fn tell(&mut self, qp: &Qp) {
        if !self.told && !qp.destroyed.load(Ordering::Relaxed) {
            self.told = true;
            qp.ch.event(EventKind::QpDisconnected, qp.num.0, 0);
        }
    }

    /// A protocol error found here: Terminate (after the bytes already queued), QP to Error.
    /// `quote` is the offending segment as siw copies it (its MPA length field and DDP
    /// header, then — with `rdmap` — its Read Request header).
    pub(crate) fn terminate(&mut self, qp: &Qp, code: TermCode, quote: Option<&[u8]>, rdmap: bool) {
        tracing::debug!(qp = qp.num.0, ?code, "sending Terminate");
        if !self.closing && !self.dead {
            let msn = self.msn[2];
            self.msn[2] = msn.wrapping_add(1);
            self.tx.cur = None;
            let t = match quote {
                Some(block) => TerminateRepr::with_header(code, rdmap, block),
                None => TerminateRepr::bare(code),
            };
            let sent = self
                .tx
                .fpdu(self.crc, &MessageRepr::terminate(msn, t), Payload::None);
            if let Err(e) = sent {
                // A quote the codec refuses (it never should): the code alone still goes.
                tracing::warn!(qp = qp.num.0, "Terminate quote refused: {e}");
                let bare = MessageRepr::terminate(msn, TerminateRepr::bare(code));
                let _ = self.tx.fpdu(self.crc, &bare, Payload::None);
            }
        }
        self.closing = true;
        qp.fail(Some(EventKind::QpFatal));
    }

    /// The codec refused to frame a message of ours (it never should): the stream cannot go
    /// on, so the peer gets a local catastrophic error and the QP fails.
    pub(crate) fn local_failure(&mut self, qp: &Qp, e: &WireError) {
        tracing::error!(qp = qp.num.0, "cannot frame an outgoing FPDU: {e}");
        self.terminate(qp, TermCode::RDMAP_LOCAL_CATASTROPHIC, None, false);
    }

    /// The peer sent a Terminate: the oldest running WQE fails with the matching status,
    /// the QP goes to Error.
    pub(crate) fn terminated(&mut self, qp: &Qp, code: TermCode) {
        tracing::debug!(qp = qp.num.0, ?code, "Terminate received");
        let st = status_of(code);
        if let Some(f) = self.inflight.iter_mut().find(|f| f.status.is_none()) {
            f.status = Some(st);
        }
        self.closing = true;
        qp.fail(Some(EventKind::QpFatal));
    }
}

/// One pass of the engine over a remote QP; `true` if it did work.
pub(crate) fn process(ctx: &Ctx<'_>, qp: &Arc<Qp>, r: &RemoteQp, budget: &mut usize) -> bool {
    let mut c = lock(&r.conn);
    let mut did = false;
    if qp.state() != QpState::Error && !c.dead && c.rx.blocked && r.hup.load(Ordering::Relaxed) {
        // The peer is gone; the message waiting for a RECV will never be completed.
        c.disconnected(qp, &"the peer closed the stream");
    }
    if qp.state() != QpState::Error && !c.dead {
        if r.rx_ready.load(Ordering::Relaxed) || c.rx.buffered() {
            did |= super::rx::run(ctx, qp, r, &mut c, budget);
        }
        if qp.state() != QpState::Error && !c.dead {
            did |= super::tx::run(ctx, qp, r, &mut c, budget);
        }
    }
    did |= complete(qp, &mut c);
    if qp.state() == QpState::Error {
        did |= wind_down(qp, r, &mut c);
        drop(c);
        did |= exec::flush(qp);
    }
    did
}

/// Writes the completions of the finished WQEs at the head, in order.
fn complete(qp: &Qp, c: &mut Conn) -> bool {
    let mut did = false;
    while c.inflight.front().is_some_and(|f| f.status.is_some()) {
        let Some(f) = c.inflight.pop_front() else {
            break;
        };
        did = true;
        if !finish(qp, &f) {
            break;
        }
    }
    did
}

/// The CQE (and counters) of a finished send WQE; `false` if the QP failed.
fn finish(qp: &Qp, f: &Inflight) -> bool {
    let st = f.status.unwrap_or(CqeStatus::WrFlushError);
    let ok = st == CqeStatus::Success;
    if st != CqeStatus::WrFlushError {
        qp.ch.stats.op(if ok { f.len } else { 0 });
        if !ok {
            qp.ch.stats.error();
        }
        qp.counters.send(ok, f.len);
    }
    if !ok || f.signaled {
        let c = exec::cqe(qp, f.wr_id, f.opcode, st, f.len);
        if !qp.send_cq.complete(&c, false) {
            qp.fail(Some(EventKind::QpFatal));
            return false;
        }
    }
    if !ok {
        qp.fail(None);
        return false;
    }
    true
}

/// The QP is in Error: a queued Terminate goes out, then the socket closes; every WQE the
/// connection holds completes (its own status or flushed), before the queues' WQEs.
fn wind_down(qp: &Qp, r: &RemoteQp, c: &mut Conn) -> bool {
    let mut did = false;
    if !c.dead {
        let out = c.closing && !c.tx.is_empty() && r.tx_ready.load(Ordering::Relaxed);
        let drained = if out {
            match c.tx.send(&c.sock) {
                Ok(all) => {
                    if !all {
                        r.tx_ready.store(false, Ordering::Relaxed);
                    }
                    all
                }
                Err(_) => true,
            }
        } else {
            !c.closing || c.tx.is_empty()
        };
        did |= out;
        if drained {
            c.dead = true;
            // Only our direction: closing the receive side with unread bytes in it would
            // answer with a reset, and a reset may destroy the Terminate before the peer has
            // read it. The socket closes for good when the QP is destroyed.
            let _ = c.sock.shutdown(Shutdown::Write);
            c.tell(qp);
            did = true;
        }
    }
    while let Some(mut f) = c.inflight.pop_front() {
        did = true;
        if f.status == Some(CqeStatus::Success) && !f.signaled {
            continue;
        }
        if f.status.is_none() {
            f.status = Some(CqeStatus::WrFlushError);
        }
        finish(qp, &f);
    }
    c.orq.clear();
    c.irq.clear();
    c.tx.cur = None;
    if let Some(w) = c.held.take() {
        did = true;
        let cqe = exec::cqe(
            qp,
            w.wr_id,
            exec::cqe_opcode(w.opcode),
            CqeStatus::WrFlushError,
            0,
        );
        qp.send_cq.complete(&cqe, false);
    }
    if let Some(rc) = c.recv.take() {
        did = true;
        let cqe = exec::cqe(
            qp,
            exec::wr_id_of(&rc.raw),
            CqeOpcode::Recv,
            CqeStatus::WrFlushError,
            0,
        );
        qp.recv_cq.complete(&cqe, false);
    }
    did
}

/// Before the engine sleeps: whether a pass over the remote QP would do work.
pub(crate) fn has_work(qp: &Qp, r: &RemoteQp) -> bool {
    let c = lock(&r.conn);
    let state = qp.state();
    if state == QpState::Error {
        // A Terminate waiting for room in a full socket waits for the writable event.
        let io = !c.dead && (!c.closing || c.tx.is_empty() || r.tx_ready.load(Ordering::Relaxed));
        return io || !c.inflight.is_empty() || c.held.is_some() || c.recv.is_some();
    }
    if c.inflight.front().is_some_and(|f| f.status.is_some()) {
        return true;
    }
    if c.dead {
        return false;
    }
    if r.rx_ready.load(Ordering::Relaxed) || c.rx.buffered() {
        if !c.rx.blocked || r.hup.load(Ordering::Relaxed) {
            return true;
        }
        if lock(&qp.recv).rq.available().map_or(true, |n| n > 0) {
            return true;
        }
    }
    if !r.tx_ready.load(Ordering::Relaxed) || c.closing {
        return false;
    }
    if !c.tx.is_empty() || c.tx.cur.is_some() || (!c.irq.is_empty() && !c.wait_rtr) {
        return true;
    }
    if c.wait_rtr || state != QpState::Rts {
        return false;
    }
    if c.held.is_some() {
        return c.orq.len() < c.ord;
    }
    let cap = inflight_cap(qp);
    c.inflight.len() < cap && lock(&qp.send).sq.available().is_ok_and(|n| n > 0)
}
