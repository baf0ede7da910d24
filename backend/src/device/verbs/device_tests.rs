//! The verbs device on the fake libibverbs (`super::super::fake`): its threads and control
//! paths, on any host.

use super::super::fake::{self, Elem};
use super::*;
use crate::device::testkit::TestChannel;

const WAIT: Duration = Duration::from_secs(5);

fn open(lib: &VerbsLib) -> VerbsDevice {
    VerbsDevice::open(lib, "fake0", 1, EngineConfig::default()).expect("the fake device opens")
}

/// The async-event thread moves a QP to Error (QP_FATAL) while the guest destroys it: the
/// thread's reference is then the last, and the HCA QP must not be destroyed on that thread
/// (`ibv_destroy_qp` waits for the QP's async events to be acknowledged, which only that
/// thread does).
#[test]
fn the_async_thread_never_destroys_a_guest_qp() {
    let (_serial, lib) = fake::setup();
    let dev = open(&lib);
    let mut ch = TestChannel::open(&dev, 1, ChannelMode::Bypass);
    let cq = ch.cq(&dev, 4);
    let qp = ch.qp(&dev, &cq, &cq, 4);
    fake::hold_err(true);
    fake::push_event(IBV_EVENT_QP_FATAL, Elem::Qp(qp.num.0));
    assert!(fake::wait_held(WAIT), "QP_FATAL moves the HCA QP to Error");
    dev.destroy_qp(ch.id, qp.num).unwrap();
    fake::hold_err(false);
    assert!(
        fake::wait_destroyed(qp.num.0, WAIT),
        "the HCA QP is destroyed"
    );
    let d = fake::destroyed();
    assert!(
        d.iter().all(|(_, t)| !t.starts_with("vrdma-async")),
        "destroyed on the async thread: {d:?}"
    );
    assert_eq!(fake::hung(), Vec::<u32>::new());
    let evs = ch.take_events();
    assert!(
        evs.iter()
            .any(|e| e.kind == EventKind::QpFatal && e.handle == qp.num.0),
        "{evs:?}"
    );
    drop(dev);
}

/// Waits (up to [`WAIT`]) until the async thread has ended.
fn async_thread_ends(dev: &VerbsDevice) -> bool {
    let end = Instant::now() + WAIT;
    while Instant::now() < end {
        if dev.async_thread.as_ref().is_some_and(|t| t.is_finished()) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn device_lost(evs: &[EventRepr]) -> usize {
    evs.iter()
        .filter(|e| e.kind == EventKind::DeviceLost)
        .count()
}

/// A device removed under the backend: the async fd hangs up and `ibv_get_async_event`
/// fails with EIO. Every channel hears `DeviceLost` once, its QPs fail, the thread ends
/// (instead of retrying every 200 ms for ever).
#[test]
fn a_lost_device_is_reported_once_and_the_async_thread_ends() {
    let (_serial, lib) = fake::setup();
    let dev = open(&lib);
    let mut a = TestChannel::open(&dev, 1, ChannelMode::Bypass);
    let mut b = TestChannel::open(&dev, 2, ChannelMode::Mediated);
    let cq = a.cq(&dev, 4);
    let qp = a.qp(&dev, &cq, &cq, 4);
    fake::lose_device();
    assert!(async_thread_ends(&dev), "the async thread still runs");
    assert_eq!(device_lost(&a.take_events()), 1);
    assert_eq!(device_lost(&b.take_events()), 1);
    assert_eq!(dev.qp_state(a.id, qp.num).unwrap(), QpState::Error);
    // A channel opened after the loss would never hear of it: refused.
    let doorbell = shared_ring::SharedRegion::alloc(shared_ring::PAGE_SIZE).unwrap();
    let events = shared_ring::SharedRegion::alloc(shared_ring::event_ring::EVENT_RING_LEN).unwrap();
    let late = dev.open_channel(crate::device::ChannelSetup {
        domid: crate::device::DomId(3),
        doorbell,
        event_ring: events,
        notifier: std::sync::Arc::new(|| {}),
        mode: ChannelMode::Bypass,
        kick_source: None,
    });
    assert!(
        matches!(late, Err(crate::device::DeviceError::DeviceLost)),
        "a channel opened after the loss: {late:?}"
    );
    drop(dev);
}

/// `DEVICE_FATAL` then the failing fd: still one `DeviceLost`.
#[test]
fn a_device_fatal_event_then_a_failing_fd_is_one_device_lost() {
    let (_serial, lib) = fake::setup();
    let dev = open(&lib);
    let mut a = TestChannel::open(&dev, 1, ChannelMode::Bypass);
    fake::push_event(IBV_EVENT_DEVICE_FATAL, Elem::Device);
    fake::lose_device();
    assert!(async_thread_ends(&dev), "the async thread still runs");
    assert_eq!(device_lost(&a.take_events()), 1);
    drop(dev);
}

fn mapped(last: u8) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[192, 0, 2, last]);
    g
}

/// `fe80::1`: the default link-local GID a RoCE port has at index 0.
fn link_local() -> [u8; 16] {
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    g[15] = 1;
    g
}

/// mlx4/mlx5 list each address as RoCE v1 then v2: the device's own GID and the source GID
/// of an address vector are the v2 entries.
#[test]
fn the_device_sends_from_roce_v2_gids() {
    let (_serial, lib) = fake::setup();
    let ll = link_local();
    fake::set_gids(
        IBV_LINK_LAYER_ETHERNET,
        &[
            (ll, IBV_GID_TYPE_ROCE_V1),
            (ll, IBV_GID_TYPE_ROCE_V2),
            (mapped(1), IBV_GID_TYPE_ROCE_V1),
            (mapped(1), IBV_GID_TYPE_ROCE_V2),
        ],
    );
    let dev = open(&lib);
    assert_eq!(
        dev.inner.av.gid_index,
        Some(3),
        "the port's own GID: its IPv4 address, the v2 entry"
    );
    let av = dev
        .remote_av(&RemoteAv {
            gid: mapped(9),
            lid: 0,
            qpn: 0x99,
            psn: 1,
            mtu: 0,
        })
        .unwrap();
    assert_eq!(av.gid_index, Some(3), "the IPv4 source GID");
    drop(dev);
}

/// The guests see the port's real GID table with types (`QueryGid`), its own GID (its IPv4
/// address, not the default link-local GID at index 0) first.
#[test]
fn the_guests_see_the_port_s_gid_table() {
    let (_serial, lib) = fake::setup();
    let ll = link_local();
    fake::set_gids(
        IBV_LINK_LAYER_ETHERNET,
        &[
            (ll, IBV_GID_TYPE_ROCE_V2),
            (mapped(1), IBV_GID_TYPE_ROCE_V2),
            ([0; 16], IBV_GID_TYPE_ROCE_V2),
        ],
    );
    let dev = open(&lib);
    assert_eq!(
        dev.gid_table(),
        vec![
            (mapped(1), IBV_GID_TYPE_ROCE_V2),
            (ll, IBV_GID_TYPE_ROCE_V2)
        ],
        "the port's own GID (its IPv4 address, not the default link-local GID at index 0) \
         leads; zero entries are left out"
    );
    assert_eq!(dev.local_av().map(|a| a.gid), Some(mapped(1)));
    drop(dev);
}
