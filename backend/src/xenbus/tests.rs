//! The backend state machines against the embedded XenStore server, with a fake channel
//! opener: every step is driven explicitly, so nothing depends on timing.

use std::sync::{Arc, Mutex};

use xenstore_proto::client::{Client, NodeOps, XenbusStore};
use xenstore_proto::server::{Config, Server};

use super::*;
use crate::resources::{Quotas, Resource};
use crate::toolstack;

const B: u32 = 0;
const D: u32 = 5;
const DEV: DeviceId = DeviceId { domid: D, devid: 0 };

type Log = Arc<Mutex<Vec<(u32, CloseReason)>>>;

struct FakeOpener {
    opened: Arc<Mutex<Vec<ChannelRequest>>>,
    closed: Log,
    refuse: Option<String>,
}

struct FakeLink {
    channel: u32,
    closed: Log,
}

impl ChannelLink for FakeLink {
    fn close(self: Box<Self>, reason: &CloseReason) {
        self.closed
            .lock()
            .unwrap()
            .push((self.channel, reason.clone()));
    }
}

impl ChannelOpener for FakeOpener {
    fn open(&mut self, request: ChannelRequest) -> Result<Box<dyn ChannelLink>, String> {
        if let Some(why) = &self.refuse {
            return Err(why.clone());
        }
        let channel = request.channel;
        self.opened.lock().unwrap().push(request);
        Ok(Box::new(FakeLink {
            channel,
            closed: self.closed.clone(),
        }))
    }
}

struct World {
    server: Server,
    dom0: Arc<Client>,
    guest: Client,
    opened: Arc<Mutex<Vec<ChannelRequest>>>,
    closed: Log,
}

fn info() -> DeviceInfo {
    DeviceInfo {
        versions: vec![1],
        kind: "soft-iwarp".into(),
        limits: vec![("max-qp-wr".into(), 4096), ("max-sge".into(), 4)],
        address: None,
    }
}

impl World {
    fn new(quotas: Quotas) -> World {
        let server = Server::new(Config::default());
        let dom0 = Arc::new(Client::from_unix_stream(server.connect(0).unwrap()).unwrap());
        dom0.write(&format!("/local/domain/{D}/name"), "guest")
            .unwrap();
        server.introduce_domain(D).unwrap();
        toolstack::attach_device(&*dom0, D, B, 0, &quotas).unwrap();
        let guest = Client::from_unix_stream(server.connect(D).unwrap()).unwrap();
        World {
            server,
            dom0,
            guest,
            opened: Arc::default(),
            closed: Arc::default(),
        }
    }

    fn backend(&self) -> XenbusBackend {
        self.backend_with(None)
    }

    fn backend_with(&self, refuse: Option<&str>) -> XenbusBackend {
        XenbusBackend::new(
            self.dom0.clone() as Arc<dyn XenbusStore>,
            B,
            info(),
            Quotas::default(),
            Box::new(FakeOpener {
                opened: self.opened.clone(),
                closed: self.closed.clone(),
                refuse: refuse.map(str::to_owned),
            }),
            Arc::new(|_| {}),
            Box::new(|_| crate::xenbus::StatsSnapshot {
                counters: vec![("ops", 7)],
                qps: Default::default(),
            }),
        )
    }

    /// A new world and its backend, after its first scan.
    fn started(quotas: Quotas) -> (World, XenbusBackend) {
        let w = World::new(quotas);
        let mut b = w.backend();
        b.scan().unwrap();
        (w, b)
    }

    fn read(&self, path: &str) -> Option<String> {
        self.dom0
            .read_opt(path)
            .unwrap()
            .map(|v| String::from_utf8(v).unwrap())
    }

    fn b(&self, key: &str) -> Option<String> {
        self.read(&format!("{}/{key}", device_backend_path(B, DEV)))
    }

    /// A counter the backend published for the device.
    fn s(&self, key: &str) -> Option<String> {
        self.read(&format!("{}/{key}", super::device_stats_path(B, DEV)))
    }

    fn f(&self, key: &str) -> String {
        format!("{}/{key}", device_frontend_path(DEV))
    }

    /// The frontend's steps 1 and 3 of the channel handshake.
    fn open_channel(&self, n: u32, version: u32) {
        self.open_channel_with(n, version, ("pid", "4242"));
    }

    /// [`World::open_channel`] of a channel instance with a nonce (as the frontend writes it).
    fn open_channel_instance(&self, n: u32, nonce: &str) {
        self.open_channel_with(n, 2, ("nonce", nonce));
    }

    /// Steps 1 and 3 with `extra` (a node and its value) written before the state.
    fn open_channel_with(&self, n: u32, version: u32, extra: (&str, &str)) {
        self.guest
            .write(&self.f(&format!("channel/{n}/state")), "1")
            .unwrap();
        self.guest
            .transaction(|t| {
                let c = |k: &str| self.f(&format!("channel/{n}/{k}"));
                t.write(&c("ring-ref"), "77")?;
                t.write(&c("event-channel"), "9")?;
                t.write(&c("version"), version.to_string())?;
                t.write(&c(extra.0), extra.1)?;
                t.write(&c("state"), "3")
            })
            .unwrap();
    }

    /// Channels `ns` opened (version 2), then one scan of the frontend by `b`.
    fn connect(&self, b: &mut XenbusBackend, ns: &[u32]) {
        for &n in ns {
            self.open_channel(n, 2);
        }
        b.scan_frontend(DEV).unwrap();
    }

    fn closed(&self) -> Vec<(u32, CloseReason)> {
        self.closed.lock().unwrap().clone()
    }
}

#[test]
fn init_wait_with_versions_kind_and_limits() {
    let (w, b) = World::started(Quotas::default());
    assert_eq!(w.b("state").as_deref(), Some("2"));
    assert_eq!(w.b("versions").as_deref(), Some("1"));
    assert_eq!(w.b("kind").as_deref(), Some("soft-iwarp"));
    assert_eq!(w.b("max-qp-wr").as_deref(), Some("4096"));
    assert_eq!(w.s("channels").as_deref(), Some("0"));
    assert_eq!(w.s("ops").as_deref(), Some("7"));
    assert_eq!(b.devices(), vec![DEV]);
    // The guest may read but not write the backend directory (its quotas).
    let q = format!("{}/max-qps", device_backend_path(B, DEV));
    assert!(w.guest.read(&q).is_ok());
    assert!(w.guest.write(&q, "100000").unwrap_err().is_access_denied());
}

#[test]
fn device_connects_when_the_frontend_does() {
    let (w, mut b) = World::started(Quotas::default());
    w.guest.write(&w.f("state"), "4").unwrap();
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.b("state").as_deref(), Some("4"));
}

#[test]
fn channel_connects_and_closes_with_the_etiquette() {
    let (w, mut b) = World::started(Quotas::default());
    w.connect(&mut b, &[0]);
    assert_eq!(w.b("channel/0/state").as_deref(), Some("4"));
    {
        let opened = w.opened.lock().unwrap();
        assert_eq!(opened.len(), 1);
        let r = &opened[0];
        assert_eq!((r.channel, r.ring_ref, r.event_channel), (0, 77, 9));
        assert_eq!(r.pid, Some(4242));
        assert_eq!(r.mode, crate::device::ChannelMode::Bypass);
    }
    b.publish_stats(DEV).unwrap();
    assert_eq!(w.s("channels").as_deref(), Some("1"));
    // A rescan changes nothing.
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.opened.lock().unwrap().len(), 1);

    // Frontend Closing -> backend Closing then Closed, resources released.
    w.guest.write(&w.f("channel/0/state"), "5").unwrap();
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.b("channel/0/state").as_deref(), Some("6"));
    assert_eq!(w.b("channel/0/error"), None);
    assert_eq!(w.closed(), vec![(0, CloseReason::Frontend)]);
    b.publish_stats(DEV).unwrap();
    assert_eq!(w.s("channels").as_deref(), Some("0"));
    // The frontend sets 6 and removes its node; the backend removes its own.
    w.guest.write(&w.f("channel/0/state"), "6").unwrap();
    b.scan_frontend(DEV).unwrap();
    w.guest.rm(&w.f("channel/0")).unwrap();
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.b("channel/0/state"), None);
    assert_eq!(w.closed().len(), 1);
}

#[test]
fn bad_version_is_closed_with_an_error() {
    let (w, mut b) = World::started(Quotas::default());
    w.open_channel(0, 9);
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.b("channel/0/state").as_deref(), Some("6"));
    let err = w.b("channel/0/error").unwrap();
    assert!(err.contains("version 9"), "{err}");
    assert!(w.opened.lock().unwrap().is_empty());
    // No retry on the next event.
    b.scan_frontend(DEV).unwrap();
    assert!(w.opened.lock().unwrap().is_empty());
}

#[test]
fn garbage_channel_nodes_are_refused_not_trusted() {
    let (w, mut b) = World::started(Quotas::default());
    w.open_channel(0, 2);
    w.guest.write(&w.f("channel/0/ring-ref"), "-1").unwrap();
    w.guest.write(&w.f("channel/x"), "junk").unwrap();
    w.guest.write(&w.f("channel/01/state"), "3").unwrap();
    b.scan_frontend(DEV).unwrap();
    let err = w.b("channel/0/error").unwrap();
    assert!(err.contains("ring-ref"), "{err}");
    w.open_channel(1, 2);
    w.guest.write(&w.f("channel/1/mode"), "turbo").unwrap();
    b.scan_frontend(DEV).unwrap();
    assert!(w.b("channel/1/error").unwrap().contains("mode"));
    w.open_channel(2, 2);
    w.guest.write(&w.f("channel/2/mode"), "mediated").unwrap();
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.b("channel/2/state").as_deref(), Some("4"));
    assert_eq!(
        w.opened.lock().unwrap()[0].mode,
        crate::device::ChannelMode::Mediated
    );
}

#[test]
fn channel_quota_is_enforced_with_a_clear_error() {
    let (w, mut b) = World::started(Quotas {
        max_channels: 1,
        ..Quotas::default()
    });
    w.connect(&mut b, &[0, 1]);
    assert_eq!(w.b("channel/0/state").as_deref(), Some("4"));
    assert_eq!(w.b("channel/1/state").as_deref(), Some("6"));
    let err = w.b("channel/1/error").unwrap();
    assert!(err.contains("max-channels"), "{err}");
    assert_eq!(b.account(DEV).unwrap().usage().get(Resource::Channels), 1);
}

#[test]
fn opener_failure_is_the_channel_error() {
    let w = World::new(Quotas::default());
    let mut b = w.backend_with(Some("cannot map grant 77 of domain 5"));
    b.scan().unwrap();
    w.connect(&mut b, &[0]);
    assert_eq!(w.b("channel/0/state").as_deref(), Some("6"));
    assert!(w.b("channel/0/error").unwrap().contains("grant 77"));
    assert!(b.account(DEV).unwrap().usage().is_zero());
}

#[test]
fn detach_closes_channels_then_the_device() {
    let (w, mut b) = World::started(Quotas::default());
    w.connect(&mut b, &[0]);
    let paths = toolstack::begin_detach(&*w.dom0, D, B, 0).unwrap();
    b.on_backend_path(&format!("{}/state", paths.backend))
        .unwrap();
    assert_eq!(w.b("channel/0/state").as_deref(), Some("6"));
    assert_eq!(w.b("channel/0/error").as_deref(), Some("device detached"));
    assert_eq!(w.b("state").as_deref(), Some("6"));
    assert_eq!(w.closed(), vec![(0, CloseReason::Detached)]);
    assert!(toolstack::wait_backend_closed(&*w.dom0, &paths, std::time::Duration::ZERO).unwrap());
    toolstack::finish_detach(&*w.dom0, &paths).unwrap();
    b.scan().unwrap();
    assert!(b.devices().is_empty());
    assert_eq!(w.closed().len(), 1);
}

#[test]
fn domain_release_reclaims_everything() {
    let (w, mut b) = World::started(Quotas::default());
    w.connect(&mut b, &[0, 1]);
    assert_eq!(b.live_channels(DEV), vec![0, 1]);
    w.server.release_domain(D).unwrap();
    assert!(!w.dom0.exists(&device_frontend_path(DEV)).unwrap());
    b.on_release_domain().unwrap();
    assert_eq!(
        w.closed(),
        vec![(0, CloseReason::DomainGone), (1, CloseReason::DomainGone)]
    );
    assert!(b.live_channels(DEV).is_empty());
    assert_eq!(w.b("state").as_deref(), Some("6"));
    assert_eq!(w.b("channel"), None);
    b.publish_stats(DEV).unwrap();
    assert_eq!(w.s("channels").as_deref(), Some("0"));
}

#[test]
fn restarted_backend_closes_stale_channels_and_republishes() {
    let w = World::new(Quotas::default());
    {
        let mut b = w.backend();
        b.scan().unwrap();
        w.guest.write(&w.f("state"), "4").unwrap();
        w.open_channel(0, 2);
        b.scan_frontend(DEV).unwrap();
        assert_eq!(w.b("state").as_deref(), Some("4"));
        // The backend dies: its record goes without any XenStore write.
    }
    let mut b = w.backend();
    b.scan().unwrap();
    assert_eq!(w.b("channel/0/state").as_deref(), Some("6"));
    assert_eq!(w.b("channel/0/error").as_deref(), Some("backend restarted"));
    // InitWait was republished and the present frontend got Connected again.
    assert_eq!(w.b("state").as_deref(), Some("4"));
    assert_eq!(w.b("versions").as_deref(), Some("1"));
    assert_eq!(
        w.opened.lock().unwrap().len(),
        1,
        "the stale channel is not reconnected"
    );
    // The process opens a new channel and it works; the stale one goes when removed.
    w.connect(&mut b, &[1]);
    assert_eq!(w.b("channel/1/state").as_deref(), Some("4"));
    w.guest.rm(&w.f("channel/0")).unwrap();
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.b("channel/0/state"), None);
}

#[test]
fn shutdown_closes_every_channel_politely() {
    let (w, mut b) = World::started(Quotas::default());
    w.connect(&mut b, &[0]);
    b.shutdown();
    assert_eq!(w.closed(), vec![(0, CloseReason::Shutdown)]);
    assert_eq!(w.b("channel/0/state").as_deref(), Some("6"));
    assert_eq!(w.b("channel/0/error").as_deref(), Some("backend stopped"));
    assert_eq!(w.b("state").as_deref(), Some("6"));
}

#[test]
fn a_dead_process_loses_its_channel_and_nodes() {
    let (w, mut b) = World::started(Quotas::default());
    w.connect(&mut b, &[0]);
    b.channel_fault(DEV, 0, ChannelFault::Died).unwrap();
    assert_eq!(w.closed(), vec![(0, CloseReason::ProcessDied)]);
    assert!(!w.dom0.exists(&w.f("channel/0")).unwrap());
    assert_eq!(w.b("channel/0/state"), None);
    assert!(b.account(DEV).unwrap().usage().is_zero());
    // A protocol error closes with the sentence.
    w.connect(&mut b, &[1]);
    b.channel_fault(DEV, 1, ChannelFault::Protocol("ring overflow".into()))
        .unwrap();
    assert_eq!(w.b("channel/1/state").as_deref(), Some("6"));
    assert!(w.b("channel/1/error").unwrap().contains("ring overflow"));
}

#[test]
fn quotas_come_from_the_backend_node() {
    let (w, mut b) = World::started(Quotas {
        max_qps: 3,
        ..Quotas::default()
    });
    w.connect(&mut b, &[0]);
    assert_eq!(b.account(DEV).unwrap().quotas().max_qps, 3);
    // The toolstack may change them; the next channel sees the change.
    w.dom0
        .write(&format!("{}/max-qps", device_backend_path(B, DEV)), "5")
        .unwrap();
    w.connect(&mut b, &[1]);
    assert_eq!(b.account(DEV).unwrap().quotas().max_qps, 5);
}

#[test]
fn a_frontend_that_never_existed_is_not_served_wrongly() {
    let w = World::new(Quotas::default());
    // A node written by hand with a frontend path of another domain is ignored.
    let bad = DeviceId { domid: 6, devid: 1 };
    let p = device_backend_path(B, bad);
    w.dom0
        .write(&format!("{p}/frontend"), "/local/domain/5/device/vrdma/0")
        .unwrap();
    w.dom0.write(&format!("{p}/frontend-id"), "6").unwrap();
    w.dom0.write(&format!("{p}/state"), "1").unwrap();
    let mut b = w.backend();
    b.scan().unwrap();
    assert_eq!(b.devices(), vec![DEV]);
    assert_eq!(w.dom0.read_string(&format!("{p}/state")).unwrap(), "1");
}

/// Watch events coalesce: the backend may see a channel index come back as a new instance
/// (another nonce) without ever seeing the old node gone. The new instance is served — the
/// old one's Closed record (or live link) does not shadow it — and every answer echoes the
/// nonce of the instance it answers.
#[test]
fn a_new_instance_at_a_reused_index_is_served_even_if_the_removal_was_missed() {
    let (w, mut b) = World::started(Quotas::default());
    w.open_channel_instance(0, "one");
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.b("channel/0/state").as_deref(), Some("4"));
    assert_eq!(w.b("channel/0/nonce").as_deref(), Some("one"));
    // Closed politely; the frontend removes its node and a new instance takes index 0, all
    // before the backend looks again.
    w.guest.write(&w.f("channel/0/state"), "5").unwrap();
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.b("channel/0/state").as_deref(), Some("6"));
    assert_eq!(w.b("channel/0/nonce").as_deref(), Some("one"));
    w.guest.rm(&w.f("channel/0")).unwrap();
    w.open_channel_instance(0, "two");
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.b("channel/0/state").as_deref(), Some("4"));
    assert_eq!(w.b("channel/0/nonce").as_deref(), Some("two"));
    assert_eq!(w.opened.lock().unwrap().len(), 2);

    // A live instance whose removal was missed: its link is closed, the new one served.
    w.guest.rm(&w.f("channel/0")).unwrap();
    w.open_channel_instance(0, "three");
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.b("channel/0/state").as_deref(), Some("4"));
    assert_eq!(w.b("channel/0/nonce").as_deref(), Some("three"));
    assert_eq!(w.opened.lock().unwrap().len(), 3);
    assert_eq!(
        w.closed(),
        vec![(0, CloseReason::Frontend), (0, CloseReason::Frontend)]
    );
    b.publish_stats(DEV).unwrap();
    assert_eq!(w.s("channels").as_deref(), Some("1"));
    // A refusal carries the nonce too, and no stale error survives into a later answer.
    w.guest.rm(&w.f("channel/0")).unwrap();
    w.open_channel(0, 9);
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.b("channel/0/state").as_deref(), Some("6"));
    assert_eq!(w.b("channel/0/nonce"), None);
    assert!(w.b("channel/0/error").unwrap().contains("version 9"));
    w.guest.rm(&w.f("channel/0")).unwrap();
    w.open_channel_instance(0, "four");
    b.scan_frontend(DEV).unwrap();
    assert_eq!(w.b("channel/0/state").as_deref(), Some("4"));
    assert_eq!(w.b("channel/0/error"), None);
}
