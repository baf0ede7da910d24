//! The few fixed headers the data path reads and writes: MPA FPDU framing (RFC 5044 §4),
//! DDP tagged/untagged headers (RFC 5041 §4), RDMAP opcodes, the Read Request and the
//! Terminate message (RFC 5040 §4). A minimal stand-in for the `iwarp-proto` codec, which is
//! written in parallel; every parse here checks lengths and never panics.

/// The MPA ULPDU length field.
pub(crate) const MPA_LEN: usize = 2;
/// The MPA CRC field (always present; zero when CRCs are off).
pub(crate) const CRC_LEN: usize = 4;
pub(crate) const TAGGED_LEN: usize = 14;
pub(crate) const UNTAGGED_LEN: usize = 18;
/// Read Request body: sink STag, sink TO, size, source STag, source TO.
pub(crate) const READ_REQ_LEN: usize = 28;
/// Largest ULPDU whose body is read into a private buffer (Read Request, Terminate).
pub(crate) const MAX_PRIVATE_ULPDU: usize = 96;

/// RDMAP opcodes (RFC 5040 §4.3); the Send with Invalidate ones (4, 6) are refused.
pub(crate) mod op {
    pub(crate) const WRITE: u8 = 0;
    pub(crate) const READ_REQ: u8 = 1;
    pub(crate) const READ_RESP: u8 = 2;
    pub(crate) const SEND: u8 = 3;
    pub(crate) const SEND_SE: u8 = 5;
    pub(crate) const TERMINATE: u8 = 7;
}

/// Untagged queue numbers (RFC 5040 §5.1).
pub(crate) const QN_SEND: u32 = 0;
pub(crate) const QN_READ: u32 = 1;
pub(crate) const QN_TERM: u32 = 2;

/// Pad bytes after a ULPDU of `ulpdu` bytes (the length field counts in the alignment).
pub(crate) fn pad(ulpdu: usize) -> usize {
    (4 - (MPA_LEN + ulpdu) % 4) % 4
}

/// The DDP part of a segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ddp {
    Tagged { stag: u32, to: u64 },
    Untagged { qn: u32, msn: u32, mo: u32 },
}

/// A DDP segment header with its RDMAP control byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hdr {
    pub(crate) last: bool,
    pub(crate) opcode: u8,
    pub(crate) ddp: Ddp,
}

impl Hdr {
    pub(crate) fn len(&self) -> usize {
        match self.ddp {
            Ddp::Tagged { .. } => TAGGED_LEN,
            Ddp::Untagged { .. } => UNTAGGED_LEN,
        }
    }

    /// Appends the header (DDP version 1, RDMAP version 1) to `out`.
    pub(crate) fn emit(&self, out: &mut Vec<u8>) {
        let tagged = matches!(self.ddp, Ddp::Tagged { .. });
        out.push(u8::from(tagged) << 7 | u8::from(self.last) << 6 | 1);
        out.push(1 << 6 | (self.opcode & 0xf));
        match self.ddp {
            Ddp::Tagged { stag, to } => {
                out.extend_from_slice(&stag.to_be_bytes());
                out.extend_from_slice(&to.to_be_bytes());
            }
            Ddp::Untagged { qn, msn, mo } => {
                out.extend_from_slice(&0u32.to_be_bytes());
                out.extend_from_slice(&qn.to_be_bytes());
                out.extend_from_slice(&msn.to_be_bytes());
                out.extend_from_slice(&mo.to_be_bytes());
            }
        }
    }

    /// Bytes of DDP header that `first` (at least 2 bytes: the DDP control byte and the
    /// RDMAP control byte) announces.
    pub(crate) fn len_of(first: u8) -> usize {
        if first & 0x80 != 0 {
            TAGGED_LEN
        } else {
            UNTAGGED_LEN
        }
    }

    /// Parses a DDP segment header (`b` holds at least [`Self::len_of`] bytes).
    pub(crate) fn parse(b: &[u8]) -> Result<Hdr, Term> {
        let tagged = b.first().is_some_and(|c| c & 0x80 != 0);
        let need = if tagged { TAGGED_LEN } else { UNTAGGED_LEN };
        if b.len() < need {
            return Err(Term::MALFORMED);
        }
        if b[0] & 0x3 != 1 {
            return Err(if tagged {
                Term::DDP_T_VERSION
            } else {
                Term::DDP_UT_VERSION
            });
        }
        if b[1] >> 6 != 1 {
            return Err(Term::RDMAP_VERSION);
        }
        let be32 = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let ddp = if tagged {
            let mut to = [0u8; 8];
            to.copy_from_slice(&b[6..14]);
            Ddp::Tagged {
                stag: be32(2),
                to: u64::from_be_bytes(to),
            }
        } else {
            Ddp::Untagged {
                qn: be32(6),
                msn: be32(10),
                mo: be32(14),
            }
        };
        Ok(Hdr {
            last: b[0] & 0x40 != 0,
            opcode: b[1] & 0xf,
            ddp,
        })
    }
}

/// The body of an RDMA Read Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadReq {
    pub(crate) sink_stag: u32,
    pub(crate) sink_to: u64,
    pub(crate) len: u32,
    pub(crate) src_stag: u32,
    pub(crate) src_to: u64,
}

impl ReadReq {
    pub(crate) fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.sink_stag.to_be_bytes());
        out.extend_from_slice(&self.sink_to.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
        out.extend_from_slice(&self.src_stag.to_be_bytes());
        out.extend_from_slice(&self.src_to.to_be_bytes());
    }

    pub(crate) fn parse(b: &[u8]) -> Option<ReadReq> {
        if b.len() != READ_REQ_LEN {
            return None;
        }
        let be32 = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let be64 = |i: usize| u64::from(be32(i)) << 32 | u64::from(be32(i + 4));
        Some(ReadReq {
            sink_stag: be32(0),
            sink_to: be64(4),
            len: be32(12),
            src_stag: be32(16),
            src_to: be64(20),
        })
    }
}

/// Layer, error type and code of a Terminate message (RFC 5040 §7, RFC 5041 §7,
/// RFC 5044 §8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Term {
    pub(crate) layer: u8,
    pub(crate) etype: u8,
    pub(crate) code: u8,
}

const RDMAP: u8 = 0;
const DDP: u8 = 1;
const LLP: u8 = 2;

impl Term {
    const fn new(layer: u8, etype: u8, code: u8) -> Term {
        Term { layer, etype, code }
    }
    // RDMAP: remote protection error (etype 1) and remote operation error (etype 2).
    pub(crate) const RDMAP_INVALID_STAG: Term = Term::new(RDMAP, 1, 0x00);
    pub(crate) const RDMAP_BOUNDS: Term = Term::new(RDMAP, 1, 0x01);
    pub(crate) const RDMAP_ACCESS: Term = Term::new(RDMAP, 1, 0x02);
    pub(crate) const RDMAP_VERSION: Term = Term::new(RDMAP, 2, 0x05);
    pub(crate) const RDMAP_OPCODE: Term = Term::new(RDMAP, 2, 0x06);
    pub(crate) const RDMAP_LOCAL_CATASTROPHIC: Term = Term::new(RDMAP, 0, 0x00);
    pub(crate) const RDMAP_UNSPECIFIED: Term = Term::new(RDMAP, 2, 0xff);
    // DDP tagged buffer errors (etype 1).
    pub(crate) const DDP_T_INVALID_STAG: Term = Term::new(DDP, 1, 0x00);
    pub(crate) const DDP_T_BOUNDS: Term = Term::new(DDP, 1, 0x01);
    pub(crate) const DDP_T_VERSION: Term = Term::new(DDP, 1, 0x04);
    // DDP untagged buffer errors (etype 2).
    pub(crate) const DDP_UT_QN: Term = Term::new(DDP, 2, 0x01);
    pub(crate) const DDP_UT_MSN_RANGE: Term = Term::new(DDP, 2, 0x03);
    pub(crate) const DDP_UT_MO: Term = Term::new(DDP, 2, 0x04);
    pub(crate) const DDP_UT_TOO_LONG: Term = Term::new(DDP, 2, 0x05);
    pub(crate) const DDP_UT_VERSION: Term = Term::new(DDP, 2, 0x06);
    // LLP (MPA) errors (etype 0).
    pub(crate) const MPA_CRC: Term = Term::new(LLP, 0, 0x02);
    /// A frame that is not one (truncated header, length field and content disagree):
    /// RDMAP's catastrophic error localized to the stream, as the `iwarp-proto` codec maps it.
    pub(crate) const MALFORMED: Term = Term::new(RDMAP, 2, 0x07);

    /// The completion status a requester gives its failed work request when the peer
    /// terminated the stream with this error (the statuses of the intra-host path).
    pub(crate) fn status(&self) -> shared_ring::abi::cqe::CqeStatus {
        use shared_ring::abi::cqe::CqeStatus;
        match (self.layer, self.etype) {
            (RDMAP, 1) | (DDP, 1) => CqeStatus::RemoteAccessError,
            (DDP, 2) => CqeStatus::RemoteInvalidRequest,
            _ => CqeStatus::RemoteOperationError,
        }
    }

    /// The Terminate message's body: the control word, then the segment that caused it
    /// (`seg`: its MPA length field and DDP header, with the M and D flags, as siw quotes it)
    /// and the Read Request body (`rdmap`, with R).
    pub(crate) fn emit_body(&self, seg: Option<&[u8]>, rdmap: Option<&[u8]>, out: &mut Vec<u8>) {
        let mut w = u32::from(self.layer & 0xf) << 28
            | u32::from(self.etype & 0xf) << 24
            | u32::from(self.code) << 16;
        if seg.is_some() {
            w |= 1 << 15 | 1 << 14;
        }
        if rdmap.is_some() {
            w |= 1 << 13;
        }
        out.extend_from_slice(&w.to_be_bytes());
        out.extend_from_slice(seg.unwrap_or(&[]));
        out.extend_from_slice(rdmap.unwrap_or(&[]));
    }

    /// Parses a Terminate body's control word.
    pub(crate) fn parse_body(b: &[u8]) -> Option<Term> {
        let w = u32::from_be_bytes(b.get(..4)?.try_into().ok()?);
        Some(Term::new(
            (w >> 28) as u8,
            (w >> 24) as u8 & 0xf,
            (w >> 16) as u8,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_emit_and_parse_back() {
        for h in [
            Hdr {
                last: true,
                opcode: op::WRITE,
                ddp: Ddp::Tagged {
                    stag: 0x1234_5679,
                    to: 0x0102_0304_0506_0708,
                },
            },
            Hdr {
                last: false,
                opcode: op::SEND_SE,
                ddp: Ddp::Untagged {
                    qn: 0,
                    msn: 7,
                    mo: 8192,
                },
            },
        ] {
            let mut b = Vec::new();
            h.emit(&mut b);
            assert_eq!(b.len(), h.len());
            assert_eq!(Hdr::len_of(b[0]), h.len());
            assert_eq!(Hdr::parse(&b), Ok(h));
        }
        // A tagged last WRITE: T|L|DV=1, RV=1 opcode 0, as RFC 5041 §4.2 lays it out.
        let mut b = Vec::new();
        Hdr {
            last: true,
            opcode: op::WRITE,
            ddp: Ddp::Tagged { stag: 1, to: 2 },
        }
        .emit(&mut b);
        assert_eq!(b[..6], [0xc1, 0x40, 0, 0, 0, 1]);
        assert_eq!(Hdr::parse(&[0xc2, 0x40]), Err(Term::MALFORMED));
        b[0] = 0xc2;
        assert_eq!(Hdr::parse(&b), Err(Term::DDP_T_VERSION));
        b[0] = 0xc1;
        b[1] = 0x80;
        assert_eq!(Hdr::parse(&b), Err(Term::RDMAP_VERSION));
    }

    #[test]
    fn read_request_and_terminate_round_trip() {
        let r = ReadReq {
            sink_stag: 2,
            sink_to: 3 << 40,
            len: 4096,
            src_stag: 5,
            src_to: 6,
        };
        let mut b = Vec::new();
        r.emit(&mut b);
        assert_eq!(ReadReq::parse(&b), Some(r));
        assert_eq!(ReadReq::parse(&b[1..]), None);
        let mut t = Vec::new();
        Term::DDP_T_BOUNDS.emit_body(Some(&[9; MPA_LEN + TAGGED_LEN]), None, &mut t);
        assert_eq!(t[..4], [0x11, 0x01, 0xc0, 0x00]);
        assert_eq!(t.len(), 4 + MPA_LEN + TAGGED_LEN);
        assert_eq!(Term::parse_body(&t), Some(Term::DDP_T_BOUNDS));
        assert_eq!(Term::parse_body(&t[..3]), None);
        assert_eq!(pad(18), 0);
        assert_eq!(pad(14 + 1), 3);
    }
}
