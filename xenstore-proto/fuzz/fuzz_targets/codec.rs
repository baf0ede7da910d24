//! The wire codec on arbitrary bytes: the packet view, request and reply parsing (whatever
//! parses must emit and parse back to the same meaning), and the stream decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xenstore_proto::wire::{FrameDecoder, Packet, Request, Response, HEADER_LEN, PAYLOAD_MAX};

fuzz_target!(|data: &[u8]| {
    if let Ok(packet) = Packet::new_checked(data) {
        assert!(packet.payload_len() <= PAYLOAD_MAX);
        assert_eq!(packet.total_len(), HEADER_LEN + packet.payload().len());
        if let Ok(ty) = packet.msg_type() {
            let header = packet.header().expect("known type has a header");
            assert_eq!(header.msg_type, ty);
            if let Ok(req) = Request::parse(ty, packet.payload()) {
                assert_eq!(req.msg_type(), ty);
                let payload = req.to_payload();
                let again = Request::parse(ty, &payload).expect("an emitted request parses");
                assert_eq!(again, req);
            }
            if let Ok(resp) = Response::parse(ty, packet.payload()) {
                let payload = resp.to_payload();
                let again =
                    Response::parse(resp.msg_type(), &payload).expect("an emitted reply parses");
                assert_eq!(again, resp);
            }
        }
    }

    // The same bytes as a stream, cut at places the first byte chooses.
    let step = usize::from(data.first().copied().unwrap_or(1)).max(1);
    let mut decoder = FrameDecoder::new();
    let mut consumed = 0;
    for chunk in data.chunks(step) {
        decoder.push(chunk);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    let p = Packet::new_checked(&frame[..]).expect("decoded frames are whole");
                    assert_eq!(p.total_len(), frame.len());
                    consumed += frame.len();
                }
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
    assert_eq!(consumed + decoder.buffered(), data.len());
});
