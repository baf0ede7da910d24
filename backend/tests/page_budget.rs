//! Pages are bounded per guest (issue 10, items 2 and 11): one guest exhausting its page
//! budget leaves every other guest able to work; the refusal names the knob; a configuration
//! that oversubscribes the host is refused at start; CQ rings are read-only for the guest; a
//! reused doorbell slot starts clean.

mod daemon_common;

use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use daemon_common::*;
use shared_ring::abi::control::{Reply, Request, ResponseRepr, Status};
use shared_ring::abi::page_dir::PageList;
use shared_ring::SharedRegion;
use vrdma_backend::control::ControlService;
use vrdma_backend::device::testkit::TestChannel;
use vrdma_backend::device::{ChannelMode, CqSetup, Device, EngineConfig, SoftDevice};
use vrdma_backend::resources::budget::{BudgetLimits, HostBudget, Pool};
use vrdma_backend::resources::{Account, Quotas, Resource};
use vrdma_backend::toolstack;
use vrdma_backend::xenbus::{CloseReason, DeviceId};
use xen_platform::sim::{SimHost, SimHostConfig};
use xen_platform::{Access, DomId, GrantRef, PAGE_SIZE};

fn attach(s: &Stack) -> u32 {
    let d = s.new_domain();
    toolstack::attach_device(&*s.dom0, d, 0, 0, &Quotas::default()).unwrap();
    wait_value(&*s.dom0, &s.backend_node(d, "state"), "2");
    d
}

fn open(s: &Stack, d: u32) -> Frontend {
    let (mut f, state) = Frontend::open(s.host.dir(), d, 0);
    assert_eq!(state, "4", "channel connected");
    let r = f.call(Request::Init { version: 2 });
    assert_eq!(r.status, Status::Ok, "Init of domain {d}: {r:?}");
    f
}

fn cq_handle(r: &ResponseRepr) -> u32 {
    match r.reply {
        Reply::Cq { cq, .. } => cq,
        _ => panic!("no CQ in {r:?}"),
    }
}

/// dom0 may grant 400 pages on this host; with the default `[host] guests = 8` a domain gets
/// 50 of them. Guest A asks for CQ after CQ (4 pages each); before page budgets it took all
/// 400 and guest B could not even `Init`.
#[test]
fn a_guest_exhausting_its_pages_leaves_the_others_working() {
    let s = Stack::start_with_max_grants(400);
    let a = attach(&s);
    let b = attach(&s);
    let mut fa = open(&s, a);
    let mut refused = None;
    for _ in 0..200 {
        let r = fa.call(Request::CreateCq { cqe_log2: 9 });
        if r.status != Status::Ok {
            refused = Some(r.status);
            break;
        }
    }
    assert_eq!(
        refused,
        Some(Status::QuotaExceeded),
        "guest A is stopped by its budget, not by the host running dry"
    );
    let used: u64 = s
        .dom0
        .read_string(&s.stats_node(a, "granted-pages"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        used <= 50,
        "A holds {used} granted pages, more than its share of 50"
    );

    // B: Init, CreateCq, CreateQp and RegMr all work.
    let mut fb = open(&s, b);
    let pd = fb.alloc_pd();
    let cq = cq_handle(&fb.call(Request::CreateCq { cqe_log2: 9 }));
    let r = fb.call(Request::CreateQp {
        pd,
        send_cq: cq,
        recv_cq: cq,
        sq_log2: 6,
        rq_log2: 6,
    });
    assert_eq!(r.status, Status::Ok, "B's CreateQp: {r:?}");
    let (_mem, r) = fb.reg_inline_mr(pd, 4);
    assert_eq!(r.status, Status::Ok, "B's RegMr: {r:?}");
}

/// The control service on a simulated host with a guest, charging a given host budget.
struct Bench {
    _tmp: tempfile::TempDir,
    host: SimHost,
    dom0: xen_platform::Platform,
    guests: Vec<(u32, xen_platform::Platform)>,
    device: Arc<dyn Device>,
    budget: Arc<HostBudget>,
}

impl Bench {
    fn new(limits: BudgetLimits) -> Bench {
        let tmp = tempfile::Builder::new()
            .prefix("vb")
            .tempdir_in("/tmp")
            .unwrap();
        let host = SimHost::start(SimHostConfig::new(tmp.path())).unwrap();
        let dom0 = platform(host.dir(), DomId::DOM0);
        let guests = (0..2)
            .map(|_| {
                let d = host.create_domain(None, None).unwrap();
                (u32::from(d.0), platform(host.dir(), d))
            })
            .collect();
        Bench {
            _tmp: tmp,
            host,
            dom0,
            guests,
            device: Arc::new(SoftDevice::new(EngineConfig::default()).unwrap()),
            budget: Arc::new(HostBudget::new(limits)),
        }
    }

    fn service(&self, guest: usize, quotas: Quotas) -> (ControlService, Arc<Account>) {
        let domid = self.guests[guest].0;
        let account = Account::new(domid, 0, quotas, Box::new(|| {}));
        let svc = ControlService::new(
            DeviceId { domid, devid: 0 },
            0,
            self.dom0.clone(),
            self.device.clone(),
            account.clone(),
            ChannelMode::Bypass,
            Arc::new(|| {}),
        )
        .with_budget(self.budget.clone());
        (svc, account)
    }
}

fn call(svc: &mut ControlService, req_id: u32, request: Request) -> ResponseRepr {
    let slot = shared_ring::abi::control::RequestRepr { req_id, request }.to_bytes();
    ResponseRepr::parse(&svc.handle(&slot).expect("an immediate answer")).unwrap()
}

#[test]
fn the_refusal_names_the_knob_and_reclaim_gives_every_page_back() {
    let bench = Bench::new(BudgetLimits {
        granted_pages: 40,
        mapped_pages: 1000,
        guests: 2,
    });
    // Per-device quota first: 10 granted pages.
    let (mut svc, account) = bench.service(
        0,
        Quotas {
            max_granted_pages: 10,
            ..Quotas::default()
        },
    );
    assert_eq!(
        call(&mut svc, 1, Request::Init { version: 2 }).status,
        Status::Ok
    );
    assert_eq!(account.usage().get(Resource::GrantedPages), 2);
    // 512 CQEs of 32 bytes: 4 pages each; the third does not fit in 10.
    for id in 2..4 {
        assert_eq!(
            call(&mut svc, id, Request::CreateCq { cqe_log2: 9 }).status,
            Status::Ok
        );
    }
    let r = call(&mut svc, 4, Request::CreateCq { cqe_log2: 9 });
    assert_eq!(r.status, Status::QuotaExceeded);
    let why = svc.last_refusal().unwrap().to_owned();
    assert!(why.contains("max-granted-pages"), "{why}");
    assert_eq!(svc.granted_pages(), 10);

    // The domain's share of the host budget next: 40 / 2 guests = 20 pages.
    let (mut svc2, _) = bench.service(
        0,
        Quotas {
            max_granted_pages: 1000,
            ..Quotas::default()
        },
    );
    assert_eq!(
        call(&mut svc2, 1, Request::Init { version: 2 }).status,
        Status::Ok
    );
    assert_eq!(
        call(&mut svc2, 2, Request::CreateCq { cqe_log2: 9 }).status,
        Status::Ok
    );
    // The domain holds 10 + 2 + 4 = 16; 4 more make 20, the share; the next 4 do not fit.
    assert_eq!(
        call(&mut svc2, 3, Request::CreateCq { cqe_log2: 9 }).status,
        Status::Ok
    );
    let r = call(&mut svc2, 4, Request::CreateCq { cqe_log2: 9 });
    assert_eq!(r.status, Status::QuotaExceeded);
    let why = svc2.last_refusal().unwrap().to_owned();
    assert!(
        why.contains("[host] granted-pages") && why.contains("[host] guests"),
        "{why}"
    );
    assert_eq!(bench.budget.used_by(bench.guests[0].0, Pool::Granted), 20);

    // The other guest still has its whole share.
    let (mut other, _) = bench.service(1, Quotas::default());
    assert_eq!(
        call(&mut other, 1, Request::Init { version: 2 }).status,
        Status::Ok
    );
    assert_eq!(
        call(&mut other, 2, Request::CreateCq { cqe_log2: 9 }).status,
        Status::Ok
    );

    // Mapped pages: the share is 500; a 600-page MR is refused naming its knob.
    let pd = match call(&mut other, 3, Request::AllocPd).reply {
        Reply::Handle(h) => h,
        r => panic!("{r:?}"),
    };
    // The budget answers before any grant is touched: the directory grant is never mapped.
    let list = shared_ring::abi::page_dir::PageList::Directory {
        n_pages: 600,
        first_dir_gref: 424_242,
    };
    let r = call(
        &mut other,
        4,
        Request::RegMr {
            pd,
            access: 0,
            length: 600 * PAGE_SIZE as u64,
            iova: 0,
            first_page_offset: 0,
            pages: list,
        },
    );
    assert_eq!(r.status, Status::QuotaExceeded, "{r:?}");
    let why = other.last_refusal().unwrap().to_owned();
    assert!(why.contains("[host] mapped-pages"), "{why}");

    // Reclaim gives everything back, to the device's account and to the host.
    svc.reclaim(&CloseReason::ProcessDied);
    svc2.reclaim(&CloseReason::ProcessDied);
    other.reclaim(&CloseReason::ProcessDied);
    assert!(account.usage().is_zero(), "{:?}", account.usage());
    assert_eq!(bench.budget.used(Pool::Granted), 0);
    assert_eq!(bench.budget.used(Pool::Mapped), 0);
    drop(bench.host);
}

/// The guest only polls its CQ: the grant is read-only, so the simulated host refuses a
/// read-write mapping (a guest store into its CQ page cannot happen), while a read-only one
/// works.
#[test]
fn cq_rings_are_granted_read_only() {
    let bench = Bench::new(BudgetLimits::UNLIMITED);
    let (mut svc, _) = bench.service(0, Quotas::default());
    assert_eq!(
        call(&mut svc, 1, Request::Init { version: 2 }).status,
        Status::Ok
    );
    let r = call(&mut svc, 2, Request::CreateCq { cqe_log2: 4 });
    let Reply::Cq {
        pages: PageList::Inline { grefs, .. },
        ..
    } = r.reply
    else {
        panic!("{r:?}")
    };
    let gref = GrantRef(grefs[0]);
    let guest = &bench.guests[0].1;
    let e = guest
        .map_grants(DomId::DOM0, &[gref], Access::ReadWrite)
        .expect_err("a read-write mapping of the CQ ring");
    assert!(e.to_string().contains("read-only"), "{e}");
    guest
        .map_grants(DomId::DOM0, &[gref], Access::ReadOnly)
        .expect("the CQ ring maps read-only");
    svc.reclaim(&CloseReason::ProcessDied);
}

/// A CQ's doorbell slot, reused by the next CQ, starts with arm word and consumer index 0.
#[test]
fn a_reused_doorbell_slot_starts_clean() {
    {
        let dev = SoftDevice::new(EngineConfig::default()).unwrap();
        let ch = TestChannel::open(&dev, 1, ChannelMode::Bypass);
        let setup = || CqSetup {
            ring: SharedRegion::alloc(PAGE_SIZE).unwrap(),
            cqe_log2: 2,
            doorbell_slot: 3,
        };
        let cq = dev.create_cq(ch.id, setup()).unwrap();
        let words = ch.db.cq(3).unwrap();
        words.arm.store(0x55, Ordering::SeqCst);
        words.cons.store(7, Ordering::SeqCst);
        dev.destroy_cq(ch.id, cq).unwrap();
        dev.create_cq(ch.id, setup()).unwrap();
        assert_eq!(
            words.arm.load(Ordering::SeqCst),
            0,
            "arm word of a reused slot"
        );
        assert_eq!(
            words.cons.load(Ordering::SeqCst),
            0,
            "consumer index of a reused slot"
        );
    }
}

/// A configuration granting more than the host allows is refused at start, naming both the
/// configuration key and the host's knob.
#[test]
fn an_oversubscribing_config_is_refused_at_start() {
    let tmp = tempfile::Builder::new()
        .prefix("vo")
        .tempdir_in("/tmp")
        .unwrap();
    let host = SimHost::start(SimHostConfig {
        default_max_grants: 1000,
        ..SimHostConfig::new(tmp.path().join("host"))
    })
    .unwrap();
    let cfg = tmp.path().join("backend.toml");
    std::fs::write(&cfg, "[host]\ngranted-pages = 1001\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vrdma-backend"))
        .arg("--config")
        .arg(&cfg)
        .arg("--sim")
        .arg(host.dir())
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the backend started: {err}");
    assert!(
        err.contains("[host] granted-pages = 1001") && err.contains("--max-grants"),
        "{err}"
    );
    drop(host);
}
