//! MPA connection setup (RFC 5044 §7.1, enhanced by RFC 6581): the request and reply frames
//! the two ends exchange on a fresh TCP connection before Full Operation.
//!
//! ```text
//!  0 .. 16  key: "MPA ID Req Frame" (request) or "MPA ID Rep Frame" (reply)
//! 16        flags: M 0x80 (markers wanted) | C 0x40 (CRC) | R 0x20 (reject)
//!                  | S 0x10 (enhanced, RFC 6581) | 4 reserved bits
//! 17        revision (1 or 2)
//! 18 .. 20  PD_Length, big-endian, at most 512
//! 20 ..     private data (PD_Length bytes)
//! ```
//!
//! With the enhanced flag (revision 2), the private data starts with the IRD/ORD word
//! (RFC 6581 §9.1), big-endian:
//!
//! ```text
//!  0 .. 2   A 0x8000 (peer-to-peer: an RTR message follows) | B 0x4000 | IRD (14 bits)
//!  2 .. 4   C 0x8000 (RTR: zero-length RDMA Write) | D 0x4000 (RTR: zero-length RDMA Read)
//!           | ORD (14 bits)
//! ```
//!
//! B is a third RTR kind (siw calls it "zero-length RTR" and never chooses it); it is carried
//! but not acted on. The ULP's private data follows the word.
//!
//! Reserved bits are ignored on receipt (siw uses 0x08 of the flags for a private "GSO"
//! experiment) and sent as 0.

use super::WireError;

/// The key of a request frame.
pub const KEY_REQ: &[u8; 16] = b"MPA ID Req Frame";
/// The key of a reply frame.
pub const KEY_REP: &[u8; 16] = b"MPA ID Rep Frame";
/// Bytes before the private data.
pub const HEADER_LEN: usize = 20;
/// Largest private data a frame may carry (RFC 5044 §7.1).
pub const MAX_PD_LEN: usize = 512;
/// Size of the enhanced IRD/ORD word.
pub const IRD_ORD_LEN: usize = 4;
/// Largest IRD or ORD the word carries (14 bits).
pub const MAX_IRD_ORD: u16 = 0x3fff;

/// Byte offsets and bits of the frame.
pub mod field {
    use core::ops::Range;
    pub const KEY: Range<usize> = 0..16;
    pub const FLAGS: usize = 16;
    pub const REV: usize = 17;
    pub const PD_LEN: Range<usize> = 18..20;
    pub const FLAG_M: u8 = 0x80;
    pub const FLAG_C: u8 = 0x40;
    pub const FLAG_R: u8 = 0x20;
    pub const FLAG_S: u8 = 0x10;
    pub const IRD_A: u16 = 0x8000;
    pub const IRD_B: u16 = 0x4000;
    pub const ORD_C: u16 = 0x8000;
    pub const ORD_D: u16 = 0x4000;
    pub const MASK_IRD_ORD: u16 = 0x3fff;
}

/// Request or reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    Request,
    Reply,
}

impl FrameKind {
    pub fn key(self) -> &'static [u8; 16] {
        match self {
            FrameKind::Request => KEY_REQ,
            FrameKind::Reply => KEY_REP,
        }
    }
}

/// Zero-copy view of an MPA request/reply frame.
#[derive(Debug, Clone)]
pub struct Mpa<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Mpa<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }

    /// A view of a whole frame: the header and the private data it announces are there, and
    /// the announced length is legal.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let m = Self { buffer };
        m.check_len()?;
        Ok(m)
    }

    /// Checks the lengths (what [`Self::new_checked`] does).
    pub fn check_len(&self) -> Result<(), WireError> {
        let have = self.buffer.as_ref().len();
        if have < HEADER_LEN {
            return Err(WireError::Truncated {
                what: "MPA frame header",
                need: HEADER_LEN,
                have,
            });
        }
        let pd = usize::from(self.pd_len());
        if pd > MAX_PD_LEN {
            return Err(WireError::Malformed {
                what: "MPA frame",
                why: "private data longer than 512 bytes",
            });
        }
        if have < HEADER_LEN + pd {
            return Err(WireError::Truncated {
                what: "MPA private data",
                need: HEADER_LEN + pd,
                have,
            });
        }
        Ok(())
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn key(&self) -> &[u8] {
        &self.b()[field::KEY]
    }
    pub fn flags(&self) -> u8 {
        self.b()[field::FLAGS]
    }
    pub fn markers(&self) -> bool {
        self.flags() & field::FLAG_M != 0
    }
    pub fn crc(&self) -> bool {
        self.flags() & field::FLAG_C != 0
    }
    pub fn reject(&self) -> bool {
        self.flags() & field::FLAG_R != 0
    }
    pub fn enhanced(&self) -> bool {
        self.flags() & field::FLAG_S != 0
    }
    pub fn revision(&self) -> u8 {
        self.b()[field::REV]
    }
    pub fn pd_len(&self) -> u16 {
        let b = &self.b()[field::PD_LEN];
        u16::from_be_bytes([b[0], b[1]])
    }
    /// The private data (the IRD/ORD word included).
    pub fn private_data(&self) -> &[u8] {
        &self.b()[HEADER_LEN..HEADER_LEN + usize::from(self.pd_len())]
    }
    /// Bytes of the whole frame.
    pub fn total_len(&self) -> usize {
        HEADER_LEN + usize::from(self.pd_len())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Mpa<T> {
    fn bm(&mut self) -> &mut [u8] {
        self.buffer.as_mut()
    }
    pub fn set_key(&mut self, key: &[u8; 16]) {
        self.bm()[field::KEY].copy_from_slice(key);
    }
    pub fn set_flags(&mut self, flags: u8) {
        self.bm()[field::FLAGS] = flags;
    }
    pub fn set_revision(&mut self, rev: u8) {
        self.bm()[field::REV] = rev;
    }
    pub fn set_pd_len(&mut self, len: u16) {
        self.bm()[field::PD_LEN].copy_from_slice(&len.to_be_bytes());
    }
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        let n = usize::from(self.pd_len());
        &mut self.bm()[HEADER_LEN..HEADER_LEN + n]
    }
}

/// The RDMA Read limits and RTR choice of an enhanced frame (RFC 6581 §9.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IrdOrd {
    /// Inbound RDMA Reads the sender accepts outstanding (14 bits).
    pub ird: u16,
    /// Outbound RDMA Reads the sender wants outstanding (14 bits).
    pub ord: u16,
    /// A: peer-to-peer mode, the initiator sends an RTR message first.
    pub p2p: bool,
    /// B: the third RTR kind (siw's "zero-length RTR"); carried, never chosen here.
    pub rtr_b: bool,
    /// C: RTR by a zero-length RDMA Write (offered in a request, chosen in a reply).
    pub rtr_write: bool,
    /// D: RTR by a zero-length RDMA Read Request.
    pub rtr_read: bool,
}

impl IrdOrd {
    /// Parses the word at the start of `pd`.
    pub fn parse(pd: &[u8]) -> Result<Self, WireError> {
        if pd.len() < IRD_ORD_LEN {
            return Err(WireError::Truncated {
                what: "MPA IRD/ORD word",
                need: IRD_ORD_LEN,
                have: pd.len(),
            });
        }
        let ird = u16::from_be_bytes([pd[0], pd[1]]);
        let ord = u16::from_be_bytes([pd[2], pd[3]]);
        Ok(Self {
            ird: ird & field::MASK_IRD_ORD,
            ord: ord & field::MASK_IRD_ORD,
            p2p: ird & field::IRD_A != 0,
            rtr_b: ird & field::IRD_B != 0,
            rtr_write: ord & field::ORD_C != 0,
            rtr_read: ord & field::ORD_D != 0,
        })
    }

    /// The 4 bytes of the word (IRD and ORD above 14 bits are cut to 14).
    pub fn to_bytes(&self) -> [u8; IRD_ORD_LEN] {
        let bit = |on: bool, b: u16| if on { b } else { 0 };
        let ird = (self.ird.min(MAX_IRD_ORD))
            | bit(self.p2p, field::IRD_A)
            | bit(self.rtr_b, field::IRD_B);
        let ord = (self.ord.min(MAX_IRD_ORD))
            | bit(self.rtr_write, field::ORD_C)
            | bit(self.rtr_read, field::ORD_D);
        let (i, o) = (ird.to_be_bytes(), ord.to_be_bytes());
        [i[0], i[1], o[0], o[1]]
    }
}

/// The meaning of an MPA request or reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MpaRepr<'a> {
    pub kind: FrameKind,
    /// M: the sender wants to receive markers.
    pub markers: bool,
    /// C: the sender wants CRC32c in every FPDU (RFC 5044 §7.1: the reply's C bit decides).
    pub crc: bool,
    /// R: the reply rejects the connection (replies only).
    pub reject: bool,
    pub revision: u8,
    /// The enhanced flag's IRD/ORD word (`Some` exactly when the S flag is set).
    pub ird_ord: Option<IrdOrd>,
    /// The ULP's private data (after the IRD/ORD word, if any).
    pub private_data: &'a [u8],
}

impl<'a> MpaRepr<'a> {
    /// Parses a view (its lengths are checked here): a known key, R only in a reply, the
    /// IRD/ORD word present when the enhanced flag says so.
    pub fn parse(m: &Mpa<&'a [u8]>) -> Result<Self, WireError> {
        m.check_len()?;
        let b: &'a [u8] = m.buffer;
        let kind = if m.key() == KEY_REQ {
            FrameKind::Request
        } else if m.key() == KEY_REP {
            FrameKind::Reply
        } else {
            return Err(WireError::Malformed {
                what: "MPA frame",
                why: "unknown key",
            });
        };
        if kind == FrameKind::Request && m.reject() {
            return Err(WireError::Malformed {
                what: "MPA request",
                why: "reject flag in a request",
            });
        }
        let pd = &b[HEADER_LEN..HEADER_LEN + usize::from(m.pd_len())];
        let (ird_ord, private_data) = if m.enhanced() {
            (Some(IrdOrd::parse(pd)?), &pd[IRD_ORD_LEN..])
        } else {
            (None, pd)
        };
        Ok(Self {
            kind,
            markers: m.markers(),
            crc: m.crc(),
            reject: m.reject(),
            revision: m.revision(),
            ird_ord,
            private_data,
        })
    }

    /// Parses a whole frame from bytes.
    pub fn from_bytes(b: &'a [u8]) -> Result<Self, WireError> {
        Self::parse(&Mpa::new_unchecked(b))
    }

    /// Bytes the frame takes.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.pd_len()
    }

    fn pd_len(&self) -> usize {
        self.private_data.len()
            + if self.ird_ord.is_some() {
                IRD_ORD_LEN
            } else {
                0
            }
    }

    /// Writes the frame into `buf` (at least [`Self::buffer_len`] bytes). Fails if the
    /// private data does not fit a frame.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let pd = self.pd_len();
        if pd > MAX_PD_LEN {
            return Err(WireError::Malformed {
                what: "MPA frame",
                why: "private data longer than 512 bytes",
            });
        }
        if buf.len() < HEADER_LEN + pd {
            return Err(WireError::Truncated {
                what: "MPA frame buffer",
                need: HEADER_LEN + pd,
                have: buf.len(),
            });
        }
        let mut m = Mpa::new_unchecked(&mut buf[..HEADER_LEN + pd]);
        m.set_key(self.kind.key());
        let bit = |on: bool, b: u8| if on { b } else { 0 };
        m.set_flags(
            bit(self.markers, field::FLAG_M)
                | bit(self.crc, field::FLAG_C)
                | bit(self.reject, field::FLAG_R)
                | bit(self.ird_ord.is_some(), field::FLAG_S),
        );
        m.set_revision(self.revision);
        // pd <= 512 fits u16.
        m.set_pd_len(pd as u16);
        let out = m.private_data_mut();
        let rest = match &self.ird_ord {
            Some(w) => {
                out[..IRD_ORD_LEN].copy_from_slice(&w.to_bytes());
                &mut out[IRD_ORD_LEN..]
            }
            None => out,
        };
        rest.copy_from_slice(self.private_data);
        Ok(())
    }

    /// The frame as bytes.
    pub fn to_vec(&self) -> Result<Vec<u8>, WireError> {
        let mut v = vec![0u8; self.buffer_len()];
        self.emit(&mut v)?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A request as RFC 5044 Figure 11 + RFC 6581 §9.1 lay it out, written byte by byte:
    /// enhanced, CRC, revision 2, IRD 16 with A (P2P), ORD 8 with C and D, private data "hi".
    #[test]
    fn request_bytes_match_the_rfc_layout() {
        let mut want = Vec::new();
        want.extend_from_slice(b"MPA ID Req Frame");
        want.push(0x40 | 0x10); // C | S
        want.push(2);
        want.extend_from_slice(&[0, 6]); // 4 (IRD/ORD) + 2
        want.extend_from_slice(&[0x80, 16, 0xC0, 8]);
        want.extend_from_slice(b"hi");
        let r = MpaRepr {
            kind: FrameKind::Request,
            markers: false,
            crc: true,
            reject: false,
            revision: 2,
            ird_ord: Some(IrdOrd {
                ird: 16,
                ord: 8,
                p2p: true,
                rtr_b: false,
                rtr_write: true,
                rtr_read: true,
            }),
            private_data: b"hi",
        };
        assert_eq!(r.to_vec().unwrap(), want);
        assert_eq!(MpaRepr::from_bytes(&want).unwrap(), r);
    }

    /// A reject reply of revision 1 (no IRD/ORD word), markers and reject bits.
    #[test]
    fn reply_bytes_match_the_rfc_layout() {
        let mut want = Vec::new();
        want.extend_from_slice(b"MPA ID Rep Frame");
        want.push(0x80 | 0x20);
        want.push(1);
        want.extend_from_slice(&[0, 3]);
        want.extend_from_slice(b"no!");
        let r = MpaRepr::from_bytes(&want).unwrap();
        assert_eq!(r.kind, FrameKind::Reply);
        assert!(r.markers && r.reject && !r.crc);
        assert_eq!(r.ird_ord, None);
        assert_eq!(r.private_data, b"no!");
        assert_eq!(r.to_vec().unwrap(), want);
    }

    #[test]
    fn bad_frames_are_errors() {
        let ok = MpaRepr {
            kind: FrameKind::Request,
            markers: false,
            crc: false,
            reject: false,
            revision: 2,
            ird_ord: Some(IrdOrd::default()),
            private_data: b"",
        }
        .to_vec()
        .unwrap();
        // Truncated header, truncated private data.
        assert!(matches!(
            MpaRepr::from_bytes(&ok[..19]),
            Err(WireError::Truncated { .. })
        ));
        assert!(matches!(
            MpaRepr::from_bytes(&ok[..22]),
            Err(WireError::Truncated { .. })
        ));
        // Unknown key.
        let mut b = ok.clone();
        b[0] = b'X';
        assert!(matches!(
            MpaRepr::from_bytes(&b),
            Err(WireError::Malformed { .. })
        ));
        // R in a request.
        let mut b = ok.clone();
        b[16] |= 0x20;
        assert!(MpaRepr::from_bytes(&b).is_err());
        // Enhanced flag without room for the IRD/ORD word.
        let mut b = ok.clone();
        b[19] = 2;
        b.truncate(22);
        assert!(matches!(
            MpaRepr::from_bytes(&b),
            Err(WireError::Truncated { .. })
        ));
        // PD_Length over 512.
        let mut b = vec![0u8; 20 + 513];
        b[..16].copy_from_slice(KEY_REQ);
        b[18..20].copy_from_slice(&513u16.to_be_bytes());
        assert!(matches!(
            MpaRepr::from_bytes(&b),
            Err(WireError::Malformed { .. })
        ));
        // Reserved flag bits are ignored (siw's 0x08).
        let mut b = ok.clone();
        b[16] |= 0x08;
        assert_eq!(
            MpaRepr::from_bytes(&b).unwrap(),
            MpaRepr::from_bytes(&ok).unwrap()
        );
        // Too much private data to emit.
        let big = [0u8; 509];
        let r = MpaRepr {
            private_data: &big,
            ..MpaRepr::from_bytes(&ok).unwrap()
        };
        assert!(r.to_vec().is_err());
    }

    proptest! {
        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = MpaRepr::from_bytes(&b);
            let _ = Mpa::new_checked(&b[..]).map(|m| (m.private_data().len(), m.total_len()));
        }

        #[test]
        fn round_trip(
            reply in any::<bool>(), m in any::<bool>(), c in any::<bool>(), r in any::<bool>(),
            rev in any::<u8>(), enhanced in any::<bool>(),
            ird in 0u16..=MAX_IRD_ORD, ord in 0u16..=MAX_IRD_ORD,
            a in any::<bool>(), bb in any::<bool>(), cc in any::<bool>(), d in any::<bool>(),
            pd in proptest::collection::vec(any::<u8>(), 0..=508),
        ) {
            let kind = if reply { FrameKind::Reply } else { FrameKind::Request };
            let repr = MpaRepr {
                kind,
                markers: m,
                crc: c,
                reject: r && reply,
                revision: rev,
                ird_ord: enhanced.then_some(IrdOrd {
                    ird, ord, p2p: a, rtr_b: bb, rtr_write: cc, rtr_read: d,
                }),
                private_data: &pd,
            };
            let bytes = repr.to_vec().unwrap();
            prop_assert_eq!(bytes.len(), repr.buffer_len());
            prop_assert_eq!(MpaRepr::from_bytes(&bytes).unwrap(), repr);
        }
    }
}
