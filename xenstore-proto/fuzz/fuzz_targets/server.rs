//! The server's synchronous core on arbitrary byte streams from several connections of
//! several domains, interleaved with domain introduction and release: no panic, every frame it
//! sends is well formed, and the store's invariants hold after every step.
#![no_main]

use libfuzzer_sys::fuzz_target;
use xenstore_proto::server::{Config, ConnId, Quotas, Store};
use xenstore_proto::wire::{MsgType, Packet, PermKind, Perms, Request, PAYLOAD_MAX};

fn setup() -> (Store, Vec<ConnId>) {
    let mut store = Store::new(Config {
        // Small quotas so that the fuzzer reaches them.
        quotas: Quotas {
            nodes: 20,
            node_size: 64,
            watches: 4,
            transactions: 2,
            node_permissions: 3,
            transaction_nodes: 16,
        },
        ..Config::default()
    });
    let dom0 = store.open(0);
    for d in [1u32, 2] {
        let home = format!("/local/domain/{d}");
        let frame = Request::Mkdir { path: &home }.to_frame(1, 0).unwrap();
        store.handle(dom0, &frame);
        let perms = Perms(vec![xenstore_proto::wire::Perm::new(PermKind::None, d)]);
        let frame = Request::SetPerms { path: &home, perms }
            .to_frame(2, 0)
            .unwrap();
        store.handle(dom0, &frame);
        store.introduce_domain(d);
    }
    let conns = vec![dom0, store.open(0), store.open(1), store.open(2)];
    (store, conns)
}

fuzz_target!(|data: &[u8]| {
    let (mut store, mut conns) = setup();
    let domids = [0u32, 0, 1, 2];
    // Records: [selector][len][len bytes]. Selector picks a connection or a domain action.
    let mut rest = data;
    while let [sel, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (bytes, next) = tail.split_at(n);
        rest = next;
        let out = match sel % 8 {
            i @ 0..=3 => {
                let i = usize::from(i);
                if !store.is_open(conns[i]) {
                    // Reconnect, as a client would after being dropped or released.
                    conns[i] = store.open(domids[i]);
                }
                store.feed(conns[i], bytes)
            }
            4 => store.introduce_domain(1 + u32::from(*len % 2)),
            5 => store.release_domain(1 + u32::from(*len % 2)),
            6 => {
                let i = usize::from(*len % 4);
                store.close(conns[i]);
                Default::default()
            }
            _ => store.feed(conns[0], bytes),
        };
        for (conn, frame) in &out.messages {
            let p = Packet::new_checked(&frame[..]).expect("server frames are whole");
            assert!(p.payload_len() <= PAYLOAD_MAX);
            assert_eq!(p.total_len(), frame.len());
            let ty = p.msg_type().expect("server frame types are known");
            if ty == MsgType::WatchEvent {
                assert_eq!((p.req_id(), p.tx_id()), (0, 0));
            }
            assert!(
                store.is_open(*conn) || out.closed.contains(conn),
                "message for a connection that is gone"
            );
        }
        if let Err(why) = store.check() {
            panic!("store invariant broken: {why}");
        }
    }
});
