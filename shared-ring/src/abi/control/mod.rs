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
//! The per-op layouts are the [`args`] and [`result`] offset modules and `docs/protocol.md`.
//! Responses may come in any order; `req_id` matches them to requests.
//!
//! Parsing is canonical: after decoding, the repr is emitted again and must reproduce the
//! slot byte for byte, so every reserved or unused byte is checked to be zero.
//!
//! This file holds what both directions share (slot size, header fields, ops, status codes,
//! QP states); requests (`request.rs`) and responses (`response.rs`) have their own files, and
//! their items are re-exported here.

mod request;
mod response;

pub use request::{args, CmTarget, PrivData, Request, RequestRepr, AV_RTS, MAX_PATH_MTU, MAX_PSN};
pub use response::{
    result, ChannelStats, CmInfoReply, DeviceAttrs, Reply, ResponseRepr, GID_TYPE_IB,
    GID_TYPE_ROCE_V1, GID_TYPE_ROCE_V2, MAX_GIDS,
};

use super::AbiError;

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
    Reject = 21,
    Disconnect = 22,
    CloseListener = 23,
    CmInfo = 24,
    CmPage = 25,
    /// Connect a QP by address vector (RTR/RTS towards a GID, QP number and PSNs).
    ConnectAv = 26,
    /// One entry of the port's GID table, its type and the table's length (protocol 2.x
    /// addition: an older backend answers `BadRequest`).
    QueryGid = 27,
}

impl Op {
    pub fn from_u16(v: u16) -> Result<Self, AbiError> {
        use Op::*;
        const ALL: [Op; 27] = [
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
            Reject,
            Disconnect,
            CloseListener,
            CmInfo,
            CmPage,
            ConnectAv,
            QueryGid,
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
    /// The backend's policy forbids it: a port outside the domain's `allowed-ports`, a peer
    /// outside its `allowed-peers`, or an address that is not the backend's.
    NotPermitted = 12,
    /// The address and port are already bound (by a listener of any domain).
    AddressInUse = 13,
}

impl Status {
    pub fn from_u32(v: u32) -> Result<Self, AbiError> {
        use Status::*;
        const ALL: [Status; 14] = [
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
            NotPermitted,
            AddressInUse,
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

/// Connection-management private data (the bytes `Connect`, `Accept` and `Reject` carry to
/// the peer, and `CmInfo` reads back) travels through the channel's **CM page**: one page the
/// backend allocates and grants on the first `CmPage` request, cut into [`CM_SLOTS`] slots of
/// [`CM_SLOT_LEN`] bytes. A request names a slot and a length; the frontend gives each
/// in-flight CM request its own slot. The backend copies a slot out before it uses it.
pub const CM_SLOTS: u8 = 16;
/// Bytes of one CM page slot.
pub const CM_SLOT_LEN: usize = 256;
/// Most private data bytes one CM message carries (MPA's limit for revision 2 is 512; vrdma's
/// is that of the device, 255, so one length byte holds it).
pub const MAX_PRIVATE_DATA: usize = 255;

/// QP transport type (`CreateQp`).
pub const QP_TYPE_RC: u8 = 1;
/// `ArmCq` flag: notify on solicited completions only.
pub const ARM_SOLICITED: u32 = 1;
/// Largest queue (log2 entries) a parser accepts; the backend's limits apply after.
pub const MAX_QUEUE_LOG2: u8 = 16;

pub(super) fn check_log2(v: u8, what: &'static str) -> Result<u8, AbiError> {
    if v > MAX_QUEUE_LOG2 {
        return Err(AbiError::OutOfRange {
            what,
            value: v.into(),
            max: MAX_QUEUE_LOG2.into(),
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_ops_and_statuses_are_errors() {
        let mut b = [0u8; 64];
        assert_eq!(
            RequestRepr::parse(&b).err(),
            Some(AbiError::Unknown {
                what: "control op",
                value: 0
            })
        );
        b[4] = 28;
        assert_eq!(
            RequestRepr::parse(&b).err(),
            Some(AbiError::Unknown {
                what: "control op",
                value: 28
            })
        );
        b[4] = 2;
        b[8] = 14;
        assert_eq!(
            ResponseRepr::parse(&b).err(),
            Some(AbiError::Unknown {
                what: "status",
                value: 14
            })
        );
        assert_eq!(
            RequestRepr::parse(&b[..63]).err(),
            Some(AbiError::Truncated { len: 63, need: 64 })
        );
    }
}
