//! Random bytes on one live connection never disturb the server's other clients.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use proptest::prelude::*;
use xenstore_proto::server::{Config, Server};
use xenstore_proto::wire::{MsgType, Packet, Request, Response, HEADER_LEN};

/// Sends one request on a raw stream and returns its reply's type and payload, skipping
/// watch events.
fn call(stream: &mut UnixStream, req: &Request<'_>, req_id: u32) -> (MsgType, Vec<u8>) {
    stream.write_all(&req.to_frame(req_id, 0).unwrap()).unwrap();
    loop {
        let mut header = [0u8; HEADER_LEN];
        stream.read_exact(&mut header).unwrap();
        let len = Packet::new_unchecked(&header[..]).payload_len();
        let mut frame = header.to_vec();
        frame.resize(HEADER_LEN + len, 0);
        stream.read_exact(&mut frame[HEADER_LEN..]).unwrap();
        let p = Packet::new_checked(&frame[..]).unwrap();
        let ty = p.msg_type().unwrap();
        if ty == MsgType::WatchEvent {
            continue;
        }
        assert_eq!(p.req_id(), req_id);
        return (ty, p.payload().to_vec());
    }
}

/// A frame-shaped prefix (a plausible header with a small length) followed by noise, or pure
/// noise: both reach the request parser and the framing checks.
fn garbage() -> impl Strategy<Value = Vec<u8>> {
    let framed = (
        0u32..30,
        any::<u32>(),
        0u32..3,
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(ty, req_id, tx_id, payload)| {
            let mut f = Vec::new();
            f.extend_from_slice(&ty.to_ne_bytes());
            f.extend_from_slice(&req_id.to_ne_bytes());
            f.extend_from_slice(&tx_id.to_ne_bytes());
            f.extend_from_slice(&(payload.len() as u32).to_ne_bytes());
            f.extend_from_slice(&payload);
            f
        });
    let noise = proptest::collection::vec(any::<u8>(), 0..2000);
    proptest::collection::vec(prop_oneof![framed, noise], 1..8).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn garbage_does_not_disturb_other_clients(bytes in garbage(), domid in prop_oneof![Just(0u32), Just(3u32)]) {
        let server = Server::new(Config::default());
        let mut good = server.connect(0).unwrap();
        // A hang would be a bug; the timeout turns it into a failure, not a measurement.
        good.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let watch = Request::Watch { path: "/", token: "all" };
        prop_assert_eq!(call(&mut good, &watch, 1).0, MsgType::Watch);

        let mut bad = server.connect(domid).unwrap();
        // The server may close it (oversized frame): errors are expected then.
        let _ = bad.write_all(&bytes);
        let _ = bad.shutdown(std::net::Shutdown::Write);

        let write = Request::Write { path: "/still/here", value: b"yes" };
        prop_assert_eq!(call(&mut good, &write, 2).0, MsgType::Write);
        let (ty, payload) = call(&mut good, &Request::Read { path: "/still/here" }, 3);
        prop_assert_eq!(ty, MsgType::Read);
        prop_assert_eq!(payload, b"yes".to_vec());
        // Whatever the garbage did, the store is consistent.
        let (ty, payload) = call(&mut good, &Request::Control { args: vec![b"check"] }, 4);
        prop_assert_eq!(ty, MsgType::Control);
        prop_assert_eq!(Response::parse(ty, &payload).unwrap(), Response::Control(b"OK\0"));
        server.with_store(|s| s.check()).unwrap();
        server.shutdown();
    }
}
