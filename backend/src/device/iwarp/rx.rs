//! The receive half: an FPDU's MPA length and DDP/RDMAP header are read into a small private
//! buffer and checked (STag, bounds, access, MSN, a RECV to take) before a byte of payload
//! is placed; the payload is then read straight into the target range of guest memory, in
//! the same `readv` as the FPDU's pad and CRC and the next FPDU's first bytes. The private
//! buffer is filled as far as it goes (128 bytes): what follows a header in it — a small
//! message's payload and trailer, the next FPDU — is copied into place before the socket is
//! read again, so a small message costs one read. The CRC is
//! summed over the placed bytes as each `readv` places them (read where they lie, while they
//! are in the cache) and checked before anything is completed.
//!
//! Framing, headers, Read Request and Terminate bodies and the CRC are read with the
//! `iwarp-proto` codec (`frame_len`, `MessageRepr::parse`, `FpduRepr`, `FpduCrc`), and its
//! errors become Terminate codes through `TermCode::for_error`; what needs the QP (MSN,
//! STag, bounds, access, a RECV) is checked here.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use shared_ring::abi::control::{access, QpState};
use shared_ring::abi::cqe::{flags as cqe_flags, CqeOpcode, CqeStatus};
use shared_ring::abi::event::EventKind;
use shared_ring::abi::wqe::{WqeOpcode, WqeRepr, WQE_LEN};
use shared_ring::mem::RecvList;

use iwarp_proto::ddp::{BufferModel, DdpRepr, Segment, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
use iwarp_proto::fpdu::{self, Fpdu, FpduCrc, FpduRepr, Framing, CRC_LEN, HEADER_LEN as MPA_LEN};
use iwarp_proto::message::{Body, MessageRepr};
use iwarp_proto::rdmap::{self, Opcode, ReadRequestRepr, READ_REQUEST_LEN};
use iwarp_proto::terminate::TermCode;
use iwarp_proto::WireError;

use super::qp::{Conn, CurRecv, InRead, RemoteQp};
use super::tx::{crc_segs, for_ranges};
use crate::device::exec::{self, Ctx};
use crate::device::mr::RemoteFault;
use crate::device::objects::{lock, Qp, SegList};

/// Bytes read before the header's kind is known: the shortest FPDU head (tagged).
const PREFIX: usize = MPA_LEN + TAGGED_HEADER_LEN;
/// Largest ULPDU read whole into the private buffer: a Read Request (46 bytes) or a
/// Terminate (at most 70); a longer one is refused before it is read.
const MAX_PRIVATE_ULPDU: usize = 96;
/// The MPA length field and DDP header of a segment, as a Terminate quotes them.
const QUOTE_MAX: usize = MPA_LEN + UNTAGGED_HEADER_LEN;

/// An FPDU whose header was accepted and whose payload is being placed.
struct Placing {
    opcode: Opcode,
    last: bool,
    /// Untagged: the message offset of the payload.
    mo: u32,
    ulpdu: usize,
    plen: usize,
    got: usize,
    pad: usize,
    /// CRC of the length field, header and the payload placed so far (when CRCs are on).
    crc: FpduCrc,
    /// Where the payload goes: segments and the message offset of the first byte.
    dst: Option<(SegList, usize)>,
    /// The MPA length and DDP header as received (a Terminate quotes them).
    quote: [u8; QUOTE_MAX],
    qlen: usize,
}

/// What the front of an FPDU announces, from its first four bytes.
struct Head {
    ulpdu: usize,
    ddp_len: usize,
    /// A Read Request or Terminate: its body is the message, read whole into `buf`.
    whole: Option<Opcode>,
}

/// An FPDU's message as the codec read it, owned (the buffer is read into again).
struct Msg {
    opcode: Opcode,
    ddp: DdpRepr,
    body: MsgBody,
}

enum MsgBody {
    Data,
    ReadRequest(ReadRequestRepr),
    Terminate(TermCode),
}

/// The receive state of a connection.
pub(crate) struct Rx {
    /// Bytes of the stream read ahead of where it is processed: from the start of the next
    /// FPDU (its header, the whole FPDU for a Read Request or Terminate, and whatever
    /// followed it in the same read: a small message arrives whole in one read).
    buf: [u8; 128],
    have: usize,
    /// While an FPDU is being placed: `buf[pos..have]` is what follows its header (payload,
    /// pad and CRC, then the next FPDU), to place before reading the socket again.
    pos: usize,
    cur: Option<Placing>,
    trailer: [u8; 8],
    tail: usize,
    /// A SEND waits for a RECV to be posted (the stream is not read meanwhile: TCP's flow
    /// control holds the sender, as an RC QP with infinite RNR retry would).
    pub(crate) blocked: bool,
}

impl Default for Rx {
    fn default() -> Self {
        Self {
            buf: [0; 128],
            have: 0,
            pos: 0,
            cur: None,
            trailer: [0; 8],
            tail: 0,
            blocked: false,
        }
    }
}

impl Rx {
    /// Whether what `buf` holds is enough for the next step without reading the socket:
    /// bytes of the FPDU being placed, or a whole header (or a bad one) to look at.
    pub(crate) fn buffered(&self) -> bool {
        if self.cur.is_some() {
            self.pos < self.have
        } else {
            self.have > 0 && self.need().map_or(true, |n| self.have >= n)
        }
    }

    /// The first `n` bytes of `buf` are done with: what follows moves to the front.
    fn consume(&mut self, n: usize) {
        let n = n.min(self.have);
        self.buf.copy_within(n..self.have, 0);
        self.have -= n;
        self.pos = 0;
    }

    /// What the FPDU in `buf` announces (`buf` holds at least its first four bytes).
    fn head(&self) -> Head {
        let ulpdu = usize::from(u16::from_be_bytes([self.buf[0], self.buf[1]]));
        let seg = Segment::new_unchecked(&self.buf[MPA_LEN..]);
        let whole = if seg.tagged() {
            None
        } else {
            rdmap::parse_ctrl(seg.ulp_ctrl())
                .ok()
                .filter(|o| matches!(o, Opcode::ReadRequest | Opcode::Terminate))
        };
        Head {
            ulpdu,
            ddp_len: seg.header_len(),
            whole,
        }
    }

    /// Bytes of the FPDU needed in `buf` before it can be looked at.
    fn need(&self) -> Result<usize, WireError> {
        if self.have < MPA_LEN + 2 {
            return Ok(PREFIX);
        }
        let h = self.head();
        if h.ulpdu < h.ddp_len {
            return Err(WireError::Truncated {
                what: "DDP segment",
                need: h.ddp_len,
                have: h.ulpdu,
            });
        }
        if h.whole.is_some() {
            return Ok(
                match fpdu::frame_len(&self.buf[..self.have], MAX_PRIVATE_ULPDU)? {
                    Framing::Need(n) => self.have + n,
                    Framing::Complete(n) => n,
                },
            );
        }
        Ok(MPA_LEN + h.ddp_len)
    }

    /// Reads the message of the FPDU in `buf`: a whole Read Request or Terminate (its CRC
    /// checked first, when on), or the header of a data segment whose payload is still in
    /// the socket.
    fn message(&self, h: &Head, crc: bool) -> Result<Msg, WireError> {
        let ulpdu = if h.whole.is_some() {
            let f = Fpdu::new_checked(&self.buf[..self.have])?;
            FpduRepr::parse(&f, crc)?.ulpdu
        } else {
            &self.buf[MPA_LEN..MPA_LEN + h.ddp_len]
        };
        let m = MessageRepr::parse(ulpdu)?;
        let body = match m.body {
            Body::Data => MsgBody::Data,
            Body::ReadRequest(r) => MsgBody::ReadRequest(r),
            Body::Terminate(t) => MsgBody::Terminate(t.code),
        };
        Ok(Msg {
            opcode: m.opcode,
            ddp: m.ddp,
            body,
        })
    }
}

enum Step {
    Go,
    Blocked,
    Stop,
}

fn would_block(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock
}

/// Whether to read the socket: no short read since its last event (or the peer hung up, and
/// the stream is read to its end).
fn readable(r: &RemoteQp) -> bool {
    r.rx_ready.load(Ordering::Relaxed) || r.hup.load(Ordering::Relaxed)
}

/// Copies `bytes` into message bytes `[from, from + bytes.len())` over `segs`.
fn place(segs: &SegList, from: usize, bytes: &[u8]) {
    let mut at = 0;
    for_ranges(segs, from, bytes.len(), |s, off, n| {
        // In bounds: checked when the segment was resolved.
        let _ = s.region().0.write_bytes(off, &bytes[at..at + n]);
        at += n;
    });
}

/// Places the bytes read ahead with the current FPDU's header (`buf[pos..have]`): its
/// payload (copied into guest memory, the CRC summed over exactly those bytes), then its pad
/// and CRC; a whole FPDU is finished and the next one's bytes move to the front. `false` if
/// the connection failed.
fn drain(qp: &Qp, c: &mut Conn) -> bool {
    let Some(f) = c.rx.cur.as_mut() else {
        return true;
    };
    let (pos, have) = (c.rx.pos, c.rx.have);
    let p = (have - pos).min(f.plen - f.got);
    if p > 0 {
        let bytes = &c.rx.buf[pos..pos + p];
        if let Some((segs, off)) = &f.dst {
            place(segs, off + f.got, bytes);
        }
        if c.crc {
            f.crc.update(bytes);
        }
        f.got += p;
    }
    let at = pos + p;
    let t = (have - at).min(f.pad + CRC_LEN - c.rx.tail);
    let tail = c.rx.tail;
    c.rx.trailer[tail..tail + t].copy_from_slice(&c.rx.buf[at..at + t]);
    c.rx.tail += t;
    c.rx.pos = at + t;
    if f.got == f.plen && c.rx.tail == f.pad + CRC_LEN {
        let done = c.rx.pos;
        c.rx.consume(done);
        return finish(qp, c);
    }
    true
}

/// One pass of the receive half; `true` if it did work.
pub(crate) fn run(
    ctx: &Ctx<'_>,
    qp: &Arc<Qp>,
    r: &RemoteQp,
    c: &mut Conn,
    budget: &mut usize,
) -> bool {
    let mut did = false;
    let mut moved = 0usize;
    let limit = (*budget).max(64 << 10);
    while !c.dead && !c.closing && qp.state() != QpState::Error && moved < limit {
        if c.rx.cur.is_none() {
            let need = match c.rx.need() {
                Ok(n) => n,
                Err(e) => {
                    c.terminate(qp, TermCode::for_error(&e), None, false);
                    return true;
                }
            };
            if c.rx.have < need {
                if !readable(r) {
                    break;
                }
                // As much as the buffer takes: the header, and for a small message the
                // rest of it (and of the next ones).
                let mut l = RecvList::with_capacity(1);
                let have = c.rx.have;
                l.push_private_mut(&mut c.rx.buf[have..]);
                let want = l.bytes();
                match l.recv(c.sock.as_fd()) {
                    Ok(0) => {
                        c.disconnected(qp, &"end of stream");
                        return true;
                    }
                    Ok(n) => {
                        did = true;
                        c.rx.have += n;
                        // A short read: the socket is empty for now (what was read is
                        // processed first; the next read waits for the next event).
                        if n < want && !r.hup.load(Ordering::Relaxed) {
                            r.rx_ready.store(false, Ordering::Relaxed);
                        }
                    }
                    Err(e) if would_block(&e) => {
                        r.rx_ready.store(false, Ordering::Relaxed);
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        c.disconnected(qp, &e);
                        return true;
                    }
                }
                continue;
            }
            match start(ctx, qp, c) {
                Step::Go => did = true,
                Step::Blocked => {
                    c.rx.blocked = true;
                    break;
                }
                Step::Stop => return true,
            }
            continue;
        }
        // What was read ahead with the header comes first.
        if c.rx.pos < c.rx.have {
            did = true;
            if !drain(qp, c) {
                return true;
            }
            continue;
        }
        if !readable(r) {
            break;
        }
        c.rx.have = 0;
        c.rx.pos = 0;
        // Payload (into guest memory), pad and CRC, and the next FPDU's first bytes.
        let (n, want) = {
            let Some(f) = c.rx.cur.as_ref() else { break };
            let mut l = RecvList::with_capacity(6);
            if let Some((segs, off)) = &f.dst {
                for_ranges(segs, off + f.got, f.plen - f.got, |s, o, n| {
                    // In bounds: checked when the segment was resolved.
                    let _ = l.push_shared(s.region().0, o, n);
                });
            }
            let tail = c.rx.tail;
            l.push_private_mut(&mut c.rx.trailer[tail..f.pad + CRC_LEN]);
            l.push_private_mut(&mut c.rx.buf[..]);
            match l.recv(c.sock.as_fd()) {
                Ok(0) => {
                    c.disconnected(qp, &"end of stream");
                    return true;
                }
                Ok(n) => (n, l.bytes()),
                Err(e) if would_block(&e) => {
                    r.rx_ready.store(false, Ordering::Relaxed);
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    c.disconnected(qp, &e);
                    return true;
                }
            }
        };
        did = true;
        moved += n;
        let Some(f) = c.rx.cur.as_mut() else { break };
        let p = n.min(f.plen - f.got);
        if c.crc && p > 0 {
            // The bytes just placed, while they are in the cache.
            if let Some((segs, off)) = &f.dst {
                crc_segs(&mut f.crc, segs, off + f.got, p);
            }
        }
        f.got += p;
        let t = (n - p).min(f.pad + CRC_LEN - c.rx.tail);
        c.rx.tail += t;
        c.rx.have = n - p - t;
        if f.got == f.plen && c.rx.tail == f.pad + CRC_LEN && !finish(qp, c) {
            return true;
        }
        // A short read means the socket is empty for now (its next event says when not),
        // unless the peer's FIN came with the data: its event is spent, so read on to the
        // end of the stream. The bytes read into `buf` are processed first.
        if n < want && !r.hup.load(Ordering::Relaxed) {
            r.rx_ready.store(false, Ordering::Relaxed);
        }
    }
    *budget = budget.saturating_sub(moved);
    did
}

/// A whole header (or private FPDU) is in `buf`: check it and decide where its payload goes.
fn start(ctx: &Ctx<'_>, qp: &Qp, c: &mut Conn) -> Step {
    let h = c.rx.head();
    let (ulpdu, dlen) = (h.ulpdu, h.ddp_len);
    let plen = ulpdu - dlen;
    let mut quote = [0u8; QUOTE_MAX];
    let qlen = MPA_LEN + dlen;
    quote[..qlen].copy_from_slice(&c.rx.buf[..qlen]);
    let msg = match c.rx.message(&h, c.crc) {
        Ok(m) => m,
        Err(e) => {
            let versions = matches!(
                e,
                WireError::DdpVersion { .. } | WireError::RdmapVersion { .. }
            );
            if h.whole == Some(Opcode::Terminate)
                && !versions
                && !matches!(e, WireError::BadCrc { .. })
            {
                // A Terminate that does not read right still ends the stream; a Terminate is
                // never answered with another.
                c.rx.consume(fpdu::fpdu_len(ulpdu));
                c.terminated(qp, TermCode::RDMAP_OPERATION_UNSPECIFIED);
                return Step::Stop;
            }
            // A header that is not one of this version is not quoted back.
            let quote = (!versions).then_some(&quote[..qlen]);
            c.terminate(qp, TermCode::for_error(&e), quote, false);
            return Step::Stop;
        }
    };
    let quoted = &quote[..qlen];
    if c.wait_rtr {
        // The initiator's first FPDU is its RTR: from now on this end may send.
        c.wait_rtr = false;
        if qp.state() == QpState::Rtr {
            qp.set_state(QpState::Rts);
            qp.ch.event(EventKind::QpEstablished, qp.num.0, 0);
        }
    }
    let mut mo = 0;
    let dst = match (msg.opcode, msg.ddp.model, msg.body) {
        (Opcode::Write, BufferModel::Tagged { stag, to }, _) => {
            if plen == 0 {
                None
            } else {
                match ctx.keys.remote_checked(
                    qp.ch.id,
                    qp.pd,
                    stag,
                    to,
                    plen as u64,
                    access::REMOTE_WRITE,
                ) {
                    Ok(seg) => Some(([Some(seg), None], 0)),
                    Err(f) => {
                        let t = match f {
                            RemoteFault::Key => TermCode::DDP_INVALID_STAG,
                            RemoteFault::Bounds => TermCode::DDP_BASE_BOUNDS,
                            RemoteFault::Access => TermCode::RDMAP_ACCESS_RIGHTS,
                        };
                        c.terminate(qp, t, Some(quoted), false);
                        return Step::Stop;
                    }
                }
            }
        }
        (Opcode::ReadResponse, BufferModel::Tagged { stag, to }, _) => {
            let t = match c.orq.front() {
                None => Err(TermCode::RDMAP_UNEXPECTED_OPCODE),
                Some(o) if o.stag != stag => Err(TermCode::DDP_INVALID_STAG),
                Some(o) => match to
                    .checked_sub(o.base_to)
                    .filter(|off| off.checked_add(plen as u64).is_some_and(|e| e <= o.len))
                {
                    None => Err(TermCode::DDP_BASE_BOUNDS),
                    Some(off) => Ok((plen > 0).then(|| (o.segs.clone(), off as usize))),
                },
            };
            match t {
                Ok(d) => d,
                Err(t) => {
                    c.terminate(qp, t, Some(quoted), false);
                    return Step::Stop;
                }
            }
        }
        // The codec checked the queue number.
        (Opcode::Send | Opcode::SendSe, BufferModel::Untagged { msn, mo: m, .. }, _) => {
            mo = m;
            let mo = m as usize;
            let t = if msn != c.expect[0] {
                Some(TermCode::DDP_MSN_RANGE)
            } else if c.recv.is_none() && mo != 0 {
                Some(TermCode::DDP_INVALID_MO)
            } else {
                None
            };
            if let Some(t) = t {
                c.terminate(qp, t, Some(quoted), false);
                return Step::Stop;
            }
            if c.recv.is_none() {
                match take_recv(ctx, qp, c) {
                    Ok(true) => {}
                    Ok(false) => return Step::Blocked,
                    Err(t) => {
                        c.terminate(qp, t, Some(quoted), false);
                        return Step::Stop;
                    }
                }
            }
            let Some(rc) = c.recv.as_ref() else {
                return Step::Stop;
            };
            if (mo + plen) as u64 > rc.cap {
                let raw = rc.raw;
                c.recv = None;
                recv_done(qp, &raw, CqeStatus::LocalLengthError, 0, false);
                c.terminate(qp, TermCode::DDP_MESSAGE_TOO_LONG, Some(quoted), false);
                return Step::Stop;
            }
            (plen > 0).then(|| (rc.segs.clone(), mo))
        }
        (Opcode::ReadRequest, BufferModel::Untagged { msn, .. }, MsgBody::ReadRequest(req)) => {
            c.rx.consume(fpdu::fpdu_len(ulpdu));
            return read_request(ctx, qp, c, msn, req, quoted);
        }
        (Opcode::Terminate, _, MsgBody::Terminate(code)) => {
            c.rx.consume(fpdu::fpdu_len(ulpdu));
            c.terminated(qp, code);
            return Step::Stop;
        }
        // Send with Invalidate: vrdma gives a peer no STag to invalidate.
        _ => {
            c.terminate(qp, TermCode::RDMAP_UNEXPECTED_OPCODE, Some(quoted), false);
            return Step::Stop;
        }
    };
    let mut crc = FpduCrc::new();
    if c.crc {
        crc.update(quoted);
    }
    c.rx.cur = Some(Placing {
        opcode: msg.opcode,
        last: msg.ddp.last,
        mo,
        ulpdu,
        plen,
        got: 0,
        pad: fpdu::pad_len(ulpdu),
        crc,
        dst,
        quote,
        qlen,
    });
    // What followed the header in `buf` is placed first (`drain`).
    c.rx.pos = qlen;
    c.rx.tail = 0;
    c.rx.blocked = false;
    Step::Go
}

/// An RDMA Read Request (read whole, CRC and layout checked by the codec): checked against
/// IRD, MSN and the source region, then queued for the transmit half to answer.
fn read_request(
    ctx: &Ctx<'_>,
    qp: &Qp,
    c: &mut Conn,
    msn: u32,
    req: ReadRequestRepr,
    quote: &[u8],
) -> Step {
    if msn != c.expect[1] || c.irq.len() >= c.ird {
        // More reads outstanding than IRD allows: RFC 5040 §5.3's MSN range error.
        c.terminate(qp, TermCode::DDP_MSN_RANGE, Some(quote), false);
        return Step::Stop;
    }
    c.expect[1] = msn.wrapping_add(1);
    let src = if req.size == 0 {
        None
    } else {
        match ctx.keys.remote_checked(
            qp.ch.id,
            qp.pd,
            req.source_stag,
            req.source_to,
            u64::from(req.size),
            access::REMOTE_READ,
        ) {
            Ok(s) => Some(s),
            Err(f) => {
                let t = match f {
                    RemoteFault::Key => TermCode::RDMAP_INVALID_STAG,
                    RemoteFault::Bounds => TermCode::RDMAP_BASE_BOUNDS,
                    RemoteFault::Access => TermCode::RDMAP_ACCESS_RIGHTS,
                };
                // The segment and its Read Request header, as siw quotes them.
                let mut block = [0u8; QUOTE_MAX + READ_REQUEST_LEN];
                let n = quote.len();
                block[..n].copy_from_slice(quote);
                block[n..n + READ_REQUEST_LEN].copy_from_slice(&req.to_bytes());
                c.terminate(qp, t, Some(&block[..n + READ_REQUEST_LEN]), true);
                return Step::Stop;
            }
        }
    };
    c.irq.push_back(InRead {
        src,
        stag: req.sink_stag,
        to: req.sink_to,
        len: u64::from(req.size),
    });
    Step::Go
}

/// Takes the RQ's head for an incoming SEND; `Ok(false)` if none is posted.
fn take_recv(ctx: &Ctx<'_>, qp: &Qp, c: &mut Conn) -> Result<bool, TermCode> {
    let mut rv = lock(&qp.recv);
    let raw = match rv.rq.pop() {
        Ok(None) => return Ok(false),
        Err(e) => {
            drop(rv);
            tracing::debug!(qp = qp.num.0, "RQ index garbage: {e}");
            return Err(TermCode::RDMAP_LOCAL_CATASTROPHIC);
        }
        Ok(Some(raw)) => {
            rv.rq.release();
            raw
        }
    };
    drop(rv);
    let Some(w) = WqeRepr::from_bytes(&raw)
        .ok()
        .filter(|w| w.opcode == WqeOpcode::Recv)
    else {
        recv_done(qp, &raw, CqeStatus::BadWqe, 0, false);
        return Err(TermCode::RDMAP_OPERATION_UNSPECIFIED);
    };
    match exec::local_segs(ctx, qp, &w.data, true) {
        Err(st) => {
            recv_done(qp, &raw, st, 0, false);
            Err(TermCode::RDMAP_OPERATION_UNSPECIFIED)
        }
        Ok(segs) => {
            let cap = segs.iter().flatten().map(|s| s.len as u64).sum();
            c.recv = Some(CurRecv { raw, segs, cap });
            Ok(true)
        }
    }
}

/// Completes a RECV (in RQ order: only one is ever taken at a time).
fn recv_done(qp: &Qp, raw: &[u8; WQE_LEN], st: CqeStatus, len: u64, solicited: bool) {
    let ok = st == CqeStatus::Success;
    qp.ch.stats.op(if ok { len } else { 0 });
    if !ok {
        qp.ch.stats.error();
    }
    qp.counters.recv(ok, len);
    let mut cqe = exec::cqe(qp, exec::wr_id_of(raw), CqeOpcode::Recv, st, len);
    if ok && solicited {
        cqe.flags |= cqe_flags::SOLICITED;
    }
    if !qp.recv_cq.complete(&cqe, solicited) {
        qp.fail(Some(EventKind::QpFatal));
    } else if !ok {
        qp.fail(None);
    }
}

/// The FPDU's payload and trailer are in: check the CRC, then complete what it ends.
/// `false` if the connection failed.
fn finish(qp: &Qp, c: &mut Conn) -> bool {
    let Some(f) = c.rx.cur.take() else {
        return true;
    };
    let quote = &f.quote[..f.qlen];
    if c.crc {
        // `f.crc` has the length field, the header and the payload as it was placed.
        if let Err(e) = f
            .crc
            .check_trailer(f.ulpdu, &c.rx.trailer[..f.pad + CRC_LEN])
        {
            c.terminate(qp, TermCode::for_error(&e), Some(quote), false);
            return false;
        }
    }
    c.rx.tail = 0;
    match f.opcode {
        Opcode::ReadResponse => {
            let Some(o) = c.orq.front_mut() else {
                return true;
            };
            o.got += f.plen as u64;
            if f.last {
                let Some(o) = c.orq.pop_front() else {
                    return true;
                };
                if o.got != o.len {
                    if let Some(seq) = o.seq {
                        c.mark(seq, CqeStatus::BadResponse, 0);
                    }
                    c.terminate(qp, TermCode::DDP_BASE_BOUNDS, Some(quote), false);
                    return false;
                }
                if let Some(seq) = o.seq {
                    c.mark(seq, CqeStatus::Success, o.len);
                }
            }
        }
        Opcode::Send | Opcode::SendSe if f.last => {
            c.expect[0] = c.expect[0].wrapping_add(1);
            if let Some(rc) = c.recv.take() {
                let len = u64::from(f.mo) + f.plen as u64;
                recv_done(
                    qp,
                    &rc.raw,
                    CqeStatus::Success,
                    len,
                    f.opcode == Opcode::SendSe,
                );
            }
        }
        _ => {}
    }
    true
}
