//! Engine threads: poll the doorbells of their channels' QPs, execute work, and sleep when
//! idle.
//!
//! Sleeping (the kick protocol of docs/protocol.md §2, the `req_event` idiom): after `spin` without work the engine arms the
//! sleep word of every channel it serves (`EngineSleep::prepare_sleep`, which fences), re-checks
//! every queue, and only then blocks in `mio::Poll` on its waker. A frontend that publishes a
//! producer index after the re-check sees the sleep word and notifies the channel's event
//! channel. A bypass channel's event channel is in the engine's own poller
//! ([`super::ChannelSetup::kick_source`]), so the notification wakes the engine directly, which
//! consumes it ([`super::KickSource::fired`], which passes control requests on to the daemon);
//! without one, the daemon forwards the event as [`super::Device::kick`], which wakes the
//! engine through its waker. The control path wakes it that way when channels or QPs come and
//! go, and for mediated posts.
//!
//! A kick buys one look, not a spin: an engine woken from its sleep that finds no work goes
//! straight back to sleep (after the usual arm-and-re-check), and spins for `spin` only after
//! it did work. A guest that floods its event channel therefore costs one pass over the
//! engine's QPs per wake-up, not `spin` of busy polling per kick.
//!
//! While it spins, the passes right after work are kept free of what would make a post that
//! arrives then wait: the clock is read every [`CLOCK_PASSES`] idle passes, not before the
//! first `CLOCK_PASSES`; the first [`EAGER_PASSES`] idle passes do not `pause`; and the poller
//! (a system call) is looked at every `CLOCK_PASSES` idle passes or after
//! [`KICK_POLL_UNITS`] of work, not every few passes (docs/benchmarks.md, "Seventh round").
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
use super::waker::{is_kick_token, kick_token, EngineWaker};

/// Passes after two channels last did work in the same pass during which budgets stay small.
pub(crate) const SHARED_PASSES: usize = 256;

/// Idle passes between two looks at the clock while spinning.
const CLOCK_PASSES: u32 = 64;

/// Work units (a pass, one more per QP that found work in it and one more per
/// [`exec::PASS_BYTES`] it moved) between two looks at the poller of an awake engine whose
/// poller holds guests' event channels but no sockets, while it keeps finding work (an idle
/// one looks every [`CLOCK_PASSES`] idle passes). A look is a system call (`epoll_wait`); one
/// every 64 passes cost a ping-pong ≈ 20 ns per round trip (docs/benchmarks.md, "Seventh
/// round"). Bounds what a control request or a frontend's death waits while the engine is
/// busy: ≈ 500 passes of a ping-pong (tens of µs), at most 1024 QP turns of at most
/// `exec::BUDGET` WQEs each however many QPs are busy, ≈ 8 MiB of copying for a hog.
const KICK_POLL_UNITS: usize = 1024;

/// Idle passes after work that do not `pause`: a ping-pong's next post arrives within them.
const EAGER_PASSES: u32 = CLOCK_PASSES;

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
    let mut ctx = Ctx {
        keys: EngineKeys::new(&keys),
        peers: Default::default(),
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
    // Whether a channel's kick source (the guest's event channel) is in the poller.
    let mut kick_sources = false;
    // Work since the engine last looked at its poller: passes, plus one per `PASS_BYTES` moved.
    let mut kick_units = KICK_POLL_UNITS;
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
            kick_sources = chans.iter().any(|c| c.kick_source.is_some());
            // An event the poller reported before the channel was in the shared list found
            // nobody to consume it (`fire_kicks`); on Xen that port then stays masked and no
            // later notification would ever wake anyone. Every source is looked at once more
            // (a read that finds nothing is cheap; a needless wake of a channel thread is
            // harmless). The channel's opener bumps the generation after listing it.
            for src in chans.iter().filter_map(|c| c.kick_source.as_ref()) {
                src.fired();
            }
        }
        // Regions retired or deregistered since the last pass leave the key cache (mr.rs,
        // `KeyCache`: a deregistration does not wait for the engine).
        ctx.keys.sync();
        // Peers destroyed since the last pass leave the peer cache (peers.rs).
        ctx.peers.sync();
        // While awake the engine looks at its poller without blocking: every pass when it
        // has sockets; when only guests' event channels are there, after `KICK_POLL_UNITS` of
        // work or every `CLOCK_PASSES` idle passes (a control request or a frontend's death
        // that arrives meanwhile is passed on to the daemon from here; the guest does not kick
        // an engine that is awake).
        let polled = if !sockets.is_empty() {
            sockets.poll_now(&mut poll, &mut events)
        } else if kick_sources && kick_units >= KICK_POLL_UNITS {
            kick_units = 0;
            poll.poll(&mut events, Some(Duration::ZERO)).is_ok()
        } else {
            false
        };
        if polled {
            fire_kicks(&events, &shared);
        }
        let mut did = false;
        pass = pass.wrapping_add(1);
        let per_channel = if pass.wrapping_sub(last_shared) < SHARED_PASSES {
            exec::PASS_BYTES
        } else {
            exec::SOLO_BYTES
        };
        let mut working = 0;
        let mut moved = 0;
        let mut turns = 0;
        for r in &ranges {
            let mine = &qps[r.clone()];
            let mut budget = per_channel;
            let mut worked = false;
            // From QP `pass % n` on, round the list; one division per channel and pass (none
            // for a lone QP), not one per QP: it is on the path from a post to its execution.
            let n = mine.len();
            let mut i = if n > 1 { pass % n } else { 0 };
            for _ in 0..n {
                if budget == 0 {
                    break;
                }
                let w = exec::process_qp(&ctx, &mine[i], &mut budget);
                turns += usize::from(w);
                worked |= w;
                i += 1;
                if i == n {
                    i = 0;
                }
            }
            working += usize::from(worked);
            did |= worked;
            moved += per_channel.saturating_sub(budget);
        }
        kick_units = kick_units.saturating_add(1 + turns + moved / exec::PASS_BYTES);
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
            // Reading the clock costs more than an idle pass (56–370 ns on a VM): look at it
            // every `CLOCK_PASSES` idle passes only, the first read at the `CLOCK_PASSES`th only
            // starting the timer (so the spin ends at most 2 × `CLOCK_PASSES` idle passes late). Not on the first idle pass after work
            // either: that is when a ping-pong's next post arrives, and it would wait for the
            // clock (docs/benchmarks.md, "Seventh round"). Nor `pause` in those first passes.
            idle_passes = idle_passes.wrapping_add(1);
            if idle_passes % CLOCK_PASSES != 0 {
                if idle_passes > EAGER_PASSES {
                    std::hint::spin_loop();
                }
                continue;
            }
            // An idle engine looks at its poller every `CLOCK_PASSES` idle passes too.
            kick_units = KICK_POLL_UNITS;
            let Some(since) = idle_since else {
                // The spin is timed from here: one clock read, not two.
                idle_since = Some(Instant::now());
                std::hint::spin_loop();
                continue;
            };
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
            // A sleeping engine holds no region (deregistered meanwhile or not) and no peer.
            ctx.keys.clear();
            ctx.peers.clear();
            me.sleeps.fetch_add(1, Ordering::Relaxed);
            let timeout = nap.then_some(RNR_NAP);
            match poll.poll(&mut events, timeout) {
                Ok(()) => {
                    sockets.dispatch(&events);
                    fire_kicks(&events, &shared);
                }
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
    // A stopped engine holds no region and no peer (a panicking one drops its caches while
    // unwinding).
    ctx.keys.clear();
    ctx.peers.clear();
    tracing::debug!(engine = me.idx, "engine stopped");
}

/// Lets the channels whose kick sources `events` reported consume their events and pass on
/// what was not a kick. The channels are looked up in the shared list, not in the engine's
/// snapshot: a channel opened just now may have its event before the engine has seen it.
fn fire_kicks(events: &Events, shared: &EngineShared) {
    for ev in events.iter() {
        if !is_kick_token(ev.token()) {
            continue;
        }
        let src = lock(&shared.channels)
            .iter()
            .find(|c| kick_token(c.id) == ev.token())
            .and_then(|c| c.kick_source.clone());
        if let Some(src) = src {
            src.fired();
        }
    }
}
