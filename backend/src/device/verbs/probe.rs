//! `vrdmactl verbs-probe`: what libibverbs sees on this host, and a loopback self-test of one
//! device (PD, MR, CQs, two RC QPs connected to each other, RDMA WRITE and SEND/RECV with the
//! data checked).

use std::alloc::Layout;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::abi::*;
use super::{c_string, gid_string, Context, Cq, Qp, VerbsError, VerbsLib};

/// What the probe reports about one port.
#[derive(Clone, Debug)]
pub struct PortReport {
    pub port: u8,
    pub attr: ibv_port_attr,
    /// Non-zero GID table entries: (index, GID).
    pub gids: Vec<(i32, ibv_gid)>,
}

/// What the probe reports about one device.
#[derive(Clone, Debug)]
pub struct DeviceReport {
    pub name: String,
    pub node_type: i32,
    pub transport_type: i32,
    pub attr: ibv_device_attr,
    pub ports: Vec<PortReport>,
}

/// Opens every device libibverbs lists and queries its attributes, ports and GIDs.
/// Returns the reports and, when there are none, libibverbs' reason if it gave one.
pub fn list(lib: &VerbsLib) -> Result<(Vec<DeviceReport>, Option<String>), VerbsError> {
    let list = lib.devices()?;
    let mut out = Vec::new();
    for d in &list.devices {
        let ctx = lib.open_device(&d.name)?;
        let attr = ctx.query_device()?;
        let mut ports = Vec::new();
        for port in 1..=attr.phys_port_cnt {
            let pattr = ctx.query_port(port)?;
            let mut gids = Vec::new();
            for i in 0..pattr.gid_tbl_len.clamp(0, 256) {
                match ctx.query_gid(port, i) {
                    Ok(g) if g.raw() != [0; 16] => gids.push((i, g)),
                    Ok(_) => {}
                    // Unpopulated RoCE GID entries fail with EINVAL/ENODATA: not an error.
                    Err(_) => {}
                }
            }
            ports.push(PortReport {
                port,
                attr: pattr,
                gids,
            });
        }
        out.push(DeviceReport {
            name: d.name.clone(),
            node_type: d.node_type,
            transport_type: d.transport_type,
            attr,
            ports,
        });
    }
    Ok((out, list.empty_reason))
}

pub fn port_state_str(s: u32) -> &'static str {
    match s {
        IBV_PORT_NOP => "NOP",
        IBV_PORT_DOWN => "DOWN",
        IBV_PORT_INIT => "INIT",
        IBV_PORT_ARMED => "ARMED",
        IBV_PORT_ACTIVE => "ACTIVE",
        IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER",
        _ => "unknown",
    }
}

pub fn transport_str(t: i32) -> &'static str {
    match t {
        IBV_TRANSPORT_IB => "InfiniBand",
        IBV_TRANSPORT_IWARP => "iWARP",
        IBV_TRANSPORT_USNIC => "usNIC",
        IBV_TRANSPORT_USNIC_UDP => "usNIC UDP",
        _ => "unknown",
    }
}

pub fn link_layer_str(l: u8) -> &'static str {
    match l {
        IBV_LINK_LAYER_INFINIBAND => "InfiniBand",
        IBV_LINK_LAYER_ETHERNET => "Ethernet",
        _ => "unspecified",
    }
}

pub fn mtu_bytes(m: u32) -> u32 {
    match m {
        IBV_MTU_256..=IBV_MTU_4096 => 128 << m,
        _ => 0,
    }
}

/// The probe's listing as text (what `vrdmactl verbs-probe` prints).
pub fn render(lib: &VerbsLib, devs: &[DeviceReport], empty_reason: Option<&str>) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "libibverbs: {} — {} RDMA device{}",
        std::path::Path::new(lib.path()).display(),
        devs.len(),
        if devs.len() == 1 { "" } else { "s" }
    );
    if devs.is_empty() {
        let _ = writeln!(
            s,
            "no RDMA devices{}",
            empty_reason.map(|r| format!(": {r}")).unwrap_or_default()
        );
    }
    for d in devs {
        let a = &d.attr;
        let _ = writeln!(
            s,
            "{}: transport {}, node type {}, fw {}, vendor {:#x}:{:#x}, ports {}",
            d.name,
            transport_str(d.transport_type),
            d.node_type,
            c_string(&a.fw_ver),
            a.vendor_id,
            a.vendor_part_id,
            a.phys_port_cnt
        );
        let _ = writeln!(
            s,
            "  max_qp {} max_qp_wr {} max_sge {} max_cq {} max_cqe {} max_mr {} max_pd {} \
             max_mr_size {:#x} max_qp_rd_atom {} max_qp_init_rd_atom {} atomic_cap {}",
            a.max_qp,
            a.max_qp_wr,
            a.max_sge,
            a.max_cq,
            a.max_cqe,
            a.max_mr,
            a.max_pd,
            a.max_mr_size,
            a.max_qp_rd_atom,
            a.max_qp_init_rd_atom,
            a.atomic_cap
        );
        for p in &d.ports {
            let pa = &p.attr;
            let _ = writeln!(
                s,
                "  port {}: {} link_layer {} active_mtu {} max_mtu {} lid {} gid_tbl_len {} \
                 max_msg_sz {:#x}",
                p.port,
                port_state_str(pa.state),
                link_layer_str(pa.link_layer),
                mtu_bytes(pa.active_mtu),
                mtu_bytes(pa.max_mtu),
                pa.lid,
                pa.gid_tbl_len,
                pa.max_msg_sz
            );
            for (i, g) in &p.gids {
                let _ = writeln!(s, "    gid[{i}] {}", gid_string(g));
            }
        }
    }
    s
}

/// Page-aligned memory the device reads and writes: touched by Rust only through raw
/// pointers (never a `&[u8]` that the device could change under it).
struct DmaBuf {
    ptr: *mut u8,
    layout: Layout,
}

impl DmaBuf {
    fn new(len: usize) -> DmaBuf {
        let layout = Layout::from_size_align(len.max(1), 4096).expect("valid layout");
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        DmaBuf { ptr, layout }
    }

    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.layout.size());
        // SAFETY: in bounds (checked); no reference to the buffer exists.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }

    fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.layout.size());
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        let mut v = vec![0u8; len];
        // SAFETY: in bounds (checked); the device's write completed before its CQE was polled.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), v.as_mut_ptr(), len) };
        v
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the MRs over it were dropped first
        // (declared after the buffers in `self_test`).
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// What the self-test did.
#[derive(Clone, Debug)]
pub struct SelfTestReport {
    pub device: String,
    pub port: u8,
    pub gid_index: Option<i32>,
    pub qpn_a: u32,
    pub qpn_b: u32,
    pub write_bytes: usize,
    pub send_bytes: usize,
}

const MSG: usize = 4096;
const TIMEOUT: Duration = Duration::from_secs(10);

/// Loopback self-test on `port` of `ctx`: two RC QPs connected to each other through the
/// port (its GID at `gid_index`, or the first non-zero one on RoCE; its LID on InfiniBand),
/// an RDMA WRITE from A's buffer into B's, then a SEND from A to a RECV posted by B, each
/// checked byte for byte. iWARP devices cannot be connected this way (they need rdma_cm).
pub fn self_test(
    ctx: &Context,
    port: u8,
    gid_index: Option<i32>,
) -> Result<SelfTestReport, VerbsError> {
    if ctx.transport_type() == IBV_TRANSPORT_IWARP {
        return Err(VerbsError::Invalid(format!(
            "{} is an iWARP device: its QPs are connected through rdma_cm, not by address \
             vector, so the loopback self-test does not apply",
            ctx.name()
        )));
    }
    let av = port_av(ctx, port, gid_index)?;
    let gid_index = av.gid_index;

    // Buffers first: they must outlive the MRs (locals drop in reverse order).
    let buf_a = DmaBuf::new(2 * MSG);
    let buf_b = DmaBuf::new(2 * MSG);
    let pd = ctx.alloc_pd()?;
    let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    // SAFETY: the buffers outlive the MRs (declared before them) and are only touched
    // through raw pointers.
    let mr_a = unsafe { pd.reg_mr(buf_a.ptr, 2 * MSG, access)? };
    // SAFETY: as above.
    let mr_b = unsafe { pd.reg_mr(buf_b.ptr, 2 * MSG, access)? };
    let channel = ctx.create_comp_channel()?;
    let cq_a = ctx.create_cq(16, None)?;
    let cq_b = ctx.create_cq(16, Some(&channel))?;
    let init = ibv_qp_init_attr {
        cap: ibv_qp_cap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: IBV_QPT_RC,
        sq_sig_all: 1,
        ..Default::default()
    };
    let qp_a = pd.create_qp(&cq_a, &cq_a, init)?;
    let qp_b = pd.create_qp(&cq_b, &cq_b, init)?;
    to_init(&qp_a, port)?;
    to_init(&qp_b, port)?;
    to_rts(&qp_a, qp_b.qp_num(), &av, 0x1111, 0x2222)?;
    to_rts(&qp_b, qp_a.qp_num(), &av, 0x2222, 0x1111)?;

    // RDMA WRITE: A[0..MSG] -> B[0..MSG].
    let pattern: Vec<u8> = (0..MSG).map(|i| (i * 7 + 3) as u8).collect();
    buf_a.write(0, &pattern);
    let mut sge = ibv_sge {
        addr: mr_a.addr(),
        length: MSG as u32,
        lkey: mr_a.lkey(),
    };
    let mut wr = ibv_send_wr {
        wr_id: 1,
        sg_list: &mut sge,
        num_sge: 1,
        opcode: IBV_WR_RDMA_WRITE,
        send_flags: IBV_SEND_SIGNALED,
        ..Default::default()
    };
    wr.wr.rdma = ibv_send_wr_rdma {
        remote_addr: mr_b.addr(),
        rkey: mr_b.rkey(),
    };
    // SAFETY: one WR whose SGE lies in mr_a; both live across the call.
    unsafe { qp_a.post_send(&mut wr) }.map_err(|(_, e)| e)?;
    let wc = wait_one(ctx, &cq_a, 1, IBV_WC_RDMA_WRITE)?;
    let _ = wc;
    if buf_b.read(0, MSG) != pattern {
        return Err(VerbsError::Invalid(
            "RDMA WRITE completed but the target buffer does not hold the data".into(),
        ));
    }

    // SEND/RECV: A[MSG..2MSG] -> B[MSG..2MSG], B's completion through the channel.
    let msg: Vec<u8> = (0..MSG).map(|i| (i * 13 + 5) as u8).collect();
    buf_a.write(MSG, &msg);
    let mut rsge = ibv_sge {
        addr: mr_b.addr() + MSG as u64,
        length: MSG as u32,
        lkey: mr_b.lkey(),
    };
    let mut rwr = ibv_recv_wr {
        wr_id: 2,
        sg_list: &mut rsge,
        num_sge: 1,
        ..Default::default()
    };
    // SAFETY: one WR whose SGE lies in mr_b.
    unsafe { qp_b.post_recv(&mut rwr) }.map_err(|(_, e)| e)?;
    cq_b.req_notify(false)?;
    let mut ssge = ibv_sge {
        addr: mr_a.addr() + MSG as u64,
        length: MSG as u32,
        lkey: mr_a.lkey(),
    };
    let mut swr = ibv_send_wr {
        wr_id: 3,
        sg_list: &mut ssge,
        num_sge: 1,
        opcode: IBV_WR_SEND,
        send_flags: IBV_SEND_SIGNALED,
        ..Default::default()
    };
    // SAFETY: one WR whose SGE lies in mr_a.
    unsafe { qp_a.post_send(&mut swr) }.map_err(|(_, e)| e)?;
    wait_one(ctx, &cq_a, 3, IBV_WC_SEND)?;
    wait_channel(&channel, &cq_b)?;
    let rwc = wait_one(ctx, &cq_b, 2, IBV_WC_RECV)?;
    if rwc.byte_len as usize != MSG || buf_b.read(MSG, MSG) != msg {
        return Err(VerbsError::Invalid(format!(
            "RECV completed with {} bytes but the data differs from what was sent",
            rwc.byte_len
        )));
    }
    let report = SelfTestReport {
        device: ctx.name().to_owned(),
        port,
        gid_index,
        qpn_a: qp_a.qp_num(),
        qpn_b: qp_b.qp_num(),
        write_bytes: MSG,
        send_bytes: MSG,
    };
    drop((qp_a, qp_b, mr_a, mr_b));
    Ok(report)
}

/// How QPs on a port address a peer on the same port: its GID (RoCE) or LID (InfiniBand).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PortAv {
    pub port: u8,
    pub lid: u16,
    pub gid_index: Option<i32>,
    pub gid: Option<ibv_gid>,
    /// The path MTU QPs use (the port's active MTU, at most 1024).
    pub mtu: u32,
}

/// The address of `port` of `ctx` (ACTIVE): its GID at `gid_index`, or on RoCE the one
/// [`super::av::own_gid`] picks among the sendable entries (RoCE v2: its IPv4 address before
/// a global IPv6 one before the default link-local GID); its LID on InfiniBand.
pub(crate) fn port_av(
    ctx: &Context,
    port: u8,
    gid_index: Option<i32>,
) -> Result<PortAv, VerbsError> {
    let pattr = ctx.query_port(port)?;
    if pattr.state != IBV_PORT_ACTIVE {
        return Err(VerbsError::Invalid(format!(
            "{} port {port} is {}, not ACTIVE",
            ctx.name(),
            port_state_str(pattr.state)
        )));
    }
    let gid_index = match gid_index {
        Some(i) => Some(i),
        None if pattr.link_layer == IBV_LINK_LAYER_ETHERNET => {
            // A RoCE v2 GID (v1 ones only on a port without v2): the port's IPv4 address
            // before its default link-local GID.
            let table = super::av::sendable(&ctx.gid_table(port, &pattr));
            Some(super::av::own_gid(&table).map(|g| g.index).ok_or_else(|| {
                VerbsError::Invalid(format!("{} port {port} has no GID", ctx.name()))
            })?)
        }
        None => None,
    };
    let gid = match gid_index {
        Some(i) => Some(ctx.query_gid(port, i)?),
        None => None,
    };
    Ok(PortAv {
        port,
        lid: pattr.lid,
        gid_index,
        gid,
        mtu: pattr.active_mtu.min(IBV_MTU_1024),
    })
}

/// RESET → INIT on `port` with local write and remote read/write access.
pub(crate) fn to_init(qp: &Qp, port: u8) -> Result<(), VerbsError> {
    let init = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        pkey_index: 0,
        port_num: port,
        qp_access_flags: IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
        ..Default::default()
    };
    qp.modify(
        &init,
        IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
    )
}

/// Transport retries (`retry_cnt`) of an RC QP: a peer that stops answering (its QP destroyed,
/// its host gone) fails the requests after this many retransmissions, each after the local
/// ACK timeout (`timeout` 14: 4.096 µs × 2^14 ≈ 67 ms), about half a second in all. Not 7:
/// rxe reads 7 as "retry forever" (`rxe_comp.c`: the count is not decremented when it is 7),
/// so a guest's QP whose peer was killed would never fail there.
pub(crate) const RETRY_CNT: u8 = 6;

/// The RTR → RTS attributes: ACK timeout, [`RETRY_CNT`], unlimited RNR retries (7, as the
/// IB spec defines it), send PSN `my_psn`, one outstanding RDMA READ.
pub(crate) fn rts_attr(my_psn: u32) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: IBV_QPS_RTS,
        timeout: 14,
        retry_cnt: RETRY_CNT,
        rnr_retry: 7,
        sq_psn: my_psn,
        max_rd_atomic: 1,
        ..Default::default()
    }
}

/// INIT → RTR → RTS for `qp`, addressed at QP `peer_qpn` behind `av`.
pub(crate) fn to_rts(
    qp: &Qp,
    peer_qpn: u32,
    av: &PortAv,
    my_psn: u32,
    peer_psn: u32,
) -> Result<(), VerbsError> {
    to_rtr(qp, peer_qpn, av, peer_psn)?;
    rtr_to_rts(qp, my_psn)
}

/// INIT → RTR for `qp`, addressed at QP `peer_qpn` behind `av` (its first PSN `peer_psn`):
/// a global route from GID index `av.gid_index` with hop limit 1 (RoCE), else the LID;
/// path MTU `av.mtu`, one incoming RDMA READ, RNR timer 12 (0.64 ms).
pub(crate) fn to_rtr(qp: &Qp, peer_qpn: u32, av: &PortAv, peer_psn: u32) -> Result<(), VerbsError> {
    let (port, lid, gid_index, gid, mtu) = (av.port, av.lid, av.gid_index, av.gid, av.mtu);
    let mut ah = ibv_ah_attr {
        dlid: lid,
        port_num: port,
        ..Default::default()
    };
    if let (Some(i), Some(g)) = (gid_index, gid) {
        ah.is_global = 1;
        ah.grh.dgid = g;
        ah.grh.sgid_index = u8::try_from(i)
            .map_err(|_| VerbsError::Invalid(format!("GID index {i} out of range")))?;
        ah.grh.hop_limit = 1;
    }
    let rtr = ibv_qp_attr {
        qp_state: IBV_QPS_RTR,
        path_mtu: mtu,
        dest_qp_num: peer_qpn,
        rq_psn: peer_psn,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: ah,
        ..Default::default()
    };
    qp.modify(
        &rtr,
        IBV_QP_STATE
            | IBV_QP_AV
            | IBV_QP_PATH_MTU
            | IBV_QP_DEST_QPN
            | IBV_QP_RQ_PSN
            | IBV_QP_MAX_DEST_RD_ATOMIC
            | IBV_QP_MIN_RNR_TIMER,
    )
}

/// RTR → RTS for `qp` with first send PSN `my_psn` ([`rts_attr`]), checked by a query.
pub(crate) fn rtr_to_rts(qp: &Qp, my_psn: u32) -> Result<(), VerbsError> {
    let rts = rts_attr(my_psn);
    qp.modify(
        &rts,
        IBV_QP_STATE
            | IBV_QP_TIMEOUT
            | IBV_QP_RETRY_CNT
            | IBV_QP_RNR_RETRY
            | IBV_QP_SQ_PSN
            | IBV_QP_MAX_QP_RD_ATOMIC,
    )?;
    let (attr, _) = qp.query(IBV_QP_STATE)?;
    if attr.qp_state != IBV_QPS_RTS {
        return Err(VerbsError::Invalid(format!(
            "QP {} is in state {} after the move to RTS",
            qp.qp_num(),
            attr.qp_state
        )));
    }
    Ok(())
}

/// Polls `cq` (bounded by [`TIMEOUT`]) for one completion: `wr_id`, success, `opcode`.
fn wait_one(ctx: &Context, cq: &Cq, wr_id: u64, opcode: u32) -> Result<ibv_wc, VerbsError> {
    let deadline = Instant::now() + TIMEOUT;
    let mut wc = [ibv_wc::default()];
    loop {
        if cq.poll(&mut wc)? == 1 {
            let w = wc[0];
            if w.status != IBV_WC_SUCCESS {
                return Err(VerbsError::Invalid(format!(
                    "work request {} completed with {} ({}), vendor error {:#x}",
                    w.wr_id,
                    ctx.lib().wc_status_str(w.status),
                    w.status,
                    w.vendor_err
                )));
            }
            if w.wr_id != wr_id || w.opcode != opcode {
                return Err(VerbsError::Invalid(format!(
                    "expected the completion of work request {wr_id} (opcode {opcode}), got {} \
                     (opcode {})",
                    w.wr_id, w.opcode
                )));
            }
            return Ok(w);
        }
        if Instant::now() > deadline {
            return Err(VerbsError::Invalid(format!(
                "no completion for work request {wr_id} within {TIMEOUT:?}"
            )));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Waits (bounded) until the channel's fd is readable, then takes the CQ event.
fn wait_channel(channel: &super::CompChannel, cq: &Cq) -> Result<(), VerbsError> {
    use std::os::fd::AsRawFd;
    let fd = channel.fd().as_raw_fd();
    let mut poll = mio::Poll::new().map_err(|e| VerbsError::Call {
        op: "epoll_create",
        cause: e,
    })?;
    poll.registry()
        .register(
            &mut mio::unix::SourceFd(&fd),
            mio::Token(0),
            mio::Interest::READABLE,
        )
        .map_err(|e| VerbsError::Call {
            op: "epoll_ctl",
            cause: e,
        })?;
    let mut events = mio::Events::with_capacity(1);
    poll.poll(&mut events, Some(TIMEOUT))
        .map_err(|e| VerbsError::Call {
            op: "epoll_wait",
            cause: e,
        })?;
    if events.is_empty() {
        return Err(VerbsError::Invalid(format!(
            "no completion event on the channel within {TIMEOUT:?}"
        )));
    }
    channel.get_cq_event(&[cq])?;
    cq.ack_events();
    Ok(())
}
