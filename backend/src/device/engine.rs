//! Engine threads: poll the doorbells of their channels' QPs, execute work, and sleep when
//! idle.
//!
//! Sleeping (the kick protocol of docs/protocol.md §2, the `req_event` idiom): after `spin` without work the engine arms the
//! sleep word of every channel it serves (`EngineSleep::prepare_sleep`, which fences), re-checks
//! every queue, and only then blocks in `mio::Poll` on its waker. A frontend that publishes a
//! producer index after the re-check sees the sleep word and notifies the channel's event
//! channel; the daemon forwards that as [`super::Device::kick`], which wakes the engine. The
//! control path wakes it the same way when channels or QPs come and go, and for mediated posts.
//!
//! A kick buys one look, not a spin: an engine woken from its sleep that finds no work goes
//! straight back to sleep (after the usual arm-and-re-check), and spins for `spin` only after
//! it did work. A guest that floods its event channel therefore costs one pass over the
//! engine's QPs per wake-up, not `spin` of busy polling per kick.
//!
//! Each pass serves every channel in turn with a byte budget, and the QPs of a channel from a
//! rotating start, so a channel moving huge messages delays another's by one budget's worth of
//! copying per pass, whatever its message sizes or QP count. The budget is
//! [`exec::PASS_BYTES`] for [`SHARED_PASSES`] passes after two channels last did work in the
//! same pass, [`exec::SOLO_BYTES`] otherwise (a lone stream is not chopped finer than needed).
//!
//! A QP blocked on a RECV at a QP served by another engine cannot be woken by its own
//! channels' kicks; the serving engine hands the wake-up over (`exec::hand_off_rnr`), and as a
//! safety net such an engine sleeps at most [`RNR_NAP`] at a time.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::{Events, Poll};

use super::exec::{self, Ctx};
use super::iwarp;
use super::mr::{EngineKeys, KeyTable};
use super::objects::{lock, Channel, Qp};
use super::waker::EngineWaker;

/// Passes after two channels last did work in the same pass during which budgets stay small.
pub(crate) const SHARED_PASSES: usize = 256;

/// Idle passes between two looks at the clock while spinning.
const CLOCK_PASSES: u32 = 64;

/// Longest sleep of an engine whose QP waits for a RECV at another engine's QP.
pub(crate) const RNR_NAP: Duration = Duration::from_millis(1);

/// An engine's shared part: its waker and the channels it serves.
pub(crate) struct EngineShared {
    pub(crate) waker: Arc<EngineWaker>,
    pub(crate) channels: Mutex<Vec<Arc<Channel>>>,
    /// Registers the sockets of remote QPs with the engine's poller.
    pub(crate) registry: mio::Registry,
}

/// An engine ready to run: its shared part and its poller.
pub(crate) struct Prepared {
    pub(crate) shared: Arc<EngineShared>,
    poll: Poll,
}

pub(crate) fn prepare(idx: usize) -> std::io::Result<Prepared> {
    let poll = Poll::new()?;
    let waker = Arc::new(EngineWaker::new(idx, &poll)?);
    Ok(Prepared {
        shared: Arc::new(EngineShared {
            waker,
            channels: Mutex::new(Vec::new()),
            registry: poll.registry().try_clone()?,
        }),
        poll,
    })
}

pub(crate) fn spawn(
    p: Prepared,
    spin: Duration,
    keys: Arc<KeyTable>,
    engines: Arc<[Arc<EngineWaker>]>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("vrdma-engine-{}", p.shared.waker.idx))
        .spawn(move || run(p, spin, keys, engines))
}

fn run(p: Prepared, spin: Duration, keys: Arc<KeyTable>, engines: Arc<[Arc<EngineWaker>]>) {
    let Prepared { shared, mut poll } = p;
    let me = &*shared.waker;
    let mut events = Events::with_capacity(256);
    let ctx = Ctx {
        keys: EngineKeys::new(&keys),
        me: me.idx,
        engines: &engines,
    };
    let mut seen = u64::MAX;
    let mut chans: Vec<Arc<Channel>> = Vec::new();
    let mut qps: Vec<Arc<Qp>> = Vec::new();
    // Per channel: its QPs' range in `qps`.
    let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
    // The sockets of the remote QPs among `qps`.
    let mut sockets = iwarp::Sockets::default();
    let mut pass: usize = 0;
    let mut last_shared: usize = 0;
    let mut idle_since: Option<Instant> = None;
    // Idle passes since the last pass that did work.
    let mut idle_passes: u32 = 0;
    // Woken from a sleep (or just started) and no work found since: no spinning for that.
    let mut just_woke = true;
    tracing::debug!(engine = me.idx, "engine started");
    while !me.stop.load(Ordering::Acquire) {
        let g = me.generation.load(Ordering::SeqCst);
        if g != seen {
            seen = g;
            chans = lock(&shared.channels).clone();
            qps.clear();
            ranges.clear();
            for c in &chans {
                let start = qps.len();
                qps.extend(lock(&c.qps).iter().cloned());
                ranges.push(start..qps.len());
            }
            sockets.rebuild(&qps);
        }
        if !sockets.is_empty() {
            sockets.poll_now(&mut poll, &mut events);
        }
        let mut did = false;
        pass = pass.wrapping_add(1);
        let per_channel = if pass.wrapping_sub(last_shared) < SHARED_PASSES {
            exec::PASS_BYTES
        } else {
            exec::SOLO_BYTES
        };
        let mut working = 0;
        for r in &ranges {
            let mine = &qps[r.clone()];
            let mut budget = per_channel;
            let mut worked = false;
            for k in 0..mine.len() {
                if budget == 0 {
                    break;
                }
                worked |= exec::process_qp(&ctx, &mine[(pass + k) % mine.len()], &mut budget);
            }
            working += usize::from(worked);
            did |= worked;
        }
        if working >= 2 {
            last_shared = pass;
        }
        if did {
            idle_since = None;
            idle_passes = 0;
            just_woke = false;
            continue;
        }
        if !just_woke {
            // Reading the clock costs as much as an idle pass: look at it every
            // `CLOCK_PASSES` idle passes only (the spin ends that much later at most).
            idle_passes = idle_passes.wrapping_add(1);
            if idle_passes % CLOCK_PASSES != 1 {
                std::hint::spin_loop();
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < spin {
                std::hint::spin_loop();
                continue;
            }
        }
        // Arm every sleep word, then look once more: a post published before the arm is seen
        // here, one published after it sees the arm and kicks.
        me.asleep.store(true, Ordering::SeqCst);
        for c in &chans {
            lock(&c.sleep).prepare_sleep();
        }
        let mut work = false;
        let mut nap = false;
        for qp in &qps {
            let (w, cross) = exec::has_work(qp, me.idx);
            work |= w;
            nap |= cross;
        }
        if !work && me.generation.load(Ordering::SeqCst) == seen && !me.stop.load(Ordering::SeqCst)
        {
            me.sleeps.fetch_add(1, Ordering::Relaxed);
            let timeout = nap.then_some(RNR_NAP);
            match poll.poll(&mut events, timeout) {
                Ok(()) => sockets.dispatch(&events),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::error!(engine = me.idx, "engine poll failed: {e}");
                    std::thread::sleep(RNR_NAP);
                }
            }
        }
        for c in &chans {
            lock(&c.sleep).wake();
        }
        me.asleep.store(false, Ordering::SeqCst);
        idle_since = None;
        idle_passes = 0;
        just_woke = true;
    }
    tracing::debug!(engine = me.idx, "engine stopped");
}
