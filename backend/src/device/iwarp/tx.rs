//! The transmit half: send WQEs and Read Responses cut into FPDUs no larger than the MSS,
//! queued as a list of pieces — private bytes (MPA length, DDP/RDMAP header, pad, CRC) and
//! ranges of guest memory — and handed to the kernel with one `sendmsg` per batch, so payload
//! goes from the guest's pages to the socket without a copy and small messages queued
//! together leave in one system call.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use shared_ring::abi::control::QpState;
use shared_ring::abi::cqe::{CqeOpcode, CqeStatus};
use shared_ring::abi::event::EventKind;
use shared_ring::abi::wqe::{flags, WqeData, WqeOpcode, WqeRepr, MAX_INLINE};
use shared_ring::mem::SendList;

use super::hdr::{self, Ddp, Hdr, ReadReq};
use super::qp::{self, Conn, OutRead, RemoteQp};
use crate::device::exec::{self, Ctx};
use crate::device::mr::Seg;
use crate::device::objects::{lock, Qp, SegList};

/// Bytes queued for the socket before the engine stops cutting FPDUs and sends (also the
/// most one pass moves for a QP whose budget allows it).
const TX_QUEUE: usize = 256 << 10;

/// Calls `f(segment, offset in its pages, length)` for the ranges that bytes
/// `[from, from + len)` of the message laid out over `segs` occupy.
pub(crate) fn for_ranges<'a>(
    segs: &'a SegList,
    mut from: usize,
    mut len: usize,
    mut f: impl FnMut(&'a Seg, usize, usize),
) {
    for s in segs.iter().flatten() {
        if len == 0 {
            break;
        }
        if from >= s.len {
            from -= s.len;
            continue;
        }
        let n = (s.len - from).min(len);
        f(s, s.region().1 + from, n);
        len -= n;
        from = 0;
    }
}

/// CRC32c of message bytes `[from, from + len)` over `segs`, appended to `crc`.
pub(crate) fn crc_segs(mut crc: u32, segs: &SegList, from: usize, len: usize) -> u32 {
    for_ranges(segs, from, len, |s, off, n| {
        // The range was checked when the segment was resolved.
        let _ = s
            .region()
            .0
            .for_each_chunk(off, n, |b| crc = crc32c::crc32c_append(crc, b));
    });
    crc
}

/// A piece of the byte stream waiting for the socket.
enum Piece {
    /// `arena[at..at + len]`.
    Priv { at: usize, len: usize },
    /// Guest memory: `len` bytes at `off` of the segment's pages.
    Shared { seg: Seg, off: usize, len: usize },
    /// Everything before it is out: the send WQE with this sequence number is done.
    Done(u64),
}

/// What an FPDU carries after its header.
pub(crate) enum Body<'a> {
    None,
    Priv(&'a [u8]),
    /// Message bytes `[from, from + len)` over the segments.
    Segs(&'a SegList, usize, usize),
}

/// Where a message's payload comes from.
enum Src {
    Segs(SegList),
    Inline([u8; MAX_INLINE]),
}

/// A message being cut into FPDUs.
pub(crate) struct TxMsg {
    opcode: u8,
    /// Untagged (a SEND, with its MSN) or tagged (STag and base TO).
    ddp: Ddp,
    src: Src,
    len: usize,
    done: usize,
    /// The send WQE that ends with the message.
    seq: Option<u64>,
}

/// The transmit state of a connection.
#[derive(Default)]
pub(crate) struct Tx {
    arena: Vec<u8>,
    pieces: VecDeque<Piece>,
    queued: usize,
    pub(crate) cur: Option<TxMsg>,
    /// Send WQEs whose bytes all went out since the caller last looked.
    pub(crate) done: Vec<u64>,
}

impl Tx {
    /// Nothing waits for the socket.
    pub(crate) fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    fn push_priv(&mut self, at: usize, len: usize) {
        if let Some(Piece::Priv { at: a, len: l }) = self.pieces.back_mut() {
            if *a + *l == at {
                *l += len;
                self.queued += len;
                return;
            }
        }
        self.pieces.push_back(Piece::Priv { at, len });
        self.queued += len;
    }

    /// Queues one FPDU: length, header, body, pad and CRC (zero when CRCs are off).
    pub(crate) fn fpdu(&mut self, crc_on: bool, h: &Hdr, body: Body<'_>) {
        let blen = match body {
            Body::None => 0,
            Body::Priv(b) => b.len(),
            Body::Segs(_, _, n) => n,
        };
        let ulpdu = h.len() + blen;
        let at = self.arena.len();
        self.arena.extend_from_slice(&(ulpdu as u16).to_be_bytes());
        h.emit(&mut self.arena);
        if let Body::Priv(b) = body {
            self.arena.extend_from_slice(b);
        }
        let mut crc = if crc_on {
            crc32c::crc32c(&self.arena[at..])
        } else {
            0
        };
        let mut tail = at;
        if let Body::Segs(segs, from, n) = body {
            self.push_priv(at, self.arena.len() - at);
            if crc_on {
                crc = crc_segs(crc, segs, from, n);
            }
            let mut shared: [Option<Piece>; 2] = [None, None];
            let mut k = 0;
            for_ranges(segs, from, n, |s, off, len| {
                if k < shared.len() {
                    shared[k] = Some(Piece::Shared {
                        seg: s.clone(),
                        off,
                        len,
                    });
                    k += 1;
                }
            });
            for p in shared.into_iter().flatten() {
                self.pieces.push_back(p);
            }
            self.queued += n;
            tail = self.arena.len();
        }
        let pad = hdr::pad(ulpdu);
        self.arena.extend_from_slice(&[0u8; 3][..pad]);
        if crc_on {
            crc = crc32c::crc32c_append(crc, &[0u8; 3][..pad]);
        }
        self.arena.extend_from_slice(&crc.to_le_bytes());
        self.push_priv(tail, self.arena.len() - tail);
    }

    /// Hands queued pieces to the socket until it is full or they are all out; `Ok(true)`
    /// when all are out. Send WQEs whose bytes are all out land in `self.done`.
    pub(crate) fn send(&mut self, sock: &mio::net::TcpStream) -> std::io::Result<bool> {
        loop {
            self.pop_done();
            if self.pieces.is_empty() {
                self.arena.clear();
                self.queued = 0;
                return Ok(true);
            }
            let (n, want) = {
                let mut l = SendList::with_capacity(self.pieces.len());
                for p in &self.pieces {
                    if l.is_full() {
                        break;
                    }
                    match p {
                        Piece::Priv { at, len } => l.push_private(&self.arena[*at..*at + *len]),
                        Piece::Shared { seg, off, len } => l
                            .push_shared(seg.region().0, *off, *len)
                            .map_err(std::io::Error::other)?,
                        Piece::Done(_) => {}
                    }
                }
                match l.send(sock.as_fd()) {
                    Ok(n) => (n, l.bytes()),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            self.consume(n);
            if n < want {
                self.pop_done();
                return Ok(false);
            }
        }
    }

    fn pop_done(&mut self) {
        while let Some(Piece::Done(s)) = self.pieces.front() {
            self.done.push(*s);
            self.pieces.pop_front();
        }
    }

    /// `n` bytes from the front went out.
    fn consume(&mut self, mut n: usize) {
        self.queued -= n.min(self.queued);
        while n > 0 {
            match self.pieces.front_mut() {
                None => break,
                Some(Piece::Done(s)) => {
                    self.done.push(*s);
                    self.pieces.pop_front();
                }
                Some(Piece::Priv { at, len }) | Some(Piece::Shared { off: at, len, .. }) => {
                    if *len <= n {
                        n -= *len;
                        self.pieces.pop_front();
                    } else {
                        *at += n;
                        *len -= n;
                        n = 0;
                    }
                }
            }
        }
        self.compact();
    }

    /// Keeps the arena from growing while the socket never drains completely.
    fn compact(&mut self) {
        if self.arena.len() < (1 << 20) {
            return;
        }
        let first = self
            .pieces
            .iter()
            .find_map(|p| match p {
                Piece::Priv { at, .. } => Some(*at),
                _ => None,
            })
            .unwrap_or(self.arena.len());
        self.arena.drain(..first);
        for p in &mut self.pieces {
            if let Piece::Priv { at, .. } = p {
                *at -= first;
            }
        }
    }
}

/// One pass of the transmit half: cut FPDUs from the current message, the peer's reads and
/// the SQ, and send them; `true` if it did work.
pub(crate) fn run(
    ctx: &Ctx<'_>,
    qp: &Arc<Qp>,
    r: &RemoteQp,
    c: &mut Conn,
    budget: &mut usize,
) -> bool {
    let mut did = false;
    let mut moved = 0usize;
    loop {
        let before = c.tx.queued;
        did |= fill(ctx, qp, c);
        moved += c.tx.queued.saturating_sub(before);
        if c.tx.is_empty() || !r.tx_ready.load(Ordering::Relaxed) {
            break;
        }
        match c.tx.send(&c.sock) {
            Ok(all) => {
                did = true;
                if !all {
                    r.tx_ready.store(false, Ordering::Relaxed);
                }
            }
            Err(e) => {
                c.disconnected(qp, &e);
                return true;
            }
        }
        for seq in std::mem::take(&mut c.tx.done) {
            c.mark_sent(seq);
        }
        if !r.tx_ready.load(Ordering::Relaxed) || moved >= *budget || c.tx.cur.is_none() {
            // A message fully queued and sent: the next pass looks for more (completions
            // are written in between).
            if c.tx.cur.is_none() && c.tx.is_empty() && moved < *budget && !c.closing {
                let before = c.tx.queued;
                if fill(ctx, qp, c) {
                    did = true;
                    moved += c.tx.queued.saturating_sub(before);
                    continue;
                }
            }
            break;
        }
    }
    *budget = budget.saturating_sub(moved);
    did
}

impl Conn {
    /// All bytes of a SEND or WRITE are out: it is done (iWARP completes a send WQE once
    /// the transport has its bytes, as siw does).
    fn mark_sent(&mut self, seq: u64) {
        let front = self.next_seq - self.inflight.len() as u64;
        if let Some(f) = seq
            .checked_sub(front)
            .and_then(|i| self.inflight.get_mut(i as usize))
        {
            if f.status.is_none() {
                f.status = Some(CqeStatus::Success);
            }
        }
    }
}

/// Cuts FPDUs until [`TX_QUEUE`] bytes wait; `true` if it queued anything.
fn fill(ctx: &Ctx<'_>, qp: &Arc<Qp>, c: &mut Conn) -> bool {
    let mut did = false;
    while c.tx.queued < TX_QUEUE && !c.closing {
        if let Some(m) = c.tx.cur.take() {
            did = true;
            cut(c, m);
            continue;
        }
        if c.wait_rtr {
            break;
        }
        if let Some(rd) = c.irq.pop_front() {
            c.tx.cur = Some(TxMsg {
                opcode: hdr::op::READ_RESP,
                ddp: Ddp::Tagged {
                    stag: rd.stag,
                    to: rd.to,
                },
                src: Src::Segs([rd.src, None]),
                len: rd.len as usize,
                done: 0,
                seq: None,
            });
            continue;
        }
        if qp.state() != QpState::Rts || !next_wqe(ctx, qp, c) {
            break;
        }
        did = true;
    }
    did
}

/// Queues the next FPDU of `m` (keeps it current until its last byte is queued).
fn cut(c: &mut Conn, mut m: TxMsg) {
    let hlen = match m.ddp {
        Ddp::Tagged { .. } => hdr::TAGGED_LEN,
        Ddp::Untagged { .. } => hdr::UNTAGGED_LEN,
    };
    let room = (c.max_fpdu - hdr::MPA_LEN - hlen - hdr::CRC_LEN) & !3;
    let n = (m.len - m.done).min(room);
    let last = m.done + n == m.len;
    let ddp = match m.ddp {
        Ddp::Tagged { stag, to } => Ddp::Tagged {
            stag,
            to: to.wrapping_add(m.done as u64),
        },
        Ddp::Untagged { qn, msn, .. } => Ddp::Untagged {
            qn,
            msn,
            mo: m.done as u32,
        },
    };
    let h = Hdr {
        last,
        opcode: m.opcode,
        ddp,
    };
    match &m.src {
        Src::Segs(segs) => c.tx.fpdu(c.crc, &h, Body::Segs(segs, m.done, n)),
        Src::Inline(b) => c.tx.fpdu(c.crc, &h, Body::Priv(&b[m.done..m.done + n])),
    }
    m.done += n;
    if last {
        if let Some(seq) = m.seq {
            c.tx.pieces.push_back(Piece::Done(seq));
        }
    } else {
        c.tx.cur = Some(m);
    }
}

/// Starts the SQ's next WQE; `false` if there is none (or it must wait).
fn next_wqe(ctx: &Ctx<'_>, qp: &Arc<Qp>, c: &mut Conn) -> bool {
    let w = match c.held.take() {
        Some(w) => w,
        None => {
            let mut s = lock(&qp.send);
            if c.inflight.len() >= s.sq.size() as usize {
                return false;
            }
            let popped = s.sq.pop();
            if let Ok(Some(_)) = popped {
                s.sq.release();
            }
            qp.note_send_side(&s);
            drop(s);
            match popped {
                Ok(None) => return false,
                Err(e) => {
                    tracing::debug!(qp = qp.num.0, "SQ index garbage: {e}");
                    qp.fail(Some(EventKind::QpFatal));
                    return false;
                }
                Ok(Some(raw)) => match WqeRepr::from_bytes(&raw) {
                    Ok(w) if w.opcode != WqeOpcode::Recv => w,
                    _ => {
                        let seq = c.push_inflight(exec::wr_id_of(&raw), CqeOpcode::Send, true);
                        c.mark(seq, CqeStatus::BadWqe, 0);
                        return true;
                    }
                },
            }
        }
    };
    if w.opcode == WqeOpcode::RdmaRead && c.orq.len() >= c.ord {
        c.held = Some(w);
        return false;
    }
    let signaled = qp.sig_all || w.flags & flags::SIGNALED != 0;
    let seq = c.push_inflight(w.wr_id, exec::cqe_opcode(w.opcode), signaled);
    let segs = match exec::local_segs(ctx, qp, &w.data, w.opcode == WqeOpcode::RdmaRead) {
        Ok(s) => s,
        Err(st) => {
            c.mark(seq, st, 0);
            return true;
        }
    };
    let (src, len) = match w.data {
        WqeData::Inline { bytes, len } => (Src::Inline(bytes), usize::from(len)),
        WqeData::Sges { .. } => {
            let len = segs.iter().flatten().map(|s| s.len).sum();
            (Src::Segs(segs.clone()), len)
        }
    };
    c.set_len(seq, len as u64);
    if len > u32::MAX as usize && w.opcode != WqeOpcode::RdmaWrite {
        // DDP's MO and the Read Request's size are 32 bits: a longer SEND or READ has no
        // encoding (two SGEs of up to 4 GiB each can add up to more).
        c.mark(seq, CqeStatus::LocalLengthError, 0);
        return true;
    }
    let msg = |opcode, ddp, src| TxMsg {
        opcode,
        ddp,
        src,
        len,
        done: 0,
        seq: Some(seq),
    };
    match w.opcode {
        WqeOpcode::Send => {
            let opcode = if w.flags & flags::SOLICITED != 0 {
                hdr::op::SEND_SE
            } else {
                hdr::op::SEND
            };
            let msn = c.msn[0];
            c.msn[0] = msn.wrapping_add(1);
            let ddp = Ddp::Untagged {
                qn: hdr::QN_SEND,
                msn,
                mo: 0,
            };
            cut(c, msg(opcode, ddp, src));
        }
        WqeOpcode::RdmaWrite => {
            let ddp = Ddp::Tagged {
                stag: w.rkey,
                to: w.remote_addr,
            };
            cut(c, msg(hdr::op::WRITE, ddp, src));
        }
        WqeOpcode::RdmaRead => {
            let Src::Segs(_) = src else {
                // Inline data cannot receive a READ.
                c.mark(seq, CqeStatus::LocalProtectionError, 0);
                return true;
            };
            let first = segs.iter().flatten().next();
            let stag = first.map_or(0, |s| s.lkey());
            let base_to = first.map_or(0, |s| s.region().1 as u64);
            let mut body = Vec::with_capacity(hdr::READ_REQ_LEN);
            ReadReq {
                sink_stag: stag,
                sink_to: base_to,
                len: len as u32,
                src_stag: w.rkey,
                src_to: w.remote_addr,
            }
            .emit(&mut body);
            let h = qp::read_req_hdr(c);
            c.tx.fpdu(c.crc, &h, Body::Priv(&body));
            c.orq.push_back(OutRead {
                seq: Some(seq),
                segs,
                len: len as u64,
                got: 0,
                stag,
                base_to,
            });
        }
        // Immediate data has no carrier on the wire yet (Linux siw has none either).
        WqeOpcode::SendWithImm | WqeOpcode::RdmaWriteWithImm => {
            c.mark(seq, CqeStatus::LocalQpOperationError, 0);
        }
        WqeOpcode::Recv => c.mark(seq, CqeStatus::BadWqe, 0),
    }
    true
}
