//! Tests of the verbs layer that run on any host: the loader's errors, the device list of
//! this host, and the `context->ops` dispatch of the static-inline verbs (on a fake context).

use super::dl::{poll_cq_raw, post_recv_raw, post_send_raw, req_notify_cq_raw};
use super::*;
use std::sync::atomic::{AtomicUsize, Ordering as AO};

#[test]
fn missing_library_names_the_packages() {
    let err = VerbsLib::open_path("/nonexistent/vrdma-test/libibverbs.so.1").unwrap_err();
    assert!(matches!(err, VerbsError::LibraryMissing { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("libibverbs1"), "{msg}");
    assert!(msg.contains("ibverbs-providers"), "{msg}");
    assert!(
        msg.contains("/nonexistent/vrdma-test/libibverbs.so.1"),
        "{msg}"
    );
}

#[test]
fn a_library_without_the_verbs_is_refused_by_symbol() {
    // libc is loaded in every process and has none of the verbs.
    let err = VerbsLib::open_path("libc.so.6").unwrap_err();
    match err {
        VerbsError::Symbol { symbol, .. } => assert_eq!(symbol, "ibv_get_device_list"),
        other => panic!("expected a missing-symbol error, got {other:?}"),
    }
}

/// The devices libibverbs lists are the kernel's (`/sys/class/infiniband`): none on a host
/// without RDMA support, and then the reason is given.
#[test]
fn device_list_matches_the_kernels() {
    let lib = match VerbsLib::open() {
        Ok(l) => l,
        Err(e) => panic!(
            "libibverbs is needed for this test (scripts/host-packages.txt: libibverbs-dev \
             pulls libibverbs1): {e}"
        ),
    };
    let list = lib.devices().unwrap();
    let mut kernel: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    kernel.sort();
    let mut seen: Vec<String> = list.devices.iter().map(|d| d.name.clone()).collect();
    seen.sort();
    assert_eq!(seen, kernel);
    if kernel.is_empty() && !std::path::Path::new("/sys/class/infiniband_verbs").exists() {
        let why = list.empty_reason.expect("an empty list says why");
        assert!(why.contains("no RDMA support"), "{why}");
    }
    let err = lib.open_device("vrdma-no-such-dev").unwrap_err();
    assert!(matches!(err, VerbsError::NoSuchDevice { .. }), "{err:?}");
    assert!(err.to_string().contains("vrdma-no-such-dev"));
}

// --- a fake provider: a zeroed ibv_context whose ops table points here ---

static POLLED_CQ: AtomicUsize = AtomicUsize::new(0);
static NOTIFY_ARG: AtomicUsize = AtomicUsize::new(99);

unsafe extern "C" fn fake_poll(cq: *mut abi::ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    POLLED_CQ.store(cq as usize, AO::SeqCst);
    let k = n.min(2);
    for i in 0..k {
        // SAFETY: the caller passed `n` writable entries and k <= n.
        unsafe {
            *wc.add(i as usize) = ibv_wc {
                wr_id: 100 + i as u64,
                status: abi::IBV_WC_SUCCESS,
                opcode: abi::IBV_WC_RDMA_WRITE,
                ..Default::default()
            }
        };
    }
    k
}

unsafe extern "C" fn fake_poll_fails(_: *mut abi::ibv_cq, _: c_int, _: *mut ibv_wc) -> c_int {
    -5 // -EIO
}

unsafe extern "C" fn fake_notify(_: *mut abi::ibv_cq, solicited: c_int) -> c_int {
    NOTIFY_ARG.store(solicited as usize, AO::SeqCst);
    0
}

/// Refuses the second WR of the chain with ENOMEM, as a full send queue does.
unsafe extern "C" fn fake_post_send(
    _: *mut abi::ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: the chain has two valid WRs (the test builds it); `bad` is writable.
    unsafe { *bad = (*wr).next };
    12
}

unsafe extern "C" fn fake_post_recv(
    _: *mut abi::ibv_qp,
    wr: *mut ibv_recv_wr,
    _: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: the test passes one valid WR.
    if unsafe { (*wr).wr_id } == 7 {
        0
    } else {
        22
    }
}

fn fake_context() -> Box<ibv_context> {
    // SAFETY: every field of ibv_context is a pointer, an optional function pointer, an int
    // or opaque bytes: all-zero is valid.
    let mut ctx: Box<ibv_context> = Box::new(unsafe { std::mem::zeroed() });
    ctx.ops.poll_cq = Some(fake_poll);
    ctx.ops.req_notify_cq = Some(fake_notify);
    ctx.ops.post_send = Some(fake_post_send);
    ctx.ops.post_recv = Some(fake_post_recv);
    ctx
}

#[test]
fn data_path_verbs_dispatch_through_context_ops() {
    let mut ctx = fake_context();
    // SAFETY: as in fake_context.
    let mut cq: Box<abi::ibv_cq> = Box::new(unsafe { std::mem::zeroed() });
    cq.context = &mut *ctx;
    // SAFETY: as in fake_context.
    let mut qp: Box<abi::ibv_qp> = Box::new(unsafe { std::mem::zeroed() });
    qp.context = &mut *ctx;

    let mut wc = [ibv_wc::default(); 4];
    // SAFETY: the fake CQ and context live across the call.
    let n = unsafe { poll_cq_raw(&mut *cq, &mut wc) }.unwrap();
    assert_eq!(n, 2);
    assert_eq!(POLLED_CQ.load(AO::SeqCst), &*cq as *const _ as usize);
    assert_eq!((wc[0].wr_id, wc[1].wr_id), (100, 101));
    assert_eq!(wc[2], ibv_wc::default());

    // SAFETY: as above.
    unsafe { req_notify_cq_raw(&mut *cq, true) }.unwrap();
    assert_eq!(NOTIFY_ARG.load(AO::SeqCst), 1);

    let mut second = ibv_send_wr {
        wr_id: 2,
        ..Default::default()
    };
    let mut first = ibv_send_wr {
        wr_id: 1,
        next: &mut second,
        ..Default::default()
    };
    // SAFETY: a valid two-WR chain without SGEs.
    let (index, err) = unsafe { post_send_raw(&mut *qp, &mut first) }.unwrap_err();
    assert_eq!(index, 1);
    assert_eq!(err.errno(), Some(12));

    let mut rwr = ibv_recv_wr {
        wr_id: 7,
        ..Default::default()
    };
    // SAFETY: one valid WR.
    unsafe { post_recv_raw(&mut *qp, &mut rwr) }.unwrap();
    rwr.wr_id = 8;
    // SAFETY: as above.
    let (index, err) = unsafe { post_recv_raw(&mut *qp, &mut rwr) }.unwrap_err();
    assert_eq!((index, err.errno()), (0, Some(22)));

    ctx.ops.poll_cq = Some(fake_poll_fails);
    // SAFETY: as above.
    let err = unsafe { poll_cq_raw(&mut *cq, &mut wc) }.unwrap_err();
    assert!(matches!(err, VerbsError::PollFailed(-5)), "{err:?}");

    ctx.ops.post_send = None;
    // SAFETY: as above.
    let (_, err) = unsafe { post_send_raw(&mut *qp, &mut first) }.unwrap_err();
    assert!(matches!(err, VerbsError::MissingOp("post_send")), "{err:?}");
}

#[test]
fn gid_strings() {
    let mut raw = [0u8; 16];
    raw[0] = 0xfe;
    raw[1] = 0x80;
    raw[15] = 1;
    let g = abi::ibv_gid { raw };
    assert_eq!(gid_string(&g), "fe80:0000:0000:0000:0000:0000:0000:0001");
}

/// A failed verb says its errno once: in the message, not again as the error's source (an
/// anyhow chain printed with `{:#}` showed "Invalid argument" twice before).
#[test]
fn call_errors_state_the_errno_once() {
    let e = VerbsError::call("ibv_query_port", std::io::Error::from_raw_os_error(22));
    assert_eq!(e.errno(), Some(22));
    assert!(std::error::Error::source(&e).is_none());
    let chain = anyhow_like(&e);
    assert_eq!(chain.matches("os error 22").count(), 1, "{chain}");
}

/// The message followed by each source's, as anyhow's `{:#}` prints an error chain.
fn anyhow_like(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[test]
fn rc_qps_give_up_on_a_peer_that_stops_answering() {
    // rxe takes retry_cnt 7 for "retry forever": a guest whose peer was killed would wait on
    // its QP for ever instead of seeing RetryExceeded (the lab's rxe scenario saw exactly that).
    let a = probe::rts_attr(0x42);
    assert!(
        a.retry_cnt < 7,
        "retry_cnt {} never gives up on rxe",
        a.retry_cnt
    );
    assert_eq!(
        (a.qp_state, a.sq_psn, a.timeout),
        (abi::IBV_QPS_RTS, 0x42, 14)
    );
}
