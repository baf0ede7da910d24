//! One thread per XenStore watch, forwarding its events to the daemon's queue (the blocking
//! client's watches are iterators; the queue lets one thread wait on all of them, and merges
//! repeated events, so a storm of them costs one entry).
//!
//! A forwarder waits for its watch's next event with no timeout, so an idle backend's watch
//! threads never wake. Stopping ends the watch ([`WatchStopper`]), which wakes the thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use xenstore_proto::client::{WatchStopper, XenbusStore};

use super::queue::EventQueue;
use super::Event;

/// A running watch forwarder; dropping it stops the thread (which unwatches).
pub(super) struct WatchPump {
    stop: Arc<AtomicBool>,
    stopper: WatchStopper,
}

impl WatchPump {
    /// Watches `path` (the initial fire included) and sends `map(event path)` for each event.
    pub(super) fn start(
        store: &dyn XenbusStore,
        path: &str,
        queue: Arc<EventQueue>,
        map: impl Fn(String) -> Event + Send + 'static,
    ) -> xenstore_proto::client::Result<WatchPump> {
        let mut watch = store.watch(path)?;
        let stopper = watch.stopper();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let name = path.to_owned();
        let spawned = std::thread::Builder::new()
            .name("xs-watch".into())
            .spawn(move || loop {
                if flag.load(Ordering::Acquire) {
                    return;
                }
                match watch.next_event(None) {
                    Ok(Some(ev)) => queue.push(map(ev.path)),
                    Ok(None) => {}
                    Err(e) => {
                        // The flag is set before the stop ends the watch: a stopped pump's
                        // `WatchEnded` is never reported as a lost watch.
                        if !flag.load(Ordering::Acquire) {
                            tracing::error!("watch on {name} ended: {e}");
                            queue.push(Event::WatchLost(name));
                        }
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            return Err(xenstore_proto::client::Error::Io(e));
        }
        Ok(WatchPump { stop, stopper })
    }
}

impl Drop for WatchPump {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.stopper.stop();
    }
}
