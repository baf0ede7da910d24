//! Concurrency against the embedded server: conflicting transactions retried to the exact
//! total, many requests in flight on one connection, and a server that goes away making
//! pending calls fail instead of hang. Timeouts here are hang guards, never assertions.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use xenstore_proto::client::{AsyncClient, Client, Error, RetryPolicy, XenbusStoreExt};
use xenstore_proto::server::{Config, Server};
use xenstore_proto::wire::{Perm, PermKind, Perms, XsErrno};

const GUARD: Duration = Duration::from_secs(60);
/// Enough that a thread is never starved out of its retries in practice; the test is about
/// the total, not the count.
const PATIENT: RetryPolicy = RetryPolicy {
    max_attempts: 100_000,
    backoff: Duration::ZERO,
    max_backoff: Duration::ZERO,
};

fn server() -> Server {
    Server::new(Config::default())
}

fn client(server: &Server, domid: u32) -> Client {
    Client::from_unix_stream(server.connect(domid).unwrap())
        .unwrap()
        .with_retry_policy(PATIENT)
}

fn increment(tx: &dyn xenstore_proto::client::NodeOps) -> xenstore_proto::client::Result<u32> {
    let n = match tx.read_opt("/counter")? {
        Some(v) => String::from_utf8(v).unwrap().parse::<u32>().unwrap(),
        None => 0,
    };
    tx.write("/counter", (n + 1).to_string().as_bytes())?;
    Ok(n + 1)
}

#[test]
fn conflicting_transactions_from_many_connections_sum_exactly() {
    const THREADS: u32 = 8;
    const EACH: u32 = 40;
    let server = server();
    let attempts = Arc::new(AtomicU32::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let c = client(&server, 0);
            let attempts = attempts.clone();
            thread::spawn(move || {
                for _ in 0..EACH {
                    c.transaction(|tx| {
                        attempts.fetch_add(1, Ordering::Relaxed);
                        increment(tx)
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    // How much conflict there was depends on scheduling: reported, not asserted.
    eprintln!(
        "{} attempts for {} increments",
        attempts.load(Ordering::Relaxed),
        THREADS * EACH
    );
    let c = client(&server, 0);
    assert_eq!(
        c.read_string("/counter").unwrap(),
        (THREADS * EACH).to_string()
    );
}

#[test]
fn conflicting_transactions_sharing_one_connection_sum_exactly() {
    // Four transactions at a time stay inside the default per-connection quota of 10.
    const THREADS: u32 = 4;
    const EACH: u32 = 40;
    let server = server();
    let shared = client(&server, 0);
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let c = shared.clone();
            // Through the handshake trait, as backend code would.
            thread::spawn(move || {
                let store: &dyn xenstore_proto::client::XenbusStore = &c;
                for _ in 0..EACH {
                    store.transaction(|tx| increment(tx)).unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(
        shared.read_string("/counter").unwrap(),
        (THREADS * EACH).to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_transactions_from_many_tasks_sum_exactly() {
    const TASKS: u32 = 8;
    const EACH: u32 = 30;
    let server = server();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let c = AsyncClient::from_std_stream(server.connect(0).unwrap())
            .unwrap()
            .with_retry_policy(PATIENT);
        tasks.spawn(async move {
            for _ in 0..EACH {
                c.transaction(|tx| async move {
                    let n: u32 = match tx.read_string("/counter").await {
                        Ok(v) => v.parse().unwrap(),
                        Err(e) if e.is_not_found() => 0,
                        Err(e) => return Err(e),
                    };
                    tx.write("/counter", (n + 1).to_string()).await
                })
                .await
                .unwrap();
            }
        });
    }
    tokio::time::timeout(GUARD, async {
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
    })
    .await
    .expect("hang guard");
    let c = AsyncClient::from_std_stream(server.connect(0).unwrap()).unwrap();
    assert_eq!(
        c.read_string("/counter").await.unwrap(),
        (TASKS * EACH).to_string()
    );
}

#[test]
fn a_conflict_is_reported_as_eagain_without_the_helper() {
    let server = server();
    let a = client(&server, 0);
    let b = client(&server, 0);
    a.write("/x", "0").unwrap();
    let tx = a.start_transaction().unwrap();
    assert_eq!(tx.read("/x").unwrap(), b"0");
    tx.write("/x", "from-tx").unwrap();
    b.write("/x", "outside").unwrap();
    let err = tx.commit().unwrap_err();
    assert!(err.is_conflict(), "{err:?}");
    assert_eq!(err.errno(), Some(XsErrno::EAGAIN));
    assert_eq!(a.read("/x").unwrap(), b"outside");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_requests_in_flight_on_one_connection_are_matched() {
    const TASKS: usize = 32;
    const EACH: usize = 25;
    let server = server();
    let client = AsyncClient::from_std_stream(server.connect(0).unwrap()).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..TASKS {
        let c = client.clone();
        tasks.spawn(async move {
            for i in 0..EACH {
                let path = format!("/inflight/{t}/{i}");
                let value = format!("{t}:{i}");
                // Write and read concurrently with every other task on the same connection.
                c.write(&path, &value).await.unwrap();
                let dir = format!("/inflight/{t}");
                let (read, listing) = tokio::join!(c.read(&path), c.directory(&dir));
                assert_eq!(read.unwrap(), value.as_bytes());
                assert!(listing.unwrap().contains(&i.to_string()));
            }
        });
    }
    tokio::time::timeout(GUARD, async {
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
    })
    .await
    .expect("hang guard");
    assert_eq!(client.directory("/inflight").await.unwrap().len(), TASKS);
}

#[test]
fn many_threads_share_one_blocking_connection() {
    const THREADS: usize = 16;
    const EACH: usize = 25;
    let server = server();
    let shared = client(&server, 0);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let c = shared.clone();
            thread::spawn(move || {
                for i in 0..EACH {
                    let path = format!("/threads/{t}/{i}");
                    c.write(&path, format!("{t}-{i}")).unwrap();
                    assert_eq!(c.read_string(&path).unwrap(), format!("{t}-{i}"));
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(shared.directory("/threads").unwrap().len(), THREADS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_shutdown_fails_pending_calls_and_watches() {
    let server = server();
    let client = AsyncClient::from_std_stream(server.connect(0).unwrap()).unwrap();
    let mut watch = client.watch("/w").await.unwrap();
    assert_eq!(watch.next().await.unwrap().unwrap().path, "/w");
    // Keep the connection busy from many tasks while the server goes away.
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..8 {
        let c = client.clone();
        tasks.spawn(async move {
            let mut i = 0u64;
            loop {
                match c.write(&format!("/busy/{t}"), i.to_string()).await {
                    Ok(()) => i += 1,
                    Err(e) => return e,
                }
            }
        });
    }
    // Let at least one request complete before pulling the plug (a hang guard, not a timer).
    let probe = client.clone();
    tokio::time::timeout(GUARD, async {
        while !probe.exists("/busy/0").await.unwrap() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("hang guard");
    let s = server.clone();
    tokio::task::spawn_blocking(move || s.shutdown())
        .await
        .unwrap();
    let errors = tokio::time::timeout(GUARD, async {
        let mut errors = Vec::new();
        while let Some(r) = tasks.join_next().await {
            errors.push(r.unwrap());
        }
        errors
    })
    .await
    .expect("pending calls must fail, not hang");
    for e in &errors {
        assert!(e.is_connection_lost(), "{e:?}");
    }
    // The watch reports the loss, then ends.
    let item = tokio::time::timeout(GUARD, async {
        loop {
            match watch.next().await {
                Some(Ok(_spurious)) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("hang guard");
    assert!(
        matches!(item, Some(Err(Error::ConnectionLost { .. }))),
        "{item:?}"
    );
    assert!(watch.next().await.is_none());
    assert!(client.read("/w").await.unwrap_err().is_connection_lost());
}

#[test]
fn blocking_calls_fail_after_the_server_shuts_down() {
    let server = server();
    let c = client(&server, 0);
    c.write("/a", "1").unwrap();
    let mut watch = c.watch("/a").unwrap();
    assert_eq!(watch.next().unwrap().unwrap().path, "/a");
    let waiter = thread::spawn(move || loop {
        match watch.next_timeout(Some(GUARD)) {
            Ok(Some(_)) => continue,
            other => return other,
        }
    });
    server.shutdown();
    let outcome = waiter.join().unwrap();
    assert!(
        matches!(outcome, Err(Error::ConnectionLost { .. })),
        "{outcome:?}"
    );
    assert!(c.read("/a").unwrap_err().is_connection_lost());
}

#[test]
fn connection_identity_decides_permissions_and_relative_paths() {
    let server = server();
    let dom0 = client(&server, 0);
    let home = dom0.get_domain_path(5).unwrap();
    assert_eq!(home, "/local/domain/5");
    dom0.mkdir(&home).unwrap();
    dom0.set_perms(&home, &Perms(vec![Perm::new(PermKind::None, 5)]))
        .unwrap();
    dom0.write("/secret", "x").unwrap();
    dom0.set_perms("/secret", &Perms::owned_by(0, PermKind::None))
        .unwrap();

    let guest = client(&server, 5);
    guest.write("device/vrdma/0/state", "1").unwrap();
    assert_eq!(
        dom0.read_string("/local/domain/5/device/vrdma/0/state")
            .unwrap(),
        "1"
    );
    let err = guest.read("/secret").unwrap_err();
    assert!(
        matches!(
            err,
            Error::Xs {
                errno: XsErrno::EACCES,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(guest
        .write("/local/domain/0/x", "y")
        .unwrap_err()
        .is_access_denied());
}

#[test]
fn connects_through_a_listening_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("socket");
    let server = server();
    let _listener = server.listen(&path, 0).unwrap();
    let c = Client::connect(&path).unwrap();
    c.write("/via-socket", "yes").unwrap();
    assert_eq!(c.read_string("/via-socket").unwrap(), "yes");
    assert!(Client::connect(dir.path().join("absent"))
        .unwrap_err()
        .to_string()
        .contains("I/O"));
    let shared = Arc::new(c);
    assert!(shared.exists("/via-socket").unwrap());
}
