//! The Terminate message (RFC 5040 §4.8, codes in RFC 5040 §7 / RFC 5041 §7 / RFC 5044 §8
//! and RFC 6581 §7): the payload of an untagged segment on queue 2, sent once before the
//! connection is torn down because of an error.
//!
//! ```text
//!  0                   1                   2                   3
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Layer | EType |  Error Code   |M|D|R|        Reserved         |  Terminate Control
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |  DDP Segment Length (M or D)  |                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+                               +
//! ~  Terminated DDP Header (D): 14 bytes tagged, 18 untagged      ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ~  Terminated RDMA Header (R): the 28-byte Read Request header   ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! M: the DDP Segment Length is valid; D: the DDP header of the offending segment follows;
//! R: its RDMAP header follows. Linux siw always sets M with D and copies the offending
//! segment's MPA length field and header as one block, which is this layout; with R it adds
//! the 28-byte Read Request header only when the offending message was a Read Request. This
//! codec keeps the copied block as bytes ([`TerminateRepr::copied`]) and reads its parts on
//! demand, so whatever a peer copied comes back byte for byte.

use crate::ddp::{TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
use crate::rdmap::{Opcode, READ_REQUEST_LEN};
use crate::WireError;

/// Bytes of the Terminate Control field.
pub const CONTROL_LEN: usize = 4;
/// Bytes of the DDP Segment Length field.
pub const SEGMENT_LENGTH_LEN: usize = 2;
/// The longest Terminate body: control, segment length, an untagged DDP header and a Read
/// Request header.
pub const MAX_BODY_LEN: usize =
    CONTROL_LEN + SEGMENT_LENGTH_LEN + UNTAGGED_HEADER_LEN + READ_REQUEST_LEN;

/// The layer that detected the error.
pub mod layer {
    /// RDMAP (RFC 5040 §7.1).
    pub const RDMAP: u8 = 0x0;
    /// DDP (RFC 5041 §7).
    pub const DDP: u8 = 0x1;
    /// The lower layer protocol: MPA (RFC 5044 §8).
    pub const LLP: u8 = 0x2;
}

/// A (layer, error type, error code) triple of the Terminate Control field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TermCode {
    /// 4 bits, [`layer`].
    pub layer: u8,
    /// 4 bits.
    pub etype: u8,
    pub code: u8,
}

const fn tc(layer: u8, etype: u8, code: u8) -> TermCode {
    TermCode { layer, etype, code }
}

impl TermCode {
    // --- RDMAP layer (RFC 5040 §7.1) ---
    /// Local catastrophic error (etype 0).
    pub const RDMAP_LOCAL_CATASTROPHIC: TermCode = tc(layer::RDMAP, 0x0, 0x00);
    /// Remote protection error (etype 1): invalid STag.
    pub const RDMAP_INVALID_STAG: TermCode = tc(layer::RDMAP, 0x1, 0x00);
    /// Remote protection: base or bounds violation.
    pub const RDMAP_BASE_BOUNDS: TermCode = tc(layer::RDMAP, 0x1, 0x01);
    /// Remote protection: access rights violation.
    pub const RDMAP_ACCESS_RIGHTS: TermCode = tc(layer::RDMAP, 0x1, 0x02);
    /// Remote protection: STag not associated with this RDMAP stream.
    pub const RDMAP_STAG_NOT_ASSOCIATED: TermCode = tc(layer::RDMAP, 0x1, 0x03);
    /// Remote protection: tagged offset wrap.
    pub const RDMAP_TO_WRAP: TermCode = tc(layer::RDMAP, 0x1, 0x04);
    /// Remote protection: the STag cannot be invalidated.
    pub const RDMAP_CANNOT_INVALIDATE: TermCode = tc(layer::RDMAP, 0x1, 0x09);
    /// Remote protection: unspecified.
    pub const RDMAP_PROTECTION_UNSPECIFIED: TermCode = tc(layer::RDMAP, 0x1, 0xff);
    /// Remote operation error (etype 2): invalid RDMAP version.
    pub const RDMAP_INVALID_VERSION: TermCode = tc(layer::RDMAP, 0x2, 0x05);
    /// Remote operation: unexpected opcode.
    pub const RDMAP_UNEXPECTED_OPCODE: TermCode = tc(layer::RDMAP, 0x2, 0x06);
    /// Remote operation: catastrophic error localized to this RDMAP stream.
    pub const RDMAP_CATASTROPHIC_STREAM: TermCode = tc(layer::RDMAP, 0x2, 0x07);
    /// Remote operation: catastrophic error, global.
    pub const RDMAP_CATASTROPHIC_GLOBAL: TermCode = tc(layer::RDMAP, 0x2, 0x08);
    /// Remote operation: unspecified.
    pub const RDMAP_OPERATION_UNSPECIFIED: TermCode = tc(layer::RDMAP, 0x2, 0xff);

    // --- DDP layer (RFC 5041 §7) ---
    /// Local catastrophic error (etype 0).
    pub const DDP_LOCAL_CATASTROPHIC: TermCode = tc(layer::DDP, 0x0, 0x00);
    /// Tagged buffer error (etype 1): invalid STag.
    pub const DDP_INVALID_STAG: TermCode = tc(layer::DDP, 0x1, 0x00);
    /// Tagged buffer: base or bounds violation.
    pub const DDP_BASE_BOUNDS: TermCode = tc(layer::DDP, 0x1, 0x01);
    /// Tagged buffer: STag not associated with this DDP stream.
    pub const DDP_STAG_NOT_ASSOCIATED: TermCode = tc(layer::DDP, 0x1, 0x02);
    /// Tagged buffer: tagged offset wrap.
    pub const DDP_TO_WRAP: TermCode = tc(layer::DDP, 0x1, 0x03);
    /// Tagged buffer: invalid DDP version.
    pub const DDP_TAGGED_INVALID_VERSION: TermCode = tc(layer::DDP, 0x1, 0x04);
    /// Untagged buffer error (etype 2): invalid queue number.
    pub const DDP_INVALID_QN: TermCode = tc(layer::DDP, 0x2, 0x01);
    /// Untagged buffer: invalid MSN, no buffer available (a Send with no posted receive).
    pub const DDP_NO_BUFFER: TermCode = tc(layer::DDP, 0x2, 0x02);
    /// Untagged buffer: invalid MSN, MSN range not valid.
    pub const DDP_MSN_RANGE: TermCode = tc(layer::DDP, 0x2, 0x03);
    /// Untagged buffer: invalid message offset.
    pub const DDP_INVALID_MO: TermCode = tc(layer::DDP, 0x2, 0x04);
    /// Untagged buffer: message too long for the available buffer.
    pub const DDP_MESSAGE_TOO_LONG: TermCode = tc(layer::DDP, 0x2, 0x05);
    /// Untagged buffer: invalid DDP version.
    pub const DDP_UNTAGGED_INVALID_VERSION: TermCode = tc(layer::DDP, 0x2, 0x06);

    // --- LLP = MPA (RFC 5044 §8, RFC 6581 §7), etype 0 ---
    /// The TCP stream was lost (siw's name for code 1).
    pub const MPA_TCP_STREAM_LOST: TermCode = tc(layer::LLP, 0x0, 0x01);
    /// Received MPA CRC does not match.
    pub const MPA_CRC_ERROR: TermCode = tc(layer::LLP, 0x0, 0x02);
    /// Marker and ULPDU pointer mismatch (FPDU start not where expected).
    pub const MPA_FPDU_START: TermCode = tc(layer::LLP, 0x0, 0x03);
    /// Invalid MPA request or reply frame.
    pub const MPA_INVALID_REQUEST_REPLY: TermCode = tc(layer::LLP, 0x0, 0x04);
    /// Enhanced connection setup: local catastrophic error.
    pub const MPA_LOCAL_CATASTROPHIC: TermCode = tc(layer::LLP, 0x0, 0x05);
    /// Enhanced connection setup: insufficient IRD resources.
    pub const MPA_INSUFFICIENT_IRD: TermCode = tc(layer::LLP, 0x0, 0x06);
    /// Enhanced connection setup: no matching RTR option.
    pub const MPA_NO_MATCHING_RTR: TermCode = tc(layer::LLP, 0x0, 0x07);

    /// The code a receiver sends when parsing a peer's FPDU failed with `err` (the data path
    /// adds placement errors — STag, bounds, access, no buffer — itself).
    pub fn for_error(err: &WireError) -> TermCode {
        match err {
            WireError::BadCrc { .. } => TermCode::MPA_CRC_ERROR,
            WireError::DdpVersion { tagged: true, .. } => TermCode::DDP_TAGGED_INVALID_VERSION,
            WireError::DdpVersion { tagged: false, .. } => TermCode::DDP_UNTAGGED_INVALID_VERSION,
            WireError::RdmapVersion { .. } => TermCode::RDMAP_INVALID_VERSION,
            WireError::UnexpectedOpcode { .. } | WireError::Unknown { .. } => {
                TermCode::RDMAP_UNEXPECTED_OPCODE
            }
            WireError::InvalidQn { .. } => TermCode::DDP_INVALID_QN,
            WireError::TooLong { .. }
            | WireError::Truncated { .. }
            | WireError::Malformed { .. } => TermCode::RDMAP_CATASTROPHIC_STREAM,
        }
    }
}

const M_BIT: u8 = 0x80;
const D_BIT: u8 = 0x40;
const R_BIT: u8 = 0x20;

/// A zero-copy view of a Terminate message body (the untagged payload on queue 2).
#[derive(Debug, Clone)]
pub struct Terminate<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Terminate<T> {
    /// Wraps a buffer without checking it.
    pub fn new_unchecked(buffer: T) -> Terminate<T> {
        Terminate { buffer }
    }

    /// Wraps a buffer holding the control field and every header its M/D/R bits announce.
    pub fn new_checked(buffer: T) -> Result<Terminate<T>, WireError> {
        let t = Terminate::new_unchecked(buffer);
        t.check_len()?;
        Ok(t)
    }

    /// Checks the control field and the copied headers are all present.
    pub fn check_len(&self) -> Result<(), WireError> {
        let have = self.buffer.as_ref().len();
        let need = if have < CONTROL_LEN {
            CONTROL_LEN
        } else {
            CONTROL_LEN + copied_len(self.buffer.as_ref())?
        };
        if have < need {
            return Err(WireError::Truncated {
                what: "Terminate",
                need,
                have,
            });
        }
        Ok(())
    }

    /// Layer (4 bits).
    pub fn layer(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    /// Error type (4 bits).
    pub fn etype(&self) -> u8 {
        self.buffer.as_ref()[0] & 0x0f
    }

    /// Error code.
    pub fn code(&self) -> u8 {
        self.buffer.as_ref()[1]
    }

    /// M: DDP Segment Length valid.
    pub fn m(&self) -> bool {
        self.buffer.as_ref()[2] & M_BIT != 0
    }

    /// D: Terminated DDP Header included.
    pub fn d(&self) -> bool {
        self.buffer.as_ref()[2] & D_BIT != 0
    }

    /// R: Terminated RDMA Header included.
    pub fn r(&self) -> bool {
        self.buffer.as_ref()[2] & R_BIT != 0
    }

    /// The 13 reserved bits.
    pub fn reserved(&self) -> u16 {
        let b = self.buffer.as_ref();
        u16::from_be_bytes([b[2] & 0x1f, b[3]])
    }

    /// The copied headers after the control field, as their bits announce them.
    pub fn copied(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let len = copied_len(b).unwrap_or(0);
        &b[CONTROL_LEN..CONTROL_LEN + len]
    }
}

/// Bytes after the control field that `body`'s M/D/R bits announce (reading the copied DDP
/// header's T bit and opcode when D is set); `body` must hold the control field.
fn copied_len(body: &[u8]) -> Result<usize, WireError> {
    let bits = body[2];
    let (m, d, r) = (bits & M_BIT != 0, bits & D_BIT != 0, bits & R_BIT != 0);
    let mut len = 0;
    let mut opcode = None;
    if m || d {
        len += SEGMENT_LENGTH_LEN;
    }
    if d {
        let at = CONTROL_LEN + len;
        let (Some(&ctrl), Some(&ulp)) = (body.get(at), body.get(at + 1)) else {
            return Err(WireError::Truncated {
                what: "Terminate: terminated DDP header",
                need: at + 2,
                have: body.len(),
            });
        };
        len += if ctrl & 0x80 != 0 {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        };
        opcode = Some(ulp & 0x0f);
    }
    // siw copies the 28-byte Read Request header only for a Read Request; for other messages
    // R means the RDMAP part inside the copied DDP header.
    if r && (opcode.is_none() || opcode == Some(Opcode::ReadRequest.as_u8())) {
        len += READ_REQUEST_LEN;
    }
    Ok(len)
}

/// The meaning of a Terminate message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateRepr<'a> {
    pub code: TermCode,
    pub m: bool,
    pub d: bool,
    pub r: bool,
    /// DDP Segment Length, Terminated DDP Header, Terminated RDMA Header — as present.
    pub copied: &'a [u8],
}

impl<'a> TerminateRepr<'a> {
    /// A Terminate carrying no copied header (a catastrophic or MPA-layer error).
    pub fn bare(code: TermCode) -> TerminateRepr<'static> {
        TerminateRepr {
            code,
            m: false,
            d: false,
            r: false,
            copied: &[],
        }
    }

    /// A Terminate copying the offending segment: `block` is its MPA length field followed by
    /// its DDP header (and, for a Read Request with `r`, the Read Request header) — what siw
    /// sends, M and D set.
    pub fn with_header(code: TermCode, r: bool, block: &'a [u8]) -> TerminateRepr<'a> {
        TerminateRepr {
            code,
            m: true,
            d: true,
            r,
            copied: block,
        }
    }

    /// Parses a Terminate body; the copied headers must be whole.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        t: &Terminate<&'a T>,
    ) -> Result<TerminateRepr<'a>, WireError> {
        t.check_len()?;
        let bytes: &'a [u8] = (*t.buffer).as_ref();
        let len = copied_len(bytes)?;
        Ok(TerminateRepr {
            code: TermCode {
                layer: t.layer(),
                etype: t.etype(),
                code: t.code(),
            },
            m: t.m(),
            d: t.d(),
            r: t.r(),
            copied: &bytes[CONTROL_LEN..CONTROL_LEN + len],
        })
    }

    /// The DDP Segment Length field, if present.
    pub fn ddp_segment_length(&self) -> Option<u16> {
        if !(self.m || self.d) {
            return None;
        }
        Some(u16::from_be_bytes([
            *self.copied.first()?,
            *self.copied.get(1)?,
        ]))
    }

    /// The Terminated DDP Header, if present.
    pub fn ddp_header(&self) -> Option<&'a [u8]> {
        if !self.d {
            return None;
        }
        let rest = self.copied.get(SEGMENT_LENGTH_LEN..)?;
        let len = if rest.first()? & 0x80 != 0 {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        };
        rest.get(..len)
    }

    /// The Terminated RDMA Header (a Read Request header), if present.
    pub fn rdma_header(&self) -> Option<&'a [u8]> {
        if !self.r {
            return None;
        }
        let n = self.copied.len();
        self.copied.get(n.checked_sub(READ_REQUEST_LEN)?..)
    }

    /// Bytes [`TerminateRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        CONTROL_LEN + self.copied.len()
    }

    /// Writes the body at the front of the view's buffer. The copied block must be what the
    /// bits announce (checked, so a peer reading it back finds the same headers).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        t: &mut Terminate<T>,
    ) -> Result<(), WireError> {
        let have = t.buffer.as_ref().len();
        if have < self.buffer_len() {
            return Err(WireError::Truncated {
                what: "Terminate buffer",
                need: self.buffer_len(),
                have,
            });
        }
        if self.code.layer > 0xf || self.code.etype > 0xf {
            return Err(WireError::Malformed {
                what: "Terminate",
                why: "layer and error type are 4-bit fields",
            });
        }
        let b = t.buffer.as_mut();
        b[0] = (self.code.layer << 4) | self.code.etype;
        b[1] = self.code.code;
        b[2] = (if self.m { M_BIT } else { 0 })
            | (if self.d { D_BIT } else { 0 })
            | (if self.r { R_BIT } else { 0 });
        b[3] = 0;
        b[CONTROL_LEN..self.buffer_len()].copy_from_slice(self.copied);
        if copied_len(b).ok() != Some(self.copied.len()) {
            return Err(WireError::Malformed {
                what: "Terminate",
                why: "copied headers do not match the M/D/R bits",
            });
        }
        Ok(())
    }

    /// The body in a new buffer.
    pub fn to_vec(&self) -> Result<Vec<u8>, WireError> {
        let mut out = vec![0u8; self.buffer_len()];
        self.emit(&mut Terminate::new_unchecked(&mut out[..]))?;
        Ok(out)
    }
}
