//! RDMAP (RFC 5040): the control byte every DDP segment carries in its 8-bit RsvdULP field,
//! the opcodes, and the RDMA Read Request header.
//!
//! ```text
//! RDMAP control (RFC 5040 §4.2), DDP byte 1:   | RV (2) | Rsvd (2) | Opcode (4) |
//!
//! RDMA Read Request (§4.4), the payload of an untagged segment on queue 1, 28 bytes:
//!   Data Sink STag (4) | Data Sink Tagged Offset (8) | RDMA Read Message Size (4) |
//!   Data Source STag (4) | Data Source Tagged Offset (8)
//! ```
//!
//! Send with Invalidate puts the STag to invalidate in the untagged segment's 32-bit RsvdULP
//! field (§4.3); every other message sends it as zero.
//!
//! Immediate data: Linux siw (the reference peer) carries none on the wire. Its RDMAP opcode
//! table stops at Terminate (7), its kernel `post_send` refuses `IB_WR_SEND_WITH_IMM` and
//! `IB_WR_RDMA_WRITE_WITH_IMM` ("unsupported"), and `SIW_OP_SEND_WITH_IMM` exists only in its
//! work-request/completion tables. RFC 7306 defines immediate-data opcodes, which siw does not
//! implement; this codec refuses every opcode above 7 (a Terminate with "invalid opcode").

use crate::be::{set_u32, set_u64, u32_at, u64_at};
use crate::WireError;

/// The RDMAP version this codec speaks (RV).
pub const RDMAP_VERSION: u8 = 1;
/// Bytes of the RDMA Read Request header.
pub const READ_REQUEST_LEN: usize = 28;

/// RDMAP message opcodes (RFC 5040 §4.2 table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    Write = 0,
    ReadRequest = 1,
    ReadResponse = 2,
    Send = 3,
    SendInvalidate = 4,
    SendSe = 5,
    SendSeInvalidate = 6,
    Terminate = 7,
}

impl Opcode {
    /// Every opcode, in numeric order.
    pub const ALL: [Opcode; 8] = [
        Opcode::Write,
        Opcode::ReadRequest,
        Opcode::ReadResponse,
        Opcode::Send,
        Opcode::SendInvalidate,
        Opcode::SendSe,
        Opcode::SendSeInvalidate,
        Opcode::Terminate,
    ];

    /// The opcode with this 4-bit value.
    pub fn from_u8(v: u8) -> Result<Opcode, WireError> {
        Opcode::ALL
            .get(usize::from(v))
            .copied()
            .ok_or(WireError::UnexpectedOpcode {
                opcode: v,
                why: "not an RDMAP opcode (siw and vrdma stop at Terminate, 7)",
            })
    }

    /// The 4-bit value.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// Carried in tagged segments (RDMA Write, Read Response); the rest are untagged.
    pub fn tagged(self) -> bool {
        matches!(self, Opcode::Write | Opcode::ReadResponse)
    }

    /// The untagged queue an untagged opcode uses (RFC 5040 §5.1).
    pub fn queue(self) -> Option<u32> {
        match self {
            Opcode::Write | Opcode::ReadResponse => None,
            Opcode::ReadRequest => Some(crate::ddp::QN_READ_REQUEST),
            Opcode::Terminate => Some(crate::ddp::QN_TERMINATE),
            Opcode::Send | Opcode::SendInvalidate | Opcode::SendSe | Opcode::SendSeInvalidate => {
                Some(crate::ddp::QN_SEND)
            }
        }
    }

    /// A Send variant (consumes a posted receive).
    pub fn is_send(self) -> bool {
        matches!(
            self,
            Opcode::Send | Opcode::SendInvalidate | Opcode::SendSe | Opcode::SendSeInvalidate
        )
    }

    /// Send with Solicited Event.
    pub fn solicited(self) -> bool {
        matches!(self, Opcode::SendSe | Opcode::SendSeInvalidate)
    }

    /// Send with Invalidate: the RsvdULP field names an STag to invalidate.
    pub fn invalidates(self) -> bool {
        matches!(self, Opcode::SendInvalidate | Opcode::SendSeInvalidate)
    }
}

/// The RDMAP control byte for `opcode` (RV 1, reserved bits zero).
pub fn ctrl_byte(opcode: Opcode) -> u8 {
    (RDMAP_VERSION << 6) | opcode.as_u8()
}

/// The opcode of an RDMAP control byte; RV must be 1, the two reserved bits are not checked
/// (sent as zero, RFC 5040 §4.2).
pub fn parse_ctrl(byte: u8) -> Result<Opcode, WireError> {
    let version = byte >> 6;
    if version != RDMAP_VERSION {
        return Err(WireError::RdmapVersion { version });
    }
    Opcode::from_u8(byte & 0x0f)
}

mod field {
    use std::ops::Range;
    pub const SINK_STAG: Range<usize> = 0..4;
    pub const SINK_TO: Range<usize> = 4..12;
    pub const SIZE: Range<usize> = 12..16;
    pub const SOURCE_STAG: Range<usize> = 16..20;
    pub const SOURCE_TO: Range<usize> = 20..28;
}

/// A zero-copy view of an RDMA Read Request header (the untagged payload on queue 1).
#[derive(Debug, Clone)]
pub struct ReadRequest<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ReadRequest<T> {
    /// Wraps a buffer without checking it.
    pub fn new_unchecked(buffer: T) -> ReadRequest<T> {
        ReadRequest { buffer }
    }

    /// Wraps a buffer of at least [`READ_REQUEST_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<ReadRequest<T>, WireError> {
        let r = ReadRequest::new_unchecked(buffer);
        r.check_len()?;
        Ok(r)
    }

    /// Checks the length.
    pub fn check_len(&self) -> Result<(), WireError> {
        let have = self.buffer.as_ref().len();
        if have < READ_REQUEST_LEN {
            return Err(WireError::Truncated {
                what: "RDMA Read Request",
                need: READ_REQUEST_LEN,
                have,
            });
        }
        Ok(())
    }

    /// Data Sink STag: where the requester wants the data (the Read Responses' STag).
    pub fn sink_stag(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::SINK_STAG)
    }

    /// Data Sink Tagged Offset.
    pub fn sink_to(&self) -> u64 {
        u64_at(self.buffer.as_ref(), field::SINK_TO)
    }

    /// RDMA Read Message Size.
    pub fn size(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::SIZE)
    }

    /// Data Source STag: the responder's buffer to read.
    pub fn source_stag(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::SOURCE_STAG)
    }

    /// Data Source Tagged Offset.
    pub fn source_to(&self) -> u64 {
        u64_at(self.buffer.as_ref(), field::SOURCE_TO)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ReadRequest<T> {
    /// Sets the Data Sink STag.
    pub fn set_sink_stag(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::SINK_STAG, v)
    }

    /// Sets the Data Sink Tagged Offset.
    pub fn set_sink_to(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::SINK_TO, v)
    }

    /// Sets the RDMA Read Message Size.
    pub fn set_size(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::SIZE, v)
    }

    /// Sets the Data Source STag.
    pub fn set_source_stag(&mut self, v: u32) {
        set_u32(self.buffer.as_mut(), field::SOURCE_STAG, v)
    }

    /// Sets the Data Source Tagged Offset.
    pub fn set_source_to(&mut self, v: u64) {
        set_u64(self.buffer.as_mut(), field::SOURCE_TO, v)
    }
}

/// The meaning of an RDMA Read Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReadRequestRepr {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub size: u32,
    pub source_stag: u32,
    pub source_to: u64,
}

impl ReadRequestRepr {
    /// Parses a Read Request header.
    pub fn parse<T: AsRef<[u8]>>(r: &ReadRequest<T>) -> Result<ReadRequestRepr, WireError> {
        r.check_len()?;
        Ok(ReadRequestRepr {
            sink_stag: r.sink_stag(),
            sink_to: r.sink_to(),
            size: r.size(),
            source_stag: r.source_stag(),
            source_to: r.source_to(),
        })
    }

    /// Bytes [`ReadRequestRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        READ_REQUEST_LEN
    }

    /// Writes the header at the front of the view's buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        r: &mut ReadRequest<T>,
    ) -> Result<(), WireError> {
        r.check_len()?;
        r.set_sink_stag(self.sink_stag);
        r.set_sink_to(self.sink_to);
        r.set_size(self.size);
        r.set_source_stag(self.source_stag);
        r.set_source_to(self.source_to);
        Ok(())
    }

    /// The header in a new buffer.
    pub fn to_bytes(&self) -> [u8; READ_REQUEST_LEN] {
        let mut out = [0u8; READ_REQUEST_LEN];
        // The buffer is exactly READ_REQUEST_LEN long: emit cannot fail.
        let _ = self.emit(&mut ReadRequest::new_unchecked(&mut out[..]));
        out
    }
}
