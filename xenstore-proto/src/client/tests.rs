//! Client unit tests against a scripted fake daemon over `UnixStream::pair()`: the peer reads
//! frames with the codec and answers as the test dictates, so out-of-order replies, conflicts
//! and dropped connections are exact, not timing-dependent.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::*;
use crate::wire::{
    DirectoryPart, FrameDecoder, Header, MsgType, Packet, Perm, PermKind, Perms, Request, Response,
    XsErrno, HEADER_LEN,
};

/// Hang guard for every blocking wait in these tests (never a timing assertion).
const GUARD: Duration = Duration::from_secs(20);

/// The daemon's end of the connection.
struct Peer {
    stream: UnixStream,
    decoder: FrameDecoder,
}

/// One request as the peer received it.
struct Got {
    header: Header,
    payload: Vec<u8>,
}

impl Got {
    fn request(&self) -> Request<'_> {
        Request::parse(self.header.msg_type, &self.payload).expect("client sent a valid request")
    }
}

fn pair() -> (UnixStream, Peer) {
    let (client, daemon) = UnixStream::pair().unwrap();
    daemon.set_read_timeout(Some(GUARD)).unwrap();
    (
        client,
        Peer {
            stream: daemon,
            decoder: FrameDecoder::new(),
        },
    )
}

impl Peer {
    /// The next request; `None` when the client closed the connection.
    fn recv(&mut self) -> Option<Got> {
        loop {
            if let Some(frame) = self.decoder.next_frame().unwrap() {
                let packet = Packet::new_checked(&frame[..]).unwrap();
                return Some(Got {
                    header: packet.header().unwrap(),
                    payload: packet.payload().to_vec(),
                });
            }
            let mut buf = [0u8; 8192];
            let n = match self.stream.read(&mut buf) {
                // A client that closes with our last reply unread resets the connection: closed.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                r => r.expect("peer read (hang guard)"),
            };
            if n == 0 {
                return None;
            }
            self.decoder.push(&buf[..n]);
        }
    }

    /// The next request, which must be of type `ty`.
    fn expect(&mut self, ty: MsgType) -> Got {
        let got = self.recv().expect("client closed the connection");
        assert_eq!(got.header.msg_type, ty, "unexpected request type");
        got
    }

    fn send(&mut self, resp: &Response<'_>, req_id: u32, tx_id: u32) {
        self.stream
            .write_all(&resp.to_frame(req_id, tx_id).unwrap())
            .unwrap();
    }

    fn reply(&mut self, got: &Got, resp: Response<'_>) {
        self.send(&resp, got.header.req_id, got.header.tx_id);
    }

    fn ok(&mut self, got: &Got) {
        self.reply(got, Response::Ok(got.header.msg_type));
    }

    fn error(&mut self, got: &Got, errno: XsErrno) {
        self.reply(got, Response::Error(errno));
    }

    fn event(&mut self, path: &str, token: &str) {
        self.send(&Response::WatchEvent { path, token }, 0, 0);
    }
}

fn blocking_pair() -> (Client, Peer) {
    let (client, peer) = pair();
    (Client::from_unix_stream(client).unwrap(), peer)
}

fn async_pair() -> (AsyncClient, Peer) {
    let (client, peer) = pair();
    (AsyncClient::from_std_stream(client).unwrap(), peer)
}

/// Waits for the peer thread without blocking the test's runtime (the client's connection
/// task may run on it).
async fn joined(daemon: thread::JoinHandle<()>) {
    tokio::task::spawn_blocking(move || daemon.join().unwrap())
        .await
        .unwrap();
}

fn spawn_peer(peer: Peer, script: impl FnOnce(Peer) + Send + 'static) -> thread::JoinHandle<()> {
    thread::spawn(move || script(peer))
}

#[test]
fn write_then_read_sends_libxenstore_payloads() {
    let (client, peer) = blocking_pair();
    let daemon = spawn_peer(peer, |mut p| {
        let got = p.expect(MsgType::Write);
        assert_eq!(got.payload, b"/vm/a\0hello");
        assert_eq!(got.header.tx_id, 0);
        p.ok(&got);
        let got = p.expect(MsgType::Read);
        assert_eq!(got.request(), Request::Read { path: "/vm/a" });
        p.reply(&got, Response::Read(b"hello"));
        let got = p.expect(MsgType::Mkdir);
        p.ok(&got);
        let got = p.expect(MsgType::Rm);
        p.ok(&got);
        let got = p.expect(MsgType::Directory);
        p.reply(&got, Response::Directory(vec!["a", "b"]));
        let got = p.expect(MsgType::Directory);
        p.reply(&got, Response::Directory(vec![]));
    });
    client.write("/vm/a", "hello").unwrap();
    assert_eq!(client.read("/vm/a").unwrap(), b"hello");
    client.mkdir("/vm/d").unwrap();
    client.rm("/vm/d").unwrap();
    assert_eq!(client.directory("/vm").unwrap(), vec!["a", "b"]);
    assert!(client.directory("/empty").unwrap().is_empty());
    daemon.join().unwrap();
}

#[test]
fn errno_stays_visible() {
    let (client, peer) = blocking_pair();
    let daemon = spawn_peer(peer, |mut p| {
        let got = p.expect(MsgType::Read);
        p.error(&got, XsErrno::ENOENT);
        let got = p.expect(MsgType::Write);
        p.error(&got, XsErrno::EACCES);
        let got = p.expect(MsgType::Read);
        p.error(&got, XsErrno::ENOENT);
        let got = p.expect(MsgType::Read);
        p.error(&got, XsErrno::EACCES);
    });
    let err = client.read("/missing").unwrap_err();
    assert!(
        matches!(
            &err,
            Error::Xs {
                errno: XsErrno::ENOENT,
                op: MsgType::Read,
                path: Some(p)
            } if p == "/missing"
        ),
        "{err:?}"
    );
    assert!(err.is_not_found());
    let err = client.write("/local", "x").unwrap_err();
    assert!(err.is_access_denied(), "{err:?}");
    assert!(!client.exists("/missing").unwrap());
    assert!(client.exists("/secret").unwrap_err().is_access_denied());
    daemon.join().unwrap();
}

#[test]
fn bad_arguments_are_refused_before_sending() {
    let (client, mut peer) = blocking_pair();
    for bad in [
        "",
        "a//b",
        "/trailing/",
        "/has space",
        "/nul\0byte",
        "@special",
    ] {
        assert!(
            matches!(client.read(bad), Err(Error::BadPath { .. })),
            "{bad:?}"
        );
    }
    let big = vec![b'x'; 5000];
    assert!(matches!(
        client.write("/big", &big),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        client.control(&[b"a\0b"]),
        Err(Error::InvalidArgument(_))
    ));
    // Nothing reached the daemon: closing the client gives it EOF as the first event.
    drop(client);
    assert!(peer.recv().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn out_of_order_replies_reach_their_callers() {
    const N: usize = 16;
    let (client, peer) = async_pair();
    let daemon = spawn_peer(peer, |mut p| {
        let mut got: Vec<Got> = (0..N).map(|_| p.expect(MsgType::Read)).collect();
        let ids: std::collections::HashSet<u32> = got.iter().map(|g| g.header.req_id).collect();
        assert_eq!(ids.len(), N, "req_ids in flight must be distinct");
        // Answer in reverse order, each with its own path as the value.
        while let Some(g) = got.pop() {
            let path = match g.request() {
                Request::Read { path } => path.to_owned(),
                other => panic!("{other:?}"),
            };
            p.reply(&g, Response::Read(path.as_bytes()));
        }
    });
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..N {
        let c = client.clone();
        tasks.spawn(async move {
            let path = format!("/k/{i}");
            let value = c.read(&path).await.unwrap();
            assert_eq!(value, path.as_bytes());
        });
    }
    let all = async {
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
    };
    tokio::time::timeout(GUARD, all).await.expect("hang guard");
    joined(daemon).await;
}

#[tokio::test]
async fn dropped_connection_fails_pending_calls() {
    let (client, peer) = async_pair();
    let daemon = spawn_peer(peer, |mut p| {
        for _ in 0..3 {
            p.expect(MsgType::Read);
        }
        // Hang up with three requests unanswered.
    });
    let reads = async { tokio::join!(client.read("/a"), client.read("/b"), client.read("/c")) };
    let (a, b, c) = tokio::time::timeout(GUARD, reads)
        .await
        .expect("pending calls must fail, not hang");
    for r in [a, b, c] {
        let err = r.unwrap_err();
        assert!(err.is_connection_lost(), "{err:?}");
        assert!(err.to_string().contains("closed the connection"), "{err}");
    }
    joined(daemon).await;
    // Later calls fail at once too.
    assert!(client.read("/d").await.unwrap_err().is_connection_lost());
    assert!(client.connection_lost().is_some());
}

#[test]
fn blocking_callers_fail_when_the_daemon_hangs_up() {
    let (client, peer) = blocking_pair();
    let daemon = spawn_peer(peer, |mut p| {
        for _ in 0..4 {
            p.expect(MsgType::Read);
        }
    });
    let callers: Vec<_> = (0..4)
        .map(|i| {
            let c = client.clone();
            thread::spawn(move || c.read(&format!("/x/{i}")))
        })
        .collect();
    for caller in callers {
        assert!(caller.join().unwrap().unwrap_err().is_connection_lost());
    }
    daemon.join().unwrap();
}

#[test]
fn protocol_violations_are_distinct_errors() {
    let (client, peer) = blocking_pair();
    let daemon = spawn_peer(peer, |mut p| {
        // A reply of the wrong type fails that call only.
        let got = p.expect(MsgType::Read);
        p.send(&Response::Ok(MsgType::Write), got.header.req_id, 0);
        let got = p.expect(MsgType::Read);
        p.reply(&got, Response::Read(b"fine"));
        // An oversized frame kills the connection.
        let got = p.expect(MsgType::Read);
        let mut bad = vec![0u8; HEADER_LEN];
        Header {
            msg_type: MsgType::Read,
            req_id: got.header.req_id,
            tx_id: 0,
            len: 100_000,
        }
        .emit(&mut bad);
        p.stream.write_all(&bad).unwrap();
        // The client goes away; wait for it.
        while p.recv().is_some() {}
    });
    assert!(matches!(
        client.read("/a"),
        Err(Error::UnexpectedReply {
            request: MsgType::Read,
            reply: MsgType::Write
        })
    ));
    assert_eq!(client.read("/a").unwrap(), b"fine");
    let err = client.read("/a").unwrap_err();
    assert!(err.is_connection_lost(), "{err:?}");
    assert!(err.to_string().contains("protocol violation"), "{err}");
    drop(client);
    daemon.join().unwrap();
}

#[test]
fn watch_delivers_initial_fire_and_unwatches_on_drop() {
    let (client, peer) = blocking_pair();
    let (token_tx, token_rx) = std::sync::mpsc::channel();
    let daemon = spawn_peer(peer, move |mut p| {
        let got = p.expect(MsgType::Watch);
        let (path, token) = match got.request() {
            Request::Watch { path, token } => (path.to_owned(), token.to_owned()),
            other => panic!("{other:?}"),
        };
        assert_eq!(path, "/be");
        p.ok(&got);
        p.event("/be", &token); // the initial fire
        p.event("/be/1/state", "someone-else"); // not ours: dropped
        p.event("/be/1/state", &token);
        token_tx.send(token.clone()).unwrap();
        let got = p.expect(MsgType::Unwatch);
        assert_eq!(
            got.request(),
            Request::Unwatch {
                path: "/be",
                token: &token
            }
        );
        p.ok(&got);
    });
    let mut watch = client.watch("/be").unwrap();
    assert_eq!(watch.path(), "/be");
    let first = watch.next().unwrap().unwrap();
    assert_eq!(first.path, "/be");
    assert_eq!(first.token, watch.token());
    assert_eq!(watch.next().unwrap().unwrap().path, "/be/1/state");
    assert_eq!(token_rx.recv_timeout(GUARD).unwrap(), watch.token());
    drop(watch);
    daemon.join().unwrap();
}

#[test]
fn stopper_wakes_a_blocked_watch_and_unwatches_once() {
    let (client, peer) = blocking_pair();
    let (token_tx, token_rx) = std::sync::mpsc::channel();
    let (unwatched_tx, unwatched_rx) = std::sync::mpsc::channel();
    let daemon = spawn_peer(peer, move |mut p| {
        let got = p.expect(MsgType::Watch);
        let token = match got.request() {
            Request::Watch { token, .. } => token.to_owned(),
            other => panic!("{other:?}"),
        };
        p.ok(&got);
        p.event("/be", &token);
        token_tx.send(token.clone()).unwrap();
        let got = p.expect(MsgType::Unwatch);
        assert_eq!(
            got.request(),
            Request::Unwatch {
                path: "/be",
                token: &token
            }
        );
        p.ok(&got);
        unwatched_tx.send(()).unwrap();
        // Dropping the stopped watch, then the client: nothing more is sent (no second UNWATCH).
        assert!(p.recv().is_none(), "a request after the stop's UNWATCH");
    });
    let mut watch = client.watch("/be").unwrap();
    assert_eq!(watch.next_timeout(None).unwrap().unwrap().path, "/be");
    let token = token_rx.recv_timeout(GUARD).unwrap();
    let stopper = watch.stopper();
    let waiter = thread::spawn(move || {
        // No timeout: only the stop can end this wait.
        let r = watch.next_timeout(None);
        (r, watch)
    });
    thread::sleep(Duration::from_millis(20));
    stopper.stop();
    stopper.stop();
    let (r, watch) = waiter.join().unwrap();
    assert!(matches!(r, Err(Error::WatchEnded)), "{r:?} (token {token})");
    // The stop's UNWATCH is sent detached (as a dropped watch's is): wait until the peer has it
    // before closing the client, or the close can overtake it.
    unwatched_rx.recv_timeout(GUARD).unwrap();
    drop(watch);
    drop(client);
    daemon.join().unwrap();
}

async fn next(w: &mut AsyncWatch) -> Option<Result<WatchEvent>> {
    tokio::time::timeout(GUARD, w.next())
        .await
        .expect("hang guard")
}

#[tokio::test]
async fn watch_stream_reports_connection_loss_then_ends() {
    let (client, peer) = async_pair();
    let daemon = spawn_peer(peer, |mut p| {
        let got = p.expect(MsgType::Watch);
        let token = match got.request() {
            Request::Watch { token, .. } => token.to_owned(),
            other => panic!("{other:?}"),
        };
        p.ok(&got);
        p.event("/w", &token);
    });
    let mut watch = client.watch("/w").await.unwrap();
    assert_eq!(next(&mut watch).await.unwrap().unwrap().path, "/w");
    assert!(next(&mut watch)
        .await
        .unwrap()
        .unwrap_err()
        .is_connection_lost());
    assert!(next(&mut watch).await.is_none());
    joined(daemon).await;
}

#[test]
fn failed_watch_leaves_no_sink() {
    let (client, peer) = blocking_pair();
    let daemon = spawn_peer(peer, |mut p| {
        let got = p.expect(MsgType::Watch);
        p.error(&got, XsErrno::ENOSPC);
    });
    assert_eq!(
        client.watch("/w").unwrap_err().errno(),
        Some(XsErrno::ENOSPC)
    );
    daemon.join().unwrap();
}

/// Serves transactions: START → id 7, READ → the counter, WRITE → stored, END T → EAGAIN
/// while `conflicts` lasts, else OK. Stops at EOF.
fn counter_daemon(mut p: Peer, conflicts: u32, ends: Arc<AtomicU32>) {
    let mut committed: u32 = 0;
    let mut pending: Option<u32> = None;
    let mut left = conflicts;
    while let Some(got) = p.recv() {
        match got.request() {
            Request::TransactionStart => p.reply(&got, Response::TransactionStart(7)),
            Request::Read { .. } => {
                assert_eq!(got.header.tx_id, 7);
                let v = committed.to_string();
                p.reply(&got, Response::Read(v.as_bytes()));
            }
            Request::Write { value, .. } => {
                assert_eq!(got.header.tx_id, 7);
                pending = Some(std::str::from_utf8(value).unwrap().parse().unwrap());
                p.ok(&got);
            }
            Request::TransactionEnd { commit } => {
                assert_eq!(got.header.tx_id, 7);
                ends.fetch_add(1, Ordering::SeqCst);
                if commit && left > 0 {
                    left -= 1;
                    p.error(&got, XsErrno::EAGAIN);
                } else {
                    if commit {
                        committed = pending.take().unwrap();
                    }
                    p.ok(&got);
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn transaction_helper_retries_on_eagain() {
    let (client, peer) = blocking_pair();
    let ends = Arc::new(AtomicU32::new(0));
    let e = ends.clone();
    let daemon = spawn_peer(peer, move |p| counter_daemon(p, 2, e));
    let mut calls = 0;
    let value = client
        .transaction(|tx| {
            calls += 1;
            let n: u32 = tx.read_string("/counter")?.parse().unwrap();
            tx.write("/counter", (n + 1).to_string())?;
            Ok(n + 1)
        })
        .unwrap();
    assert_eq!((calls, value), (3, 1));
    assert_eq!(ends.load(Ordering::SeqCst), 3);
    drop(client);
    daemon.join().unwrap();
}

#[tokio::test]
async fn async_transaction_helper_retries_and_gives_up() {
    let (client, peer) = async_pair();
    let ends = Arc::new(AtomicU32::new(0));
    let e = ends.clone();
    let daemon = spawn_peer(peer, move |p| counter_daemon(p, u32::MAX, e));
    let client = client.with_retry_policy(RetryPolicy::attempts(4));
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let err = client
        .transaction(move |tx| {
            c.fetch_add(1, Ordering::SeqCst);
            async move { tx.write("/counter", "1").await }
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::RetriesExhausted { attempts: 4 }),
        "{err:?}"
    );
    assert_eq!(err.errno(), Some(XsErrno::EAGAIN));
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    drop(client);
    joined(daemon).await;
    assert_eq!(ends.load(Ordering::SeqCst), 4);
}

#[test]
fn closure_error_aborts_and_dropped_transaction_aborts() {
    let (client, peer) = blocking_pair();
    let daemon = spawn_peer(peer, |mut p| {
        for _ in 0..2 {
            let got = p.expect(MsgType::TransactionStart);
            p.reply(&got, Response::TransactionStart(3));
            let got = p.expect(MsgType::TransactionEnd);
            assert_eq!(got.header.tx_id, 3);
            assert_eq!(got.request(), Request::TransactionEnd { commit: false });
            p.ok(&got);
        }
    });
    let err = client
        .transaction(|_tx| -> Result<()> {
            Err(Error::BadValue {
                path: "/x".into(),
                value: "?".into(),
            })
        })
        .unwrap_err();
    assert!(matches!(err, Error::BadValue { .. }));
    let tx = client.start_transaction().unwrap();
    assert_eq!(tx.id(), 3);
    drop(tx);
    daemon.join().unwrap();
}

#[test]
fn ended_transaction_refuses_operations() {
    let (client, peer) = blocking_pair();
    let daemon = spawn_peer(peer, |mut p| {
        let got = p.expect(MsgType::TransactionStart);
        p.reply(&got, Response::TransactionStart(9));
        let got = p.expect(MsgType::TransactionEnd);
        p.ok(&got);
    });
    let tx = client.start_transaction().unwrap();
    tx.commit().unwrap();
    assert!(matches!(tx.read("/a"), Err(Error::TransactionEnded)));
    assert!(matches!(tx.commit(), Err(Error::TransactionEnded)));
    drop(tx);
    daemon.join().unwrap();
}

fn part(generation: u64, children: Vec<&str>, complete: bool) -> Response<'_> {
    Response::DirectoryPart(DirectoryPart {
        generation,
        children,
        complete,
    })
}

fn part_offset(got: &Got) -> u32 {
    match got.request() {
        Request::DirectoryPart { path, offset } => {
            assert_eq!(path, "/big");
            offset
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn directory_falls_back_to_parts_and_restarts_on_change() {
    let (client, peer) = blocking_pair();
    let daemon = spawn_peer(peer, |mut p| {
        let got = p.expect(MsgType::Directory);
        p.error(&got, XsErrno::E2BIG);
        let got = p.expect(MsgType::DirectoryPart);
        assert_eq!(part_offset(&got), 0);
        p.reply(&got, part(5, vec!["aa", "b"], false));
        let got = p.expect(MsgType::DirectoryPart);
        assert_eq!(part_offset(&got), 5); // "aa\0b\0"
        p.reply(&got, part(6, vec!["c"], false)); // changed meanwhile
        let got = p.expect(MsgType::DirectoryPart);
        assert_eq!(part_offset(&got), 0);
        p.reply(&got, part(6, vec!["aa", "b"], false));
        let got = p.expect(MsgType::DirectoryPart);
        assert_eq!(part_offset(&got), 5);
        p.reply(&got, part(6, vec!["c"], true));
    });
    assert_eq!(client.directory("/big").unwrap(), vec!["aa", "b", "c"]);
    daemon.join().unwrap();
}

#[test]
fn directory_without_part_support_is_e2big() {
    let (client, peer) = blocking_pair();
    let daemon = spawn_peer(peer, |mut p| {
        let got = p.expect(MsgType::Directory);
        p.error(&got, XsErrno::E2BIG);
        let got = p.expect(MsgType::DirectoryPart);
        p.error(&got, XsErrno::ENOSYS);
    });
    assert_eq!(
        client.directory("/big").unwrap_err().errno(),
        Some(XsErrno::E2BIG)
    );
    daemon.join().unwrap();
}

#[test]
fn xenbus_file_transport_carries_the_same_framing() {
    let (client_end, peer) = pair();
    let file = std::fs::File::from(std::os::fd::OwnedFd::from(client_end));
    let client = Client::from_xenbus_file(file).unwrap();
    let daemon = spawn_peer(peer, |mut p| {
        let got = p.expect(MsgType::Write);
        p.ok(&got);
        let got = p.expect(MsgType::Watch);
        let token = match got.request() {
            Request::Watch { token, .. } => token.to_owned(),
            other => panic!("{other:?}"),
        };
        p.ok(&got);
        p.event("/dev", &token);
        let got = p.expect(MsgType::Read);
        p.reply(&got, Response::Read(b"v"));
        let got = p.expect(MsgType::Unwatch);
        p.ok(&got);
    });
    client.write("/dev/x", "v").unwrap();
    let mut watch = client.watch("/dev").unwrap();
    assert_eq!(
        watch.next_timeout(Some(GUARD)).unwrap().unwrap().path,
        "/dev"
    );
    assert_eq!(client.read("/dev/x").unwrap(), b"v");
    watch.unwatch().unwrap();
    daemon.join().unwrap();
}

#[test]
fn perms_domains_and_toolstack_requests() {
    let (client, peer) = blocking_pair();
    let daemon = spawn_peer(peer, |mut p| {
        let got = p.expect(MsgType::SetPerms);
        assert_eq!(got.payload, b"/be\0n0\0r5\0");
        p.ok(&got);
        let got = p.expect(MsgType::GetPerms);
        p.reply(
            &got,
            Response::GetPerms(Perms(vec![
                Perm::new(PermKind::None, 0),
                Perm::new(PermKind::Read, 5),
            ])),
        );
        let got = p.expect(MsgType::GetDomainPath);
        assert_eq!(got.payload, b"5\0");
        p.reply(&got, Response::GetDomainPath("/local/domain/5"));
        let got = p.expect(MsgType::Introduce);
        assert_eq!(got.payload, b"5\x0012345\x003\0");
        p.ok(&got);
        let got = p.expect(MsgType::IsDomainIntroduced);
        p.reply(&got, Response::IsDomainIntroduced(true));
        let got = p.expect(MsgType::Release);
        p.ok(&got);
        let got = p.expect(MsgType::GetFeature);
        p.reply(&got, Response::GetFeature(1));
        let got = p.expect(MsgType::SetQuota);
        assert_eq!(got.payload, b"5\0nodes\x00100\0");
        p.ok(&got);
        let got = p.expect(MsgType::GetQuota);
        p.reply(
            &got,
            Response::GetQuota(crate::wire::QuotaReply::Value(100)),
        );
        let got = p.expect(MsgType::ResetWatches);
        p.ok(&got);
        let got = p.expect(MsgType::Control);
        assert_eq!(got.payload, b"log\0on\0");
        p.reply(&got, Response::Control(b"OK\0"));
    });
    let perms = Perms(vec![
        Perm::new(PermKind::None, 0),
        Perm::new(PermKind::Read, 5),
    ]);
    client.set_perms("/be", &perms).unwrap();
    assert_eq!(client.get_perms("/be").unwrap(), perms);
    assert_eq!(client.get_domain_path(5).unwrap(), "/local/domain/5");
    client.introduce(5, 12345, 3).unwrap();
    assert!(client.is_domain_introduced(5).unwrap());
    client.release(5).unwrap();
    assert_eq!(client.get_feature(None).unwrap(), 1);
    client.set_quota(Some(5), "nodes", 100).unwrap();
    assert_eq!(client.get_quota(Some(5), "nodes").unwrap(), 100);
    client.reset_watches().unwrap();
    assert_eq!(client.control(&[b"log", b"on"]).unwrap(), b"OK\0");
    daemon.join().unwrap();
}

#[tokio::test]
async fn abandoned_request_does_not_confuse_later_replies() {
    let (client, peer) = async_pair();
    let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let daemon = spawn_peer(peer, move |mut p| {
        let first = p.expect(MsgType::Read);
        gate_rx.recv_timeout(GUARD).unwrap(); // the caller has given up
        let second = p.expect(MsgType::Read);
        assert_ne!(first.header.req_id, second.header.req_id);
        p.reply(&first, Response::Read(b"stale"));
        p.reply(&second, Response::Read(b"fresh"));
    });
    {
        let abandoned = client.read("/a");
        tokio::pin!(abandoned);
        // Poll once so the request is sent, then drop it.
        assert!(futures_poll_once(abandoned.as_mut()).await.is_none());
    }
    gate_tx.send(()).unwrap();
    let value = tokio::time::timeout(GUARD, client.read("/a"))
        .await
        .unwrap();
    assert_eq!(value.unwrap(), b"fresh");
    joined(daemon).await;
}

/// Polls a future once; `Some` if it completed.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

/// Handshake code written against the trait runs on the blocking client.
fn publish_state(store: &dyn XenbusStore, node: &str, state: u32) -> Result<u32> {
    store.transaction(|tx| {
        let old = tx.read_u32(&format!("{node}/state"))?;
        tx.write(&format!("{node}/state"), state.to_string().as_bytes())?;
        Ok(old)
    })
}

#[test]
fn xenbus_store_trait_runs_on_the_client() {
    let (client, peer) = blocking_pair();
    let daemon = spawn_peer(peer, |mut p| {
        let got = p.expect(MsgType::TransactionStart);
        p.reply(&got, Response::TransactionStart(2));
        let got = p.expect(MsgType::Read);
        assert_eq!(got.header.tx_id, 2);
        p.reply(&got, Response::Read(b"1"));
        let got = p.expect(MsgType::Write);
        assert_eq!(got.payload, b"/fe/state\x002");
        p.ok(&got);
        let got = p.expect(MsgType::TransactionEnd);
        p.ok(&got);
    });
    assert_eq!(publish_state(&client, "/fe", 2).unwrap(), 1);
    daemon.join().unwrap();
}
