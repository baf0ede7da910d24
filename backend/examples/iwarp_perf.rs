//! The iWARP data path against raw TCP between the same two loopback addresses, in one run:
//! two `SoftDevice`s in this process as two hosts (127.0.0.2 and 127.0.0.3), one RC QP each
//! over a TCP connection (CRC on, as between vrdma hosts). Engines spin `--spin-us` after
//! work (default 200, the device's default) and then sleep in epoll like the TCP baseline's
//! blocking threads; the CQ pollers spin (`--yield`: they yield between polls).
//!
//! * `write_64k_bw` — RDMA WRITEs of 64 KiB, 32 outstanding, for `--secs`; the last is
//!   followed by a 1-byte READ, so every byte was placed when the clock stops. Against
//!   `tcp_stream_64k_bw`: one thread writing 64 KiB blocks to a TCP socket, another reading.
//! * `send_64_rtt` — SEND/RECV ping-pong of 64 bytes (each side polls its CQ, RECVs posted
//!   ahead); against `tcp_pingpong_64_rtt`: two threads exchanging 64 bytes with
//!   `TCP_NODELAY`, blocking reads. Round trips: median and 10th percentile of batches of 100.
//!
//! `uptime; cargo run --release -p vrdma-backend --no-default-features --example iwarp_perf`
//! (`-- --secs N`, default 2; `--spin-us N`; `--yield`; `--no-crc`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use shared_ring::abi::control::{access, QpState};
use shared_ring::abi::cqe::CqeStatus;
use shared_ring::abi::wqe::WqeOpcode;
use vrdma_backend::device::iwarp::{Established, Role, Rtr, DEFAULT_PEER_PROBE};
use vrdma_backend::device::testkit::{wqe, TestChannel, TestCq, TestQp};
use vrdma_backend::device::{ChannelMode, Device, EngineConfig, SoftDevice};

fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.3:0").expect("listen");
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let local: SocketAddr = "127.0.0.2:0".parse().expect("address");
    sock.bind(&local.into()).expect("bind");
    sock.connect_timeout(
        &l.local_addr().expect("addr").into(),
        Duration::from_secs(5),
    )
    .expect("connect");
    let (server, _) = l.accept().expect("accept");
    let client: TcpStream = sock.into();
    for s in [&client, &server] {
        s.set_nodelay(true).expect("nodelay");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
    }
    (client, server)
}

struct Host {
    dev: SoftDevice,
    ch: TestChannel,
    cq: TestCq,
    qp: TestQp,
}

fn host(domid: u16, spin: Duration) -> Host {
    let dev = SoftDevice::new(EngineConfig { threads: 1, spin }).expect("device");
    let mut ch = TestChannel::open(&dev, domid, ChannelMode::Bypass);
    let cq = ch.cq(&dev, 10);
    let qp = ch.qp(&dev, &cq, &cq, 8);
    Host { dev, ch, cq, qp }
}

fn est(stream: TcpStream, role: Role) -> Established {
    Established {
        local: stream.local_addr().expect("local"),
        peer: stream.peer_addr().expect("peer"),
        stream,
        role,
        crc: !NO_CRC.load(std::sync::atomic::Ordering::Relaxed),
        ird: 16,
        ord: 16,
        rtr: Rtr::Write,
        peer_private: Vec::new(),
        peer_probe: DEFAULT_PEER_PROBE,
    }
}

fn connected(spin: Duration) -> (Host, Host) {
    let (a, b) = (host(1, spin), host(2, spin));
    let (client, server) = tcp_pair();
    b.dev
        .attach_stream(b.ch.id, b.qp.num, est(server, Role::Responder))
        .expect("attach");
    a.dev
        .attach_stream(a.ch.id, a.qp.num, est(client, Role::Initiator))
        .expect("attach");
    let start = Instant::now();
    while b.dev.qp_state(b.ch.id, b.qp.num) != Ok(QpState::Rts) {
        assert!(start.elapsed() < Duration::from_secs(10), "no RTS");
        std::thread::sleep(Duration::from_millis(1));
    }
    (a, b)
}

fn poll(h: &mut Host) -> shared_ring::abi::cqe::CqeRepr {
    loop {
        if let Some(c) = h.cq.poll(&h.dev) {
            assert_eq!(c.status, CqeStatus::Success, "{c:?}");
            return c;
        }
        // `--yield`: polling threads give way (on a loaded machine they share the cores with
        // the engines they wait for).
        if YIELD.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

static NO_CRC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static YIELD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn gbit(bytes: u64, t: Duration) -> f64 {
    bytes as f64 * 8.0 / t.as_secs_f64() / 1e9
}

fn write_bw(secs: f64, spin: Duration) -> f64 {
    let (mut a, mut b) = connected(spin);
    const LEN: u32 = 64 << 10;
    const WINDOW: u64 = 32;
    let src = a.ch.mr(&a.dev, u64::from(LEN), access::ALL);
    let dst = b.ch.mr(&b.dev, u64::from(LEN), access::ALL);
    let w = wqe(
        WqeOpcode::RdmaWrite,
        1,
        &[src.sge(0, LEN)],
        (dst.iova, dst.keys.rkey),
        0,
    );
    let start = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while start.elapsed().as_secs_f64() < secs || done < posted {
        while posted - done < WINDOW && start.elapsed().as_secs_f64() < secs {
            a.qp.post_send(&a.dev, &w);
            posted += 1;
        }
        poll(&mut a);
        done += 1;
    }
    let r = wqe(
        WqeOpcode::RdmaRead,
        2,
        &[src.sge(0, 1)],
        (dst.iova, dst.keys.rkey),
        0,
    );
    a.qp.post_send(&a.dev, &r);
    poll(&mut a);
    let t = start.elapsed();
    let _ = &mut b;
    gbit(done * u64::from(LEN), t)
}

fn tcp_bw(secs: f64) -> f64 {
    let (mut tx, mut rx) = tcp_pair();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        let mut n = 0u64;
        while let Ok(k) = rx.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        n
    });
    let buf = vec![1u8; 64 << 10];
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        tx.write_all(&buf).expect("write");
    }
    drop(tx);
    let n = reader.join().expect("reader");
    gbit(n, start.elapsed())
}

/// (10th percentile, median) of per-round-trip times over batches of 100, in µs.
fn stats(mut batches: Vec<f64>) -> (f64, f64) {
    batches.sort_by(f64::total_cmp);
    (batches[batches.len() / 10], batches[batches.len() / 2])
}

fn send_rtt(secs: f64, spin: Duration) -> (f64, f64) {
    let (mut a, mut b) = connected(spin);
    let sa = a.ch.mr(&a.dev, 4096, access::ALL);
    let sb = b.ch.mr(&b.dev, 4096, access::ALL);
    for i in 0..64 {
        a.qp.post_recv(&a.dev, i, &[sa.sge(2048, 64)]);
        b.qp.post_recv(&b.dev, i, &[sb.sge(2048, 64)]);
    }
    let wa = wqe(WqeOpcode::Send, 1, &[sa.sge(0, 64)], (0, 0), 0);
    let wb = wqe(WqeOpcode::Send, 1, &[sb.sge(0, 64)], (0, 0), 0);
    let responder = std::thread::spawn(move || {
        let mut n = 0u64;
        loop {
            let c = poll(&mut b);
            if c.opcode != shared_ring::abi::cqe::CqeOpcode::Recv {
                continue;
            }
            b.qp.post_recv(&b.dev, n, &[sb.sge(2048, 64)]);
            b.qp.post_send(&b.dev, &wb);
            n += 1;
            if c.byte_len == 1 {
                return b;
            }
        }
    });
    let mut batches = Vec::new();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        for _ in 0..100 {
            a.qp.post_send(&a.dev, &wa);
            loop {
                let c = poll(&mut a);
                if c.opcode == shared_ring::abi::cqe::CqeOpcode::Recv {
                    break;
                }
            }
            a.qp.post_recv(&a.dev, 0, &[sa.sge(2048, 64)]);
        }
        batches.push(t.elapsed().as_secs_f64() * 1e6 / 100.0);
    }
    let stop = wqe(WqeOpcode::Send, 1, &[sa.sge(0, 1)], (0, 0), 0);
    a.qp.post_send(&a.dev, &stop);
    let _b = responder.join().expect("responder");
    stats(batches)
}

fn tcp_rtt(secs: f64) -> (f64, f64) {
    let (mut a, mut b) = tcp_pair();
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while b.read_exact(&mut buf).is_ok() {
            if b.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let msg = [7u8; 64];
    let mut buf = [0u8; 64];
    let mut batches = Vec::new();
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        for _ in 0..100 {
            a.write_all(&msg).expect("write");
            a.read_exact(&mut buf).expect("read");
        }
        batches.push(t.elapsed().as_secs_f64() * 1e6 / 100.0);
    }
    drop(a);
    echo.join().expect("echo");
    stats(batches)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: f64| {
        args.iter().position(|a| a == name).map_or(default, |i| {
            args.get(i + 1)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("{name} N"))
        })
    };
    let secs = arg("--secs", 2.0);
    let spin = Duration::from_secs_f64(arg("--spin-us", 200.0) / 1e6);
    if args.iter().any(|a| a == "--no-crc") {
        NO_CRC.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if args.iter().any(|a| a == "--yield") {
        YIELD.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    println!("engines spin {spin:?} after work, then sleep in epoll (sockets and kicks)");
    let tcp = tcp_bw(secs);
    let write = write_bw(secs, spin);
    println!("tcp_stream_64k_bw      {tcp:8.2} Gbit/s");
    println!("write_64k_bw           {write:8.2} Gbit/s");
    println!(
        "  ratio write ÷ tcp    {:8.3}   (target ≥ 0.9)",
        write / tcp
    );
    let (tp10, tmed) = tcp_rtt(secs);
    let (sp10, smed) = send_rtt(secs, spin);
    println!("tcp_pingpong_64_rtt    p10 {tp10:7.2} µs  median {tmed:7.2} µs");
    println!("send_64_rtt            p10 {sp10:7.2} µs  median {smed:7.2} µs");
    println!(
        "  ratio send ÷ tcp     p10 {:7.3}     median {:7.3}   (target ≤ 1.1)",
        sp10 / tp10,
        smed / tmed
    );
}
