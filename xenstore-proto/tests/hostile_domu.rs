//! A domU can only hurt itself: xenstored's per-domain bounds on the socket side — connections,
//! outstanding requests (the server stops reading), queued watch events (dropped past a byte
//! budget or when stale; replies never are) — while dom0 and other domains go on.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use xenstore_proto::server::{Config, Server, ServerError};
use xenstore_proto::wire::{
    MsgType, Packet, Perm, PermKind, Perms, Request, Response, XsErrno, HEADER_LEN,
};

fn read_frame(stream: &mut UnixStream) -> Option<(MsgType, u32, Vec<u8>)> {
    let mut header = [0u8; HEADER_LEN];
    stream.read_exact(&mut header).ok()?;
    let len = Packet::new_unchecked(&header[..]).payload_len();
    let mut frame = header.to_vec();
    frame.resize(HEADER_LEN + len, 0);
    stream.read_exact(&mut frame[HEADER_LEN..]).ok()?;
    let p = Packet::new_checked(&frame[..]).unwrap();
    Some((p.msg_type().unwrap(), p.req_id(), p.payload().to_vec()))
}

fn open(stream: UnixStream) -> UnixStream {
    // A hang would be a bug; the timeout turns it into a failure.
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream
}

/// Sends a request and waits for its reply, skipping watch events; `None` if the server
/// closed the connection.
fn try_call(
    stream: &mut UnixStream,
    req: Request<'_>,
    id: u32,
) -> Option<Result<Vec<u8>, XsErrno>> {
    stream.write_all(&req.to_frame(id, 0).unwrap()).ok()?;
    loop {
        let (ty, req_id, payload) = read_frame(stream)?;
        if ty == MsgType::WatchEvent {
            continue;
        }
        assert_eq!(req_id, id);
        return Some(match Response::parse(ty, &payload).unwrap() {
            Response::Error(e) => Err(e),
            _ => Ok(payload),
        });
    }
}

fn call(stream: &mut UnixStream, req: Request<'_>, id: u32) -> Result<Vec<u8>, XsErrno> {
    try_call(stream, req, id).expect("connection open")
}

/// Polls `cond` for up to 20 s.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < end, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `/w`, readable by domains 5 and 7.
fn shared_node(dom0: &mut UnixStream) {
    call(
        dom0,
        Request::Write {
            path: "/w",
            value: b"v",
        },
        1,
    )
    .unwrap();
    let perms = Perms(vec![
        Perm::new(PermKind::None, 0),
        Perm::new(PermKind::Read, 5),
        Perm::new(PermKind::Read, 7),
    ]);
    call(dom0, Request::SetPerms { path: "/w", perms }, 2).unwrap();
}

#[test]
fn a_domain_has_a_bounded_number_of_connections() {
    let server = Server::new(Config {
        max_domain_connections: 3,
        ..Config::default()
    });
    // In process.
    let mut five: Vec<_> = (0..3).map(|_| server.connect(5).unwrap()).collect();
    match server.connect(5) {
        Err(ServerError::TooManyConnections { domid: 5, max: 3 }) => {}
        other => panic!("a 4th connection of domain 5: {other:?}"),
    }
    // dom0 is not limited; another domain has its own allowance.
    let _dom0: Vec<_> = (0..20).map(|_| server.connect(0).unwrap()).collect();
    let _six = server.connect(6).unwrap();
    // A closed connection frees its place.
    five.pop();
    eventually("a place freed", || server.connect(5).is_ok());

    // On a domain's socket, the connection past the limit is closed at once.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dom8");
    let _l = server.listen(&path, 8).unwrap();
    let mut served: Vec<_> = (0..3)
        .map(|_| open(UnixStream::connect(&path).unwrap()))
        .collect();
    for (i, s) in served.iter_mut().enumerate() {
        let r = call(s, Request::GetDomainPath { domid: 8 }, i as u32 + 1);
        assert_eq!(r.unwrap(), b"/local/domain/8\0");
    }
    let mut refused = open(UnixStream::connect(&path).unwrap());
    assert_eq!(
        try_call(&mut refused, Request::GetDomainPath { domid: 8 }, 9),
        None,
        "the 4th connection is closed unanswered"
    );
    drop(served.pop());
    eventually("a socket place freed", || {
        let mut s = open(UnixStream::connect(&path).unwrap());
        try_call(&mut s, Request::GetDomainPath { domid: 8 }, 1).is_some()
    });
    server.shutdown();
}

#[test]
fn a_domu_that_never_reads_is_bounded_and_hurts_only_itself() {
    const BUDGET: usize = 16 * 1024;
    const READS: u32 = 5000;
    const WRITES: u32 = 3000;
    let server = Server::new(Config {
        max_domain_output_bytes: BUDGET,
        ..Config::default()
    });
    let max_outstanding = Config::default().max_outstanding;
    let mut dom0 = open(server.connect(0).unwrap());
    shared_node(&mut dom0);
    // Replies of 2 KiB: the socket cannot absorb thousands of them.
    let big = vec![b'v'; 2048];
    call(
        &mut dom0,
        Request::Write {
            path: "/w",
            value: &big,
        },
        3,
    )
    .unwrap();
    let mut good = open(server.connect(7).unwrap());
    let hostile = open(server.connect(5).unwrap());

    // The hostile domain watches /w and pipelines thousands of reads, never reading a reply.
    let mut pipe = hostile.try_clone().unwrap();
    pipe.set_write_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let sender = std::thread::spawn(move || {
        let watch = Request::Watch {
            path: "/w",
            token: "t",
        };
        pipe.write_all(&watch.to_frame(0, 0).unwrap())?;
        for id in 1..=READS {
            pipe.write_all(&Request::Read { path: "/w" }.to_frame(id, 0).unwrap())?;
        }
        std::io::Result::Ok(())
    });
    // Its replies fill the socket; then at most `max_outstanding` requests are held and the
    // server stops reading its socket.
    eventually("the outstanding bound reached", || {
        server.domain_backlog(5).outstanding == max_outstanding
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(server.domain_backlog(5).outstanding <= max_outstanding);
    assert!(!sender.is_finished(), "the server kept reading the domain");

    // Watch events for it beyond the byte budget are dropped, not queued.
    for i in 0..WRITES {
        let v = format!("{i}");
        call(
            &mut dom0,
            Request::Write {
                path: "/w",
                value: v.as_bytes(),
            },
            10 + i,
        )
        .unwrap();
    }
    let backlog = server.domain_backlog(5);
    let reply_room = max_outstanding * (HEADER_LEN + big.len());
    assert!(
        backlog.queued_bytes <= BUDGET + reply_room,
        "queued for the hostile domain: {backlog:?}"
    );
    // Others are served meanwhile.
    assert_eq!(
        call(&mut good, Request::Read { path: "/w" }, 1).unwrap(),
        b"2999"
    );
    assert_eq!(
        call(&mut dom0, Request::Read { path: "/w" }, 99_999).unwrap(),
        b"2999"
    );

    // The hostile domain is not disconnected: once it reads, every reply arrives, in order;
    // only watch events were lost.
    let mut hostile = hostile;
    let (mut replies, mut events) = (0u32, 0u32);
    let mut watch_ok = false;
    while replies < READS {
        let (ty, id, _) = read_frame(&mut hostile).expect("connection kept");
        match ty {
            MsgType::WatchEvent => events += 1,
            MsgType::Watch => watch_ok = true,
            MsgType::Read => {
                replies += 1;
                assert_eq!(id, replies, "replies in order, none lost");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    sender.join().unwrap().unwrap();
    assert!(watch_ok);
    assert!(
        events < WRITES + 1,
        "{events} events: some must have been dropped"
    );
    eventually("the backlog drained", || {
        server.domain_backlog(5).outstanding == 0
    });
    server.shutdown();
}

#[test]
fn stale_watch_events_of_a_domu_are_dropped_unsent() {
    let server = Server::new(Config {
        watch_event_timeout: Duration::from_millis(500),
        ..Config::default()
    });
    let mut dom0 = open(server.connect(0).unwrap());
    shared_node(&mut dom0);
    let mut slow = open(server.connect(5).unwrap());
    call(
        &mut slow,
        Request::Watch {
            path: "/w",
            token: "t",
        },
        1,
    )
    .unwrap();
    // Fire events until the socket is full and several wait in the server's queue (still
    // there 50 ms later: the writer is stuck on the full socket, not just behind).
    let event_len = HEADER_LEN + "/w\0t\0".len();
    let queued = || server.domain_backlog(5).queued_bytes;
    let mut fired = 0u32;
    loop {
        assert!(fired < 200_000, "the socket never filled");
        call(
            &mut dom0,
            Request::Write {
                path: "/w",
                value: b"x",
            },
            10,
        )
        .unwrap();
        fired += 1;
        if queued() > 4 * event_len {
            std::thread::sleep(Duration::from_millis(50));
            if queued() > 4 * event_len {
                break;
            }
        }
    }
    // Without the client reading anything, the stale events leave the queue (only the frame
    // being written may stay).
    eventually("stale events dropped", || queued() <= event_len);
    // Now a fresh event, then read everything.
    call(
        &mut dom0,
        Request::Write {
            path: "/w/fresh",
            value: b"y",
        },
        11,
    )
    .unwrap();
    let mut got = 0u32;
    loop {
        let (ty, _, payload) = read_frame(&mut slow).expect("connection kept");
        assert_eq!(ty, MsgType::WatchEvent);
        if payload.starts_with(b"/w/fresh\0") {
            break;
        }
        got += 1;
    }
    assert!(
        got < fired + 1,
        "{got} of {} events arrived: the stale ones must have been dropped",
        fired + 1
    );
    server.shutdown();
}

#[test]
fn a_domu_that_never_reads_its_events_does_not_hold_up_another_domain() {
    // Domain 5's writes fire watch events for domain 7, which never reads: 5's requests stay
    // outstanding while those events wait, but only until they time out — the events are
    // dropped even though 7's socket stays full.
    const WRITES: u32 = 1500;
    let server = Server::new(Config {
        watch_event_timeout: Duration::from_millis(20),
        ..Config::default()
    });
    let mut dom0 = open(server.connect(0).unwrap());
    call(
        &mut dom0,
        Request::Write {
            path: "/w",
            value: b"",
        },
        1,
    )
    .unwrap();
    let perms = Perms(vec![
        Perm::new(PermKind::None, 0),
        Perm::new(PermKind::Both, 5),
        Perm::new(PermKind::Read, 7),
    ]);
    call(&mut dom0, Request::SetPerms { path: "/w", perms }, 2).unwrap();
    let mut deaf = open(server.connect(7).unwrap());
    call(
        &mut deaf,
        Request::Watch {
            path: "/w",
            token: "t",
        },
        1,
    )
    .unwrap();
    let mut writer = open(server.connect(5).unwrap());
    for i in 0..WRITES {
        let v = format!("{i}");
        let r = try_call(
            &mut writer,
            Request::Write {
                path: "/w",
                value: v.as_bytes(),
            },
            i + 1,
        );
        assert_eq!(r, Some(Ok(b"OK\0".to_vec())), "write {i} of domain 5");
    }
    assert!(
        server.domain_backlog(7).queued_bytes > 0,
        "domain 7's socket filled up (else this proves nothing)"
    );
    drop(deaf);
    server.shutdown();
}
