//! The connection manager's thread sleeps when nothing is in progress: with listeners open,
//! after a handshake was served, it does not wake up (counted from its context switches in
//! `/proc/self/task`, a count, not a time). Its own test binary, so no other test's
//! connection-manager thread is in the process.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use vrdma_backend::device::testkit::TestChannel;
use vrdma_backend::device::{ChannelMode, CmConfig, Device, EngineConfig, SoftDevice};

const A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// Context switches of the `vrdma-cm` thread(s) of this process.
fn cm_switches() -> u64 {
    let mut total = 0;
    let mut found = false;
    for t in std::fs::read_dir("/proc/self/task").expect("/proc") {
        let p = t.expect("task").path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if comm.trim() != "vrdma-cm" {
            continue;
        }
        found = true;
        let status = std::fs::read_to_string(p.join("status")).expect("status");
        for line in status.lines() {
            if line.starts_with("voluntary_ctxt_switches:")
                || line.starts_with("nonvoluntary_ctxt_switches:")
            {
                total += line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|n| n.parse::<u64>().ok())
                    .expect("count");
            }
        }
    }
    assert!(found, "no vrdma-cm thread");
    total
}

#[test]
fn the_connection_manager_thread_sleeps_when_idle() {
    let dev = SoftDevice::new(EngineConfig::default())
        .unwrap()
        .with_cm(CmConfig {
            addrs: vec![A],
            connect_timeout: Duration::from_millis(200),
            ..CmConfig::default()
        })
        .unwrap();
    let ch = TestChannel::open(&dev, 1, ChannelMode::Bypass);
    let l = dev.cm_listen(ch.id, SocketAddr::new(A, 0), 4).unwrap();
    let addr = dev.cm_listener_addr(ch.id, l).unwrap();
    // Serve one connection that never sends a request (its deadline passes), so the thread
    // has had a deadline and must have gone back to sleeping without one.
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(
        s.read(&mut [0u8; 1]).unwrap_or(0),
        0,
        "dropped at the deadline"
    );
    let _ = s.write_all(b"late");
    std::thread::sleep(Duration::from_millis(300));
    let before = cm_switches();
    std::thread::sleep(Duration::from_secs(1));
    let after = cm_switches();
    assert!(
        after - before <= 1,
        "{} wake-ups of the idle connection-manager thread in 1 s",
        after - before
    );
}
