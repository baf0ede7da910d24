//! The part of an engine thread that other threads see: wake it, tell it that its channel or
//! QP lists changed, stop it, and read whether it sleeps.
//!
//! It sits below the data model ([`super::objects`]) so that a channel can hold its engine's
//! waker without the objects knowing the engine thread ([`super::engine`]), which is built on
//! top of them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use mio::{Poll, Token, Waker};

use super::ChannelId;

/// The bit that marks an engine poller's token as a channel's kick source (the guest's event
/// channel, [`super::ChannelSetup::kick_source`]): QP sockets use their QP number (below
/// 2^24), the waker token 0.
const KICK_BIT: usize = 1 << (usize::BITS - 1);

/// The token under which channel `ch`'s kick source is registered with its engine's poller.
pub(crate) fn kick_token(ch: ChannelId) -> Token {
    Token(KICK_BIT | ch.0 as usize)
}

/// Whether `t` is a channel's kick source (its event needs nothing but the wake-up itself).
pub(crate) fn is_kick_token(t: Token) -> bool {
    t.0 & KICK_BIT != 0
}

/// Wakes one engine thread and carries the flags it shares with the rest of the device.
pub(crate) struct EngineWaker {
    /// The engine's index among the device's engines.
    pub(crate) idx: usize,
    waker: Waker,
    /// Bumped whenever the engine's channels or their QPs change.
    pub(crate) generation: AtomicU64,
    pub(crate) stop: AtomicBool,
    /// Times the engine blocked (for tests and diagnostics).
    pub(crate) sleeps: AtomicU64,
    /// True while the engine is blocked or about to block.
    pub(crate) asleep: AtomicBool,
}

impl EngineWaker {
    /// A waker of engine `idx` that wakes `poll` (the engine blocks in it).
    pub(crate) fn new(idx: usize, poll: &Poll) -> std::io::Result<Self> {
        Ok(Self {
            idx,
            waker: Waker::new(poll.registry(), Token(0))?,
            generation: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            sleeps: AtomicU64::new(0),
            asleep: AtomicBool::new(false),
        })
    }

    /// Wakes the engine if it sleeps (a spurious wake-up otherwise, absorbed by the next sleep).
    pub(crate) fn wake(&self) {
        if let Err(e) = self.waker.wake() {
            tracing::warn!(engine = self.idx, "engine waker failed: {e}");
        }
    }

    /// Channels or QPs changed: the engine re-reads its lists.
    pub(crate) fn changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.wake();
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake();
    }
}
