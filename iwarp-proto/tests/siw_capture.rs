//! Linux siw's own wire, as captured in the Xen lab (`tests/xen-lab/run-siw.sh`; how the
//! fixtures in `tests/data/` were made and what Wireshark says about them:
//! `tests/data/README.md`), read back with this crate's codec: each capture's TCP
//! connections are reassembled per direction, the initiator's stream must start with an MPA
//! request and the responder's with an MPA reply, and everything after them must be whole
//! FPDUs (CRC checked when the reply set C) whose ULPDUs parse as RDMAP messages with the
//! opcodes the tool sends — nothing left over at the end of either stream.
//!
//! The pcap reader and the TCP reassembly are the test's own (no dependency): classic pcap
//! (micro- or nanosecond, either byte order), Ethernet or Linux cooked (v1) or raw IPv4
//! frames, IPv4 + TCP; a missing byte range (a segment the capture lost or cut by its snap
//! length) is an error, retransmitted bytes must equal the first copy.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use iwarp_proto::fpdu::FpduDecoder;
use iwarp_proto::message::MessageRepr;
use iwarp_proto::mpa::{FrameKind, IrdOrd, Mpa, MpaRepr};
use iwarp_proto::rdmap::Opcode;
use iwarp_proto::WireError;

// ---------------------------------------------------------------------------------------
// pcap

/// One captured frame: its link type and bytes (`incl_len` of them).
struct Frame {
    link: u32,
    data: Vec<u8>,
    /// The frame's length on the wire (more than `data` when the snap length cut it).
    orig_len: usize,
}

fn read_pcap(bytes: &[u8]) -> Result<Vec<Frame>, String> {
    if bytes.len() < 24 {
        return Err(format!("{} bytes: no pcap header", bytes.len()));
    }
    let magic = u32::from_le_bytes(bytes[0..4].try_into().unwrap());
    let le = match magic {
        0xa1b2_c3d4 | 0xa1b2_3c4d => true,
        0xd4c3_b2a1 | 0x4d3c_b2a1 => false,
        m => return Err(format!("not a pcap file (magic {m:#010x})")),
    };
    let u32_at = |b: &[u8], at: usize| {
        let w: [u8; 4] = b[at..at + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        }
    };
    let link = u32_at(bytes, 20);
    let mut frames = Vec::new();
    let mut at = 24;
    while at < bytes.len() {
        if bytes.len() - at < 16 {
            return Err(format!("record header cut at byte {at}"));
        }
        let incl = u32_at(bytes, at + 8) as usize;
        let orig = u32_at(bytes, at + 12) as usize;
        let data = bytes
            .get(at + 16..at + 16 + incl)
            .ok_or_else(|| format!("record at byte {at} cut ({incl} bytes announced)"))?;
        frames.push(Frame {
            link,
            data: data.to_vec(),
            orig_len: orig,
        });
        at += 16 + incl;
    }
    Ok(frames)
}

/// The TCP part of one frame.
struct Segment {
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    seq: u32,
    syn: bool,
    payload: Vec<u8>,
}

const LINKTYPE_ETHERNET: u32 = 1;
const LINKTYPE_RAW: u32 = 101;
const LINKTYPE_LINUX_SLL: u32 = 113;

/// The IPv4/TCP segment in a frame; `Ok(None)` for frames that are something else (ARP,
/// IPv6, UDP).
fn tcp_segment(f: &Frame) -> Result<Option<Segment>, String> {
    let d = &f.data[..];
    let ip = match f.link {
        LINKTYPE_ETHERNET if d.len() >= 14 && d[12..14] == [0x08, 0x00] => &d[14..],
        LINKTYPE_LINUX_SLL if d.len() >= 16 && d[14..16] == [0x08, 0x00] => &d[16..],
        LINKTYPE_RAW if d.first().map(|b| b >> 4) == Some(4) => d,
        LINKTYPE_ETHERNET | LINKTYPE_LINUX_SLL | LINKTYPE_RAW => return Ok(None),
        l => return Err(format!("link type {l} not supported")),
    };
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return Err("short or non-IPv4 header".into());
    }
    if ip[9] != 6 {
        return Ok(None);
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    // The IP total length drops Ethernet padding (0: a GSO frame, the rest is the packet).
    let total = match usize::from(u16::from_be_bytes([ip[2], ip[3]])) {
        0 => ip.len(),
        n => n,
    };
    if f.data.len() < f.orig_len || ip.len() < total {
        return Err(format!(
            "frame cut by the capture ({} of {} bytes)",
            f.data.len(),
            f.orig_len
        ));
    }
    let tcp = &ip[ihl..total];
    if tcp.len() < 20 {
        return Err("short TCP header".into());
    }
    let doff = usize::from(tcp[12] >> 4) * 4;
    let addr = |at: usize| Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
    Ok(Some(Segment {
        src: (addr(12), u16::from_be_bytes([tcp[0], tcp[1]])),
        dst: (addr(16), u16::from_be_bytes([tcp[2], tcp[3]])),
        seq: u32::from_be_bytes(tcp[4..8].try_into().unwrap()),
        syn: tcp[13] & 0x02 != 0,
        payload: tcp[doff..].to_vec(),
    }))
}

// ---------------------------------------------------------------------------------------
// TCP reassembly

type Endpoint = (Ipv4Addr, u16);

/// One direction of a connection: the ISN (from its SYN) and the payload by stream offset.
#[derive(Default)]
struct Direction {
    isn: Option<u32>,
    segs: BTreeMap<u32, Vec<u8>>,
}

/// A TCP connection: `initiator` sent the first SYN.
struct Connection {
    initiator: Endpoint,
    responder: Endpoint,
    /// The initiator's stream and the responder's.
    streams: [Vec<u8>; 2],
}

fn reassemble(frames: &[Frame]) -> Result<Vec<Connection>, String> {
    let mut dirs: BTreeMap<(Endpoint, Endpoint), Direction> = BTreeMap::new();
    let mut order: Vec<(Endpoint, Endpoint)> = Vec::new();
    for (i, f) in frames.iter().enumerate() {
        let Some(s) = tcp_segment(f).map_err(|e| format!("frame {}: {e}", i + 1))? else {
            continue;
        };
        let d = dirs.entry((s.src, s.dst)).or_default();
        if s.syn {
            if d.isn.is_none() && !dirs.contains_key(&(s.dst, s.src)) {
                order.push((s.src, s.dst));
            }
            dirs.get_mut(&(s.src, s.dst)).unwrap().isn = Some(s.seq);
            continue;
        }
        if s.payload.is_empty() {
            continue;
        }
        let isn = d
            .isn
            .ok_or_else(|| format!("frame {}: data before the SYN", i + 1))?;
        let off = s.seq.wrapping_sub(isn).wrapping_sub(1);
        let e = d.segs.entry(off).or_default();
        if e.len() < s.payload.len() {
            *e = s.payload;
        }
    }
    let mut conns = Vec::new();
    for (a, b) in order {
        let mut streams = [Vec::new(), Vec::new()];
        for (k, key) in [(a, b), (b, a)].into_iter().enumerate() {
            let Some(d) = dirs.get(&key) else { continue };
            let out = &mut streams[k];
            for (&off, data) in &d.segs {
                let off = off as usize;
                if off > out.len() {
                    return Err(format!(
                        "{}:{} -> {}:{}: bytes {}..{off} missing from the capture",
                        key.0 .0,
                        key.0 .1,
                        key.1 .0,
                        key.1 .1,
                        out.len()
                    ));
                }
                let overlap = (out.len() - off).min(data.len());
                if out[off..off + overlap] != data[..overlap] {
                    return Err(format!("retransmitted bytes at {off} differ"));
                }
                out.extend_from_slice(&data[overlap..]);
            }
        }
        conns.push(Connection {
            initiator: a,
            responder: b,
            streams,
        });
    }
    Ok(conns)
}

// ---------------------------------------------------------------------------------------
// iWARP over the reassembled streams

/// What one connection carried, as this crate reads it.
#[derive(Debug)]
struct Iwarp {
    crc: bool,
    request_pd: Vec<u8>,
    reply_pd: Vec<u8>,
    /// Opcodes of the FPDUs each side sent (initiator's, responder's), in order.
    opcodes: [Vec<Opcode>; 2],
    /// The CRC fields of each FPDU (both directions), as on the wire.
    crc_fields: Vec<[u8; 4]>,
}

#[derive(Debug)]
#[allow(dead_code)] // the fields are read through Debug, in failure messages
enum CheckError {
    Wire {
        side: &'static str,
        at: usize,
        err: WireError,
    },
    Leftover {
        side: &'static str,
        bytes: usize,
    },
    Unexpected(String),
}

/// The MPA frame at the front of `stream` and how long it is.
fn mpa_frame<'a>(stream: &'a [u8], side: &'static str) -> Result<(MpaRepr<'a>, usize), CheckError> {
    let wire = |err| CheckError::Wire { side, at: 0, err };
    let m = Mpa::new_checked(stream).map_err(wire)?;
    let len = m.total_len();
    let r = MpaRepr::from_bytes(&stream[..len]).map_err(wire)?;
    Ok((r, len))
}

fn check_connection(c: &Connection) -> Result<Iwarp, CheckError> {
    let (req, req_len) = mpa_frame(&c.streams[0], "initiator")?;
    let (rep, rep_len) = mpa_frame(&c.streams[1], "responder")?;
    if req.kind != FrameKind::Request || rep.kind != FrameKind::Reply {
        return Err(CheckError::Unexpected(format!(
            "frames {:?} then {:?}",
            req.kind, rep.kind
        )));
    }
    if rep.reject {
        return Err(CheckError::Unexpected("the reply rejects".into()));
    }
    // RFC 5044 §7.1: CRC is used if either side asked (the responder's C bit says).
    let crc = rep.crc;
    let mut opcodes = [Vec::new(), Vec::new()];
    let mut crc_fields = Vec::new();
    for (k, (side, start)) in [("initiator", req_len), ("responder", rep_len)]
        .into_iter()
        .enumerate()
    {
        let stream = &c.streams[k][start..];
        let mut dec = FpduDecoder::new(usize::from(u16::MAX), crc);
        dec.push(stream);
        let mut at = start;
        loop {
            let before = dec.buffered();
            let ulpdu = match dec.next_ulpdu() {
                Ok(Some(u)) => u,
                Ok(None) => break,
                Err(err) => return Err(CheckError::Wire { side, at, err }),
            };
            let m = MessageRepr::parse(ulpdu).map_err(|err| CheckError::Wire { side, at, err })?;
            opcodes[k].push(m.opcode);
            let fpdu_len = before - dec.buffered();
            let end = at - start + fpdu_len;
            crc_fields.push(stream[end - 4..end].try_into().unwrap());
            at += fpdu_len;
        }
        if dec.buffered() != 0 {
            return Err(CheckError::Leftover {
                side,
                bytes: dec.buffered(),
            });
        }
    }
    Ok(Iwarp {
        crc,
        request_pd: req.private_data.to_vec(),
        reply_pd: rep.private_data.to_vec(),
        opcodes,
        crc_fields,
    })
}

// ---------------------------------------------------------------------------------------
// The fixtures

/// Where the captures come from: `tests/data/` (the committed fixtures), or
/// `$SIW_CAPTURE_DIR` when set (`run-siw.sh` points it at the captures it just made, so
/// fresh siw traffic goes through the same codec).
fn capture_dir() -> Option<PathBuf> {
    std::env::var_os("SIW_CAPTURE_DIR").map(PathBuf::from)
}

fn fixture(name: &str) -> Vec<u8> {
    let dir = capture_dir()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data"));
    let p = dir.join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The RDMAP opcodes Wireshark's dissector found in a fresh capture, by opcode: `run-siw.sh`
/// writes `tshark -T fields -e iwarp_rdma.opcode` (one line per frame, several FPDUs of a
/// frame comma-separated, e.g. `0x03,0x03`) beside each capture as `<capture>.opcodes`.
fn tshark_opcodes(dir: &std::path::Path, name: &str) -> BTreeMap<u8, usize> {
    let p = dir.join(format!("{name}.opcodes"));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run-siw.sh writes it with tshark; without it a fresh capture's opcodes \
             have nothing independent to be checked against)",
            p.display()
        )
    });
    let mut out = BTreeMap::new();
    for v in text
        .split([',', '\n'])
        .map(str::trim)
        .filter(|v| !v.is_empty())
    {
        let n = match v.strip_prefix("0x") {
            Some(hex) => u8::from_str_radix(hex, 16),
            None => v.parse(),
        }
        .unwrap_or_else(|e| panic!("{}: opcode {v:?}: {e}", p.display()));
        *out.entry(n).or_default() += 1;
    }
    out
}

/// Every connection of a fixture, checked: the MPA negotiation siw does (revision 2,
/// enhanced frames, no markers, CRC as the module asks, no peer-to-peer RTR), then
/// [`check_connection`].
fn siw_connections(name: &str, crc: bool) -> Vec<(Connection, Iwarp, [IrdOrd; 2])> {
    let frames = read_pcap(&fixture(name)).unwrap();
    let conns = reassemble(&frames).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(!conns.is_empty(), "{name}: no TCP connection");
    conns
        .into_iter()
        .map(|c| {
            let req = mpa_frame(&c.streams[0], "initiator").unwrap().0;
            let rep = mpa_frame(&c.streams[1], "responder").unwrap().0;
            let mut io = [IrdOrd::default(); 2];
            for (k, r) in [&req, &rep].into_iter().enumerate() {
                assert_eq!(r.revision, 2, "{name}: MPA revision");
                assert!(!r.markers, "{name}: markers");
                assert_eq!(r.crc, crc, "{name}: {:?} C bit", r.kind);
                io[k] = r.ird_ord.expect("siw sends enhanced (RFC 6581) frames");
                assert!(!io[k].p2p, "{name}: siw's peer_to_peer is off: no RTR");
            }
            let iw = check_connection(&c).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!(iw.crc, crc);
            (c, iw, io)
        })
        .collect()
}

/// How many FPDUs of each opcode the initiators (the tool's client) and the responders (its
/// server) sent, over every connection of a fixture.
type Counts = [BTreeMap<u8, usize>; 2];

fn counts(conns: &[(Connection, Iwarp, [IrdOrd; 2])]) -> Counts {
    let mut out: Counts = [BTreeMap::new(), BTreeMap::new()];
    for (_, iw, _) in conns {
        for (side, ops) in out.iter_mut().zip(&iw.opcodes) {
            for &op in ops {
                *side.entry(op.as_u8()).or_default() += 1;
            }
        }
    }
    out
}

fn expect(pairs: &[(Opcode, usize)]) -> BTreeMap<u8, usize> {
    pairs.iter().map(|&(op, n)| (op.as_u8(), n)).collect()
}

/// Checks a tool's two fixtures (CRC off and on) against the same expectations: the
/// server's port, the IRD/ORD both sides announced on each connection (in capture order),
/// and the FPDU counts by opcode of the client and the server over all connections.
fn both_modes(
    tool: &str,
    port: u16,
    ird_ord: &[u16],
    client: &[(Opcode, usize)],
    server: &[(Opcode, usize)],
) -> [Vec<(Connection, Iwarp, [IrdOrd; 2])>; 2] {
    [false, true].map(|crc| {
        let name = format!("siw-{}-{tool}.pcap", if crc { "crc" } else { "nocrc" });
        let conns = siw_connections(&name, crc);
        assert_eq!(conns.len(), ird_ord.len(), "{name}: TCP connections");
        let got = counts(&conns);
        match capture_dir() {
            // A committed fixture: the exact FPDU counts of each side.
            None => {
                for (side, got, want) in [
                    ("client", &got[0], expect(client)),
                    ("server", &got[1], expect(server)),
                ] {
                    assert_eq!(got, &want, "{name}: the {side}'s FPDUs");
                }
            }
            // A fresh capture: what perftest sends varies with timing (its synchronisation
            // Sends; once, a CI run's ib_read_lat without CRC had no Read on port 18516 at
            // all while the tool reported 20 reads), and that is the tool's business, not
            // the codec's. What the codec must get right is what the independent dissector
            // sees: the same opcodes, as many of each, over both sides.
            Some(dir) => {
                let mut both = got[0].clone();
                for (&op, &n) in &got[1] {
                    *both.entry(op).or_default() += n;
                }
                let tshark = tshark_opcodes(&dir, &name);
                eprintln!("{name}: codec {both:?}, tshark {tshark:?}");
                assert_eq!(both, tshark, "{name}: FPDUs by opcode, codec vs tshark");
                assert!(!both.is_empty(), "{name}: no FPDU at all");
            }
        }
        for ((c, iw, io), &want) in conns.iter().zip(ird_ord) {
            assert_eq!(c.responder.1, port, "{name}: the server's port");
            assert_eq!(
                c.initiator.0, c.responder.0,
                "{name}: both on siw1's address"
            );
            // rdma_cm puts no private data of its own on iWARP: only the IRD/ORD word.
            assert!(iw.request_pd.is_empty(), "{name}: request private data");
            assert!(iw.reply_pd.is_empty(), "{name}: reply private data");
            for w in io {
                assert_eq!((w.ird, w.ord), (want, want), "{name}: IRD/ORD");
                assert!(!(w.rtr_b || w.rtr_write || w.rtr_read), "{name}: RTR bits");
            }
            if !crc {
                // Without CRC siw leaves the field zero (Wireshark: "CRC: 0x00000000").
                assert!(
                    iw.crc_fields.iter().all(|f| *f == [0; 4]),
                    "{name}: CRC fields"
                );
            }
        }
        conns
    })
}

use Opcode::{ReadRequest, ReadResponse, Send, Write};

/// rping -C 5 -S 64 (-v -V): per ping the client Sends its source buffer's STag, answers the
/// server's RDMA Read, Sends its sink's; the server Reads, Sends "go", Writes, Sends "done".
#[test]
fn rping_parses_with_its_opcodes_in_order() {
    let [nocrc, crc] = both_modes(
        "rping",
        7174,
        &[1],
        &[(Send, 10), (ReadResponse, 5)],
        &[(ReadRequest, 5), (Send, 10), (Write, 5)],
    );
    for conns in [nocrc, crc] {
        let iw = &conns[0].1;
        assert_eq!(iw.opcodes[0], [Send, ReadResponse, Send].repeat(5));
        assert_eq!(iw.opcodes[1], [ReadRequest, Send, Write, Send].repeat(5));
    }
}

/// perftest over rdma_cm (-R) opens two connections: one whose Sends exchange the test's
/// parameters, then the measured one.
#[test]
fn ib_write_bw_parses() {
    let [nocrc, crc] = both_modes(
        "ib_write_bw",
        18515,
        &[0, 0],
        &[(Write, 20), (Send, 16)],
        &[(Send, 16)],
    );
    if capture_dir().is_some() {
        return; // fresh captures: see both_modes
    }
    for conns in [nocrc, crc] {
        assert_eq!(
            conns[1].1.opcodes[0],
            vec![Write; 20],
            "-n 20 Writes of 4 KiB"
        );
    }
}

#[test]
fn ib_read_lat_parses() {
    let [nocrc, crc] = both_modes(
        "ib_read_lat",
        18516,
        &[0, 128],
        &[(ReadRequest, 20), (Send, 11)],
        &[(ReadResponse, 20), (Send, 11)],
    );
    if capture_dir().is_some() {
        return; // fresh captures: see both_modes
    }
    for conns in [nocrc, crc] {
        let iw = &conns[1].1;
        assert_eq!(iw.opcodes, [vec![ReadRequest; 20], vec![ReadResponse; 20]]);
    }
}

#[test]
fn ib_send_lat_parses() {
    both_modes("ib_send_lat", 18517, &[0, 0], &[(Send, 31)], &[(Send, 31)]);
}

// ---------------------------------------------------------------------------------------
// The checks above can fail: damaged copies of the fixtures are refused.

/// The frames of a fixture minus the `nth` (1-based) frame that carries TCP payload after
/// the MPA frames (the 3rd payload-carrying frame onwards).
fn without_data_frame(name: &str, nth: usize) -> Vec<Frame> {
    let mut frames = read_pcap(&fixture(name)).unwrap();
    let data: Vec<usize> = frames
        .iter()
        .enumerate()
        .filter(|(_, f)| matches!(tcp_segment(f), Ok(Some(s)) if !s.payload.is_empty()))
        .map(|(i, _)| i)
        .collect();
    frames.remove(data[2 + nth - 1]);
    frames
}

#[test]
fn a_lost_segment_is_reported() {
    let err = reassemble(&without_data_frame("siw-nocrc-rping.pcap", 2))
        .err()
        .expect("a gap in a stream must be an error");
    assert!(err.contains("missing from the capture"), "{err}");
}

#[test]
fn a_frame_cut_by_the_snap_length_is_reported() {
    let mut frames = read_pcap(&fixture("siw-nocrc-rping.pcap")).unwrap();
    let f = frames
        .iter_mut()
        .rev()
        .find(|f| f.data.len() > 100)
        .unwrap();
    f.data.truncate(f.data.len() - 8);
    let err = reassemble(&frames)
        .err()
        .expect("a cut frame must be an error");
    assert!(err.contains("cut by the capture"), "{err}");
}

#[test]
fn a_truncated_file_is_reported() {
    let bytes = fixture("siw-nocrc-rping.pcap");
    let err = read_pcap(&bytes[..bytes.len() - 5])
        .err()
        .expect("cut file");
    assert!(err.contains("cut"), "{err}");
}

/// One payload byte flipped in the client's first FPDU (its Send, after the MPA request):
/// with CRC negotiated the codec refuses it; without, the same flip goes unnoticed by MPA
/// (the C bit of the reply is what decides).
#[test]
fn a_flipped_byte_fails_the_crc_only_when_negotiated() {
    for (name, crc) in [
        ("siw-crc-rping.pcap", true),
        ("siw-nocrc-rping.pcap", false),
    ] {
        let frames = read_pcap(&fixture(name)).unwrap();
        let mut c = reassemble(&frames).unwrap().remove(0);
        assert!(check_connection(&c).is_ok());
        let (_, req_len) = mpa_frame(&c.streams[0], "initiator").unwrap();
        // Header 2 + DDP/RDMAP 18: byte 24 is in the Send's payload.
        c.streams[0][req_len + 24] ^= 0x01;
        match check_connection(&c) {
            Err(CheckError::Wire {
                side: "initiator",
                err: WireError::BadCrc { .. },
                ..
            }) if crc => {}
            Ok(_) if !crc => {}
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// A stream cut inside its last FPDU leaves bytes no FPDU accounts for.
#[test]
fn a_cut_stream_leaves_bytes_over() {
    let frames = read_pcap(&fixture("siw-nocrc-rping.pcap")).unwrap();
    let mut c = reassemble(&frames).unwrap().remove(0);
    let n = c.streams[1].len();
    c.streams[1].truncate(n - 3);
    match check_connection(&c) {
        Err(CheckError::Leftover {
            side: "responder", ..
        }) => {}
        other => panic!("{other:?}"),
    }
}
