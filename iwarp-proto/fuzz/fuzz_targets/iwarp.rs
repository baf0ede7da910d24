//! Bytes from an iWARP peer, through every layer the receive path parses: the FPDU stream
//! decoder (cut into pieces of input-chosen sizes, CRC on or off, a ULPDU limit), then each
//! ULPDU as an RDMAP message (DDP header, opcode, Read Request, Terminate). Whatever parses
//! must emit back to the same bytes (reserved bits, sent as zero, aside) and parse to the same
//! meaning; every error maps to a Terminate code.
#![no_main]

use iwarp_proto::fpdu::{self, Fpdu, FpduDecoder, FpduRepr};
use iwarp_proto::message::{Body, MessageRepr};
use iwarp_proto::rdmap::{ReadRequest, ReadRequestRepr};
use iwarp_proto::terminate::{TermCode, Terminate, TerminateRepr};
use libfuzzer_sys::fuzz_target;

/// Re-emits a parsed message and compares with the ULPDU it came from.
fn check_message(ulpdu: &[u8]) {
    let m = match MessageRepr::parse(ulpdu) {
        Ok(m) => m,
        Err(e) => {
            let _ = TermCode::for_error(&e);
            return;
        }
    };
    let mut again = vec![0u8; m.headers_len()];
    m.emit_headers(&mut again)
        .expect("a parsed message re-emits");
    again.extend_from_slice(&ulpdu[m.payload.clone()]);
    let mut want = ulpdu[..again.len()].to_vec();
    want[0] &= !0x3c; // DDP reserved bits
    if let Body::Terminate(_) = m.body {
        let at = m.ddp.header_len();
        want[at + 2] &= 0xe0; // Terminate reserved bits
        want[at + 3] = 0;
    }
    assert_eq!(again, want, "a parsed message re-emits its bytes");
    assert_eq!(MessageRepr::parse(&again).expect("re-parses"), m);
    let _ = m.invalidate_stag();
    assert!(m.payload.end <= ulpdu.len());
}

fuzz_target!(|data: &[u8]| {
    let Some((&knobs, rest)) = data.split_first() else {
        return;
    };
    let crc = knobs & 1 != 0;
    let max = if knobs & 2 != 0 {
        fpdu::MAX_ULPDU_LEN
    } else {
        usize::from(knobs) * 4
    };
    let chunk = usize::from(knobs >> 2).max(1);

    // The stream, as the socket might deliver it.
    let _ = fpdu::frame_len(rest, max);
    let mut dec = FpduDecoder::new(max, crc);
    let mut ulpdus = Vec::new();
    'feed: for piece in rest.chunks(chunk) {
        dec.push(piece);
        loop {
            match dec.next_ulpdu() {
                Ok(Some(u)) => {
                    assert!(u.len() <= max, "a ULPDU above the limit came out");
                    ulpdus.push(u.to_vec());
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = TermCode::for_error(&e);
                    break 'feed;
                }
            }
        }
    }
    for u in &ulpdus {
        // Framing back: same ULPDU, CRC that checks.
        let f = FpduRepr { ulpdu: u }
            .to_vec(true)
            .expect("a decoded ULPDU re-frames");
        let view = Fpdu::new_checked(&f[..]).expect("re-framed FPDU is whole");
        assert_eq!(
            FpduRepr::parse(&view, true).expect("its CRC checks").ulpdu,
            &u[..]
        );
        check_message(u);
    }

    // Each layer straight on the input.
    check_message(rest);
    if let Ok(t) = Terminate::new_checked(rest) {
        if let Ok(r) = TerminateRepr::parse(&t) {
            let _ = (r.ddp_segment_length(), r.ddp_header(), r.rdma_header());
            let again = r.to_vec().expect("a parsed Terminate re-emits");
            assert_eq!(again[4..], rest[4..again.len()]);
            assert_eq!(
                TerminateRepr::parse(&Terminate::new_checked(&again[..]).unwrap()).unwrap(),
                r
            );
        }
    }
    if let Ok(r) = ReadRequest::new_checked(rest) {
        let repr = ReadRequestRepr::parse(&r).unwrap();
        assert_eq!(repr.to_bytes()[..], rest[..28]);
    }
});
