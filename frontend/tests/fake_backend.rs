//! The frontend against a scripted fake backend on a simulated host in this process: the
//! XenStore handshake, the control client, the bypass post/poll path (no notification to a
//! busy engine, exactly one per sleep), mediated posts, the registration cache, errors and the
//! polite close.

mod common;

use std::time::Duration;

use common::{FakeBackend, World};
use shared_ring::abi::cqe::{CqeOpcode, CqeRepr, CqeStatus};
use shared_ring::abi::wqe::{WqeData, WqeOpcode, WqeRepr};
use vrdma::{AccessFlags, Context, Mode, Op, Status, WorkCompletion};
use xenstore_proto::client::NodeOps;

fn open(w: &World, mode: Mode) -> Context {
    Context::builder()
        .platform(w.guest_platform())
        .store(w.guest_store())
        .mode(mode)
        .timeout(Duration::from_secs(10))
        .open()
        .expect("open the device")
}

#[test]
fn handshake_publishes_the_channel_and_close_is_polite() {
    let w = World::new();
    w.attach();
    let be = FakeBackend::start(&w);
    let ctx = open(&w, Mode::Bypass);
    assert_eq!(ctx.domid(), w.guest);
    assert_eq!(ctx.channel(), 0);
    let fchan = format!("{}/channel/0", w.front_dir());
    let s = &w.dom0_store;
    assert_eq!(s.read_string(&format!("{fchan}/state")).unwrap(), "3");
    assert_eq!(s.read_string(&format!("{fchan}/version")).unwrap(), "2");
    assert_eq!(
        s.read_string(&format!("{fchan}/pid")).unwrap(),
        std::process::id().to_string()
    );
    assert_eq!(
        s.read_string(&format!("{}/state", w.front_dir())).unwrap(),
        "4"
    );
    assert!(s.read_u32(&format!("{fchan}/ring-ref")).is_ok());
    assert!(s.read_u32(&format!("{fchan}/event-channel")).is_ok());
    assert_eq!(be.state.lock().unwrap().ops, vec![Op::Init]);
    drop(ctx);
    assert!(be.state.lock().unwrap().closed, "backend saw Closing");
    assert!(
        !s.exists(&fchan).unwrap(),
        "the frontend removed its channel directory"
    );
}

/// `Context::query_gids`: the backend's GID table entry by entry (a verbs device), or `None`
/// when the backend has none of its own (the software device answers `NotSupported`).
#[test]
fn the_gid_table_is_the_backend_s() {
    let w = World::new();
    w.attach();
    let be = FakeBackend::start(&w);
    let ctx = open(&w, Mode::Bypass);
    assert_eq!(ctx.query_gids().unwrap(), None);
    let mut v4 = [0u8; 16];
    v4[10] = 0xff;
    v4[11] = 0xff;
    v4[12..].copy_from_slice(&[10, 77, 0, 1]);
    let mut ll = [0u8; 16];
    ll[0] = 0xfe;
    ll[1] = 0x80;
    ll[15] = 1;
    let table = vec![(v4, 2), (ll, 1), (ll, 2)];
    be.state.lock().unwrap().gids = Some(table.clone());
    assert_eq!(ctx.query_gids().unwrap(), Some(table));
    let ops = be.state.lock().unwrap().ops.clone();
    assert_eq!(ops.iter().filter(|o| **o == Op::QueryGid).count(), 4);
}

#[test]
fn missing_device_and_refused_channel_are_clear_errors() {
    let w = World::new();
    let e = Context::builder()
        .platform(w.guest_platform())
        .store(w.guest_store())
        .open()
        .unwrap_err();
    assert!(matches!(e, vrdma::Error::NoDevice { .. }), "{e}");
    w.attach();
    // No backend: InitWait never comes.
    let e = Context::builder()
        .platform(w.guest_platform())
        .store(w.guest_store())
        .timeout(Duration::from_millis(300))
        .open()
        .unwrap_err();
    assert!(matches!(e, vrdma::Error::Timeout { .. }), "{e}");
    // A backend that refuses the channel.
    let s = &w.dom0_store;
    s.write(&format!("{}/state", w.back_dir()), "2").unwrap();
    let back = w.back_dir();
    let refuser = {
        let store =
            xenstore_proto::client::Client::from_unix_stream(w.xs.connect(0).unwrap()).unwrap();
        let fnode = format!("{}/channel/0", w.front_dir());
        let fchan = format!("{fnode}/state");
        std::thread::spawn(move || {
            for _ in 0..2000 {
                if store.read_opt(&fchan).unwrap().as_deref() == Some(b"3") {
                    // The answer echoes the channel's nonce (docs/split-driver.md).
                    let nonce = store.read_opt(&format!("{fnode}/nonce")).unwrap().unwrap();
                    store
                        .transaction(|t| {
                            t.write(
                                &format!("{back}/channel/0/error"),
                                "max-channels (1) reached",
                            )?;
                            t.write(&format!("{back}/channel/0/nonce"), &nonce)?;
                            t.write(&format!("{back}/channel/0/state"), "6")
                        })
                        .unwrap();
                    return;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let e = Context::builder()
        .platform(w.guest_platform())
        .store(w.guest_store())
        .open()
        .unwrap_err();
    refuser.join().unwrap();
    match e {
        vrdma::Error::ChannelRefused { reason, .. } => assert!(reason.contains("max-channels")),
        e => panic!("{e}"),
    }
    assert!(!s.exists(&format!("{}/channel/0", w.front_dir())).unwrap());
}

#[test]
fn bypass_post_writes_wqes_and_kicks_only_a_sleeping_engine() {
    let w = World::new();
    w.attach();
    let be = FakeBackend::start(&w);
    let ctx = open(&w, Mode::Bypass);
    let pd = ctx.alloc_pd().unwrap();
    let mut cq = ctx.create_cq(16).unwrap();
    let mut qp = pd
        .create_qp(&cq, &cq)
        .sq_size(8)
        .rq_size(8)
        .build()
        .unwrap();
    let peer = vrdma::QpEndpoint {
        addr: [0; 16],
        qp_num: 77,
    };
    qp.connect(&peer).unwrap();
    let mr = pd.alloc_mr(100, AccessFlags::ALL).unwrap();
    mr.write(3, b"hello").unwrap();
    let base = ctx.notifications_sent();

    // Engine awake: 100 posts, no notification.
    let h = qp.handle();
    for i in 0..100u64 {
        qp.post_send(&[mr.slice(3..8)], i).unwrap();
        let mut st = be.state.lock().unwrap();
        let q = st.qps.get_mut(&h).unwrap();
        let wqe = WqeRepr::from_bytes(&q.sq.pop().unwrap().unwrap()).unwrap();
        q.sq.release();
        assert_eq!(wqe.opcode, WqeOpcode::Send);
        assert_eq!(wqe.wr_id, i);
        match wqe.data {
            WqeData::Sges { sges, len: 1 } => {
                assert_eq!(
                    (sges[0].offset, sges[0].length, sges[0].lkey),
                    (3, 5, mr.lkey())
                )
            }
            d => panic!("{d:?}"),
        }
    }
    assert_eq!(
        ctx.notifications_sent(),
        base,
        "no kick while the engine is awake"
    );

    // Engine sleeps: the first post kicks, the next ones do not.
    let mut sleep = be
        .state
        .lock()
        .unwrap()
        .doorbell
        .clone()
        .unwrap()
        .engine_sleep()
        .unwrap();
    sleep.prepare_sleep();
    for i in 0..5 {
        qp.post_send_inline(b"inline!", 200 + i).unwrap();
    }
    assert_eq!(
        ctx.notifications_sent(),
        base + 1,
        "one kick per engine sleep"
    );
    {
        let mut st = be.state.lock().unwrap();
        let q = st.qps.get_mut(&h).unwrap();
        let wqe = WqeRepr::from_bytes(&q.sq.pop().unwrap().unwrap()).unwrap();
        assert_eq!(wqe.data, WqeData::inline(b"inline!").unwrap());
        assert_eq!(
            q.connected_to,
            Some((77, [0; 16])),
            "connect carries the peer's QP number"
        );
    }

    // Completions: poll reads them from the CQ pages.
    let cqh = cq.handle();
    {
        let mut st = be.state.lock().unwrap();
        let c = st.cqs.get_mut(&cqh).unwrap();
        for i in 0..3 {
            c.writer
                .write_repr(&CqeRepr {
                    wr_id: i,
                    status: if i == 2 {
                        CqeStatus::RemoteAccessError
                    } else {
                        CqeStatus::Success
                    },
                    opcode: CqeOpcode::Recv,
                    byte_len: 5,
                    imm_data: 0xabc,
                    qp_num: qp.qp_num(),
                    vendor_err: 0,
                    flags: if i == 1 {
                        shared_ring::abi::cqe::flags::WITH_IMM
                    } else {
                        0
                    },
                })
                .unwrap();
        }
    }
    let mut wc = [WorkCompletion::default(); 2];
    let got = cq.poll(&mut wc).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].wr_id, got[0].imm_data), (0, None));
    assert_eq!((got[1].wr_id, got[1].imm_data), (1, Some(0xabc)));
    let got = cq.poll(&mut wc).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].status, CqeStatus::RemoteAccessError);
    assert!(!got[0].is_ok());
    assert!(cq.poll(&mut wc).unwrap().is_empty());
    assert_eq!(ctx.notifications_sent(), base + 1, "polling sends nothing");
}

#[test]
fn blocking_wait_wakes_on_the_event_channel_and_times_out() {
    let w = World::new();
    w.attach();
    let be = FakeBackend::start(&w);
    let ctx = open(&w, Mode::Bypass);
    let mut cq = ctx.create_cq(4).unwrap();
    let mut wc = [WorkCompletion::default(); 4];
    assert!(cq
        .wait(&mut wc, Some(Duration::from_millis(50)))
        .unwrap()
        .is_empty());
    let cqh = cq.handle();
    let state = be.state.clone();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        let mut st = state.lock().unwrap();
        let c = st.cqs.get_mut(&cqh).unwrap();
        c.writer
            .write_repr(&CqeRepr {
                wr_id: 9,
                status: CqeStatus::Success,
                opcode: CqeOpcode::Send,
                byte_len: 0,
                imm_data: 0,
                qp_num: 1,
                vendor_err: 0,
                flags: 0,
            })
            .unwrap();
        if c.writer.notify_needed(false) {
            st.notify();
            true
        } else {
            false
        }
    });
    let got = cq.wait(&mut wc, Some(Duration::from_secs(20))).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].wr_id, 9);
    assert!(writer.join().unwrap(), "the CQ was armed");
}

#[test]
fn mediated_posts_and_polls_go_over_the_control_ring() {
    let w = World::new();
    w.attach();
    let be = FakeBackend::start(&w);
    let ctx = open(&w, Mode::Mediated);
    assert_eq!(ctx.mode(), Mode::Mediated);
    let pd = ctx.alloc_pd().unwrap();
    let mut cq = ctx.create_cq(16).unwrap();
    let mut qp = pd
        .create_qp(&cq, &cq)
        .sq_size(8)
        .rq_size(8)
        .build()
        .unwrap();
    qp.post_send_inline(b"x", 1).unwrap();
    qp.post_send_inline(b"y", 2).unwrap();
    let mut wc = [WorkCompletion::default(); 4];
    assert!(cq.poll(&mut wc).unwrap().is_empty());
    let st = be.state.lock().unwrap();
    assert_eq!(st.qps[&qp.handle()].posted_send, vec![1, 2]);
    let tail: Vec<_> = st.ops.iter().rev().take(3).rev().copied().collect();
    assert_eq!(tail, vec![Op::PostSend, Op::PostSend, Op::PollCq]);
}

#[test]
fn registration_cache_reuses_grants() {
    let w = World::new();
    w.attach();
    let be = FakeBackend::start(&w);
    let ctx = open(&w, Mode::Bypass);
    let pd = ctx.alloc_pd().unwrap();
    let grants = || {
        w.host
            .list_domains()
            .into_iter()
            .find(|d| d.domid == w.guest.0)
            .unwrap()
            .grants
    };
    // Large enough to need a page directory (more than 4 pages).
    let mr = pd.alloc_mr(10 * 4096 - 1, AccessFlags::ALL).unwrap();
    mr.fill(0, mr.len(), 0x5a).unwrap();
    let keys = (mr.lkey(), mr.rkey());
    drop(mr);
    let before = grants();
    let regs = be.state.lock().unwrap().ops.len();
    let mr = pd.alloc_mr(10 * 4096, AccessFlags::ALL).unwrap();
    assert_eq!((mr.lkey(), mr.rkey()), keys, "same registration");
    assert_eq!(grants(), before, "no new grants");
    assert_eq!(
        be.state.lock().unwrap().ops.len(),
        regs,
        "no control request"
    );
    assert!(
        mr.to_vec().iter().all(|&b| b == 0),
        "recycled memory is zeroed"
    );
    let s = pd.mr_cache_stats();
    assert_eq!((s.hits, s.misses), (1, 1));
    drop(mr);
    pd.flush_mr_cache();
    assert!(be.state.lock().unwrap().ops.contains(&Op::DeregMr));
}

#[test]
fn backend_statuses_are_typed_errors() {
    let w = World::new();
    w.attach();
    let be = FakeBackend::start(&w);
    let ctx = open(&w, Mode::Bypass);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4).unwrap();
    be.state.lock().unwrap().quota_qps = Some(1);
    let _qp = pd
        .create_qp(&cq, &cq)
        .sq_size(4)
        .rq_size(4)
        .build()
        .unwrap();
    let e = pd
        .create_qp(&cq, &cq)
        .sq_size(4)
        .rq_size(4)
        .build()
        .unwrap_err();
    assert!(e.is_quota_exceeded(), "{e}");
    assert_eq!(e.status(), Some(Status::QuotaExceeded));
    assert!(e.to_string().contains("max-qps"), "{e}");
    be.state
        .lock()
        .unwrap()
        .fail_next
        .insert(Op::RegMr, Status::NoResources);
    let e = pd.alloc_mr(4096, AccessFlags::ALL).unwrap_err();
    assert_eq!(e.status(), Some(Status::NoResources));
    // Client-side checks.
    let mut qp = _qp;
    let e = qp.post_send_inline(&[0; 33], 1).unwrap_err();
    assert!(matches!(e, vrdma::Error::InvalidArgument(_)), "{e}");
}

#[test]
fn a_full_send_queue_is_an_error_not_an_overwrite() {
    let w = World::new();
    w.attach();
    let _be = FakeBackend::start(&w);
    let ctx = open(&w, Mode::Bypass);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4).unwrap();
    let mut qp = pd
        .create_qp(&cq, &cq)
        .sq_size(4)
        .rq_size(4)
        .build()
        .unwrap();
    for i in 0..4 {
        qp.post_send_inline(b"a", i).unwrap();
    }
    let e = qp.post_send_inline(b"a", 9).unwrap_err();
    assert!(matches!(e, vrdma::Error::QueueFull { size: 4, .. }), "{e}");
}

#[test]
fn a_backend_that_closes_the_channel_is_device_lost() {
    let w = World::new();
    w.attach();
    let be = FakeBackend::start(&w);
    let ctx = open(&w, Mode::Bypass);
    let mut cq = ctx.create_cq(4).unwrap();
    let back = format!("{}/channel/0", w.back_dir());
    w.dom0_store
        .write(&format!("{back}/error"), "backend restarted")
        .unwrap();
    w.dom0_store.write(&format!("{back}/state"), "6").unwrap();
    drop(be);
    let mut wc = [WorkCompletion::default(); 1];
    let e = cq.wait(&mut wc, Some(Duration::from_secs(20))).unwrap_err();
    assert!(e.is_device_lost(), "{e}");
    assert!(e.to_string().contains("backend restarted"), "{e}");
    assert!(cq.poll(&mut wc).unwrap_err().is_device_lost());
}

#[test]
fn a_device_lost_event_is_noticed_by_poll_without_waiting() {
    let w = World::new();
    w.attach();
    let be = FakeBackend::start(&w);
    let ctx = open(&w, Mode::Bypass);
    let mut cq = ctx.create_cq(4).unwrap();
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(cq.poll(&mut wc).unwrap().len(), 0);
    {
        let mut st = be.state.lock().unwrap();
        let ev = shared_ring::abi::event::EventRepr {
            kind: shared_ring::abi::event::EventKind::DeviceLost,
            handle: 0,
            detail: 0,
        };
        let p = st.events.as_mut().expect("Init made the event ring");
        p.write(&ev.to_bytes()).unwrap();
        p.publish();
    }
    // No notification, no wait: the next empty poll sees the event in shared memory.
    let before = ctx.notifications_sent();
    let e = cq.poll(&mut wc).unwrap_err();
    assert!(e.is_device_lost(), "{e}");
    assert_eq!(ctx.notifications_sent(), before);
    drop(be);
}

/// A backend node left by an earlier channel at index 0 (its teardown not yet seen by the
/// backend): a new channel takes a free index instead and is not refused by the leftover.
#[test]
fn a_leftover_backend_node_does_not_refuse_a_new_channel() {
    let w = World::new();
    w.attach();
    let back0 = format!("{}/channel/0", w.back_dir());
    w.dom0_store
        .write(&format!("{back0}/nonce"), "an-earlier-channel")
        .unwrap();
    w.dom0_store.write(&format!("{back0}/state"), "6").unwrap();
    let _be = FakeBackend::start(&w);
    let ctx = open(&w, Mode::Bypass);
    assert_eq!(ctx.channel(), 1, "index 0 is still being torn down");
    let pd = ctx.alloc_pd().unwrap();
    drop(pd);
}

/// The backend's Closed for an earlier channel at the same index, written after the new
/// channel claimed it (a slow backend finishing the old teardown), is not the answer to the
/// new channel: the frontend waits for the answer carrying its own nonce.
#[test]
fn a_late_closed_of_an_earlier_channel_is_not_the_answer() {
    let w = World::new();
    w.attach();
    let s = &w.dom0_store;
    s.write(&format!("{}/versions", w.back_dir()), "2").unwrap();
    s.write(&format!("{}/state", w.back_dir()), "2").unwrap();
    let (platform, store) = (w.guest_platform(), w.guest_store());
    let opener = std::thread::spawn(move || {
        Context::builder()
            .platform(platform)
            .store(store)
            .timeout(Duration::from_secs(20))
            .open()
            .map(|c| c.channel())
    });
    // The backend is slow: channel 0 is Initialised before it writes anything...
    let fstate = format!("{}/channel/0/state", w.front_dir());
    let t0 = std::time::Instant::now();
    while s.read_opt(&fstate).unwrap().as_deref() != Some(b"3") {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "channel 0 never Initialised"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let front_nonce = s
        .read_string(&format!("{}/channel/0/nonce", w.front_dir()))
        .unwrap();
    // ... and then writes Closed (no error) for the earlier channel at index 0.
    let back0 = format!("{}/channel/0", w.back_dir());
    s.transaction(|t| {
        t.write(&format!("{back0}/nonce"), "an-earlier-channel")?;
        t.write(&format!("{back0}/state"), "6")
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !opener.is_finished(),
        "the frontend took the earlier channel's Closed"
    );
    // Now the backend answers the new channel.
    let _be = FakeBackend::start(&w);
    let got = opener.join().unwrap();
    assert_eq!(got.unwrap(), 0);
    assert_eq!(
        s.read_string(&format!("{back0}/nonce")).unwrap(),
        front_nonce,
        "the answer carries the channel's nonce"
    );
}

/// A backend process that goes away (its mapping of the control ring is released: the
/// unmap-notify clears its alive byte and signals) is noticed by a blocked wait and by an
/// empty poll, without any XenStore change.
#[test]
fn a_backend_that_vanishes_is_device_lost_in_wait_and_poll() {
    let w = World::new();
    w.attach();
    let be = FakeBackend::start(&w);
    let ctx = open(&w, Mode::Bypass);
    let mut cq = ctx.create_cq(4).unwrap();
    let mut cq2 = ctx.create_cq(4).unwrap();
    let waiter = std::thread::spawn(move || {
        let mut wc = [WorkCompletion::default(); 1];
        let t = std::time::Instant::now();
        let r = cq
            .wait(&mut wc, Some(Duration::from_secs(20)))
            .map(|w| w.len());
        (r, t.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    // The fake backend stops serving and unmaps the ring; XenStore still says Connected.
    drop(be);
    let (r, took) = waiter.join().unwrap();
    let e = r.unwrap_err();
    assert!(e.is_device_lost(), "{e}");
    assert!(e.to_string().contains("went away"), "{e}");
    assert!(took < Duration::from_secs(10), "noticed after {took:?}");
    let mut wc = [WorkCompletion::default(); 1];
    assert!(cq2.poll(&mut wc).unwrap_err().is_device_lost());
}
