//! The transmit half: send WQEs and Read Responses cut into FPDUs no larger than the MSS,
//! queued as a list of pieces — private bytes (MPA length, DDP/RDMAP header, pad, CRC) and
//! ranges of guest memory — and handed to the kernel with one `sendmsg` per batch, so payload
//! goes from the guest's pages to the socket without a copy and small messages queued
//! together leave in one system call. Every header, the FPDU trailer and the segmentation
//! come from the `iwarp-proto` codec (`MessageRepr::emit_fpdu_head`, `FpduCrc`, `Trailer`,
//! `message::segments`).

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use iwarp_proto::ddp::{TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
use iwarp_proto::fpdu::{self, FpduCrc, Trailer};
use iwarp_proto::message::{self, MessageRepr, Segments, MAX_FPDU_HEAD_LEN};
use iwarp_proto::rdmap::{Opcode, ReadRequestRepr};
use iwarp_proto::WireError;
use shared_ring::abi::control::QpState;
use shared_ring::abi::cqe::{CqeOpcode, CqeStatus};
use shared_ring::abi::event::EventKind;
use shared_ring::abi::wqe::{flags, WqeData, WqeOpcode, WqeRepr, MAX_INLINE};
use shared_ring::mem::SendList;

use super::qp::{self, Conn, OutRead, RemoteQp};
use crate::device::exec::{self, Ctx};
use crate::device::mr::Seg;
use crate::device::objects::{lock, Qp, SegList};

/// Bytes queued for the socket before the engine stops cutting FPDUs and sends (also the
/// most one pass moves for a QP whose budget allows it).
const TX_QUEUE: usize = 256 << 10;

/// Payloads up to this long are copied into the private bytes beside their headers rather
/// than sent from guest memory: one piece instead of three, and the CRC covers exactly the
/// bytes the socket gets (read once). Longer ones go from the guest's pages (zero-copy) and
/// are read twice — once for the CRC, once by the kernel.
const COPY_MAX: usize = 256;

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

/// Adds message bytes `[from, from + len)` over `segs` to `crc`, read where they lie (once,
/// by `SharedRegion::crc32c_append`: no copy).
pub(crate) fn crc_segs(crc: &mut FpduCrc, segs: &SegList, from: usize, len: usize) {
    for_ranges(segs, from, len, |s, off, n| {
        // In bounds: checked when the segment was resolved.
        if let Ok(v) = s.region().0.crc32c_append(crc.value(), off, n) {
            *crc = FpduCrc::from_value(v);
        }
    });
}

/// Copies message bytes `[from, from + out.len())` over `segs` into `out`.
fn copy_segs(segs: &SegList, from: usize, out: &mut [u8]) {
    let mut at = 0;
    for_ranges(segs, from, out.len(), |s, off, n| {
        // In bounds: checked when the segment was resolved.
        let _ = s.region().0.read_bytes(off, &mut out[at..at + n]);
        at += n;
    });
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

/// The payload an FPDU carries after its headers.
pub(crate) enum Payload<'a> {
    None,
    Priv(&'a [u8]),
    /// Message bytes `[from, from + len)` over the segments.
    Segs(&'a SegList, usize, usize),
}

impl Payload<'_> {
    fn len(&self) -> usize {
        match self {
            Payload::None => 0,
            Payload::Priv(b) => b.len(),
            Payload::Segs(_, _, n) => *n,
        }
    }
}

/// Where a message's payload comes from.
enum Src {
    Segs(SegList),
    Inline([u8; MAX_INLINE]),
}

/// Where a message's segments go.
#[derive(Clone, Copy)]
enum Dest {
    /// The peer's buffer `stag`, from tagged offset `to` (WRITE, Read Response).
    Tagged { stag: u32, to: u64 },
    /// Message `msn` of the opcode's untagged queue (SEND).
    Untagged { msn: u32 },
}

/// A message being cut into FPDUs.
pub(crate) struct TxMsg {
    opcode: Opcode,
    dest: Dest,
    src: Src,
    /// The segments still to cut.
    cuts: Segments,
    /// The send WQE that ends with the message.
    seq: Option<u64>,
}

impl TxMsg {
    fn new(c: &Conn, opcode: Opcode, dest: Dest, src: Src, len: usize, seq: Option<u64>) -> Self {
        let header = match dest {
            Dest::Tagged { .. } => TAGGED_HEADER_LEN,
            Dest::Untagged { .. } => UNTAGGED_HEADER_LEN,
        };
        TxMsg {
            opcode,
            dest,
            src,
            cuts: message::segments(len, c.mulpdu - header),
            seq,
        }
    }
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

    /// Queues one FPDU: the codec's head (length, DDP/RDMAP header, Read Request or
    /// Terminate body) from a stack buffer, the payload, and the trailer (pad, CRC — zero
    /// when CRCs are off). Nothing is queued if the codec refuses the message.
    pub(crate) fn fpdu(
        &mut self,
        crc_on: bool,
        m: &MessageRepr<'_>,
        payload: Payload<'_>,
    ) -> Result<(), WireError> {
        let mut head = [0u8; MAX_FPDU_HEAD_LEN];
        let hlen = m.emit_fpdu_head(payload.len(), &mut head)?;
        let ulpdu = hlen - fpdu::HEADER_LEN + payload.len();
        let at = self.arena.len();
        self.arena.extend_from_slice(&head[..hlen]);
        let payload = match payload {
            Payload::Priv(b) => {
                self.arena.extend_from_slice(b);
                Payload::None
            }
            Payload::Segs(segs, from, n) if n <= COPY_MAX => {
                let start = self.arena.len();
                self.arena.resize(start + n, 0);
                copy_segs(segs, from, &mut self.arena[start..]);
                Payload::None
            }
            p => p,
        };
        let mut crc = FpduCrc::new();
        if crc_on {
            crc.update(&self.arena[at..]);
        }
        let mut tail = at;
        if let Payload::Segs(segs, from, n) = payload {
            self.push_priv(at, self.arena.len() - at);
            if crc_on {
                crc_segs(&mut crc, segs, from, n);
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
        self.arena
            .extend_from_slice(Trailer::new(ulpdu, &crc, crc_on).as_bytes());
        self.push_priv(tail, self.arena.len() - tail);
        Ok(())
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
            if let Err(e) = cut(c, m) {
                c.local_failure(qp, &e);
                break;
            }
            continue;
        }
        if c.wait_rtr {
            break;
        }
        if let Some(rd) = c.irq.pop_front() {
            let dest = Dest::Tagged {
                stag: rd.stag,
                to: rd.to,
            };
            let src = Src::Segs([rd.src, None]);
            c.refresh_mulpdu(rd.len as usize);
            let m = TxMsg::new(c, Opcode::ReadResponse, dest, src, rd.len as usize, None);
            c.tx.cur = Some(m);
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
fn cut(c: &mut Conn, mut m: TxMsg) -> Result<(), WireError> {
    let Some((range, last)) = m.cuts.next() else {
        return Ok(());
    };
    let h = match m.dest {
        Dest::Tagged { stag, to } => {
            MessageRepr::tagged(m.opcode, last, stag, to.wrapping_add(range.start as u64))
        }
        Dest::Untagged { msn } => MessageRepr::untagged(m.opcode, last, 0, msn, range.start as u32),
    };
    match &m.src {
        Src::Segs(segs) => {
            let p = Payload::Segs(segs, range.start, range.len());
            c.tx.fpdu(c.crc, &h, p)?;
        }
        Src::Inline(b) => {
            let p = Payload::Priv(b.get(range).unwrap_or_default());
            c.tx.fpdu(c.crc, &h, p)?;
        }
    }
    if last {
        if let Some(seq) = m.seq {
            c.tx.pieces.push_back(Piece::Done(seq));
        }
    } else {
        c.tx.cur = Some(m);
    }
    Ok(())
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
    c.refresh_mulpdu(len);
    if len > u32::MAX as usize && w.opcode != WqeOpcode::RdmaWrite {
        // DDP's MO and the Read Request's size are 32 bits: a longer SEND or READ has no
        // encoding (two SGEs of up to 4 GiB each can add up to more).
        c.mark(seq, CqeStatus::LocalLengthError, 0);
        return true;
    }
    let sent = match w.opcode {
        WqeOpcode::Send => {
            let opcode = if w.flags & flags::SOLICITED != 0 {
                Opcode::SendSe
            } else {
                Opcode::Send
            };
            let msn = c.msn[0];
            c.msn[0] = msn.wrapping_add(1);
            let m = TxMsg::new(c, opcode, Dest::Untagged { msn }, src, len, Some(seq));
            cut(c, m)
        }
        WqeOpcode::RdmaWrite => {
            let dest = Dest::Tagged {
                stag: w.rkey,
                to: w.remote_addr,
            };
            let m = TxMsg::new(c, Opcode::Write, dest, src, len, Some(seq));
            cut(c, m)
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
            let m = qp::read_request(
                c,
                ReadRequestRepr {
                    sink_stag: stag,
                    sink_to: base_to,
                    size: len as u32,
                    source_stag: w.rkey,
                    source_to: w.remote_addr,
                },
            );
            c.orq.push_back(OutRead {
                seq: Some(seq),
                segs,
                len: len as u64,
                got: 0,
                stag,
                base_to,
            });
            c.tx.fpdu(c.crc, &m, Payload::None)
        }
        // Immediate data has no carrier on the wire yet (Linux siw has none either).
        WqeOpcode::SendWithImm | WqeOpcode::RdmaWriteWithImm => {
            c.mark(seq, CqeStatus::LocalQpOperationError, 0);
            Ok(())
        }
        WqeOpcode::Recv => {
            c.mark(seq, CqeStatus::BadWqe, 0);
            Ok(())
        }
    };
    if let Err(e) = sent {
        c.local_failure(qp, &e);
    }
    true
}
