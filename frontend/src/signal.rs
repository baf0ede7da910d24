//! Waiting for the backend: one event channel per channel serves control responses, armed-CQ
//! completions and async events, so several threads may wait on it at once.
//!
//! A waiter reads the hub's *epoch*, checks its own condition (a response, a CQE), and only
//! then waits for the epoch to move. One waiter at a time polls the event channel's descriptor
//! and bumps the epoch for everyone when an event arrives; the others sleep on a condition
//! variable. An event that arrives between the check and the wait leaves the descriptor
//! readable, so it is never lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use xen_platform::EventChannel;

use crate::error::Result;

/// Longest single block: waiters re-check their condition (and device liveness) this often
/// even without events, so a lost or coalesced notification costs latency, never a hang.
pub(crate) const MAX_BLOCK: Duration = Duration::from_millis(100);

/// Notifications to and from the backend.
pub(crate) trait Signal: Send + Sync {
    /// Notify the backend (a system call on the event channel).
    fn notify(&self) -> Result<()>;
    /// The current epoch (bumped for every batch of events received).
    fn epoch(&self) -> u64;
    /// Bumps the epoch and wakes every waiter (another thread found something they wait for).
    fn wake_all(&self);
    /// Waits until the epoch differs from `seen` (true) or `deadline` passes (false). Returns
    /// after at most [`MAX_BLOCK`] in any case (false), so callers re-check.
    fn wait_after(&self, seen: u64, deadline: Option<Instant>) -> Result<bool>;
}

/// The [`Signal`] of a real (or simulated) event channel.
pub(crate) struct EventHub {
    evtchn: EventChannel,
    state: Mutex<HubState>,
    cv: Condvar,
    notifications: AtomicU64,
}

struct HubState {
    epoch: u64,
    polling: bool,
}

impl EventHub {
    pub(crate) fn new(evtchn: EventChannel) -> EventHub {
        EventHub {
            evtchn,
            state: Mutex::new(HubState {
                epoch: 0,
                polling: false,
            }),
            cv: Condvar::new(),
            notifications: AtomicU64::new(0),
        }
    }

    /// Notifications this process sent to the backend on the channel.
    pub(crate) fn notifications(&self) -> u64 {
        self.notifications.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Signal for EventHub {
    fn notify(&self) -> Result<()> {
        self.notifications.fetch_add(1, Ordering::Relaxed);
        self.evtchn.notify()?;
        Ok(())
    }

    fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    fn wake_all(&self) {
        let mut st = self.lock();
        st.epoch = st.epoch.wrapping_add(1);
        drop(st);
        self.cv.notify_all();
    }

    fn wait_after(&self, seen: u64, deadline: Option<Instant>) -> Result<bool> {
        let give_up = Instant::now() + MAX_BLOCK;
        let deadline = Some(deadline.map_or(give_up, |d| d.min(give_up)));
        let mut st = self.lock();
        loop {
            if st.epoch != seen {
                return Ok(true);
            }
            let now = Instant::now();
            let left = match deadline {
                Some(d) if now >= d => return Ok(false),
                Some(d) => d - now,
                None => MAX_BLOCK,
            };
            if !st.polling {
                st.polling = true;
                drop(st);
                let r = self.evtchn.wait_timeout(Some(left));
                st = self.lock();
                st.polling = false;
                if matches!(r, Ok(true)) {
                    st.epoch = st.epoch.wrapping_add(1);
                }
                self.cv.notify_all();
                r?;
            } else {
                st = self
                    .cv
                    .wait_timeout(st, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }
}
