//! A guest can only hurt itself (issue 10, items 3 and 4): a hostile guest A storms XenStore
//! or floods its control ring, and a good guest B beside it attaches, connects and works as if
//! A were not there. Waits are bounded by PATIENCE (a hang guard, not a timing assertion);
//! the bounds asserted are counts: XenStore operations, event-queue entries, scans.

mod daemon_common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use daemon_common::*;
use shared_ring::abi::control::{access, Reply, Request, RequestRepr, ResponseRepr, Status};
use shared_ring::abi::page_dir::{write_page_list, GREFS_PER_DIR_PAGE};
use vrdma_backend::daemon::{self, MetricsSnapshot};
use vrdma_backend::resources::Quotas;
use vrdma_backend::toolstack;
use xen_platform::{Access, DomId};
use xenstore_proto::client::NodeOps;

fn attach(s: &Stack, quotas: Quotas) -> u32 {
    attach_with_grants(s, quotas, None)
}

/// Attaches a new domain that may grant `max_grants` pages (the host's default if `None`).
fn attach_with_grants(s: &Stack, quotas: Quotas, max_grants: Option<u32>) -> u32 {
    let d = u32::from(s.host.create_domain(None, max_grants).unwrap().0);
    toolstack::attach_device(&*s.dom0, d, 0, 0, &quotas).unwrap();
    wait_value(&*s.dom0, &s.backend_node(d, "state"), "2");
    d
}

/// Sets the flag when dropped, so attacker threads stop even when an assertion fails.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What the good guest B saw.
#[derive(Debug)]
struct GoodGuest {
    /// From `vrdmactl attach` to the backend's InitWait.
    attach: Duration,
    /// From opening a channel to the backend's Connected.
    connect: Duration,
}

/// B attaches, opens a channel, and allocates a PD: everything works.
fn good_guest(s: &Stack) -> (GoodGuest, Frontend) {
    let t0 = Instant::now();
    let b = attach(s, Quotas::default());
    let attach = t0.elapsed();
    let t1 = Instant::now();
    let (mut fe, st) = Frontend::open(s.host.dir(), b, 0);
    let connect = t1.elapsed();
    assert_eq!(st, "4", "B's channel is connected");
    assert_eq!(fe.call(Request::Init { version: 2 }).status, Status::Ok);
    fe.alloc_pd();
    wait_value(&*s.dom0, &s.stats_node(b, "pds"), "1");
    (GoodGuest { attach, connect }, fe)
}

/// Guest A loops writes to its own frontend node and AllocPd/DeallocPd on its channel for
/// `storm`, while B attaches and connects. Returns the daemon's counters over the storm, the
/// storm's real length, A's write count and what B saw.
fn xenstore_storm(storm: Duration) -> (MetricsSnapshot, Duration, u64, u64, GoodGuest) {
    let s = Stack::start();
    let a = attach(&s, Quotas::default());
    let (mut fe_a, st) = Frontend::open(s.host.dir(), a, 0);
    assert_eq!(st, "4");
    assert_eq!(fe_a.call(Request::Init { version: 2 }).status, Status::Ok);

    let stop = Arc::new(AtomicBool::new(false));
    let _guard = StopOnDrop(stop.clone());
    let writes = Arc::new(AtomicU64::new(0));
    let pds = Arc::new(AtomicU64::new(0));
    let before = s.metrics.snapshot();
    let t0 = Instant::now();
    let writer = {
        let (stop, writes) = (stop.clone(), writes.clone());
        let store = platform(s.host.dir(), DomId(a as u16)).xenstore().unwrap();
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                store
                    .write("device/vrdma/0/storm", i.to_string().as_bytes())
                    .unwrap();
                writes.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let churner = {
        let (stop, pds) = (stop.clone(), pds.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let pd = fe_a.alloc_pd();
                let r = fe_a.call(Request::DeallocPd { pd });
                assert_eq!(r.status, Status::Ok);
                pds.fetch_add(1, Ordering::Relaxed);
            }
            fe_a
        })
    };
    // B arrives once the storm is well under way.
    std::thread::sleep(storm / 4);
    let (seen, _fe_b) = good_guest(&s);
    let left = storm.saturating_sub(t0.elapsed());
    std::thread::sleep(left);
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let _fe_a = churner.join().unwrap();
    let elapsed = t0.elapsed();
    let after = s.metrics.snapshot();
    let during = MetricsSnapshot {
        xenstore_ops: after.xenstore_ops - before.xenstore_ops,
        frontend_scans: after.frontend_scans - before.frontend_scans,
        stats_publications: after.stats_publications - before.stats_publications,
        ..after
    };
    (
        during,
        elapsed,
        writes.load(Ordering::Relaxed),
        pds.load(Ordering::Relaxed),
        seen,
    )
}

fn check_storm(storm: Duration) {
    let (m, elapsed, writes, pds, b) = xenstore_storm(storm);
    eprintln!(
        "storm {elapsed:?}: A wrote its frontend node {writes} times and made {pds} AllocPd/DeallocPd pairs; \
         daemon: {} XenStore ops, {} frontend scans, {} stats publications, queue high-water {}; \
         B attach {:?}, connect {:?}",
        m.xenstore_ops, m.frontend_scans, m.stats_publications, m.queue_high_water, b.attach, b.connect
    );
    assert!(writes > 0 && pds > 0, "the attacker ran");
    // The queue holds at most one entry per (device, kind) plus the fixed ones: two devices.
    let queue_bound = daemon::queue_capacity(2, 2) as u64;
    assert!(
        m.queue_high_water <= queue_bound,
        "queue high-water {} > {queue_bound}",
        m.queue_high_water
    );
    // Rate limits: per device, frontend scans and stats publications are paced; both
    // devices count (B's handshake included).
    let secs = elapsed.as_secs_f64();
    let scans_bound = 2.0 * daemon::FRONTEND_SCAN_BURST as f64
        + 2.0 * secs * daemon::FRONTEND_SCANS_PER_SEC as f64;
    assert!(
        (m.frontend_scans as f64) <= scans_bound,
        "{} frontend scans in {secs:.1} s > {scans_bound}",
        m.frontend_scans
    );
    let pubs_bound = 2.0 * (1.0 + secs / daemon::STATS_MIN_INTERVAL.as_secs_f64()) + 4.0;
    assert!(
        (m.stats_publications as f64) <= pubs_bound,
        "{} stats publications in {secs:.1} s > {pubs_bound}",
        m.stats_publications
    );
    // Each scan or publication costs a handful of operations (one channel per device here);
    // B's attach and connect a fixed number more.
    let ops_bound = 16.0 * (scans_bound + pubs_bound) + 200.0;
    assert!(
        (m.xenstore_ops as f64) <= ops_bound,
        "{} XenStore ops in {secs:.1} s > {ops_bound}",
        m.xenstore_ops
    );
}

/// The normal test run storms for 2 s: long enough for thousands of attacker writes and
/// several stats periods, short enough for the suite; `xenstore_storm_10s` is the issue's
/// 10-second figure (`cargo test -p vrdma-backend --test daemon_hostile_guest -- --ignored`).
#[test]
fn xenstore_storm_leaves_the_daemon_bounded_and_b_unaffected() {
    check_storm(Duration::from_secs(2));
}

#[test]
#[ignore = "10 s; run explicitly with --ignored"]
fn xenstore_storm_10s() {
    check_storm(Duration::from_secs(10));
}

/// Pages per registration in the flood: each RegMr maps this many grants, so that a ring
/// full of them is a lot of work (the attacker's domain may grant `FLOOD_GRANTS`).
const FLOOD_MR_PAGES: usize = 120 * GREFS_PER_DIR_PAGE;
const FLOOD_GRANTS: u32 = 1 << 17;

/// Slots in a one-page control ring, and where the first one starts (`io/ring.h`).
const RING_SLOTS: u32 = 32;
const RING_ENTRIES_AT: usize = 64;

/// Keeps A's ring full of large RegMr and DeregMr requests until `stop`, as a hostile
/// frontend can: it sees a response land in a slot (before the backend even publishes
/// `rsp_prod`) and at once reuses the slot for a new request, so the backend never finds the
/// ring empty. Counts the answers.
fn flood(fe: Frontend, stop: Arc<AtomicBool>, answered: Arc<AtomicU64>) -> Frontend {
    let mut fe = fe;
    let pd = fe.alloc_pd();
    // One share call gives at most 16384 pages.
    let mem: Vec<_> = (0..FLOOD_MR_PAGES)
        .step_by(16 * GREFS_PER_DIR_PAGE)
        .map(|at| {
            let n = (FLOOD_MR_PAGES - at).min(16 * GREFS_PER_DIR_PAGE);
            fe.platform
                .share_pages(DomId::DOM0, n, Access::ReadWrite)
                .unwrap()
        })
        .collect();
    let grefs: Vec<u32> = mem
        .iter()
        .flat_map(|m| m.grant_refs().iter().map(|g| g.0))
        .collect();
    let n_dir = FLOOD_MR_PAGES.div_ceil(GREFS_PER_DIR_PAGE);
    let dir = fe
        .platform
        .share_pages(DomId::DOM0, n_dir, Access::ReadOnly)
        .unwrap();
    let dir_grefs: Vec<u32> = dir.grant_refs().iter().map(|g| g.0).collect();
    let dir = dir.into_region().unwrap();
    let dir_regions: Vec<_> = (0..n_dir)
        .map(|i| dir.subregion(i * xen_platform::PAGE_SIZE, xen_platform::PAGE_SIZE))
        .collect::<Result<_, _>>()
        .unwrap();
    let list = write_page_list(&grefs, &dir_regions, &dir_grefs).unwrap();
    let reg = Request::RegMr {
        pd,
        access: access::ALL,
        length: (FLOOD_MR_PAGES * xen_platform::PAGE_SIZE) as u64,
        iova: 0,
        first_page_offset: 0,
        pages: list,
    };
    let page = fe.ring_page.clone();
    let slot_at = |idx: u32| RING_ENTRIES_AT + (idx % RING_SLOTS) as usize * 64;
    let mut deregs: Vec<u32> = Vec::new();
    let mut req_id = 1000u32;
    let mut next = |deregs: &mut Vec<u32>| {
        req_id += 1;
        let request = match deregs.pop() {
            Some(mr) => Request::DeregMr { mr },
            None => reg,
        };
        RequestRepr { req_id, request }.to_bytes()
    };
    // Every earlier call was answered: the ring is empty at `prod`.
    let mut prod = page.load_u32(0, Ordering::Acquire).unwrap();
    let mut in_flight = std::collections::VecDeque::new();
    // One slot short of full: a response lands in its slot just before the backend counts
    // it, and a request published in that instant must not look like a ring overflow.
    for _ in 0..RING_SLOTS - 1 {
        let bytes = next(&mut deregs);
        page.write_bytes(slot_at(prod), &bytes).unwrap();
        in_flight.push_back((prod, bytes));
        prod = prod.wrapping_add(1);
    }
    page.store_u32(0, prod, Ordering::Release).unwrap();
    fe.evtchn.notify().unwrap();
    let mut slot = [0u8; 64];
    while !stop.load(Ordering::Relaxed) {
        let mut pushed = false;
        while let Some(&(idx, bytes)) = in_flight.front() {
            page.read_bytes(slot_at(idx), &mut slot).unwrap();
            if slot == bytes {
                break;
            }
            // Answered; read again until the backend has finished writing the slot (the
            // response parses and echoes the request's id).
            let mut rsp = ResponseRepr::parse(&slot);
            for _ in 0..1_000_000 {
                if matches!(&rsp, Ok(r) if r.req_id.to_le_bytes() == bytes[..4]) {
                    break;
                }
                page.read_bytes(slot_at(idx), &mut slot).unwrap();
                rsp = ResponseRepr::parse(&slot);
            }
            if let Ok(ResponseRepr {
                reply: Reply::Mr { mr, .. },
                ..
            }) = rsp
            {
                deregs.push(mr);
            }
            answered.fetch_add(1, Ordering::Relaxed);
            in_flight.pop_front();
            let bytes = next(&mut deregs);
            page.write_bytes(slot_at(prod), &bytes).unwrap();
            in_flight.push_back((prod, bytes));
            prod = prod.wrapping_add(1);
            pushed = true;
        }
        if pushed {
            page.store_u32(0, prod, Ordering::Release).unwrap();
            fe.evtchn.notify().unwrap();
        } else {
            std::thread::yield_now();
        }
    }
    drop(mem);
    fe
}

#[test]
fn regmr_flood_then_closing_does_not_stall_the_daemon_while_b_connects() {
    let s = Stack::start();
    // Room for every registration in flight: each one really maps its pages.
    let a = attach_with_grants(
        &s,
        Quotas {
            max_mr_pages: u32::MAX,
            max_mrs: u32::MAX,
            ..Quotas::default()
        },
        Some(FLOOD_GRANTS),
    );
    let (mut fe_a, st) = Frontend::open(s.host.dir(), a, 0);
    assert_eq!(st, "4");
    assert_eq!(fe_a.call(Request::Init { version: 2 }).status, Status::Ok);
    let stop = Arc::new(AtomicBool::new(false));
    let guard = StopOnDrop(stop.clone());
    let answered = Arc::new(AtomicU64::new(0));
    let flooder = {
        let (stop, answered) = (stop.clone(), answered.clone());
        std::thread::spawn(move || flood(fe_a, stop, answered))
    };
    // The flood is under way: registrations are being answered.
    let deadline = Instant::now() + PATIENCE;
    while answered.load(Ordering::Relaxed) < 4 {
        assert!(Instant::now() < deadline, "the flood never got answers");
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_for(&*s.dom0, &s.stats_node(a, "mrs"), |v| v != Some("0"));
    // A asks to close its channel while it keeps the ring full.
    let store_a = platform(s.host.dir(), DomId(a as u16)).xenstore().unwrap();
    store_a
        .write("device/vrdma/0/channel/0/state", b"5")
        .unwrap();
    // B attaches and connects while A floods and closes.
    let (seen, mut fe_b) = good_guest(&s);
    // The daemon answered A's Closing with Closed while A still floods.
    wait_value(&*s.dom0, &s.backend_node(a, "channel/0/state"), "6");
    assert!(!flooder.is_finished(), "A flooded all along");
    // Closed because A asked, not for a protocol error: the flood was a well-formed one.
    let error = s
        .dom0
        .read_opt(&s.backend_node(a, "channel/0/error"))
        .unwrap()
        .map(|v| String::from_utf8_lossy(&v).into_owned());
    assert_eq!(error, None, "A's channel was closed by its request only");
    eprintln!(
        "flood: {} answers before the close; B attach {:?}, connect {:?}",
        answered.load(Ordering::Relaxed),
        seen.attach,
        seen.connect
    );
    // B keeps working.
    let pd = fe_b.alloc_pd();
    assert_eq!(fe_b.call(Request::DeallocPd { pd }).status, Status::Ok);
    drop(guard);
    let _fe_a = flooder.join().unwrap();
    // Everything A held is reclaimed, exactly once (counters back to 0, not below).
    for k in ["channels", "pds", "mrs", "mr-pages"] {
        wait_value(&*s.dom0, &s.stats_node(a, k), "0");
    }
}

/// A ring's worth of requests at once uses up the channel thread's budget for one wake-up;
/// the request after them must still wake it (the thread asks for a notification before it
/// sleeps).
#[test]
fn a_full_ring_of_requests_then_one_more_is_answered() {
    let s = Stack::start();
    let a = attach(&s, Quotas::default());
    let (mut fe, st) = Frontend::open(s.host.dir(), a, 0);
    assert_eq!(st, "4");
    assert_eq!(fe.call(Request::Init { version: 2 }).status, Status::Ok);
    for round in 0..3u32 {
        for i in 0..RING_SLOTS {
            let slot = RequestRepr {
                req_id: 10_000 * (round + 1) + i,
                request: Request::QueryPort { port: 1 },
            }
            .to_bytes();
            fe.ring.write_request(&slot).unwrap();
        }
        fe.ring.push_requests();
        fe.evtchn.notify().unwrap();
        for _ in 0..RING_SLOTS {
            assert_eq!(fe.next_response().status, Status::Ok);
        }
        // The next request is published with the ring's ordinary notification rule.
        assert_eq!(fe.call(Request::QueryPort { port: 1 }).status, Status::Ok);
    }
}
