//! DDP segments (RFC 5041 §4): the header at the front of every ULPDU, all fields big-endian.
//!
//! ```text
//! control (RFC 5041 §4.2)           byte 0                byte 1
//!                               |T|L| Rsvd  |DV |     |  RsvdULP (RDMAP control)  |
//!
//! tagged (T=1, §4.3), 14 bytes:   control(2) | STag(4) | TO(8)
//! untagged (T=0, §4.4), 18 bytes: control(2) | RsvdULP(4) | QN(4) | MSN(4) | MO(4)
//! ```
//!
//! T picks the buffer model, L marks the last segment of a message, DV is the DDP version (1).
//! The 8-bit RsvdULP in byte 1 and the 32-bit RsvdULP of untagged segments belong to the
//! upper layer: RDMAP puts its control byte and the Invalidate STag there. The four reserved
//! bits are sent as zero and not checked on receive (RFC 5041 §4.2), so a view may hold bits
//! its [`DdpRepr`] does not.

use crate::be::{set_u32, set_u64, u32_at, u64_at};
use crate::WireError;

/// The DDP version this codec speaks (DV).
pub const DDP_VERSION: u8 = 1;
/// Header bytes of a tagged segment.
pub const TAGGED_HEADER_LEN: usize = 14;
/// Header bytes of an untagged segment.
pub const UNTAGGED_HEADER_LEN: usize = 18;

/// Untagged queue of Send messages (RFC 5040 §5.1).
pub const QN_SEND: u32 = 0;
/// Untagged queue of RDMA Read Requests.
pub const QN_READ_REQUEST: u32 = 1;
/// Untagged queue of Terminate messages.
pub const QN_TERMINATE: u32 = 2;

const T_BIT: u8 = 0x80;
const L_BIT: u8 = 0x40;
const RSVD_MASK: u8 = 0x3c;
const DV_MASK: u8 = 0x03;

mod field {
    use std::ops::Range;
    pub const CTRL: usize = 0;
    pub const ULP_CTRL: usize = 1;
    pub const STAG: Range<usize> = 2..6;
    pub const TO: Range<usize> = 6..14;
    pub const RSVD_ULP: Range<usize> = 2..6;
    pub const QN: Range<usize> = 6..10;
    pub const MSN: Range<usize> = 10..14;
    pub const MO: Range<usize> = 14..18;
}

/// A zero-copy view of one DDP segment (a whole ULPDU: header, then payload).
#[derive(Debug, Clone)]
pub struct Segment<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Segment<T> {
    /// Wraps a buffer without checking it; accessors may panic until [`Segment::check_len`]
    /// passes.
    pub fn new_unchecked(buffer: T) -> Segment<T> {
        Segment { buffer }
    }

    /// Wraps a buffer holding at least the header its T bit calls for.
    pub fn new_checked(buffer: T) -> Result<Segment<T>, WireError> {
        let s = Segment::new_unchecked(buffer);
        s.check_len()?;
        Ok(s)
    }

    /// Checks that the control bytes and the rest of the header are present.
    pub fn check_len(&self) -> Result<(), WireError> {
        let have = self.buffer.as_ref().len();
        let need = if have < 2 { 2 } else { self.header_len() };
        if have < need {
            return Err(WireError::Truncated {
                what: "DDP header",
                need,
                have,
            });
        }
        Ok(())
    }

    fn ctrl(&self) -> u8 {
        self.buffer.as_ref()[field::CTRL]
    }

    /// T: tagged buffer model.
    pub fn tagged(&self) -> bool {
        self.ctrl() & T_BIT != 0
    }

    /// L: last segment of the message.
    pub fn last(&self) -> bool {
        self.ctrl() & L_BIT != 0
    }

    /// The four reserved bits.
    pub fn reserved(&self) -> u8 {
        (self.ctrl() & RSVD_MASK) >> 2
    }

    /// DV: the DDP version.
    pub fn version(&self) -> u8 {
        self.ctrl() & DV_MASK
    }

    /// The 8-bit RsvdULP field (the RDMAP control byte).
    pub fn ulp_ctrl(&self) -> u8 {
        self.buffer.as_ref()[field::ULP_CTRL]
    }

    /// Header length for this segment's buffer model.
    pub fn header_len(&self) -> usize {
        if self.tagged() {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }

    /// Tagged: the Steering Tag of the sink buffer.
    pub fn stag(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::STAG)
    }

    /// Tagged: the Tagged Offset this segment's payload goes to.
    pub fn to(&self) -> u64 {
        u64_at(self.buffer.as_ref(), field::TO)
    }

    /// Untagged: the 32-bit RsvdULP field (RDMAP's Invalidate STag).
    pub fn rsvd_ulp(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::RSVD_ULP)
    }

    /// Untagged: Queue Number.
    pub fn qn(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::QN)
    }

    /// Untagged: Message Sequence Number (per queue, from 1).
    pub fn msn(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::MSN)
    }

    /// Untagged: Message Offset of this segment's payload.
    pub fn mo(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::MO)
    }

    /// The payload after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }

    /// The buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Segment<T> {
    fn set_bit(&mut self, bit: u8, on: bool) {
        let b = &mut self.buffer.as_mut()[field::CTRL];
        *b = if on { *b | bit } else { *b & !bit };
    }

    /// Sets T.
    pub fn set_tagged(&mut self, on: bool) {
        self.set_bit(T_BIT, on)
    }

    /// Sets L.
    pub fn set_last(&mut self, on: bool) {
        self.set_bit(L_BIT, on)
    }

    /// Sets DV and clears the reserved bits.
    pub fn set_version(&mut self, version: u8) {
        let b = &mut self.buffer.as_mut()[field::CTRL];
        *b = (*b & (T_BIT | L_BIT)) | (version & DV_MASK);
    }

    /// Sets the 8-bit RsvdULP (RDMAP control byte).
    pub fn set_ulp_ctrl(&mut self, v: u8) {
        self.buffer.as_mut()[field::ULP_CTRL] = v;
    }

    /// Tagged: sets the STag.
    pub fn set_stag(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::STAG, v)
    }

    /// Tagged: sets the TO.
    pub fn set_to(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::TO, v)
    }

    /// Untagged: sets the 32-bit RsvdULP.
    pub fn set_rsvd_ulp(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::RSVD_ULP, v)
    }

    /// Untagged: sets QN.
    pub fn set_qn(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::QN, v)
    }

    /// Untagged: sets MSN.
    pub fn set_msn(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::MSN, v)
    }

    /// Untagged: sets MO.
    pub fn set_mo(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::MO, v)
    }

    /// The payload, to fill in place.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let at = self.header_len();
        &mut self.buffer.as_mut()[at..]
    }
}

/// Where a segment's payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferModel {
    /// Into the buffer named by `stag`, at tagged offset `to` (RDMA Write, Read Response).
    Tagged { stag: u32, to: u64 },
    /// Into the next buffer of queue `qn`, message `msn`, at offset `mo` (Send, Read
    /// Request, Terminate); `rsvd_ulp` is RDMAP's (the Invalidate STag, or 0).
    Untagged {
        rsvd_ulp: u32,
        qn: u32,
        msn: u32,
        mo: u32,
    },
}

/// The meaning of a DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DdpRepr {
    pub last: bool,
    /// The 8-bit RsvdULP: the RDMAP control byte.
    pub ulp_ctrl: u8,
    pub model: BufferModel,
}

impl DdpRepr {
    /// Parses a checked segment's header; the DDP version must be 1.
    pub fn parse<T: AsRef<[u8]>>(seg: &Segment<T>) -> Result<DdpRepr, WireError> {
        seg.check_len()?;
        if seg.version() != DDP_VERSION {
            return Err(WireError::DdpVersion {
                tagged: seg.tagged(),
                version: seg.version(),
            });
        }
        let model = if seg.tagged() {
            BufferModel::Tagged {
                stag: seg.stag(),
                to: seg.to(),
            }
        } else {
            BufferModel::Untagged {
                rsvd_ulp: seg.rsvd_ulp(),
                qn: seg.qn(),
                msn: seg.msn(),
                mo: seg.mo(),
            }
        };
        Ok(DdpRepr {
            last: seg.last(),
            ulp_ctrl: seg.ulp_ctrl(),
            model,
        })
    }

    /// Whether the tagged buffer model is used.
    pub fn tagged(&self) -> bool {
        matches!(self.model, BufferModel::Tagged { .. })
    }

    /// Header bytes [`DdpRepr::emit`] writes.
    pub fn header_len(&self) -> usize {
        if self.tagged() {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }

    /// Writes the header at the front of the segment's buffer (reserved bits zero).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        seg: &mut Segment<T>,
    ) -> Result<(), WireError> {
        let have = seg.buffer.as_ref().len();
        if have < self.header_len() {
            return Err(WireError::Truncated {
                what: "DDP header buffer",
                need: self.header_len(),
                have,
            });
        }
        seg.buffer.as_mut()[field::CTRL] = 0;
        seg.set_tagged(self.tagged());
        seg.set_last(self.last);
        seg.set_version(DDP_VERSION);
        seg.set_ulp_ctrl(self.ulp_ctrl);
        match self.model {
            BufferModel::Tagged { stag, to } => {
                seg.set_stag(stag);
                seg.set_to(to);
            }
            BufferModel::Untagged {
                rsvd_ulp,
                qn,
                msn,
                mo,
            } => {
                seg.set_rsvd_ulp(rsvd_ulp);
                seg.set_qn(qn);
                seg.set_msn(msn);
                seg.set_mo(mo);
            }
        }
        Ok(())
    }

    /// The header bytes in a new buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.header_len()];
        // The buffer is exactly header_len() long: emit cannot fail.
        let _ = self.emit(&mut Segment::new_unchecked(&mut out[..]));
        out
    }
}
