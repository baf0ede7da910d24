//! The iWARP wire codec, smoltcp-style (as `xenstore-proto/src/wire`): zero-copy views over
//! bytes plus `Repr` types that parse and emit them, for the three layers the software device
//! speaks over TCP:
//!
//! * [`mpa`] — MPA connection setup (RFC 5044, revision 2 "enhanced" as RFC 6581): the
//!   request/reply frames with their key, M/C/R/Enhanced flags, revision, private data and the
//!   enhanced IRD/ORD + RTR word.
//! * [`fpdu`] — MPA Full Operation framing: ULPDU length, pad to 4 bytes, CRC32c.
//! * [`ddp`] and [`rdmap`] — DDP tagged/untagged headers (RFC 5041) and RDMAP opcodes and
//!   headers (RFC 5040); [`terminate`] — the Terminate message.
//!
//! Everything that arrives from a peer goes through a `new_checked` view and `parse`, which
//! return [`WireError`] and never panic, whatever the bytes.

#![forbid(unsafe_code)]

pub mod ddp;
pub mod fpdu;
pub mod mpa;
pub mod rdmap;
pub mod terminate;

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
}
