//! The iWARP codec against literal bytes laid out from the RFCs, the CRC32c against RFC 3720's
//! vectors, and round trips / hostile bytes under proptest.

use iwarp_proto::ddp::{self, BufferModel, DdpRepr, Segment};
use iwarp_proto::fpdu::{self, Fpdu, FpduCrc, FpduDecoder, FpduRepr, Framing};
use iwarp_proto::message::{self, Body, MessageRepr};
use iwarp_proto::rdmap::{self, Opcode, ReadRequestRepr};
use iwarp_proto::terminate::{TermCode, Terminate, TerminateRepr};
use iwarp_proto::WireError;
use proptest::prelude::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

// ---- CRC32c: RFC 3720 appendix B.4 (the iSCSI CRC MPA uses), bytes as sent ----

#[test]
fn crc32c_matches_rfc3720_b4_vectors() {
    let inc: Vec<u8> = (0u8..32).collect();
    let dec: Vec<u8> = (0u8..32).rev().collect();
    let read_pdu = hex("01 c0 00 00 00 00 00 00 00 00 00 00 00 00 00 00
         14 00 00 00 00 00 04 00 00 00 00 14 00 00 00 18
         28 00 00 00 00 00 00 00 02 00 00 00 00 00 00 00");
    let cases: [(&[u8], &str); 5] = [
        (&[0u8; 32], "aa 36 91 8a"),
        (&[0xffu8; 32], "43 ab a8 62"),
        (&inc, "4e 79 dd 46"),
        (&dec, "5c db 3f 11"),
        (&read_pdu, "56 3a 96 d9"),
    ];
    for (data, want) in cases {
        let mut crc = FpduCrc::new();
        crc.update(data);
        assert_eq!(crc.to_wire().to_vec(), hex(want), "{data:02x?}");
    }
    // The CRC-32C check value.
    let mut crc = FpduCrc::new();
    crc.update(b"123456789");
    assert_eq!(crc.value(), 0xe306_9283);
}

#[test]
fn fpdu_crc_field_holds_the_crc_lsb_first() {
    // A Send of "hi": the CRC field is CRC32c(header + ULPDU + pad), least significant byte
    // first.
    let ulpdu = hex("41 43 00000000 00000000 00000001 00000000 6869");
    let bytes = FpduRepr { ulpdu: &ulpdu }.to_vec(true).unwrap();
    assert_eq!(bytes.len(), 2 + 20 + 2 + 4);
    assert_eq!(&bytes[..2], &[0x00, 0x14]);
    assert_eq!(&bytes[22..24], &[0, 0], "pad");
    let crc = crc32c::crc32c(&bytes[..24]);
    assert_eq!(&bytes[24..], &crc.to_le_bytes());
    // CRC off: the field is there and zero.
    let plain = FpduRepr { ulpdu: &ulpdu }.to_vec(false).unwrap();
    assert_eq!(&plain[..24], &bytes[..24]);
    assert_eq!(&plain[24..], &[0, 0, 0, 0]);
}

#[test]
fn trailer_is_what_emit_writes_after_the_ulpdu() {
    for len in 14..22usize {
        let ulpdu: Vec<u8> = (0..len as u8).collect();
        for crc_on in [true, false] {
            let whole = FpduRepr { ulpdu: &ulpdu }.to_vec(crc_on).unwrap();
            let mut crc = FpduCrc::new();
            crc.update(&(len as u16).to_be_bytes());
            crc.update(&ulpdu[..3]);
            crc.update(&ulpdu[3..]);
            let t = fpdu::Trailer::new(len, &crc, crc_on);
            assert_eq!(t.as_bytes(), &whole[2 + len..], "len {len} crc {crc_on}");
        }
    }
}

#[test]
fn incremental_crc_equals_one_shot_with_pad() {
    let ulpdu = hex("c1 40 11223344 0102030405060708 616263");
    let bytes = FpduRepr { ulpdu: &ulpdu }.to_vec(true).unwrap();
    let mut crc = FpduCrc::new();
    crc.update(&bytes[..2]);
    crc.update(&ulpdu[..14]);
    crc.update(&ulpdu[14..15]);
    crc.update(&ulpdu[15..]);
    crc.update_pad(ulpdu.len());
    assert_eq!(crc.to_wire(), bytes[bytes.len() - 4..]);
}

// ---- framing ----

#[test]
fn pad_and_fpdu_lengths() {
    // 2 + ULPDU + pad is a multiple of 4.
    assert_eq!(fpdu::pad_len(14), 0);
    assert_eq!(fpdu::pad_len(15), 3);
    assert_eq!(fpdu::pad_len(17), 1);
    assert_eq!(fpdu::pad_len(18), 0);
    assert_eq!(fpdu::fpdu_len(17), 24);
    assert_eq!(fpdu::fpdu_len(0), 8);
}

#[test]
fn mulpdu_fills_one_segment() {
    // RFC 5044 §8.1.1 without markers: EMSS - (6 + EMSS mod 4).
    assert_eq!(fpdu::mulpdu(1460), 1454);
    assert_eq!(fpdu::fpdu_len(1454), 1460);
    assert_eq!(fpdu::mulpdu(1461), 1454);
    assert_eq!(fpdu::mulpdu(65483), 65474);
    assert_eq!(fpdu::mulpdu(5), 0);
    // siw rounds the segment to a multiple of 8 first.
    assert_eq!(fpdu::mulpdu_siw(1460), 1450);
    assert_eq!(fpdu::fpdu_len(1450), 1456);
    for mss in 8..200_000 {
        let m = fpdu::mulpdu(mss);
        assert!(fpdu::fpdu_len(m) <= mss.max(8), "mss {mss}");
        assert_eq!(fpdu::pad_len(m), 0, "mss {mss}");
        if mss < 65536 {
            assert!(mss - fpdu::fpdu_len(m) < 4, "mss {mss} leaves room");
        }
        let s = fpdu::mulpdu_siw(mss);
        assert!(s <= m);
        assert!(s <= fpdu::MAX_ULPDU_LEN);
    }
}

#[test]
fn frame_len_asks_for_more_and_refuses_oversize() {
    assert_eq!(fpdu::frame_len(&[], 100).unwrap(), Framing::Need(2));
    assert_eq!(fpdu::frame_len(&[0], 100).unwrap(), Framing::Need(1));
    // ULPDU 17 → FPDU 24.
    assert_eq!(fpdu::frame_len(&[0, 17], 100).unwrap(), Framing::Need(22));
    assert_eq!(
        fpdu::frame_len(
            &[0, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9],
            100
        )
        .unwrap(),
        Framing::Complete(24)
    );
    assert_eq!(
        fpdu::frame_len(&[0x01, 0x00], 255).unwrap_err(),
        WireError::TooLong {
            what: "FPDU ULPDU",
            len: 256,
            max: 255
        }
    );
}

#[test]
fn checked_fpdu_view_rejects_truncation() {
    let ulpdu = [0u8; 18];
    let mut bytes = FpduRepr { ulpdu: &ulpdu }.to_vec(true).unwrap();
    bytes.pop();
    assert_eq!(
        Fpdu::new_checked(&bytes[..]).unwrap_err(),
        WireError::Truncated {
            what: "FPDU",
            need: 24,
            have: 23
        }
    );
    assert!(Fpdu::new_checked(&bytes[..1]).is_err());
}

#[test]
fn corrupted_byte_fails_crc_only_when_crc_is_on() {
    let ulpdu = hex("41 43 00000000 00000000 00000001 00000000 6869");
    let mut bytes = FpduRepr { ulpdu: &ulpdu }.to_vec(true).unwrap();
    bytes[21] ^= 0x01;
    let view = Fpdu::new_checked(&bytes[..]).unwrap();
    assert!(matches!(
        FpduRepr::parse(&view, true),
        Err(WireError::BadCrc { .. })
    ));
    assert_eq!(FpduRepr::parse(&view, false).unwrap().ulpdu[19], 0x68);
    // CRC off: a zero (or any) CRC field is accepted.
    let plain = FpduRepr { ulpdu: &ulpdu }.to_vec(false).unwrap();
    assert!(FpduRepr::parse(&Fpdu::new_checked(&plain[..]).unwrap(), false).is_ok());
    assert!(FpduRepr::parse(&Fpdu::new_checked(&plain[..]).unwrap(), true).is_err());
}

#[test]
fn decoder_reassembles_split_fpdus_and_stops_on_bad_crc() {
    let a = FpduRepr {
        ulpdu: b"first ulpdu",
    }
    .to_vec(true)
    .unwrap();
    let b = FpduRepr { ulpdu: b"2nd" }.to_vec(true).unwrap();
    let stream: Vec<u8> = [a.clone(), b.clone()].concat();
    let mut dec = FpduDecoder::new(64, true);
    let mut got = Vec::new();
    for byte in &stream {
        dec.push(std::slice::from_ref(byte));
        while let Some(u) = dec.next_ulpdu().unwrap() {
            got.push(u.to_vec());
        }
    }
    assert_eq!(got, vec![b"first ulpdu".to_vec(), b"2nd".to_vec()]);
    assert_eq!(dec.buffered(), 0);

    let mut bad = a.clone();
    bad[5] ^= 0x80;
    let mut dec = FpduDecoder::new(64, true);
    dec.push(&bad);
    assert!(matches!(dec.next_ulpdu(), Err(WireError::BadCrc { .. })));

    let mut dec = FpduDecoder::new(4, true);
    dec.push(&a[..2]);
    assert!(matches!(dec.next_ulpdu(), Err(WireError::TooLong { .. })));
}

// ---- DDP / RDMAP layouts (RFC 5041 §4, RFC 5040 §4) ----

#[test]
fn rdma_write_segment_layout() {
    let h = message::tagged_header(Opcode::Write, true, 0x1122_3344, 0x0102_0304_0506_0708);
    // T=1 L=1 DV=1 | RV=1 opcode 0 | STag | TO
    assert_eq!(h.to_vec(), hex("c1 40 11223344 0102030405060708"));
    let mut ulpdu = h.to_vec();
    ulpdu.extend_from_slice(b"abc");
    let m = MessageRepr::parse(&ulpdu).unwrap();
    assert_eq!(m.opcode, Opcode::Write);
    assert_eq!(m.ddp, h);
    assert_eq!(m.payload, 14..17);
    assert_eq!(m.body, Body::Data);
    // As one FPDU: length 17, one pad byte.
    let f = FpduRepr { ulpdu: &ulpdu }.to_vec(true).unwrap();
    assert_eq!(&f[..2], &[0, 17]);
    assert_eq!(f.len(), 24);
    assert_eq!(f[19], 0);
}

#[test]
fn send_and_send_invalidate_layout() {
    let h = message::untagged_header(Opcode::Send, true, 0, 1, 0);
    // T=0 L=1 DV=1 | RV=1 opcode 3 | RsvdULP | QN 0 | MSN 1 | MO 0
    assert_eq!(h.to_vec(), hex("41 43 00000000 00000000 00000001 00000000"));
    let h = message::untagged_header(Opcode::SendSeInvalidate, false, 0xdead_beef, 7, 4096);
    assert_eq!(h.to_vec(), hex("01 46 deadbeef 00000000 00000007 00001000"));
    let mut ulpdu = h.to_vec();
    ulpdu.push(0x55);
    let m = MessageRepr::parse(&ulpdu).unwrap();
    assert_eq!(m.invalidate_stag(), Some(0xdead_beef));
    assert!(m.opcode.solicited());
    assert!(!m.ddp.last);
    assert_eq!(&ulpdu[m.payload.clone()], &[0x55]);
}

#[test]
fn read_request_layout() {
    let rr = ReadRequestRepr {
        sink_stag: 0x0a0b_0c0d,
        sink_to: 0x1000,
        size: 0x0001_0000,
        source_stag: 0x0102_0304,
        source_to: 0xffff_0000_0000_0001,
    };
    let m = MessageRepr {
        ddp: message::untagged_header(Opcode::ReadRequest, true, 0, 1, 0),
        opcode: Opcode::ReadRequest,
        body: Body::ReadRequest(rr),
        payload: 46..46,
    };
    let mut buf = vec![0u8; m.headers_len()];
    assert_eq!(m.emit_headers(&mut buf).unwrap(), 46);
    assert_eq!(
        buf,
        hex("41 41 00000000 00000001 00000001 00000000
             0a0b0c0d 0000000000001000 00010000 01020304 ffff000000000001")
    );
    assert_eq!(MessageRepr::parse(&buf).unwrap(), m);
}

#[test]
fn rdmap_control_byte_for_every_opcode() {
    for (i, op) in Opcode::ALL.iter().enumerate() {
        assert_eq!(rdmap::ctrl_byte(*op), 0x40 | i as u8);
        assert_eq!(rdmap::parse_ctrl(0x40 | i as u8).unwrap(), *op);
        // The two reserved bits are not checked.
        assert_eq!(rdmap::parse_ctrl(0x70 | i as u8).unwrap(), *op);
    }
    assert_eq!(
        rdmap::parse_ctrl(0x88).unwrap_err(),
        WireError::RdmapVersion { version: 2 }
    );
    assert!(matches!(
        rdmap::parse_ctrl(0x48),
        Err(WireError::UnexpectedOpcode { opcode: 8, .. })
    ));
}

#[test]
fn terminate_layouts() {
    // A bare MPA CRC error: layer 2, etype 0, code 2, no headers.
    let t = TerminateRepr::bare(TermCode::MPA_CRC_ERROR);
    assert_eq!(t.to_vec().unwrap(), hex("20 02 00 00"));
    // Invalid STag on an RDMA Write, as siw sends it: M and D, the segment's MPA length and
    // its tagged DDP header.
    let block = hex("0011 c1 40 11223344 0102030405060708");
    let t = TerminateRepr::with_header(TermCode::DDP_INVALID_STAG, false, &block);
    let body = t.to_vec().unwrap();
    assert_eq!(&body[..4], &hex("11 00 c0 00"));
    let parsed = TerminateRepr::parse(&Terminate::new_checked(&body[..]).unwrap()).unwrap();
    assert_eq!(parsed, t);
    assert_eq!(parsed.ddp_segment_length(), Some(0x11));
    assert_eq!(parsed.ddp_header(), Some(&block[2..]));
    assert_eq!(parsed.rdma_header(), None);
    // A Read Request refused for access rights: M D R and the 28-byte Read Request header.
    let rr = ReadRequestRepr {
        sink_stag: 1,
        sink_to: 2,
        size: 3,
        source_stag: 4,
        source_to: 5,
    };
    let mut block = hex("002c 41 41 00000000 00000001 00000001 00000000");
    block.extend_from_slice(&rr.to_bytes());
    let t = TerminateRepr::with_header(TermCode::RDMAP_ACCESS_RIGHTS, true, &block);
    let body = t.to_vec().unwrap();
    assert_eq!(&body[..4], &hex("01 02 e0 00"));
    let parsed = TerminateRepr::parse(&Terminate::new_checked(&body[..]).unwrap()).unwrap();
    assert_eq!(parsed.rdma_header(), Some(&rr.to_bytes()[..]));
    // Bits that announce more than is there: truncated, and refused on emit.
    assert!(Terminate::new_checked(&body[..body.len() - 1]).is_err());
    let wrong = TerminateRepr {
        r: false,
        ..TerminateRepr::with_header(TermCode::RDMAP_ACCESS_RIGHTS, true, &block)
    };
    assert!(wrong.to_vec().is_err());
    // As a whole message on queue 2.
    let ddp = message::untagged_header(Opcode::Terminate, true, 0, 1, 0);
    assert_eq!(
        ddp.to_vec(),
        hex("41 47 00000000 00000002 00000001 00000000")
    );
    let mut ulpdu = ddp.to_vec();
    ulpdu.extend_from_slice(&body);
    let m = MessageRepr::parse(&ulpdu).unwrap();
    assert_eq!(m.body, Body::Terminate(t));
}

#[test]
fn message_errors_and_their_terminate_codes() {
    let send = message::untagged_header(Opcode::Send, true, 0, 1, 0).to_vec();
    // DV 2.
    let mut b = send.clone();
    b[0] = 0x42;
    let e = MessageRepr::parse(&b).unwrap_err();
    assert_eq!(
        e,
        WireError::DdpVersion {
            tagged: false,
            version: 2
        }
    );
    assert_eq!(
        TermCode::for_error(&e),
        TermCode::DDP_UNTAGGED_INVALID_VERSION
    );
    let mut b = message::tagged_header(Opcode::Write, true, 1, 2).to_vec();
    b[0] = 0xc0;
    assert_eq!(
        TermCode::for_error(&MessageRepr::parse(&b).unwrap_err()),
        TermCode::DDP_TAGGED_INVALID_VERSION
    );
    // RV 0.
    let mut b = send.clone();
    b[1] = 0x03;
    let e = MessageRepr::parse(&b).unwrap_err();
    assert_eq!(e, WireError::RdmapVersion { version: 0 });
    assert_eq!(TermCode::for_error(&e), TermCode::RDMAP_INVALID_VERSION);
    // Opcode 9 (RFC 7306's range: not spoken).
    let mut b = send.clone();
    b[1] = 0x49;
    assert_eq!(
        TermCode::for_error(&MessageRepr::parse(&b).unwrap_err()),
        TermCode::RDMAP_UNEXPECTED_OPCODE
    );
    // A Send in a tagged segment.
    let b = message::tagged_header(Opcode::Send, true, 1, 2).to_vec();
    assert!(matches!(
        MessageRepr::parse(&b),
        Err(WireError::UnexpectedOpcode { opcode: 3, .. })
    ));
    // A Send on the Read Request queue.
    let mut b = send.clone();
    b[9] = 1;
    let e = MessageRepr::parse(&b).unwrap_err();
    assert_eq!(e, WireError::InvalidQn { qn: 1 });
    assert_eq!(TermCode::for_error(&e), TermCode::DDP_INVALID_QN);
    // A Read Request that is not one whole segment, or short.
    let rr = message::untagged_header(Opcode::ReadRequest, false, 0, 1, 0).to_vec();
    assert!(MessageRepr::parse(&[rr, vec![0; 28]].concat()).is_err());
    let rr = message::untagged_header(Opcode::ReadRequest, true, 0, 1, 0).to_vec();
    assert!(MessageRepr::parse(&[rr.clone(), vec![0; 27]].concat()).is_err());
    assert!(MessageRepr::parse(&[rr, vec![0; 28]].concat()).is_ok());
    // Truncated headers.
    assert!(matches!(
        MessageRepr::parse(&send[..17]),
        Err(WireError::Truncated { need: 18, .. })
    ));
    assert!(MessageRepr::parse(&[0xc1]).is_err());
    assert_eq!(
        TermCode::for_error(&WireError::BadCrc {
            computed: 1,
            received: 2
        }),
        TermCode::MPA_CRC_ERROR
    );
}

#[test]
fn ddp_reserved_bits_are_ignored_on_receive_and_zero_on_send() {
    let mut b = message::untagged_header(Opcode::Send, true, 0, 1, 0).to_vec();
    b[0] |= 0x3c;
    let seg = Segment::new_checked(&b[..]).unwrap();
    assert_eq!(seg.reserved(), 0xf);
    let repr = DdpRepr::parse(&seg).unwrap();
    assert_eq!(repr.to_vec()[0], 0x41);
}

// ---- property tests ----

fn opcode() -> impl Strategy<Value = Opcode> {
    (0u8..8).prop_map(|v| Opcode::from_u8(v).unwrap())
}

fn ddp_repr() -> impl Strategy<Value = DdpRepr> {
    let tagged =
        (any::<u32>(), any::<u64>()).prop_map(|(stag, to)| BufferModel::Tagged { stag, to });
    let untagged = (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
        |(rsvd_ulp, qn, msn, mo)| BufferModel::Untagged {
            rsvd_ulp,
            qn,
            msn,
            mo,
        },
    );
    (any::<bool>(), any::<u8>(), prop_oneof![tagged, untagged]).prop_map(
        |(last, ulp_ctrl, model)| DdpRepr {
            last,
            ulp_ctrl,
            model,
        },
    )
}

/// A valid message ULPDU: opcode, its header, and a body or payload.
fn message_ulpdu() -> impl Strategy<Value = Vec<u8>> {
    (
        opcode(),
        any::<bool>(),
        any::<(u32, u64, u32, u32, u32)>(),
        prop::collection::vec(any::<u8>(), 0..300),
        any::<(u32, u64, u32, u32, u64)>(),
        (0u8..3, any::<u8>(), any::<bool>()),
    )
        .prop_map(|(op, last, (stag, to, inv, msn, mo), payload, rr, term)| {
            let (ddp, body) = match op {
                Opcode::Write | Opcode::ReadResponse => {
                    (message::tagged_header(op, last, stag, to), payload)
                }
                Opcode::ReadRequest => {
                    let rr = ReadRequestRepr {
                        sink_stag: rr.0,
                        sink_to: rr.1,
                        size: rr.2,
                        source_stag: rr.3,
                        source_to: rr.4,
                    };
                    (
                        message::untagged_header(op, true, 0, msn, 0),
                        rr.to_bytes().to_vec(),
                    )
                }
                Opcode::Terminate => {
                    let code = TermCode {
                        layer: term.0,
                        etype: term.1 & 0xf,
                        code: term.1,
                    };
                    let block = [
                        vec![0x00, 0x20],
                        message::tagged_header(Opcode::Write, true, stag, to).to_vec(),
                    ]
                    .concat();
                    let t = if term.2 {
                        TerminateRepr::with_header(code, false, &block)
                    } else {
                        TerminateRepr::bare(code)
                    };
                    (
                        message::untagged_header(op, true, 0, msn, 0),
                        t.to_vec().unwrap(),
                    )
                }
                _ => {
                    let inv = if op.invalidates() { inv } else { 0 };
                    (message::untagged_header(op, last, inv, msn, mo), payload)
                }
            };
            [ddp.to_vec(), body].concat()
        })
}

#[test]
fn segments_split_a_message() {
    let v: Vec<_> = message::segments(10, 4).collect();
    assert_eq!(v, vec![(0..4, false), (4..8, false), (8..10, true)]);
    assert_eq!(
        message::segments(0, 4).collect::<Vec<_>>(),
        vec![(0..0, true)]
    );
    assert_eq!(
        message::segments(8, 4).collect::<Vec<_>>(),
        vec![(0..4, false), (4..8, true)]
    );
}

proptest! {
    #[test]
    fn segmented_writes_fit_the_mss_and_cover_the_message(len in 0usize..20_000, mss in 64usize..9000) {
        let max = fpdu::mulpdu(mss) - ddp::TAGGED_HEADER_LEN;
        let mut covered = 0;
        let mut n = 0;
        for (range, last) in message::segments(len, max) {
            prop_assert_eq!(range.start, covered);
            covered = range.end;
            n += 1;
            let ulpdu_len = ddp::TAGGED_HEADER_LEN + range.len();
            prop_assert!(fpdu::fpdu_len(ulpdu_len) <= mss);
            prop_assert_eq!(last, covered == len);
        }
        prop_assert_eq!(covered, len);
        prop_assert_eq!(n, len.div_ceil(max).max(1));
    }

    #[test]
    fn ddp_repr_round_trips(repr in ddp_repr(), payload in prop::collection::vec(any::<u8>(), 0..16)) {
        let mut bytes = repr.to_vec();
        bytes.extend_from_slice(&payload);
        let seg = Segment::new_checked(&bytes[..]).unwrap();
        let back = DdpRepr::parse(&seg).unwrap();
        prop_assert_eq!(back, repr);
        prop_assert_eq!(seg.payload(), &payload[..]);
        prop_assert_eq!(back.to_vec(), bytes[..repr.header_len()].to_vec());
    }

    #[test]
    fn messages_round_trip_through_fpdus(
        ulpdus in prop::collection::vec(message_ulpdu(), 1..6),
        crc in any::<bool>(),
        chunk in 1usize..64,
    ) {
        let mut stream = Vec::new();
        for u in &ulpdus {
            let f = FpduRepr { ulpdu: u }.to_vec(crc).unwrap();
            prop_assert_eq!(f.len() % 4, 0);
            stream.extend_from_slice(&f);
        }
        let mut dec = FpduDecoder::new(fpdu::MAX_ULPDU_LEN, crc);
        let mut got = Vec::new();
        for piece in stream.chunks(chunk) {
            dec.push(piece);
            while let Some(u) = dec.next_ulpdu().unwrap() {
                got.push(u.to_vec());
            }
        }
        prop_assert_eq!(&got, &ulpdus);
        for u in &ulpdus {
            let m = MessageRepr::parse(u).unwrap();
            let mut again = vec![0u8; m.headers_len()];
            m.emit_headers(&mut again).unwrap();
            again.extend_from_slice(&u[m.payload.clone()]);
            prop_assert_eq!(&again, u);
            prop_assert_eq!(MessageRepr::parse(&again).unwrap(), m);
        }
    }

    #[test]
    fn incremental_crc_matches_for_any_split(data in prop::collection::vec(any::<u8>(), 0..200), cut in any::<prop::sample::Index>()) {
        let at = cut.index(data.len() + 1);
        let mut crc = FpduCrc::new();
        crc.update(&data[..at]);
        crc.update(&data[at..]);
        prop_assert_eq!(crc.value(), crc32c::crc32c(&data));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200), crc in any::<bool>(), max in 0usize..70_000) {
        let _ = fpdu::frame_len(&bytes, max);
        if let Ok(f) = Fpdu::new_checked(&bytes[..]) {
            let _ = f.ulpdu();
            let _ = f.pad();
            let _ = FpduRepr::parse(&f, crc);
        }
        let mut dec = FpduDecoder::new(max, crc);
        dec.push(&bytes);
        for _ in 0..bytes.len() {
            match dec.next_ulpdu() {
                Ok(Some(_)) => {}
                _ => break,
            }
        }
        if let Ok(m) = MessageRepr::parse(&bytes) {
            // Whatever parses re-emits to the same bytes, DDP and Terminate reserved bits aside
            // (the RDMAP control byte is kept whole).
            let mut again = vec![0u8; m.headers_len()];
            m.emit_headers(&mut again).unwrap();
            again.extend_from_slice(&bytes[m.payload.clone()]);
            let mut want = bytes.clone();
            want[0] &= !0x3c;
            if let Body::Terminate(_) = m.body {
                want[m.ddp.header_len() + 2] &= 0xe0;
                want[m.ddp.header_len() + 3] = 0;
            }
            prop_assert_eq!(&again[..], &want[..again.len()]);
        }
        if let Ok(t) = Terminate::new_checked(&bytes[..]) {
            let _ = t.copied();
            if let Ok(r) = TerminateRepr::parse(&t) {
                let _ = (r.ddp_segment_length(), r.ddp_header(), r.rdma_header());
                let again = r.to_vec().unwrap();
                prop_assert_eq!(TerminateRepr::parse(&Terminate::new_checked(&again[..]).unwrap()).unwrap(), r);
            }
        }
        if let Ok(s) = Segment::new_checked(&bytes[..]) {
            let _ = DdpRepr::parse(&s);
        }
        let _ = ddp::UNTAGGED_HEADER_LEN;
    }
}

#[test]
fn terminate_payload_range_ignores_trailing_bytes() {
    // Found by the `iwarp` fuzz target: the empty payload range of a Terminate sat at the end
    // of the ULPDU, so bytes after the announced headers changed the parsed message.
    let mut ulpdu = message::untagged_header(Opcode::Terminate, true, 0, 1, 0).to_vec();
    ulpdu.extend_from_slice(
        &TerminateRepr::bare(TermCode::RDMAP_LOCAL_CATASTROPHIC)
            .to_vec()
            .unwrap(),
    );
    let longer = [&ulpdu[..], &[0x2d, 0x40]].concat();
    let short = MessageRepr::parse(&ulpdu).unwrap();
    let long = MessageRepr::parse(&longer).unwrap();
    assert_eq!(long, short);
    assert_eq!(long.payload, 22..22);
}

// ---- a zero-copy sender's pieces: head in a stack buffer, payload from elsewhere, trailer ----

/// What a zero-copy sender puts on the wire for `m` with `payload`: the head from
/// `emit_fpdu_head` into a fixed buffer, the payload, then the trailer over the CRC fed
/// piecewise.
fn sent_pieces(m: &MessageRepr<'_>, payload: &[u8], crc_on: bool) -> Vec<u8> {
    let mut head = [0u8; message::MAX_FPDU_HEAD_LEN];
    let n = m.emit_fpdu_head(payload.len(), &mut head).unwrap();
    let mut crc = FpduCrc::new();
    crc.update(&head[..n]);
    crc.update(payload);
    let ulpdu_len = n - fpdu::HEADER_LEN + payload.len();
    let trailer = fpdu::Trailer::new(ulpdu_len, &crc, crc_on);
    [&head[..n], payload, trailer.as_bytes()].concat()
}

#[test]
fn fpdu_head_payload_and_trailer_are_the_whole_fpdu() {
    let rr = ReadRequestRepr {
        sink_stag: 7,
        sink_to: 0x1000,
        size: 4096,
        source_stag: 9,
        source_to: 0x2000,
    };
    // The longest Terminate: an untagged header quoted with its Read Request.
    let mut block = hex("002e 41 41 00000000 00000001 00000003 00000000");
    block.extend_from_slice(&rr.to_bytes());
    let term = TerminateRepr::with_header(TermCode::RDMAP_ACCESS_RIGHTS, true, &block);
    let data: Vec<u8> = (0..37u8).collect();
    let cases: [(MessageRepr<'_>, &[u8]); 6] = [
        (
            MessageRepr::tagged(Opcode::Write, false, 0x11, 0x2233),
            &data,
        ),
        (
            MessageRepr::tagged(Opcode::ReadResponse, true, 5, 6),
            &data[..1],
        ),
        (
            MessageRepr::untagged(Opcode::SendSe, true, 0, 3, 4096),
            &data,
        ),
        (MessageRepr::tagged(Opcode::Write, true, 0, 0), &[]),
        (MessageRepr::read_request(2, rr), &[]),
        (MessageRepr::terminate(1, term), &[]),
    ];
    for (m, payload) in &cases {
        for crc_on in [true, false] {
            let wire = sent_pieces(m, payload, crc_on);
            let mut ulpdu = vec![0u8; m.headers_len()];
            m.emit_headers(&mut ulpdu).unwrap();
            ulpdu.extend_from_slice(payload);
            assert_eq!(
                wire,
                FpduRepr { ulpdu: &ulpdu }.to_vec(crc_on).unwrap(),
                "{m:?} crc {crc_on}"
            );
            let f = Fpdu::new_checked(&wire[..]).unwrap();
            let back = MessageRepr::parse(FpduRepr::parse(&f, crc_on).unwrap().ulpdu).unwrap();
            assert_eq!(back.ddp, m.ddp);
            assert_eq!(back.opcode, m.opcode);
            assert_eq!(back.body, m.body);
            assert_eq!(&ulpdu[back.payload.clone()], *payload);
        }
    }
    // The constructors put untagged messages on their queues; Read Request and Terminate are
    // single segments.
    assert_eq!(
        cases[2].0.ddp.to_vec(),
        hex("41 45 00000000 00000000 00000003 00001000")
    );
    assert_eq!(
        cases[4].0.ddp.to_vec(),
        hex("41 41 00000000 00000001 00000002 00000000")
    );
    assert_eq!(
        cases[5].0.ddp.to_vec(),
        hex("41 47 00000000 00000002 00000001 00000000")
    );
    // The longest head fits the constant exactly.
    assert_eq!(
        fpdu::HEADER_LEN + cases[5].0.headers_len(),
        message::MAX_FPDU_HEAD_LEN
    );
}

#[test]
fn fpdu_head_refuses_what_does_not_fit() {
    let m = MessageRepr::untagged(Opcode::Send, true, 0, 1, 0);
    let mut head = [0u8; message::MAX_FPDU_HEAD_LEN];
    // 18 + 65517 = 65535: the largest ULPDU the length field holds.
    assert_eq!(m.emit_fpdu_head(65517, &mut head), Ok(20));
    assert_eq!(&head[..2], &[0xff, 0xff]);
    assert!(matches!(
        m.emit_fpdu_head(65518, &mut head),
        Err(WireError::TooLong { len: 65536, .. })
    ));
    assert!(m.emit_fpdu_head(usize::MAX, &mut head).is_err());
    assert!(matches!(
        m.emit_fpdu_head(0, &mut head[..19]),
        Err(WireError::Truncated { need: 20, .. })
    ));
    // A Terminate whose copied block does not match its bits is refused, not sent.
    let block = hex("0011 c1 40 11223344");
    let t = TerminateRepr::with_header(TermCode::DDP_INVALID_STAG, false, &block);
    assert!(MessageRepr::terminate(1, t)
        .emit_fpdu_head(0, &mut head)
        .is_err());
}

#[test]
fn a_receiver_checks_the_crc_it_fed_piecewise_against_the_trailer() {
    let payload: Vec<u8> = (0..23u8).collect();
    let m = MessageRepr::tagged(Opcode::Write, true, 1, 2);
    let wire = sent_pieces(&m, &payload, true);
    let head = fpdu::HEADER_LEN + ddp::TAGGED_HEADER_LEN;
    let ulpdu_len = ddp::TAGGED_HEADER_LEN + payload.len();
    let trailer_at = head + payload.len();
    let mut crc = FpduCrc::new();
    crc.update(&wire[..head]);
    crc.update(&wire[head..head + 5]);
    crc.update(&wire[head + 5..trailer_at]);
    assert_eq!(crc.check_trailer(ulpdu_len, &wire[trailer_at..]), Ok(()));
    // A flipped CRC byte is an MPA CRC error.
    let mut bad = wire.clone();
    *bad.last_mut().unwrap() ^= 1;
    let e = crc
        .check_trailer(ulpdu_len, &bad[trailer_at..])
        .unwrap_err();
    assert!(matches!(e, WireError::BadCrc { .. }));
    assert_eq!(TermCode::for_error(&e), TermCode::MPA_CRC_ERROR);
    // The pad counts as received, as the whole-FPDU view counts it.
    let mut padded = wire.clone();
    padded[trailer_at] = 0x5a;
    let whole = Fpdu::new_checked(&padded[..]).unwrap();
    assert!(whole.check_crc().is_err());
    assert!(crc.check_trailer(ulpdu_len, &padded[trailer_at..]).is_err());
    let fixed = fpdu::crc_to_wire(whole.compute_crc());
    let n = padded.len();
    padded[n - fpdu::CRC_LEN..].copy_from_slice(&fixed);
    assert_eq!(Fpdu::new_checked(&padded[..]).unwrap().check_crc(), Ok(()));
    assert_eq!(crc.check_trailer(ulpdu_len, &padded[trailer_at..]), Ok(()));
    // A trailer of the wrong length is refused, whatever it holds (here: pad 1, CRC 4).
    assert_eq!(n - trailer_at, 5);
    let longer = [&wire[trailer_at..], &[0][..]].concat();
    for t in [
        &wire[trailer_at..n - 1],
        &wire[trailer_at + 1..],
        &longer[..],
        &[][..],
    ] {
        assert!(matches!(
            crc.check_trailer(ulpdu_len, t),
            Err(WireError::Malformed { .. })
        ));
    }
}

proptest! {
    #[test]
    fn what_a_zero_copy_sender_emits_parses_back(
        op in opcode(),
        (last, stag, to, msn, mo) in any::<(bool, u32, u64, u32, u32)>(),
        payload in prop::collection::vec(any::<u8>(), 0..200),
        crc in any::<bool>(),
    ) {
        let m = match op {
            Opcode::Write | Opcode::ReadResponse => MessageRepr::tagged(op, last, stag, to),
            Opcode::ReadRequest => MessageRepr::read_request(msn, ReadRequestRepr {
                sink_stag: stag, sink_to: to, size: mo, source_stag: msn, source_to: !to,
            }),
            Opcode::Terminate => MessageRepr::terminate(msn, TerminateRepr::bare(TermCode::DDP_MSN_RANGE)),
            _ => MessageRepr::untagged(op, last, if op.invalidates() { stag } else { 0 }, msn, mo),
        };
        let payload = if matches!(m.body, Body::Data) { &payload[..] } else { &[][..] };
        let wire = sent_pieces(&m, payload, crc);
        let mut dec = FpduDecoder::new(fpdu::MAX_ULPDU_LEN, crc);
        dec.push(&wire);
        let u = dec.next_ulpdu().unwrap().unwrap().to_vec();
        prop_assert_eq!(dec.buffered(), 0);
        let back = MessageRepr::parse(&u).unwrap();
        prop_assert_eq!(back.ddp, m.ddp);
        prop_assert_eq!(back.opcode, op);
        prop_assert_eq!(back.body, m.body);
        prop_assert_eq!(&u[back.payload.clone()], payload);
    }
}
