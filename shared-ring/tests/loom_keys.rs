//! Loom model of the hand-off between a deregistration and an engine's key cache
//! (`backend/src/device/mr.rs`: `KeyTable::remove`, `KeyCache::get`, `EngineKeys::sync` and
//! `clear`; the engine loop in `engine.rs`), with no lock between them and no waiting: the
//! deregistration returns at once, and
//!
//! 1. no lookup the engine starts after the deregistration returned resolves the region (the
//!    guest may reuse its pages then);
//! 2. a pass of the engine that starts after the deregistration returned, or whose `sync`
//!    sees the key epoch moved, holds the region no more once that `sync` is done (the
//!    mapping outlives the reply by at most one pass);
//! 3. a sleeping engine holds no region.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p shared-ring --release --test loom_keys`. It
//! lives here, beside the ring's loom models, because the backend crate does not build with
//! `--cfg loom` (tokio leaves out `net` under it); it needs nothing of either crate.
//!
//! The model is the protocol, restated with loom's types (the engine's code uses std's): one
//! region, one engine with a one-way cache, and the control thread that deregisters. The
//! engine makes two passes (sync, lookup, use), goes to sleep (empties the cache, says it
//! sleeps), wakes and makes another pass. The deregistration removes the key and sets the
//! region's `dead` flag under the table's lock, bumps the key epoch and returns (a flag the
//! engine reads at the start of each pass: in the daemon, the reply and the guest's next
//! request), then looks whether the engine sleeps. Each `fails_without_*` model drops or
//! reorders one step and must fail.
#![cfg(loom)]

use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// The steps of the protocol; a model with one of them off must fail.
#[derive(Clone, Copy)]
struct Steps {
    /// A hit checks the region's `dead` flag.
    hit_checks_dead: bool,
    /// `remove` bumps the epoch after it set the flag (else before).
    bump_after_flag: bool,
    /// `sync` reads the epoch with Acquire (else Relaxed).
    epoch_acquire: bool,
    /// `sync` runs every pass and drops dead entries when the epoch moved.
    purge: bool,
    /// The engine empties its cache before it says it sleeps.
    clear_before_sleep: bool,
}

const ALL: Steps = Steps {
    hit_checks_dead: true,
    bump_after_flag: true,
    epoch_acquire: true,
    purge: true,
    clear_before_sleep: true,
};

struct Region {
    dead: AtomicBool,
}

struct Shared {
    table: Mutex<Option<Arc<Region>>>,
    epoch: AtomicU64,
    /// The deregistration has returned.
    returned: AtomicBool,
    asleep: AtomicBool,
}

struct Engine {
    way: Option<Arc<Region>>,
    retired: Vec<Arc<Region>>,
    epoch: u64,
    steps: Steps,
}

impl Engine {
    fn sync(&mut self, s: &Shared) {
        self.retired.clear();
        if !self.steps.purge {
            return;
        }
        let order = if self.steps.epoch_acquire {
            Ordering::Acquire
        } else {
            Ordering::Relaxed
        };
        let e = s.epoch.load(order);
        if e != self.epoch {
            if self
                .way
                .as_ref()
                .is_some_and(|m| m.dead.load(Ordering::Acquire))
            {
                self.way = None;
            }
            self.epoch = e;
            // The model's one deregistration: once its bump is seen, the region is gone (no
            // later epoch change would purge it).
            assert!(
                self.way.is_none(),
                "the region is held past one pass after the epoch moved"
            );
        }
    }

    fn lookup(&mut self, s: &Shared) -> bool {
        let hit = self
            .way
            .as_ref()
            .is_some_and(|m| !(self.steps.hit_checks_dead && m.dead.load(Ordering::Acquire)));
        if !hit {
            let m = s.table.lock().unwrap().clone();
            if let Some(old) = std::mem::replace(&mut self.way, m) {
                self.retired.push(old);
            }
        }
        self.way.is_some()
    }

    fn pass(&mut self, s: &Shared) {
        let after = s.returned.load(Ordering::SeqCst);
        self.sync(s);
        if after {
            assert!(
                self.way.is_none() && self.retired.is_empty(),
                "the region is held past one pass after its deregistration"
            );
        }
        // A lookup may start after the return within a pass that started before it.
        let after = s.returned.load(Ordering::SeqCst);
        let found = self.lookup(s);
        assert!(
            !(after && found),
            "a lookup that started after the deregistration returned resolved it"
        );
    }

    fn sleep(&mut self, s: &Shared) {
        if self.steps.clear_before_sleep {
            self.way = None;
            self.retired.clear();
        }
        s.asleep.store(true, Ordering::SeqCst);
    }

    fn wake(&mut self, s: &Shared) {
        s.asleep.store(false, Ordering::SeqCst);
    }
}

fn run(steps: Steps) {
    loom::model(move || {
        let region = Arc::new(Region {
            dead: AtomicBool::new(false),
        });
        let s = Arc::new(Shared {
            table: Mutex::new(Some(region)),
            epoch: AtomicU64::new(0),
            returned: AtomicBool::new(false),
            asleep: AtomicBool::new(false),
        });
        let engine = {
            let s = s.clone();
            thread::spawn(move || {
                let mut e = Engine {
                    way: None,
                    retired: Vec::new(),
                    epoch: 0,
                    steps,
                };
                e.pass(&s);
                e.pass(&s);
                e.sleep(&s);
                e.wake(&s);
                e.pass(&s);
            })
        };
        // The deregistration (`KeyTable::remove`).
        if !steps.bump_after_flag {
            s.epoch.fetch_add(1, Ordering::Release);
        }
        let m = {
            let mut t = s.table.lock().unwrap();
            let m = t.take().unwrap();
            m.dead.store(true, Ordering::Release);
            m
        };
        if steps.bump_after_flag {
            s.epoch.fetch_add(1, Ordering::Release);
        }
        // DeregMr returns without waiting for the engine.
        s.returned.store(true, Ordering::SeqCst);
        if s.asleep.load(Ordering::SeqCst) {
            assert_eq!(
                Arc::strong_count(&m),
                1,
                "a sleeping engine holds the region"
            );
        }
        engine.join().unwrap();
    });
}

#[test]
fn dereg_never_waits_and_the_engine_lets_go_within_a_pass() {
    run(ALL);
}

#[test]
#[should_panic(expected = "resolved it")]
fn fails_when_a_hit_does_not_check_the_dead_flag() {
    run(Steps {
        hit_checks_dead: false,
        ..ALL
    });
}

#[test]
#[should_panic(expected = "held past one pass")]
fn fails_when_the_epoch_is_bumped_before_the_flag() {
    run(Steps {
        bump_after_flag: false,
        ..ALL
    });
}

#[test]
#[should_panic(expected = "held past one pass")]
fn fails_with_a_relaxed_epoch_load() {
    run(Steps {
        epoch_acquire: false,
        ..ALL
    });
}

#[test]
#[should_panic(expected = "held past one pass")]
fn fails_without_the_purge() {
    run(Steps {
        purge: false,
        ..ALL
    });
}

#[test]
#[should_panic(expected = "a sleeping engine holds the region")]
fn fails_without_emptying_the_cache_before_sleep() {
    run(Steps {
        clear_before_sleep: false,
        ..ALL
    });
}
