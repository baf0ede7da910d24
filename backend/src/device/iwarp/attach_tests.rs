//! `attach_stream` against an engine that acts on the stream at once: the race between the
//! connection manager's state step and a responder's engine reading the initiator's RTR.

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use shared_ring::abi::control::{access, QpState};
use shared_ring::abi::cqe::{CqeOpcode, CqeStatus};
use shared_ring::abi::event::EventKind;
use shared_ring::abi::wqe::WqeOpcode;

use super::{Established, Role, Rtr};
use crate::device::soft::AFTER_HANDOVER;
use crate::device::testkit::{wqe, TestChannel, HANG};
use crate::device::{ChannelMode, Device, EngineConfig, SoftDevice};

const IO_TIMEOUT: Duration = Duration::from_secs(20);

fn est(stream: TcpStream, role: Role) -> Established {
    Established {
        local: stream.local_addr().expect("local"),
        peer: stream.peer_addr().expect("peer"),
        stream,
        role,
        crc: true,
        ird: 8,
        ord: 8,
        rtr: Rtr::Write,
        peer_private: Vec::new(),
        peer_probe: super::qp::DEFAULT_PEER_PROBE,
    }
}

/// The responder's engine reads the initiator's RTR (Rtr → Rts, `QpEstablished`) before
/// `attach_stream` takes its state step — the order a busy host gives when the connection
/// manager's thread is preempted right after handing the stream over. The QP must stay in
/// Rts and send: the old step stored Rtr over the Rts, and every SEND of the responder then
/// waited forever while the initiator's traffic still came in (the interhost tshark test's
/// "no completion of the SEND of 1 B" on host B's guest).
#[test]
fn a_responder_whose_engine_read_the_rtr_during_attach_stays_in_rts_and_sends() {
    let da = SoftDevice::new(EngineConfig::default()).expect("device A");
    let db = SoftDevice::new(EngineConfig::default()).expect("device B");
    let mut ca = TestChannel::open(&da, 1, ChannelMode::Bypass);
    let mut cb = TestChannel::open(&db, 1, ChannelMode::Bypass);
    let mut cqa = ca.cq(&da, 8);
    let mut cqb = cb.cq(&db, 8);
    let mut a = ca.qp(&da, &cqa, &cqa, 4);
    let mut b = cb.qp(&db, &cqb, &cqb, 4);
    let ma = ca.mr(&da, 4096, access::ALL);
    let mb = cb.mr(&db, 4096, access::ALL);

    let l = TcpListener::bind("127.0.0.1:0").expect("listen");
    let client =
        TcpStream::connect_timeout(&l.local_addr().expect("addr"), IO_TIMEOUT).expect("connect");
    let (server, _) = l.accept().expect("accept");
    for s in [&client, &server] {
        s.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
        s.set_write_timeout(Some(IO_TIMEOUT)).expect("timeout");
    }
    // The initiator first: its engine sends the RTR, which waits in the responder's socket.
    da.attach_stream(ca.id, a.num, est(client, Role::Initiator))
        .expect("attach initiator");

    AFTER_HANDOVER.with(|h| {
        *h.borrow_mut() = Some(Box::new(|q| {
            // Where the connection manager's accept left the QP.
            q.set_state(QpState::Rtr);
            // The engine picks up the handed-over stream on its next socket-map rebuild,
            // which a generation change triggers (attach_stream's own `changed()` comes
            // after this hook).
            q.ch.engine.changed();
            let start = Instant::now();
            while q.state() != QpState::Rts {
                assert!(start.elapsed() < HANG, "the engine never read the RTR");
                std::thread::sleep(Duration::from_millis(1));
            }
        }));
    });
    let attached = db.attach_stream(cb.id, b.num, est(server, Role::Responder));
    AFTER_HANDOVER.with(|h| *h.borrow_mut() = None);
    attached.expect("attach responder");
    assert_eq!(db.qp_state(cb.id, b.num).expect("state"), QpState::Rts);
    let start = Instant::now();
    while !cb
        .take_events()
        .iter()
        .any(|e| e.kind == EventKind::QpEstablished)
    {
        assert!(start.elapsed() < HANG, "no QpEstablished at the responder");
        std::thread::sleep(Duration::from_millis(1));
    }

    // The responder sends.
    ma.fill(0, &[0; 1]);
    mb.fill(0, &[0x5a]);
    a.post_recv(&da, 7, &[ma.sge(0, 1)]);
    b.post_send(&db, &wqe(WqeOpcode::Send, 8, &[mb.sge(0, 1)], (0, 0), 0));
    let s = cqb.wait(&db);
    assert_eq!(
        (s.wr_id, s.opcode, s.status),
        (8, CqeOpcode::Send, CqeStatus::Success)
    );
    let r = cqa.wait(&da);
    assert_eq!(
        (r.wr_id, r.opcode, r.status, r.byte_len),
        (7, CqeOpcode::Recv, CqeStatus::Success, 1)
    );
    assert_eq!(ma.read(0, 1), [0x5a]);
}

/// `[cm] peer-probe-s` reaches the socket the data path runs: after `attach_stream` with a
/// probe of 60 s, the stream's TCP keepalive starts after 60 s of silence, probes every 15 s,
/// four times, and unacknowledged bytes time out after 120 s (read back through a duplicate
/// of the socket's descriptor). The old code had a fixed 10 s whatever the configuration.
#[test]
fn the_configured_peer_probe_sets_the_streams_keepalive_and_user_timeout() {
    let dev = SoftDevice::new(EngineConfig::default()).expect("device");
    let mut ch = TestChannel::open(&dev, 1, ChannelMode::Bypass);
    let cq = ch.cq(&dev, 8);
    let q = ch.qp(&dev, &cq, &cq, 4);
    let l = TcpListener::bind("127.0.0.1:0").expect("listen");
    let client =
        TcpStream::connect_timeout(&l.local_addr().expect("addr"), IO_TIMEOUT).expect("connect");
    let (_server, _) = l.accept().expect("accept");
    let probe = Duration::from_secs(60);
    let seen = client.try_clone().expect("dup");
    let mut e = est(client, Role::Initiator);
    e.peer_probe = probe;
    dev.attach_stream(ch.id, q.num, e).expect("attach");
    let s = socket2::SockRef::from(&seen);
    assert!(s.keepalive().expect("SO_KEEPALIVE"), "keepalive is on");
    assert_eq!(s.tcp_keepalive_time().expect("TCP_KEEPIDLE"), probe);
    assert_eq!(
        s.tcp_keepalive_interval().expect("TCP_KEEPINTVL"),
        probe / 4
    );
    assert_eq!(s.tcp_keepalive_retries().expect("TCP_KEEPCNT"), 4);
    assert_eq!(
        s.tcp_user_timeout().expect("TCP_USER_TIMEOUT"),
        Some(probe * 2)
    );
}

/// FPDUs follow the MSS the socket reports when a long message starts, not only the one it
/// reported at attach. On loopback Linux bounds the MSS right after the handshake by half
/// the peer's largest window so far (32 741 of 65 483 here) and raises it once the peer's
/// window grows; the old code cut every FPDU of the connection to the first value (twice
/// the FPDUs, headers and reads per byte, the whole connection long). A WRITE of 4 MiB
/// lets the window grow, a second WRITE must then fill FPDUs to the larger MSS (and never
/// beyond it). Seen failing on the old code: "write 1: FPDUs not cut to the MSS of now
/// (65483; 32741 at attach)".
#[test]
fn fpdus_grow_with_the_sockets_mss_after_attach() {
    const LEN: usize = 4 << 20;
    let dev = SoftDevice::new(EngineConfig::default()).expect("device");
    let mut ch = TestChannel::open(&dev, 1, ChannelMode::Bypass);
    let mut cq = ch.cq(&dev, 8);
    let mut q = ch.qp(&dev, &cq, &cq, 4);
    let m = ch.mr(&dev, LEN as u64, access::ALL);
    m.fill(0, &[0x5a; 4096]);
    let l = TcpListener::bind("127.0.0.1:0").expect("listen");
    let client =
        TcpStream::connect_timeout(&l.local_addr().expect("addr"), IO_TIMEOUT).expect("connect");
    let (mut server, _) = l.accept().expect("accept");
    server.set_read_timeout(Some(IO_TIMEOUT)).expect("timeout");
    let seen = client.try_clone().expect("dup");
    let mss_at_attach = socket2::SockRef::from(&seen).tcp_mss().expect("MSS") as usize;
    dev.attach_stream(ch.id, q.num, est(client, Role::Initiator))
        .expect("attach");

    // The peer's side, read raw: the FPDU lengths of the RTR and `writes` WRITEs of LEN.
    let read_fpdus = |server: &mut TcpStream, writes: usize| -> Vec<usize> {
        use std::io::Read;
        let (mut got, mut lens) = (0usize, Vec::new());
        let want = if writes == 0 { 0 } else { LEN * writes };
        while got < want || lens.is_empty() {
            let mut len = [0u8; 2];
            server.read_exact(&mut len).expect("MPA length");
            let ulpdu = usize::from(u16::from_be_bytes(len));
            let fpdu = iwarp_proto::fpdu::fpdu_len(ulpdu);
            let mut rest = vec![0u8; fpdu - 2];
            server.read_exact(&mut rest).expect("FPDU");
            // Tagged DDP header of a WRITE: 14 bytes; the payload follows.
            got += ulpdu - iwarp_proto::ddp::TAGGED_HEADER_LEN;
            lens.push(fpdu);
        }
        lens
    };
    let rtr = read_fpdus(&mut server, 0);
    assert_eq!(rtr.len(), 1, "the RTR first");
    for (i, want_id) in [(0, 1u64), (1, 2)] {
        q.post_send(
            &dev,
            &wqe(
                WqeOpcode::RdmaWrite,
                want_id,
                &[m.sge(0, LEN as u32)],
                (0x1000, 7),
                0,
            ),
        );
        let lens = read_fpdus(&mut server, 1);
        let c = cq.wait(&dev);
        assert_eq!((c.wr_id, c.status), (want_id, CqeStatus::Success));
        let mss = socket2::SockRef::from(&seen).tcp_mss().expect("MSS") as usize;
        let largest = *lens.iter().max().expect("FPDUs");
        assert!(
            largest <= mss,
            "write {i}: an FPDU of {largest} over the MSS {mss}"
        );
        if i == 1 {
            assert!(
                mss > mss_at_attach,
                "the loopback MSS did not grow ({mss_at_attach} → {mss}): nothing to test"
            );
            assert_eq!(
                largest,
                iwarp_proto::fpdu::fpdu_len(iwarp_proto::fpdu::mulpdu(mss)),
                "write {i}: FPDUs not cut to the MSS of now ({mss}; {mss_at_attach} at attach)"
            );
        }
    }
}
