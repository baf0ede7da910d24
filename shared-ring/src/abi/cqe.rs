//! Completion-queue entries: 32-byte slots with an owner/phase bit in the last word.
//!
//! ```text
//!  0  wr_id u64
//!  8  byte_len u32
//! 12  imm_data u32
//! 16  qp_num u32
//! 20  vendor_err u32
//! 24  opcode u8   25 status u8   26 flags u8   27 reserved u8 (0)
//! 28  owner u32: bit 0 = phase, other bits 0; written last, with release ordering
//! ```
//! Written by the backend, read by the frontend (see [`crate::cq`] for the phase rule).

use super::{check_len, AbiError};

/// Size of a CQE slot.
pub const CQE_LEN: usize = 32;
/// Bytes of a CQE written before its owner word.
pub const CQE_BODY_LEN: usize = 28;

/// Byte offsets of the CQE fields.
pub mod field {
    pub const WR_ID: usize = 0;
    pub const BYTE_LEN: usize = 8;
    pub const IMM_DATA: usize = 12;
    pub const QP_NUM: usize = 16;
    pub const VENDOR_ERR: usize = 20;
    pub const OPCODE: usize = 24;
    pub const STATUS: usize = 25;
    pub const FLAGS: usize = 26;
    pub const RESERVED: usize = 27;
    /// The owner word; bit 0 is the phase bit.
    pub const OWNER: usize = 28;
}

/// Phase bit in the owner word.
pub const OWNER_PHASE: u32 = 1;

/// Which work request a CQE completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CqeOpcode {
    Send = 1,
    RdmaWrite = 2,
    RdmaRead = 3,
    Recv = 4,
    /// A receive consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm = 5,
}

impl CqeOpcode {
    #[inline]
    pub fn from_u8(v: u8) -> Result<Self, AbiError> {
        Ok(match v {
            1 => Self::Send,
            2 => Self::RdmaWrite,
            3 => Self::RdmaRead,
            4 => Self::Recv,
            5 => Self::RecvRdmaWithImm,
            _ => {
                return Err(AbiError::Unknown {
                    what: "CQE opcode",
                    value: v.into(),
                })
            }
        })
    }
}

/// Completion status (the ibverbs `ibv_wc_status` values that the device model produces).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CqeStatus {
    Success = 0,
    LocalLengthError = 1,
    LocalQpOperationError = 2,
    LocalProtectionError = 3,
    WrFlushError = 4,
    RemoteAccessError = 5,
    RemoteOperationError = 6,
    RetryExceeded = 7,
    RnrRetryExceeded = 8,
    GeneralError = 9,
    BadResponse = 10,
    RemoteInvalidRequest = 11,
    /// The WQE itself did not parse (garbage written by the guest).
    BadWqe = 12,
}

impl CqeStatus {
    #[inline]
    pub fn from_u8(v: u8) -> Result<Self, AbiError> {
        use CqeStatus::*;
        const ALL: [CqeStatus; 13] = [
            Success,
            LocalLengthError,
            LocalQpOperationError,
            LocalProtectionError,
            WrFlushError,
            RemoteAccessError,
            RemoteOperationError,
            RetryExceeded,
            RnrRetryExceeded,
            GeneralError,
            BadResponse,
            RemoteInvalidRequest,
            BadWqe,
        ];
        ALL.get(usize::from(v)).copied().ok_or(AbiError::Unknown {
            what: "CQE status",
            value: v.into(),
        })
    }
}

/// CQE flag bits.
pub mod flags {
    /// `imm_data` is valid.
    pub const WITH_IMM: u8 = 1 << 0;
    /// The sender asked for a solicited event.
    pub const SOLICITED: u8 = 1 << 1;
    pub const ALL: u8 = WITH_IMM | SOLICITED;
}

/// Zero-copy view of a CQE slot.
#[derive(Debug, Clone)]
pub struct Cqe<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Cqe<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }
    /// Wraps a buffer of at least [`CQE_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Self, AbiError> {
        check_len(buffer.as_ref().len(), CQE_LEN)?;
        Ok(Self { buffer })
    }
    pub fn into_inner(self) -> T {
        self.buffer
    }
    super::view_getters! {
        wr_id: u64 @ field::WR_ID;
        byte_len: u32 @ field::BYTE_LEN;
        imm_data: u32 @ field::IMM_DATA;
        qp_num: u32 @ field::QP_NUM;
        vendor_err: u32 @ field::VENDOR_ERR;
        opcode: u8 @ field::OPCODE;
        status: u8 @ field::STATUS;
        flags: u8 @ field::FLAGS;
        reserved: u8 @ field::RESERVED;
        owner: u32 @ field::OWNER;
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Cqe<T> {
    super::view_setters! {
        set_wr_id: u64 @ field::WR_ID;
        set_byte_len: u32 @ field::BYTE_LEN;
        set_imm_data: u32 @ field::IMM_DATA;
        set_qp_num: u32 @ field::QP_NUM;
        set_vendor_err: u32 @ field::VENDOR_ERR;
        set_opcode: u8 @ field::OPCODE;
        set_status: u8 @ field::STATUS;
        set_flags: u8 @ field::FLAGS;
        set_reserved: u8 @ field::RESERVED;
        set_owner: u32 @ field::OWNER;
    }
}

/// The meaning of a CQE (the owner word is ring mechanics, not part of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqeRepr {
    pub wr_id: u64,
    pub status: CqeStatus,
    pub opcode: CqeOpcode,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub vendor_err: u32,
    pub flags: u8,
}

impl CqeRepr {
    /// Parses a CQE. A flush-error CQE may carry an opcode of 0 in real devices; ours always
    /// carries the opcode of the flushed WQE.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(cqe: &Cqe<T>) -> Result<Self, AbiError> {
        check_len(cqe.buffer.as_ref().len(), CQE_LEN)?;
        if cqe.flags() & !flags::ALL != 0 {
            return Err(AbiError::Unknown {
                what: "CQE flags",
                value: cqe.flags().into(),
            });
        }
        if cqe.reserved() != 0 || cqe.owner() & !OWNER_PHASE != 0 {
            return Err(AbiError::Reserved {
                field: "cqe.reserved",
            });
        }
        Ok(Self {
            wr_id: cqe.wr_id(),
            status: CqeStatus::from_u8(cqe.status())?,
            opcode: CqeOpcode::from_u8(cqe.opcode())?,
            byte_len: cqe.byte_len(),
            imm_data: cqe.imm_data(),
            qp_num: cqe.qp_num(),
            vendor_err: cqe.vendor_err(),
            flags: cqe.flags(),
        })
    }

    /// Writes the CQE body; the owner word is left 0 (the CQ writer sets the phase).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, cqe: &mut Cqe<T>) {
        cqe.buffer.as_mut()[..CQE_LEN].fill(0);
        cqe.set_wr_id(self.wr_id);
        cqe.set_byte_len(self.byte_len);
        cqe.set_imm_data(self.imm_data);
        cqe.set_qp_num(self.qp_num);
        cqe.set_vendor_err(self.vendor_err);
        cqe.set_opcode(self.opcode as u8);
        cqe.set_status(self.status as u8);
        cqe.set_flags(self.flags);
    }

    /// Slot bytes of this CQE (owner word 0).
    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let mut b = [0u8; CQE_LEN];
        self.emit(&mut Cqe::new_unchecked(&mut b[..]));
        b
    }

    /// Parses slot bytes.
    #[inline]
    pub fn from_bytes(b: &[u8; CQE_LEN]) -> Result<Self, AbiError> {
        Self::parse(&Cqe::new_unchecked(&b[..]))
    }

    /// The body (the first [`CQE_BODY_LEN`] bytes of [`Self::to_bytes`]) as seven words, word
    /// `i` holding bytes `4 i .. 4 i + 4` in native order: what the CQ writer stores.
    #[inline]
    pub fn body_words(&self) -> [u32; CQE_BODY_LEN / 4] {
        let w = |v: u32| u32::from_ne_bytes(v.to_le_bytes());
        [
            w(self.wr_id as u32),
            w((self.wr_id >> 32) as u32),
            w(self.byte_len),
            w(self.imm_data),
            w(self.qp_num),
            w(self.vendor_err),
            u32::from_ne_bytes([self.opcode as u8, self.status as u8, self.flags, 0]),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_bytes_round_trip() {
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&77u64.to_le_bytes());
        b[8..12].copy_from_slice(&64u32.to_le_bytes());
        b[16..20].copy_from_slice(&0x12u32.to_le_bytes());
        b[24] = 4; // RECV
        b[25] = 0;
        let r = CqeRepr::from_bytes(&b).unwrap();
        assert_eq!(r.opcode, CqeOpcode::Recv);
        assert_eq!((r.wr_id, r.byte_len, r.qp_num), (77, 64, 0x12));
        assert_eq!(r.to_bytes(), b);
        b[31] = 0x80;
        assert_eq!(
            CqeRepr::from_bytes(&b).err(),
            Some(AbiError::Reserved {
                field: "cqe.reserved"
            })
        );
        b[31] = 0;
        b[25] = 200;
        assert_eq!(
            CqeRepr::from_bytes(&b).err(),
            Some(AbiError::Unknown {
                what: "CQE status",
                value: 200
            })
        );
    }
}
