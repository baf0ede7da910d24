//! Control-ring messages: fixed 64-byte request and response slots (pvcalls style).
//!
//! ```text
//! request                              response
//!  0  req_id u32  (chosen by frontend)  0  req_id u32  (echoed)
//!  4  op u16                            4  op u16      (echoed)
//!  6  flags u16 (0)                     6  reserved u16 (0)
//!  8  arguments, 56 bytes (per op)      8  status u32  (0 = ok, see Status)
//!                                      12  result, 52 bytes (per op; zero on error)
//! ```
//! The per-op layouts are the `args`/`result` offset modules below and `docs/protocol.md`.
//! Responses may come in any order; `req_id` matches them to requests.
//!
//! Parsing is canonical: after decoding, the repr is emitted again and must reproduce the
//! slot byte for byte, so every reserved or unused byte is checked to be zero.

use super::page_dir::{PageList, PAGE_LIST_LEN};
use super::{check_len, get_u16, get_u32, get_u64, get_u8, set_u16, set_u32, set_u64, set_u8};
use super::{AbiError, GrantRef};

/// Size of a control-ring slot (requests and responses alike).
pub const CONTROL_SLOT_LEN: usize = 64;

/// Bytes of the control ring: one page; holds [`crate::xen_ring::ring_entries`]`(4096, 64)`
/// = 32 slots.
pub const CONTROL_RING_LEN: usize = crate::mem::PAGE_SIZE;

/// Upper bound on page-list lengths a parser accepts before quotas apply (4 GiB of pages).
pub const MAX_PAGE_LIST: u32 = 1 << 20;

/// Byte offsets of the common header fields.
pub mod field {
    pub const REQ_ID: usize = 0;
    pub const OP: usize = 4;
    pub const FLAGS: usize = 6;
    pub const ARGS: usize = 8;
    pub const STATUS: usize = 8;
    pub const RESULT: usize = 12;
}

/// Byte offsets of request arguments, per op (absolute offsets in the slot).
pub mod args {
    /// `Init`: protocol version the frontend speaks.
    pub const INIT_VERSION: usize = 8;
    /// `QueryPort`: port number (1-based).
    pub const PORT_NUM: usize = 8;
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
    /// `Listen`.
    pub const LISTEN_PORT: usize = 8;
    pub const LISTEN_BACKLOG: usize = 12;
    /// `Connect`: TCP port and IPv6 (or v4-mapped) address of the peer.
    pub const CONNECT_PORT: usize = 12;
    pub const CONNECT_ADDR: usize = 16;
    /// `Connect`: QP number of the peer QP (intra-host pairing on the same backend).
    pub const CONNECT_REMOTE_QPN: usize = 32;
    /// `Accept`: the QP to attach to the connection.
    pub const ACCEPT_QP: usize = 12;
    /// `ArmCq`: flag bits (bit 0 = solicited only).
    pub const ARM_FLAGS: usize = 12;
    /// `PostSend` / `PostRecv` (mediated mode): producer index the frontend published.
    pub const POST_PROD: usize = 12;
}

/// Byte offsets of response results, per op (absolute offsets in the slot).
pub mod result {
    /// `Init`.
    pub const INIT_VERSION: usize = 12;
    pub const INIT_DOORBELL_GREF: usize = 16;
    pub const INIT_EVENT_GREF: usize = 20;
    pub const INIT_DOORBELL_SLOTS: usize = 24;
    /// `QueryDevice`: nine u32 limits from here, in [`super::DeviceAttrs`] field order.
    pub const DEVICE_ATTRS: usize = 12;
    /// `QueryPort`.
    pub const PORT_STATE: usize = 12;
    pub const PORT_MTU: usize = 16;
    pub const PORT_SPEED_MBPS: usize = 20;
    pub const PORT_GID: usize = 24;
    /// Ops returning one handle (`AllocPd`, `Listen`).
    pub const HANDLE: usize = 12;
    /// `RegMr`.
    pub const MR_HANDLE: usize = 12;
    pub const MR_LKEY: usize = 16;
    pub const MR_RKEY: usize = 20;
    /// `CreateCq`.
    pub const CQ_HANDLE: usize = 12;
    pub const CQ_DOORBELL_SLOT: usize = 16;
    pub const CQ_CQE_LOG2: usize = 20;
    pub const CQ_PAGES: usize = 28;
    /// Grant of the doorbell page holding the CQ's slot (added in protocol version 1.1; see
    /// `Reply::Cq::doorbell_gref`).
    pub const CQ_DOORBELL_GREF: usize = 52;
    /// `CreateQp`: SQ pages come first in the page list, then RQ pages.
    pub const QP_HANDLE: usize = 12;
    pub const QP_NUM: usize = 16;
    pub const QP_SQ_SLOT: usize = 20;
    pub const QP_RQ_SLOT: usize = 24;
    pub const QP_SQ_LOG2: usize = 28;
    pub const QP_RQ_LOG2: usize = 29;
    pub const QP_PAGES: usize = 32;
    /// Grant of the doorbell page holding both queue slots.
    pub const QP_DOORBELL_GREF: usize = 56;
    /// `Stats`: four u64 counters.
    pub const STATS: usize = 16;
    /// `PollCq` (mediated mode): 1 when a CQE follows, then the 32-byte CQE.
    pub const POLL_PRESENT: usize = 12;
    pub const POLL_CQE: usize = 16;
}

/// Control operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Op {
    Init = 1,
    QueryDevice = 2,
    QueryPort = 3,
    AllocPd = 4,
    DeallocPd = 5,
    RegMr = 6,
    DeregMr = 7,
    CreateCq = 8,
    DestroyCq = 9,
    CreateQp = 10,
    ModifyQp = 11,
    DestroyQp = 12,
    Listen = 13,
    Connect = 14,
    Accept = 15,
    ArmCq = 16,
    Stats = 17,
    PostSend = 18,
    PostRecv = 19,
    PollCq = 20,
}

impl Op {
    pub fn from_u16(v: u16) -> Result<Self, AbiError> {
        use Op::*;
        const ALL: [Op; 20] = [
            Init,
            QueryDevice,
            QueryPort,
            AllocPd,
            DeallocPd,
            RegMr,
            DeregMr,
            CreateCq,
            DestroyCq,
            CreateQp,
            ModifyQp,
            DestroyQp,
            Listen,
            Connect,
            Accept,
            ArmCq,
            Stats,
            PostSend,
            PostRecv,
            PollCq,
        ];
        (v as usize)
            .checked_sub(1)
            .and_then(|i| ALL.get(i))
            .copied()
            .ok_or(AbiError::Unknown {
                what: "control op",
                value: v.into(),
            })
    }
}

/// Response status codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Status {
    Ok = 0,
    /// The op is unknown or the slot is malformed.
    BadRequest = 1,
    /// An argument is out of range.
    InvalidArgument = 2,
    /// A handle does not belong to the caller.
    BadHandle = 3,
    /// A per-domain quota would be exceeded.
    QuotaExceeded = 4,
    /// The backend is out of memory or grant entries.
    NoResources = 5,
    /// A grant reference could not be mapped.
    BadGrant = 6,
    /// Protocol versions do not match.
    VersionMismatch = 7,
    NotSupported = 8,
    ConnectionRefused = 9,
    /// The object is in use (e.g. destroying a CQ a QP still uses).
    Busy = 10,
    DeviceLost = 11,
}

impl Status {
    pub fn from_u32(v: u32) -> Result<Self, AbiError> {
        use Status::*;
        const ALL: [Status; 12] = [
            Ok,
            BadRequest,
            InvalidArgument,
            BadHandle,
            QuotaExceeded,
            NoResources,
            BadGrant,
            VersionMismatch,
            NotSupported,
            ConnectionRefused,
            Busy,
            DeviceLost,
        ];
        ALL.get(v as usize).copied().ok_or(AbiError::Unknown {
            what: "status",
            value: v,
        })
    }
}

/// QP states (`ModifyQp`), as ibverbs numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum QpState {
    Reset = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    Sqd = 4,
    Sqe = 5,
    Error = 6,
}

impl QpState {
    pub fn from_u32(v: u32) -> Result<Self, AbiError> {
        use QpState::*;
        [Reset, Init, Rtr, Rts, Sqd, Sqe, Error]
            .get(v as usize)
            .copied()
            .ok_or(AbiError::Unknown {
                what: "QP state",
                value: v,
            })
    }
}

/// Memory-region access bits (`RegMr`).
pub mod access {
    pub const LOCAL_WRITE: u32 = 1 << 0;
    pub const REMOTE_WRITE: u32 = 1 << 1;
    pub const REMOTE_READ: u32 = 1 << 2;
    pub const ALL: u32 = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ;
}

/// QP transport type (`CreateQp`).
pub const QP_TYPE_RC: u8 = 1;
/// `ArmCq` flag: notify on solicited completions only.
pub const ARM_SOLICITED: u32 = 1;
/// Largest queue (log2 entries) a parser accepts; the backend's limits apply after.
pub const MAX_QUEUE_LOG2: u8 = 16;

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
    Listen {
        port: u32,
        backlog: u32,
    },
    Connect {
        qp: u32,
        port: u32,
        /// IPv6 address, or an IPv4-mapped one (`::ffff:a.b.c.d`).
        addr: [u8; 16],
        /// QP number of the peer QP on the same backend (intra-host pairing).
        remote_qpn: u32,
    },
    Accept {
        listener: u32,
        qp: u32,
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
        }
    }
}

fn check_log2(v: u8, what: &'static str) -> Result<u8, AbiError> {
    if v > MAX_QUEUE_LOG2 {
        return Err(AbiError::OutOfRange {
            what,
            value: v.into(),
            max: MAX_QUEUE_LOG2.into(),
        });
    }
    Ok(v)
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
                port: get_u32(b, args::LISTEN_PORT),
                backlog: get_u32(b, args::LISTEN_BACKLOG),
            },
            Op::Connect => {
                let mut addr = [0u8; 16];
                addr.copy_from_slice(&b[args::CONNECT_ADDR..args::CONNECT_ADDR + 16]);
                R::Connect {
                    qp: h,
                    port: get_u32(b, args::CONNECT_PORT),
                    addr,
                    remote_qpn: get_u32(b, args::CONNECT_REMOTE_QPN),
                }
            }
            Op::Accept => R::Accept {
                listener: h,
                qp: get_u32(b, args::ACCEPT_QP),
            },
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
            R::QueryDevice | R::AllocPd | R::Stats => {}
            R::QueryPort { port } => set_u32(b, args::PORT_NUM, port),
            R::DeallocPd { pd: h }
            | R::DeregMr { mr: h }
            | R::DestroyCq { cq: h }
            | R::DestroyQp { qp: h }
            | R::PollCq { cq: h } => set_u32(b, args::HANDLE, h),
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
            R::ModifyQp { qp, state } => {
                set_u32(b, args::HANDLE, qp);
                set_u32(b, args::MODIFY_STATE, state as u32);
            }
            R::Listen { port, backlog } => {
                set_u32(b, args::LISTEN_PORT, port);
                set_u32(b, args::LISTEN_BACKLOG, backlog);
            }
            R::Connect {
                qp,
                port,
                addr,
                remote_qpn,
            } => {
                set_u32(b, args::HANDLE, qp);
                set_u32(b, args::CONNECT_PORT, port);
                b[args::CONNECT_ADDR..args::CONNECT_ADDR + 16].copy_from_slice(&addr);
                set_u32(b, args::CONNECT_REMOTE_QPN, remote_qpn);
            }
            R::Accept { listener, qp } => {
                set_u32(b, args::HANDLE, listener);
                set_u32(b, args::ACCEPT_QP, qp);
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

/// Device limits (`QueryDevice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DeviceAttrs {
    pub max_qp: u32,
    pub max_cq: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_wr: u32,
    pub max_cqe: u32,
    pub max_sge: u32,
    pub max_inline: u32,
    pub max_mr_pages: u32,
}

impl DeviceAttrs {
    fn to_array(self) -> [u32; 9] {
        [
            self.max_qp,
            self.max_cq,
            self.max_mr,
            self.max_pd,
            self.max_qp_wr,
            self.max_cqe,
            self.max_sge,
            self.max_inline,
            self.max_mr_pages,
        ]
    }
    fn from_array(a: [u32; 9]) -> Self {
        Self {
            max_qp: a[0],
            max_cq: a[1],
            max_mr: a[2],
            max_pd: a[3],
            max_qp_wr: a[4],
            max_cqe: a[5],
            max_sge: a[6],
            max_inline: a[7],
            max_mr_pages: a[8],
        }
    }
}

/// Channel counters (`Stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ChannelStats {
    pub work_requests: u64,
    pub completions: u64,
    pub control_requests: u64,
    pub notifications: u64,
}

/// The result of a successful request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reply {
    /// For ops with no result, and for every error status.
    Empty,
    Init {
        version: u32,
        /// Grant of the channel's doorbell page (backend-allocated).
        doorbell_gref: GrantRef,
        /// Grant of the channel's event ring page (backend-allocated).
        event_gref: GrantRef,
        /// Doorbell slots in the doorbell page.
        doorbell_slots: u32,
    },
    Device(DeviceAttrs),
    Port {
        state: u32,
        active_mtu: u32,
        speed_mbps: u32,
        gid: [u8; 16],
    },
    /// A handle (`AllocPd`, `Listen`).
    Handle(u32),
    Mr {
        mr: u32,
        lkey: u32,
        rkey: u32,
    },
    Cq {
        cq: u32,
        doorbell_slot: u32,
        cqe_log2: u8,
        /// The CQ ring pages, granted read-only to the guest.
        pages: PageList,
        /// Grant of the doorbell page holding `doorbell_slot`: slots are numbered across the
        /// channel's doorbell pages, `Init`'s `doorbell_slots` per page, and the backend adds
        /// pages on demand. Page 0 is the `Init` page.
        doorbell_gref: u32,
    },
    Qp {
        qp: u32,
        qp_num: u32,
        sq_slot: u32,
        rq_slot: u32,
        sq_log2: u8,
        rq_log2: u8,
        /// SQ pages then RQ pages.
        pages: PageList,
        /// Grant of the doorbell page holding `sq_slot` and `rq_slot` (always the same page;
        /// see `Reply::Cq::doorbell_gref`).
        doorbell_gref: u32,
    },
    Stats(ChannelStats),
    /// Mediated `PollCq`: the next CQE (body bytes, owner word 0), if any.
    Poll(Option<[u8; 32]>),
}

/// A response slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResponseRepr {
    pub req_id: u32,
    pub op: Op,
    pub status: Status,
    pub reply: Reply,
}

impl ResponseRepr {
    /// An error response to `req` (the result bytes are zero).
    pub fn error(req_id: u32, op: Op, status: Status) -> Self {
        Self {
            req_id,
            op,
            status,
            reply: Reply::Empty,
        }
    }

    /// Parses a response slot copied out of the control ring, checking every reserved byte.
    pub fn parse(b: &[u8]) -> Result<Self, AbiError> {
        check_len(b.len(), CONTROL_SLOT_LEN)?;
        let b = &b[..CONTROL_SLOT_LEN];
        let op = Op::from_u16(get_u16(b, field::OP))?;
        let status = Status::from_u32(get_u32(b, field::STATUS))?;
        let reply = if status != Status::Ok {
            Reply::Empty
        } else {
            match op {
                Op::Init => Reply::Init {
                    version: get_u32(b, result::INIT_VERSION),
                    doorbell_gref: get_u32(b, result::INIT_DOORBELL_GREF),
                    event_gref: get_u32(b, result::INIT_EVENT_GREF),
                    doorbell_slots: get_u32(b, result::INIT_DOORBELL_SLOTS),
                },
                Op::QueryDevice => {
                    let mut a = [0u32; 9];
                    for (i, v) in a.iter_mut().enumerate() {
                        *v = get_u32(b, result::DEVICE_ATTRS + 4 * i);
                    }
                    Reply::Device(DeviceAttrs::from_array(a))
                }
                Op::QueryPort => {
                    let mut gid = [0u8; 16];
                    gid.copy_from_slice(&b[result::PORT_GID..result::PORT_GID + 16]);
                    Reply::Port {
                        state: get_u32(b, result::PORT_STATE),
                        active_mtu: get_u32(b, result::PORT_MTU),
                        speed_mbps: get_u32(b, result::PORT_SPEED_MBPS),
                        gid,
                    }
                }
                Op::AllocPd | Op::Listen => Reply::Handle(get_u32(b, result::HANDLE)),
                Op::RegMr => Reply::Mr {
                    mr: get_u32(b, result::MR_HANDLE),
                    lkey: get_u32(b, result::MR_LKEY),
                    rkey: get_u32(b, result::MR_RKEY),
                },
                Op::CreateCq => Reply::Cq {
                    cq: get_u32(b, result::CQ_HANDLE),
                    doorbell_slot: get_u32(b, result::CQ_DOORBELL_SLOT),
                    cqe_log2: check_log2(get_u8(b, result::CQ_CQE_LOG2), "CQ size log2")?,
                    pages: PageList::parse(&b[result::CQ_PAGES..], MAX_PAGE_LIST)?,
                    doorbell_gref: get_u32(b, result::CQ_DOORBELL_GREF),
                },
                Op::CreateQp => Reply::Qp {
                    qp: get_u32(b, result::QP_HANDLE),
                    qp_num: get_u32(b, result::QP_NUM),
                    sq_slot: get_u32(b, result::QP_SQ_SLOT),
                    rq_slot: get_u32(b, result::QP_RQ_SLOT),
                    sq_log2: check_log2(get_u8(b, result::QP_SQ_LOG2), "SQ size log2")?,
                    rq_log2: check_log2(get_u8(b, result::QP_RQ_LOG2), "RQ size log2")?,
                    pages: PageList::parse(&b[result::QP_PAGES..], MAX_PAGE_LIST)?,
                    doorbell_gref: get_u32(b, result::QP_DOORBELL_GREF),
                },
                Op::Stats => Reply::Stats(ChannelStats {
                    work_requests: get_u64(b, result::STATS),
                    completions: get_u64(b, result::STATS + 8),
                    control_requests: get_u64(b, result::STATS + 16),
                    notifications: get_u64(b, result::STATS + 24),
                }),
                Op::PollCq => match get_u32(b, result::POLL_PRESENT) {
                    0 => Reply::Poll(None),
                    1 => {
                        let mut c = [0u8; 32];
                        c.copy_from_slice(&b[result::POLL_CQE..result::POLL_CQE + 32]);
                        Reply::Poll(Some(c))
                    }
                    v => {
                        return Err(AbiError::Unknown {
                            what: "poll presence",
                            value: v,
                        })
                    }
                },
                _ => Reply::Empty,
            }
        };
        let repr = Self {
            req_id: get_u32(b, field::REQ_ID),
            op,
            status,
            reply,
        };
        if repr.to_bytes()[..] != *b {
            return Err(AbiError::Reserved {
                field: "control response",
            });
        }
        Ok(repr)
    }

    /// Writes the response slot (all 64 bytes). A reply that does not belong to `op` is
    /// written as `Empty`.
    pub fn emit(&self, b: &mut [u8; CONTROL_SLOT_LEN]) {
        b.fill(0);
        set_u32(b, field::REQ_ID, self.req_id);
        set_u16(b, field::OP, self.op as u16);
        set_u32(b, field::STATUS, self.status as u32);
        if self.status != Status::Ok {
            return;
        }
        match (self.op, self.reply) {
            (
                Op::Init,
                Reply::Init {
                    version,
                    doorbell_gref,
                    event_gref,
                    doorbell_slots,
                },
            ) => {
                set_u32(b, result::INIT_VERSION, version);
                set_u32(b, result::INIT_DOORBELL_GREF, doorbell_gref);
                set_u32(b, result::INIT_EVENT_GREF, event_gref);
                set_u32(b, result::INIT_DOORBELL_SLOTS, doorbell_slots);
            }
            (Op::QueryDevice, Reply::Device(d)) => {
                for (i, v) in d.to_array().iter().enumerate() {
                    set_u32(b, result::DEVICE_ATTRS + 4 * i, *v);
                }
            }
            (
                Op::QueryPort,
                Reply::Port {
                    state,
                    active_mtu,
                    speed_mbps,
                    gid,
                },
            ) => {
                set_u32(b, result::PORT_STATE, state);
                set_u32(b, result::PORT_MTU, active_mtu);
                set_u32(b, result::PORT_SPEED_MBPS, speed_mbps);
                b[result::PORT_GID..result::PORT_GID + 16].copy_from_slice(&gid);
            }
            (Op::AllocPd | Op::Listen, Reply::Handle(h)) => set_u32(b, result::HANDLE, h),
            (Op::RegMr, Reply::Mr { mr, lkey, rkey }) => {
                set_u32(b, result::MR_HANDLE, mr);
                set_u32(b, result::MR_LKEY, lkey);
                set_u32(b, result::MR_RKEY, rkey);
            }
            (
                Op::CreateCq,
                Reply::Cq {
                    cq,
                    doorbell_slot,
                    cqe_log2,
                    pages,
                    doorbell_gref,
                },
            ) => {
                set_u32(b, result::CQ_DOORBELL_GREF, doorbell_gref);
                set_u32(b, result::CQ_HANDLE, cq);
                set_u32(b, result::CQ_DOORBELL_SLOT, doorbell_slot);
                set_u8(b, result::CQ_CQE_LOG2, cqe_log2);
                pages.emit(&mut b[result::CQ_PAGES..result::CQ_PAGES + PAGE_LIST_LEN]);
            }
            (
                Op::CreateQp,
                Reply::Qp {
                    qp,
                    qp_num,
                    sq_slot,
                    rq_slot,
                    sq_log2,
                    rq_log2,
                    pages,
                    doorbell_gref,
                },
            ) => {
                set_u32(b, result::QP_DOORBELL_GREF, doorbell_gref);
                set_u32(b, result::QP_HANDLE, qp);
                set_u32(b, result::QP_NUM, qp_num);
                set_u32(b, result::QP_SQ_SLOT, sq_slot);
                set_u32(b, result::QP_RQ_SLOT, rq_slot);
                set_u8(b, result::QP_SQ_LOG2, sq_log2);
                set_u8(b, result::QP_RQ_LOG2, rq_log2);
                pages.emit(&mut b[result::QP_PAGES..result::QP_PAGES + PAGE_LIST_LEN]);
            }
            (Op::Stats, Reply::Stats(s)) => {
                set_u64(b, result::STATS, s.work_requests);
                set_u64(b, result::STATS + 8, s.completions);
                set_u64(b, result::STATS + 16, s.control_requests);
                set_u64(b, result::STATS + 24, s.notifications);
            }
            (Op::PollCq, Reply::Poll(Some(c))) => {
                set_u32(b, result::POLL_PRESENT, 1);
                b[result::POLL_CQE..result::POLL_CQE + 32].copy_from_slice(&c);
            }
            _ => {}
        }
    }

    /// The slot bytes.
    pub fn to_bytes(&self) -> [u8; CONTROL_SLOT_LEN] {
        let mut b = [0u8; CONTROL_SLOT_LEN];
        self.emit(&mut b);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn responses_round_trip_and_errors_carry_no_result() {
        let ok = ResponseRepr {
            req_id: 5,
            op: Op::CreateCq,
            status: Status::Ok,
            reply: Reply::Cq {
                cq: 1,
                doorbell_slot: 3,
                cqe_log2: 7,
                pages: PageList::inline(&[100]).unwrap(),
                doorbell_gref: 0x0a0b_0c0d,
            },
        };
        assert_eq!(&ok.to_bytes()[52..56], &[0x0d, 0x0c, 0x0b, 0x0a]);
        assert_eq!(ResponseRepr::parse(&ok.to_bytes()).unwrap(), ok);
        let err = ResponseRepr::error(6, Op::CreateQp, Status::QuotaExceeded);
        let mut b = err.to_bytes();
        assert_eq!(&b[8..12], &[4, 0, 0, 0]);
        assert_eq!(ResponseRepr::parse(&b).unwrap(), err);
        b[12] = 1;
        assert!(ResponseRepr::parse(&b).is_err());
    }

    #[test]
    fn create_qp_reply_carries_the_doorbell_gref_at_56() {
        let ok = ResponseRepr {
            req_id: 8,
            op: Op::CreateQp,
            status: Status::Ok,
            reply: Reply::Qp {
                qp: 1,
                qp_num: 1,
                sq_slot: 31,
                rq_slot: 32,
                sq_log2: 4,
                rq_log2: 4,
                pages: PageList::inline(&[5, 6]).unwrap(),
                doorbell_gref: 0x0102_0304,
            },
        };
        let mut b = ok.to_bytes();
        assert_eq!(&b[56..60], &[4, 3, 2, 1]);
        assert_eq!(ResponseRepr::parse(&b).unwrap(), ok);
        b[60] = 1; // still reserved
        assert!(ResponseRepr::parse(&b).is_err());
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
            },
        };
        let b = r.to_bytes();
        assert_eq!(&b[32..36], &[4, 3, 2, 1]);
        assert_eq!(RequestRepr::parse(&b).unwrap(), r);
    }

    #[test]
    fn unknown_ops_and_statuses_are_errors() {
        let mut b = [0u8; 64];
        assert!(RequestRepr::parse(&b).is_err());
        b[4] = 21;
        assert!(RequestRepr::parse(&b).is_err());
        b[4] = 2;
        b[8] = 99;
        assert!(ResponseRepr::parse(&b).is_err());
        assert!(RequestRepr::parse(&b[..63]).is_err());
    }
}
