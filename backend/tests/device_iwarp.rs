//! The iWARP data path between two software devices in one process, as two hosts: each has
//! a channel, CQs, QPs and MRs on plain memory, and their QPs run over real loopback TCP
//! connections (client bound to 127.0.0.2, listener on 127.0.0.3, kernel-chosen ports). The
//! MPA exchange is not part of this (connection setup's job): `Established` is built by hand.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use shared_ring::abi::control::{access, QpState};
use shared_ring::abi::cqe::{CqeOpcode, CqeRepr, CqeStatus};
use shared_ring::abi::event::EventKind;
use shared_ring::abi::wqe::{Sge, WqeOpcode, WqeRepr};
use vrdma_backend::device::iwarp::{Established, Role, Rtr, DEFAULT_PEER_PROBE};
use vrdma_backend::device::testkit::{wqe, TestChannel, TestCq, TestMr, TestQp, HANG};
use vrdma_backend::device::{ChannelMode, Device, EngineConfig, SoftDevice};

const ALL: u32 = access::ALL;
const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// One simulated host: a device and a channel with one CQ.
struct Host {
    dev: SoftDevice,
    ch: TestChannel,
    cq: TestCq,
}

impl Host {
    fn new(domid: u16, mode: ChannelMode) -> Host {
        let dev = SoftDevice::new(EngineConfig::default()).expect("device");
        let mut ch = TestChannel::open(&dev, domid, mode);
        let cq = ch.cq(&dev, 10);
        Host { dev, ch, cq }
    }

    fn qp(&mut self) -> TestQp {
        self.ch.qp(&self.dev, &self.cq, &self.cq, 6)
    }

    fn mr(&mut self, len: u64) -> TestMr {
        self.ch.mr(&self.dev, len, ALL)
    }

    fn wait(&mut self) -> CqeRepr {
        self.cq.wait(&self.dev)
    }

    fn state(&self, qp: &TestQp) -> QpState {
        self.dev.qp_state(self.ch.id, qp.num).expect("QP state")
    }

    /// Waits until the QP is in `want`.
    fn wait_state(&self, qp: &TestQp, want: QpState) {
        wait_for(&format!("QP {:?} never reached {want:?}", qp.num), || {
            self.state(qp) == want
        });
    }

    /// Waits for an event of `kind` on the channel (others are dropped).
    fn wait_event(&mut self, kind: EventKind) {
        wait_for(&format!("no {kind:?} event"), || {
            self.ch.take_events().iter().any(|e| e.kind == kind)
        });
    }
}

/// Waits until `done` (a hang, not a timing check, after [`HANG`]: fails saying `hang`).
fn wait_for(hang: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < HANG, "{hang}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Two hosts (domains 1 and 2, bypass channels) and a QP on each.
fn two_hosts() -> (Host, TestQp, Host, TestQp) {
    let mut ha = Host::new(1, ChannelMode::Bypass);
    let mut hb = Host::new(2, ChannelMode::Bypass);
    let (a, b) = (ha.qp(), hb.qp());
    (ha, a, hb, b)
}

/// A loopback TCP connection: (client bound to 127.0.0.2, server end on 127.0.0.3).
fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.3:0").expect("listen on 127.0.0.3");
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let local: SocketAddr = "127.0.0.2:0".parse().expect("address");
    sock.bind(&local.into()).expect("bind 127.0.0.2");
    sock.connect_timeout(&l.local_addr().expect("addr").into(), IO_TIMEOUT)
        .expect("connect");
    let client: TcpStream = sock.into();
    let (server, _) = l.accept().expect("accept");
    for s in [&client, &server] {
        s.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
        s.set_write_timeout(Some(IO_TIMEOUT)).expect("timeout");
    }
    (client, server)
}

/// What MPA would have established on `stream`, with IRD = ORD = `ord`.
fn est(stream: TcpStream, role: Role, crc: bool, rtr: Rtr, ord: u16) -> Established {
    Established {
        local: stream.local_addr().expect("local"),
        peer: stream.peer_addr().expect("peer"),
        stream,
        role,
        crc,
        ird: ord,
        ord,
        rtr,
        peer_private: Vec::new(),
        peer_probe: DEFAULT_PEER_PROBE,
    }
}

/// Runs `a` (initiator) and `b` (responder) over the two ends of a connection and waits
/// until both are in RTS.
fn attach(
    ha: &mut Host,
    a: &TestQp,
    hb: &mut Host,
    b: &TestQp,
    ends: (TcpStream, TcpStream),
    crc: bool,
    rtr: Rtr,
) {
    attach_ord(ha, a, hb, b, ends, (crc, rtr, 8));
}

/// [`attach`] with IRD = ORD = `ord`.
fn attach_ord(
    ha: &mut Host,
    a: &TestQp,
    hb: &mut Host,
    b: &TestQp,
    (client, server): (TcpStream, TcpStream),
    (crc, rtr, ord): (bool, Rtr, u16),
) {
    hb.dev
        .attach_stream(hb.ch.id, b.num, est(server, Role::Responder, crc, rtr, ord))
        .expect("attach responder");
    ha.dev
        .attach_stream(ha.ch.id, a.num, est(client, Role::Initiator, crc, rtr, ord))
        .expect("attach initiator");
    ha.wait_state(a, QpState::Rts);
    hb.wait_state(b, QpState::Rts);
    ha.wait_event(EventKind::QpEstablished);
    hb.wait_event(EventKind::QpEstablished);
}

/// A signaled SEND of `local`.
fn send(wr_id: u64, local: Sge) -> WqeRepr {
    wqe(WqeOpcode::Send, wr_id, &[local], (0, 0), 0)
}

/// A signaled RDMA WRITE or READ between `local` and `remote` (address, rkey).
fn rdma(op: WqeOpcode, wr_id: u64, local: Sge, remote: (u64, u32)) -> WqeRepr {
    wqe(op, wr_id, &[local], remote, 0)
}

/// Where `mr` is at `offset` for a peer: (address, rkey).
fn at(mr: &TestMr, offset: u64) -> (u64, u32) {
    (mr.iova + offset, mr.keys.rkey)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

fn expect(c: &CqeRepr, wr_id: u64, opcode: CqeOpcode, status: CqeStatus) {
    assert_eq!(
        (c.wr_id, c.opcode, c.status),
        (wr_id, opcode, status),
        "CQE {c:?}"
    );
}

/// SEND/RECV, RDMA WRITE and RDMA READ (four outstanding) of `sizes`, verified byte by byte.
fn transfers(crc: bool, rtr: Rtr, mode: ChannelMode, sizes: &[usize]) {
    let max = *sizes.iter().max().expect("sizes") as u64;
    let mut ha = Host::new(1, mode);
    let mut hb = Host::new(2, mode);
    let mut a = ha.qp();
    let mut b = hb.qp();
    let src = ha.mr(max);
    let back = ha.mr(max);
    let dst = hb.mr(max);
    attach(&mut ha, &a, &mut hb, &b, tcp_pair(), crc, rtr);
    let mut id = 0u64;
    for (k, &len) in sizes.iter().enumerate() {
        let n = len as u32;
        // SEND into a posted RECV.
        let data = pattern(len, k as u8);
        src.fill(0, &data);
        id += 1;
        b.post_recv(&hb.dev, id, &[dst.sge(0, n)]);
        a.post_send(&ha.dev, &send(id, src.sge(0, n)));
        expect(&ha.wait(), id, CqeOpcode::Send, CqeStatus::Success);
        let r = hb.wait();
        expect(&r, id, CqeOpcode::Recv, CqeStatus::Success);
        assert_eq!(r.byte_len, n, "RECV length");
        assert!(dst.read(0, len) == data, "SEND of {len} B: payload differs");
        // RDMA WRITE to the responder's region, at an offset into it.
        let data = pattern(len, k as u8 ^ 0x55);
        src.fill(0, &data);
        let off = (max as usize - len) / 2;
        id += 1;
        a.post_send(
            &ha.dev,
            &rdma(
                WqeOpcode::RdmaWrite,
                id,
                src.sge(0, n),
                at(&dst, off as u64),
            ),
        );
        expect(&ha.wait(), id, CqeOpcode::RdmaWrite, CqeStatus::Success);
        // The WRITE's completion says the bytes left; a READ behind it sees them placed.
        // READ it back in four pieces, all outstanding at once.
        let pieces = if len >= 4 { 4 } else { 1 };
        let step = len / pieces;
        let first = id + 1;
        for p in 0..pieces {
            let plen = if p + 1 == pieces {
                len - step * p
            } else {
                step
            };
            id += 1;
            a.post_send(
                &ha.dev,
                &rdma(
                    WqeOpcode::RdmaRead,
                    id,
                    back.sge((step * p) as u64, plen as u32),
                    at(&dst, (off + step * p) as u64),
                ),
            );
        }
        for p in 0..pieces as u64 {
            expect(
                &ha.wait(),
                first + p,
                CqeOpcode::RdmaRead,
                CqeStatus::Success,
            );
        }
        assert!(
            dst.read(off, len) == data,
            "WRITE of {len} B: payload differs"
        );
        assert!(
            back.read(0, len) == data,
            "READ of {len} B: payload differs"
        );
    }
    assert_eq!(ha.state(&a), QpState::Rts);
    assert_eq!(hb.state(&b), QpState::Rts);
}

#[test]
fn send_write_read_from_1_byte_to_16_mib_with_crc() {
    transfers(
        true,
        Rtr::Write,
        ChannelMode::Bypass,
        &[1, 4096, 1 << 20, 16 << 20],
    );
}

#[test]
fn send_write_read_from_1_byte_to_16_mib_without_crc() {
    transfers(
        false,
        Rtr::Read,
        ChannelMode::Bypass,
        &[1, 4096, 1 << 20, 16 << 20],
    );
}

#[test]
fn mediated_channels_run_the_same_data_path() {
    transfers(true, Rtr::None, ChannelMode::Mediated, &[1, 4096, 100_000]);
}

#[test]
fn a_bad_rkey_is_a_remote_access_error_and_the_responder_host_carries_on() {
    let (mut ha, a, mut hb, b) = two_hosts();
    let (mut a2, b2) = (ha.qp(), hb.qp());
    let local = ha.mr(4096);
    let target = hb.mr(4096);
    target.fill(0, &[7; 4096]);
    attach(&mut ha, &a, &mut hb, &b, tcp_pair(), true, Rtr::Write);
    attach(&mut ha, &a2, &mut hb, &b2, tcp_pair(), true, Rtr::Write);
    let mut a = a;
    // An rkey the responder never gave out, then one out of the region's bounds.
    a.post_send(
        &ha.dev,
        &rdma(
            WqeOpcode::RdmaRead,
            1,
            local.sge(0, 64),
            (target.iova, target.keys.rkey ^ 0x100),
        ),
    );
    expect(
        &ha.wait(),
        1,
        CqeOpcode::RdmaRead,
        CqeStatus::RemoteAccessError,
    );
    ha.wait_state(&a, QpState::Error);
    // The responder's QP of that connection ends (Terminate), its memory is untouched.
    hb.wait_event(EventKind::QpFatal);
    hb.wait_state(&b, QpState::Error);
    assert_eq!(target.read(0, 4096), vec![7; 4096]);
    // The other connection of the same two hosts is unaffected.
    a2.post_send(
        &ha.dev,
        &rdma(WqeOpcode::RdmaRead, 2, local.sge(0, 4096), at(&target, 0)),
    );
    expect(&ha.wait(), 2, CqeOpcode::RdmaRead, CqeStatus::Success);
    assert_eq!(local.read(0, 4096), vec![7; 4096]);
    a2.post_send(
        &ha.dev,
        &rdma(WqeOpcode::RdmaRead, 3, local.sge(0, 64), at(&target, 4090)),
    );
    expect(
        &ha.wait(),
        3,
        CqeOpcode::RdmaRead,
        CqeStatus::RemoteAccessError,
    );
    assert_eq!(hb.state(&b2), QpState::Error);
}

#[test]
fn the_peer_closing_mid_transfer_flushes_and_disconnects() {
    let (mut ha, mut a, mut hb, b) = two_hosts();
    let src = ha.mr(16 << 20);
    let dst = hb.mr(16 << 20);
    attach(&mut ha, &a, &mut hb, &b, tcp_pair(), false, Rtr::Write);
    let n = 8u64;
    for id in 1..=n {
        a.post_send(
            &ha.dev,
            &rdma(WqeOpcode::RdmaWrite, id, src.sge(0, 16 << 20), at(&dst, 0)),
        );
    }
    // The responder's QP goes away while the WRITEs stream: its socket closes.
    let first = ha.wait();
    expect(&first, 1, CqeOpcode::RdmaWrite, CqeStatus::Success);
    hb.dev.destroy_qp(hb.ch.id, b.num).expect("destroy");
    let mut statuses = vec![first.status];
    for id in 2..=n {
        let c = ha.wait();
        assert_eq!(c.wr_id, id, "completions in order");
        statuses.push(c.status);
    }
    assert!(
        statuses.contains(&CqeStatus::WrFlushError),
        "the WRITEs that could not go out are flushed: {statuses:?}"
    );
    // Once one failed, all later ones are flushed.
    let bad = statuses
        .iter()
        .position(|s| *s != CqeStatus::Success)
        .expect("a failure");
    assert!(statuses[bad + 1..]
        .iter()
        .all(|s| *s == CqeStatus::WrFlushError));
    ha.wait_state(&a, QpState::Error);
    ha.wait_event(EventKind::QpDisconnected);
    // Later work is flushed at once; the device still serves new connections.
    a.post_send(
        &ha.dev,
        &rdma(WqeOpcode::RdmaWrite, 99, src.sge(0, 8), at(&dst, 0)),
    );
    expect(
        &ha.wait(),
        99,
        CqeOpcode::RdmaWrite,
        CqeStatus::WrFlushError,
    );
    let (mut a2, b2) = (ha.qp(), hb.qp());
    attach(&mut ha, &a2, &mut hb, &b2, tcp_pair(), false, Rtr::Write);
    src.fill(0, b"again");
    a2.post_send(
        &ha.dev,
        &rdma(WqeOpcode::RdmaWrite, 100, src.sge(0, 5), at(&dst, 0)),
    );
    expect(&ha.wait(), 100, CqeOpcode::RdmaWrite, CqeStatus::Success);
}

/// Copies bytes from `from` to `to` until either end closes; flips byte `corrupt` (counted
/// from the start of the stream) once. Each direction closes on its own (`to` for writing,
/// `from` for reading): when one side closes, what the other direction still carries (a
/// Terminate) reaches its end before that end's stream ends. Shutting both directions here
/// raced the other forwarder and could end the requester's stream before the responder's
/// Terminate got through (a `QpDisconnected` instead of the `QpFatal` the test expects).
fn forward(mut from: TcpStream, mut to: TcpStream, corrupt: Option<usize>) {
    let mut buf = vec![0u8; 64 << 10];
    let mut at = 0usize;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(k) = corrupt {
            if k >= at && k < at + n {
                buf[k - at] ^= 0x01;
            }
        }
        at += n;
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
    let _ = from.shutdown(std::net::Shutdown::Read);
}

#[test]
fn a_byte_corrupted_in_flight_is_a_crc_error_that_fails_both_ends() {
    let (mut ha, mut a, mut hb, b) = two_hosts();
    let src = ha.mr(1 << 20);
    let dst = hb.mr(1 << 20);
    src.fill(0, &pattern(1 << 20, 3));
    // a <-> proxy <-> b: the proxy flips one byte of the first WRITE's payload.
    let (a_end, p_in) = tcp_pair();
    let (p_out, b_end) = tcp_pair();
    let (i2, o2) = (
        p_in.try_clone().expect("clone"),
        p_out.try_clone().expect("clone"),
    );
    let t1 = std::thread::spawn(move || forward(p_in, p_out, Some(5000)));
    let t2 = std::thread::spawn(move || forward(o2, i2, None));
    attach(&mut ha, &a, &mut hb, &b, (a_end, b_end), true, Rtr::Write);
    a.post_send(
        &ha.dev,
        &rdma(WqeOpcode::RdmaWrite, 1, src.sge(0, 1 << 20), at(&dst, 0)),
    );
    // The WRITE left (its completion says so); the responder finds the CRC wrong, sends a
    // Terminate and fails; the requester fails on the Terminate.
    let c = ha.wait();
    assert_eq!(c.wr_id, 1);
    hb.wait_event(EventKind::QpFatal);
    hb.wait_state(&b, QpState::Error);
    ha.wait_event(EventKind::QpFatal);
    ha.wait_state(&a, QpState::Error);
    a.post_send(
        &ha.dev,
        &rdma(WqeOpcode::RdmaRead, 2, src.sge(0, 8), at(&dst, 0)),
    );
    expect(&ha.wait(), 2, CqeOpcode::RdmaRead, CqeStatus::WrFlushError);
    t1.join().expect("proxy");
    t2.join().expect("proxy");
}

#[test]
fn many_qps_over_separate_connections() {
    let mut ha = Host::new(1, ChannelMode::Bypass);
    let mut hb = Host::new(2, ChannelMode::Bypass);
    // A doorbell page has 31 slots: the CQ and 14 QPs of two queues each.
    let k = 14;
    let mut pairs = Vec::new();
    for i in 0..k {
        let (a, b) = (ha.qp(), hb.qp());
        let crc = i % 2 == 0;
        attach(&mut ha, &a, &mut hb, &b, tcp_pair(), crc, Rtr::Write);
        let src = ha.mr(64 << 10);
        let dst = hb.mr(64 << 10);
        src.fill(0, &pattern(64 << 10, i as u8));
        pairs.push((a, b, src, dst));
    }
    // Every pair: a SEND and a WRITE at once, all connections busy together.
    for (i, (a, b, src, dst)) in pairs.iter_mut().enumerate() {
        let id = 10 * i as u64;
        b.post_recv(&hb.dev, id, &[dst.sge(0, 32 << 10)]);
        a.post_send(&ha.dev, &send(id, src.sge(0, 32 << 10)));
        a.post_send(
            &ha.dev,
            &rdma(
                WqeOpcode::RdmaWrite,
                id + 1,
                src.sge(32 << 10, 32 << 10),
                at(dst, 32 << 10),
            ),
        );
    }
    let mut sends = 0;
    let mut recvs = 0;
    for _ in 0..3 * k {
        let c = ha.cq.poll(&ha.dev).or_else(|| hb.cq.poll(&hb.dev));
        let c = match c {
            Some(c) => c,
            None => {
                let start = Instant::now();
                loop {
                    if let Some(c) = ha.cq.poll(&ha.dev).or_else(|| hb.cq.poll(&hb.dev)) {
                        break c;
                    }
                    assert!(start.elapsed() < HANG, "completions missing");
                    std::thread::yield_now();
                }
            }
        };
        assert_eq!(c.status, CqeStatus::Success, "{c:?}");
        if c.opcode == CqeOpcode::Recv {
            recvs += 1;
        } else {
            sends += 1;
        }
    }
    assert_eq!((sends, recvs), (2 * k, k));
    for (i, (a, _, _, dst)) in pairs.iter_mut().enumerate() {
        // A READ behind the WRITE sees its bytes.
        let back = ha.mr(64 << 10);
        a.post_send(
            &ha.dev,
            &rdma(
                WqeOpcode::RdmaRead,
                1000 + i as u64,
                back.sge(0, 64 << 10),
                at(dst, 0),
            ),
        );
        expect(
            &ha.wait(),
            1000 + i as u64,
            CqeOpcode::RdmaRead,
            CqeStatus::Success,
        );
        assert!(
            back.read(0, 64 << 10) == pattern(64 << 10, i as u8),
            "pair {i}"
        );
        assert!(
            dst.read(0, 64 << 10) == pattern(64 << 10, i as u8),
            "pair {i}"
        );
    }
}

/// Reads one FPDU (CRC off) from a raw peer socket: (ULPDU bytes).
fn read_fpdu(s: &mut TcpStream) -> Vec<u8> {
    let mut len = [0u8; 2];
    s.read_exact(&mut len).expect("FPDU length");
    let ulpdu = usize::from(u16::from_be_bytes(len));
    let pad = (4 - (2 + ulpdu) % 4) % 4;
    let mut rest = vec![0u8; ulpdu + pad + 4];
    s.read_exact(&mut rest).expect("FPDU");
    rest.truncate(ulpdu);
    rest
}

/// A raw peer's FPDU: ULPDU_LENGTH, `ulpdu`, the given pad bytes, and the CRC32c over all of
/// it (least significant byte first), or a zero field with `crc` off.
fn raw_fpdu(ulpdu: &[u8], pad: &[u8], crc: bool) -> Vec<u8> {
    assert_eq!((2 + ulpdu.len() + pad.len()) % 4, 0, "pad length");
    let mut f = (ulpdu.len() as u16).to_be_bytes().to_vec();
    f.extend_from_slice(ulpdu);
    f.extend_from_slice(pad);
    let c = if crc { crc32c::crc32c(&f) } else { 0 };
    f.extend_from_slice(&c.to_le_bytes());
    f
}

/// A raw peer's Read Request for `len` bytes of `rkey` at `to` (MSN `msn`, sink STag 9).
fn raw_read_request(msn: u32, rkey: u32, to: u64, len: u32, last: bool) -> Vec<u8> {
    let mut u = vec![if last { 0x41 } else { 0x01 }, 0x41, 0, 0, 0, 0, 0, 0, 0, 1];
    u.extend_from_slice(&msn.to_be_bytes());
    u.extend_from_slice(&[0, 0, 0, 0]);
    u.extend_from_slice(&9u32.to_be_bytes());
    u.extend_from_slice(&0u64.to_be_bytes());
    u.extend_from_slice(&len.to_be_bytes());
    u.extend_from_slice(&rkey.to_be_bytes());
    u.extend_from_slice(&to.to_be_bytes());
    u
}

/// A raw peer's tagged last RDMA WRITE segment of `data` to `stag` at `to`.
fn raw_write(stag: u32, to: u64, data: &[u8]) -> Vec<u8> {
    let mut u = vec![0xc1, 0x40];
    u.extend_from_slice(&stag.to_be_bytes());
    u.extend_from_slice(&to.to_be_bytes());
    u.extend_from_slice(data);
    u
}

/// A responder QP on `hb` whose peer is the returned raw socket.
fn raw_peer(hb: &mut Host, crc: bool) -> (TestQp, TcpStream) {
    raw_peer_with(hb, Role::Responder, (crc, Rtr::None, 8))
}

/// A QP on `h` in `role`, with CRC, RTR and IRD = ORD as given, whose peer is the returned
/// raw socket; in RTS.
fn raw_peer_with(
    h: &mut Host,
    role: Role,
    (crc, rtr, ord): (bool, Rtr, u16),
) -> (TestQp, TcpStream) {
    let q = h.qp();
    let (client, server) = tcp_pair();
    let (mine, raw) = match role {
        Role::Initiator => (client, server),
        Role::Responder => (server, client),
    };
    h.dev
        .attach_stream(h.ch.id, q.num, est(mine, role, crc, rtr, ord))
        .expect("attach");
    h.wait_state(&q, QpState::Rts);
    (q, raw)
}

/// A raw peer's untagged last SEND segment (queue 0) with `payload`.
fn raw_send(msn: u32, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0];
    u.extend_from_slice(&msn.to_be_bytes());
    u.extend_from_slice(&0u32.to_be_bytes());
    u.extend_from_slice(payload);
    u
}

#[test]
fn a_write_to_an_unknown_stag_is_answered_with_a_ddp_tagged_terminate() {
    let mut hb = Host::new(2, ChannelMode::Bypass);
    let mr = hb.mr(4096);
    let (b, mut raw) = raw_peer(&mut hb, false);
    // A tagged last RDMA WRITE of 4 bytes: DDP T|L|DV=1, RDMAP RV=1 op 0, STag, TO, data;
    // no pad (2 + 18 = 20), CRC field (off: zero).
    let f = raw_fpdu(
        &raw_write(mr.keys.rkey ^ 0x2_0000, mr.iova, b"abcd"),
        &[],
        false,
    );
    raw.write_all(&f).expect("send FPDU");
    let t = read_fpdu(&mut raw);
    // Untagged last, RDMAP Terminate on QN 2, MSN 1, MO 0.
    assert_eq!(t[..2], [0x41, 0x47], "Terminate header");
    assert_eq!(t[6..18], [0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0]);
    // Layer DDP (1), tagged buffer error (1), invalid STag (0), the M and D flags, then the
    // offending segment's MPA length and DDP header quoted (as siw does).
    assert_eq!(t[18..22], [0x11, 0x00, 0xc0, 0x00], "Terminate control");
    assert_eq!(t[22..38], f[..16], "quoted MPA length and DDP header");
    hb.wait_event(EventKind::QpFatal);
    hb.wait_state(&b, QpState::Error);
    // The stream is closed after the Terminate.
    let mut rest = Vec::new();
    let _ = raw.read_to_end(&mut rest);
    assert_eq!(mr.read(0, 4), vec![0; 4], "nothing placed");
}

#[test]
fn a_read_request_beyond_the_region_is_answered_with_an_rdmap_protection_terminate() {
    let mut hb = Host::new(2, ChannelMode::Bypass);
    let mr = hb.mr(4096);
    let (b, mut raw) = raw_peer(&mut hb, false);
    // Read Request: untagged last, op 1, QN 1, MSN 1, MO 0; sink STag/TO, size, source;
    // 2 + 46 = 48: no pad; CRC field.
    let rr = raw_read_request(1, mr.keys.rkey, mr.iova + 4092, 8, true);
    let f = raw_fpdu(&rr, &[], false);
    raw.write_all(&f).expect("send FPDU");
    let t = read_fpdu(&mut raw);
    assert_eq!(t[..2], [0x41, 0x47], "Terminate header");
    // Layer RDMAP (0), remote protection (1), base or bounds violation (1), M, D and R.
    assert_eq!(t[18..22], [0x01, 0x01, 0xe0, 0x00], "Terminate control");
    assert_eq!(t[22..42], f[..20], "quoted MPA length and DDP header");
    assert_eq!(t[42..70], f[20..48], "quoted Read Request");
    hb.wait_state(&b, QpState::Error);
}

/// Waits until the engine serving the host's channel sleeps.
fn wait_asleep(h: &Host) {
    wait_for("the engine never went to sleep", || {
        h.dev.engine_diag(h.ch.id).expect("engine").asleep
    });
}

#[test]
fn a_send_waits_for_its_recv_and_idle_engines_sleep() {
    let (mut ha, mut a, mut hb, mut b) = two_hosts();
    let src = ha.mr(4096);
    let dst = hb.mr(4096);
    attach(&mut ha, &a, &mut hb, &b, tcp_pair(), true, Rtr::Write);
    // Connected and idle: both engines sleep (the sockets wake them).
    wait_asleep(&ha);
    wait_asleep(&hb);
    let data = pattern(4096, 9);
    src.fill(0, &data);
    let mut w = send(1, src.sge(0, 4096));
    w.flags |= shared_ring::abi::wqe::flags::SOLICITED;
    a.post_send(&ha.dev, &w);
    expect(&ha.wait(), 1, CqeOpcode::Send, CqeStatus::Success);
    // No RECV yet: the message waits in the stream (no error, no completion).
    std::thread::sleep(Duration::from_millis(50));
    assert!(hb.cq.poll(&hb.dev).is_none());
    assert_eq!(hb.state(&b), QpState::Rts);
    b.post_recv(&hb.dev, 2, &[dst.sge(0, 4096)]);
    let r = hb.wait();
    expect(&r, 2, CqeOpcode::Recv, CqeStatus::Success);
    assert_eq!(r.byte_len, 4096);
    assert_ne!(
        r.flags & shared_ring::abi::cqe::flags::SOLICITED,
        0,
        "solicited"
    );
    assert!(dst.read(0, 4096) == data);
    wait_asleep(&ha);
    wait_asleep(&hb);
    // A sleeping responder is woken by the next message.
    b.post_recv(&hb.dev, 3, &[dst.sge(0, 4096)]);
    wait_asleep(&hb);
    a.post_send(&ha.dev, &send(4, src.sge(0, 16)));
    expect(&ha.wait(), 4, CqeOpcode::Send, CqeStatus::Success);
    expect(&hb.wait(), 3, CqeOpcode::Recv, CqeStatus::Success);
}

#[test]
fn garbage_from_a_peer_fails_only_its_qp() {
    let mut hb = Host::new(2, ChannelMode::Bypass);
    let mr = hb.mr(4096);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed as u8
    };
    let mut cases: Vec<Vec<u8>> = vec![
        vec![0, 0, 0, 0],                    // ULPDU shorter than any header
        vec![0xff, 0xff, 0x41, 0x47],        // a Terminate longer than allowed
        vec![0, 18, 0x41, 0x43, 0, 0, 0, 0], // a SEND cut short, then the end of stream
        vec![0, 14, 0xc1, 0x42, 0, 0, 0, 1], // a Read Response nobody asked for
        vec![0, 18, 0x41, 0x48, 0, 0, 0, 0], // opcode 8
        vec![0, 18, 0x42, 0x43, 0, 0, 0, 0], // DDP version 2
    ];
    for _ in 0..4 {
        cases.push((0..4000).map(|_| rnd()).collect());
    }
    // A good SEND no RECV is posted for, then the end of the stream: the QP must not wait
    // for the RECV forever.
    let mut send = vec![
        0, 22, 0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
    ];
    send.extend_from_slice(b"data");
    send.extend_from_slice(&[0; 4]);
    cases.push(send);
    for (i, bytes) in cases.iter().enumerate() {
        let (b, mut raw) = raw_peer(&mut hb, i % 2 == 0);
        let mut pad = bytes.clone();
        pad.resize(bytes.len().max(64), 0);
        let _ = raw.write_all(&pad);
        let _ = raw.shutdown(std::net::Shutdown::Write);
        hb.wait_state(&b, QpState::Error);
        hb.dev.destroy_qp(hb.ch.id, b.num).expect("destroy");
    }
    assert_eq!(mr.read(0, 4096), vec![0; 4096], "nothing placed");
    // The device still runs connections.
    let mut ha = Host::new(1, ChannelMode::Bypass);
    let (mut a, b) = (ha.qp(), hb.qp());
    let src = ha.mr(64);
    src.fill(0, &[5; 64]);
    attach(&mut ha, &a, &mut hb, &b, tcp_pair(), true, Rtr::Write);
    a.post_send(
        &ha.dev,
        &rdma(WqeOpcode::RdmaWrite, 1, src.sge(0, 64), at(&mr, 0)),
    );
    expect(&ha.wait(), 1, CqeOpcode::RdmaWrite, CqeStatus::Success);
    wait_for("WRITE not placed", || mr.read(0, 64) == vec![5; 64]);
}

#[test]
fn reads_beyond_ord_wait_their_turn() {
    let (mut ha, mut a, mut hb, b) = two_hosts();
    let local = ha.mr(6 << 16);
    let remote = hb.mr(6 << 16);
    remote.fill(0, &pattern(6 << 16, 77));
    attach_ord(&mut ha, &a, &mut hb, &b, tcp_pair(), (true, Rtr::Write, 2));
    // Six READs with ORD 2: the later ones wait at the head of the SQ; all complete, in
    // order, with their bytes.
    for i in 0..6u64 {
        a.post_send(
            &ha.dev,
            &rdma(
                WqeOpcode::RdmaRead,
                i,
                local.sge(i << 16, 1 << 16),
                at(&remote, i << 16),
            ),
        );
    }
    for i in 0..6u64 {
        expect(&ha.wait(), i, CqeOpcode::RdmaRead, CqeStatus::Success);
    }
    assert!(local.read(0, 6 << 16) == pattern(6 << 16, 77));
}

#[test]
fn read_requests_beyond_ird_are_terminated() {
    let mut hb = Host::new(2, ChannelMode::Bypass);
    let mr = hb.mr(4096);
    let (b, mut raw) = raw_peer_with(&mut hb, Role::Responder, (false, Rtr::None, 1));
    // Three 4 KiB Read Requests in one segment: IRD is 1.
    let mut f = Vec::new();
    for msn in 1..=3u32 {
        let rr = raw_read_request(msn, mr.keys.rkey, mr.iova, 4096, true);
        f.extend_from_slice(&raw_fpdu(&rr, &[], false));
    }
    raw.write_all(&f).expect("send");
    // Read Responses may come first; then a Terminate: DDP untagged, MSN out of range.
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < HANG, "no Terminate");
        let t = read_fpdu(&mut raw);
        if t[1] & 0xf == 7 {
            assert_eq!(t[18..20], [0x12, 0x03], "Terminate layer/type and code");
            break;
        }
        assert_eq!(t[1] & 0xf, 2, "a Read Response");
    }
    hb.wait_state(&b, QpState::Error);
}

#[test]
fn closing_the_peer_channel_disconnects_the_qp() {
    let (mut ha, mut a, mut hb, b) = two_hosts();
    let local = ha.mr(4096);
    attach(&mut ha, &a, &mut hb, &b, tcp_pair(), true, Rtr::Read);
    a.post_recv(&ha.dev, 1, &[local.sge(0, 4096)]);
    hb.dev.close_channel(hb.ch.id);
    ha.wait_event(EventKind::QpDisconnected);
    ha.wait_state(&a, QpState::Error);
    expect(&ha.wait(), 1, CqeOpcode::Recv, CqeStatus::WrFlushError);
}

/// Reads FPDUs from a raw peer socket through `iwarp-proto`'s decoder (CRC checked) up to
/// and including the first Read Request; returns their ULPDUs.
fn decode_to_read_request(s: &mut TcpStream, crc: bool) -> Vec<Vec<u8>> {
    let mut dec = iwarp_proto::fpdu::FpduDecoder::new(65535, crc);
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let start = Instant::now();
    loop {
        while let Some(u) = dec.next_ulpdu().expect("iwarp-proto accepts the FPDU") {
            out.push(u.to_vec());
            if u.len() > 1 && u[1] & 0xf == 1 {
                return out;
            }
        }
        assert!(start.elapsed() < HANG, "only {} ULPDUs", out.len());
        let k = s.read(&mut buf).expect("read");
        assert!(k > 0, "end of stream after {} ULPDUs", out.len());
        dec.push(&buf[..k]);
    }
}

#[test]
fn what_the_device_sends_parses_with_the_iwarp_proto_codec() {
    use iwarp_proto::ddp::BufferModel;
    use iwarp_proto::message::{Body, MessageRepr};
    use iwarp_proto::rdmap::Opcode;
    for crc in [true, false] {
        let mut ha = Host::new(1, ChannelMode::Bypass);
        let src = ha.mr(200_000);
        let sink = ha.mr(4096);
        src.fill(0, &pattern(200_000, 5));
        let (mut a, mut raw) = raw_peer_with(&mut ha, Role::Initiator, (crc, Rtr::Write, 8));
        let mut w = send(1, src.sge(0, 100_000));
        w.flags |= shared_ring::abi::wqe::flags::SOLICITED;
        a.post_send(&ha.dev, &w);
        a.post_send(
            &ha.dev,
            &rdma(
                WqeOpcode::RdmaWrite,
                2,
                src.sge(100_000, 100_000),
                (0xabcd_0000, 0x1235),
            ),
        );
        a.post_send(
            &ha.dev,
            &rdma(WqeOpcode::RdmaRead, 3, sink.sge(8, 64), (0x5000, 0x77)),
        );
        // RTR, the SEND and the WRITE (cut at the MSS), the Read Request.
        let ulpdus = decode_to_read_request(&mut raw, crc);
        let msgs: Vec<MessageRepr<'_>> = ulpdus
            .iter()
            .map(|u| MessageRepr::parse(u).expect("iwarp-proto parses the ULPDU"))
            .collect();
        assert_eq!(msgs[0].opcode, Opcode::Write, "RTR");
        assert_eq!(msgs[0].payload.len(), 0);
        let sends = msgs.iter().filter(|m| m.opcode == Opcode::SendSe).count();
        let writes = msgs.iter().filter(|m| m.opcode == Opcode::Write).count() - 1;
        assert_eq!(msgs.len(), 1 + sends + writes + 1);
        assert!(sends >= 2, "100 kB in FPDUs no larger than the MSS");
        let mut sent = Vec::new();
        for (i, m) in msgs[1..=sends].iter().enumerate() {
            assert_eq!(m.opcode, Opcode::SendSe);
            let BufferModel::Untagged { qn, msn, mo, .. } = m.ddp.model else {
                panic!("SEND is untagged");
            };
            assert_eq!((qn, msn, mo as usize), (0, 1, sent.len()));
            assert_eq!(m.ddp.last, i + 1 == sends);
            sent.extend_from_slice(&ulpdus[1 + i][m.payload.clone()]);
        }
        assert!(sent == pattern(200_000, 5)[..100_000], "SEND payload");
        let mut written = Vec::new();
        for (i, m) in msgs[1 + sends..1 + sends + writes].iter().enumerate() {
            assert_eq!(m.opcode, Opcode::Write);
            let BufferModel::Tagged { stag, to } = m.ddp.model else {
                panic!("WRITE is tagged");
            };
            assert_eq!((stag, to), (0x1235, 0xabcd_0000 + written.len() as u64));
            assert_eq!(m.ddp.last, i + 1 == writes);
            written.extend_from_slice(&ulpdus[1 + sends + i][m.payload.clone()]);
        }
        assert!(written == pattern(200_000, 5)[100_000..], "WRITE payload");
        let m = &msgs[1 + sends + writes];
        assert_eq!(m.opcode, Opcode::ReadRequest);
        let Body::ReadRequest(r) = m.body else {
            panic!("Read Request body");
        };
        assert_eq!(
            (r.sink_stag, r.size, r.source_stag, r.source_to),
            (sink.keys.lkey, 64, 0x77, 0x5000)
        );
    }
}

#[test]
fn pad_bytes_count_in_the_crc_as_received() {
    // RFC 5044 §4.1: the pad is sent as zeros and ignored by the receiver, "except for CRC
    // checking". A peer whose pad is not zero (and whose CRC covers it) is not in error.
    let mut hb = Host::new(2, ChannelMode::Bypass);
    let mr = hb.mr(4096);
    mr.fill(100, b"R");
    let (b, mut raw) = raw_peer(&mut hb, true);
    // A tagged last WRITE of 5 bytes: 2 + 14 + 5 = 21, so 3 pad bytes.
    let w = raw_write(mr.keys.rkey, mr.iova, b"hello");
    raw.write_all(&raw_fpdu(&w, &[0xa5, 0, 0x5a], true))
        .expect("WRITE");
    // Then a Read Request: answered (a Read Response), not a Terminate for a CRC error.
    let rr = raw_read_request(1, mr.keys.rkey, mr.iova + 100, 1, true);
    raw.write_all(&raw_fpdu(&rr, &[], true))
        .expect("Read Request");
    let t = read_fpdu(&mut raw);
    assert_eq!(t[1] & 0xf, 2, "a Read Response, not a Terminate: {t:02x?}");
    assert_eq!(&t[14..], b"R");
    assert_eq!(mr.read(0, 5), b"hello".to_vec());
    assert_eq!(hb.state(&b), QpState::Rts);
}

#[test]
fn a_read_request_that_is_not_one_segment_is_refused() {
    // RFC 5040 §4.4: a Read Request is one DDP segment (L set, MO 0). One with L clear is a
    // malformed message: Terminate with RDMAP's catastrophic-stream error (0/2/7), the
    // segment quoted; nothing is read for it.
    let mut hb = Host::new(2, ChannelMode::Bypass);
    let mr = hb.mr(4096);
    let (b, mut raw) = raw_peer(&mut hb, false);
    let rr = raw_read_request(1, mr.keys.rkey, mr.iova, 64, false);
    let f = raw_fpdu(&rr, &[], false);
    raw.write_all(&f).expect("Read Request");
    let t = read_fpdu(&mut raw);
    assert_eq!(
        t[..2],
        [0x41, 0x47],
        "a Terminate, not a Read Response: {t:02x?}"
    );
    assert_eq!(t[18..22], [0x02, 0x07, 0xc0, 0x00], "Terminate control");
    assert_eq!(t[22..42], f[..20], "quoted MPA length and DDP header");
    hb.wait_state(&b, QpState::Error);
}

#[test]
fn a_small_send_read_whole_waits_for_its_recv() {
    // A small message arrives whole in the read that fetches its header (the receiver reads
    // ahead into its private buffer): with no RECV posted it waits there, and the RECV posted
    // later (a kick, no new socket event) still gets it.
    let (mut ha, mut a, mut hb, mut b) = two_hosts();
    let src = ha.mr(4096);
    let dst = hb.mr(4096);
    attach(&mut ha, &a, &mut hb, &b, tcp_pair(), true, Rtr::Write);
    let data = pattern(64, 3);
    src.fill(0, &data);
    a.post_send(&ha.dev, &send(1, src.sge(0, 64)));
    expect(&ha.wait(), 1, CqeOpcode::Send, CqeStatus::Success);
    std::thread::sleep(Duration::from_millis(50));
    assert!(hb.cq.poll(&hb.dev).is_none(), "no RECV yet");
    wait_asleep(&hb);
    b.post_recv(&hb.dev, 2, &[dst.sge(0, 4096)]);
    let r = hb.wait();
    expect(&r, 2, CqeOpcode::Recv, CqeStatus::Success);
    assert_eq!(r.byte_len, 64);
    assert_eq!(dst.read(0, 64), data);
}

#[test]
fn fpdus_that_arrive_in_one_read_are_each_placed_and_checked() {
    // One write of a WRITE, a SEND and a Read Request, CRC on (the receiver reads them
    // ahead together): each lands where it belongs and the Read Request is answered; then
    // the same with a bad CRC on the SEND, whose payload was read ahead, is a Terminate.
    for bad in [false, true] {
        let mut hb = Host::new(2, ChannelMode::Bypass);
        let mr = hb.mr(4096);
        mr.fill(200, b"Q");
        let (mut b, mut raw) = raw_peer(&mut hb, true);
        b.post_recv(&hb.dev, 7, &[mr.sge(1000, 100)]);
        let w = raw_write(mr.keys.rkey, mr.iova + 8, b"abcdefgh");
        let mut all = raw_fpdu(&w, &[], true);
        let mut send = raw_fpdu(&raw_send(1, b"hello, world"), &[], true);
        if bad {
            let n = send.len();
            send[n - 1] ^= 1;
        }
        all.extend_from_slice(&send);
        let rr = raw_read_request(1, mr.keys.rkey, mr.iova + 200, 1, true);
        all.extend_from_slice(&raw_fpdu(&rr, &[], true));
        raw.write_all(&all).expect("three FPDUs");
        let t = read_fpdu(&mut raw);
        assert_eq!(mr.read(8, 8), b"abcdefgh".to_vec());
        if bad {
            assert_eq!(t[1] & 0xf, 7, "a Terminate: {t:02x?}");
            hb.wait_state(&b, QpState::Error);
            continue;
        }
        assert_eq!(t[1] & 0xf, 2, "a Read Response: {t:02x?}");
        assert_eq!(&t[14..], b"Q");
        let r = hb.wait();
        expect(&r, 7, CqeOpcode::Recv, CqeStatus::Success);
        assert_eq!(r.byte_len, 12);
        assert_eq!(mr.read(1000, 12), b"hello, world".to_vec());
        assert_eq!(hb.state(&b), QpState::Rts);
    }
}
