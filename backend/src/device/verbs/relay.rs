//! The relay's translation between vrdma's shared-memory formats and libibverbs' work requests
//! and completions: plain functions over copied-out WQEs and `ibv_wc`s, testable without a
//! device.
//!
//! * A guest WQE (already parsed by [`WqeRepr::parse`], so garbage is `BadWqe` before it gets
//!   here) becomes an [`SendWr`]/[`RecvWr`]: SGE offsets (relative to the region their lkey
//!   names) become addresses in the region's iova space (the HCA registration uses the
//!   guest's iova, `ibv_reg_mr_iova2`), guest lkeys become the HCA's. An lkey the channel
//!   did not register, of another PD, out of bounds or without the local access the operation
//!   needs is refused with `LocalProtectionError` — the HCA never sees it.
//! * The HCA's work request id is the relay's own tag ([`hca_wr_id`]): a per-queue sequence
//!   number with the queue in bit 0, so a completion (flushes included, whose opcode is
//!   undefined) names its queue and its place in it; the guest's wr_id is kept in the relay's
//!   in-order record ([`Pending`]) and written back into the CQE unchanged.
//! * `ibv_wc_status` maps 1:1 to [`CqeStatus`] where vrdma has the status; the rest become
//!   `GeneralError` with the HCA's status in `vendor_err`'s high byte (the vendor error in the
//!   low 24 bits).

use std::collections::HashMap;

use shared_ring::abi::control::access;
use shared_ring::abi::cqe::{flags as cqe_flags, CqeOpcode, CqeRepr, CqeStatus};
use shared_ring::abi::wqe::{flags as wqe_flags, WqeData, WqeOpcode, WqeRepr, MAX_INLINE, MAX_SGE};

use super::abi::*;
use crate::device::PdId;

/// What the relay knows of a registered region: the key table of a channel maps the guest's
/// lkey to this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyEntry {
    pub pd: PdId,
    /// The HCA's lkey of the registration.
    pub hca_lkey: u32,
    /// The region's first byte in the iova space it was registered at.
    pub iova: u64,
    pub len: u64,
    /// vrdma [`access`] bits.
    pub access: u32,
}

/// A channel's guest lkey → registration table.
pub(crate) type KeyMap = HashMap<u32, KeyEntry>;

/// A send work request ready for `ibv_post_send`: owns its SGEs and inline bytes, so
/// [`SendWr::as_ibv`] can point into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendWr {
    pub opcode: u32,
    pub send_flags: u32,
    /// In network byte order (as `ibv_send_wr.imm_data`).
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub sges: [ibv_sge; MAX_SGE],
    pub num_sge: usize,
    pub inline: [u8; MAX_INLINE],
}

/// A receive work request ready for `ibv_post_recv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecvWr {
    pub sges: [ibv_sge; MAX_SGE],
    pub num_sge: usize,
}

impl SendWr {
    /// The libibverbs request, pointing into `self` (which must stay put until the post
    /// returns).
    pub(crate) fn as_ibv(&mut self, wr_id: u64) -> ibv_send_wr {
        let mut wr = ibv_send_wr {
            wr_id,
            sg_list: self.sges.as_mut_ptr(),
            num_sge: self.num_sge as i32,
            opcode: self.opcode,
            send_flags: self.send_flags,
            imm_data: self.imm_data,
            ..Default::default()
        };
        if self.send_flags & IBV_SEND_INLINE != 0 {
            // Inline: the provider copies the bytes during the post; lkey is ignored.
            self.sges[0].addr = self.inline.as_ptr() as u64;
        }
        wr.wr.rdma = ibv_send_wr_rdma {
            remote_addr: self.remote_addr,
            rkey: self.rkey,
        };
        wr
    }
}

impl RecvWr {
    pub(crate) fn as_ibv(&mut self, wr_id: u64) -> ibv_recv_wr {
        ibv_recv_wr {
            wr_id,
            sg_list: self.sges.as_mut_ptr(),
            num_sge: self.num_sge as i32,
            ..Default::default()
        }
    }
}

/// Which queue of a QP a tagged work request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Queue {
    Sq,
    Rq,
}

/// The HCA's wr_id for the `seq`-th request of `queue`.
pub(crate) fn hca_wr_id(queue: Queue, seq: u64) -> u64 {
    (seq << 1) | u64::from(queue == Queue::Rq)
}

/// The queue and sequence number of an HCA wr_id made by [`hca_wr_id`].
pub(crate) fn split_wr_id(id: u64) -> (Queue, u64) {
    let q = if id & 1 == 1 { Queue::Rq } else { Queue::Sq };
    (q, id >> 1)
}

/// A posted request the relay waits to complete (requests complete in order per queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pending {
    pub seq: u64,
    /// The guest's wr_id, written back into the CQE.
    pub wr_id: u64,
    pub opcode: CqeOpcode,
    /// Whether a successful completion reaches the guest (unsignaled sends do not; the HCA
    /// request is always signaled so the relay knows when the slot is free).
    pub signaled: bool,
    /// The WQE's payload length (its SGEs' or inline bytes): a send-side completion's byte
    /// count (mlx4/mlx5 leave `ibv_wc::byte_len` unset for SEND and RDMA WRITE).
    pub len: u64,
}

/// Translates the SGEs of `data` for QP PD `pd`; `write` says the device writes them (RECV,
/// RDMA READ), which needs `LOCAL_WRITE`.
fn sges(
    data: &WqeData,
    keys: &KeyMap,
    pd: PdId,
    write: bool,
) -> Result<([ibv_sge; MAX_SGE], usize), CqeStatus> {
    let mut out = [ibv_sge::default(); MAX_SGE];
    let WqeData::Sges { sges, len } = data else {
        return Err(CqeStatus::LocalQpOperationError);
    };
    let n = usize::from(*len).min(MAX_SGE);
    for (o, s) in out.iter_mut().zip(&sges[..n]) {
        let k = keys
            .get(&s.lkey)
            .filter(|k| k.pd == pd)
            .ok_or(CqeStatus::LocalProtectionError)?;
        let end = s.offset.checked_add(u64::from(s.length));
        if !matches!(end, Some(e) if e <= k.len) || (write && k.access & access::LOCAL_WRITE == 0) {
            return Err(CqeStatus::LocalProtectionError);
        }
        *o = ibv_sge {
            addr: k.iova + s.offset,
            length: s.length,
            lkey: k.hca_lkey,
        };
    }
    Ok((out, n))
}

/// The CQE opcode that completes a send WQE of `op`.
pub(crate) fn send_cqe_opcode(op: WqeOpcode) -> CqeOpcode {
    match op {
        WqeOpcode::RdmaWrite | WqeOpcode::RdmaWriteWithImm => CqeOpcode::RdmaWrite,
        WqeOpcode::RdmaRead => CqeOpcode::RdmaRead,
        _ => CqeOpcode::Send,
    }
}

/// A send-queue WQE as an HCA request, or the status that completes it without posting.
pub(crate) fn translate_send(w: &WqeRepr, keys: &KeyMap, pd: PdId) -> Result<SendWr, CqeStatus> {
    let opcode = match w.opcode {
        WqeOpcode::Send => IBV_WR_SEND,
        WqeOpcode::SendWithImm => IBV_WR_SEND_WITH_IMM,
        WqeOpcode::RdmaWrite => IBV_WR_RDMA_WRITE,
        WqeOpcode::RdmaWriteWithImm => IBV_WR_RDMA_WRITE_WITH_IMM,
        WqeOpcode::RdmaRead => IBV_WR_RDMA_READ,
        WqeOpcode::Recv => return Err(CqeStatus::BadWqe),
    };
    // Always signaled at the HCA: the relay learns from every completion that a slot is free.
    let mut send_flags = IBV_SEND_SIGNALED;
    if w.flags & wqe_flags::SOLICITED != 0 {
        send_flags |= IBV_SEND_SOLICITED;
    }
    if w.flags & wqe_flags::FENCE != 0 {
        send_flags |= IBV_SEND_FENCE;
    }
    let mut wr = SendWr {
        opcode,
        send_flags,
        imm_data: w.imm_data.to_be(),
        remote_addr: w.remote_addr,
        rkey: w.rkey,
        sges: [ibv_sge::default(); MAX_SGE],
        num_sge: 0,
        inline: [0; MAX_INLINE],
    };
    match &w.data {
        WqeData::Inline { bytes, len } => {
            if w.opcode == WqeOpcode::RdmaRead {
                // Nowhere to put the data read.
                return Err(CqeStatus::LocalQpOperationError);
            }
            wr.send_flags |= IBV_SEND_INLINE;
            wr.inline = *bytes;
            if *len > 0 {
                wr.sges[0].length = u32::from(*len);
                wr.num_sge = 1;
            }
        }
        data => {
            let (s, n) = sges(data, keys, pd, w.opcode == WqeOpcode::RdmaRead)?;
            wr.sges = s;
            wr.num_sge = n;
        }
    }
    Ok(wr)
}

/// A receive-queue WQE as an HCA request.
pub(crate) fn translate_recv(w: &WqeRepr, keys: &KeyMap, pd: PdId) -> Result<RecvWr, CqeStatus> {
    if w.opcode != WqeOpcode::Recv {
        return Err(CqeStatus::BadWqe);
    }
    let (sges, num_sge) = sges(&w.data, keys, pd, true)?;
    Ok(RecvWr { sges, num_sge })
}

/// The vrdma status of an HCA completion status.
pub(crate) fn status_of(s: u32) -> CqeStatus {
    match s {
        IBV_WC_SUCCESS => CqeStatus::Success,
        IBV_WC_LOC_LEN_ERR => CqeStatus::LocalLengthError,
        IBV_WC_LOC_QP_OP_ERR => CqeStatus::LocalQpOperationError,
        IBV_WC_LOC_PROT_ERR | IBV_WC_LOC_ACCESS_ERR => CqeStatus::LocalProtectionError,
        IBV_WC_WR_FLUSH_ERR => CqeStatus::WrFlushError,
        IBV_WC_REM_ACCESS_ERR => CqeStatus::RemoteAccessError,
        IBV_WC_REM_OP_ERR => CqeStatus::RemoteOperationError,
        IBV_WC_RETRY_EXC_ERR => CqeStatus::RetryExceeded,
        IBV_WC_RNR_RETRY_EXC_ERR => CqeStatus::RnrRetryExceeded,
        IBV_WC_BAD_RESP_ERR => CqeStatus::BadResponse,
        IBV_WC_REM_INV_REQ_ERR | IBV_WC_REM_INV_RD_REQ_ERR => CqeStatus::RemoteInvalidRequest,
        _ => CqeStatus::GeneralError,
    }
}

/// The guest CQE of an HCA completion of request `p` of guest QP `qp_num`. Receive opcodes
/// come from the completion (a RECV consumed by a WRITE with immediate); everything else from
/// `p` (flushes carry no valid opcode).
pub(crate) fn cqe_of(wc: &ibv_wc, p: &Pending, qp_num: u32) -> CqeRepr {
    let status = status_of(wc.status);
    let ok = status == CqeStatus::Success;
    let mut opcode = p.opcode;
    if ok && p.opcode == CqeOpcode::Recv && wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM {
        opcode = CqeOpcode::RecvRdmaWithImm;
    }
    let with_imm = ok && wc.wc_flags & IBV_WC_WITH_IMM != 0;
    let vendor_err = if status == CqeStatus::GeneralError && wc.status != IBV_WC_GENERAL_ERR {
        (wc.status << 24) | (wc.vendor_err & 0x00ff_ffff)
    } else {
        wc.vendor_err
    };
    CqeRepr {
        wr_id: p.wr_id,
        status,
        opcode,
        // A receive's length is the HCA's (what arrived); a send-side WQE moved its payload.
        byte_len: match (ok, opcode) {
            (false, _) => 0,
            (true, CqeOpcode::Recv | CqeOpcode::RecvRdmaWithImm) => wc.byte_len,
            (true, _) => u32::try_from(p.len).unwrap_or(u32::MAX),
        },
        imm_data: if with_imm {
            u32::from_be(wc.imm_data)
        } else {
            0
        },
        qp_num,
        vendor_err,
        flags: if with_imm { cqe_flags::WITH_IMM } else { 0 },
    }
}

/// A CQE the relay writes itself (a WQE refused before posting, or flushed after the QP
/// failed).
pub(crate) fn local_cqe(wr_id: u64, opcode: CqeOpcode, status: CqeStatus, qp_num: u32) -> CqeRepr {
    CqeRepr {
        wr_id,
        status,
        opcode,
        byte_len: 0,
        imm_data: 0,
        qp_num,
        vendor_err: 0,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_ring::abi::wqe::Sge;

    const PD: PdId = PdId(7);

    fn keys() -> KeyMap {
        let mut k = KeyMap::new();
        k.insert(
            0x100,
            KeyEntry {
                pd: PD,
                hca_lkey: 0xabcd,
                iova: 0x7000_0000,
                len: 8192,
                access: access::LOCAL_WRITE,
            },
        );
        k.insert(
            0x200,
            KeyEntry {
                pd: PD,
                hca_lkey: 0x1234,
                iova: 0x9000_0000,
                len: 4096,
                access: 0,
            },
        );
        k.insert(
            0x300,
            KeyEntry {
                pd: PdId(8),
                hca_lkey: 0x5555,
                iova: 0,
                len: 4096,
                access: access::LOCAL_WRITE,
            },
        );
        k
    }

    fn wqe(opcode: WqeOpcode, sges: &[Sge]) -> WqeRepr {
        WqeRepr {
            opcode,
            flags: wqe_flags::SIGNALED,
            wr_id: 0xfeed_0001,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            data: WqeData::sges(sges).unwrap(),
        }
    }

    fn sge(lkey: u32, offset: u64, length: u32) -> Sge {
        Sge {
            offset,
            length,
            lkey,
        }
    }

    #[test]
    fn write_with_imm_translates_opcode_keys_addresses_and_imm() {
        let mut w = wqe(
            WqeOpcode::RdmaWriteWithImm,
            &[sge(0x100, 16, 100), sge(0x200, 4000, 96)],
        );
        w.imm_data = 0x0102_0304;
        w.remote_addr = 0x5555_0000;
        w.rkey = 0x77;
        w.flags |= wqe_flags::SOLICITED | wqe_flags::FENCE;
        let mut wr = translate_send(&w, &keys(), PD).unwrap();
        assert_eq!(wr.num_sge, 2);
        assert_eq!(
            wr.sges[0],
            ibv_sge {
                addr: 0x7000_0010,
                length: 100,
                lkey: 0xabcd
            }
        );
        assert_eq!(
            wr.sges[1],
            ibv_sge {
                addr: 0x9000_0000 + 4000,
                length: 96,
                lkey: 0x1234
            }
        );
        let ibv = wr.as_ibv(hca_wr_id(Queue::Sq, 5));
        assert_eq!(ibv.opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
        assert_eq!(
            ibv.send_flags,
            IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_FENCE
        );
        assert_eq!(ibv.imm_data, 0x0102_0304u32.to_be());
        assert_eq!(ibv.num_sge, 2);
        assert_eq!(ibv.wr_id, 10);
        // SAFETY: reading the union member this request was built with.
        let rdma = unsafe { ibv.wr.rdma };
        assert_eq!((rdma.remote_addr, rdma.rkey), (0x5555_0000, 0x77));
    }

    #[test]
    fn unsignaled_guest_sends_are_signaled_at_the_hca() {
        let mut w = wqe(WqeOpcode::Send, &[sge(0x200, 0, 8)]);
        w.flags = 0;
        let wr = translate_send(&w, &keys(), PD).unwrap();
        assert_eq!(wr.send_flags, IBV_SEND_SIGNALED);
    }

    #[test]
    fn foreign_unknown_and_out_of_bounds_keys_are_refused() {
        let k = keys();
        for s in [
            sge(0x999, 0, 8),        // never registered on this channel
            sge(0x300, 0, 8),        // this channel's, but another PD
            sge(0x200, 4000, 97),    // one byte past the end
            sge(0x100, u64::MAX, 2), // offset overflow
        ] {
            let w = wqe(WqeOpcode::Send, &[s]);
            assert_eq!(
                translate_send(&w, &k, PD),
                Err(CqeStatus::LocalProtectionError),
                "{s:?}"
            );
        }
    }

    #[test]
    fn device_writes_need_local_write() {
        let k = keys();
        let recv = wqe(WqeOpcode::Recv, &[sge(0x200, 0, 8)]);
        assert_eq!(
            translate_recv(&recv, &k, PD),
            Err(CqeStatus::LocalProtectionError)
        );
        let read = wqe(WqeOpcode::RdmaRead, &[sge(0x200, 0, 8)]);
        assert_eq!(
            translate_send(&read, &k, PD),
            Err(CqeStatus::LocalProtectionError)
        );
        let recv = wqe(WqeOpcode::Recv, &[sge(0x100, 8, 64)]);
        let mut r = translate_recv(&recv, &k, PD).unwrap();
        let ibv = r.as_ibv(hca_wr_id(Queue::Rq, 3));
        assert_eq!((ibv.wr_id, ibv.num_sge), (7, 1));
        assert_eq!(r.sges[0].addr, 0x7000_0008);
    }

    #[test]
    fn wrong_queue_opcodes_are_bad_wqes() {
        let k = keys();
        assert_eq!(
            translate_send(&wqe(WqeOpcode::Recv, &[]), &k, PD),
            Err(CqeStatus::BadWqe)
        );
        assert_eq!(
            translate_recv(&wqe(WqeOpcode::Send, &[]), &k, PD),
            Err(CqeStatus::BadWqe)
        );
    }

    #[test]
    fn inline_sends_point_at_the_copied_bytes() {
        let mut w = wqe(WqeOpcode::Send, &[]);
        w.data = WqeData::inline(b"hello").unwrap();
        let mut wr = translate_send(&w, &keys(), PD).unwrap();
        let ibv = wr.as_ibv(0);
        assert_eq!(ibv.send_flags & IBV_SEND_INLINE, IBV_SEND_INLINE);
        assert_eq!(ibv.num_sge, 1);
        assert_eq!(wr.sges[0].addr, wr.inline.as_ptr() as u64);
        assert_eq!(&wr.inline[..5], b"hello");
        assert_eq!(wr.sges[0].length, 5);
        let mut r = wqe(WqeOpcode::RdmaRead, &[]);
        r.data = WqeData::inline(b"x").unwrap();
        assert_eq!(
            translate_send(&r, &keys(), PD),
            Err(CqeStatus::LocalQpOperationError)
        );
    }

    #[test]
    fn wr_ids_name_queue_and_sequence() {
        for (q, s) in [
            (Queue::Sq, 0),
            (Queue::Rq, 0),
            (Queue::Sq, 99),
            (Queue::Rq, 1 << 40),
        ] {
            assert_eq!(split_wr_id(hca_wr_id(q, s)), (q, s));
        }
    }

    #[test]
    fn statuses_map_one_to_one() {
        let table = [
            (IBV_WC_SUCCESS, CqeStatus::Success),
            (IBV_WC_LOC_LEN_ERR, CqeStatus::LocalLengthError),
            (IBV_WC_LOC_QP_OP_ERR, CqeStatus::LocalQpOperationError),
            (IBV_WC_LOC_PROT_ERR, CqeStatus::LocalProtectionError),
            (IBV_WC_WR_FLUSH_ERR, CqeStatus::WrFlushError),
            (IBV_WC_REM_ACCESS_ERR, CqeStatus::RemoteAccessError),
            (IBV_WC_REM_OP_ERR, CqeStatus::RemoteOperationError),
            (IBV_WC_RETRY_EXC_ERR, CqeStatus::RetryExceeded),
            (IBV_WC_RNR_RETRY_EXC_ERR, CqeStatus::RnrRetryExceeded),
            (IBV_WC_GENERAL_ERR, CqeStatus::GeneralError),
            (IBV_WC_BAD_RESP_ERR, CqeStatus::BadResponse),
            (IBV_WC_REM_INV_REQ_ERR, CqeStatus::RemoteInvalidRequest),
            (IBV_WC_FATAL_ERR, CqeStatus::GeneralError),
        ];
        for (ibv, ours) in table {
            assert_eq!(status_of(ibv), ours, "ibv status {ibv}");
        }
    }

    #[test]
    fn completions_become_cqes_with_the_guests_wr_id() {
        let p = Pending {
            seq: 4,
            wr_id: 0xdead_beef,
            opcode: CqeOpcode::Recv,
            signaled: true,
            len: 4096,
        };
        let wc = ibv_wc {
            wr_id: hca_wr_id(Queue::Rq, 4),
            status: IBV_WC_SUCCESS,
            opcode: IBV_WC_RECV_RDMA_WITH_IMM,
            byte_len: 512,
            imm_data: 0x0a0b_0c0du32.to_be(),
            wc_flags: IBV_WC_WITH_IMM,
            qp_num: 0x11,
            ..Default::default()
        };
        let c = cqe_of(&wc, &p, 0x11);
        assert_eq!(c.wr_id, 0xdead_beef);
        assert_eq!(c.opcode, CqeOpcode::RecvRdmaWithImm);
        assert_eq!((c.byte_len, c.imm_data), (512, 0x0a0b_0c0d));
        assert_eq!(c.flags, cqe_flags::WITH_IMM);
        // A flush: no opcode from the HCA, the pending record's; no length.
        let flush = ibv_wc {
            status: IBV_WC_WR_FLUSH_ERR,
            opcode: 0xff,
            byte_len: 77,
            ..wc
        };
        let c = cqe_of(&flush, &p, 0x11);
        assert_eq!(c.status, CqeStatus::WrFlushError);
        assert_eq!((c.opcode, c.byte_len, c.flags), (CqeOpcode::Recv, 0, 0));
        // A status vrdma has no name for keeps the HCA's in vendor_err.
        let fatal = ibv_wc {
            status: IBV_WC_FATAL_ERR,
            vendor_err: 0x42,
            ..wc
        };
        let c = cqe_of(&fatal, &p, 0x11);
        assert_eq!(c.status, CqeStatus::GeneralError);
        assert_eq!(c.vendor_err, (IBV_WC_FATAL_ERR << 24) | 0x42);
        // CQEs round-trip through the ring format.
        assert_eq!(CqeRepr::from_bytes(&c.to_bytes()).unwrap(), c);
    }

    /// A send-side completion counts the WQE's payload: mlx4/mlx5 leave `byte_len` unset
    /// for SEND and RDMA WRITE (here 0, or an earlier RECV's value in a reused `ibv_wc`).
    #[test]
    fn a_send_side_completion_s_length_is_the_wqe_s_payload() {
        for (opcode, ibv) in [
            (CqeOpcode::Send, IBV_WC_SEND),
            (CqeOpcode::RdmaWrite, IBV_WC_RDMA_WRITE),
            (CqeOpcode::RdmaRead, IBV_WC_RDMA_READ),
        ] {
            let p = Pending {
                seq: 1,
                wr_id: 9,
                opcode,
                signaled: true,
                len: 65_536,
            };
            for stale in [0, 512] {
                let wc = ibv_wc {
                    wr_id: hca_wr_id(Queue::Sq, 1),
                    status: IBV_WC_SUCCESS,
                    opcode: ibv,
                    byte_len: stale,
                    ..Default::default()
                };
                assert_eq!(cqe_of(&wc, &p, 3).byte_len, 65_536, "{opcode:?}");
            }
        }
    }
}
