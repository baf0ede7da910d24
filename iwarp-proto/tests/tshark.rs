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

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use iwarp_proto::fpdu::FpduRepr;
use iwarp_proto::message::{self, Body, MessageRepr};
use iwarp_proto::mpa::{FrameKind, IrdOrd, MpaRepr};
use iwarp_proto::rdmap::{Opcode, ReadRequestRepr};
use iwarp_proto::terminate::{TermCode, TerminateRepr};

const INITIATOR: (Ipv4Addr, u16) = (Ipv4Addr::new(127, 0, 0, 2), 40001);
const RESPONDER: (Ipv4Addr, u16) = (Ipv4Addr::new(127, 0, 0, 3), 40002);

/// What the capture is made of, in order; `true` = initiator → responder.
struct Capture {
    pcap: Vec<u8>,
    frames: usize,
    seq: [u32; 2],
    /// (frame number, what it carries) of every FPDU.
    fpdus: Vec<(usize, String)>,
    /// CRC negotiated (both frames' C bit) and in every FPDU.
    crc: bool,
}

fn checksum(chunks: &[&[u8]]) -> u16 {
    let mut sum = 0u32;
    for chunk in chunks {
        for pair in chunk.chunks(2) {
            let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
            sum += u32::from(word);
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl Capture {
    fn new(crc: bool) -> Capture {
        let mut pcap = Vec::new();
        pcap.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        pcap.extend_from_slice(&2u16.to_le_bytes());
        pcap.extend_from_slice(&4u16.to_le_bytes());
        pcap.extend_from_slice(&0i32.to_le_bytes());
        pcap.extend_from_slice(&0u32.to_le_bytes());
        pcap.extend_from_slice(&65535u32.to_le_bytes());
        pcap.extend_from_slice(&1u32.to_le_bytes()); // LINKTYPE_ETHERNET
        Capture {
            pcap,
            frames: 0,
            seq: [1000, 5000],
            fpdus: Vec::new(),
            crc,
        }
    }

    /// One TCP segment; returns its frame number (1-based, as tshark counts).
    fn segment(&mut self, forward: bool, flags: u8, payload: &[u8]) -> usize {
        let (src, dst) = if forward {
            (INITIATOR, RESPONDER)
        } else {
            (RESPONDER, INITIATOR)
        };
        let (me, peer) = if forward { (0, 1) } else { (1, 0) };
        let syn = flags & 0x02 != 0;
        let seq = self.seq[me];
        let ack = if flags & 0x10 != 0 { self.seq[peer] } else { 0 };
        self.seq[me] = seq
            .wrapping_add(payload.len() as u32)
            .wrapping_add(u32::from(syn));

        let mut tcp = Vec::with_capacity(20 + payload.len());
        tcp.extend_from_slice(&src.1.to_be_bytes());
        tcp.extend_from_slice(&dst.1.to_be_bytes());
        tcp.extend_from_slice(&seq.to_be_bytes());
        tcp.extend_from_slice(&ack.to_be_bytes());
        tcp.push(5 << 4);
        tcp.push(flags);
        tcp.extend_from_slice(&65535u16.to_be_bytes());
        tcp.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent
        tcp.extend_from_slice(payload);
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.0.octets());
        pseudo.extend_from_slice(&dst.0.octets());
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
        let c = checksum(&[&pseudo, &tcp]);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());

        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&((20 + tcp.len()) as u16).to_be_bytes());
        ip.extend_from_slice(&(self.frames as u16).to_be_bytes());
        ip.extend_from_slice(&[0x40, 0, 64, 6, 0, 0]);
        ip.extend_from_slice(&src.0.octets());
        ip.extend_from_slice(&dst.0.octets());
        let c = checksum(&[&ip]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());

        let mut frame = Vec::new();
        frame.extend_from_slice(&[2, 0, 0, 0, 0, if forward { 3 } else { 2 }]);
        frame.extend_from_slice(&[2, 0, 0, 0, 0, if forward { 2 } else { 3 }]);
        frame.extend_from_slice(&0x0800u16.to_be_bytes());
        frame.extend_from_slice(&ip);
        frame.extend_from_slice(&tcp);

        self.frames += 1;
        self.pcap
            .extend_from_slice(&(1_700_000_000u32).to_le_bytes());
        self.pcap
            .extend_from_slice(&(self.frames as u32 * 1000).to_le_bytes());
        self.pcap
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.pcap
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.pcap.extend_from_slice(&frame);
        self.frames
    }

    fn fpdu(&mut self, forward: bool, what: &str, ulpdu: &[u8]) -> usize {
        // Every ULPDU sent here is one the receive path parses.
        MessageRepr::parse(ulpdu).unwrap_or_else(|e| panic!("{what}: {e}"));
        let bytes = FpduRepr { ulpdu }.to_vec(self.crc).unwrap();
        let n = self.segment(forward, 0x18, &bytes);
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
    c.segment(true, 0x02, &[]); // SYN
    c.segment(false, 0x12, &[]); // SYN ACK
    c.segment(true, 0x10, &[]); // ACK
    c.segment(true, 0x18, &mpa_frame(FrameKind::Request, crc, b"vrdma-pd"));
    c.segment(false, 0x18, &mpa_frame(FrameKind::Reply, crc, b""));

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

fn tshark_present() -> bool {
    match Command::new("tshark").arg("--version").output() {
        Ok(out) => out.status.success(),
        Err(_) => false,
    }
}

/// A capture file removed when dropped (also when an assertion fails).
struct TempPcap(PathBuf);

impl Drop for TempPcap {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn temp_pcap(name: &str, bytes: &[u8]) -> TempPcap {
    let path = std::env::temp_dir().join(format!("vrdma-iwarp-{}-{name}.pcap", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    TempPcap(path)
}

/// Options of every run: the payloads here are arbitrary bytes, so the heuristic ULP
/// dissectors Wireshark runs on iWARP payloads (RPC-over-RDMA, SMB Direct) are off — they
/// would judge our test pattern, not our framing.
const OPTIONS: [&str; 7] = [
    "-n",
    "--disable-protocol",
    "rpcordma",
    "--disable-protocol",
    "smb_direct",
    "-o",
    "tcp.check_checksum:TRUE",
];

/// `tshark -V` of a capture, split per frame (index 0 = frame 1).
fn dissect(path: &Path) -> Vec<String> {
    let out = Command::new("tshark")
        .args(OPTIONS)
        .arg("-r")
        .arg(path)
        .arg("-V")
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut frames: Vec<String> = Vec::new();
    for line in text.lines() {
        if line.starts_with("Frame ") && line.contains(" bytes on wire") {
            frames.push(String::new());
        }
        if let Some(f) = frames.last_mut() {
            f.push_str(line);
            f.push('\n');
        }
    }
    frames
}

/// Expert infos of the capture: (frame, severity, message) from `-T fields`.
fn expert(path: &Path) -> Vec<(usize, String, String)> {
    let out = Command::new("tshark")
        .args(OPTIONS)
        .arg("-r")
        .arg(path)
        .args([
            "-T",
            "fields",
            "-e",
            "frame.number",
            "-e",
            "_ws.expert.severity",
            "-e",
            "_ws.expert.message",
            "-e",
            "_ws.malformed",
        ])
        .output()
        .expect("run tshark");
    assert!(out.status.success());
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        let frame: usize = cols[0].parse().unwrap();
        let sev = cols.get(1).copied().unwrap_or("");
        let msg = cols.get(2).copied().unwrap_or("");
        let malformed = cols.get(3).copied().unwrap_or("");
        if !sev.is_empty() || !malformed.is_empty() {
            found.push((frame, sev.to_string(), format!("{msg} {malformed}")));
        }
    }
    found
}

#[test]
fn tshark_dissects_every_fpdu_with_good_crc() {
    if !tshark_present() {
        if std::env::var("VRDMA_SKIP_TSHARK").as_deref() == Ok("1") {
            eprintln!(
                "\n!!!!! tshark_dissects_every_fpdu_with_good_crc DID NOT RUN: tshark is not \
                 installed and VRDMA_SKIP_TSHARK=1 !!!!!\n"
            );
            return;
        }
        panic!(
            "tshark not found: install it (`apt-get install tshark`, listed in \
             scripts/host-packages.txt) or set VRDMA_SKIP_TSHARK=1 to skip this check"
        );
    }
    let capture = build(true);
    let good = temp_pcap("good", &capture.pcap);
    let frames = dissect(&good.0);
    assert_eq!(frames.len(), capture.frames, "tshark read every frame");
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
    for (frame, sev, msg) in expert(&good.0) {
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
    let mut bad = capture.pcap.clone();
    // Walk the pcap records to the target frame; flip the byte after its DDP header.
    let mut at = 24;
    for _ in 1..target {
        let len = u32::from_le_bytes(bad[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 16 + len;
    }
    let payload_at = at + 16 + 14 + 20 + 20 + 2 + 18;
    bad[payload_at] ^= 0x5a;
    let bad_path = temp_pcap("bad", &bad);
    let frames = dissect(&bad_path.0);
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
    let plain_path = temp_pcap("nocrc", &plain.pcap);
    let frames = dissect(&plain_path.0);
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
    for (frame, sev, msg) in expert(&plain_path.0) {
        assert!(
            sev != "Error" && !msg.contains("Malformed"),
            "CRC off: frame {frame}: {sev} {msg}"
        );
    }
}
