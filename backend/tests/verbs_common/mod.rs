//! Shared by the verbs device tests (`verbs_device.rs`, `verbs_cm.rs`, `verbs_probe.rs`):
//! the host's RDMA devices, and the SEND / RDMA WRITE / RDMA READ exchange checked on one.
#![allow(dead_code)]

use shared_ring::abi::cqe::{CqeOpcode, CqeStatus};
use shared_ring::abi::wqe::WqeOpcode;
use vrdma_backend::device::testkit::{wqe, TestChannel, TestCq, TestMr, TestQp};
use vrdma_backend::device::verbs::{VerbsDevice, VerbsLib};
use vrdma_backend::device::{access, Device, EngineConfig};

/// The RDMA devices the kernel lists (`/sys/class/infiniband`), sorted.
pub fn kernel_devices() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The device and port to test on: `VRDMA_TEST_IBDEV=<ibdev>[:<port>]`, else the first
/// device the kernel lists, port 1; `None` (with `NOT RUN` and why) on a host without one.
pub fn ibdev() -> Option<(String, u8)> {
    match std::env::var("VRDMA_TEST_IBDEV") {
        Ok(v) => Some(match v.split_once(':') {
            Some((d, p)) => (d.to_owned(), p.parse().expect("VRDMA_TEST_IBDEV port")),
            None => (v, 1),
        }),
        Err(_) => {
            let first = kernel_devices().into_iter().next().map(|d| (d, 1));
            if first.is_none() {
                eprintln!(
                    "NOT RUN: no RDMA device on this host (/sys/class/infiniband is empty \
                     or absent); run these tests where one exists, e.g. rxe0 in the Xen \
                     lab's dom0 (docs/operations.md, \"verbs device\")"
                );
            }
            first
        }
    }
}

/// The verbs device on [`ibdev`] and its name; `None` on a host without one.
pub fn open_device() -> Option<(VerbsDevice, String)> {
    let (name, port) = ibdev()?;
    let lib = VerbsLib::open().expect("libibverbs (the host has an RDMA device)");
    let dev = VerbsDevice::open(&lib, &name, port, EngineConfig::default())
        .unwrap_or_else(|e| panic!("opening {name} port {port}: {e}"));
    Some((dev, name))
}

/// One side of a connected QP pair.
pub struct Side<'a> {
    pub ch: &'a mut TestChannel,
    pub cq: &'a mut TestCq,
    pub qp: &'a mut TestQp,
}

/// On a connected pair: SEND a → b (1000 bytes), RDMA WRITE a → b at b's iova (4096
/// bytes), RDMA READ b → a (12 bytes), each with its completions (wr_id 1, 2, 3 at a, 77 at
/// b) and the data checked. Returns the 8 KiB regions used, a's and b's.
pub fn send_write_read(dev: &dyn Device, a: Side<'_>, b: Side<'_>) -> (TestMr, TestMr) {
    let ma = a.ch.mr(dev, 8192, access::ALL);
    let mb = b.ch.mr(dev, 8192, access::ALL);
    // SEND a → b.
    let msg: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 1) as u8).collect();
    ma.fill(0, &msg);
    b.qp.post_recv(dev, 77, &[mb.sge(4096, 2048)]);
    a.qp.post_send(dev, &wqe(WqeOpcode::Send, 1, &[ma.sge(0, 1000)], (0, 0), 0));
    let c = a.cq.wait(dev);
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (1, CqeStatus::Success, CqeOpcode::Send)
    );
    let c = b.cq.wait(dev);
    assert_eq!(
        (c.wr_id, c.status, c.byte_len),
        (77, CqeStatus::Success, 1000)
    );
    assert_eq!(c.qp_num, b.qp.num.0);
    assert_eq!(mb.read(4096, 1000), msg);
    // RDMA WRITE a → b at b's iova (the guest's address space).
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 13 + 5) as u8).collect();
    ma.fill(4096, &pattern);
    a.qp.post_send(
        dev,
        &wqe(
            WqeOpcode::RdmaWrite,
            2,
            &[ma.sge(4096, 4096)],
            (mb.iova, mb.keys.rkey),
            0,
        ),
    );
    let c = a.cq.wait(dev);
    assert_eq!((c.wr_id, c.status), (2, CqeStatus::Success));
    assert_eq!(mb.read(0, 4096), pattern);
    // RDMA READ b → a.
    mb.fill(100, b"read me back");
    a.qp.post_send(
        dev,
        &wqe(
            WqeOpcode::RdmaRead,
            3,
            &[ma.sge(2000, 12)],
            (mb.iova + 100, mb.keys.rkey),
            0,
        ),
    );
    let c = a.cq.wait(dev);
    assert_eq!(
        (c.wr_id, c.status, c.opcode),
        (3, CqeStatus::Success, CqeOpcode::RdmaRead)
    );
    assert_eq!(ma.read(2000, 12), b"read me back");
    (ma, mb)
}
