//! Queue pairs: create, modify (connect at RTR), query, destroy; post_send and post_recv.

use std::ffi::{c_int, c_uint};
use std::sync::Mutex;

use verbs_abi::verbs::*;
use vrdma::{RemoteMr, SendOp, Sge};

use crate::cq::Cq;
use crate::device::Ctx;
use crate::errno::*;
use crate::mr::Pd;
use crate::objects::null_errno;
use crate::{fail, guard};

#[repr(C)]
pub(crate) struct Qp {
    pub qp: ibv_qp,
    vr: Mutex<vrdma::QueuePair>,
    attr: Mutex<ibv_qp_attr>,
    init: ibv_qp_init_attr,
    sq_sig_all: bool,
    /// The `ConnectAv` of the move to RTR towards this backend's own GID: on the software
    /// device a pairing, answered once the peer names this QP too; the first post_send
    /// waits for it (see `modify_qp`).
    connecting: Mutex<Option<std::thread::JoinHandle<Result<(), i32>>>>,
    /// The address vector of the move to RTR; the move to RTS sends it again with the send
    /// PSN.
    av: Mutex<Option<vrdma::AddressVector>>,
}

impl Qp {
    /// The backend's `Disconnect` for a move to ERR. Right after RTR the pairing `Connect`
    /// may still be on its way from the background thread, and a QP that has not named its
    /// peer yet has no connection to end ("the QP has no connection"): try again while that
    /// thread runs, for up to `CONNECT_SEND_WAIT`. (A QP that named its peer, paired or not,
    /// is disconnected at once: the backend abandons a half-made pairing.)
    fn disconnect_for_err(&self) -> vrdma::Result<()> {
        const CONNECT_SEND_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
        let t0 = std::time::Instant::now();
        loop {
            // Looked at before the attempt: a connect that ends during it is tried once more.
            let connecting = self
                .connecting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|t| !t.is_finished());
            let r = self
                .vr
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .disconnect();
            if r.is_ok() || !connecting || t0.elapsed() >= CONNECT_SEND_WAIT {
                return r;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Waits for a pending connect; its error, if it failed.
    fn connected(&self) -> Result<(), i32> {
        let pending = self
            .connecting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match pending {
            Some(t) => t.join().unwrap_or(Err(EIO)),
            None => Ok(()),
        }
    }
}

impl Qp {
    /// # Safety
    /// `p` must be NULL or a live QP of this library.
    pub(crate) unsafe fn of<'a>(p: *mut ibv_qp) -> Option<&'a Qp> {
        // SAFETY: the caller's contract.
        (!p.is_null()).then(|| unsafe { &*p.cast::<Qp>() })
    }

    /// rdma_connect: connects through the connection manager (blocks until the outcome; the
    /// QP stays free for posting receives meanwhile).
    pub(crate) fn cm_connect(
        &self,
        peer: std::net::SocketAddr,
        private_data: &[u8],
        timeout: std::time::Duration,
    ) -> vrdma::Result<vrdma::CmInfo> {
        let conn = self
            .vr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .connector();
        conn.connect_to(peer, private_data, timeout)
    }

    /// rdma_accept: accepts `req` on this QP (blocks until established; the QP stays free).
    pub(crate) fn cm_accept(
        &self,
        req: vrdma::ConnRequest,
        private_data: &[u8],
    ) -> vrdma::Result<vrdma::CmInfo> {
        let conn = self
            .vr
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .connector();
        req.accept_with(&conn, private_data)
    }

    /// The connection manager established the QP's connection: it is in RTS, and its
    /// flushed receives are passed on when the connection ends (rdma_cm programs wait for
    /// them, as after a disconnect on a real device).
    ///
    /// # Safety
    /// `p` must be this QP's own pointer.
    pub(crate) unsafe fn cm_established(&self, p: *mut ibv_qp) {
        let mut cur = self.attr.lock().unwrap_or_else(|e| e.into_inner());
        cur.qp_state = IBV_QPS_RTS;
        cur.cur_qp_state = IBV_QPS_RTS;
        // SAFETY: the QP's context is live while the QP is.
        if let Some(ctx) = unsafe { Ctx::of(self.qp.context) } {
            ctx.flushing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(self.qp.qp_num);
        }
        // SAFETY: the caller's contract; `state` is libibverbs' public field.
        unsafe { (*p).state = IBV_QPS_RTS };
    }
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_create_qp(
    p: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    guard(std::ptr::null_mut(), || {
        // SAFETY: C contract.
        let Some(pd) = (unsafe { Pd::of(p) }) else {
            return null_errno(EINVAL);
        };
        if init.is_null() {
            return null_errno(EINVAL);
        }
        // SAFETY: the caller's init attributes.
        let ia = unsafe { &mut *init };
        if ia.qp_type != IBV_QPT_RC || !ia.srq.is_null() {
            // UD, UC, raw packet, XRC; shared receive queues.
            return null_errno(EOPNOTSUPP);
        }
        // SAFETY: CQs of ours or NULL.
        let (Some(scq), Some(rcq)) = (unsafe { Cq::of(ia.send_cq) }, unsafe { Cq::of(ia.recv_cq) })
        else {
            return null_errno(EINVAL);
        };
        let cap = ia.cap;
        let max_sge = vrdma::MAX_SGE as u32;
        if cap.max_send_sge > max_sge
            || cap.max_recv_sge > max_sge
            || cap.max_inline_data > vrdma::MAX_INLINE as u32
        {
            return null_errno(EINVAL);
        }
        // The device's queues have at least 2 slots.
        let sq = cap.max_send_wr.max(2);
        let rq = cap.max_recv_wr.max(2);
        let built = {
            fn lock(c: &Cq) -> std::sync::MutexGuard<'_, vrdma::CompletionQueue> {
                c.vr.lock().unwrap_or_else(|e| e.into_inner())
            }
            if std::ptr::eq(scq, rcq) {
                let sg = lock(scq);
                pd.vr.create_qp(&sg, &sg).sq_size(sq).rq_size(rq).build()
            } else {
                // Both CQs' locks, always in address order: two threads creating QPs on the
                // same two CQs, send and receive swapped, would otherwise deadlock.
                let (sg, rg);
                if (scq as *const Cq) < (rcq as *const Cq) {
                    sg = lock(scq);
                    rg = lock(rcq);
                } else {
                    rg = lock(rcq);
                    sg = lock(scq);
                }
                pd.vr.create_qp(&sg, &rg).sq_size(sq).rq_size(rq).build()
            }
        };
        let vr = match built {
            Ok(q) => q,
            Err(e) => return null_errno(fail("ibv_create_qp", &e)),
        };
        // What the QP really has (ibv_create_qp reports it back in `cap`).
        ia.cap = ibv_qp_cap {
            max_send_wr: sq.next_power_of_two(),
            max_recv_wr: rq.next_power_of_two(),
            max_send_sge: max_sge,
            max_recv_sge: max_sge,
            max_inline_data: vr.max_inline(),
        };
        // SAFETY: all-zero mutex/cond are valid initial values on glibc.
        let mut q: ibv_qp = unsafe { std::mem::zeroed() };
        // SAFETY: the PD's context.
        q.context = pd.pd.context;
        q.qp_context = ia.qp_context;
        q.pd = p;
        q.send_cq = ia.send_cq;
        q.recv_cq = ia.recv_cq;
        q.handle = vr.handle();
        q.qp_num = vr.qp_num();
        q.state = IBV_QPS_RESET;
        q.qp_type = IBV_QPT_RC;
        let attr = ibv_qp_attr {
            qp_state: IBV_QPS_RESET,
            cap: ia.cap,
            path_mtu: IBV_MTU_4096,
            ..Default::default()
        };
        // SAFETY: the PD's context is live.
        let ctx = unsafe { Ctx::of(pd.pd.context) };
        let handle = q.handle;
        let p = Box::into_raw(Box::new(Qp {
            qp: q,
            vr: Mutex::new(vr),
            attr: Mutex::new(attr),
            init: *ia,
            sq_sig_all: ia.sq_sig_all != 0,
            connecting: Mutex::new(None),
            av: Mutex::new(None),
        }));
        if let Some(ctx) = ctx {
            ctx.qps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(handle, p as usize);
        }
        p.cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_destroy_qp(p: *mut ibv_qp) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract.
        let Some(qp) = (unsafe { Qp::of(p) }) else {
            return EINVAL;
        };
        // SAFETY: the QP's context is live.
        if let Some(ctx) = unsafe { Ctx::of(qp.qp.context) } {
            ctx.flushing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&qp.qp.qp_num);
            ctx.qps
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&qp.qp.handle);
        }
        // SAFETY: from Box::into_raw in create_qp, destroyed once.
        drop(unsafe { Box::from_raw(p.cast::<Qp>()) });
        0
    })
}

/// The backend's answer to a `Disconnect` of a QP that never connected.
fn has_no_connection(e: &vrdma::Error) -> bool {
    matches!(
        e,
        vrdma::Error::Backend {
            op: vrdma::Op::Disconnect,
            status: vrdma::Status::InvalidArgument,
        }
    )
}

/// The address vector of a move to RTR (`a`, `mask`; what is not in the mask from `cur`).
/// The GID is the AV's global route's, or all zero without one (InfiniBand's LID; the
/// software device's "this backend"); our own GID invented for a backend that publishes no
/// address (see `device::gid_for`) is all zero too. `None`: an MTU ibverbs does not have.
fn av_of(
    ctx: &Ctx,
    a: &ibv_qp_attr,
    cur: &ibv_qp_attr,
    mask: c_uint,
) -> Option<vrdma::AddressVector> {
    let ah = &a.ah_attr;
    let mut gid = if ah.is_global != 0 {
        ah.grh.dgid.raw()
    } else {
        [0; 16]
    };
    if gid == ctx.gid && ctx.vr.backend_addr_raw() == [0; 16] {
        gid = [0; 16];
    }
    let pick = |bit: c_uint, new: u32, old: u32| if mask & bit != 0 { new } else { old };
    let path_mtu = pick(IBV_QP_PATH_MTU, a.path_mtu, cur.path_mtu);
    Some(vrdma::AddressVector {
        gid,
        lid: ah.dlid,
        qp_num: a.dest_qp_num,
        rq_psn: pick(IBV_QP_RQ_PSN, a.rq_psn, cur.rq_psn) & 0xff_ffff,
        path_mtu: u8::try_from(path_mtu).ok().filter(|m| *m <= 5)?,
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_modify_qp(
    p: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract.
        let Some(qp) = (unsafe { Qp::of(p) }) else {
            return EINVAL;
        };
        if attr.is_null() {
            return EINVAL;
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &*attr };
        let mask = mask as c_uint;
        // SAFETY: the QP's context is live.
        let Some(ctx) = (unsafe { Ctx::of(qp.qp.context) }) else {
            return EINVAL;
        };
        let mut cur = qp.attr.lock().unwrap_or_else(|e| e.into_inner());
        if mask & IBV_QP_RATE_LIMIT != 0 || mask & IBV_QP_ALT_PATH != 0 {
            return EOPNOTSUPP;
        }
        let to = if mask & IBV_QP_STATE != 0 {
            a.qp_state
        } else {
            cur.qp_state
        };
        let from = cur.qp_state;
        // The transitions of the IB spec that an RC QP of this library makes.
        let ok = matches!(
            (from, to),
            (IBV_QPS_RESET, IBV_QPS_RESET | IBV_QPS_INIT)
                | (IBV_QPS_INIT, IBV_QPS_INIT | IBV_QPS_RTR)
                | (IBV_QPS_RTR, IBV_QPS_RTS)
                | (IBV_QPS_RTS, IBV_QPS_RTS)
        ) || to == IBV_QPS_ERR;
        if !ok {
            return EINVAL;
        }
        if from == IBV_QPS_INIT && to == IBV_QPS_RTR {
            if mask & IBV_QP_AV == 0 || mask & IBV_QP_DEST_QPN == 0 {
                return EINVAL;
            }
            let Some(av) = av_of(ctx, a, &cur, mask) else {
                return EINVAL;
            };
            let conn = qp.vr.lock().unwrap_or_else(|e| e.into_inner()).connector();
            if av.gid == [0; 16] || ctx.gids.iter().any(|(g, _)| *g == av.gid) {
                // One of this backend's GIDs: on the software device a pairing, which the
                // backend answers when both ends have named each other, possibly after this
                // program tells its peer our QP number: connect in the background, and let
                // the first post_send wait for it. (A device with address vectors answers
                // at once.)
                let t = std::thread::Builder::new()
                    .name("vrdma-verbs-connect".into())
                    .spawn(move || {
                        conn.connect_av(&av, None)
                            .map_err(|e| fail("ibv_modify_qp(RTR): connect", &e))
                    });
                match t {
                    Ok(t) => {
                        *qp.connecting.lock().unwrap_or_else(|e| e.into_inner()) = Some(t);
                    }
                    Err(_) => return EAGAIN,
                }
            } else if let Err(e) = conn.connect_av(&av, None) {
                // Another host: the backend checks the peer against the domain's allowed
                // peers and answers at once (the software device cannot reach it).
                return fail("ibv_modify_qp(RTR)", &e);
            }
            *qp.av.lock().unwrap_or_else(|e| e.into_inner()) = Some(av);
        }
        if from == IBV_QPS_RTR && to == IBV_QPS_RTS {
            let av = *qp.av.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(av) = av {
                let psn = if mask & IBV_QP_SQ_PSN != 0 {
                    a.sq_psn
                } else {
                    cur.sq_psn
                } & 0xff_ffff;
                let conn = qp.vr.lock().unwrap_or_else(|e| e.into_inner()).connector();
                if let Err(e) = conn.connect_av(&av, Some(psn)) {
                    return fail("ibv_modify_qp(RTS)", &e);
                }
            }
        }
        // Remember what was set (ibv_query_qp reports it).
        macro_rules! keep {
            ($bit:expr, $($f:ident),+) => {
                if mask & $bit != 0 { $( cur.$f = a.$f; )+ }
            };
        }
        keep!(IBV_QP_ACCESS_FLAGS, qp_access_flags);
        keep!(IBV_QP_PKEY_INDEX, pkey_index);
        keep!(IBV_QP_PORT, port_num);
        keep!(IBV_QP_QKEY, qkey);
        keep!(IBV_QP_AV, ah_attr);
        keep!(IBV_QP_PATH_MTU, path_mtu);
        keep!(IBV_QP_TIMEOUT, timeout);
        keep!(IBV_QP_RETRY_CNT, retry_cnt);
        keep!(IBV_QP_RNR_RETRY, rnr_retry);
        keep!(IBV_QP_RQ_PSN, rq_psn);
        keep!(IBV_QP_MAX_QP_RD_ATOMIC, max_rd_atomic);
        keep!(IBV_QP_MIN_RNR_TIMER, min_rnr_timer);
        keep!(IBV_QP_SQ_PSN, sq_psn);
        keep!(IBV_QP_MAX_DEST_RD_ATOMIC, max_dest_rd_atomic);
        keep!(IBV_QP_DEST_QPN, dest_qp_num);
        if to == IBV_QPS_ERR && from != IBV_QPS_ERR {
            ctx.flushing
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(qp.qp.qp_num);
            if matches!(from, IBV_QPS_RTR | IBV_QPS_RTS) {
                // The backend's Disconnect moves a paired (or pairing) QP to Error: its work
                // requests flush, as on a move to ERR. (The peer's QP fails too; its flushed
                // receives are not passed on, see cq::deliver_wc.) A QP whose connect of the
                // move to RTR was refused (a peer not allowed, a bad address vector) has no
                // connection to end — the backend says `InvalidArgument` — and goes to Error
                // as any QP does.
                let r = match qp.disconnect_for_err() {
                    Err(e) if has_no_connection(&e) => {
                        qp.vr.lock().unwrap_or_else(|e| e.into_inner()).set_error()
                    }
                    r => r,
                };
                if let Err(e) = r {
                    return fail("ibv_modify_qp(ERR)", &e);
                }
            } else if from == IBV_QPS_INIT {
                // Nothing connected (a move to RTR refused at once stays in INIT: a peer not
                // allowed, a bad address vector): the backend moves the QP to Error, and the
                // receives posted in INIT flush.
                let r = qp.vr.lock().unwrap_or_else(|e| e.into_inner()).set_error();
                if let Err(e) = r {
                    return fail("ibv_modify_qp(ERR)", &e);
                }
            }
        }
        cur.qp_state = to;
        cur.cur_qp_state = to;
        // SAFETY: the program's ibv_qp is ours; `state` is libibverbs' public field.
        unsafe { (*p).state = to };
        0
    })
}

#[no_mangle]
pub unsafe extern "C" fn vrdma_verbs_ibv_query_qp(
    p: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract.
        let Some(qp) = (unsafe { Qp::of(p) }) else {
            return EINVAL;
        };
        if attr.is_null() || init.is_null() {
            return EINVAL;
        }
        let cur = *qp.attr.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the caller's output structs.
        unsafe {
            attr.write(cur);
            init.write(qp.init);
        }
        0
    })
}

/// Local SGEs (addresses) as WQE SGEs (offsets into their region).
fn wqe_sges(
    pd: &Pd,
    list: *const ibv_sge,
    n: c_int,
    out: &mut [Sge; vrdma::MAX_SGE],
) -> Result<usize, i32> {
    if n < 0 || n as usize > vrdma::MAX_SGE || (n > 0 && list.is_null()) {
        return Err(EINVAL);
    }
    let keys = pd.lkeys.read().unwrap_or_else(|e| e.into_inner());
    for (i, o) in out.iter_mut().enumerate().take(n as usize) {
        // SAFETY: the work request's `sg_list` holds `num_sge` entries.
        let s = unsafe { list.add(i).read() };
        // An unknown lkey goes to the backend as is: it completes the request with an error,
        // as a device does.
        let base = keys.get(&s.lkey).copied().unwrap_or(0);
        *o = Sge {
            offset: s.addr.wrapping_sub(base),
            length: s.length,
            lkey: s.lkey,
        };
    }
    Ok(n as usize)
}

fn post_one_send(qp: &Qp, pd: &Pd, wr: &ibv_send_wr) -> Result<(), i32> {
    if wr.num_sge < 0
        || wr.num_sge as usize > vrdma::MAX_SGE
        || (wr.num_sge > 0 && wr.sg_list.is_null())
    {
        return Err(EINVAL);
    }
    let mut sges = [Sge::default(); vrdma::MAX_SGE];
    let total: u64 = (0..wr.num_sge as usize)
        // SAFETY: `sg_list` holds `num_sge` entries.
        .map(|i| u64::from(unsafe { wr.sg_list.add(i).read() }.length))
        .sum();
    // SAFETY: `wr.rdma` is the member RDMA opcodes use; plain integers.
    let rdma = unsafe { wr.wr.rdma };
    let remote = RemoteMr {
        addr: rdma.remote_addr,
        len: total,
        rkey: rdma.rkey,
    };
    let op = match wr.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm(wr.imm_data),
        IBV_WR_RDMA_WRITE => SendOp::Write(remote),
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm(remote, wr.imm_data),
        IBV_WR_RDMA_READ => SendOp::Read(remote),
        // Atomics, memory windows, invalidation, TSO.
        _ => return Err(EINVAL),
    };
    let mut inline_buf = [0u8; vrdma::MAX_INLINE];
    let inline = if wr.send_flags & IBV_SEND_INLINE != 0 && wr.opcode != IBV_WR_RDMA_READ {
        if total > vrdma::MAX_INLINE as u64 {
            return Err(EINVAL);
        }
        let mut at = 0usize;
        for i in 0..wr.num_sge.max(0) as usize {
            // SAFETY: `sg_list` holds `num_sge` entries; an inline SGE's address is the
            // program's readable memory of `length` bytes (it needs no lkey).
            unsafe {
                let s = wr.sg_list.add(i).read();
                std::ptr::copy_nonoverlapping(
                    s.addr as usize as *const u8,
                    inline_buf.as_mut_ptr().add(at),
                    s.length as usize,
                );
                at += s.length as usize;
            }
        }
        Some(&inline_buf[..at])
    } else {
        None
    };
    let n = if inline.is_some() {
        0
    } else {
        wqe_sges(pd, wr.sg_list, wr.num_sge, &mut sges)?
    };
    let signaled = qp.sq_sig_all || wr.send_flags & IBV_SEND_SIGNALED != 0;
    qp.vr
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .post_send_sges(
            wr.wr_id,
            op,
            &sges[..n],
            inline,
            signaled,
            wr.send_flags & IBV_SEND_SOLICITED != 0,
            wr.send_flags & IBV_SEND_FENCE != 0,
        )
        .map_err(|e| fail("ibv_post_send", &e))
}

pub(crate) unsafe extern "C" fn post_send(
    p: *mut ibv_qp,
    mut wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract.
        let Some(qp) = (unsafe { Qp::of(p) }) else {
            return EINVAL;
        };
        // SAFETY: the QP's PD is live.
        let Some(pd) = (unsafe { Pd::of(qp.qp.pd) }) else {
            return EINVAL;
        };
        if let Err(e) = qp.connected() {
            if !bad.is_null() {
                // SAFETY: the caller's out pointer.
                unsafe { *bad = wr };
            }
            return e;
        }
        while !wr.is_null() {
            // SAFETY: the program's work request list.
            let w = unsafe { &*wr };
            if let Err(e) = post_one_send(qp, pd, w) {
                if !bad.is_null() {
                    // SAFETY: the caller's out pointer.
                    unsafe { *bad = wr };
                }
                return e;
            }
            wr = w.next;
        }
        0
    })
}

pub(crate) unsafe extern "C" fn post_recv(
    p: *mut ibv_qp,
    mut wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(EIO, || {
        // SAFETY: C contract.
        let Some(qp) = (unsafe { Qp::of(p) }) else {
            return EINVAL;
        };
        // SAFETY: the QP's PD is live.
        let Some(pd) = (unsafe { Pd::of(qp.qp.pd) }) else {
            return EINVAL;
        };
        let mut q = qp.vr.lock().unwrap_or_else(|e| e.into_inner());
        while !wr.is_null() {
            // SAFETY: the program's work request list.
            let w = unsafe { &*wr };
            let mut sges = [Sge::default(); vrdma::MAX_SGE];
            let r = wqe_sges(pd, w.sg_list, w.num_sge, &mut sges).and_then(|n| {
                q.post_recv_sges(&sges[..n], w.wr_id)
                    .map_err(|e| fail("ibv_post_recv", &e))
            });
            if let Err(e) = r {
                if !bad.is_null() {
                    // SAFETY: the caller's out pointer.
                    unsafe { *bad = wr };
                }
                return e;
            }
            wr = w.next;
        }
        0
    })
}
