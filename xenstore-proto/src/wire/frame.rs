//! `struct xsd_sockmsg` framing: the zero-copy view, the header representation, and a
//! streaming decoder for byte streams (sockets, `/dev/xen/xenbus`).

use super::{MsgType, WireError, PAYLOAD_MAX};

/// Size of `struct xsd_sockmsg`.
pub const HEADER_LEN: usize = 16;

mod field {
    use std::ops::Range;
    pub const TYPE: Range<usize> = 0..4;
    pub const REQ_ID: Range<usize> = 4..8;
    pub const TX_ID: Range<usize> = 8..12;
    pub const LEN: Range<usize> = 12..16;
}

/// A zero-copy view of one framed message: header then payload.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

fn u32_at(bytes: &[u8], range: std::ops::Range<usize>) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[range]);
    u32::from_ne_bytes(raw)
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it; getters may panic until [`Packet::check_len`] passes.
    pub fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer holding at least one whole message, whose `len` is within the limit.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the header is present, `len` is within `XENSTORE_PAYLOAD_MAX` and the
    /// buffer holds the whole payload.
    pub fn check_len(&self) -> Result<(), WireError> {
        let bytes = self.buffer.as_ref();
        if bytes.len() < HEADER_LEN {
            return Err(WireError::Truncated {
                need: HEADER_LEN,
                have: bytes.len(),
            });
        }
        let len = u32_at(bytes, field::LEN) as usize;
        if len > PAYLOAD_MAX {
            return Err(WireError::PayloadTooLong(len));
        }
        if bytes.len() < HEADER_LEN + len {
            return Err(WireError::Truncated {
                need: HEADER_LEN + len,
                have: bytes.len(),
            });
        }
        Ok(())
    }

    /// The raw `type` field.
    pub fn msg_type_raw(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::TYPE)
    }

    /// The `type` field, when it names a known type.
    pub fn msg_type(&self) -> Result<MsgType, WireError> {
        MsgType::from_u32(self.msg_type_raw())
    }

    /// `req_id`: echoed by the daemon in its reply.
    pub fn req_id(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::REQ_ID)
    }

    /// `tx_id`: the transaction, 0 for none.
    pub fn tx_id(&self) -> u32 {
        u32_at(self.buffer.as_ref(), field::TX_ID)
    }

    /// `len`: payload length.
    pub fn payload_len(&self) -> usize {
        u32_at(self.buffer.as_ref(), field::LEN) as usize
    }

    /// The payload bytes.
    pub fn payload(&self) -> &[u8] {
        let len = self.payload_len();
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + len]
    }

    /// Header plus payload length in bytes.
    pub fn total_len(&self) -> usize {
        HEADER_LEN + self.payload_len()
    }

    /// The header's meaning.
    pub fn header(&self) -> Result<Header, WireError> {
        Ok(Header {
            msg_type: self.msg_type()?,
            req_id: self.req_id(),
            tx_id: self.tx_id(),
            len: self.payload_len() as u32,
        })
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    fn set_u32(&mut self, range: std::ops::Range<usize>, value: u32) {
        self.buffer.as_mut()[range].copy_from_slice(&value.to_ne_bytes());
    }

    /// Sets the raw `type` field.
    pub fn set_msg_type_raw(&mut self, value: u32) {
        self.set_u32(field::TYPE, value)
    }

    /// Sets `req_id`.
    pub fn set_req_id(&mut self, value: u32) {
        self.set_u32(field::REQ_ID, value)
    }

    /// Sets `tx_id`.
    pub fn set_tx_id(&mut self, value: u32) {
        self.set_u32(field::TX_ID, value)
    }

    /// Sets `len`.
    pub fn set_payload_len(&mut self, value: u32) {
        self.set_u32(field::LEN, value)
    }
}

/// The meaning of a `struct xsd_sockmsg` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub msg_type: MsgType,
    pub req_id: u32,
    pub tx_id: u32,
    pub len: u32,
}

impl Header {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        let mut packet = Packet::new_unchecked(buf);
        packet.set_msg_type_raw(self.msg_type.as_u32());
        packet.set_req_id(self.req_id);
        packet.set_tx_id(self.tx_id);
        packet.set_payload_len(self.len);
    }
}

/// Frames a payload: header followed by the payload bytes.
pub fn encode_frame(
    msg_type: MsgType,
    req_id: u32,
    tx_id: u32,
    payload: &[u8],
) -> Result<Vec<u8>, WireError> {
    if payload.len() > PAYLOAD_MAX {
        return Err(WireError::PayloadTooLong(payload.len()));
    }
    let mut out = vec![0u8; HEADER_LEN + payload.len()];
    Header {
        msg_type,
        req_id,
        tx_id,
        len: payload.len() as u32,
    }
    .emit(&mut out);
    out[HEADER_LEN..].copy_from_slice(payload);
    Ok(out)
}

/// Reassembles whole messages from a byte stream.
///
/// An oversized `len` is reported as soon as the header arrives (xenstored kills such a
/// connection); unknown types are left for the caller, who can still answer with an error
/// carrying the request's `req_id`.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> FrameDecoder {
        FrameDecoder::default()
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered but not yet returned as a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next whole frame (header + payload), if one is buffered.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, WireError> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32_at(&self.buf, field::LEN) as usize;
        if len > PAYLOAD_MAX {
            return Err(WireError::PayloadTooLong(len));
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let rest = self.buf.split_off(HEADER_LEN + len);
        Ok(Some(std::mem::replace(&mut self.buf, rest)))
    }
}
