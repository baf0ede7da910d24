//! The whole backend in one process on an embedded simulated host: the daemon in dom0, a
//! guest domain, and a scripted frontend speaking raw control-ring requests.

mod daemon_common;

use daemon_common::*;
use shared_ring::abi::control::{access, QpState, Reply, Request, Status};
use shared_ring::abi::page_dir::{write_page_list, PageList};
use shared_ring::doorbell::DOORBELL_MAGIC;
use vrdma_backend::resources::Quotas;
use vrdma_backend::toolstack;
use xen_platform::{Access, DomId, GrantRef};

fn attach(s: &Stack, quotas: Quotas) -> u32 {
    let d = s.new_domain();
    toolstack::attach_device(&*s.dom0, d, 0, 0, &quotas).unwrap();
    wait_value(&*s.dom0, &s.backend_node(d, "state"), "2");
    d
}

#[test]
fn init_wait_is_answered_with_versions_kind_and_limits() {
    let s = Stack::start();
    let d = attach(&s, Quotas::default());
    let read = |k: &str| s.dom0.read_string(&s.backend_node(d, k)).unwrap();
    assert_eq!(read("versions"), "2");
    assert_eq!(read("kind"), "soft-iwarp");
    for k in [
        "max-qp-wr",
        "max-cqe",
        "max-sge",
        "max-inline",
        "max-mr-size",
    ] {
        assert!(read(k).parse::<u64>().unwrap() > 0, "{k}");
    }
}

#[test]
fn a_channel_gets_valid_grants_for_everything_it_creates() {
    let mut s = Stack::start();
    let d = attach(
        &s,
        Quotas {
            max_qps: 1,
            ..Quotas::default()
        },
    );
    let (mut fe, st) = Frontend::open(s.host.dir(), d, 0);
    assert_eq!(st, "4");

    // Nothing before Init.
    assert_eq!(fe.call(Request::AllocPd).status, Status::BadRequest);
    let r = fe.call(Request::Init { version: 2 });
    assert_eq!(r.status, Status::Ok);
    let Reply::Init {
        doorbell_gref,
        event_gref,
        doorbell_slots,
        ..
    } = r.reply
    else {
        panic!("{r:?}")
    };
    assert!(doorbell_slots > 0);
    let db = fe
        .platform
        .map_grants(DomId::DOM0, &[GrantRef(doorbell_gref)], Access::ReadWrite)
        .unwrap();
    let db = db.into_region().unwrap();
    assert_eq!(
        db.load_u32(0, std::sync::atomic::Ordering::Acquire)
            .unwrap(),
        DOORBELL_MAGIC
    );
    fe.platform
        .map_grants(DomId::DOM0, &[GrantRef(event_gref)], Access::ReadWrite)
        .unwrap();
    assert_eq!(
        fe.call(Request::Init { version: 2 }).status,
        Status::BadRequest,
        "Init twice"
    );

    let pd = fe.alloc_pd();

    // An MR of 2 pages, inline list.
    let (mem, r) = fe.reg_inline_mr(pd, 2);
    let grefs: Vec<u32> = mem.grant_refs().iter().map(|g| g.0).collect();
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let Reply::Mr { lkey, rkey, .. } = r.reply else {
        panic!()
    };
    assert_ne!(lkey, 0);
    assert_ne!(rkey, 0);

    // An MR of 6 pages listed in a directory page.
    let big = fe
        .platform
        .share_pages(DomId::DOM0, 6, Access::ReadWrite)
        .unwrap();
    let big_grefs: Vec<u32> = big.grant_refs().iter().map(|g| g.0).collect();
    let dir = fe
        .platform
        .share_pages(DomId::DOM0, 1, Access::ReadOnly)
        .unwrap();
    let dir_gref = dir.grant_refs()[0].0;
    // The directory page must stay granted until the backend has read it.
    let dir_regions = [dir.into_region().unwrap()];
    let list = write_page_list(&big_grefs, &dir_regions, &[dir_gref]).unwrap();
    let r = fe.call(Request::RegMr {
        pd,
        access: access::LOCAL_WRITE,
        length: 6 * 4096 - 100,
        iova: 0,
        first_page_offset: 0,
        pages: list,
    });
    assert_eq!(r.status, Status::Ok, "{r:?}");

    // Garbage grants, a wrong page count, a foreign PD.
    let r = fe.call(Request::RegMr {
        pd,
        access: 0,
        length: 4096,
        iova: 0,
        first_page_offset: 0,
        pages: PageList::inline(&[999_999]).unwrap(),
    });
    assert_eq!(r.status, Status::BadGrant);
    let r = fe.call(Request::RegMr {
        pd,
        access: 0,
        length: 3 * 4096,
        iova: 0,
        first_page_offset: 0,
        pages: PageList::inline(&grefs).unwrap(),
    });
    assert_eq!(r.status, Status::InvalidArgument);
    let r = fe.call(Request::RegMr {
        pd: pd + 1000,
        access: 0,
        length: 4096,
        iova: 0,
        first_page_offset: 0,
        pages: PageList::inline(&grefs[..1]).unwrap(),
    });
    assert_eq!(r.status, Status::BadHandle);

    // A CQ and a QP, whose pages the guest can map.
    let r = fe.call(Request::CreateCq { cqe_log2: 8 });
    let Reply::Cq {
        cq,
        pages: cq_pages,
        ..
    } = r.reply
    else {
        panic!("{r:?}")
    };
    let PageList::Inline { n_pages, grefs: g } = cq_pages else {
        panic!()
    };
    let g: Vec<GrantRef> = g[..n_pages as usize].iter().map(|&x| GrantRef(x)).collect();
    fe.platform
        .map_grants(DomId::DOM0, &g, Access::ReadOnly)
        .unwrap();
    let r = fe.call(Request::CreateQp {
        pd,
        send_cq: cq,
        recv_cq: cq,
        sq_log2: 6,
        rq_log2: 6,
    });
    assert_eq!(r.status, Status::Ok, "{r:?}");
    let Reply::Qp {
        qp,
        qp_num,
        sq_slot,
        rq_slot,
        pages: qp_pages,
        ..
    } = r.reply
    else {
        panic!()
    };
    assert_ne!(sq_slot, rq_slot);
    assert_eq!(qp_pages.n_pages(), 2);
    // The quota (max-qps = 1) holds, with its own status.
    let r = fe.call(Request::CreateQp {
        pd,
        send_cq: cq,
        recv_cq: cq,
        sq_log2: 6,
        rq_log2: 6,
    });
    assert_eq!(r.status, Status::QuotaExceeded);
    // In-use objects are Busy; a privileged port is not the guest's to listen on.
    assert_eq!(fe.call(Request::DestroyCq { cq }).status, Status::Busy);
    assert_eq!(fe.call(Request::DeallocPd { pd }).status, Status::Busy);
    assert_eq!(
        fe.call(Request::Listen {
            port: 1,
            backlog: 1,
            addr: [0; 16],
        })
        .status,
        Status::NotPermitted
    );
    assert_eq!(
        fe.call(Request::ModifyQp {
            qp,
            state: QpState::Rtr
        })
        .status,
        Status::Ok
    );
    let _ = qp_num;

    // The counters are in XenStore for the toolstack.
    wait_value(&*s.dom0, &s.stats_node(d, "qps"), "1");
    wait_value(&*s.dom0, &s.stats_node(d, "mrs"), "2");
    wait_value(&*s.dom0, &s.stats_node(d, "mr-pages"), "8");
    wait_value(&*s.dom0, &s.stats_node(d, "channels"), "1");

    // The process dies: its ring page goes, unmap-notify clears the alive byte.
    drop(fe);
    wait_for(&*s.dom0, &s.backend_node(d, "channel/0/state"), |v| {
        v.is_none()
    });
    for k in ["channels", "pds", "mrs", "mr-pages", "cqs", "qps"] {
        wait_value(&*s.dom0, &s.stats_node(d, k), "0");
    }
    assert!(!s
        .dom0
        .exists(&format!("/local/domain/{d}/device/vrdma/0/channel/0"))
        .unwrap());
    s.stop_daemon();
}

#[test]
fn two_guests_connect_their_qps_on_one_host() {
    let s = Stack::start();
    let d1 = attach(&s, Quotas::default());
    let d2 = attach(&s, Quotas::default());
    let mut ends = Vec::new();
    for d in [d1, d2] {
        let (mut fe, st) = Frontend::open(s.host.dir(), d, 0);
        assert_eq!(st, "4");
        assert_eq!(fe.call(Request::Init { version: 2 }).status, Status::Ok);
        let Reply::Handle(pd) = fe.call(Request::AllocPd).reply else {
            panic!()
        };
        let Reply::Cq { cq, .. } = fe.call(Request::CreateCq { cqe_log2: 4 }).reply else {
            panic!()
        };
        let Reply::Qp { qp, qp_num, .. } = fe
            .call(Request::CreateQp {
                pd,
                send_cq: cq,
                recv_cq: cq,
                sq_log2: 4,
                rq_log2: 4,
            })
            .reply
        else {
            panic!()
        };
        ends.push((fe, qp, qp_num));
    }
    let (qpn1, qpn2) = (ends[0].2, ends[1].2);
    let (a, b) = ends.split_at_mut(1);
    let (fe1, qp1, _) = &mut a[0];
    let (fe2, qp2, _) = &mut b[0];
    // The first Connect is answered only once the peer connects too.
    let slot = shared_ring::abi::control::RequestRepr {
        req_id: 500,
        request: Request::Connect {
            qp: *qp1,
            port: 0,
            addr: [0; 16],
            remote_qpn: qpn2,
            private: shared_ring::abi::control::PrivData::NONE,
        },
    }
    .to_bytes();
    fe1.ring.write_request(&slot).unwrap();
    if fe1.ring.push_requests_and_check_notify() {
        fe1.evtchn.notify().unwrap();
    }
    let r2 = fe2.call(Request::Connect {
        qp: *qp2,
        port: 0,
        addr: [0; 16],
        remote_qpn: qpn1,
        private: shared_ring::abi::control::PrivData::NONE,
    });
    assert_eq!(r2.status, Status::Ok);
    let r1 = fe1.next_response();
    assert_eq!((r1.req_id, r1.status), (500, Status::Ok));
    // A Connect to a QP number that does not exist is refused.
    let r = fe1.call(Request::Connect {
        qp: *qp1,
        port: 0,
        addr: [0; 16],
        remote_qpn: 0xdead,
        private: shared_ring::abi::control::PrivData::NONE,
    });
    assert_ne!(r.status, Status::Ok);
}

#[test]
fn ring_index_games_close_the_channel_with_an_error() {
    let s = Stack::start();
    let d = attach(&s, Quotas::default());
    let (mut fe, st) = Frontend::open(s.host.dir(), d, 0);
    assert_eq!(st, "4");
    assert_eq!(fe.call(Request::Init { version: 2 }).status, Status::Ok);
    // req_prod far beyond what the ring holds.
    fe.ring_page
        .store_u32(0, 1000, std::sync::atomic::Ordering::Release)
        .unwrap();
    fe.evtchn.notify().unwrap();
    wait_value(&*s.dom0, &s.backend_node(d, "channel/0/state"), "6");
    let err = s
        .dom0
        .read_string(&s.backend_node(d, "channel/0/error"))
        .unwrap();
    assert!(err.contains("protocol error"), "{err}");
    wait_value(&*s.dom0, &s.stats_node(d, "channels"), "0");
}

#[test]
fn bad_version_and_quota_close_the_channel_with_errors() {
    let s = Stack::start();
    let d = attach(
        &s,
        Quotas {
            max_channels: 1,
            ..Quotas::default()
        },
    );
    let (_fe0, st) = Frontend::open(s.host.dir(), d, 0);
    assert_eq!(st, "4");
    let (_fe1, st) = Frontend::open(s.host.dir(), d, 1);
    assert_eq!(st, "6");
    let err = s
        .dom0
        .read_string(&s.backend_node(d, "channel/1/error"))
        .unwrap();
    assert!(err.contains("max-channels"), "{err}");
    let (_fe2, st) = Frontend::open_with(s.host.dir(), d, 2, |t| {
        t.write("device/vrdma/0/channel/2/mode", b"mediated")
            .unwrap();
    });
    assert_eq!(st, "6", "still over quota");
}

#[test]
fn detach_closes_channels_politely() {
    let s = Stack::start();
    let d = attach(&s, Quotas::default());
    let (mut fe, st) = Frontend::open(s.host.dir(), d, 0);
    assert_eq!(st, "4");
    assert_eq!(fe.call(Request::Init { version: 2 }).status, Status::Ok);
    let closed = toolstack::detach_device(&*s.dom0, d, 0, 0, PATIENCE).unwrap();
    assert!(closed, "the backend answered Closed");
    assert!(!s.dom0.exists(&s.backend_node(d, "state")).unwrap());
}

#[test]
fn domain_destruction_reclaims_everything() {
    let s = Stack::start();
    let d = attach(&s, Quotas::default());
    let (mut fe, st) = Frontend::open(s.host.dir(), d, 0);
    assert_eq!(st, "4");
    assert_eq!(fe.call(Request::Init { version: 2 }).status, Status::Ok);
    assert!(matches!(fe.call(Request::AllocPd).reply, Reply::Handle(_)));
    wait_value(&*s.dom0, &s.stats_node(d, "pds"), "1");
    s.host.destroy_domain(DomId(d as u16)).unwrap();
    wait_value(&*s.dom0, &s.backend_node(d, "state"), "6");
    wait_value(&*s.dom0, &s.stats_node(d, "pds"), "0");
    wait_value(&*s.dom0, &s.stats_node(d, "channels"), "0");
    drop(fe);
}

#[test]
fn a_restarted_backend_serves_the_device_again() {
    let mut s = Stack::start();
    let d = attach(&s, Quotas::default());
    let (fe, st) = Frontend::open(s.host.dir(), d, 0);
    assert_eq!(st, "4");
    s.stop_daemon();
    // SIGTERM etiquette: the channel was closed politely, the device marked Closed.
    assert_eq!(
        s.dom0
            .read_string(&s.backend_node(d, "channel/0/error"))
            .unwrap(),
        "backend stopped"
    );
    assert_eq!(
        s.dom0.read_string(&s.backend_node(d, "state")).unwrap(),
        "6"
    );
    drop(fe);
    s.start_daemon();
    wait_value(&*s.dom0, &s.backend_node(d, "state"), "2");
    let (_fe, st) = Frontend::open(s.host.dir(), d, 1);
    assert_eq!(st, "4");
}
