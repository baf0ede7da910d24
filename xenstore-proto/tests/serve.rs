//! The socket side of the server: identities per socket, release closing a domain's
//! connections, listeners stopping, shutdown.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use xenstore_proto::server::{Config, Server, ServerError};
use xenstore_proto::wire::{MsgType, Packet, Request, Response, XsErrno, HEADER_LEN};

fn read_frame(stream: &mut UnixStream) -> Option<(MsgType, u32, Vec<u8>)> {
    let mut header = [0u8; HEADER_LEN];
    if stream.read_exact(&mut header).is_err() {
        return None;
    }
    let len = Packet::new_unchecked(&header[..]).payload_len();
    let mut frame = header.to_vec();
    frame.resize(HEADER_LEN + len, 0);
    stream.read_exact(&mut frame[HEADER_LEN..]).unwrap();
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

fn call(stream: &mut UnixStream, req: Request<'_>, id: u32) -> Result<Vec<u8>, XsErrno> {
    stream.write_all(&req.to_frame(id, 0).unwrap()).unwrap();
    loop {
        let (ty, req_id, payload) = read_frame(stream).expect("a reply");
        if ty == MsgType::WatchEvent {
            continue;
        }
        assert_eq!(req_id, id);
        return match Response::parse(ty, &payload).unwrap() {
            Response::Error(e) => Err(e),
            _ => Ok(payload),
        };
    }
}

#[test]
fn sockets_carry_their_domain_identity() {
    let server = Server::new(Config::default());
    let dir = tempfile::tempdir().unwrap();
    let _l0 = server.listen(dir.path().join("0"), 0).unwrap();
    let _l4 = server.listen(dir.path().join("4"), 4).unwrap();
    let mut dom0 = open(UnixStream::connect(dir.path().join("0")).unwrap());
    let mut dom4 = open(UnixStream::connect(dir.path().join("4")).unwrap());
    call(
        &mut dom0,
        Request::Write {
            path: "/private",
            value: b"x",
        },
        1,
    )
    .unwrap();
    assert_eq!(
        call(&mut dom4, Request::Read { path: "/private" }, 1),
        Err(XsErrno::EACCES)
    );
    assert_eq!(
        call(&mut dom4, Request::GetDomainPath { domid: 4 }, 2).unwrap(),
        b"/local/domain/4\0"
    );
    server.shutdown();
}

#[test]
fn watch_events_cross_connections() {
    let server = Server::new(Config::default());
    let mut a = open(server.connect(0).unwrap());
    let mut b = open(server.connect(0).unwrap());
    call(
        &mut a,
        Request::Watch {
            path: "/w",
            token: "tok",
        },
        1,
    )
    .unwrap();
    let (ty, _, payload) = read_frame(&mut a).unwrap();
    assert_eq!(ty, MsgType::WatchEvent);
    assert_eq!(payload, b"/w\0tok\0");
    call(
        &mut b,
        Request::Write {
            path: "/w/x",
            value: b"1",
        },
        1,
    )
    .unwrap();
    let (ty, req_id, payload) = read_frame(&mut a).unwrap();
    assert_eq!((ty, req_id), (MsgType::WatchEvent, 0));
    assert_eq!(payload, b"/w/x\0tok\0");
    server.shutdown();
}

#[test]
fn release_closes_the_domains_connections_and_fires() {
    let server = Server::new(Config::default());
    server.introduce_domain(6).unwrap();
    let mut watcher = open(server.connect(0).unwrap());
    call(
        &mut watcher,
        Request::Watch {
            path: "@releaseDomain",
            token: "r",
        },
        1,
    )
    .unwrap();
    assert_eq!(read_frame(&mut watcher).unwrap().2, b"@releaseDomain\0r\0");
    let mut dom6 = open(server.connect(6).unwrap());
    call(&mut dom6, Request::GetFeature { domid: None }, 1).unwrap();
    server.release_domain(6).unwrap();
    let mut rest = Vec::new();
    assert_eq!(dom6.read_to_end(&mut rest).unwrap(), 0, "EOF after release");
    assert_eq!(read_frame(&mut watcher).unwrap().2, b"@releaseDomain\0r\0");
    assert_eq!(
        call(&mut watcher, Request::IsDomainIntroduced { domid: 6 }, 2).unwrap(),
        b"F\0"
    );
    server.shutdown();
}

#[test]
fn oversized_message_closes_only_that_connection() {
    let server = Server::new(Config::default());
    let mut bad = open(server.connect(0).unwrap());
    let mut good = open(server.connect(0).unwrap());
    let mut header = [0u8; HEADER_LEN];
    header[0..4].copy_from_slice(&MsgType::Write.as_u32().to_ne_bytes());
    header[12..16].copy_from_slice(&4097u32.to_ne_bytes());
    bad.write_all(&header).unwrap();
    let mut rest = Vec::new();
    assert_eq!(bad.read_to_end(&mut rest).unwrap(), 0);
    call(
        &mut good,
        Request::Write {
            path: "/ok",
            value: b"",
        },
        1,
    )
    .unwrap();
    server.shutdown();
}

#[test]
fn listener_stop_removes_the_socket() {
    let server = Server::new(Config::default());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s");
    let listener = server.listen(&path, 0).unwrap();
    let mut c = open(UnixStream::connect(&path).unwrap());
    // Once answered, the connection has been accepted (not just queued in the backlog).
    call(
        &mut c,
        Request::Write {
            path: "/before",
            value: b"",
        },
        1,
    )
    .unwrap();
    listener.stop();
    assert!(!path.exists());
    assert_eq!(
        UnixStream::connect(&path).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    // Accepted connections go on.
    call(
        &mut c,
        Request::Write {
            path: "/after",
            value: b"",
        },
        1,
    )
    .unwrap();
    // A stale socket file is replaced.
    let again = server.listen(&path, 0).unwrap();
    drop(again);
    server.shutdown();
    assert!(matches!(server.connect(0), Err(ServerError::Shutdown)));
    let mut rest = Vec::new();
    assert_eq!(
        c.read_to_end(&mut rest).unwrap(),
        0,
        "shutdown closes connections"
    );
}

#[test]
fn reserved_domids_are_refused() {
    let server = Server::new(Config::default());
    assert!(matches!(
        server.connect(0x7ff0),
        Err(ServerError::BadDomid(0x7ff0))
    ));
}
