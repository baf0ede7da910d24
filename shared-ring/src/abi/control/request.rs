//! Control requests: the frontend's slots, one per op, and their argument offsets.

use super::access;
use super::{
    check_log2, field, Op, QpState, ARM_SOLICITED, CM_SLOTS, CONTROL_SLOT_LEN, MAX_PAGE_LIST,
    QP_TYPE_RC,
};
use crate::abi::page_dir::{PageList, PAGE_LIST_LEN};
use crate::abi::AbiError;
use crate::abi::{check_len, get_u16, get_u32, get_u64, get_u8, set_u16, set_u32, set_u64, set_u8};

/// Byte offsets of request arguments, per op (absolute offsets in the slot).
pub mod args {
    /// `Init`: protocol version the frontend speaks.
    pub const INIT_VERSION: usize = 8;
    /// `QueryPort`, `QueryGid`: port number (1-based).
    pub const PORT_NUM: usize = 8;
    /// `QueryGid`: index in the port's GID table.
    pub const GID_INDEX: usize = 12;
    /// Ops on one handle (`DeallocPd`, `DeregMr`, `DestroyCq`, `DestroyQp`, `PollCq`,
    /// `ModifyQp`, `Connect`, `PostSend`, `PostRecv`, `ArmCq`, `Accept`(listener)): the handle.
    pub const HANDLE: usize = 8;
    /// `RegMr`.
    pub const MR_PD: usize = 8;
    pub const MR_ACCESS: usize = 12;
    pub const MR_LENGTH: usize = 16;
    pub const MR_IOVA: usize = 24;
    pub const MR_FIRST_PAGE_OFFSET: usize = 32;
    pub const MR_PAGES: usize = 40;
    /// `CreateCq`: log2 of the number of CQEs.
    pub const CQ_CQE_LOG2: usize = 8;
    /// `CreateQp`.
    pub const QP_PD: usize = 8;
    pub const QP_SEND_CQ: usize = 12;
    pub const QP_RECV_CQ: usize = 16;
    pub const QP_SQ_LOG2: usize = 20;
    pub const QP_RQ_LOG2: usize = 21;
    pub const QP_TYPE: usize = 22;
    /// `ModifyQp`: new state.
    pub const MODIFY_STATE: usize = 12;
    /// `Listen`: TCP port (0: the kernel chooses), backlog, and the backend address to bind
    /// (all zero: the backend's first address).
    pub const LISTEN_PORT: usize = 8;
    pub const LISTEN_BACKLOG: usize = 12;
    pub const LISTEN_ADDR: usize = 16;
    /// `Connect`: TCP port and IPv6 (or v4-mapped) address of the peer.
    pub const CONNECT_PORT: usize = 12;
    pub const CONNECT_ADDR: usize = 16;
    /// `Connect`: QP number of the peer QP (intra-host pairing on the same backend); 0 for a
    /// connection-manager connect to `addr:port`.
    pub const CONNECT_REMOTE_QPN: usize = 32;
    /// `Connect`: private data (CM page slot, length).
    pub const CONNECT_PDATA_SLOT: usize = 36;
    pub const CONNECT_PDATA_LEN: usize = 37;
    /// `Accept`: the connection request (at [`HANDLE`]), the QP to attach to the connection,
    /// private data.
    pub const ACCEPT_QP: usize = 12;
    pub const ACCEPT_PDATA_SLOT: usize = 16;
    pub const ACCEPT_PDATA_LEN: usize = 17;
    /// `Reject`: the connection request (at [`HANDLE`]), private data.
    pub const REJECT_PDATA_SLOT: usize = 12;
    pub const REJECT_PDATA_LEN: usize = 13;
    /// `CmInfo`: the handle (at [`HANDLE`]), what it is (1 connection request, 2 QP), the CM
    /// page slot the peer's private data is written to.
    pub const CM_INFO_KIND: usize = 12;
    pub const CM_INFO_SLOT: usize = 13;
    /// `ArmCq`: flag bits (bit 0 = solicited only).
    pub const ARM_FLAGS: usize = 12;
    /// `PostSend` / `PostRecv` (mediated mode): producer index the frontend published.
    pub const POST_PROD: usize = 12;
    /// `ConnectAv`: the QP (at [`HANDLE`]), the peer QP's number, the peer port's GID, the
    /// peer's first send PSN (this QP's receive PSN), this QP's first send PSN, the peer's
    /// LID (InfiniBand without a global route), the path MTU (ibverbs' enum, 0: the
    /// device's).
    pub const AV_REMOTE_QPN: usize = 12;
    pub const AV_GID: usize = 16;
    pub const AV_RQ_PSN: usize = 32;
    pub const AV_SQ_PSN: usize = 36;
    pub const AV_LID: usize = 40;
    pub const AV_PATH_MTU: usize = 42;
    /// `ConnectAv` flags: bit 0 ([`super::AV_RTS`]) on to RTS.
    pub const AV_FLAGS: usize = 43;
}

/// `ConnectAv` flag: move on to RTS with `sq_psn` (clear: stop at RTR; `sq_psn` is then 0).
pub const AV_RTS: u8 = 1;

/// Largest PSN and QP number (24 bits).
pub const MAX_PSN: u32 = 0xff_ffff;
/// Largest path MTU value of `ConnectAv` (`IBV_MTU_4096`).
pub const MAX_PATH_MTU: u8 = 5;

fn check_24(v: u32, what: &'static str) -> Result<u32, AbiError> {
    if v > MAX_PSN {
        return Err(AbiError::OutOfRange {
            what,
            value: v.into(),
            max: MAX_PSN.into(),
        });
    }
    Ok(v)
}

/// Private data of a connection-management message: `len` bytes in slot `slot` of the
/// channel's CM page (`len` 0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PrivData {
    pub slot: u8,
    pub len: u8,
}

impl PrivData {
    /// No private data.
    pub const NONE: PrivData = PrivData { slot: 0, len: 0 };

    fn parse(b: &[u8], slot_at: usize, len_at: usize) -> Result<PrivData, AbiError> {
        Ok(PrivData {
            slot: check_cm_slot(get_u8(b, slot_at))?,
            len: get_u8(b, len_at),
        })
    }

    fn emit(&self, b: &mut [u8], slot_at: usize, len_at: usize) {
        set_u8(b, slot_at, self.slot);
        set_u8(b, len_at, self.len);
    }
}

fn check_cm_slot(slot: u8) -> Result<u8, AbiError> {
    if slot >= CM_SLOTS {
        return Err(AbiError::OutOfRange {
            what: "CM page slot",
            value: slot.into(),
            max: u64::from(CM_SLOTS - 1),
        });
    }
    Ok(slot)
}

fn check_port(v: u32) -> Result<u16, AbiError> {
    u16::try_from(v).map_err(|_| AbiError::OutOfRange {
        what: "TCP port",
        value: v.into(),
        max: u16::MAX.into(),
    })
}

/// What a `CmInfo` request asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmTarget {
    /// A connection request a listener received (its id from the `ConnectRequest` event).
    Request(u32),
    /// A QP's connection (established, or rejected: the peer's private data).
    Qp(u32),
}

impl CmTarget {
    const KIND_REQUEST: u8 = 1;
    const KIND_QP: u8 = 2;
}

/// A control request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Request {
    Init {
        version: u32,
    },
    QueryDevice,
    QueryPort {
        port: u32,
    },
    AllocPd,
    DeallocPd {
        pd: u32,
    },
    RegMr {
        pd: u32,
        access: u32,
        length: u64,
        /// Address the application uses for the region (remote peers address it too).
        iova: u64,
        /// Offset of the region's first byte inside the first page.
        first_page_offset: u32,
        pages: PageList,
    },
    DeregMr {
        mr: u32,
    },
    CreateCq {
        cqe_log2: u8,
    },
    DestroyCq {
        cq: u32,
    },
    CreateQp {
        pd: u32,
        send_cq: u32,
        recv_cq: u32,
        sq_log2: u8,
        rq_log2: u8,
    },
    ModifyQp {
        qp: u32,
        state: QpState,
    },
    DestroyQp {
        qp: u32,
    },
    /// Listen on `addr:port` (`addr` all zero: the backend's first address; `port` 0: any).
    Listen {
        port: u16,
        backlog: u32,
        addr: [u8; 16],
    },
    /// With `remote_qpn != 0`: pair with that QP on the same backend (address-vector style;
    /// `addr`, `port` and `private` unused), answered once connected. With `remote_qpn == 0`:
    /// a connection-manager connect to `addr:port` with private data, answered at once; the
    /// outcome is a `QpEstablished`, `ConnectRejected` or `ConnectUnreachable` event.
    Connect {
        qp: u32,
        port: u16,
        /// IPv6 address, or an IPv4-mapped one (`::ffff:a.b.c.d`).
        addr: [u8; 16],
        /// QP number of the peer QP on the same backend (intra-host pairing).
        remote_qpn: u32,
        private: PrivData,
    },
    /// Accept connection request `request` (a listener's `ConnectRequest` event) on `qp`.
    Accept {
        request: u32,
        qp: u32,
        private: PrivData,
    },
    ArmCq {
        cq: u32,
        solicited_only: bool,
    },
    Stats,
    /// Mediated mode: WQEs up to `prod` are in the SQ.
    PostSend {
        qp: u32,
        prod: u32,
    },
    /// Mediated mode: WQEs up to `prod` are in the RQ.
    PostRecv {
        qp: u32,
        prod: u32,
    },
    /// Mediated mode: return one CQE if any.
    PollCq {
        cq: u32,
    },
    /// Refuse connection request `request`, sending `private` to the connecting side.
    Reject {
        request: u32,
        private: PrivData,
    },
    /// Close the connection of `qp` (the peer gets `QpDisconnected`).
    Disconnect {
        qp: u32,
    },
    CloseListener {
        listener: u32,
    },
    /// Addresses and the peer's private data of a connection request or of a QP's connection;
    /// the private data is written to CM page slot `slot`.
    CmInfo {
        target: CmTarget,
        slot: u8,
    },
    /// The channel's CM page (allocated and granted on the first call).
    CmPage,
    /// Entry `index` of port `port`'s GID table.
    QueryGid {
        port: u32,
        index: u32,
    },
    /// Connect `qp` by address vector, as `ibv_modify_qp` to RTR (and with `rts` on to RTS)
    /// does: the peer is QP `remote_qpn` at port `gid` (or `lid`), its first send PSN is
    /// `rq_psn`, this QP's is `sq_psn` (with `rts`; else 0). Devices with address vectors
    /// (the verbs device) answer at once; the software device pairs with a QP of the same
    /// backend at RTR (as `Connect`: answered when connected) and takes the RTS as done.
    ConnectAv {
        qp: u32,
        remote_qpn: u32,
        gid: [u8; 16],
        rq_psn: u32,
        sq_psn: u32,
        lid: u16,
        /// ibverbs' `enum ibv_mtu` (1: 256 … 5: 4096); 0: the device's.
        path_mtu: u8,
        /// On to RTS (else RTR only).
        rts: bool,
    },
}

impl Request {
    /// The op of this request.
    pub fn op(&self) -> Op {
        match self {
            Self::Init { .. } => Op::Init,
            Self::QueryDevice => Op::QueryDevice,
            Self::QueryPort { .. } => Op::QueryPort,
            Self::AllocPd => Op::AllocPd,
            Self::DeallocPd { .. } => Op::DeallocPd,
            Self::RegMr { .. } => Op::RegMr,
            Self::DeregMr { .. } => Op::DeregMr,
            Self::CreateCq { .. } => Op::CreateCq,
            Self::DestroyCq { .. } => Op::DestroyCq,
            Self::CreateQp { .. } => Op::CreateQp,
            Self::ModifyQp { .. } => Op::ModifyQp,
            Self::DestroyQp { .. } => Op::DestroyQp,
            Self::Listen { .. } => Op::Listen,
            Self::Connect { .. } => Op::Connect,
            Self::Accept { .. } => Op::Accept,
            Self::ArmCq { .. } => Op::ArmCq,
            Self::Stats => Op::Stats,
            Self::PostSend { .. } => Op::PostSend,
            Self::PostRecv { .. } => Op::PostRecv,
            Self::PollCq { .. } => Op::PollCq,
            Self::Reject { .. } => Op::Reject,
            Self::Disconnect { .. } => Op::Disconnect,
            Self::CloseListener { .. } => Op::CloseListener,
            Self::CmInfo { .. } => Op::CmInfo,
            Self::CmPage => Op::CmPage,
            Self::ConnectAv { .. } => Op::ConnectAv,
            Self::QueryGid { .. } => Op::QueryGid,
        }
    }
}

/// A request with its id: the content of a request slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestRepr {
    pub req_id: u32,
    pub request: Request,
}

impl RequestRepr {
    /// Parses a request slot copied out of the control ring, checking every reserved byte.
    pub fn parse(b: &[u8]) -> Result<Self, AbiError> {
        check_len(b.len(), CONTROL_SLOT_LEN)?;
        let b = &b[..CONTROL_SLOT_LEN];
        let op = Op::from_u16(get_u16(b, field::OP))?;
        let h = get_u32(b, args::HANDLE);
        use Request as R;
        let request = match op {
            Op::Init => R::Init {
                version: get_u32(b, args::INIT_VERSION),
            },
            Op::QueryDevice => R::QueryDevice,
            Op::QueryPort => R::QueryPort {
                port: get_u32(b, args::PORT_NUM),
            },
            Op::QueryGid => R::QueryGid {
                port: get_u32(b, args::PORT_NUM),
                index: get_u32(b, args::GID_INDEX),
            },
            Op::AllocPd => R::AllocPd,
            Op::DeallocPd => R::DeallocPd { pd: h },
            Op::RegMr => {
                let acc = get_u32(b, args::MR_ACCESS);
                if acc & !access::ALL != 0 {
                    return Err(AbiError::Unknown {
                        what: "MR access bits",
                        value: acc,
                    });
                }
                let first_page_offset = get_u32(b, args::MR_FIRST_PAGE_OFFSET);
                if first_page_offset as usize >= crate::mem::PAGE_SIZE {
                    return Err(AbiError::OutOfRange {
                        what: "first page offset",
                        value: first_page_offset.into(),
                        max: crate::mem::PAGE_SIZE as u64 - 1,
                    });
                }
                R::RegMr {
                    pd: get_u32(b, args::MR_PD),
                    access: acc,
                    length: get_u64(b, args::MR_LENGTH),
                    iova: get_u64(b, args::MR_IOVA),
                    first_page_offset,
                    pages: PageList::parse(&b[args::MR_PAGES..], MAX_PAGE_LIST)?,
                }
            }
            Op::DeregMr => R::DeregMr { mr: h },
            Op::CreateCq => R::CreateCq {
                cqe_log2: check_log2(get_u8(b, args::CQ_CQE_LOG2), "CQ size log2")?,
            },
            Op::DestroyCq => R::DestroyCq { cq: h },
            Op::CreateQp => {
                let t = get_u8(b, args::QP_TYPE);
                if t != QP_TYPE_RC {
                    return Err(AbiError::Unknown {
                        what: "QP type",
                        value: t.into(),
                    });
                }
                R::CreateQp {
                    pd: get_u32(b, args::QP_PD),
                    send_cq: get_u32(b, args::QP_SEND_CQ),
                    recv_cq: get_u32(b, args::QP_RECV_CQ),
                    sq_log2: check_log2(get_u8(b, args::QP_SQ_LOG2), "SQ size log2")?,
                    rq_log2: check_log2(get_u8(b, args::QP_RQ_LOG2), "RQ size log2")?,
                }
            }
            Op::ModifyQp => R::ModifyQp {
                qp: h,
                state: QpState::from_u32(get_u32(b, args::MODIFY_STATE))?,
            },
            Op::DestroyQp => R::DestroyQp { qp: h },
            Op::Listen => R::Listen {
                port: check_port(get_u32(b, args::LISTEN_PORT))?,
                backlog: get_u32(b, args::LISTEN_BACKLOG),
                addr: get_addr(b, args::LISTEN_ADDR),
            },
            Op::Connect => R::Connect {
                qp: h,
                port: check_port(get_u32(b, args::CONNECT_PORT))?,
                addr: get_addr(b, args::CONNECT_ADDR),
                remote_qpn: get_u32(b, args::CONNECT_REMOTE_QPN),
                private: PrivData::parse(b, args::CONNECT_PDATA_SLOT, args::CONNECT_PDATA_LEN)?,
            },
            Op::Accept => R::Accept {
                request: h,
                qp: get_u32(b, args::ACCEPT_QP),
                private: PrivData::parse(b, args::ACCEPT_PDATA_SLOT, args::ACCEPT_PDATA_LEN)?,
            },
            Op::Reject => R::Reject {
                request: h,
                private: PrivData::parse(b, args::REJECT_PDATA_SLOT, args::REJECT_PDATA_LEN)?,
            },
            Op::Disconnect => R::Disconnect { qp: h },
            Op::CloseListener => R::CloseListener { listener: h },
            Op::CmInfo => R::CmInfo {
                target: match get_u8(b, args::CM_INFO_KIND) {
                    CmTarget::KIND_REQUEST => CmTarget::Request(h),
                    CmTarget::KIND_QP => CmTarget::Qp(h),
                    k => {
                        return Err(AbiError::Unknown {
                            what: "CM info kind",
                            value: k.into(),
                        })
                    }
                },
                slot: check_cm_slot(get_u8(b, args::CM_INFO_SLOT))?,
            },
            Op::CmPage => R::CmPage,
            Op::ArmCq => R::ArmCq {
                cq: h,
                solicited_only: get_u32(b, args::ARM_FLAGS) & ARM_SOLICITED != 0,
            },
            Op::Stats => R::Stats,
            Op::PostSend => R::PostSend {
                qp: h,
                prod: get_u32(b, args::POST_PROD),
            },
            Op::PostRecv => R::PostRecv {
                qp: h,
                prod: get_u32(b, args::POST_PROD),
            },
            Op::PollCq => R::PollCq { cq: h },
            Op::ConnectAv => {
                let path_mtu = get_u8(b, args::AV_PATH_MTU);
                if path_mtu > MAX_PATH_MTU {
                    return Err(AbiError::OutOfRange {
                        what: "path MTU",
                        value: path_mtu.into(),
                        max: MAX_PATH_MTU.into(),
                    });
                }
                let flags = get_u8(b, args::AV_FLAGS);
                if flags & !AV_RTS != 0 {
                    return Err(AbiError::Unknown {
                        what: "ConnectAv flags",
                        value: flags.into(),
                    });
                }
                R::ConnectAv {
                    qp: h,
                    remote_qpn: check_24(get_u32(b, args::AV_REMOTE_QPN), "QP number")?,
                    gid: get_addr(b, args::AV_GID),
                    rq_psn: check_24(get_u32(b, args::AV_RQ_PSN), "PSN")?,
                    sq_psn: check_24(get_u32(b, args::AV_SQ_PSN), "PSN")?,
                    lid: get_u16(b, args::AV_LID),
                    path_mtu,
                    rts: flags & AV_RTS != 0,
                }
            }
        };
        let repr = Self {
            req_id: get_u32(b, field::REQ_ID),
            request,
        };
        if repr.to_bytes()[..] != *b {
            return Err(AbiError::Reserved {
                field: "control request",
            });
        }
        Ok(repr)
    }

    /// Writes the request slot (all 64 bytes).
    pub fn emit(&self, b: &mut [u8; CONTROL_SLOT_LEN]) {
        b.fill(0);
        set_u32(b, field::REQ_ID, self.req_id);
        set_u16(b, field::OP, self.request.op() as u16);
        use Request as R;
        match self.request {
            R::Init { version } => set_u32(b, args::INIT_VERSION, version),
            R::QueryDevice | R::AllocPd | R::Stats | R::CmPage => {}
            R::QueryPort { port } => set_u32(b, args::PORT_NUM, port),
            R::QueryGid { port, index } => {
                set_u32(b, args::PORT_NUM, port);
                set_u32(b, args::GID_INDEX, index);
            }
            R::DeallocPd { pd: h }
            | R::DeregMr { mr: h }
            | R::DestroyCq { cq: h }
            | R::DestroyQp { qp: h }
            | R::PollCq { cq: h }
            | R::Disconnect { qp: h }
            | R::CloseListener { listener: h } => set_u32(b, args::HANDLE, h),
            R::RegMr {
                pd,
                access,
                length,
                iova,
                first_page_offset,
                pages,
            } => {
                set_u32(b, args::MR_PD, pd);
                set_u32(b, args::MR_ACCESS, access);
                set_u64(b, args::MR_LENGTH, length);
                set_u64(b, args::MR_IOVA, iova);
                set_u32(b, args::MR_FIRST_PAGE_OFFSET, first_page_offset);
                pages.emit(&mut b[args::MR_PAGES..args::MR_PAGES + PAGE_LIST_LEN]);
            }
            R::CreateCq { cqe_log2 } => set_u8(b, args::CQ_CQE_LOG2, cqe_log2),
            R::CreateQp {
                pd,
                send_cq,
                recv_cq,
                sq_log2,
                rq_log2,
            } => {
                set_u32(b, args::QP_PD, pd);
                set_u32(b, args::QP_SEND_CQ, send_cq);
                set_u32(b, args::QP_RECV_CQ, recv_cq);
                set_u8(b, args::QP_SQ_LOG2, sq_log2);
                set_u8(b, args::QP_RQ_LOG2, rq_log2);
                set_u8(b, args::QP_TYPE, QP_TYPE_RC);
            }
            R::ConnectAv {
                qp,
                remote_qpn,
                gid,
                rq_psn,
                sq_psn,
                lid,
                path_mtu,
                rts,
            } => {
                set_u32(b, args::HANDLE, qp);
                set_u8(b, args::AV_FLAGS, if rts { AV_RTS } else { 0 });
                set_u32(b, args::AV_REMOTE_QPN, remote_qpn);
                b[args::AV_GID..args::AV_GID + 16].copy_from_slice(&gid);
                set_u32(b, args::AV_RQ_PSN, rq_psn);
                set_u32(b, args::AV_SQ_PSN, sq_psn);
                set_u16(b, args::AV_LID, lid);
                set_u8(b, args::AV_PATH_MTU, path_mtu);
            }
            R::ModifyQp { qp, state } => {
                set_u32(b, args::HANDLE, qp);
                set_u32(b, args::MODIFY_STATE, state as u32);
            }
            R::Listen {
                port,
                backlog,
                addr,
            } => {
                set_u32(b, args::LISTEN_PORT, port.into());
                set_u32(b, args::LISTEN_BACKLOG, backlog);
                b[args::LISTEN_ADDR..args::LISTEN_ADDR + 16].copy_from_slice(&addr);
            }
            R::Connect {
                qp,
                port,
                addr,
                remote_qpn,
                private,
            } => {
                set_u32(b, args::HANDLE, qp);
                set_u32(b, args::CONNECT_PORT, port.into());
                b[args::CONNECT_ADDR..args::CONNECT_ADDR + 16].copy_from_slice(&addr);
                set_u32(b, args::CONNECT_REMOTE_QPN, remote_qpn);
                private.emit(b, args::CONNECT_PDATA_SLOT, args::CONNECT_PDATA_LEN);
            }
            R::Accept {
                request,
                qp,
                private,
            } => {
                set_u32(b, args::HANDLE, request);
                set_u32(b, args::ACCEPT_QP, qp);
                private.emit(b, args::ACCEPT_PDATA_SLOT, args::ACCEPT_PDATA_LEN);
            }
            R::Reject { request, private } => {
                set_u32(b, args::HANDLE, request);
                private.emit(b, args::REJECT_PDATA_SLOT, args::REJECT_PDATA_LEN);
            }
            R::CmInfo { target, slot } => {
                let (kind, h) = match target {
                    CmTarget::Request(h) => (CmTarget::KIND_REQUEST, h),
                    CmTarget::Qp(h) => (CmTarget::KIND_QP, h),
                };
                set_u32(b, args::HANDLE, h);
                set_u8(b, args::CM_INFO_KIND, kind);
                set_u8(b, args::CM_INFO_SLOT, slot);
            }
            R::ArmCq { cq, solicited_only } => {
                set_u32(b, args::HANDLE, cq);
                set_u32(
                    b,
                    args::ARM_FLAGS,
                    if solicited_only { ARM_SOLICITED } else { 0 },
                );
            }
            R::PostSend { qp, prod } | R::PostRecv { qp, prod } => {
                set_u32(b, args::HANDLE, qp);
                set_u32(b, args::POST_PROD, prod);
            }
        }
    }

    /// The slot bytes.
    pub fn to_bytes(&self) -> [u8; CONTROL_SLOT_LEN] {
        let mut b = [0u8; CONTROL_SLOT_LEN];
        self.emit(&mut b);
        b
    }
}

fn get_addr(b: &[u8], at: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::control::access;

    #[test]
    fn query_gid_from_literal_bytes() {
        let mut b = [0u8; 64];
        b[0] = 3; // req_id
        b[4] = 27; // QueryGid
        b[8] = 1; // port
        b[12] = 5; // index
        let r = RequestRepr::parse(&b).unwrap();
        assert_eq!(
            r,
            RequestRepr {
                req_id: 3,
                request: Request::QueryGid { port: 1, index: 5 }
            }
        );
        assert_eq!(r.to_bytes(), b);
        b[16] = 1; // reserved
        assert!(matches!(
            RequestRepr::parse(&b),
            Err(AbiError::Reserved { .. })
        ));
    }

    #[test]
    fn create_qp_from_literal_bytes() {
        let mut b = [0u8; 64];
        b[0] = 9; // req_id
        b[4] = 10; // CreateQp
        b[8] = 1; // pd
        b[12] = 2; // send cq
        b[16] = 3; // recv cq
        b[20] = 8; // sq 256
        b[21] = 7; // rq 128
        b[22] = QP_TYPE_RC;
        let r = RequestRepr::parse(&b).unwrap();
        assert_eq!(
            r,
            RequestRepr {
                req_id: 9,
                request: Request::CreateQp {
                    pd: 1,
                    send_cq: 2,
                    recv_cq: 3,
                    sq_log2: 8,
                    rq_log2: 7
                }
            }
        );
        assert_eq!(r.to_bytes(), b);
        b[23] = 1; // reserved
        assert!(matches!(
            RequestRepr::parse(&b),
            Err(AbiError::Reserved { .. })
        ));
    }

    #[test]
    fn reg_mr_with_directory_round_trips() {
        let r = RequestRepr {
            req_id: 1,
            request: Request::RegMr {
                pd: 4,
                access: access::LOCAL_WRITE | access::REMOTE_READ,
                length: 1 << 20,
                iova: 0x7f00_0000_0000,
                first_page_offset: 0,
                pages: PageList::Directory {
                    n_pages: 256,
                    first_dir_gref: 77,
                },
            },
        };
        let b = r.to_bytes();
        assert_eq!(&b[40..48], &[0, 1, 0, 0, 77, 0, 0, 0]);
        assert_eq!(RequestRepr::parse(&b).unwrap(), r);
    }

    #[test]
    fn connect_carries_the_remote_qpn_at_32() {
        let r = RequestRepr {
            req_id: 3,
            request: Request::Connect {
                qp: 7,
                port: 0,
                addr: [0; 16],
                remote_qpn: 0x0102_0304,
                private: PrivData::NONE,
            },
        };
        let b = r.to_bytes();
        assert_eq!(&b[32..36], &[4, 3, 2, 1]);
        assert_eq!(RequestRepr::parse(&b).unwrap(), r);
    }

    #[test]
    fn connect_av_from_literal_bytes() {
        // QP 9 to QP 0x123456 at ::ffff:10.77.0.1, PSNs 0xabcdef / 0x10, LID 0, MTU 1024 (3).
        let mut b = [0u8; 64];
        b[0] = 5;
        b[4] = 26;
        b[8] = 9;
        b[12..16].copy_from_slice(&0x12_3456u32.to_le_bytes());
        b[26..28].copy_from_slice(&[0xff, 0xff]);
        b[28..32].copy_from_slice(&[10, 77, 0, 1]);
        b[32..36].copy_from_slice(&0xab_cdefu32.to_le_bytes());
        b[36] = 0x10;
        b[42] = 3;
        b[43] = 1;
        let mut gid = [0u8; 16];
        gid[10..12].copy_from_slice(&[0xff, 0xff]);
        gid[12..].copy_from_slice(&[10, 77, 0, 1]);
        let r = RequestRepr::parse(&b).unwrap();
        assert_eq!(
            r.request,
            Request::ConnectAv {
                qp: 9,
                remote_qpn: 0x12_3456,
                gid,
                rq_psn: 0xab_cdef,
                sq_psn: 0x10,
                lid: 0,
                path_mtu: 3,
                rts: true
            }
        );
        assert_eq!(r.to_bytes(), b);
        // PSNs and QP numbers are 24 bits; MTU 6 is not ibverbs'; flag bit 1 is unknown; byte
        // 44 is reserved.
        let mut bad = b;
        bad[35] = 1;
        assert!(matches!(
            RequestRepr::parse(&bad),
            Err(AbiError::OutOfRange { what: "PSN", .. })
        ));
        let mut bad = b;
        bad[15] = 1;
        assert!(matches!(
            RequestRepr::parse(&bad),
            Err(AbiError::OutOfRange {
                what: "QP number",
                ..
            })
        ));
        let mut bad = b;
        bad[42] = 6;
        assert!(matches!(
            RequestRepr::parse(&bad),
            Err(AbiError::OutOfRange {
                what: "path MTU",
                ..
            })
        ));
        let mut bad = b;
        bad[43] = 2;
        assert!(matches!(
            RequestRepr::parse(&bad),
            Err(AbiError::Unknown {
                what: "ConnectAv flags",
                ..
            })
        ));
        let mut bad = b;
        bad[44] = 1;
        assert!(matches!(
            RequestRepr::parse(&bad),
            Err(AbiError::Reserved { .. })
        ));
    }

    #[test]
    fn cm_requests_from_literal_bytes() {
        // Connect to [::ffff:127.0.0.2]:4791 with 200 bytes of private data in slot 3.
        let mut b = [0u8; 64];
        b[0] = 1;
        b[4] = 14;
        b[8] = 9; // qp
        b[12..14].copy_from_slice(&4791u16.to_le_bytes());
        b[26..28].copy_from_slice(&[0xff, 0xff]);
        b[28..32].copy_from_slice(&[127, 0, 0, 2]);
        b[36] = 3;
        b[37] = 200;
        let r = RequestRepr::parse(&b).unwrap();
        let mut addr = [0u8; 16];
        addr[10..12].copy_from_slice(&[0xff, 0xff]);
        addr[12..].copy_from_slice(&[127, 0, 0, 2]);
        assert_eq!(
            r.request,
            Request::Connect {
                qp: 9,
                port: 4791,
                addr,
                remote_qpn: 0,
                private: PrivData { slot: 3, len: 200 }
            }
        );
        assert_eq!(r.to_bytes(), b);
        // Slot 16 does not exist; a port above 65535 is not a port; byte 38 is reserved.
        let mut bad = b;
        bad[36] = 16;
        assert_eq!(
            RequestRepr::parse(&bad).err(),
            Some(AbiError::OutOfRange {
                what: "CM page slot",
                value: 16,
                max: 15
            })
        );
        let mut bad = b;
        bad[14] = 1;
        assert!(matches!(
            RequestRepr::parse(&bad),
            Err(AbiError::OutOfRange {
                what: "TCP port",
                ..
            })
        ));
        let mut bad = b;
        bad[38] = 1;
        assert!(matches!(
            RequestRepr::parse(&bad),
            Err(AbiError::Reserved { .. })
        ));

        // CmInfo of a QP into slot 15; kind 3 is unknown.
        let mut b = [0u8; 64];
        b[4] = 24;
        b[8] = 7;
        b[12] = 2;
        b[13] = 15;
        assert_eq!(
            RequestRepr::parse(&b).unwrap().request,
            Request::CmInfo {
                target: CmTarget::Qp(7),
                slot: 15
            }
        );
        b[12] = 3;
        assert_eq!(
            RequestRepr::parse(&b).err(),
            Some(AbiError::Unknown {
                what: "CM info kind",
                value: 3
            })
        );
        // Reject's private data is at 12/13; Accept's at 16/17.
        let r = RequestRepr {
            req_id: 2,
            request: Request::Reject {
                request: 5,
                private: PrivData { slot: 1, len: 255 },
            },
        };
        assert_eq!(&r.to_bytes()[12..14], &[1, 255]);
        let a = RequestRepr {
            req_id: 2,
            request: Request::Accept {
                request: 5,
                qp: 6,
                private: PrivData { slot: 2, len: 9 },
            },
        };
        assert_eq!(&a.to_bytes()[12..18], &[6, 0, 0, 0, 2, 9]);
        assert_eq!(RequestRepr::parse(&a.to_bytes()).unwrap(), a);
    }
}
