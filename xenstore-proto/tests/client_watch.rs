//! Watches against the embedded server: under concurrent writers no event is lost (spurious
//! ones are allowed), the initial fire comes first, dropping a watch unwatches it.

use std::collections::HashSet;
use std::thread;
use std::time::Duration;

use xenstore_proto::client::{AsyncClient, Client, WatchEvents, XenbusStore};
use xenstore_proto::server::{Config, Server};

const GUARD: Duration = Duration::from_secs(60);

fn server() -> Server {
    Server::new(Config::default())
}

fn expected(writers: usize, each: usize) -> HashSet<String> {
    (0..writers)
        .flat_map(|w| (0..each).map(move |i| format!("/watched/{w}/{i}")))
        .collect()
}

#[test]
fn blocking_watch_under_concurrent_writers_loses_nothing() {
    const WRITERS: usize = 6;
    const EACH: usize = 60;
    let server = server();
    let watcher = Client::from_unix_stream(server.connect(0).unwrap()).unwrap();
    let mut watch = watcher.watch("/watched").unwrap();
    assert_eq!(watch.next().unwrap().unwrap().path, "/watched");
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let c = Client::from_unix_stream(server.connect(0).unwrap()).unwrap();
            thread::spawn(move || {
                for i in 0..EACH {
                    c.write(&format!("/watched/{w}/{i}"), i.to_string())
                        .unwrap();
                }
            })
        })
        .collect();
    let mut missing = expected(WRITERS, EACH);
    while !missing.is_empty() {
        let event = watch
            .next_timeout(Some(GUARD))
            .unwrap()
            .unwrap_or_else(|| panic!("lost events: {} never seen", missing.len()));
        missing.remove(&event.path);
    }
    for w in writers {
        w.join().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_watch_under_concurrent_writers_loses_nothing() {
    const WRITERS: usize = 6;
    const EACH: usize = 60;
    let server = server();
    let watcher = AsyncClient::from_std_stream(server.connect(0).unwrap()).unwrap();
    let mut watch = watcher.watch("/watched").await.unwrap();
    assert_eq!(watch.next().await.unwrap().unwrap().path, "/watched");
    // All writers share one connection: their writes are in flight together.
    let writer = AsyncClient::from_std_stream(server.connect(0).unwrap()).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        let c = writer.clone();
        tasks.spawn(async move {
            for i in 0..EACH {
                c.write(&format!("/watched/{w}/{i}"), i.to_string())
                    .await
                    .unwrap();
            }
        });
    }
    let mut missing = expected(WRITERS, EACH);
    tokio::time::timeout(GUARD, async {
        while !missing.is_empty() {
            let event = watch.next().await.expect("stream ended").unwrap();
            missing.remove(&event.path);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("lost events: {} never seen", missing.len()));
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
}

#[test]
fn several_watches_on_one_connection_each_get_their_events() {
    let server = server();
    let c = Client::from_unix_stream(server.connect(0).unwrap()).unwrap();
    let mut a = c.watch("/a").unwrap();
    let mut b = c.watch("/b").unwrap();
    let mut a2 = c.watch("/a").unwrap();
    for w in [&mut a, &mut b, &mut a2] {
        let first = w.next().unwrap().unwrap();
        assert_eq!(first.path, w.path());
    }
    c.write("/b/x", "1").unwrap();
    c.write("/a/y", "1").unwrap();
    assert_eq!(a.next().unwrap().unwrap().path, "/a/y");
    assert_eq!(a2.next().unwrap().unwrap().path, "/a/y");
    assert_eq!(b.next().unwrap().unwrap().path, "/b/x");
    assert_ne!(a.token(), a2.token());
}

#[test]
fn dropping_a_watch_unwatches_it() {
    let server = server();
    let c = Client::from_unix_stream(server.connect(0).unwrap()).unwrap();
    let watches = |s: &Server| {
        s.with_store(|st| {
            st.conn_ids()
                .iter()
                .map(|&id| st.watch_count(id))
                .sum::<usize>()
        })
    };
    let w = c.watch("/dropme").unwrap();
    let kept = c.watch("/kept").unwrap();
    assert_eq!(watches(&server), 2);
    drop(w);
    // Requests on one connection are handled in order: once this read is answered, the
    // UNWATCH sent by the drop has been handled too.
    let _ = c.exists("/dropme").unwrap();
    assert_eq!(watches(&server), 1);
    kept.unwatch().unwrap();
    assert_eq!(watches(&server), 0);
}

#[test]
fn reset_watches_ends_every_stream() {
    let server = server();
    let c = Client::from_unix_stream(server.connect(0).unwrap()).unwrap();
    let mut w = c.watch("/r").unwrap();
    assert_eq!(w.next().unwrap().unwrap().path, "/r");
    c.reset_watches().unwrap();
    assert!(w.next().is_none());
    c.write("/r/x", "1").unwrap();
    assert!(w.try_next().is_none());
}

#[test]
fn handshake_trait_watch_waits_with_timeout() {
    let server = server();
    let c = Client::from_unix_stream(server.connect(0).unwrap()).unwrap();
    let store: &dyn XenbusStore = &c;
    let mut w: Box<dyn WatchEvents> = store.watch("/backend/vrdma").unwrap();
    assert_eq!(w.watch_path(), "/backend/vrdma");
    assert_eq!(
        w.next_event(Some(GUARD)).unwrap().unwrap().path,
        "/backend/vrdma"
    );
    // Nothing happens: the wait ends empty (the timeout is the point here, not a guard).
    assert!(w
        .next_event(Some(Duration::from_millis(50)))
        .unwrap()
        .is_none());
    store.write("/backend/vrdma/1/0/state", b"2").unwrap();
    let ev = w.next_event(Some(GUARD)).unwrap().unwrap();
    assert_eq!(ev.path, "/backend/vrdma/1/0/state");
}
