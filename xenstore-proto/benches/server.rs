//! Server throughput: READ, WRITE and DIRECTORY on the synchronous core (in-process, no
//! sockets) and over a Unix socket through the project's blocking client.
//!
//! `cargo bench -p xenstore-proto --bench server`

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use xenstore_proto::client::Client;
use xenstore_proto::server::{Config, Server, Store};
use xenstore_proto::wire::Request;

const DIR_CHILDREN: usize = 32;

fn populate(mut op: impl FnMut(Request<'_>)) {
    op(Request::Write {
        path: "/bench/key",
        value: b"some-value-of-moderate-length",
    });
    for i in 0..DIR_CHILDREN {
        op(Request::Write {
            path: &format!("/bench/dir/child-{i:03}"),
            value: b"x",
        });
    }
}

fn core(c: &mut Criterion) {
    let mut store = Store::new(Config::default());
    let conn = store.open(0);
    populate(|r| {
        store.handle(conn, &r.to_frame(1, 0).unwrap());
    });
    let read = Request::Read { path: "/bench/key" }.to_frame(7, 0).unwrap();
    let write = Request::Write {
        path: "/bench/key",
        value: b"some-value-of-moderate-length",
    }
    .to_frame(8, 0)
    .unwrap();
    let dir = Request::Directory { path: "/bench/dir" }
        .to_frame(9, 0)
        .unwrap();

    let mut g = c.benchmark_group("xenstore-server/core");
    g.throughput(Throughput::Elements(1));
    g.bench_function("read", |b| {
        b.iter(|| black_box(store.handle(conn, black_box(&read))))
    });
    g.bench_function("write", |b| {
        b.iter(|| black_box(store.handle(conn, black_box(&write))))
    });
    g.bench_function("directory-32", |b| {
        b.iter(|| black_box(store.handle(conn, black_box(&dir))))
    });
    g.finish();
}

fn socket(c: &mut Criterion) {
    let server = Server::new(Config::default());
    let client = Client::from_unix_stream(server.connect(0).unwrap()).unwrap();
    populate(|r| match r {
        Request::Write { path, value } => client.write(path, value).unwrap(),
        _ => unreachable!(),
    });

    let mut g = c.benchmark_group("xenstore-server/socket");
    g.throughput(Throughput::Elements(1));
    g.bench_function("read", |b| {
        b.iter(|| black_box(client.read("/bench/key").unwrap()))
    });
    g.bench_function("write", |b| {
        b.iter(|| {
            client
                .write("/bench/key", b"some-value-of-moderate-length")
                .unwrap()
        })
    });
    g.bench_function("directory-32", |b| {
        b.iter(|| black_box(client.directory("/bench/dir").unwrap()))
    });
    g.finish();
    drop(client);
    server.shutdown();
}

criterion_group!(benches, core, socket);
criterion_main!(benches);
