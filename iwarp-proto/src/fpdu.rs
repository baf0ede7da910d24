//! MPA Full Operation framing (RFC 5044 §4, no markers): every DDP segment travels as one
//! FPDU
//!
//! ```text
//!  0                   1                   2                   3
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |          ULPDU_LENGTH         |                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+                               +
//! ~                 ULPDU (the DDP segment) ...     + PAD (0-3)   ~
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                              CRC                              |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//!
//! `ULPDU_LENGTH` is big-endian and counts the ULPDU only; the pad makes header + ULPDU a
//! multiple of 4 bytes. The CRC is CRC32c (the iSCSI polynomial, RFC 3720 B.4) over header,
//! ULPDU and pad, computed LSB-first and sent least significant byte first — what Linux siw
//! (the kernel's `crc32c` shash) and Wireshark's dissector do. When CRC was not negotiated
//! the field is still present (RFC 5044 §4.1): vrdma sends zero (as siw does) and ignores it
//! on receive.

use std::ops::Range;

use crate::WireError;

/// The `ULPDU_LENGTH` field.
pub const HEADER_LEN: usize = 2;
/// The CRC field.
pub const CRC_LEN: usize = 4;
/// The largest ULPDU the 16-bit length can announce.
pub const MAX_ULPDU_LEN: usize = u16::MAX as usize;
/// The largest ULPDU whose FPDU needs no pad (what [`mulpdu`] caps at for GSO-sized MSS).
pub const MAX_PADLESS_ULPDU_LEN: usize = 65530;

/// Pad bytes after a ULPDU of `ulpdu_len` bytes (header + ULPDU + pad is a multiple of 4).
pub fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (HEADER_LEN + ulpdu_len) % 4) % 4
}

/// Bytes on the wire of the FPDU carrying a ULPDU of `ulpdu_len` bytes.
pub fn fpdu_len(ulpdu_len: usize) -> usize {
    HEADER_LEN + ulpdu_len + pad_len(ulpdu_len) + CRC_LEN
}

/// The largest ULPDU (MULPDU) that fills, and does not exceed, one TCP segment of `mss`
/// payload bytes, without markers (RFC 5044 §8.1.1: `EMSS - (6 + EMSS mod 4)`): the FPDU then
/// takes `mss - mss % 4` bytes and needs no pad. 0 for an MSS too small to frame anything.
pub fn mulpdu(mss: usize) -> usize {
    mss.saturating_sub(HEADER_LEN + CRC_LEN + mss % 4)
        .min(MAX_PADLESS_ULPDU_LEN)
}

/// The MULPDU Linux siw uses for the same MSS: it first rounds the segment length down to a
/// multiple of 8 (`siw_update_tcpseg`), so its FPDUs are up to 4 bytes shorter than
/// [`mulpdu`]'s. Either is valid on the wire; a receiver takes any length up to its limit.
pub fn mulpdu_siw(mss: usize) -> usize {
    (mss & !7)
        .saturating_sub(HEADER_LEN + CRC_LEN)
        .min(MAX_PADLESS_ULPDU_LEN)
}

/// The bytes that carry a CRC32c value in an FPDU (least significant byte first).
pub fn crc_to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// The CRC32c value in an FPDU's CRC field.
pub fn crc_from_wire(bytes: [u8; 4]) -> u32 {
    u32::from_le_bytes(bytes)
}

/// A CRC32c computed piece by piece: the header, then payload slices straight from where
/// they live (guest pages), then the pad — without gathering them into one buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FpduCrc {
    crc: u32,
}

impl FpduCrc {
    /// The CRC of nothing.
    pub fn new() -> FpduCrc {
        FpduCrc { crc: 0 }
    }

    /// Continues from `crc`, the CRC32c of the FPDU's bytes so far: the value of
    /// [`FpduCrc::value`], or of another implementation of the same CRC (as
    /// `crc32c::crc32c_append` defines it) that read bytes the codec never sees as a slice —
    /// guest memory checksummed where it lies.
    pub fn from_value(crc: u32) -> FpduCrc {
        FpduCrc { crc }
    }

    /// Adds the next bytes of the FPDU.
    pub fn update(&mut self, bytes: &[u8]) {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
    }

    /// Adds the pad after a ULPDU of `ulpdu_len` bytes (zeros).
    pub fn update_pad(&mut self, ulpdu_len: usize) {
        self.update(&[0u8; 3][..pad_len(ulpdu_len)]);
    }

    /// The CRC32c of everything added so far.
    pub fn value(&self) -> u32 {
        self.crc
    }

    /// [`FpduCrc::value`] as the four bytes of the CRC field.
    pub fn to_wire(&self) -> [u8; 4] {
        crc_to_wire(self.crc)
    }

    /// For a receiver that placed the ULPDU where it belongs and fed it here piece by piece
    /// (length field, header, payload): checks `trailer`, the pad and CRC field as received
    /// after a ULPDU of `ulpdu_len` bytes. The pad counts as received, as
    /// [`Fpdu::check_crc`] counts it.
    pub fn check_trailer(&self, ulpdu_len: usize, trailer: &[u8]) -> Result<(), WireError> {
        let pad = pad_len(ulpdu_len);
        if trailer.len() != pad + CRC_LEN {
            return Err(WireError::Malformed {
                what: "FPDU trailer",
                why: "not the pad and CRC field its ULPDU length calls for",
            });
        }
        let mut raw = [0u8; CRC_LEN];
        raw.copy_from_slice(&trailer[pad..]);
        let mut c = *self;
        c.update(&trailer[..pad]);
        let (computed, received) = (c.value(), crc_from_wire(raw));
        if computed != received {
            return Err(WireError::BadCrc { computed, received });
        }
        Ok(())
    }
}

/// The pad and CRC field that end an FPDU, for a sender that writes the header, then the
/// payload from where it lives, then these bytes (one `writev`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    bytes: [u8; 7],
    len: usize,
}

impl Trailer {
    /// The trailer of an FPDU whose length field and ULPDU (`ulpdu_len` bytes) `crc` has
    /// seen; with `crc_on` false the CRC field is zero.
    pub fn new(ulpdu_len: usize, crc: &FpduCrc, crc_on: bool) -> Trailer {
        let pad = pad_len(ulpdu_len);
        let mut bytes = [0u8; 7];
        if crc_on {
            let mut c = *crc;
            c.update_pad(ulpdu_len);
            bytes[pad..pad + CRC_LEN].copy_from_slice(&c.to_wire());
        }
        Trailer {
            bytes,
            len: pad + CRC_LEN,
        }
    }

    /// Pad then CRC field.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// What the front of a byte stream holds, from [`frame_len`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// At least this many more bytes are needed to know or to hold the next FPDU.
    Need(usize),
    /// A whole FPDU of this many bytes is at the front.
    Complete(usize),
}

/// Looks at the front of a stream: how long the next FPDU is, and whether it is all there.
/// A `ULPDU_LENGTH` above `max_ulpdu` is refused as soon as its two bytes arrive, so a peer
/// cannot make the receiver buffer more than it agreed to.
pub fn frame_len(stream: &[u8], max_ulpdu: usize) -> Result<Framing, WireError> {
    if stream.len() < HEADER_LEN {
        return Ok(Framing::Need(HEADER_LEN - stream.len()));
    }
    let ulpdu_len = usize::from(u16::from_be_bytes([stream[0], stream[1]]));
    if ulpdu_len > max_ulpdu {
        return Err(WireError::TooLong {
            what: "FPDU ULPDU",
            len: ulpdu_len,
            max: max_ulpdu,
        });
    }
    let total = fpdu_len(ulpdu_len);
    Ok(if stream.len() < total {
        Framing::Need(total - stream.len())
    } else {
        Framing::Complete(total)
    })
}

/// A zero-copy view of one FPDU at the front of a buffer (which may hold more after it).
#[derive(Debug, Clone)]
pub struct Fpdu<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Fpdu<T> {
    /// Wraps a buffer without checking it; accessors may panic until [`Fpdu::check_len`]
    /// passes. For emitting into a buffer of [`FpduRepr::buffer_len`] bytes.
    pub fn new_unchecked(buffer: T) -> Fpdu<T> {
        Fpdu { buffer }
    }

    /// Wraps a buffer that holds a whole FPDU as its length field announces.
    pub fn new_checked(buffer: T) -> Result<Fpdu<T>, WireError> {
        let fpdu = Fpdu::new_unchecked(buffer);
        fpdu.check_len()?;
        Ok(fpdu)
    }

    /// Checks that the header and everything it announces (ULPDU, pad, CRC) are present.
    pub fn check_len(&self) -> Result<(), WireError> {
        let bytes = self.buffer.as_ref();
        let need = if bytes.len() < HEADER_LEN {
            HEADER_LEN
        } else {
            fpdu_len(self.ulpdu_len())
        };
        if bytes.len() < need {
            return Err(WireError::Truncated {
                what: "FPDU",
                need,
                have: bytes.len(),
            });
        }
        Ok(())
    }

    /// The `ULPDU_LENGTH` field.
    pub fn ulpdu_len(&self) -> usize {
        let b = self.buffer.as_ref();
        usize::from(u16::from_be_bytes([b[0], b[1]]))
    }

    /// Header + ULPDU + pad + CRC.
    pub fn total_len(&self) -> usize {
        fpdu_len(self.ulpdu_len())
    }

    fn ulpdu_range(&self) -> Range<usize> {
        HEADER_LEN..HEADER_LEN + self.ulpdu_len()
    }

    fn crc_range(&self) -> Range<usize> {
        let end = self.total_len();
        end - CRC_LEN..end
    }

    /// The ULPDU (the DDP segment).
    pub fn ulpdu(&self) -> &[u8] {
        &self.buffer.as_ref()[self.ulpdu_range()]
    }

    /// The pad bytes.
    pub fn pad(&self) -> &[u8] {
        let start = self.ulpdu_range().end;
        &self.buffer.as_ref()[start..self.crc_range().start]
    }

    /// The CRC field as a CRC32c value.
    pub fn crc_field(&self) -> u32 {
        let mut raw = [0u8; 4];
        raw.copy_from_slice(&self.buffer.as_ref()[self.crc_range()]);
        crc_from_wire(raw)
    }

    /// The CRC32c of header, ULPDU and pad as they are in the buffer.
    pub fn compute_crc(&self) -> u32 {
        crc32c::crc32c(&self.buffer.as_ref()[..self.crc_range().start])
    }

    /// Checks the CRC field against the contents.
    pub fn check_crc(&self) -> Result<(), WireError> {
        let (computed, received) = (self.compute_crc(), self.crc_field());
        if computed != received {
            return Err(WireError::BadCrc { computed, received });
        }
        Ok(())
    }

    /// The buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Fpdu<T> {
    /// Sets `ULPDU_LENGTH`.
    pub fn set_ulpdu_len(&mut self, len: u16) {
        self.buffer.as_mut()[..HEADER_LEN].copy_from_slice(&len.to_be_bytes());
    }

    /// The ULPDU, to fill in place.
    pub fn ulpdu_mut(&mut self) -> &mut [u8] {
        let r = self.ulpdu_range();
        &mut self.buffer.as_mut()[r]
    }

    /// Zeroes the pad and writes the CRC field: the CRC32c when `crc`, else zero.
    pub fn fill_trailer(&mut self, crc: bool) {
        let pad = self.ulpdu_range().end..self.crc_range().start;
        self.buffer.as_mut()[pad].fill(0);
        let value = if crc { self.compute_crc() } else { 0 };
        let r = self.crc_range();
        self.buffer.as_mut()[r].copy_from_slice(&crc_to_wire(value));
    }
}

/// The meaning of an FPDU: its ULPDU. The pad and CRC are framing, rebuilt on emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FpduRepr<'a> {
    pub ulpdu: &'a [u8],
}

impl<'a> FpduRepr<'a> {
    /// The ULPDU of a checked FPDU; with `crc` the CRC field must match (a mismatch is an MPA
    /// error: the connection is terminated, RFC 5044 §8), without it the field is ignored.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        fpdu: &Fpdu<&'a T>,
        crc: bool,
    ) -> Result<FpduRepr<'a>, WireError> {
        fpdu.check_len()?;
        if crc {
            fpdu.check_crc()?;
        }
        let bytes: &'a [u8] = (*fpdu.buffer).as_ref();
        Ok(FpduRepr {
            ulpdu: &bytes[HEADER_LEN..HEADER_LEN + fpdu.ulpdu_len()],
        })
    }

    /// Bytes [`FpduRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        fpdu_len(self.ulpdu.len())
    }

    /// Writes the FPDU at the front of the view's buffer.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        fpdu: &mut Fpdu<T>,
        crc: bool,
    ) -> Result<(), WireError> {
        let len = u16::try_from(self.ulpdu.len()).map_err(|_| WireError::TooLong {
            what: "FPDU ULPDU",
            len: self.ulpdu.len(),
            max: MAX_ULPDU_LEN,
        })?;
        let have = fpdu.buffer.as_ref().len();
        if have < self.buffer_len() {
            return Err(WireError::Truncated {
                what: "FPDU buffer",
                need: self.buffer_len(),
                have,
            });
        }
        fpdu.set_ulpdu_len(len);
        fpdu.ulpdu_mut().copy_from_slice(self.ulpdu);
        fpdu.fill_trailer(crc);
        Ok(())
    }

    /// The FPDU in a new buffer.
    pub fn to_vec(&self, crc: bool) -> Result<Vec<u8>, WireError> {
        let mut out = vec![0u8; self.buffer_len()];
        self.emit(&mut Fpdu::new_unchecked(&mut out[..]), crc)?;
        Ok(out)
    }
}

/// Reassembles FPDUs from a TCP byte stream for a receiver that copies: push what the socket
/// gave, take whole ULPDUs out (CRC checked when negotiated). A receiver that places payload
/// straight into memory uses [`frame_len`] and [`FpduCrc`] on its own reads instead.
#[derive(Debug)]
pub struct FpduDecoder {
    buf: Vec<u8>,
    start: usize,
    max_ulpdu: usize,
    crc: bool,
}

impl FpduDecoder {
    /// A decoder refusing ULPDUs above `max_ulpdu` bytes; `crc` as negotiated.
    pub fn new(max_ulpdu: usize, crc: bool) -> FpduDecoder {
        FpduDecoder {
            buf: Vec::new(),
            start: 0,
            max_ulpdu,
            crc,
        }
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        // Drop what was returned before it outweighs what is kept.
        if self.start > 0 && (self.start == self.buf.len() || self.start >= self.buf.len() / 2) {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes buffered and not yet returned.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// What the front of the buffer holds: how many more bytes the next FPDU needs.
    pub fn framing(&self) -> Result<Framing, WireError> {
        frame_len(&self.buf[self.start..], self.max_ulpdu)
    }

    /// The next whole FPDU's ULPDU, if one is buffered. After an error the stream is
    /// unusable (the peer broke framing): the caller terminates the connection.
    pub fn next_ulpdu(&mut self) -> Result<Option<&[u8]>, WireError> {
        let total = match self.framing()? {
            Framing::Need(_) => return Ok(None),
            Framing::Complete(total) => total,
        };
        let at = self.start;
        let fpdu = Fpdu::new_checked(&self.buf[at..at + total])?;
        if self.crc {
            fpdu.check_crc()?;
        }
        let ulpdu_len = fpdu.ulpdu_len();
        self.start += total;
        Ok(Some(
            &self.buf[at + HEADER_LEN..at + HEADER_LEN + ulpdu_len],
        ))
    }
}
