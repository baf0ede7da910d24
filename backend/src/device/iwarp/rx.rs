//! The receive half: an FPDU's MPA length and DDP/RDMAP header are read into a small private
//! buffer and checked (STag, bounds, access, MSN, a RECV to take) before a byte of payload
//! is read; the payload is then read straight into the target range of guest memory, in the
//! same `readv` as the FPDU's pad and CRC and the next FPDU's first header bytes. The CRC is
//! checked over the placed bytes before anything is completed.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use shared_ring::abi::control::{access, QpState};
use shared_ring::abi::cqe::{flags as cqe_flags, CqeOpcode, CqeStatus};
use shared_ring::abi::event::EventKind;
use shared_ring::abi::wqe::{WqeOpcode, WqeRepr, WQE_LEN};
use shared_ring::mem::RecvList;

use super::hdr::{self, op, Ddp, Hdr, ReadReq, Term, CRC_LEN, MPA_LEN};
use super::qp::{Conn, CurRecv, InRead, RemoteQp};
use super::tx::{crc_segs, for_ranges};
use crate::device::exec::{self, Ctx};
use crate::device::mr::RemoteFault;
use crate::device::objects::{lock, Qp, SegList};

/// Bytes read before the header's kind is known: the shortest header (tagged).
const PREFIX: usize = MPA_LEN + hdr::TAGGED_LEN;

/// An FPDU whose header was accepted and whose payload is being placed.
struct Fpdu {
    h: Hdr,
    plen: usize,
    got: usize,
    pad: usize,
    /// CRC32c of the length field and header (when CRCs are on).
    crc: u32,
    /// Where the payload goes: segments and the message offset of the first byte.
    dst: Option<(SegList, usize)>,
    /// The MPA length and DDP header as received (a Terminate quotes them).
    ddp: [u8; MPA_LEN + hdr::UNTAGGED_LEN],
    dlen: usize,
}

/// The receive state of a connection.
pub(crate) struct Rx {
    /// Header bytes (the whole FPDU for a Read Request or Terminate).
    buf: [u8; 128],
    have: usize,
    cur: Option<Fpdu>,
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
            cur: None,
            trailer: [0; 8],
            tail: 0,
            blocked: false,
        }
    }
}

impl Rx {
    fn ulpdu(&self) -> usize {
        usize::from(u16::from_be_bytes([self.buf[0], self.buf[1]]))
    }

    /// Bytes of the FPDU needed in `buf` before it can be looked at.
    fn need(&self) -> Result<usize, Term> {
        if self.have < MPA_LEN + 2 {
            return Ok(PREFIX);
        }
        let ulpdu = self.ulpdu();
        let dl = Hdr::len_of(self.buf[MPA_LEN]);
        if ulpdu < dl {
            return Err(Term::MALFORMED);
        }
        let tagged = self.buf[MPA_LEN] & 0x80 != 0;
        let opcode = self.buf[MPA_LEN + 1] & 0xf;
        if !tagged && (opcode == op::READ_REQ || opcode == op::TERMINATE) {
            if ulpdu > hdr::MAX_PRIVATE_ULPDU {
                return Err(Term::MALFORMED);
            }
            return Ok(MPA_LEN + ulpdu + hdr::pad(ulpdu) + CRC_LEN);
        }
        Ok(MPA_LEN + dl)
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
                Err(t) => {
                    c.terminate(qp, t, None, None);
                    return true;
                }
            };
            if c.rx.have < need {
                let mut l = RecvList::with_capacity(1);
                let have = c.rx.have;
                l.push_private_mut(&mut c.rx.buf[have..need]);
                match l.recv(c.sock.as_fd()) {
                    Ok(0) => {
                        c.disconnected(qp, &"end of stream");
                        return true;
                    }
                    Ok(n) => {
                        did = true;
                        c.rx.have += n;
                        if c.rx.have < need && !r.hup.load(Ordering::Relaxed) {
                            r.rx_ready.store(false, Ordering::Relaxed);
                            break;
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
            l.push_private_mut(&mut c.rx.buf[..PREFIX]);
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
        f.got += p;
        let t = (n - p).min(f.pad + CRC_LEN - c.rx.tail);
        c.rx.tail += t;
        c.rx.have = n - p - t;
        if f.got == f.plen && c.rx.tail == f.pad + CRC_LEN && !finish(qp, c) {
            return true;
        }
        // A short read means the socket is empty for now (its next event says when not),
        // unless the peer's FIN came with the data: its event is spent, so read on to the
        // end of the stream.
        if n < want && !r.hup.load(Ordering::Relaxed) {
            r.rx_ready.store(false, Ordering::Relaxed);
            break;
        }
    }
    *budget = budget.saturating_sub(moved);
    did
}

/// A whole header (or private FPDU) is in `buf`: check it and decide where its payload goes.
fn start(ctx: &Ctx<'_>, qp: &Qp, c: &mut Conn) -> Step {
    let h = match Hdr::parse(&c.rx.buf[MPA_LEN..]) {
        Ok(h) => h,
        Err(t) => {
            c.terminate(qp, t, None, None);
            return Step::Stop;
        }
    };
    let ulpdu = c.rx.ulpdu();
    let dlen = h.len();
    let plen = ulpdu - dlen;
    let mut ddp = [0u8; MPA_LEN + hdr::UNTAGGED_LEN];
    ddp[..MPA_LEN + dlen].copy_from_slice(&c.rx.buf[..MPA_LEN + dlen]);
    let quote = &ddp[..MPA_LEN + dlen];
    if c.wait_rtr {
        // The initiator's first FPDU is its RTR: from now on this end may send.
        c.wait_rtr = false;
        if qp.state() == QpState::Rtr {
            qp.set_state(QpState::Rts);
            qp.ch.event(EventKind::QpEstablished, qp.num.0, 0);
        }
    }
    let dst = match (h.ddp, h.opcode) {
        (Ddp::Tagged { stag, to }, op::WRITE) => {
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
                            RemoteFault::Key => Term::DDP_T_INVALID_STAG,
                            RemoteFault::Bounds => Term::DDP_T_BOUNDS,
                            RemoteFault::Access => Term::RDMAP_ACCESS,
                        };
                        c.terminate(qp, t, Some(quote), None);
                        return Step::Stop;
                    }
                }
            }
        }
        (Ddp::Tagged { stag, to }, op::READ_RESP) => {
            let t = match c.orq.front() {
                None => Err(Term::RDMAP_OPCODE),
                Some(o) if o.stag != stag => Err(Term::DDP_T_INVALID_STAG),
                Some(o) => match to
                    .checked_sub(o.base_to)
                    .filter(|off| off.checked_add(plen as u64).is_some_and(|e| e <= o.len))
                {
                    None => Err(Term::DDP_T_BOUNDS),
                    Some(off) => Ok((plen > 0).then(|| (o.segs.clone(), off as usize))),
                },
            };
            match t {
                Ok(d) => d,
                Err(t) => {
                    c.terminate(qp, t, Some(quote), None);
                    return Step::Stop;
                }
            }
        }
        (Ddp::Untagged { qn, msn, mo }, op::SEND | op::SEND_SE) => {
            let mo = mo as usize;
            let t = if qn != hdr::QN_SEND {
                Some(Term::DDP_UT_QN)
            } else if msn != c.expect[0] {
                Some(Term::DDP_UT_MSN_RANGE)
            } else if c.recv.is_none() && mo != 0 {
                Some(Term::DDP_UT_MO)
            } else {
                None
            };
            if let Some(t) = t {
                c.terminate(qp, t, Some(quote), None);
                return Step::Stop;
            }
            if c.recv.is_none() {
                match take_recv(ctx, qp, c) {
                    Ok(true) => {}
                    Ok(false) => return Step::Blocked,
                    Err(t) => {
                        c.terminate(qp, t, Some(quote), None);
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
                c.terminate(qp, Term::DDP_UT_TOO_LONG, Some(quote), None);
                return Step::Stop;
            }
            (plen > 0).then(|| (rc.segs.clone(), mo))
        }
        (Ddp::Untagged { qn, msn, .. }, op::READ_REQ) => {
            return read_request(ctx, qp, c, qn, msn, dlen, ulpdu, &ddp);
        }
        (Ddp::Untagged { qn, .. }, op::TERMINATE) => {
            if !private_crc_ok(c, ulpdu) {
                c.terminate(qp, Term::MPA_CRC, Some(quote), None);
                return Step::Stop;
            }
            c.rx.have = 0;
            let t = if qn == hdr::QN_TERM {
                Term::parse_body(&c.rx.buf[MPA_LEN + dlen..MPA_LEN + ulpdu])
            } else {
                None
            };
            c.terminated(qp, t.unwrap_or(Term::RDMAP_UNSPECIFIED));
            return Step::Stop;
        }
        _ => {
            c.terminate(qp, Term::RDMAP_OPCODE, Some(quote), None);
            return Step::Stop;
        }
    };
    let crc = if c.crc {
        crc32c::crc32c(&c.rx.buf[..MPA_LEN + dlen])
    } else {
        0
    };
    c.rx.cur = Some(Fpdu {
        h,
        plen,
        got: 0,
        pad: hdr::pad(ulpdu),
        crc,
        dst,
        ddp,
        dlen,
    });
    c.rx.have = 0;
    c.rx.tail = 0;
    c.rx.blocked = false;
    Step::Go
}

/// Whether the CRC of the private FPDU in `buf` is right (always, with CRCs off).
fn private_crc_ok(c: &Conn, ulpdu: usize) -> bool {
    if !c.crc {
        return true;
    }
    let end = MPA_LEN + ulpdu + hdr::pad(ulpdu);
    let want = u32::from_le_bytes([
        c.rx.buf[end],
        c.rx.buf[end + 1],
        c.rx.buf[end + 2],
        c.rx.buf[end + 3],
    ]);
    crc32c::crc32c(&c.rx.buf[..end]) == want
}

/// An RDMA Read Request (whole in `buf`): checked against IRD, MSN and the source region,
/// then queued for the transmit half to answer.
#[allow(clippy::too_many_arguments)]
fn read_request(
    ctx: &Ctx<'_>,
    qp: &Qp,
    c: &mut Conn,
    qn: u32,
    msn: u32,
    dlen: usize,
    ulpdu: usize,
    ddp: &[u8; MPA_LEN + hdr::UNTAGGED_LEN],
) -> Step {
    let quote = &ddp[..MPA_LEN + dlen];
    if !private_crc_ok(c, ulpdu) {
        c.terminate(qp, Term::MPA_CRC, Some(quote), None);
        return Step::Stop;
    }
    c.rx.have = 0;
    let mut body = [0u8; hdr::READ_REQ_LEN];
    let req = if ulpdu == dlen + hdr::READ_REQ_LEN {
        body.copy_from_slice(&c.rx.buf[MPA_LEN + dlen..MPA_LEN + ulpdu]);
        ReadReq::parse(&body)
    } else {
        None
    };
    let t = if qn != hdr::QN_READ {
        Some(Term::DDP_UT_QN)
    } else if msn != c.expect[1] || c.irq.len() >= c.ird {
        // More reads outstanding than IRD allows: RFC 5040 §5.3's MSN range error.
        Some(Term::DDP_UT_MSN_RANGE)
    } else if req.is_none() {
        Some(Term::MALFORMED)
    } else {
        None
    };
    let Some(req) = req.filter(|_| t.is_none()) else {
        c.terminate(qp, t.unwrap_or(Term::MALFORMED), Some(quote), None);
        return Step::Stop;
    };
    c.expect[1] = msn.wrapping_add(1);
    let src = if req.len == 0 {
        None
    } else {
        match ctx.keys.remote_checked(
            qp.ch.id,
            qp.pd,
            req.src_stag,
            req.src_to,
            u64::from(req.len),
            access::REMOTE_READ,
        ) {
            Ok(s) => Some(s),
            Err(f) => {
                let t = match f {
                    RemoteFault::Key => Term::RDMAP_INVALID_STAG,
                    RemoteFault::Bounds => Term::RDMAP_BOUNDS,
                    RemoteFault::Access => Term::RDMAP_ACCESS,
                };
                c.terminate(qp, t, Some(quote), Some(&body));
                return Step::Stop;
            }
        }
    };
    c.irq.push_back(InRead {
        src,
        stag: req.sink_stag,
        to: req.sink_to,
        len: u64::from(req.len),
    });
    Step::Go
}

/// Takes the RQ's head for an incoming SEND; `Ok(false)` if none is posted.
fn take_recv(ctx: &Ctx<'_>, qp: &Qp, c: &mut Conn) -> Result<bool, Term> {
    let mut rv = lock(&qp.recv);
    let raw = match rv.rq.pop() {
        Ok(None) => return Ok(false),
        Err(e) => {
            drop(rv);
            tracing::debug!(qp = qp.num.0, "RQ index garbage: {e}");
            return Err(Term::RDMAP_LOCAL_CATASTROPHIC);
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
        return Err(Term::RDMAP_UNSPECIFIED);
    };
    match exec::local_segs(ctx, qp, &w.data, true) {
        Err(st) => {
            recv_done(qp, &raw, st, 0, false);
            Err(Term::RDMAP_UNSPECIFIED)
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
    let quote = &f.ddp[..MPA_LEN + f.dlen];
    if c.crc {
        let mut crc = f.crc;
        if let Some((segs, off)) = &f.dst {
            crc = crc_segs(crc, segs, *off, f.plen);
        }
        crc = crc32c::crc32c_append(crc, &[0u8; 3][..f.pad]);
        let t = &c.rx.trailer[f.pad..f.pad + CRC_LEN];
        if crc != u32::from_le_bytes([t[0], t[1], t[2], t[3]]) {
            c.terminate(qp, Term::MPA_CRC, Some(quote), None);
            return false;
        }
    }
    c.rx.tail = 0;
    match f.h.opcode {
        op::READ_RESP => {
            let Some(o) = c.orq.front_mut() else {
                return true;
            };
            o.got += f.plen as u64;
            if f.h.last {
                let Some(o) = c.orq.pop_front() else {
                    return true;
                };
                if o.got != o.len {
                    if let Some(seq) = o.seq {
                        c.mark(seq, CqeStatus::BadResponse, 0);
                    }
                    c.terminate(qp, Term::DDP_T_BOUNDS, Some(quote), None);
                    return false;
                }
                if let Some(seq) = o.seq {
                    c.mark(seq, CqeStatus::Success, o.len);
                }
            }
        }
        op::SEND | op::SEND_SE if f.h.last => {
            let Ddp::Untagged { mo, .. } = f.h.ddp else {
                return true;
            };
            c.expect[0] = c.expect[0].wrapping_add(1);
            if let Some(rc) = c.recv.take() {
                let len = u64::from(mo) + f.plen as u64;
                recv_done(
                    qp,
                    &rc.raw,
                    CqeStatus::Success,
                    len,
                    f.h.opcode == op::SEND_SE,
                );
            }
        }
        _ => {}
    }
    true
}
