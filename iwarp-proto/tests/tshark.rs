//! The wire as Wireshark's own iWARP dissectors read it: a capture (written here as a pcap:
//! Ethernet / IPv4 / TCP around an enhanced MPA request and reply and FPDUs of every RDMAP
//! opcode, CRC on, one FPDU per TCP segment) must dissect with `tshark` as `iwarp_mpa` +
//! `iwarp_ddp_rdmap` with "Good CRC32" on every FPDU and no malformed packet or expert
//! error; a copy with one payload byte flipped must show a bad CRC on exactly that frame; the
//! same traffic with CRC negotiated off (zero CRC fields) must dissect clean with no CRC check.
//! The MPA frames come from `iwarp_proto::mpa` and are compared with bytes written by hand
//! from RFC 5044 / RFC 6581, so the connection-setup codec is checked by Wireshark too.
//!
//! Needs the `tshark` command (Debian package `tshark`, in scripts/host-packages.txt). Without
//! it the test fails, unless `VRDMA_SKIP_TSHARK=1`, when it says loudly that it did not run.

use std::net::{Ipv4Addr, SocketAddrV4};

use iwarp_proto::fpdu::FpduRepr;
use iwarp_proto::message::{self, Body, MessageRepr};
use iwarp_proto::mpa::{FrameKind, IrdOrd, MpaRepr};
use iwarp_proto::rdmap::{Opcode, ReadRequestRepr};
use iwarp_proto::terminate::{TermCode, TerminateRepr};
use tshark_support::pcap::{self, Flow};
use tshark_support::tshark::{self, dissect, expert, TempPcap};

const INITIATOR: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 40001);
const RESPONDER: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 3), 40002);

/// What the capture is made of, in order.
struct Capture {
    pcap: pcap::Capture,
    flow: Flow,
    /// (frame number, what it carries) of every FPDU.
    fpdus: Vec<(usize, String)>,
    /// CRC negotiated (both frames' C bit) and in every FPDU.
    crc: bool,
}

impl Capture {
    fn new(crc: bool) -> Capture {
        Capture {
            pcap: pcap::Capture::new(),
            flow: Flow::new(INITIATOR, RESPONDER),
            fpdus: Vec::new(),
            crc,
        }
    }

    /// One segment, `true` = initiator → responder; its frame number.
    fn segment(&mut self, forward: bool, payload: &[u8]) -> usize {
        self.flow.data(&mut self.pcap, forward, payload)
    }

    fn fpdu(&mut self, forward: bool, what: &str, ulpdu: &[u8]) -> usize {
        // Every ULPDU sent here is one the receive path parses.
        MessageRepr::parse(ulpdu).unwrap_or_else(|e| panic!("{what}: {e}"));
        let bytes = FpduRepr { ulpdu }.to_vec(self.crc).unwrap();
        let n = self.segment(forward, &bytes);
        self.fpdus.push((n, what.to_string()));
        n
    }
}

/// MPA request or reply written by hand from RFC 5044 §7.1 / RFC 6581 §5: key, flags C (when
/// `crc`) + Enhanced, revision 2, private data = IRD/ORD word (peer-to-peer, Write RTR, 16
/// reads) + `extra`.
fn mpa_frame_by_hand(key: &[u8; 16], crc: bool, extra: &[u8]) -> Vec<u8> {
    let mut f = key.to_vec();
    f.push(if crc { 0x40 } else { 0 } | 0x10);
    f.push(2);
    f.extend_from_slice(&((4 + extra.len()) as u16).to_be_bytes());
    f.extend_from_slice(&(0x8000u16 | 16).to_be_bytes()); // P + IRD 16
    f.extend_from_slice(&(0x8000u16 | 16).to_be_bytes()); // Write RTR + ORD 16
    f.extend_from_slice(extra);
    f
}

/// The same frame as connection setup (`iwarp_proto::mpa`) emits it; it must be the bytes
/// written by hand, so Wireshark checks the codec's frames too.
fn mpa_frame(kind: FrameKind, crc: bool, extra: &[u8]) -> Vec<u8> {
    let repr = MpaRepr {
        kind,
        markers: false,
        crc,
        reject: false,
        revision: 2,
        ird_ord: Some(IrdOrd {
            ird: 16,
            ord: 16,
            p2p: true,
            rtr_b: false,
            rtr_write: true,
            rtr_read: false,
        }),
        private_data: extra,
    };
    let bytes = repr.to_vec().unwrap();
    assert_eq!(bytes, mpa_frame_by_hand(kind.key(), crc, extra), "{kind:?}");
    bytes
}

fn data_message(ddp: iwarp_proto::ddp::DdpRepr, payload: &[u8]) -> Vec<u8> {
    [ddp.to_vec(), payload.to_vec()].concat()
}

fn with_body(op: Opcode, body: Body<'_>, msn: u32) -> Vec<u8> {
    let m = MessageRepr {
        ddp: message::untagged_header(op, true, 0, msn, 0),
        opcode: op,
        body,
        payload: 0..0,
    };
    let mut buf = vec![0u8; m.headers_len()];
    m.emit_headers(&mut buf).unwrap();
    buf
}

fn build(crc: bool) -> Capture {
    let mut c = Capture::new(crc);
    c.flow.handshake(&mut c.pcap);
    c.segment(true, &mpa_frame(FrameKind::Request, crc, b"vrdma-pd"));
    c.segment(false, &mpa_frame(FrameKind::Reply, crc, b""));

    let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    // RTR: a zero-length RDMA Write.
    c.fpdu(
        true,
        "RTR write",
        &data_message(message::tagged_header(Opcode::Write, true, 0, 0), &[]),
    );
    // An RDMA Write in two segments.
    c.fpdu(
        true,
        "write 1/2",
        &data_message(
            message::tagged_header(Opcode::Write, false, 0x0001_0203, 0x7000),
            &payload[..600],
        ),
    );
    c.fpdu(
        true,
        "write 2/2",
        &data_message(
            message::tagged_header(Opcode::Write, true, 0x0001_0203, 0x7000 + 600),
            &payload[600..],
        ),
    );
    let rr = ReadRequestRepr {
        sink_stag: 0x0000_1100,
        sink_to: 0x4000,
        size: 333,
        source_stag: 0x0000_2200,
        source_to: 0x9000,
    };
    c.fpdu(
        true,
        "read request",
        &with_body(Opcode::ReadRequest, Body::ReadRequest(rr), 1),
    );
    c.fpdu(
        false,
        "read response",
        &data_message(
            message::tagged_header(Opcode::ReadResponse, true, 0x0000_1100, 0x4000),
            &payload[..333],
        ),
    );
    let mut msn = 0;
    for (op, len) in [
        (Opcode::Send, 1usize),
        (Opcode::SendInvalidate, 2),
        (Opcode::SendSe, 3),
        (Opcode::SendSeInvalidate, 64),
    ] {
        msn += 1;
        let inv = if op.invalidates() { 0x0000_3300 } else { 0 };
        c.fpdu(
            true,
            &format!("{op:?}"),
            &data_message(
                message::untagged_header(op, true, inv, msn, 0),
                &payload[..len],
            ),
        );
    }
    // A Terminate for an invalid STag on a Write, copying the offending segment as siw does.
    let bad = data_message(
        message::tagged_header(Opcode::Write, true, 0xbad0_0000, 0),
        &payload[..20],
    );
    let block = [
        (bad.len() as u16).to_be_bytes().to_vec(),
        bad[..14].to_vec(),
    ]
    .concat();
    let term = TerminateRepr::with_header(TermCode::DDP_INVALID_STAG, false, &block);
    c.fpdu(
        false,
        "terminate",
        &with_body(Opcode::Terminate, Body::Terminate(term), 1),
    );
    c
}

#[test]
fn tshark_dissects_every_fpdu_with_good_crc() {
    if !tshark::need("tshark_dissects_every_fpdu_with_good_crc") {
        return;
    }
    let capture = build(true);
    let good = TempPcap::write("iwarp-good", capture.pcap.bytes());
    let frames = dissect(good.path());
    assert_eq!(
        frames.len(),
        capture.pcap.frames(),
        "tshark read every frame"
    );
    assert!(
        frames[3].contains("MPA Request Frame") || frames[3].contains("Request frame header"),
        "{}",
        frames[3]
    );
    assert!(frames[4].contains("Reply frame header"), "{}", frames[4]);
    for (n, what) in &capture.fpdus {
        let f = &frames[n - 1];
        assert!(
            f.contains("iwarp_mpa") && f.contains("iwarp_ddp_rdmap"),
            "frame {n} ({what}) not dissected as iwarp_mpa + iwarp_ddp_rdmap:\n{f}"
        );
        assert!(
            f.contains("(Good CRC32)"),
            "frame {n} ({what}): no good CRC:\n{f}"
        );
        assert!(
            !f.contains("Bad CRC32") && !f.contains("Malformed"),
            "frame {n} ({what}):\n{f}"
        );
    }
    // Every opcode appears in the dissection.
    let all = frames.concat();
    for name in [
        "Write (0x0)",
        "Read Request (0x1)",
        "Read Response (0x2)",
        "Send (0x3)",
        "Send with Invalidate (0x4)",
        "Send with SE (0x5)",
        "Send with SE and Invalidate (0x6)",
        "Terminate (0x7)",
    ] {
        assert!(
            all.contains(&format!("OpCode: {name}")),
            "no {name} in the dissection"
        );
    }
    // No expert errors anywhere; the only warnings are on the MPA request/reply (Wireshark
    // knows revision 1 only and calls the Enhanced flag reserved).
    for (frame, sev, msg) in expert(good.path()) {
        assert!(
            sev != "Error" && !msg.contains("Malformed"),
            "frame {frame}: {sev} {msg}"
        );
        if sev == "Warning" {
            assert!(frame == 4 || frame == 5, "frame {frame}: warning {msg}");
        }
    }

    // One payload byte flipped in the Send with SE: a bad CRC on that frame only.
    let (target, _) = capture
        .fpdus
        .iter()
        .find(|(_, w)| w == "SendSe")
        .cloned()
        .unwrap();
    // The byte after its MPA length (2) and DDP/RDMAP header (18).
    let bad = TempPcap::write("iwarp-bad", &capture.pcap.with_flipped(target, 2 + 18));
    let frames = dissect(bad.path());
    for (n, what) in &capture.fpdus {
        let f = &frames[n - 1];
        if *n == target {
            assert!(
                f.contains("Bad CRC32"),
                "frame {n} ({what}) corrupted but:\n{f}"
            );
        } else {
            assert!(f.contains("(Good CRC32)"), "frame {n} ({what}):\n{f}");
        }
    }

    // CRC negotiated off (siw's default): the same traffic with a zero CRC field dissects
    // clean, and Wireshark, told by the frames that there is no CRC, does not check it.
    let plain = build(false);
    let plain_path = TempPcap::write("iwarp-nocrc", plain.pcap.bytes());
    let frames = dissect(plain_path.path());
    for (n, what) in &plain.fpdus {
        let f = &frames[n - 1];
        assert!(
            f.contains("iwarp_mpa") && f.contains("iwarp_ddp_rdmap"),
            "CRC off: frame {n} ({what}) not dissected:\n{f}"
        );
        assert!(
            f.contains("CRC: 0x00000000"),
            "CRC off: frame {n} ({what}):\n{f}"
        );
        assert!(
            !f.contains("CRC32") && !f.contains("Malformed"),
            "CRC off: frame {n} ({what}):\n{f}"
        );
    }
    for (frame, sev, msg) in expert(plain_path.path()) {
        assert!(
            sev != "Error" && !msg.contains("Malformed"),
            "CRC off: frame {frame}: {sev} {msg}"
        );
    }
}
