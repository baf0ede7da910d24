//! A capture file (pcap, Ethernet / IPv4 / TCP) of iWARP byte streams the [`crate::proxy`]
//! recorded, for Wireshark's dissectors (`tshark`): each connection gets a TCP handshake, then
//! its MPA request and reply and every FPDU each in a TCP segment of its own (the iWARP
//! dissector reads an FPDU from the start of a segment), cut from the recorded stream by the
//! MPA framing (RFC 5044 §7.1 frame: 16-byte key, flags, revision, private data length,
//! private data; §4 FPDU: ULPDU length, ULPDU, pad to 4, CRC — the CRC field is there,
//! zero, when CRC is off; never markers).
//!
//! Addresses and ports in the file are the ones given; sequence numbers count from 1000 (the
//! initiator) and 5000 (the responder). The pcap writing is `tshark_support::pcap`'s, which
//! `iwarp-proto`'s own Wireshark test uses too.

use std::net::SocketAddrV4;

use tshark_support::pcap::{self, Flow};

use crate::proxy::{Chunk, Dir};

/// What one frame of the capture carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// The SYN, SYN-ACK and ACK of a connection.
    Handshake,
    /// An MPA request (initiator) or reply (responder).
    Mpa,
    /// One FPDU.
    Fpdu,
    /// Bytes left at the end of a stream that make no whole frame (a cut connection).
    Partial,
}

/// A capture being written.
pub struct Capture {
    pcap: pcap::Capture,
    /// (frame number from 1, what it is, connection, initiator → responder).
    pub frames: Vec<(usize, Unit, u64, bool)>,
}

/// Cuts whole frames off the front of one direction's pending bytes.
struct Framer {
    pending: Vec<u8>,
    /// The MPA request/reply is still to come (the first frame of each direction).
    setup: bool,
}

impl Framer {
    fn next(&mut self) -> Option<(Unit, Vec<u8>)> {
        let need = if self.setup {
            // key(16) flags(1) revision(1) private data length(2) private data.
            let h = self.pending.get(18..20)?;
            20 + usize::from(u16::from_be_bytes([h[0], h[1]]))
        } else {
            let h = self.pending.get(0..2)?;
            let unpadded = 2 + usize::from(u16::from_be_bytes([h[0], h[1]]));
            unpadded.next_multiple_of(4) + 4
        };
        if self.pending.len() < need {
            return None;
        }
        let unit = if self.setup { Unit::Mpa } else { Unit::Fpdu };
        self.setup = false;
        let rest = self.pending.split_off(need);
        Some((unit, std::mem::replace(&mut self.pending, rest)))
    }
}

impl Default for Capture {
    fn default() -> Self {
        Capture::new()
    }
}

impl Capture {
    pub fn new() -> Capture {
        Capture {
            pcap: pcap::Capture::new(),
            frames: Vec::new(),
        }
    }

    /// The pcap file.
    pub fn bytes(&self) -> &[u8] {
        self.pcap.bytes()
    }

    /// The frames that carry `unit`.
    pub fn count(&self, unit: Unit) -> usize {
        self.frames.iter().filter(|f| f.1 == unit).count()
    }

    /// The capture with the byte at `offset` of frame `frame`'s TCP payload XORed with 0xff
    /// (the TCP checksum left as it was: what a bad CRC must catch, not TCP).
    pub fn with_flipped(&self, frame: usize, offset: usize) -> Vec<u8> {
        self.pcap.with_flipped(frame, offset)
    }

    /// One segment of `flow` (see [`Flow::segment`]), recorded in [`Capture::frames`].
    fn segment(
        &mut self,
        flow: &mut Flow,
        conn: u64,
        forward: bool,
        flags: u8,
        unit: Unit,
        payload: &[u8],
    ) {
        let n = flow.segment(&mut self.pcap, forward, flags, payload);
        self.frames.push((n, unit, conn, forward));
    }

    /// Adds connection `conn` of `chunks` (a proxy's recording; other connections' chunks are
    /// skipped) as a TCP connection from `initiator` to `responder`. Returns the bytes of each
    /// direction that made no whole frame (written as one [`Unit::Partial`] segment).
    pub fn add_connection(
        &mut self,
        chunks: &[Chunk],
        conn: u64,
        initiator: SocketAddrV4,
        responder: SocketAddrV4,
    ) -> [usize; 2] {
        let mut flow = Flow::new(initiator, responder);
        // Handshake: SYN, SYN-ACK, ACK.
        for (forward, flags) in [
            (true, pcap::SYN),
            (false, pcap::SYN | pcap::ACK),
            (true, pcap::ACK),
        ] {
            self.segment(&mut flow, conn, forward, flags, Unit::Handshake, &[]);
        }
        let mut framers = [
            Framer {
                pending: Vec::new(),
                setup: true,
            },
            Framer {
                pending: Vec::new(),
                setup: true,
            },
        ];
        let mut emit = |cap: &mut Capture, d: usize, unit: Unit, payload: &[u8]| {
            cap.segment(&mut flow, conn, d == 0, pcap::PSH_ACK, unit, payload);
        };
        for c in chunks.iter().filter(|c| c.conn == conn) {
            let d = match c.dir {
                Dir::ToTarget => 0,
                Dir::FromTarget => 1,
            };
            framers[d].pending.extend_from_slice(&c.bytes);
            while let Some((unit, bytes)) = framers[d].next() {
                emit(self, d, unit, &bytes);
            }
        }
        let mut left = [0; 2];
        for d in 0..2 {
            let rest = std::mem::take(&mut framers[d].pending);
            left[d] = rest.len();
            for piece in rest.chunks(65_000) {
                emit(self, d, Unit::Partial, piece);
            }
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn chunk(dir: Dir, bytes: &[u8]) -> Chunk {
        Chunk {
            conn: 0,
            dir,
            bytes: bytes.to_vec(),
        }
    }

    #[test]
    fn streams_are_cut_at_mpa_frames_and_fpdus_whatever_the_chunks() {
        // MPA request with 4 bytes of private data, then FPDUs of ULPDU length 18 (pad 0:
        // 2 + 18 = 20) and 5 (2 + 5 = 7, pad 1), each with its CRC field.
        let mut req = vec![0u8; 20];
        req[19] = 4;
        req.extend_from_slice(&[9; 4]);
        let mut f1 = vec![0, 18];
        f1.extend_from_slice(&[1; 18]);
        f1.extend_from_slice(&[0; 4]);
        let mut f2 = vec![0, 5];
        f2.extend_from_slice(&[2; 5]);
        f2.extend_from_slice(&[0; 1 + 4]);
        let stream: Vec<u8> = [req.clone(), f1.clone(), f2.clone()].concat();
        let reply = vec![0u8; 20];
        // Chunks cut at odd places, the reply between.
        let chunks = vec![
            chunk(Dir::ToTarget, &stream[..7]),
            chunk(Dir::ToTarget, &stream[7..30]),
            chunk(Dir::FromTarget, &reply),
            chunk(Dir::ToTarget, &stream[30..]),
        ];
        let mut cap = Capture::new();
        let a = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 40000);
        let b = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 3), 50000);
        assert_eq!(cap.add_connection(&chunks, 0, a, b), [0, 0]);
        let units: Vec<(Unit, bool)> = cap.frames.iter().map(|f| (f.1, f.3)).collect();
        assert_eq!(
            units,
            [
                (Unit::Handshake, true),
                (Unit::Handshake, false),
                (Unit::Handshake, true),
                (Unit::Mpa, true),
                (Unit::Mpa, false),
                (Unit::Fpdu, true),
                (Unit::Fpdu, true),
            ]
        );
        // 24-byte header, then frames: 16-byte record header + 54 bytes of headers + payload.
        let sizes: usize = [0, 0, 0, 20, req.len(), f1.len(), f2.len()]
            .iter()
            .map(|p| 16 + 54 + p)
            .sum();
        assert_eq!(cap.bytes().len(), 24 + sizes);
        // A cut stream leaves what makes no frame.
        let mut cap = Capture::new();
        let cut = vec![chunk(Dir::ToTarget, &stream[..30])];
        assert_eq!(cap.add_connection(&cut, 0, a, b), [30 - 24, 0]);
        assert_eq!(cap.count(Unit::Partial), 1);
    }
}
