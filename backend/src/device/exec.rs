//! Execution of work requests with RC semantics between QPs of this backend.
//!
//! Every WQE is copied out of the queue (by `shared_ring::queue`) and parsed into a
//! [`WqeRepr`] before anything is done with it; every byte range it names is resolved through
//! the key table, which checks owner, access and bounds. Nothing the guest writes is trusted
//! after that point, and nothing it writes later changes what is executed.
//!
//! Fairness is by bytes: a pass of the engine lets each channel move at most [`PASS_BYTES`]
//! while other channels have work too ([`SOLO_BYTES`] while it is alone), and each QP run at
//! most [`BUDGET`] WQEs. A message larger than what is left is moved in
//! pieces over several passes (`objects::Active`): its WQE stays at the head of the SQ, so the QP's
//! completions stay in order, and the responder's receive lock is held for one piece at a
//! time, never across the message.

use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, MutexGuard, Weak};

use shared_ring::abi::control::{access, QpState};
use shared_ring::abi::cqe::{flags as cqe_flags, CqeOpcode, CqeRepr, CqeStatus};
use shared_ring::abi::event::EventKind;
use shared_ring::abi::wqe::{flags, WqeData, WqeOpcode, WqeRepr, WQE_LEN};

use super::mr::{self, EngineKeys, Source};
use super::objects::{lock, Active, Kind, Qp, RecvSide, SegList, SendSide};
use super::peers::PeerCache;
use super::waker::EngineWaker;

/// WQEs one QP may execute per engine pass (fairness between QPs).
const BUDGET: usize = 32;
/// Payload bytes one channel may move per engine pass while other channels have work too
/// (fairness between channels by bytes): about 1–5 µs of copying, what another channel's
/// message may wait per pass. Also the largest piece copied at once.
pub(crate) const PASS_BYTES: usize = 8 << 10;
/// The budget of a channel that has had the engine to itself for a while (fewer passes per
/// byte for a lone stream; the first message of another channel waits for at most this).
pub(crate) const SOLO_BYTES: usize = 256 << 10;
/// WQEs one QP may flush per queue per pass.
const FLUSH_BUDGET: usize = 256;

/// What an engine pass needs.
pub(crate) struct Ctx<'a> {
    pub(crate) keys: EngineKeys<'a>,
    /// The peers of the QPs this engine executes WRITEs for, without `Weak::upgrade`.
    pub(crate) peers: PeerCache<Qp>,
    pub(crate) me: usize,
    pub(crate) engines: &'a [Arc<EngineWaker>],
}

enum Exec {
    Done {
        status: CqeStatus,
        len: u64,
    },
    /// No RECV posted at the peer: retry later, in order.
    Blocked,
    /// Part of the message moved (the byte budget is spent); the rest on later passes.
    Partial,
}

fn done(status: CqeStatus, len: u64) -> Exec {
    Exec::Done { status, len }
}

pub(crate) fn wr_id_of(raw: &[u8; WQE_LEN]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&raw[8..16]);
    u64::from_le_bytes(b)
}

/// [`wr_id_of`] of a slot given as its words (`Consumer::pop_words`).
fn wr_id_of_words(raw: &[u32; WQE_LEN / 4]) -> u64 {
    use shared_ring::abi::wqe::field::WR_ID;
    u64::from(u32::from_le(raw[WR_ID / 4])) | u64::from(u32::from_le(raw[WR_ID / 4 + 1])) << 32
}

pub(crate) fn cqe_opcode(op: WqeOpcode) -> CqeOpcode {
    match op {
        WqeOpcode::Send | WqeOpcode::SendWithImm => CqeOpcode::Send,
        WqeOpcode::RdmaWrite | WqeOpcode::RdmaWriteWithImm => CqeOpcode::RdmaWrite,
        WqeOpcode::RdmaRead => CqeOpcode::RdmaRead,
        WqeOpcode::Recv => CqeOpcode::Recv,
    }
}

pub(crate) fn cqe(qp: &Qp, wr_id: u64, opcode: CqeOpcode, status: CqeStatus, len: u64) -> CqeRepr {
    CqeRepr {
        wr_id,
        status,
        opcode,
        byte_len: if status == CqeStatus::Success {
            len as u32
        } else {
            0
        },
        imm_data: 0,
        qp_num: qp.num.0,
        vendor_err: 0,
        flags: 0,
    }
}

/// One pass over a QP, moving at most `budget` payload bytes (the channel's budget for this
/// pass, decremented); `true` if it did work.
pub(crate) fn process_qp(ctx: &Ctx<'_>, qp: &Arc<Qp>, budget: &mut usize) -> bool {
    if qp.destroyed.load(Ordering::Relaxed) {
        return false;
    }
    if let Some(r) = qp.remote.get() {
        return super::iwarp::process(ctx, qp, r, budget);
    }
    let did = match qp.state() {
        QpState::Error => flush(qp),
        QpState::Rts if qp.sq_quiet() => false,
        QpState::Rts => run_sq(ctx, qp, budget),
        _ => false,
    };
    hand_off_rnr(ctx, qp);
    did
}

/// A QP of another engine waits for a RECV here: wake that engine once one is posted.
fn hand_off_rnr(ctx: &Ctx<'_>, qp: &Qp) {
    if qp.rnr_waiter.load(Ordering::Relaxed) == 0 {
        return;
    }
    let posted = lock(&qp.recv).rq.available().map_or(true, |n| n > 0);
    if posted {
        // Read the RQ index before the waiter word, as the waiter writes them in reverse.
        fence(Ordering::SeqCst);
        let w = qp.rnr_waiter.swap(0, Ordering::SeqCst);
        if let Some(e) = w.checked_sub(1).and_then(|i| ctx.engines.get(i)) {
            if e.idx != ctx.me {
                e.wake();
            }
        }
    }
}

/// Before sleeping: whether a pass over the QP would do work, and whether it waits for a RECV
/// at a QP another engine serves.
pub(crate) fn has_work(qp: &Qp, me: usize) -> (bool, bool) {
    if qp.destroyed.load(Ordering::Relaxed) {
        return (false, false);
    }
    if let Some(r) = qp.remote.get() {
        // Remote: its connection's work, and in Error the queues' flush below.
        let w = super::iwarp::has_work(qp, r);
        if w || qp.state() != QpState::Error {
            return (w, false);
        }
    }
    if qp.rnr_waiter.load(Ordering::Relaxed) != 0
        && lock(&qp.recv).rq.available().is_ok_and(|n| n > 0)
    {
        return (true, false);
    }
    match qp.state() {
        QpState::Error => {
            let mut s = lock(&qp.send);
            let sq =
                s.pending.is_some() || s.active.is_some() || s.sq.available().is_ok_and(|n| n > 0);
            drop(s);
            let mut r = lock(&qp.recv);
            let rq = r.reserved.is_some() || r.rq.available().is_ok_and(|n| n > 0);
            (sq || rq, false)
        }
        QpState::Rts => {
            let mut s = lock(&qp.send);
            if s.active.is_some() {
                return (true, false);
            }
            if s.pending.is_none() {
                return (s.sq.available().is_ok_and(|n| n > 0), false);
            }
            let Some(peer) = s.peer.as_ref().and_then(Weak::upgrade) else {
                return (true, false);
            };
            drop(s);
            if !matches!(peer.state(), QpState::Rtr | QpState::Rts) {
                return (true, false);
            }
            let ready = lock(&peer.recv).rq.available().map_or(true, |n| n > 0);
            (ready, !ready && peer.ch.engine.idx != me)
        }
        _ => (false, false),
    }
}

fn run_sq(ctx: &Ctx<'_>, qp: &Arc<Qp>, budget: &mut usize) -> bool {
    let mut s = lock(&qp.send);
    let did = run_sq_locked(ctx, qp, &mut s, budget);
    qp.note_send_side(&s);
    did
}

fn run_sq_locked(ctx: &Ctx<'_>, qp: &Arc<Qp>, s: &mut SendSide, budget: &mut usize) -> bool {
    let mut did = false;
    // The slot as its words, each loaded once from shared memory and parsed from this copy.
    let mut raw = [0u32; WQE_LEN / 4];
    for _ in 0..BUDGET {
        if qp.state() != QpState::Rts {
            return true;
        }
        if *budget == 0 {
            break;
        }
        // `wqe` and `result` are assigned, not returned as a pair: the parsed WQE is built
        // where it stays (the common path moves no WQE-sized value).
        let wqe;
        let result;
        if let Some(mut a) = s.active.take() {
            let r = match s.peer.as_ref().and_then(Weak::upgrade) {
                Some(peer) => step(&peer, &mut a, budget),
                None => done(CqeStatus::RetryExceeded, 0),
            };
            wqe = a.wqe;
            if matches!(r, Exec::Partial) {
                s.active = Some(a);
            }
            result = r;
        } else {
            wqe = match s.pending.take() {
                Some(w) => w,
                None => match s.sq.pop_words(&mut raw) {
                    Ok(false) => break,
                    Ok(true) => match WqeRepr::from_words(&raw) {
                        Ok(w) if w.opcode != WqeOpcode::Recv => w,
                        _ => {
                            s.sq.release();
                            qp.ch.stats.op_by_engine(ctx.me, 0);
                            qp.ch.stats.error();
                            qp.counters.send_locked(false, 0);
                            let c = cqe(
                                qp,
                                wr_id_of_words(&raw),
                                CqeOpcode::Send,
                                CqeStatus::BadWqe,
                                0,
                            );
                            let kept = qp.send_cq.complete(&c, true);
                            qp.fail((!kept).then_some(EventKind::QpFatal));
                            return true;
                        }
                    },
                    Err(e) => {
                        tracing::debug!(qp = qp.num.0, "SQ index garbage: {e}");
                        qp.fail(Some(EventKind::QpFatal));
                        return true;
                    }
                },
            };
            result = match write_fast(ctx, qp, s, &wqe, *budget) {
                Some(r) => r,
                None => execute(ctx, qp, s, &wqe, budget),
            };
        }
        match result {
            Exec::Blocked => {
                s.pending = Some(wqe);
                break;
            }
            Exec::Partial => {
                did = true;
                break;
            }
            Exec::Done { status, len } => {
                s.sq.release();
                did = true;
                let ok = status == CqeStatus::Success;
                *budget = budget.saturating_sub(if ok { len as usize } else { 0 });
                // The engine serving the QP's channel, under the send lock: the counters
                // without locked instructions (stats.rs).
                qp.ch.stats.op_by_engine(ctx.me, if ok { len } else { 0 });
                if !ok {
                    qp.ch.stats.error();
                }
                qp.counters.send_locked(ok, len);
                if !ok || qp.sig_all || wqe.flags & flags::SIGNALED != 0 {
                    let c = cqe(qp, wqe.wr_id, cqe_opcode(wqe.opcode), status, len);
                    if !qp.send_cq.complete(&c, false) {
                        qp.fail(Some(EventKind::QpFatal));
                        return true;
                    }
                }
                if !ok {
                    qp.fail(None);
                    return true;
                }
            }
        }
    }
    did
}

/// Starts moving a message over several passes (`len` is more than what is left of the
/// budget); keeps it in `s.active` unless it ended at once.
fn start(peer: &Qp, s: &mut SendSide, mut a: Active, budget: &mut usize) -> Exec {
    let r = step(peer, &mut a, budget);
    if matches!(r, Exec::Partial) {
        s.active = Some(a);
    }
    r
}

/// Moves the next pieces of a partly executed WQE, as far as the budget goes; finishes it
/// when all bytes are there.
fn step(peer: &Qp, a: &mut Active, budget: &mut usize) -> Exec {
    while a.done < a.len {
        if *budget == 0 {
            return Exec::Partial;
        }
        if peer.destroyed.load(Ordering::Relaxed)
            || !matches!(peer.state(), QpState::Rtr | QpState::Rts)
        {
            return done(CqeStatus::RetryExceeded, 0);
        }
        let n = (*budget).min(PASS_BYTES).min(a.len - a.done);
        if let Kind::Send = a.kind {
            // The receive buffer is the peer's: written only while its RECV is still ours.
            let r = lock(&peer.recv);
            if r.reserved.is_none() {
                return done(CqeStatus::RetryExceeded, 0);
            }
            mr::copy_part(&a.src, &a.dst, a.done, n);
        } else {
            mr::copy_part(&a.src, &a.dst, a.done, n);
        }
        a.done += n;
        *budget -= n;
    }
    let len = a.len as u64;
    let solicited = a.wqe.flags & flags::SOLICITED != 0;
    let imm = matches!(
        a.wqe.opcode,
        WqeOpcode::SendWithImm | WqeOpcode::RdmaWriteWithImm
    )
    .then_some(a.wqe.imm_data);
    let r = match a.kind {
        Kind::Copy => done(CqeStatus::Success, len),
        Kind::Send | Kind::WriteImm if !matches!(peer.state(), QpState::Rtr | QpState::Rts) => {
            // The responder failed after the last piece: its flush completes the RECV.
            done(CqeStatus::RetryExceeded, 0)
        }
        Kind::Send => {
            let mut r = lock(&peer.recv);
            let Some(raw) = r.reserved.take() else {
                return done(CqeStatus::RetryExceeded, 0);
            };
            complete_recv(
                peer,
                r,
                &raw,
                CqeStatus::Success,
                len,
                imm,
                solicited,
                false,
            );
            done(CqeStatus::Success, len)
        }
        Kind::WriteImm => {
            let mut r = lock(&peer.recv);
            let Some(raw) = take_recv(&mut r) else {
                return done(CqeStatus::RetryExceeded, 0);
            };
            let (resp, req) = match WqeRepr::from_bytes(&raw) {
                Ok(w) if w.opcode == WqeOpcode::Recv => (CqeStatus::Success, CqeStatus::Success),
                _ => (CqeStatus::BadWqe, CqeStatus::RemoteOperationError),
            };
            complete_recv(peer, r, &raw, resp, len, imm, solicited, true);
            done(req, len)
        }
    };
    // `run_sq` takes a successful WQE's bytes off the budget; these were taken piece by piece.
    if let Exec::Done {
        status: CqeStatus::Success,
        ..
    } = r
    {
        *budget += a.len;
    }
    r
}

/// The peer's next RECV: the reserved one, else the head of its RQ (consumed).
fn take_recv(r: &mut RecvSide) -> Option<[u8; WQE_LEN]> {
    if let Some(raw) = r.reserved.take() {
        return Some(raw);
    }
    let raw = r.rq.pop().ok().flatten()?;
    r.rq.release();
    Some(raw)
}

/// Resolves the local SGEs of a WQE (`write`: the engine writes them).
pub(crate) fn local_segs(
    ctx: &Ctx<'_>,
    qp: &Qp,
    data: &WqeData,
    write: bool,
) -> Result<SegList, CqeStatus> {
    let mut out: SegList = [None, None];
    if let WqeData::Sges { sges, len } = data {
        for (o, sge) in out.iter_mut().zip(&sges[..usize::from(*len)]) {
            *o = Some(ctx.keys.local(qp.ch.id, qp.pd, sge, write)?);
        }
    }
    Ok(out)
}

fn source<'a>(data: &'a WqeData, segs: &'a SegList) -> Source<'a> {
    match data {
        WqeData::Inline { bytes, len } => Source::Inline(&bytes[..usize::from(*len)]),
        WqeData::Sges { .. } => Source::Segs(segs),
    }
}

/// The common case of [`execute`] without its lists: an RDMA WRITE of one SGE that fits the
/// budget, executed only if every check [`execute`] makes passes — the same checks, in the
/// same order (`EngineKeys::local_ref`, the peer's state, `EngineKeys::remote_ref`: the same
/// checks as `local`/`remote_checked` on segments that borrow their regions from the key
/// cache, the peer borrowed from the peer cache: no reference counts), and then the same
/// single copy `mr::scatter` makes. `None` (nothing written, nothing changed but the engine's
/// key and peer caches) for any other WQE and on any failed check: [`execute`] then does it
/// all again and completes the WQE with its error.
#[inline]
fn write_fast(ctx: &Ctx<'_>, qp: &Qp, s: &SendSide, w: &WqeRepr, budget: usize) -> Option<Exec> {
    let WqeData::Sges { sges, len: 1 } = &w.data else {
        return None;
    };
    if w.opcode != WqeOpcode::RdmaWrite || sges[0].length as usize > budget {
        return None;
    }
    let src = ctx.keys.local_ref(qp.ch.id, qp.pd, &sges[0], false).ok()?;
    let peer = ctx.peers.get(s.peer.as_ref()?)?;
    if peer.destroyed.load(Ordering::Relaxed)
        || !matches!(peer.state(), QpState::Rtr | QpState::Rts)
    {
        return None;
    }
    let len = src.len as u64;
    let dst = ctx
        .keys
        .remote_ref(
            peer.ch.id,
            peer.pd,
            w.rkey,
            w.remote_addr,
            len,
            access::REMOTE_WRITE,
        )
        .ok()?;
    mr::copy_seg(&dst, &src);
    Some(done(CqeStatus::Success, len))
}

fn execute(ctx: &Ctx<'_>, qp: &Qp, s: &mut SendSide, w: &WqeRepr, budget: &mut usize) -> Exec {
    let write_local = w.opcode == WqeOpcode::RdmaRead;
    let segs = match local_segs(ctx, qp, &w.data, write_local) {
        Ok(s) => s,
        Err(st) => return done(st, 0),
    };
    let src = source(&w.data, &segs);
    let len = src.len() as u64;
    let Some(peer) = s.peer.as_ref().and_then(Weak::upgrade) else {
        return done(CqeStatus::RetryExceeded, 0);
    };
    if peer.destroyed.load(Ordering::Relaxed)
        || !matches!(peer.state(), QpState::Rtr | QpState::Rts)
    {
        return done(CqeStatus::RetryExceeded, 0);
    }
    // More than this pass may move: in pieces (inline data is always small).
    let pieces = len as usize > *budget && matches!(src, Source::Segs(_));
    let active = |kind, src: SegList, dst: SegList| Active {
        wqe: *w,
        kind,
        src,
        dst,
        len: len as usize,
        done: 0,
    };
    let solicited = w.flags & flags::SOLICITED != 0;
    match w.opcode {
        WqeOpcode::Send | WqeOpcode::SendWithImm | WqeOpcode::RdmaWriteWithImm => {
            let imm = (w.opcode != WqeOpcode::Send).then_some(w.imm_data);
            let write =
                (w.opcode == WqeOpcode::RdmaWriteWithImm).then_some((w.remote_addr, w.rkey));
            match deliver(ctx, &peer, &src, imm, solicited, write, pieces) {
                Delivery::Now(e) => e,
                Delivery::Pieces(kind, dst) => {
                    start(&peer, s, active(kind, segs.clone(), dst), budget)
                }
            }
        }
        WqeOpcode::RdmaWrite => {
            match ctx.keys.remote(
                peer.ch.id,
                peer.pd,
                w.rkey,
                w.remote_addr,
                len,
                access::REMOTE_WRITE,
            ) {
                Ok(dst) if pieces => start(
                    &peer,
                    s,
                    active(Kind::Copy, segs.clone(), [Some(dst), None]),
                    budget,
                ),
                Ok(dst) => {
                    mr::scatter(&src, &[Some(dst), None]);
                    done(CqeStatus::Success, len)
                }
                Err(st) => done(st, 0),
            }
        }
        WqeOpcode::RdmaRead => {
            match ctx.keys.remote(
                peer.ch.id,
                peer.pd,
                w.rkey,
                w.remote_addr,
                len,
                access::REMOTE_READ,
            ) {
                Ok(remote) if pieces => start(
                    &peer,
                    s,
                    active(Kind::Copy, [Some(remote), None], segs.clone()),
                    budget,
                ),
                Ok(remote) => {
                    mr::scatter(&Source::Segs(&[Some(remote), None]), &segs);
                    done(CqeStatus::Success, len)
                }
                Err(st) => done(st, 0),
            }
        }
        // Parsing refused RECV on the SQ.
        WqeOpcode::Recv => done(CqeStatus::BadWqe, 0),
    }
}

/// What [`deliver`] did.
enum Delivery {
    /// Executed (or blocked, or failed) now.
    Now(Exec),
    /// Checked and ready to move in pieces into these segments (for a SEND the RECV is
    /// reserved at the peer).
    Pieces(Kind, SegList),
}

/// Delivers a SEND (or the immediate of an RDMA WRITE with immediate, `write` = target) to the
/// peer's next RECV. With `pieces`, a message that passes every check is not copied here but
/// handed back to be moved over several passes.
fn deliver(
    ctx: &Ctx<'_>,
    peer: &Qp,
    src: &Source<'_>,
    imm: Option<u32>,
    solicited: bool,
    write: Option<(u64, u32)>,
    pieces: bool,
) -> Delivery {
    let len = src.len() as u64;
    let mut r = lock(&peer.recv);
    if r.reserved.is_none() {
        match r.rq.available() {
            Err(e) => {
                drop(r);
                tracing::debug!(qp = peer.num.0, "RQ index garbage: {e}");
                peer.fail(Some(EventKind::QpFatal));
                return Delivery::Now(done(CqeStatus::RemoteOperationError, 0));
            }
            Ok(0) => {
                peer.rnr_waiter.store(ctx.me + 1, Ordering::SeqCst);
                return Delivery::Now(Exec::Blocked);
            }
            Ok(_) => {}
        }
    }
    if let Some((addr, rkey)) = write {
        match ctx
            .keys
            .remote(peer.ch.id, peer.pd, rkey, addr, len, access::REMOTE_WRITE)
        {
            // The RECV stays queued until the data are there (only this QP consumes it).
            Ok(dst) if pieces => return Delivery::Pieces(Kind::WriteImm, [Some(dst), None]),
            Ok(dst) => mr::scatter(src, &[Some(dst), None]),
            Err(st) => return Delivery::Now(done(st, 0)),
        }
    }
    let Some(raw) = take_recv(&mut r) else {
        return Delivery::Now(Exec::Blocked);
    };
    let recv = WqeRepr::from_bytes(&raw)
        .ok()
        .filter(|w| w.opcode == WqeOpcode::Recv);
    let (resp, req) = match (&recv, write) {
        (None, _) => (CqeStatus::BadWqe, CqeStatus::RemoteOperationError),
        (Some(_), Some(_)) => (CqeStatus::Success, CqeStatus::Success),
        (Some(rw), None) => match local_segs(ctx, peer, &rw.data, true) {
            Err(st) => (st, CqeStatus::RemoteOperationError),
            Ok(dst) => {
                let cap: u64 = dst.iter().flatten().map(|s| s.len as u64).sum();
                if cap < len {
                    (CqeStatus::LocalLengthError, CqeStatus::RemoteInvalidRequest)
                } else if pieces {
                    r.reserved = Some(raw);
                    return Delivery::Pieces(Kind::Send, dst);
                } else {
                    mr::scatter(src, &dst);
                    (CqeStatus::Success, CqeStatus::Success)
                }
            }
        },
    };
    complete_recv(peer, r, &raw, resp, len, imm, solicited, write.is_some());
    Delivery::Now(done(req, len))
}

/// Completes a RECV of `peer` (its receive lock `r` held until the CQE is written, so RECVs
/// complete in order) and moves the peer to Error if that failed.
#[allow(clippy::too_many_arguments)]
fn complete_recv(
    peer: &Qp,
    r: MutexGuard<'_, RecvSide>,
    raw: &[u8; WQE_LEN],
    resp: CqeStatus,
    len: u64,
    imm: Option<u32>,
    solicited: bool,
    write: bool,
) {
    let ok = resp == CqeStatus::Success;
    peer.ch.stats.op(if ok { len } else { 0 });
    if !ok {
        peer.ch.stats.error();
    }
    peer.counters.recv(ok, len);
    let mut c = cqe(
        peer,
        wr_id_of(raw),
        if write {
            CqeOpcode::RecvRdmaWithImm
        } else {
            CqeOpcode::Recv
        },
        resp,
        len,
    );
    if ok {
        if let Some(imm) = imm {
            c.imm_data = imm;
            c.flags |= cqe_flags::WITH_IMM;
        }
        if solicited {
            c.flags |= cqe_flags::SOLICITED;
        }
    }
    let kept = peer.recv_cq.complete(&c, solicited);
    drop(r);
    if !kept {
        peer.fail(Some(EventKind::QpFatal));
    } else if !ok {
        peer.fail(None);
    }
}

/// Completes every outstanding WQE of an Error QP with `WrFlushError`; `true` if any.
pub(crate) fn flush(qp: &Qp) -> bool {
    let mut did = false;
    {
        let mut s = lock(&qp.send);
        let head = s.pending.take().or_else(|| s.active.take().map(|a| a.wqe));
        if let Some(w) = head {
            let c = cqe(
                qp,
                w.wr_id,
                cqe_opcode(w.opcode),
                CqeStatus::WrFlushError,
                0,
            );
            qp.send_cq.complete(&c, false);
            did = true;
        }
        for _ in 0..FLUSH_BUDGET {
            let Ok(Some(raw)) = s.sq.pop() else { break };
            let op = WqeRepr::from_bytes(&raw).map_or(CqeOpcode::Send, |w| cqe_opcode(w.opcode));
            let c = cqe(qp, wr_id_of(&raw), op, CqeStatus::WrFlushError, 0);
            qp.send_cq.complete(&c, false);
            did = true;
        }
        if did {
            s.sq.release();
        }
    }
    let mut r = lock(&qp.recv);
    let flush_recv = |raw: &[u8; WQE_LEN]| {
        let c = cqe(
            qp,
            wr_id_of(raw),
            CqeOpcode::Recv,
            CqeStatus::WrFlushError,
            0,
        );
        qp.recv_cq.complete(&c, false);
    };
    // The RECV a SEND in pieces had reserved comes first: it was posted before the others.
    let mut rdid = false;
    if let Some(raw) = r.reserved.take() {
        flush_recv(&raw);
        rdid = true;
    }
    for _ in 0..FLUSH_BUDGET {
        let Ok(Some(raw)) = r.rq.pop() else { break };
        flush_recv(&raw);
        rdid = true;
    }
    if rdid {
        r.rq.release();
    }
    did || rdid
}
