//! The library bench's real set-up, shared by `benches/roundtrip.rs` and `examples/lib_costs.rs`:
//! the `vrdma-backend` daemon (control service, quotas, xenbus) with a `SoftDevice` (one engine
//! thread) in dom0 of a simulated host in this process, attached with the toolstack code; a
//! guest context in domain 1 with two QPs connected to each other through the engine and two
//! 4 KiB regions (`src`, `dst`) for a WRITE from `q1` into `dst`, completed on `cq`.

use std::sync::Arc;
use std::thread::JoinHandle;

use vrdma::{
    AccessFlags, CompletionQueue, Context, MemoryRegion, Mode, ProtectionDomain, QueuePair,
};
use vrdma_backend::control::ControlOpener;
use vrdma_backend::daemon::{self, Daemon, ShutdownHandle};
use vrdma_backend::device::{Device, EngineConfig, SoftDevice};
use vrdma_backend::resources::Quotas;
use xen_platform::sim::{SimHost, SimHostConfig};
use xen_platform::{DomId, Platform, PlatformKind};

/// Stops the daemon and waits for it when dropped.
struct DaemonGuard {
    shutdown: ShutdownHandle,
    thread: Option<JoinHandle<Result<(), daemon::DaemonError>>>,
}

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        self.shutdown.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Two connected QPs of one guest through the real daemon (the `_` fields are only kept
/// alive). Fields drop in order: the guest's objects, then the daemon (stopped and joined),
/// then the simulated host and its directory.
pub struct RealPair {
    pub q1: QueuePair,
    _q2: QueuePair,
    pub cq: CompletionQueue,
    _cq2: CompletionQueue,
    pub src: MemoryRegion,
    pub dst: MemoryRegion,
    _pd: ProtectionDomain,
    _ctx: Context,
    _daemon: DaemonGuard,
    _host: SimHost,
    _tmp: tempfile::TempDir,
}

impl RealPair {
    /// Starts the host, the daemon and the guest's context in `mode`, and connects the QPs.
    pub fn start(mode: Mode) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("vb")
            .tempdir_in("/tmp")
            .unwrap();
        let host = SimHost::start(SimHostConfig::new(tmp.path())).unwrap();
        let platform = |d: DomId| {
            Platform::open(PlatformKind::Sim {
                dir: host.dir().to_path_buf(),
                domid: d,
            })
            .unwrap()
        };
        let p0 = platform(DomId::DOM0);
        let device: Arc<dyn Device> = Arc::new(SoftDevice::new(EngineConfig::default()).unwrap());
        let d = Daemon::new(
            Arc::new(p0.xenstore().unwrap()),
            0,
            daemon::device_info("soft-iwarp", &device.attrs()),
            Quotas::default(),
            daemon::device_stats_source(device.clone()),
            {
                let (p0, device) = (p0.clone(), device.clone());
                move |faults| Box::new(ControlOpener::new(p0, device, faults))
            },
        );
        let daemon_guard = DaemonGuard {
            shutdown: d.shutdown_handle(),
            thread: Some(std::thread::spawn(move || d.run())),
        };
        let guest = host.create_domain(Some("bench"), None).unwrap();
        let dom0 = p0.xenstore().unwrap();
        vrdma_backend::toolstack::attach_device(
            &dom0,
            u32::from(guest.0),
            0,
            0,
            &Quotas::default(),
        )
        .unwrap();
        let pg = platform(guest);
        let ctx = Context::builder()
            .store(Arc::new(pg.xenstore().unwrap()))
            .platform(pg)
            .mode(mode)
            .open()
            .unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(64).unwrap();
        let cq2 = ctx.create_cq(64).unwrap();
        let mut q1 = pd
            .create_qp(&cq, &cq)
            .sq_size(16)
            .rq_size(16)
            .build()
            .unwrap();
        let mut q2 = pd
            .create_qp(&cq2, &cq2)
            .sq_size(16)
            .rq_size(16)
            .build()
            .unwrap();
        let (e1, e2) = (q1.endpoint(), q2.endpoint());
        std::thread::scope(|s| {
            let a = s.spawn(|| q1.connect(&e2));
            q2.connect(&e1).unwrap();
            a.join().unwrap().unwrap();
        });
        let src = pd.alloc_mr(4096, AccessFlags::ALL).unwrap();
        let dst = pd.alloc_mr(4096, AccessFlags::ALL).unwrap();
        RealPair {
            q1,
            _q2: q2,
            cq,
            _cq2: cq2,
            src,
            dst,
            _pd: pd,
            _ctx: ctx,
            _daemon: daemon_guard,
            _host: host,
            _tmp: tmp,
        }
    }
}
