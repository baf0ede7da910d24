//! The control service against hostile requests: random slots never panic and always get a
//! response (or, for `Connect`, a deferred one); quotas are checked before any grant is
//! touched; everything is given back on reclaim.

mod daemon_common;

use std::sync::Arc;

use daemon_common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestRunner};
use shared_ring::abi::control::{
    Op, Reply, Request, RequestRepr, ResponseRepr, Status, CONTROL_SLOT_LEN,
};
use shared_ring::abi::page_dir::PageList;
use vrdma_backend::control::ControlService;
use vrdma_backend::device::{ChannelMode, Device, EngineConfig, SoftDevice};
use vrdma_backend::resources::{Account, Quotas};
use vrdma_backend::xenbus::{CloseReason, DeviceId};
use xen_platform::sim::{SimHost, SimHostConfig};
use xen_platform::{Access, DomId, Platform};

struct Bench {
    _tmp: tempfile::TempDir,
    host: SimHost,
    dom0: Platform,
    guest: Platform,
    domid: u32,
    device: Arc<dyn Device>,
}

impl Bench {
    fn new() -> Bench {
        let tmp = tempfile::Builder::new()
            .prefix("vc")
            .tempdir_in("/tmp")
            .unwrap();
        let host = SimHost::start(SimHostConfig::new(tmp.path())).unwrap();
        let domid = host.create_domain(None, None).unwrap();
        let dom0 = platform(host.dir(), DomId::DOM0);
        let guest = platform(host.dir(), domid);
        Bench {
            _tmp: tmp,
            host,
            dom0,
            guest,
            domid: u32::from(domid.0),
            device: Arc::new(SoftDevice::new(EngineConfig::default()).unwrap()),
        }
    }

    fn service(&self, quotas: Quotas) -> (ControlService, Arc<Account>) {
        let account = Account::new(self.domid, 0, quotas, Box::new(|| {}));
        let svc = ControlService::new(
            DeviceId {
                domid: self.domid,
                devid: 0,
            },
            0,
            self.dom0.clone(),
            self.device.clone(),
            account.clone(),
            ChannelMode::Bypass,
            Arc::new(|| {}),
        );
        (svc, account)
    }
}

fn call(svc: &mut ControlService, req_id: u32, request: Request) -> ResponseRepr {
    let rsp = svc
        .handle(&RequestRepr { req_id, request }.to_bytes())
        .expect("an immediate answer");
    ResponseRepr::parse(&rsp).unwrap()
}

fn handle_of(r: &ResponseRepr) -> u32 {
    match r.reply {
        Reply::Handle(h) => h,
        Reply::Cq { cq, .. } => cq,
        Reply::Qp { qp, .. } => qp,
        Reply::Mr { mr, .. } => mr,
        _ => panic!("no handle in {r:?}"),
    }
}

/// Slots that look like requests: a real op, small handles, arguments from a few bytes.
fn plausible_slot() -> impl Strategy<Value = [u8; CONTROL_SLOT_LEN]> {
    (
        any::<u32>(),
        1u16..=25,
        prop::collection::vec(0u8..4, 56),
        prop::collection::vec(any::<(u8, u8)>(), 0..4),
    )
        .prop_map(|(req_id, op, args, pokes)| {
            let mut b = [0u8; CONTROL_SLOT_LEN];
            b[..4].copy_from_slice(&req_id.to_le_bytes());
            b[4..6].copy_from_slice(&op.to_le_bytes());
            b[8..].copy_from_slice(&args);
            for (at, v) in pokes {
                b[usize::from(at) % CONTROL_SLOT_LEN] = v;
            }
            b
        })
}

fn any_slot() -> impl Strategy<Value = [u8; CONTROL_SLOT_LEN]> {
    prop_oneof![
        prop::array::uniform32(any::<u8>()).prop_flat_map(|lo| {
            prop::array::uniform32(any::<u8>()).prop_map(move |hi| {
                let mut b = [0u8; CONTROL_SLOT_LEN];
                b[..32].copy_from_slice(&lo);
                b[32..].copy_from_slice(&hi);
                b
            })
        }),
        plausible_slot(),
    ]
}

#[test]
fn hostile_slots_always_get_an_answer_and_reclaim_returns_everything() {
    let bench = Bench::new();
    let (mut svc, account) = bench.service(Quotas {
        max_mr_pages: 64,
        ..Quotas::default()
    });
    assert_eq!(
        call(&mut svc, 1, Request::Init { version: 2 }).status,
        Status::Ok
    );
    // Some real objects for the random handles to hit.
    let pd = handle_of(&call(&mut svc, 2, Request::AllocPd));
    let cq = handle_of(&call(&mut svc, 3, Request::CreateCq { cqe_log2: 2 }));
    let r = call(
        &mut svc,
        4,
        Request::CreateQp {
            pd,
            send_cq: cq,
            recv_cq: cq,
            sq_log2: 2,
            rq_log2: 2,
        },
    );
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let mut runner = TestRunner::new(PropConfig {
        cases: 512,
        failure_persistence: None,
        ..PropConfig::default()
    });
    let svc = std::cell::RefCell::new(svc);
    runner
        .run(&prop::collection::vec(any_slot(), 1..16), |slots| {
            for slot in slots {
                let op = u16::from_le_bytes([slot[4], slot[5]]);
                match svc.borrow_mut().handle(&slot) {
                    Some(rsp) => {
                        prop_assert_eq!(&rsp[..4], &slot[..4], "req_id echoed");
                        prop_assert_eq!(&rsp[4..6], &slot[4..6], "op echoed");
                        if Op::from_u16(op).is_ok() {
                            prop_assert!(ResponseRepr::parse(&rsp).is_ok());
                        }
                    }
                    None => prop_assert_eq!(op, Op::Connect as u16, "only Connect is deferred"),
                }
            }
            let _ = svc.borrow_mut().poll_pending();
            Ok(())
        })
        .unwrap();
    let mut svc = svc.into_inner();
    svc.reclaim(&CloseReason::ProcessDied);
    assert!(account.usage().is_zero(), "{:?}", account.usage());
    drop(bench.host);
}

#[test]
fn quotas_are_checked_before_grants_are_touched() {
    let bench = Bench::new();
    let (mut svc, account) = bench.service(Quotas {
        max_pds: 2,
        max_mr_pages: 3,
        max_cqs: 1,
        ..Quotas::default()
    });
    assert_eq!(
        call(&mut svc, 1, Request::Init { version: 2 }).status,
        Status::Ok
    );
    let pd = handle_of(&call(&mut svc, 2, Request::AllocPd));
    assert_eq!(call(&mut svc, 3, Request::AllocPd).status, Status::Ok);
    assert_eq!(
        call(&mut svc, 4, Request::AllocPd).status,
        Status::QuotaExceeded
    );
    // 4 pages of garbage grants: the quota answers, the grants are never mapped.
    let r = call(
        &mut svc,
        5,
        Request::RegMr {
            pd,
            access: 0,
            length: 4 * 4096,
            iova: 0,
            first_page_offset: 0,
            pages: PageList::inline(&[1, 2, 3, 4]).unwrap(),
        },
    );
    assert_eq!(r.status, Status::QuotaExceeded);
    // A directory claiming a million pages: same, no walk.
    let r = call(
        &mut svc,
        6,
        Request::RegMr {
            pd,
            access: 0,
            length: (1 << 20) * 4096,
            iova: 0,
            first_page_offset: 0,
            pages: PageList::Directory {
                n_pages: 1 << 20,
                first_dir_gref: 12345,
            },
        },
    );
    assert_eq!(r.status, Status::QuotaExceeded);
    assert_eq!(
        call(&mut svc, 7, Request::CreateCq { cqe_log2: 2 }).status,
        Status::Ok
    );
    assert_eq!(
        call(&mut svc, 8, Request::CreateCq { cqe_log2: 2 }).status,
        Status::QuotaExceeded
    );
    // A failed registration gives its charge back.
    let r = call(
        &mut svc,
        9,
        Request::RegMr {
            pd,
            access: 0,
            length: 4096,
            iova: 0,
            first_page_offset: 0,
            pages: PageList::inline(&[424_242]).unwrap(),
        },
    );
    assert_eq!(r.status, Status::BadGrant);
    assert_eq!(
        account
            .usage()
            .get(vrdma_backend::resources::Resource::MrPages),
        0
    );
    svc.reclaim(&CloseReason::Frontend);
    assert!(account.usage().is_zero());
}

#[test]
fn a_looping_page_directory_ends() {
    let bench = Bench::new();
    let (mut svc, _account) = bench.service(Quotas::default());
    assert_eq!(
        call(&mut svc, 1, Request::Init { version: 2 }).status,
        Status::Ok
    );
    let pd = handle_of(&call(&mut svc, 2, Request::AllocPd));
    // A directory page whose "next" is itself and whose entries are itself.
    let dir = bench
        .guest
        .share_pages(DomId::DOM0, 1, Access::ReadOnly)
        .unwrap();
    let g = dir.grant_refs()[0].0;
    let region = dir.into_region().unwrap();
    for i in 0..1024 {
        region
            .store_u32(i * 4, g, std::sync::atomic::Ordering::Relaxed)
            .unwrap();
    }
    let r = call(
        &mut svc,
        3,
        Request::RegMr {
            pd,
            access: 0,
            length: 5000 * 4096,
            iova: 0,
            first_page_offset: 0,
            pages: PageList::Directory {
                n_pages: 5000,
                first_dir_gref: g,
            },
        },
    );
    // The walk ends after 5 pages; mapping a read-only grant read-write is refused.
    assert_eq!(r.status, Status::BadGrant);
    drop(region);
}

#[test]
fn requests_before_init_and_bad_versions() {
    let bench = Bench::new();
    let (mut svc, _a) = bench.service(Quotas::default());
    assert_eq!(
        call(&mut svc, 1, Request::QueryDevice).status,
        Status::BadRequest
    );
    assert_eq!(
        call(&mut svc, 2, Request::Init { version: 1 }).status,
        Status::VersionMismatch
    );
    assert_eq!(
        call(&mut svc, 3, Request::Init { version: 2 }).status,
        Status::Ok
    );
    let r = call(&mut svc, 4, Request::QueryDevice);
    let Reply::Device(attrs) = r.reply else {
        panic!("{r:?}")
    };
    assert!(attrs.max_qp > 0 && attrs.max_qp <= Quotas::default().max_qps);
    assert_eq!(
        call(&mut svc, 5, Request::QueryPort { port: 2 }).status,
        Status::InvalidArgument
    );
    assert_eq!(
        call(&mut svc, 6, Request::PollCq { cq: 77 }).status,
        Status::BadHandle
    );
    // The software device has no GID table of its own (the guest library makes GID 0 from
    // the backend's address) and QueryPort's GID stays zero.
    assert_eq!(
        call(&mut svc, 7, Request::QueryGid { port: 1, index: 0 }).status,
        Status::NotSupported
    );
    let r = call(&mut svc, 8, Request::QueryPort { port: 1 });
    assert!(
        matches!(r.reply, Reply::Port { gid, .. } if gid == [0; 16]),
        "{r:?}"
    );
    // An unknown op is answered BadRequest with its req_id and op echoed.
    let mut slot = [0u8; CONTROL_SLOT_LEN];
    slot[..4].copy_from_slice(&99u32.to_le_bytes());
    slot[4] = 200;
    let rsp = svc.handle(&slot).unwrap();
    assert_eq!(&rsp[..6], &slot[..6]);
    assert_eq!(rsp[8], Status::BadRequest as u8);
}

#[test]
fn a_connect_nobody_answers_is_refused_at_its_deadline_whoever_the_remote_is() {
    let bench = Bench::new();
    let (svc, account) = bench.service(Quotas::default());
    let mut svc = svc.with_connect_timeout(std::time::Duration::from_millis(200));
    assert_eq!(
        call(&mut svc, 1, Request::Init { version: 2 }).status,
        Status::Ok
    );
    let pd = handle_of(&call(&mut svc, 2, Request::AllocPd));
    let cq = handle_of(&call(&mut svc, 3, Request::CreateCq { cqe_log2: 2 }));
    let qp = |svc: &mut ControlService, id| {
        handle_of(&call(
            svc,
            id,
            Request::CreateQp {
                pd,
                send_cq: cq,
                recv_cq: cq,
                sq_log2: 2,
                rq_log2: 2,
            },
        ))
    };
    let (a, b) = (qp(&mut svc, 4), qp(&mut svc, 5));
    // `a` names a QP number nobody has; `b` names `a`, which named someone else.
    for (id, (q, remote)) in [(6, (a, a ^ 0x5a5a_5a5a)), (7, (b, a))] {
        let slot = RequestRepr {
            req_id: id,
            request: Request::Connect {
                qp: q,
                port: 0,
                addr: [0; 16],
                remote_qpn: remote,
                private: shared_ring::abi::control::PrivData::NONE,
            },
        }
        .to_bytes();
        assert!(svc.handle(&slot).is_none(), "Connect is answered later");
    }
    assert!(svc.poll_pending().is_empty(), "nothing is due yet");
    let deadline = svc.next_deadline().expect("two connects wait");
    std::thread::sleep(deadline.saturating_duration_since(std::time::Instant::now()));
    let answers: Vec<ResponseRepr> = svc
        .poll_pending()
        .iter()
        .map(|r| ResponseRepr::parse(r).unwrap())
        .collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    for r in &answers {
        assert_eq!(r.op, Op::Connect);
        assert_eq!(r.status, Status::ConnectionRefused, "{r:?}");
    }
    assert!(svc.next_deadline().is_none());
    // The timed-out QPs are in Error: they cannot be paired later.
    let ch = svc.device_channel().expect("initialised");
    for q in [a, b] {
        assert_eq!(
            bench.device.qp_state(ch, vrdma_backend::device::QpNum(q)),
            Ok(shared_ring::abi::control::QpState::Error)
        );
    }
    svc.reclaim(&CloseReason::ProcessDied);
    assert!(account.usage().is_zero(), "{:?}", account.usage());
}
