//! A pcap file (LINKTYPE_ETHERNET) of TCP segments: Ethernet / IPv4 / TCP headers with good
//! checksums around each payload, one frame per segment. [`Flow`] numbers one connection's
//! segments: sequence numbers from 1000 (initiator) and 5000 (responder), SYN / SYN-ACK / ACK,
//! then PSH|ACK data segments.

use std::net::SocketAddrV4;

/// TCP flags.
pub const SYN: u8 = 0x02;
pub const ACK: u8 = 0x10;
pub const PSH_ACK: u8 = 0x18;

/// The largest payload of one segment (IPv4's 16-bit length less the headers).
pub const MAX_PAYLOAD: usize = 65_495;

/// A pcap file being written.
pub struct Capture {
    bytes: Vec<u8>,
    frames: usize,
    /// Where each frame's TCP payload starts in the file (index 0 = frame 1).
    payload_at: Vec<usize>,
}

impl Default for Capture {
    fn default() -> Self {
        Capture::new()
    }
}

fn checksum(chunks: &[&[u8]]) -> u16 {
    let mut sum = 0u32;
    for chunk in chunks {
        for pair in chunk.chunks(2) {
            sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl Capture {
    /// An empty capture: the pcap file header.
    pub fn new() -> Capture {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        bytes.extend_from_slice(&2u16.to_le_bytes());
        bytes.extend_from_slice(&4u16.to_le_bytes());
        bytes.extend_from_slice(&0i32.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&262_144u32.to_le_bytes()); // snap length
        bytes.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
        Capture {
            bytes,
            frames: 0,
            payload_at: Vec::new(),
        }
    }

    /// The pcap file.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// How many frames it holds.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// One TCP segment from `src` to `dst`; returns its frame number (from 1, as tshark
    /// counts).
    pub fn segment(
        &mut self,
        src: SocketAddrV4,
        dst: SocketAddrV4,
        (seq, ack): (u32, u32),
        flags: u8,
        payload: &[u8],
    ) -> usize {
        assert!(
            payload.len() <= MAX_PAYLOAD,
            "a segment of {} bytes",
            payload.len()
        );
        let mut tcp = Vec::with_capacity(20 + payload.len());
        tcp.extend_from_slice(&src.port().to_be_bytes());
        tcp.extend_from_slice(&dst.port().to_be_bytes());
        tcp.extend_from_slice(&seq.to_be_bytes());
        tcp.extend_from_slice(&ack.to_be_bytes());
        tcp.push(5 << 4);
        tcp.push(flags);
        tcp.extend_from_slice(&65535u16.to_be_bytes());
        tcp.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent
        tcp.extend_from_slice(payload);
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.ip().octets());
        pseudo.extend_from_slice(&dst.ip().octets());
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
        let c = checksum(&[&pseudo, &tcp]);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());

        self.frames += 1;
        let n = self.frames;
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&((20 + tcp.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&(n as u16).to_be_bytes());
        ip.extend_from_slice(&[0x40, 0, 64, 6, 0, 0]);
        ip.extend_from_slice(&src.ip().octets());
        ip.extend_from_slice(&dst.ip().octets());
        let c = checksum(&[&ip]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());

        let mut frame = Vec::with_capacity(14 + ip.len() + tcp.len());
        frame.extend_from_slice(&[2, 0, 0, 0, 0, dst.ip().octets()[3]]);
        frame.extend_from_slice(&[2, 0, 0, 0, 0, src.ip().octets()[3]]);
        frame.extend_from_slice(&0x0800u16.to_be_bytes());
        frame.extend_from_slice(&ip);
        frame.extend_from_slice(&tcp);
        self.bytes
            .extend_from_slice(&1_700_000_000u32.to_le_bytes());
        self.bytes
            .extend_from_slice(&((n as u32) % 1_000_000).to_le_bytes());
        self.bytes
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.bytes
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.payload_at.push(self.bytes.len() + 14 + 20 + 20);
        self.bytes.extend_from_slice(&frame);
        n
    }

    /// The capture with the byte at `offset` of frame `frame`'s TCP payload XORed with 0xff
    /// (the TCP checksum left as it was: what a bad CRC must catch, not TCP).
    pub fn with_flipped(&self, frame: usize, offset: usize) -> Vec<u8> {
        let mut b = self.bytes.clone();
        b[self.payload_at[frame - 1] + offset] ^= 0xff;
        b
    }
}

/// One TCP connection in a [`Capture`]: its two ends and next sequence numbers.
pub struct Flow {
    ends: [SocketAddrV4; 2],
    seq: [u32; 2],
}

impl Flow {
    /// A connection from `initiator` to `responder`, not yet in the capture.
    pub fn new(initiator: SocketAddrV4, responder: SocketAddrV4) -> Flow {
        Flow {
            ends: [initiator, responder],
            seq: [1000, 5000],
        }
    }

    /// A segment from the initiator (`forward`) or the responder; its frame number. A SYN
    /// takes one sequence number; the acknowledgement is the peer's next one when `flags` has
    /// ACK.
    pub fn segment(
        &mut self,
        cap: &mut Capture,
        forward: bool,
        flags: u8,
        payload: &[u8],
    ) -> usize {
        let (me, peer) = if forward { (0, 1) } else { (1, 0) };
        let seq = self.seq[me];
        let ack = if flags & ACK != 0 { self.seq[peer] } else { 0 };
        self.seq[me] = seq
            .wrapping_add(payload.len() as u32)
            .wrapping_add(u32::from(flags & SYN != 0));
        cap.segment(self.ends[me], self.ends[peer], (seq, ack), flags, payload)
    }

    /// The SYN, SYN-ACK and ACK.
    pub fn handshake(&mut self, cap: &mut Capture) {
        self.segment(cap, true, SYN, &[]);
        self.segment(cap, false, SYN | ACK, &[]);
        self.segment(cap, true, ACK, &[]);
    }

    /// A PSH|ACK segment of `payload`; its frame number.
    pub fn data(&mut self, cap: &mut Capture, forward: bool, payload: &[u8]) -> usize {
        self.segment(cap, forward, PSH_ACK, payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn segments_are_numbered_and_laid_out_as_pcap_records() {
        let a = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 40000);
        let b = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 3), 50000);
        let mut cap = Capture::new();
        let mut flow = Flow::new(a, b);
        flow.handshake(&mut cap);
        assert_eq!(flow.data(&mut cap, true, b"hello"), 4);
        assert_eq!(flow.data(&mut cap, false, b"hi"), 5);
        assert_eq!(cap.frames(), 5);
        // 24-byte file header; per frame a 16-byte record header and 54 bytes of headers.
        assert_eq!(cap.bytes().len(), 24 + 5 * (16 + 54) + 5 + 2);
        // Frame 4: seq 1001 (after the SYN), ack 5001; frame 5: seq 5001, ack 1006.
        let tcp4 = 24 + 3 * 70 + 16 + 14 + 20;
        let b = cap.bytes();
        assert_eq!(b[tcp4 + 4..tcp4 + 12], [0, 0, 3, 0xe9, 0, 0, 0x13, 0x89]);
        let tcp5 = tcp4 + 20 + 5 + 16 + 14 + 20;
        assert_eq!(b[tcp5 + 4..tcp5 + 12], [0, 0, 0x13, 0x89, 0, 0, 3, 0xee]);
        // The TCP checksum verifies (sums to 0xffff with the pseudo header).
        let seg = &b[tcp5..tcp5 + 22];
        let pseudo = [
            &[127, 0, 0, 3, 127, 0, 0, 2, 0, 6][..],
            &22u16.to_be_bytes(),
        ]
        .concat();
        assert_eq!(checksum(&[&pseudo, seg]), 0);
        let flipped = cap.with_flipped(5, 1);
        assert_eq!(flipped[tcp5 + 20 + 1], b'i' ^ 0xff);
    }
}
