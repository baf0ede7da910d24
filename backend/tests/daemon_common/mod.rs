//! Shared by the daemon tests: an in-process simulated host with the backend daemon in dom0,
//! and a scripted frontend speaking raw control-ring requests.
#![allow(dead_code)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shared_ring::abi::control::{access, Reply, Request, RequestRepr, ResponseRepr};
use shared_ring::abi::page_dir::PageList;
use shared_ring::{ControlFrontRing, SharedRegion};
use vrdma_backend::control::{ControlOpener, ALIVE_OFFSET};
use vrdma_backend::daemon::{self, Daemon, DaemonError, DaemonMetrics, ShutdownHandle};
use vrdma_backend::device::{Device, EngineConfig, SoftDevice};
use vrdma_backend::resources::Quotas;
use xen_platform::sim::{SimHost, SimHostConfig};
use xen_platform::{Access, DomId, EventChannel, Platform, PlatformKind, SharedPages, UnmapNotify};
use xenstore_proto::client::{Client, NodeOps, XenbusStore};

/// Bound on every wait, so a broken test fails instead of hanging (not a timing assertion).
pub const PATIENCE: Duration = Duration::from_secs(30);

pub fn platform(dir: &std::path::Path, domid: DomId) -> Platform {
    Platform::open(PlatformKind::Sim {
        dir: dir.to_path_buf(),
        domid,
    })
    .unwrap()
}

/// A simulated host with the daemon running as dom0.
pub struct Stack {
    pub _tmp: tempfile::TempDir,
    pub host: SimHost,
    pub dom0: Arc<Client>,
    pub device: Arc<dyn Device>,
    /// The running daemon's counters (XenStore operations, event queue).
    pub metrics: Arc<DaemonMetrics>,
    daemon: Option<(ShutdownHandle, JoinHandle<Result<(), DaemonError>>)>,
}

impl Stack {
    pub fn start() -> Stack {
        Self::start_with_max_grants(xen_platform::sim::DEFAULT_MAX_GRANTS)
    }

    /// A stack whose domains (dom0 too) may grant at most `max_grants` pages each.
    pub fn start_with_max_grants(max_grants: u32) -> Stack {
        let tmp = tempfile::Builder::new()
            .prefix("vd")
            .tempdir_in("/tmp")
            .unwrap();
        let host = SimHost::start(SimHostConfig {
            default_max_grants: max_grants,
            ..SimHostConfig::new(tmp.path())
        })
        .unwrap();
        let p0 = platform(host.dir(), DomId::DOM0);
        let dom0 = Arc::new(p0.xenstore().unwrap());
        let device: Arc<dyn Device> = Arc::new(SoftDevice::new(EngineConfig::default()).unwrap());
        let mut s = Stack {
            _tmp: tmp,
            host,
            dom0,
            device,
            metrics: Arc::default(),
            daemon: None,
        };
        s.start_daemon();
        s
    }

    pub fn start_daemon(&mut self) {
        assert!(self.daemon.is_none());
        let p0 = platform(self.host.dir(), DomId::DOM0);
        let store = Arc::new(p0.xenstore().unwrap());
        let device = self.device.clone();
        let info = daemon::device_info("soft-iwarp", &device.attrs());
        let d = Daemon::new(
            store,
            0,
            info,
            Quotas::default(),
            daemon::device_stats_source(device.clone()),
            move |faults| Box::new(ControlOpener::new(p0, device, faults)),
        );
        let handle = d.shutdown_handle();
        self.metrics = d.metrics();
        let thread = std::thread::spawn(move || d.run());
        self.daemon = Some((handle, thread));
    }

    pub fn stop_daemon(&mut self) {
        if let Some((h, t)) = self.daemon.take() {
            h.shutdown();
            t.join().unwrap().unwrap();
        }
    }

    pub fn new_domain(&self) -> u32 {
        u32::from(self.host.create_domain(None, None).unwrap().0)
    }

    pub fn backend_node(&self, domid: u32, key: &str) -> String {
        format!("/local/domain/0/backend/vrdma/{domid}/0/{key}")
    }

    /// A counter the backend publishes for device 0 of `domid` (`key` is e.g. `pds` or
    /// `qp/<qpn>/ops`).
    pub fn stats_node(&self, domid: u32, key: &str) -> String {
        format!("/local/domain/0/vrdma-stats/{domid}/0/{key}")
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some((h, t)) = self.daemon.take() {
            h.shutdown();
            let _ = t.join();
        }
    }
}

/// Waits (watching) until `path`'s value satisfies `pred` (`None`: the node does not exist).
pub fn wait_for(
    store: &dyn XenbusStore,
    path: &str,
    pred: impl Fn(Option<&str>) -> bool,
) -> Option<String> {
    let mut watch = store.watch(path).unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        let v = store
            .read_opt(path)
            .unwrap()
            .map(|v| String::from_utf8(v).unwrap());
        if pred(v.as_deref()) {
            return v;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "gave up waiting on {path} (last {v:?})");
        let _ = watch.next_event(Some(left)).unwrap();
    }
}

pub fn wait_value(store: &dyn XenbusStore, path: &str, want: &str) {
    wait_for(store, path, |v| v == Some(want));
}

/// A frontend process of domain `domid`, scripted: raw XenStore steps and control requests.
pub struct Frontend {
    pub domid: u32,
    pub platform: Platform,
    pub store: Client,
    pub ring: ControlFrontRing,
    pub ring_page: SharedRegion,
    pub evtchn: EventChannel,
    pub channel: u32,
    next_id: u32,
}

impl Frontend {
    /// Opens channel `n` of device 0 (steps 1–3 of docs/split-driver.md) and waits for the
    /// backend's answer; returns the frontend and the backend channel state it got.
    pub fn open(dir: &std::path::Path, domid: u32, n: u32) -> (Frontend, String) {
        Self::open_with(dir, domid, n, |_| {})
    }

    pub fn open_with(
        dir: &std::path::Path,
        domid: u32,
        n: u32,
        extra: impl FnOnce(&dyn NodeOps),
    ) -> (Frontend, String) {
        let platform = platform(dir, DomId(domid as u16));
        let store = platform.xenstore().unwrap();
        let dev = "device/vrdma/0".to_string();
        let backend = store.read_string(&format!("{dev}/backend")).unwrap();
        wait_for(&store, &format!("{backend}/state"), |v| {
            matches!(v, Some("2") | Some("4"))
        });
        let ch = format!("{dev}/channel/{n}");
        store.write(&format!("{ch}/state"), "1").unwrap();
        let pages: SharedPages = platform
            .share_pages(DomId::DOM0, 1, Access::ReadWrite)
            .unwrap();
        let gref = pages.grant_refs()[0];
        let evtchn = platform.alloc_unbound(DomId::DOM0).unwrap();
        pages
            .set_unmap_notify(UnmapNotify {
                clear_byte: Some(ALIVE_OFFSET),
                event: Some(evtchn.local_port()),
            })
            .unwrap();
        let ring_page = pages.into_region().unwrap();
        let ring = ControlFrontRing::init(ring_page.clone()).unwrap();
        ring_page
            .store_u32(ALIVE_OFFSET, 1, Ordering::Release)
            .unwrap();
        let port = evtchn.local_port().0;
        let mut extra = Some(extra);
        store
            .transaction(|t| {
                t.write(&format!("{ch}/ring-ref"), gref.0.to_string())?;
                t.write(&format!("{ch}/event-channel"), port.to_string())?;
                t.write(&format!("{ch}/version"), "2")?;
                t.write(&format!("{ch}/pid"), std::process::id().to_string())?;
                if let Some(f) = extra.take() {
                    f(t);
                }
                t.write(&format!("{ch}/state"), "3")
            })
            .unwrap();
        let bstate = wait_for(&store, &format!("{backend}/channel/{n}/state"), |v| {
            matches!(v, Some("4") | Some("6"))
        })
        .unwrap();
        (
            Frontend {
                domid,
                platform,
                store,
                ring,
                ring_page,
                evtchn,
                channel: n,
                next_id: 1,
            },
            bstate,
        )
    }

    /// Sends a request and waits for its response.
    /// `AllocPd`, which must succeed: the new PD's handle.
    pub fn alloc_pd(&mut self) -> u32 {
        match self.call(Request::AllocPd).reply {
            Reply::Handle(h) => h,
            other => panic!("AllocPd: {other:?}"),
        }
    }

    /// Shares `pages` pages with dom0 and registers them (inline page list, all access, iova
    /// 0x1000_0000) in `pd`; returns the pages (keep them alive) and the backend's answer.
    pub fn reg_inline_mr(&mut self, pd: u32, pages: usize) -> (SharedPages, ResponseRepr) {
        let mem = self
            .platform
            .share_pages(DomId::DOM0, pages, Access::ReadWrite)
            .unwrap();
        let grefs: Vec<u32> = mem.grant_refs().iter().map(|g| g.0).collect();
        let r = self.call(Request::RegMr {
            pd,
            access: access::ALL,
            length: (pages * xen_platform::PAGE_SIZE) as u64,
            iova: 0x1000_0000,
            first_page_offset: 0,
            pages: PageList::inline(&grefs).unwrap(),
        });
        (mem, r)
    }

    pub fn call(&mut self, request: Request) -> ResponseRepr {
        let req_id = self.next_id;
        self.next_id += 1;
        let slot = RequestRepr { req_id, request }.to_bytes();
        self.call_raw(&slot)
    }

    /// Sends raw slot bytes and waits for the response.
    pub fn call_raw(&mut self, slot: &[u8; 64]) -> ResponseRepr {
        self.ring.write_request(slot).unwrap();
        if self.ring.push_requests_and_check_notify() {
            self.evtchn.notify().unwrap();
        }
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(rsp) = self.ring.next_response().unwrap() {
                return ResponseRepr::parse(&rsp)
                    .unwrap_or_else(|e| panic!("unparsable response {rsp:?}: {e}"));
            }
            if self.ring.final_check_for_responses().unwrap() {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no response");
            self.evtchn.wait_timeout(Some(left)).unwrap();
        }
    }

    /// The next response without sending anything (a deferred answer).
    pub fn next_response(&mut self) -> ResponseRepr {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(rsp) = self.ring.next_response().unwrap() {
                return ResponseRepr::parse(&rsp).unwrap();
            }
            if self.ring.final_check_for_responses().unwrap() {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no response");
            self.evtchn.wait_timeout(Some(left)).unwrap();
        }
    }
}
