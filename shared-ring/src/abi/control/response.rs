//! Control responses: the backend's slots, a status and a per-op result, and the result
//! offsets.

use super::{check_log2, field, Op, Status, CONTROL_SLOT_LEN, MAX_PAGE_LIST};
use crate::abi::page_dir::{PageList, PAGE_LIST_LEN};
use crate::abi::{check_len, get_u16, get_u32, get_u64, get_u8, set_u16, set_u32, set_u64, set_u8};
use crate::abi::{AbiError, GrantRef};

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
    /// `QueryGid`: the entry's GID, its type ([`super::GID_TYPE_ROCE_V2`] …) and the number
    /// of entries of the table (the guest asks for indexes below it).
    pub const GID: usize = 12;
    pub const GID_TYPE: usize = 28;
    pub const GID_COUNT: usize = 32;
    /// Ops returning one handle (`AllocPd`).
    pub const HANDLE: usize = 12;
    /// `Listen`: the listener and the port it is bound to (the kernel's choice for port 0).
    pub const LISTEN_HANDLE: usize = 12;
    pub const LISTEN_PORT: usize = 16;
    /// `CmInfo`: local and remote address (IPv6 or v4-mapped) and port, and how many bytes
    /// of the peer's private data were written to the CM page slot.
    pub const CM_LOCAL_ADDR: usize = 12;
    pub const CM_REMOTE_ADDR: usize = 28;
    pub const CM_LOCAL_PORT: usize = 44;
    pub const CM_REMOTE_PORT: usize = 46;
    pub const CM_PRIVATE_LEN: usize = 48;
    /// `CmInfo`: the peer's IRD and ORD (RDMA Reads outstanding; negotiated once established).
    pub const CM_IRD: usize = 50;
    pub const CM_ORD: usize = 52;
    /// `CmPage`: the grant of the channel's CM page, its slots and their size.
    pub const CM_PAGE_GREF: usize = 12;
    pub const CM_PAGE_SLOTS: usize = 16;
    pub const CM_PAGE_SLOT_LEN: usize = 20;
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

/// GID types (`QueryGid`), as ibverbs' `enum ibv_gid_type` numbers them.
pub const GID_TYPE_IB: u32 = 0;
pub const GID_TYPE_ROCE_V1: u32 = 1;
pub const GID_TYPE_ROCE_V2: u32 = 2;
/// Most GID table entries a backend reports (`QueryGid`'s count).
pub const MAX_GIDS: u32 = 16;

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

/// The `CmInfo` result: both ends of a connection (request) and the length of the peer's
/// private data, which is in the CM page slot the request named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmInfoReply {
    pub local_addr: [u8; 16],
    pub local_port: u16,
    pub remote_addr: [u8; 16],
    pub remote_port: u16,
    pub private_len: u8,
    pub ird: u16,
    pub ord: u16,
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
    /// A handle (`AllocPd`).
    Handle(u32),
    Listener {
        listener: u32,
        port: u16,
    },
    CmInfo(CmInfoReply),
    CmPage {
        gref: GrantRef,
        slots: u32,
        slot_len: u32,
    },
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
    /// `QueryGid`: one entry, its type (`GID_TYPE_*`), the table's length (≤ [`MAX_GIDS`]).
    Gid {
        gid: [u8; 16],
        gid_type: u32,
        count: u32,
    },
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
                Op::QueryGid => {
                    let gid_type = get_u32(b, result::GID_TYPE);
                    if gid_type > GID_TYPE_ROCE_V2 {
                        return Err(AbiError::Unknown {
                            what: "GID type",
                            value: gid_type,
                        });
                    }
                    let count = get_u32(b, result::GID_COUNT);
                    if count > MAX_GIDS {
                        return Err(AbiError::OutOfRange {
                            what: "GID table length",
                            value: count.into(),
                            max: MAX_GIDS.into(),
                        });
                    }
                    Reply::Gid {
                        gid: get_addr(b, result::GID),
                        gid_type,
                        count,
                    }
                }
                Op::AllocPd => Reply::Handle(get_u32(b, result::HANDLE)),
                Op::Listen => Reply::Listener {
                    listener: get_u32(b, result::LISTEN_HANDLE),
                    port: get_u16(b, result::LISTEN_PORT),
                },
                Op::CmInfo => Reply::CmInfo(CmInfoReply {
                    local_addr: get_addr(b, result::CM_LOCAL_ADDR),
                    local_port: get_u16(b, result::CM_LOCAL_PORT),
                    remote_addr: get_addr(b, result::CM_REMOTE_ADDR),
                    remote_port: get_u16(b, result::CM_REMOTE_PORT),
                    private_len: get_u8(b, result::CM_PRIVATE_LEN),
                    ird: get_u16(b, result::CM_IRD),
                    ord: get_u16(b, result::CM_ORD),
                }),
                Op::CmPage => Reply::CmPage {
                    gref: get_u32(b, result::CM_PAGE_GREF),
                    slots: get_u32(b, result::CM_PAGE_SLOTS),
                    slot_len: get_u32(b, result::CM_PAGE_SLOT_LEN),
                },
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
            (
                Op::QueryGid,
                Reply::Gid {
                    gid,
                    gid_type,
                    count,
                },
            ) => {
                b[result::GID..result::GID + 16].copy_from_slice(&gid);
                set_u32(b, result::GID_TYPE, gid_type);
                set_u32(b, result::GID_COUNT, count);
            }
            (Op::AllocPd, Reply::Handle(h)) => set_u32(b, result::HANDLE, h),
            (Op::Listen, Reply::Listener { listener, port }) => {
                set_u32(b, result::LISTEN_HANDLE, listener);
                set_u16(b, result::LISTEN_PORT, port);
            }
            (Op::CmInfo, Reply::CmInfo(i)) => {
                b[result::CM_LOCAL_ADDR..result::CM_LOCAL_ADDR + 16].copy_from_slice(&i.local_addr);
                b[result::CM_REMOTE_ADDR..result::CM_REMOTE_ADDR + 16]
                    .copy_from_slice(&i.remote_addr);
                set_u16(b, result::CM_LOCAL_PORT, i.local_port);
                set_u16(b, result::CM_REMOTE_PORT, i.remote_port);
                set_u8(b, result::CM_PRIVATE_LEN, i.private_len);
                set_u16(b, result::CM_IRD, i.ird);
                set_u16(b, result::CM_ORD, i.ord);
            }
            (
                Op::CmPage,
                Reply::CmPage {
                    gref,
                    slots,
                    slot_len,
                },
            ) => {
                set_u32(b, result::CM_PAGE_GREF, gref);
                set_u32(b, result::CM_PAGE_SLOTS, slots);
                set_u32(b, result::CM_PAGE_SLOT_LEN, slot_len);
            }
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

fn get_addr(b: &[u8], at: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            ResponseRepr::parse(&b).err(),
            Some(AbiError::Reserved {
                field: "control response"
            })
        );
    }

    #[test]
    fn query_gid_reply_from_literal_bytes() {
        let mut b = [0u8; 64];
        b[0] = 7; // req_id
        b[4] = 27; // QueryGid
        b[12..28].copy_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1]);
        b[28] = 2; // RoCE v2
        b[32] = 3; // three entries
        let r = ResponseRepr::parse(&b).unwrap();
        assert_eq!(
            r,
            ResponseRepr {
                req_id: 7,
                op: Op::QueryGid,
                status: Status::Ok,
                reply: Reply::Gid {
                    gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 1],
                    gid_type: GID_TYPE_ROCE_V2,
                    count: 3,
                },
            }
        );
        assert_eq!(r.to_bytes(), b);
        let mut bad = b;
        bad[28] = 3;
        assert!(matches!(
            ResponseRepr::parse(&bad),
            Err(AbiError::Unknown {
                what: "GID type",
                ..
            })
        ));
        let mut bad = b;
        bad[32] = 17;
        assert!(matches!(
            ResponseRepr::parse(&bad),
            Err(AbiError::OutOfRange { .. })
        ));
        b[36] = 1; // reserved
        assert!(matches!(
            ResponseRepr::parse(&b),
            Err(AbiError::Reserved { .. })
        ));
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
        assert_eq!(
            ResponseRepr::parse(&b).err(),
            Some(AbiError::Reserved {
                field: "control response"
            })
        );
    }

    #[test]
    fn cm_replies_round_trip_at_their_offsets() {
        let l = ResponseRepr {
            req_id: 1,
            op: Op::Listen,
            status: Status::Ok,
            reply: Reply::Listener {
                listener: 0x11,
                port: 0x1234,
            },
        };
        let b = l.to_bytes();
        assert_eq!(&b[12..18], &[0x11, 0, 0, 0, 0x34, 0x12]);
        assert_eq!(ResponseRepr::parse(&b).unwrap(), l);
        let i = ResponseRepr {
            req_id: 2,
            op: Op::CmInfo,
            status: Status::Ok,
            reply: Reply::CmInfo(CmInfoReply {
                local_addr: [1; 16],
                local_port: 2,
                remote_addr: [3; 16],
                remote_port: 4,
                private_len: 255,
                ird: 5,
                ord: 6,
            }),
        };
        let mut b = i.to_bytes();
        assert_eq!(
            (b[12], b[28], b[44], b[46], b[48], b[50], b[52]),
            (1, 3, 2, 4, 255, 5, 6)
        );
        assert_eq!(ResponseRepr::parse(&b).unwrap(), i);
        b[49] = 1;
        assert!(matches!(
            ResponseRepr::parse(&b),
            Err(AbiError::Reserved { .. })
        ));
        // A Listen answer's port is 16 bits: bytes 18..20 are reserved.
        let mut b = l.to_bytes();
        b[18] = 1;
        assert!(matches!(
            ResponseRepr::parse(&b),
            Err(AbiError::Reserved { .. })
        ));
    }
}
