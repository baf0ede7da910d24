//! Unit tests of the synchronous core: requests in, frames out, no sockets.

use crate::wire::{MsgType, Packet, Perm, PermKind, Perms, Request, Response, XsErrno};

use super::{Config, ConnId, Output, Quotas, Store};

/// A decoded outgoing frame.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Msg {
    conn: ConnId,
    ty: MsgType,
    req_id: u32,
    tx_id: u32,
    payload: Vec<u8>,
}

fn decode(out: &Output) -> Vec<Msg> {
    out.messages
        .iter()
        .map(|(conn, f)| {
            let p = Packet::new_checked(&f[..]).expect("server frames are valid");
            Msg {
                conn: *conn,
                ty: p.msg_type().expect("known type"),
                req_id: p.req_id(),
                tx_id: p.tx_id(),
                payload: p.payload().to_vec(),
            }
        })
        .collect()
}

struct Fixture {
    store: Store,
    next_req: u32,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::with(Config::default())
    }

    fn with(config: Config) -> Fixture {
        Fixture {
            store: Store::new(config),
            next_req: 1,
        }
    }

    /// Sends a request; returns the reply to `conn` and every other message.
    fn req(
        &mut self,
        conn: ConnId,
        tx: u32,
        r: Request<'_>,
    ) -> (Result<Vec<u8>, XsErrno>, Vec<Msg>) {
        let id = self.next_req;
        self.next_req += 1;
        let frame = r.to_frame(id, tx).unwrap();
        let out = self.store.feed(conn, &frame);
        self.store.check().expect("store invariants");
        let msgs = decode(&out);
        let reply = msgs
            .iter()
            .find(|m| m.conn == conn && m.req_id == id && m.ty != MsgType::WatchEvent)
            .expect("a reply")
            .clone();
        assert_eq!(reply.tx_id, tx);
        let others = msgs.into_iter().filter(|m| *m != reply).collect();
        let res = if reply.ty == MsgType::Error {
            match Response::parse(MsgType::Error, &reply.payload).unwrap() {
                Response::Error(e) => Err(e),
                _ => unreachable!(),
            }
        } else {
            assert_eq!(reply.ty, r.msg_type());
            Ok(reply.payload)
        };
        (res, others)
    }

    fn ok(&mut self, conn: ConnId, r: Request<'_>) -> Vec<u8> {
        self.req(conn, 0, r).0.expect("request succeeds")
    }

    fn err(&mut self, conn: ConnId, r: Request<'_>) -> XsErrno {
        self.req(conn, 0, r).0.expect_err("request fails")
    }

    fn write(&mut self, conn: ConnId, path: &str, value: &str) -> Result<(), XsErrno> {
        self.req(
            conn,
            0,
            Request::Write {
                path,
                value: value.as_bytes(),
            },
        )
        .0
        .map(|_| ())
    }

    fn read(&mut self, conn: ConnId, path: &str) -> Result<Vec<u8>, XsErrno> {
        self.req(conn, 0, Request::Read { path }).0
    }

    fn set_perms(&mut self, conn: ConnId, path: &str, perms: &[Perm]) -> Result<(), XsErrno> {
        self.req(
            conn,
            0,
            Request::SetPerms {
                path,
                perms: Perms(perms.to_vec()),
            },
        )
        .0
        .map(|_| ())
    }

    fn dir(&mut self, conn: ConnId, path: &str) -> Vec<String> {
        let payload = self.ok(conn, Request::Directory { path });
        match Response::parse(MsgType::Directory, &payload).unwrap() {
            Response::Directory(d) => d.into_iter().map(str::to_owned).collect(),
            _ => unreachable!(),
        }
    }
}

fn events(msgs: &[Msg], conn: ConnId) -> Vec<(String, String)> {
    msgs.iter()
        .filter(|m| m.conn == conn && m.ty == MsgType::WatchEvent)
        .map(
            |m| match Response::parse(MsgType::WatchEvent, &m.payload).unwrap() {
                Response::WatchEvent { path, token } => (path.to_owned(), token.to_owned()),
                _ => unreachable!(),
            },
        )
        .collect()
}

fn perm(kind: PermKind, domid: u32) -> Perm {
    Perm::new(kind, domid)
}

/// dom0 prepares `/local/domain/<d>` owned by dom0, readable by d, as the toolstack does.
fn domain_home(f: &mut Fixture, dom0: ConnId, d: u32) {
    let path = format!("/local/domain/{d}");
    f.ok(dom0, Request::Mkdir { path: &path });
    f.set_perms(
        dom0,
        &path,
        &[perm(PermKind::None, 0), perm(PermKind::Read, d)],
    )
    .unwrap();
}

#[test]
fn write_read_directory_rm() {
    let mut f = Fixture::new();
    let c = f.store.open(0);
    f.write(c, "/a/b/c", "hello").unwrap();
    assert_eq!(f.read(c, "/a/b/c").unwrap(), b"hello");
    assert_eq!(f.read(c, "/a/b").unwrap(), b"");
    assert_eq!(f.dir(c, "/a"), ["b"]);
    f.write(c, "/a/x", "1").unwrap();
    assert_eq!(f.dir(c, "/a"), ["b", "x"]);
    f.ok(c, Request::Rm { path: "/a/b" });
    assert_eq!(f.read(c, "/a/b/c"), Err(XsErrno::ENOENT));
    assert_eq!(f.dir(c, "/a"), ["x"]);
    // Removing what is not there is fine if the parent exists.
    f.ok(c, Request::Rm { path: "/a/nope" });
    assert_eq!(
        f.err(c, Request::Rm { path: "/nope/nope" }),
        XsErrno::ENOENT
    );
    assert_eq!(f.err(c, Request::Rm { path: "/" }), XsErrno::EINVAL);
    // MKDIR leaves existing values alone.
    f.ok(c, Request::Mkdir { path: "/a/x" });
    assert_eq!(f.read(c, "/a/x").unwrap(), b"1");
    assert_eq!(f.store.node_count(), 5); // / /tool /tool/xenstored /a /a/x
}

#[test]
fn binary_values_and_empty_values() {
    let mut f = Fixture::new();
    let c = f.store.open(0);
    let value = [0u8, 1, 0, 255];
    f.ok(
        c,
        Request::Write {
            path: "/bin",
            value: &value,
        },
    );
    assert_eq!(f.read(c, "/bin").unwrap(), value);
    f.write(c, "/empty", "").unwrap();
    assert_eq!(f.read(c, "/empty").unwrap(), b"");
}

#[test]
fn relative_paths_resolve_under_the_domain_home() {
    let mut f = Fixture::new();
    let dom0 = f.store.open(0);
    domain_home(&mut f, dom0, 3);
    f.set_perms(dom0, "/local/domain/3", &[perm(PermKind::None, 3)])
        .unwrap();
    let d3 = f.store.open(3);
    f.write(d3, "device/x", "v").unwrap();
    assert_eq!(f.read(dom0, "/local/domain/3/device/x").unwrap(), b"v");
    assert_eq!(f.read(d3, "device/x").unwrap(), b"v");
    // dom0's relative paths resolve under /local/domain/0.
    f.write(dom0, "name", "Domain-0").unwrap();
    assert_eq!(f.read(dom0, "/local/domain/0/name").unwrap(), b"Domain-0");
    let gdp = f.ok(dom0, Request::GetDomainPath { domid: 7 });
    assert_eq!(gdp, b"/local/domain/7\0");
}

#[test]
fn permissions_owner_default_and_entries() {
    let mut f = Fixture::new();
    let dom0 = f.store.open(0);
    domain_home(&mut f, dom0, 1);
    domain_home(&mut f, dom0, 2);
    let d1 = f.store.open(1);
    let d2 = f.store.open(2);
    // The root is n0: a domU can read nothing there.
    assert_eq!(f.read(d1, "/"), Err(XsErrno::EACCES));
    // A missing node under an unreadable parent is EACCES, not ENOENT.
    assert_eq!(f.read(d1, "/secret/none"), Err(XsErrno::EACCES));
    // Under a readable parent, ENOENT.
    assert_eq!(f.read(d1, "/local/domain/1/none"), Err(XsErrno::ENOENT));
    // Home is r1: readable, not writable by d1.
    assert_eq!(f.read(d1, "/local/domain/1").unwrap(), b"");
    assert_eq!(f.write(d1, "/local/domain/1/x", "v"), Err(XsErrno::EACCES));
    // dom0 gives d1 a writable directory, as the toolstack does for device/.
    f.ok(
        dom0,
        Request::Mkdir {
            path: "/local/domain/1/device",
        },
    );
    f.set_perms(dom0, "/local/domain/1/device", &[perm(PermKind::None, 1)])
        .unwrap();
    f.write(d1, "device/vrdma", "").unwrap();
    // d1 created it: d1 owns it, other perms inherited (n).
    let perms = f.ok(
        d1,
        Request::GetPerms {
            path: "device/vrdma",
        },
    );
    assert_eq!(perms, b"n1\0");
    assert_eq!(
        f.read(d2, "/local/domain/1/device/vrdma"),
        Err(XsErrno::EACCES)
    );
    // d1 grants d2 read.
    f.set_perms(
        d1,
        "device/vrdma",
        &[perm(PermKind::None, 1), perm(PermKind::Read, 2)],
    )
    .unwrap();
    assert_eq!(f.read(d2, "/local/domain/1/device/vrdma").unwrap(), b"");
    assert_eq!(
        f.write(d2, "/local/domain/1/device/vrdma", "x"),
        Err(XsErrno::EACCES)
    );
    // Only dom0 changes owners.
    assert_eq!(
        f.set_perms(d1, "device/vrdma", &[perm(PermKind::None, 2)]),
        Err(XsErrno::EPERM)
    );
    // A non-owner with write access may not set perms.
    f.set_perms(
        d1,
        "device/vrdma",
        &[perm(PermKind::None, 1), perm(PermKind::Both, 2)],
    )
    .unwrap();
    f.write(d2, "/local/domain/1/device/vrdma", "x").unwrap();
    assert_eq!(
        f.set_perms(
            d2,
            "/local/domain/1/device/vrdma",
            &[perm(PermKind::None, 2)]
        ),
        Err(XsErrno::EACCES)
    );
    f.set_perms(
        dom0,
        "/local/domain/1/device/vrdma",
        &[perm(PermKind::Read, 2)],
    )
    .unwrap();
    assert_eq!(
        f.ok(
            dom0,
            Request::GetPerms {
                path: "/local/domain/1/device/vrdma"
            }
        ),
        b"r2\0"
    );
}

#[test]
fn watches_fire_on_subtree_with_relative_paths() {
    let mut f = Fixture::new();
    let dom0 = f.store.open(0);
    domain_home(&mut f, dom0, 4);
    f.set_perms(dom0, "/local/domain/4", &[perm(PermKind::None, 4)])
        .unwrap();
    let d4 = f.store.open(4);
    let (r, msgs) = f.req(
        d4,
        0,
        Request::Watch {
            path: "device",
            token: "tok",
        },
    );
    r.unwrap();
    assert_eq!(events(&msgs, d4), [("device".to_owned(), "tok".to_owned())]);
    let (_, msgs) = f.req(
        dom0,
        0,
        Request::Watch {
            path: "/local",
            token: "all",
        },
    );
    assert_eq!(
        events(&msgs, dom0),
        [("/local".to_owned(), "all".to_owned())]
    );
    let (r, msgs) = f.req(
        dom0,
        0,
        Request::Write {
            path: "/local/domain/4/device/a",
            value: b"1",
        },
    );
    r.unwrap();
    assert_eq!(
        events(&msgs, d4),
        [("device/a".to_owned(), "tok".to_owned())]
    );
    assert_eq!(
        events(&msgs, dom0),
        [("/local/domain/4/device/a".to_owned(), "all".to_owned())]
    );
    // Unrelated paths do not fire; a sibling with a common prefix does not either.
    let (_, msgs) = f.req(
        dom0,
        0,
        Request::Write {
            path: "/local/domain/4/devicex",
            value: b"",
        },
    );
    assert!(events(&msgs, d4).is_empty());
    // Removing a parent fires the watch with its own path.
    let (_, msgs) = f.req(
        dom0,
        0,
        Request::Rm {
            path: "/local/domain/4",
        },
    );
    assert_eq!(events(&msgs, d4), [("device".to_owned(), "tok".to_owned())]);
    f.ok(
        d4,
        Request::Unwatch {
            path: "device",
            token: "tok",
        },
    );
    assert_eq!(
        f.err(
            d4,
            Request::Unwatch {
                path: "device",
                token: "tok"
            }
        ),
        XsErrno::ENOENT
    );
}

#[test]
fn watch_duplicates_and_unreadable_events() {
    let mut f = Fixture::new();
    let dom0 = f.store.open(0);
    let d5 = f.store.open(5);
    f.ok(
        d5,
        Request::Watch {
            path: "/",
            token: "t",
        },
    );
    assert_eq!(
        f.err(
            d5,
            Request::Watch {
                path: "/",
                token: "t"
            }
        ),
        XsErrno::EEXIST
    );
    // d5 cannot read /hidden (n0): no event.
    let (_, msgs) = f.req(
        dom0,
        0,
        Request::Write {
            path: "/hidden",
            value: b"",
        },
    );
    assert!(events(&msgs, d5).is_empty());
    f.set_perms(dom0, "/hidden", &[perm(PermKind::Read, 0)])
        .unwrap();
    let (_, msgs) = f.req(
        dom0,
        0,
        Request::Write {
            path: "/hidden",
            value: b"x",
        },
    );
    assert_eq!(events(&msgs, d5), [("/hidden".to_owned(), "t".to_owned())]);
}

#[test]
fn transactions_isolate_commit_and_conflict() {
    let mut f = Fixture::new();
    let a = f.store.open(0);
    let b = f.store.open(0);
    f.write(a, "/t/x", "0").unwrap();
    f.ok(
        b,
        Request::Watch {
            path: "/t",
            token: "w",
        },
    );
    let tx = f.ok(a, Request::TransactionStart);
    let tx: u32 = std::str::from_utf8(&tx[..tx.len() - 1])
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(tx, 0);
    let (r, msgs) = f.req(
        a,
        tx,
        Request::Write {
            path: "/t/x",
            value: b"1",
        },
    );
    r.unwrap();
    assert!(events(&msgs, b).is_empty(), "no events before commit");
    assert_eq!(
        f.req(a, tx, Request::Read { path: "/t/x" }).0.unwrap(),
        b"1"
    );
    assert_eq!(f.read(b, "/t/x").unwrap(), b"0", "isolated");
    f.req(
        a,
        tx,
        Request::Write {
            path: "/t/new/y",
            value: b"2",
        },
    )
    .0
    .unwrap();
    let (r, msgs) = f.req(a, tx, Request::TransactionEnd { commit: true });
    r.unwrap();
    assert_eq!(f.read(b, "/t/x").unwrap(), b"1");
    assert_eq!(f.read(b, "/t/new/y").unwrap(), b"2");
    let ev = events(&msgs, b);
    assert!(ev.contains(&("/t/x".to_owned(), "w".to_owned())));
    assert!(ev.contains(&("/t/new/y".to_owned(), "w".to_owned())));
    // The id is gone.
    assert_eq!(
        f.req(a, tx, Request::Read { path: "/t/x" }).0,
        Err(XsErrno::ENOENT)
    );

    // Conflict: b changes what a's transaction read.
    let tx = f.ok(a, Request::TransactionStart);
    let tx: u32 = std::str::from_utf8(&tx[..tx.len() - 1])
        .unwrap()
        .parse()
        .unwrap();
    f.req(a, tx, Request::Read { path: "/t/x" }).0.unwrap();
    f.req(
        a,
        tx,
        Request::Write {
            path: "/t/z",
            value: b"z",
        },
    )
    .0
    .unwrap();
    f.write(b, "/t/x", "b").unwrap();
    assert_eq!(
        f.req(a, tx, Request::TransactionEnd { commit: true }).0,
        Err(XsErrno::EAGAIN)
    );
    assert_eq!(f.read(b, "/t/z"), Err(XsErrno::ENOENT));

    // Abort discards.
    let tx = f.ok(a, Request::TransactionStart);
    let tx: u32 = std::str::from_utf8(&tx[..tx.len() - 1])
        .unwrap()
        .parse()
        .unwrap();
    f.req(a, tx, Request::Rm { path: "/t" }).0.unwrap();
    f.req(a, tx, Request::TransactionEnd { commit: false })
        .0
        .unwrap();
    assert_eq!(f.read(b, "/t/x").unwrap(), b"b");
    // No nesting.
    let tx = f.ok(a, Request::TransactionStart);
    let tx: u32 = std::str::from_utf8(&tx[..tx.len() - 1])
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        f.req(a, tx, Request::TransactionStart).0,
        Err(XsErrno::EBUSY)
    );
    // Another connection cannot use a's transaction.
    assert_eq!(
        f.req(b, tx, Request::Read { path: "/t" }).0,
        Err(XsErrno::ENOENT)
    );
}

#[test]
fn node_size_counts_children_names_as_xenstored_does() {
    // Seen on real xenstored 4.17: a domU's directory stops growing when its record (children
    // names included) passes node-size.
    let mut f = Fixture::with(Config::default());
    let dom0 = f.store.open(0);
    domain_home(&mut f, dom0, 6);
    f.set_perms(dom0, "/local/domain/6", &[perm(PermKind::None, 6)])
        .unwrap();
    let d6 = f.store.open(6);
    f.write(d6, "big", "").unwrap();
    // 1 permission: 24 + 8 + 28 per child name fits 72 children in 2048 bytes, not 73.
    for i in 0..72 {
        f.write(d6, &format!("big/child-with-a-long-name-{i:04}"), "")
            .unwrap();
    }
    assert_eq!(
        f.write(d6, "big/child-with-a-long-name-0072", ""),
        Err(XsErrno::ENOSPC)
    );
    // dom0 has no quota.
    for i in 72..100 {
        f.write(
            dom0,
            &format!("/local/domain/6/big/child-with-a-long-name-{i:04}"),
            "",
        )
        .unwrap();
    }
}

#[test]
fn quotas_and_their_errors() {
    let mut f = Fixture::with(Config {
        quotas: Quotas {
            nodes: 3,
            // A record: 24-byte header + 8 per permission + value + children names.
            node_size: 40,
            watches: 2,
            transactions: 1,
            node_permissions: 2,
            transaction_nodes: 1024,
        },
        ..Config::default()
    });
    let dom0 = f.store.open(0);
    domain_home(&mut f, dom0, 6);
    f.set_perms(dom0, "/local/domain/6", &[perm(PermKind::None, 6)])
        .unwrap();
    let d6 = f.store.open(6);
    // The home is owned by d6 now: 1 node.
    f.write(d6, "a", "12345678").unwrap();
    assert_eq!(f.write(d6, "b", "123456789"), Err(XsErrno::ENOSPC));
    f.write(d6, "b", "").unwrap();
    assert_eq!(f.write(d6, "c", ""), Err(XsErrno::ENOSPC));
    assert_eq!(f.store.owned_by(6), 3);
    f.ok(
        d6,
        Request::Watch {
            path: "a",
            token: "1",
        },
    );
    f.ok(
        d6,
        Request::Watch {
            path: "a",
            token: "2",
        },
    );
    assert_eq!(
        f.err(
            d6,
            Request::Watch {
                path: "a",
                token: "3"
            }
        ),
        XsErrno::E2BIG
    );
    f.ok(d6, Request::TransactionStart);
    assert_eq!(f.err(d6, Request::TransactionStart), XsErrno::ENOSPC);
    assert_eq!(
        f.set_perms(
            d6,
            "a",
            &[
                perm(PermKind::None, 6),
                perm(PermKind::Read, 0),
                perm(PermKind::Read, 1)
            ]
        ),
        Err(XsErrno::ENOSPC)
    );
    // dom0 is not limited.
    for i in 0..10 {
        f.write(dom0, &format!("/big/{i}"), "0123456789abcdef")
            .unwrap();
    }
}

#[test]
fn privileged_requests_are_refused_to_domus() {
    let mut f = Fixture::new();
    let d7 = f.store.open(7);
    for r in [
        Request::Introduce {
            domid: 8,
            mfn: 1,
            evtchn: 1,
        },
        Request::Release { domid: 8 },
        Request::IsDomainIntroduced { domid: 8 },
        Request::Resume { domid: 8 },
        Request::SetTarget {
            domid: 7,
            target: 8,
        },
        Request::SetFeature {
            domid: 7,
            features: 0,
        },
        Request::GetFeature { domid: Some(7) },
        Request::GetQuota {
            domid: None,
            quota: None,
        },
        Request::SetQuota {
            domid: None,
            quota: "nodes",
            value: 1,
        },
        Request::Control {
            args: vec![b"help"],
        },
    ] {
        assert_eq!(f.err(d7, r), XsErrno::EACCES);
    }
    assert_eq!(f.ok(d7, Request::GetFeature { domid: None }), b"4\0");
}

#[test]
fn unknown_and_malformed_requests() {
    let mut f = Fixture::new();
    let c = f.store.open(0);
    for raw_type in [20u32, 27, 0xffff, 15, 16] {
        let mut frame = vec![0u8; 16];
        frame[0..4].copy_from_slice(&raw_type.to_ne_bytes());
        frame[4..8].copy_from_slice(&77u32.to_ne_bytes());
        let out = decode(&f.store.feed(c, &frame));
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].ty, out[0].req_id), (MsgType::Error, 77));
        assert_eq!(out[0].payload, b"ENOSYS\0");
    }
    // READ without a nul, with a bad path.
    for payload in [&b"/a"[..], b"/a//b\0", b"\0", b"/a\0/b\0"] {
        let frame = crate::wire::encode_frame(MsgType::Read, 5, 0, payload).unwrap();
        let out = decode(&f.store.feed(c, &frame));
        assert_eq!(out[0].payload, b"EINVAL\0");
        assert_eq!(out[0].req_id, 5);
    }
    // Oversized: the connection closes, others unaffected.
    let other = f.store.open(0);
    let mut frame = vec![0u8; 16];
    frame[0..4].copy_from_slice(&2u32.to_ne_bytes());
    frame[12..16].copy_from_slice(&4097u32.to_ne_bytes());
    let out = f.store.feed(c, &frame);
    assert_eq!(out.closed, [c]);
    assert!(!f.store.is_open(c));
    f.write(other, "/still", "ok").unwrap();
}

#[test]
fn directory_part_chunks_and_end_marker() {
    let mut f = Fixture::new();
    let c = f.store.open(0);
    let mut names = Vec::new();
    for i in 0..400 {
        let name = format!("child-with-a-long-name-{i:04}");
        f.ok(
            c,
            Request::Mkdir {
                path: &format!("/big/{name}"),
            },
        );
        names.push(name);
    }
    assert_eq!(
        f.err(c, Request::Directory { path: "/big" }),
        XsErrno::E2BIG
    );
    // Reassemble as libxenstore's xs_directory_part does.
    let mut strings: Vec<u8> = Vec::new();
    let mut gen0: Option<Vec<u8>> = None;
    loop {
        let payload = f.ok(
            c,
            Request::DirectoryPart {
                path: "/big",
                offset: strings.len() as u32,
            },
        );
        assert!(payload.len() <= 4096);
        let nul = payload.iter().position(|&b| b == 0).unwrap();
        let gen = payload[..nul].to_vec();
        assert_eq!(*gen0.get_or_insert(gen.clone()), gen);
        strings.extend_from_slice(&payload[nul + 1..]);
        if strings.len() <= 1 || strings[strings.len() - 2] == 0 {
            break;
        }
    }
    let got: Vec<String> = strings[..strings.len() - 2]
        .split(|&b| b == 0)
        .map(|s| String::from_utf8(s.to_vec()).unwrap())
        .collect();
    assert_eq!(got, names);
    // Empty directory: generation, then an empty string.
    f.ok(c, Request::Mkdir { path: "/empty" });
    let p = f.ok(
        c,
        Request::DirectoryPart {
            path: "/empty",
            offset: 0,
        },
    );
    assert!(p.ends_with(b"\0\0"));
}

#[test]
fn introduce_release_fire_special_watches_and_clean_up() {
    let mut f = Fixture::new();
    let dom0 = f.store.open(0);
    f.ok(
        dom0,
        Request::Watch {
            path: "@introduceDomain",
            token: "i",
        },
    );
    f.ok(
        dom0,
        Request::Watch {
            path: "@releaseDomain",
            token: "r",
        },
    );
    let (r, msgs) = f.req(
        dom0,
        0,
        Request::Introduce {
            domid: 9,
            mfn: 0,
            evtchn: 1,
        },
    );
    r.unwrap();
    assert_eq!(
        events(&msgs, dom0),
        [("@introduceDomain".to_owned(), "i".to_owned())]
    );
    assert_eq!(f.ok(dom0, Request::IsDomainIntroduced { domid: 9 }), b"T\0");
    domain_home(&mut f, dom0, 9);
    f.ok(
        dom0,
        Request::Mkdir {
            path: "/local/domain/9/device",
        },
    );
    f.set_perms(dom0, "/local/domain/9/device", &[perm(PermKind::None, 9)])
        .unwrap();
    f.write(dom0, "/shared", "").unwrap();
    f.set_perms(
        dom0,
        "/shared",
        &[perm(PermKind::None, 0), perm(PermKind::Both, 9)],
    )
    .unwrap();
    let d9 = f.store.open(9);
    f.write(d9, "device/mine", "x").unwrap();
    f.write(d9, "/shared/made-by-9", "y").unwrap();
    f.ok(
        d9,
        Request::Watch {
            path: "device",
            token: "d",
        },
    );
    let (r, msgs) = f.req(dom0, 0, Request::Release { domid: 9 });
    r.unwrap();
    assert_eq!(
        events(&msgs, dom0),
        [("@releaseDomain".to_owned(), "r".to_owned())]
    );
    assert!(!f.store.is_open(d9));
    assert_eq!(f.ok(dom0, Request::IsDomainIntroduced { domid: 9 }), b"F\0");
    // Nodes it owned are gone; the home (dom0's) stays; perms naming it are dropped.
    assert_eq!(f.read(dom0, "/local/domain/9/device"), Err(XsErrno::ENOENT));
    assert_eq!(f.read(dom0, "/shared/made-by-9"), Err(XsErrno::ENOENT));
    assert_eq!(f.read(dom0, "/local/domain/9").unwrap(), b"");
    assert_eq!(f.ok(dom0, Request::GetPerms { path: "/shared" }), b"n0\0");
    assert_eq!(f.store.owned_by(9), 0);
    assert_eq!(f.err(dom0, Request::Release { domid: 9 }), XsErrno::ENOENT);
}

#[test]
fn keep_orphans_hands_nodes_to_dom0() {
    let mut f = Fixture::with(Config {
        keep_orphans: true,
        ..Config::default()
    });
    let dom0 = f.store.open(0);
    f.store.introduce_domain(2);
    domain_home(&mut f, dom0, 2);
    f.set_perms(
        dom0,
        "/local/domain/2",
        &[perm(PermKind::None, 0), perm(PermKind::Both, 2)],
    )
    .unwrap();
    let d2 = f.store.open(2);
    f.write(d2, "data", "kept").unwrap();
    f.store.release_domain(2);
    f.store.check().unwrap();
    assert_eq!(f.read(dom0, "/local/domain/2/data").unwrap(), b"kept");
    assert_eq!(
        f.ok(
            dom0,
            Request::GetPerms {
                path: "/local/domain/2/data"
            }
        ),
        b"n0\0"
    );
}

#[test]
fn quota_and_feature_requests() {
    let mut f = Fixture::new();
    let dom0 = f.store.open(0);
    let names = f.ok(
        dom0,
        Request::GetQuota {
            domid: None,
            quota: None,
        },
    );
    assert_eq!(
        names,
        b"nodes watches transactions transaction-nodes node-permissions node-size\0"
    );
    assert_eq!(
        f.ok(
            dom0,
            Request::GetQuota {
                domid: None,
                quota: Some("nodes")
            }
        ),
        b"1000\0"
    );
    f.ok(
        dom0,
        Request::SetQuota {
            domid: None,
            quota: "nodes",
            value: 5,
        },
    );
    assert_eq!(
        f.ok(
            dom0,
            Request::GetQuota {
                domid: None,
                quota: Some("nodes")
            }
        ),
        b"5\0"
    );
    assert_eq!(
        f.err(
            dom0,
            Request::GetQuota {
                domid: Some(3),
                quota: Some("nodes")
            }
        ),
        XsErrno::ENOENT
    );
    f.store.open(3);
    f.ok(
        dom0,
        Request::SetQuota {
            domid: Some(3),
            quota: "watches",
            value: 1,
        },
    );
    assert_eq!(
        f.ok(
            dom0,
            Request::GetQuota {
                domid: Some(3),
                quota: Some("watches")
            }
        ),
        b"1\0"
    );
    assert_eq!(
        f.err(
            dom0,
            Request::SetQuota {
                domid: None,
                quota: "bogus",
                value: 1
            }
        ),
        XsErrno::EINVAL
    );
    f.ok(
        dom0,
        Request::SetFeature {
            domid: 3,
            features: 0,
        },
    );
    assert_eq!(f.ok(dom0, Request::GetFeature { domid: Some(3) }), b"0\0");
    f.store.introduce_domain(3);
    assert_eq!(
        f.err(
            dom0,
            Request::SetFeature {
                domid: 3,
                features: 4
            }
        ),
        XsErrno::EBUSY
    );
    assert_eq!(
        f.ok(
            dom0,
            Request::Control {
                args: vec![b"check"]
            }
        ),
        b"OK\0"
    );
    assert_eq!(
        f.err(
            dom0,
            Request::Control {
                args: vec![b"log", b"on"]
            }
        ),
        XsErrno::ENOSYS
    );
}

#[test]
fn transaction_nodes_quota_bounds_a_transaction() {
    let mut f = Fixture::with(Config {
        quotas: Quotas {
            transaction_nodes: 8,
            ..Quotas::default()
        },
        ..Config::default()
    });
    let d1 = f.store.open(1);
    let tx = f.ok(d1, Request::TransactionStart);
    let tx: u32 = std::str::from_utf8(&tx[..tx.len() - 1])
        .unwrap()
        .parse()
        .unwrap();
    let mut refused = None;
    for i in 0..20 {
        let path = format!("/n{i}");
        if let Err(XsErrno::ENOSPC) = f.req(d1, tx, Request::Read { path: &path }).0 {
            refused = Some((i, XsErrno::ENOSPC));
            break;
        }
    }
    let (i, e) = refused.expect("a transaction cannot grow without bound");
    assert_eq!(e, XsErrno::ENOSPC);
    assert!(i >= 4, "some reads pass first ({i})");
    // dom0 is not limited.
    let dom0 = f.store.open(0);
    let tx = f.ok(dom0, Request::TransactionStart);
    let tx: u32 = std::str::from_utf8(&tx[..tx.len() - 1])
        .unwrap()
        .parse()
        .unwrap();
    for i in 0..20 {
        let path = format!("/m{i}");
        assert_eq!(
            f.req(dom0, tx, Request::Read { path: &path }).0,
            Err(XsErrno::ENOENT)
        );
    }
}

/// Starts a transaction on `conn`; its id.
fn start_tx(f: &mut Fixture, conn: ConnId) -> u32 {
    let tx = f.ok(conn, Request::TransactionStart);
    std::str::from_utf8(&tx[..tx.len() - 1])
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_transaction_keeps_seeing_what_it_first_read() {
    // xenstored's test-xenstore "ta err": a write outside the transaction after the
    // transaction read the node does not show through; the commit then fails.
    let mut f = Fixture::new();
    let a = f.store.open(0);
    let b = f.store.open(0);
    f.write(a, "/t/x", "a").unwrap();
    let tx = start_tx(&mut f, a);
    assert_eq!(
        f.req(a, tx, Request::Read { path: "/t/x" }).0.unwrap(),
        b"a"
    );
    f.write(b, "/t/x", "b").unwrap();
    assert_eq!(
        f.req(a, tx, Request::Read { path: "/t/x" }).0.unwrap(),
        b"a",
        "the transaction's view"
    );
    f.req(
        a,
        tx,
        Request::Write {
            path: "/t/x",
            value: b"c",
        },
    )
    .0
    .unwrap();
    assert_eq!(
        f.req(a, tx, Request::Read { path: "/t/x" }).0.unwrap(),
        b"c"
    );
    assert_eq!(
        f.req(a, tx, Request::TransactionEnd { commit: true }).0,
        Err(XsErrno::EAGAIN)
    );
    assert_eq!(f.read(b, "/t/x").unwrap(), b"b");
}

#[test]
fn a_transaction_keeps_its_view_of_listings_removals_and_absent_nodes() {
    let mut f = Fixture::new();
    let a = f.store.open(0);
    let b = f.store.open(0);
    f.write(a, "/t/x", "1").unwrap();
    f.write(a, "/t/gone", "2").unwrap();
    let tx = start_tx(&mut f, a);
    let list = |f: &mut Fixture| {
        let p = f.req(a, tx, Request::Directory { path: "/t" }).0.unwrap();
        match Response::parse(MsgType::Directory, &p).unwrap() {
            Response::Directory(d) => d.into_iter().map(str::to_owned).collect::<Vec<_>>(),
            _ => unreachable!(),
        }
    };
    assert_eq!(list(&mut f), ["x", "gone"]);
    assert_eq!(
        f.req(a, tx, Request::Read { path: "/t/gone" }).0.unwrap(),
        b"2"
    );
    assert_eq!(
        f.req(a, tx, Request::Read { path: "/t/new" }).0,
        Err(XsErrno::ENOENT)
    );
    // Outside: a child added, one removed, the absent node created.
    f.write(b, "/t/new", "3").unwrap();
    f.ok(b, Request::Rm { path: "/t/gone" });
    assert_eq!(list(&mut f), ["x", "gone"], "listing as first seen");
    assert_eq!(
        f.req(a, tx, Request::Read { path: "/t/gone" }).0.unwrap(),
        b"2",
        "removed outside, still there inside"
    );
    assert_eq!(
        f.req(a, tx, Request::Read { path: "/t/new" }).0,
        Err(XsErrno::ENOENT),
        "created outside, still absent inside"
    );
    assert_eq!(
        f.req(a, tx, Request::TransactionEnd { commit: true }).0,
        Err(XsErrno::EAGAIN)
    );
}

#[test]
fn special_watch_events_of_other_domains_never_reach_a_domu() {
    // XSA-115: @introduceDomain / @releaseDomain fire only for connections that may read the
    // special node, `n0` by default: dom0 only.
    let mut f = Fixture::new();
    let dom0 = f.store.open(0);
    let good = f.store.open(7);
    for c in [dom0, good] {
        for (path, token) in [("@introduceDomain", "i"), ("@releaseDomain", "r")] {
            // The watch itself is allowed, with its initial event.
            let (r, msgs) = f.req(c, 0, Request::Watch { path, token });
            r.unwrap();
            assert_eq!(events(&msgs, c), [(path.to_owned(), token.to_owned())]);
        }
    }
    let intro = |f: &mut Fixture, domid| {
        let (r, msgs) = f.req(
            dom0,
            0,
            Request::Introduce {
                domid,
                mfn: 0,
                evtchn: 1,
            },
        );
        r.unwrap();
        msgs
    };
    let release = |f: &mut Fixture, domid| {
        let (r, msgs) = f.req(dom0, 0, Request::Release { domid });
        r.unwrap();
        msgs
    };
    let msgs = intro(&mut f, 9);
    assert_eq!(
        events(&msgs, dom0),
        [("@introduceDomain".into(), "i".into())]
    );
    assert!(events(&msgs, good).is_empty(), "{msgs:?}");
    let msgs = release(&mut f, 9);
    assert_eq!(events(&msgs, dom0), [("@releaseDomain".into(), "r".into())]);
    assert!(events(&msgs, good).is_empty(), "{msgs:?}");
    // Server-side introduction and release (the simulated host's path) too.
    let out = f.store.introduce_domain(10);
    assert!(events(&decode(&out), good).is_empty());
    let out = f.store.release_domain(10);
    assert!(events(&decode(&out), good).is_empty());
    assert_eq!(events(&decode(&out), dom0).len(), 1);

    // The domU may not grant itself the events; nor name other special nodes.
    let grant = [perm(PermKind::None, 0), perm(PermKind::Read, 7)];
    assert_eq!(
        f.set_perms(good, "@releaseDomain", &grant),
        Err(XsErrno::EACCES)
    );
    assert_eq!(
        f.set_perms(dom0, "@otherDomain", &grant),
        Err(XsErrno::EINVAL)
    );
    // dom0 grants domain 7 @releaseDomain (not @introduceDomain).
    f.set_perms(dom0, "@releaseDomain", &grant).unwrap();
    let msgs = intro(&mut f, 11);
    assert!(events(&msgs, good).is_empty());
    let msgs = release(&mut f, 11);
    assert_eq!(events(&msgs, good), [("@releaseDomain".into(), "r".into())]);
    // Read access is all it gives: no changing them.
    assert_eq!(
        f.set_perms(good, "@releaseDomain", &[perm(PermKind::Read, 0)]),
        Err(XsErrno::EACCES)
    );
    // Releasing domain 7 takes it out of the special node's permissions.
    intro(&mut f, 7);
    release(&mut f, 7);
    assert_eq!(
        f.store.special["@releaseDomain"],
        Perms(vec![perm(PermKind::None, 0)])
    );
}

#[test]
fn the_transaction_quota_counts_all_connections_of_a_domain() {
    // xenstored counts per connection, and a domU has one; here a domU may open several, so
    // its 10 transactions are shared among them.
    let mut f = Fixture::new();
    let a = f.store.open(5);
    let b = f.store.open(5);
    let other = f.store.open(6);
    let dom0 = f.store.open(0);
    let mut open = Vec::new();
    for i in 0..10 {
        let conn = if i % 2 == 0 { a } else { b };
        open.push((conn, start_tx(&mut f, conn)));
    }
    assert_eq!(f.err(a, Request::TransactionStart), XsErrno::ENOSPC);
    assert_eq!(f.err(b, Request::TransactionStart), XsErrno::ENOSPC);
    // Another domain and dom0 are not affected.
    start_tx(&mut f, other);
    for _ in 0..12 {
        start_tx(&mut f, dom0);
    }
    // Ending one frees a place for either connection.
    let (conn, tx) = open.pop().unwrap();
    f.req(conn, tx, Request::TransactionEnd { commit: false })
        .0
        .unwrap();
    start_tx(&mut f, a);
    assert_eq!(f.err(b, Request::TransactionStart), XsErrno::ENOSPC);
    // A closed connection's transactions go with it.
    f.store.close(b);
    start_tx(&mut f, a);
}
