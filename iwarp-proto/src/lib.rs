//! The iWARP wire codec, smoltcp-style (as `xenstore-proto/src/wire`): zero-copy views over
//! bytes plus `Repr` types that parse and emit them, for the three layers the software device
//! speaks over TCP:
//!
//! * [`mpa`] — MPA connection setup (RFC 5044, revision 2 "enhanced" as RFC 6581): the
//!   request/reply frames with their key, M/C/R/Enhanced flags, revision, private data and the
//!   enhanced IRD/ORD + RTR word.
//! * [`fpdu`] — MPA Full Operation framing: ULPDU length, pad to 4 bytes, CRC32c (also
//!   computed piecewise for zero-copy sends), MULPDU from the MSS, a stream decoder.
//! * [`ddp`] and [`rdmap`] — DDP tagged/untagged headers (RFC 5041) and RDMAP opcodes and
//!   headers (RFC 5040); [`terminate`] — the Terminate message and its error-code triples.
//! * [`message`] — one ULPDU read as an RDMAP message (what the receive path calls per FPDU)
//!   and the headers the send path puts in front of a payload.
//!
//! Everything that arrives from a peer goes through a `new_checked` view and `parse`, which
//! return [`WireError`] and never panic, whatever the bytes; `terminate::TermCode::for_error`
//! turns each error into the Terminate the peer is sent. The wire format, and what vrdma emits
//! and refuses, is in docs/protocol.md ("iWARP wire format").

#![forbid(unsafe_code)]

pub mod ddp;
pub mod fpdu;
pub mod message;
pub mod mpa;
pub mod rdmap;
pub mod terminate;

/// Big-endian field access for the views (every iWARP field is in network order).
pub(crate) mod be {
    use std::ops::Range;

    pub fn u32_at(bytes: &[u8], r: Range<usize>) -> u32 {
        let mut raw = [0u8; 4];
        raw.copy_from_slice(&bytes[r]);
        u32::from_be_bytes(raw)
    }

    pub fn u64_at(bytes: &[u8], r: Range<usize>) -> u64 {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&bytes[r]);
        u64::from_be_bytes(raw)
    }

    pub fn set_u32(bytes: &mut [u8], r: Range<usize>, v: u32) {
        bytes[r].copy_from_slice(&v.to_be_bytes());
    }

    pub fn set_u64(bytes: &mut [u8], r: Range<usize>, v: u64) {
        bytes[r].copy_from_slice(&v.to_be_bytes());
    }
}

/// Why bytes from a peer are not a valid iWARP frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the frame's fixed part, or than its length field announces.
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    /// A field has a value the protocol does not allow.
    #[error("malformed {what}: {why}")]
    Malformed {
        what: &'static str,
        why: &'static str,
    },
    /// A code point this codec does not know.
    #[error("unknown {what} {value}")]
    Unknown { what: &'static str, value: u32 },
    /// The FPDU's CRC32c does not match its contents.
    #[error("CRC mismatch: computed {computed:#010x}, received {received:#010x}")]
    BadCrc { computed: u32, received: u32 },
    /// A length field announces more than this end accepts (an FPDU above the negotiated
    /// maximum, a message longer than the buffer) — refused before any byte is buffered.
    #[error("{what} too long: {len} bytes, at most {max}")]
    TooLong {
        what: &'static str,
        len: usize,
        max: usize,
    },
    /// The DDP version (DV) is not 1 (RFC 5041 §4.2); `tagged` is the segment's T bit, which
    /// picks the Terminate code.
    #[error("DDP version {version}, expected 1")]
    DdpVersion { tagged: bool, version: u8 },
    /// The RDMAP version (RV) is not 1 (RFC 5040 §4.2).
    #[error("RDMAP version {version}, expected 1")]
    RdmapVersion { version: u8 },
    /// An RDMAP opcode this codec does not know, or one carried in the wrong buffer model
    /// (a tagged Send, an untagged Write).
    #[error("unexpected RDMAP opcode {opcode}: {why}")]
    UnexpectedOpcode { opcode: u8, why: &'static str },
    /// An untagged segment on a queue its opcode does not use (RFC 5040 §5.1: Send on 0,
    /// Read Request on 1, Terminate on 2).
    #[error("invalid DDP queue number {qn} for this message")]
    InvalidQn { qn: u32 },
}
