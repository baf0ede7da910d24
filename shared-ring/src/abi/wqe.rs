//! Work-queue entries: the 64-byte slots of send and receive queues.
//!
//! ```text
//!  0  opcode u8      1 flags u8     2 num_sge u8    3 inline_len u8
//!  4  imm_data u32
//!  8  wr_id u64
//! 16  remote_addr u64   (RDMA WRITE/READ)
//! 24  rkey u32          (RDMA WRITE/READ)
//! 28  owner u32        (bit 0 phase, written last with release; see `queue`)
//! 32  payload: 2 SGEs of 16 bytes {offset u64, length u32, lkey u32}, or 32 bytes inline data
//! ```
//! Written by the frontend, copied out and validated by the backend engine.

use super::{check_len, AbiError};

/// Size of a WQE slot.
pub const WQE_LEN: usize = 64;
/// Scatter/gather entries per WQE.
pub const MAX_SGE: usize = 2;
/// Bytes of inline data per WQE.
pub const MAX_INLINE: usize = 32;
/// Size of one SGE inside the payload.
pub const SGE_LEN: usize = 16;

/// Byte offsets of the WQE fields.
pub mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const NUM_SGE: usize = 2;
    pub const INLINE_LEN: usize = 3;
    pub const IMM_DATA: usize = 4;
    pub const WR_ID: usize = 8;
    pub const REMOTE_ADDR: usize = 16;
    pub const RKEY: usize = 24;
    /// The owner word: bit 0 is the slot's phase (`crate::queue`), the other bits 0. Queue
    /// consumers hand WQEs out with it zeroed, so a parsed WQE has 0 here.
    pub const OWNER: usize = 28;
    pub const PAYLOAD: usize = 32;
    /// Offsets inside one SGE.
    pub const SGE_OFFSET: usize = 0;
    pub const SGE_LENGTH: usize = 8;
    pub const SGE_LKEY: usize = 12;
}

/// What a WQE asks for. Zero is not an opcode, so a never-written slot does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WqeOpcode {
    Send = 1,
    SendWithImm = 2,
    RdmaWrite = 3,
    RdmaWriteWithImm = 4,
    RdmaRead = 5,
    /// A receive buffer (receive queue only).
    Recv = 6,
}

impl WqeOpcode {
    pub fn from_u8(v: u8) -> Result<Self, AbiError> {
        Ok(match v {
            1 => Self::Send,
            2 => Self::SendWithImm,
            3 => Self::RdmaWrite,
            4 => Self::RdmaWriteWithImm,
            5 => Self::RdmaRead,
            6 => Self::Recv,
            _ => {
                return Err(AbiError::Unknown {
                    what: "WQE opcode",
                    value: v.into(),
                })
            }
        })
    }
    /// Whether the WQE carries a remote address and rkey.
    pub fn is_rdma(self) -> bool {
        matches!(
            self,
            Self::RdmaWrite | Self::RdmaWriteWithImm | Self::RdmaRead
        )
    }
    /// Whether the WQE carries immediate data.
    pub fn has_imm(self) -> bool {
        matches!(self, Self::SendWithImm | Self::RdmaWriteWithImm)
    }
}

/// WQE flag bits.
pub mod flags {
    /// Generate a CQE on success (errors always complete).
    pub const SIGNALED: u8 = 1 << 0;
    /// Set the solicited-event bit at the receiver.
    pub const SOLICITED: u8 = 1 << 1;
    /// Payload is inline data, not SGEs.
    pub const INLINE: u8 = 1 << 2;
    /// Wait for earlier RDMA READs to complete first.
    pub const FENCE: u8 = 1 << 3;
    pub const ALL: u8 = SIGNALED | SOLICITED | INLINE | FENCE;
}

/// One scatter/gather entry: `length` bytes at `offset` inside the memory region `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Sge {
    pub offset: u64,
    pub length: u32,
    pub lkey: u32,
}

/// Zero-copy view of a WQE slot.
#[derive(Debug, Clone)]
pub struct Wqe<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Wqe<T> {
    /// Wraps a buffer without checking its length.
    pub fn new_unchecked(buffer: T) -> Self {
        Self { buffer }
    }
    /// Wraps a buffer of at least [`WQE_LEN`] bytes.
    pub fn new_checked(buffer: T) -> Result<Self, AbiError> {
        check_len(buffer.as_ref().len(), WQE_LEN)?;
        Ok(Self { buffer })
    }
    pub fn into_inner(self) -> T {
        self.buffer
    }
    super::view_getters! {
        /// Raw opcode byte.
        opcode: u8 @ field::OPCODE;
        /// Raw flag bits.
        flags: u8 @ field::FLAGS;
        /// Number of SGEs used.
        num_sge: u8 @ field::NUM_SGE;
        /// Bytes of inline data.
        inline_len: u8 @ field::INLINE_LEN;
        /// Immediate data (`*_WITH_IMM`).
        imm_data: u32 @ field::IMM_DATA;
        /// Caller's cookie, returned in the CQE.
        wr_id: u64 @ field::WR_ID;
        /// Remote virtual address (RDMA).
        remote_addr: u64 @ field::REMOTE_ADDR;
        /// Remote key (RDMA).
        rkey: u32 @ field::RKEY;
        /// Owner word (phase bit; zero in a WQE copied out of a queue).
        owner: u32 @ field::OWNER;
    }
    /// SGE `i` (`i < MAX_SGE`).
    pub fn sge(&self, i: usize) -> Sge {
        let b = self.buffer.as_ref();
        let o = field::PAYLOAD + (i % MAX_SGE) * SGE_LEN;
        Sge {
            offset: super::get_u64(b, o + field::SGE_OFFSET),
            length: super::get_u32(b, o + field::SGE_LENGTH),
            lkey: super::get_u32(b, o + field::SGE_LKEY),
        }
    }
    /// The 32-byte payload area.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD..WQE_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Wqe<T> {
    super::view_setters! {
        set_opcode: u8 @ field::OPCODE;
        set_flags: u8 @ field::FLAGS;
        set_num_sge: u8 @ field::NUM_SGE;
        set_inline_len: u8 @ field::INLINE_LEN;
        set_imm_data: u32 @ field::IMM_DATA;
        set_wr_id: u64 @ field::WR_ID;
        set_remote_addr: u64 @ field::REMOTE_ADDR;
        set_rkey: u32 @ field::RKEY;
        set_owner: u32 @ field::OWNER;
    }
    /// Sets SGE `i` (`i < MAX_SGE`).
    pub fn set_sge(&mut self, i: usize, sge: Sge) {
        let b = self.buffer.as_mut();
        let o = field::PAYLOAD + (i % MAX_SGE) * SGE_LEN;
        super::set_u64(b, o + field::SGE_OFFSET, sge.offset);
        super::set_u32(b, o + field::SGE_LENGTH, sge.length);
        super::set_u32(b, o + field::SGE_LKEY, sge.lkey);
    }
    /// The 32-byte payload area, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD..WQE_LEN]
    }
}

/// Where the data of a WQE is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WqeData {
    /// Up to [`MAX_SGE`] scatter/gather entries (`len` of them used).
    Sges { sges: [Sge; MAX_SGE], len: u8 },
    /// Up to [`MAX_INLINE`] bytes carried in the WQE (`len` of them used).
    Inline { bytes: [u8; MAX_INLINE], len: u8 },
}

impl WqeData {
    /// SGEs from a slice (at most [`MAX_SGE`]).
    pub fn sges(list: &[Sge]) -> Result<Self, AbiError> {
        if list.len() > MAX_SGE {
            return Err(AbiError::OutOfRange {
                what: "SGE count",
                value: list.len() as u64,
                max: MAX_SGE as u64,
            });
        }
        let mut sges = [Sge::default(); MAX_SGE];
        sges[..list.len()].copy_from_slice(list);
        Ok(Self::Sges {
            sges,
            len: list.len() as u8,
        })
    }
    /// Inline data from a slice (at most [`MAX_INLINE`] bytes).
    pub fn inline(data: &[u8]) -> Result<Self, AbiError> {
        if data.len() > MAX_INLINE {
            return Err(AbiError::OutOfRange {
                what: "inline length",
                value: data.len() as u64,
                max: MAX_INLINE as u64,
            });
        }
        let mut bytes = [0u8; MAX_INLINE];
        bytes[..data.len()].copy_from_slice(data);
        Ok(Self::Inline {
            bytes,
            len: data.len() as u8,
        })
    }
    /// Total bytes described.
    #[inline]
    pub fn total_len(&self) -> u64 {
        match self {
            Self::Sges { sges, len } => sges[..*len as usize]
                .iter()
                .map(|s| u64::from(s.length))
                .sum(),
            Self::Inline { len, .. } => u64::from(*len),
        }
    }
}

/// The meaning of a WQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WqeRepr {
    pub opcode: WqeOpcode,
    /// [`flags`] bits other than `INLINE` (which follows from `data`).
    pub flags: u8,
    pub wr_id: u64,
    /// Immediate data; must be 0 unless the opcode carries one.
    pub imm_data: u32,
    /// Remote address and rkey; must be 0 unless the opcode is RDMA.
    pub remote_addr: u64,
    pub rkey: u32,
    pub data: WqeData,
}

impl WqeRepr {
    /// Parses and validates a WQE copied out of a queue (its first [`WQE_LEN`] bytes, through
    /// [`Self::from_words`]).
    pub fn parse<T: AsRef<[u8]>>(wqe: &Wqe<T>) -> Result<Self, AbiError> {
        let b = wqe.buffer.as_ref();
        check_len(b.len(), WQE_LEN)?;
        let mut words = [0u32; WQE_LEN / 4];
        for (w, c) in words.iter_mut().zip(b.chunks_exact(4)) {
            *w = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
        }
        Self::from_words(&words)
    }

    /// Parses and validates a WQE given as the sixteen words of its slot, word `i` holding
    /// bytes `4 i .. 4 i + 4` in native order (what `Consumer::pop_words` hands out, the
    /// inverse of [`Self::to_words`]): the one set of rules, which [`Self::from_bytes`] and
    /// [`Self::parse`] apply too. Each word is read once; the words are the caller's copy,
    /// never shared memory.
    #[inline]
    pub fn from_words(w: &[u32; WQE_LEN / 4]) -> Result<Self, AbiError> {
        let le = u32::from_le;
        let le64 = |i: usize| u64::from(le(w[i])) | u64::from(le(w[i + 1])) << 32;
        let [op, fl, num_sge, inline_len] = w[field::OPCODE / 4].to_ne_bytes();
        let opcode = WqeOpcode::from_u8(op)?;
        if fl & !flags::ALL != 0 {
            return Err(AbiError::Unknown {
                what: "WQE flags",
                value: fl.into(),
            });
        }
        if w[field::OWNER / 4] != 0 {
            return Err(AbiError::Reserved { field: "wqe.owner" });
        }
        let imm_data = le(w[field::IMM_DATA / 4]);
        if !opcode.has_imm() && imm_data != 0 {
            return Err(AbiError::Reserved {
                field: "wqe.imm_data",
            });
        }
        let remote_addr = le64(field::REMOTE_ADDR / 4);
        let rkey = le(w[field::RKEY / 4]);
        if !opcode.is_rdma() && (remote_addr != 0 || rkey != 0) {
            return Err(AbiError::Reserved {
                field: "wqe.remote",
            });
        }
        const P: usize = field::PAYLOAD / 4;
        let data = if fl & flags::INLINE != 0 {
            if matches!(opcode, WqeOpcode::Recv | WqeOpcode::RdmaRead) {
                return Err(AbiError::Unknown {
                    what: "inline WQE opcode",
                    value: opcode as u32,
                });
            }
            if num_sge != 0 {
                return Err(AbiError::Reserved {
                    field: "wqe.num_sge",
                });
            }
            let len = inline_len;
            if usize::from(len) > MAX_INLINE {
                return Err(AbiError::OutOfRange {
                    what: "inline length",
                    value: len.into(),
                    max: MAX_INLINE as u64,
                });
            }
            let mut bytes = [0u8; MAX_INLINE];
            for (c, v) in bytes.chunks_exact_mut(4).zip(&w[P..]) {
                c.copy_from_slice(&v.to_ne_bytes());
            }
            bytes[usize::from(len)..].fill(0);
            WqeData::Inline { bytes, len }
        } else {
            if inline_len != 0 {
                return Err(AbiError::Reserved {
                    field: "wqe.inline_len",
                });
            }
            let n = num_sge;
            if usize::from(n) > MAX_SGE {
                return Err(AbiError::OutOfRange {
                    what: "SGE count",
                    value: n.into(),
                    max: MAX_SGE as u64,
                });
            }
            let mut sges = [Sge::default(); MAX_SGE];
            for (i, s) in sges.iter_mut().enumerate().take(usize::from(n)) {
                let o = P + i * (SGE_LEN / 4);
                *s = Sge {
                    offset: le64(o + field::SGE_OFFSET / 4),
                    length: le(w[o + field::SGE_LENGTH / 4]),
                    lkey: le(w[o + field::SGE_LKEY / 4]),
                };
            }
            WqeData::Sges { sges, len: n }
        };
        Ok(Self {
            opcode,
            flags: fl & !flags::INLINE,
            wr_id: le64(field::WR_ID / 4),
            imm_data,
            remote_addr,
            rkey,
            data,
        })
    }

    /// Writes the WQE into `wqe` (every byte of the slot is written).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, wqe: &mut Wqe<T>) {
        wqe.buffer.as_mut()[..WQE_LEN].fill(0);
        wqe.set_opcode(self.opcode as u8);
        wqe.set_wr_id(self.wr_id);
        wqe.set_imm_data(self.imm_data);
        wqe.set_remote_addr(self.remote_addr);
        wqe.set_rkey(self.rkey);
        match &self.data {
            WqeData::Sges { sges, len } => {
                wqe.set_flags(self.flags & !flags::INLINE);
                wqe.set_num_sge(*len);
                for (i, s) in sges.iter().enumerate().take(usize::from(*len)) {
                    wqe.set_sge(i, *s);
                }
            }
            WqeData::Inline { bytes, len } => {
                wqe.set_flags(self.flags | flags::INLINE);
                wqe.set_inline_len(*len);
                let l = usize::from(*len).min(MAX_INLINE);
                wqe.payload_mut()[..l].copy_from_slice(&bytes[..l]);
            }
        }
    }

    /// The slot bytes of this WQE.
    #[inline]
    pub fn to_bytes(&self) -> [u8; WQE_LEN] {
        let mut b = [0u8; WQE_LEN];
        self.emit(&mut Wqe::new_unchecked(&mut b[..]));
        b
    }

    /// Parses slot bytes: [`Self::from_words`] of their sixteen words.
    pub fn from_bytes(b: &[u8; WQE_LEN]) -> Result<Self, AbiError> {
        Self::parse(&Wqe::new_unchecked(&b[..]))
    }

    /// The slot as sixteen words, word `i` holding bytes `4 i .. 4 i + 4` of
    /// [`Self::to_bytes`] in native order (what `Producer::write_words` stores): the same
    /// bytes, built in registers, so the post path needs no 64-byte buffer on the stack (whose
    /// byte-wise stores and word-wise reloads cost the library's post ≈ 30 ns; see
    /// docs/benchmarks.md "The library path"). Built with [`WqeHead::words`], [`put_sge`] and
    /// [`put_inline`], as the post paths build theirs without a `WqeRepr`.
    #[inline]
    pub fn to_words(&self) -> [u32; WQE_LEN / 4] {
        let (flags, num_sge, inline_len) = match &self.data {
            WqeData::Sges { len, .. } => (self.flags & !flags::INLINE, *len, 0),
            WqeData::Inline { len, .. } => (self.flags | flags::INLINE, 0, *len),
        };
        let head = WqeHead {
            opcode: self.opcode,
            flags,
            wr_id: self.wr_id,
            imm_data: self.imm_data,
            remote_addr: self.remote_addr,
            rkey: self.rkey,
        };
        let mut words = head.words(num_sge, inline_len);
        match &self.data {
            WqeData::Sges { sges, len } => {
                for (i, s) in sges.iter().enumerate().take(usize::from(*len)) {
                    put_sge(&mut words, i, s);
                }
            }
            WqeData::Inline { bytes, len } => {
                let l = usize::from(*len).min(MAX_INLINE);
                let mut b = [0u8; MAX_INLINE];
                b[..l].copy_from_slice(&bytes[..l]);
                put_inline(&mut words, &b);
            }
        }
        words
    }
}

/// A WQE's fields before its payload, as a post path has them: the one place, with
/// [`put_sge`] and [`put_inline`], that lays a WQE out as the slot's sixteen words (word `i`
/// holding bytes `4 i .. 4 i + 4` of the layout above in native order, what
/// `Producer::write_words` stores). [`WqeRepr::to_words`], the `vrdma` library's post path and
/// the device's test kit build their WQEs with them. Nothing is checked here: the backend
/// validates what it copies out, and the library checks before it builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WqeHead {
    pub opcode: WqeOpcode,
    /// The flag byte as stored, `INLINE` included when the payload is inline.
    pub flags: u8,
    pub wr_id: u64,
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
}

/// Native-order word of four little-endian bytes.
#[inline(always)]
fn le_word(v: u32) -> u32 {
    u32::from_ne_bytes(v.to_le_bytes())
}

impl WqeHead {
    /// The WQE's words with this head, `num_sge` and `inline_len`; the owner word (the queue
    /// stores the phase) and the payload words 0.
    #[inline(always)]
    pub fn words(&self, num_sge: u8, inline_len: u8) -> [u32; WQE_LEN / 4] {
        let mut words = [0u32; WQE_LEN / 4];
        words[field::OPCODE / 4] =
            u32::from_ne_bytes([self.opcode as u8, self.flags, num_sge, inline_len]);
        words[field::IMM_DATA / 4] = le_word(self.imm_data);
        words[field::WR_ID / 4] = le_word(self.wr_id as u32);
        words[field::WR_ID / 4 + 1] = le_word((self.wr_id >> 32) as u32);
        words[field::REMOTE_ADDR / 4] = le_word(self.remote_addr as u32);
        words[field::REMOTE_ADDR / 4 + 1] = le_word((self.remote_addr >> 32) as u32);
        words[field::RKEY / 4] = le_word(self.rkey);
        words
    }
}

/// Stores SGE `i` (below [`MAX_SGE`]; panics past the payload) into a WQE's words.
#[inline(always)]
pub fn put_sge(words: &mut [u32; WQE_LEN / 4], i: usize, s: &Sge) {
    let o = (field::PAYLOAD + i * SGE_LEN) / 4;
    words[o + field::SGE_OFFSET / 4] = le_word(s.offset as u32);
    words[o + field::SGE_OFFSET / 4 + 1] = le_word((s.offset >> 32) as u32);
    words[o + field::SGE_LENGTH / 4] = le_word(s.length);
    words[o + field::SGE_LKEY / 4] = le_word(s.lkey);
}

/// Stores a whole inline payload (bytes past the WQE's `inline_len` zero, as `to_bytes`
/// leaves them) into a WQE's words.
#[inline(always)]
pub fn put_inline(words: &mut [u32; WQE_LEN / 4], bytes: &[u8; MAX_INLINE]) {
    for (d, c) in words[field::PAYLOAD / 4..]
        .iter_mut()
        .zip(bytes.chunks_exact(4))
    {
        *d = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The rules of a WQE written out a second time, over the byte view's getters (the parser
    /// as it was before `from_words`): the oracle `from_words` and `from_bytes` are held to.
    fn reference_parse(b: &[u8; WQE_LEN]) -> Result<WqeRepr, AbiError> {
        let wqe = Wqe::new_unchecked(&b[..]);
        let opcode = WqeOpcode::from_u8(wqe.opcode())?;
        let fl = wqe.flags();
        if fl & !flags::ALL != 0 {
            return Err(AbiError::Unknown {
                what: "WQE flags",
                value: fl.into(),
            });
        }
        if wqe.owner() != 0 {
            return Err(AbiError::Reserved { field: "wqe.owner" });
        }
        if !opcode.has_imm() && wqe.imm_data() != 0 {
            return Err(AbiError::Reserved {
                field: "wqe.imm_data",
            });
        }
        if !opcode.is_rdma() && (wqe.remote_addr() != 0 || wqe.rkey() != 0) {
            return Err(AbiError::Reserved {
                field: "wqe.remote",
            });
        }
        let data = if fl & flags::INLINE != 0 {
            if matches!(opcode, WqeOpcode::Recv | WqeOpcode::RdmaRead) {
                return Err(AbiError::Unknown {
                    what: "inline WQE opcode",
                    value: opcode as u32,
                });
            }
            if wqe.num_sge() != 0 {
                return Err(AbiError::Reserved {
                    field: "wqe.num_sge",
                });
            }
            let len = wqe.inline_len();
            if usize::from(len) > MAX_INLINE {
                return Err(AbiError::OutOfRange {
                    what: "inline length",
                    value: len.into(),
                    max: MAX_INLINE as u64,
                });
            }
            WqeData::inline(&wqe.payload()[..usize::from(len)])?
        } else {
            if wqe.inline_len() != 0 {
                return Err(AbiError::Reserved {
                    field: "wqe.inline_len",
                });
            }
            let n = wqe.num_sge();
            if usize::from(n) > MAX_SGE {
                return Err(AbiError::OutOfRange {
                    what: "SGE count",
                    value: n.into(),
                    max: MAX_SGE as u64,
                });
            }
            let list: Vec<Sge> = (0..usize::from(n)).map(|i| wqe.sge(i)).collect();
            WqeData::sges(&list)?
        };
        Ok(WqeRepr {
            opcode,
            flags: fl & !flags::INLINE,
            wr_id: wqe.wr_id(),
            imm_data: wqe.imm_data(),
            remote_addr: wqe.remote_addr(),
            rkey: wqe.rkey(),
            data,
        })
    }

    /// A value that is often 0 (a reserved field left alone), else anything.
    fn zero_or_any<T: Arbitrary + Default + std::fmt::Debug + Clone + 'static>(
    ) -> impl Strategy<Value = T> {
        prop_oneof![3 => Just(T::default()), 1 => any::<T>()]
    }

    /// 64-byte slots that are valid WQEs of every opcode often and garbage of every kind
    /// (bad opcode, unknown flags, owner, reserved fields, counts and lengths past the limits)
    /// the rest of the time: each header field is drawn near its valid values, the payload is
    /// random, and one in four slots is random bytes throughout.
    fn slots() -> impl Strategy<Value = [u8; WQE_LEN]> {
        let header = (
            prop_oneof![8 => 1u8..=6, 1 => Just(0u8), 1 => any::<u8>()],
            prop_oneof![6 => 0u8..=flags::ALL, 1 => any::<u8>()],
            prop_oneof![6 => 0u8..=3, 1 => any::<u8>()],
            prop_oneof![3 => Just(0u8), 3 => 0u8..=34, 1 => any::<u8>()],
            zero_or_any::<u32>(),
            any::<u64>(),
            zero_or_any::<u64>(),
            zero_or_any::<u32>(),
            prop_oneof![6 => Just(0u32), 1 => any::<u32>()],
        );
        let built = (header, any::<[u8; 32]>()).prop_map(
            |((op, fl, n, il, imm, wr_id, ra, rkey, owner), payload)| {
                let mut b = [0u8; WQE_LEN];
                let mut w = Wqe::new_unchecked(&mut b[..]);
                w.set_opcode(op);
                // Inline and SGE WQEs alike: the count of the other kind is usually 0.
                w.set_flags(fl);
                if fl & flags::INLINE != 0 && n < 3 {
                    w.set_inline_len(il);
                } else {
                    w.set_num_sge(n);
                    w.set_inline_len(if il < 34 { 0 } else { il });
                }
                w.set_imm_data(imm);
                w.set_wr_id(wr_id);
                w.set_remote_addr(ra);
                w.set_rkey(rkey);
                w.set_owner(owner);
                w.payload_mut().copy_from_slice(&payload);
                b
            },
        );
        let garbage = proptest::collection::vec(any::<u8>(), WQE_LEN)
            .prop_map(|v| <[u8; WQE_LEN]>::try_from(v).expect("64 bytes"));
        prop_oneof![3 => built, 1 => garbage]
    }

    fn words_of(b: &[u8; WQE_LEN]) -> [u32; WQE_LEN / 4] {
        let mut w = [0u32; WQE_LEN / 4];
        for (v, c) in w.iter_mut().zip(b.chunks_exact(4)) {
            *v = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
        }
        w
    }

    proptest! {
        // No failure files (Miri's isolation has no file system) and few cases under Miri.
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 16 } else { 4096 },
            failure_persistence: None,
            ..ProptestConfig::default()
        })]
        /// `from_words` of a slot's words, `from_bytes` and `parse` of its bytes accept the
        /// same slots, with the same meaning, and refuse the others with the same error as
        /// the rules written over the byte view.
        #[test]
        fn from_words_agrees_with_the_byte_rules(b in slots()) {
            let want = reference_parse(&b);
            prop_assert_eq!(WqeRepr::from_words(&words_of(&b)), want);
            prop_assert_eq!(WqeRepr::from_bytes(&b), want);
            prop_assert_eq!(WqeRepr::parse(&Wqe::new_unchecked(&b[..])), want);
            if let Ok(r) = want {
                prop_assert_eq!(WqeRepr::from_words(&r.to_words()), Ok(r));
            }
        }
    }

    /// The generator reaches what the agreement above is about: valid WQEs of every opcode,
    /// inline and not, and each kind of refusal.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "20 000 generated slots, no unsafe code: the workspace test run covers it"
    )]
    fn slot_generator_covers_every_opcode_and_error() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let mut ops = std::collections::HashSet::new();
        let mut inline = false;
        let mut errs = std::collections::HashSet::new();
        for _ in 0..20_000 {
            let b = slots().new_tree(&mut runner).unwrap().current();
            match reference_parse(&b) {
                Ok(r) => {
                    ops.insert(r.opcode as u8);
                    inline |= matches!(r.data, WqeData::Inline { .. });
                }
                Err(e) => {
                    errs.insert(match e {
                        AbiError::Reserved { field } => field,
                        AbiError::Unknown { what, .. } | AbiError::OutOfRange { what, .. } => what,
                        AbiError::Truncated { .. } => "truncated",
                    });
                }
            }
        }
        assert_eq!(ops.len(), 6, "valid WQEs of every opcode: {ops:?}");
        assert!(inline, "valid inline WQEs");
        assert_eq!(errs.len(), 10, "every kind of refusal: {errs:?}");
    }

    #[test]
    fn rdma_write_from_literal_bytes_and_back() {
        let mut b = [0u8; 64];
        b[0] = 3; // RDMA WRITE
        b[1] = flags::SIGNALED;
        b[2] = 1;
        b[8..16].copy_from_slice(&0x1122_3344_5566_7788u64.to_le_bytes());
        b[16..24].copy_from_slice(&0x7000_0000u64.to_le_bytes());
        b[24..28].copy_from_slice(&0xabcdu32.to_le_bytes());
        b[32..40].copy_from_slice(&4096u64.to_le_bytes());
        b[40..44].copy_from_slice(&64u32.to_le_bytes());
        b[44..48].copy_from_slice(&0x42u32.to_le_bytes());
        let r = WqeRepr::from_bytes(&b).unwrap();
        assert_eq!(r.opcode, WqeOpcode::RdmaWrite);
        assert_eq!(r.wr_id, 0x1122_3344_5566_7788);
        assert_eq!((r.remote_addr, r.rkey), (0x7000_0000, 0xabcd));
        assert_eq!(
            r.data,
            WqeData::sges(&[Sge {
                offset: 4096,
                length: 64,
                lkey: 0x42
            }])
            .unwrap()
        );
        assert_eq!(r.to_bytes(), b);
    }

    /// `to_words` is `to_bytes` word by word, for SGE and inline WQEs, every opcode and flag
    /// combination, SGE counts past `MAX_SGE` and bytes past an inline length (which neither
    /// encodes).
    #[test]
    fn to_words_are_the_bytes_of_to_bytes() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let ops = [
            WqeOpcode::Send,
            WqeOpcode::SendWithImm,
            WqeOpcode::RdmaWrite,
            WqeOpcode::RdmaWriteWithImm,
            WqeOpcode::RdmaRead,
            WqeOpcode::Recv,
        ];
        for i in 0..600 {
            let r = next();
            let data = if i % 2 == 0 {
                let sge = |v: u64| Sge {
                    offset: v,
                    length: (v >> 7) as u32,
                    lkey: (v >> 29) as u32,
                };
                WqeData::Sges {
                    sges: [sge(next()), sge(next())],
                    len: (r % 5) as u8,
                }
            } else {
                let mut bytes = [0u8; MAX_INLINE];
                for c in bytes.chunks_exact_mut(8) {
                    c.copy_from_slice(&next().to_le_bytes());
                }
                WqeData::Inline {
                    bytes,
                    len: (r % 40) as u8,
                }
            };
            let wqe = WqeRepr {
                opcode: ops[i % ops.len()],
                flags: (r >> 8) as u8,
                wr_id: next(),
                imm_data: (r >> 16) as u32,
                remote_addr: next(),
                rkey: (r >> 40) as u32,
                data,
            };
            let bytes = wqe.to_bytes();
            let words = wqe.to_words();
            for (k, w) in words.iter().enumerate() {
                assert_eq!(w.to_ne_bytes(), bytes[4 * k..4 * k + 4], "{wqe:?} word {k}");
            }
        }
    }

    #[test]
    fn inline_send_round_trips() {
        let r = WqeRepr {
            opcode: WqeOpcode::SendWithImm,
            flags: flags::SIGNALED | flags::SOLICITED,
            wr_id: 9,
            imm_data: 0xfeed,
            remote_addr: 0,
            rkey: 0,
            data: WqeData::inline(b"hello, xen").unwrap(),
        };
        let b = r.to_bytes();
        assert_eq!(b[3], 10);
        assert_eq!(&b[32..42], b"hello, xen");
        assert_eq!(WqeRepr::from_bytes(&b).unwrap(), r);
    }

    #[test]
    fn garbage_is_rejected() {
        let zero = [0u8; 64];
        assert_eq!(
            WqeRepr::from_bytes(&zero).err(),
            Some(AbiError::Unknown {
                what: "WQE opcode",
                value: 0
            })
        );
        let mut b = WqeRepr {
            opcode: WqeOpcode::Send,
            flags: 0,
            wr_id: 1,
            imm_data: 0,
            remote_addr: 0,
            rkey: 0,
            data: WqeData::sges(&[]).unwrap(),
        }
        .to_bytes();
        b[2] = 3;
        assert!(matches!(
            WqeRepr::from_bytes(&b),
            Err(AbiError::OutOfRange { .. })
        ));
        b[2] = 0;
        b[1] = flags::INLINE;
        b[3] = 33;
        assert_eq!(
            WqeRepr::from_bytes(&b).err(),
            Some(AbiError::OutOfRange {
                what: "inline length",
                value: 33,
                max: 32
            })
        );
        b[3] = 0;
        b[1] = 0x80;
        assert_eq!(
            WqeRepr::from_bytes(&b).err(),
            Some(AbiError::Unknown {
                what: "WQE flags",
                value: 128
            })
        );
        assert_eq!(
            Wqe::new_checked(&b[..63]).err(),
            Some(AbiError::Truncated { len: 63, need: 64 })
        );
    }
}
