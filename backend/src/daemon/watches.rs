//! One thread per XenStore watch, forwarding its events to the daemon's queue (the blocking
//! client's watches are iterators; the queue lets one thread wait on all of them, and merges
//! repeated events, so a storm of them costs one entry).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xenstore_proto::client::XenbusStore;

use super::queue::EventQueue;
use super::Event;

/// How long a forwarder waits for an event before it checks whether it should stop.
const STOP_CHECK: Duration = Duration::from_millis(500);

/// A running watch forwarder; dropping it stops the thread (which unwatches).
pub(super) struct WatchPump {
    stop: Arc<AtomicBool>,
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
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let name = path.to_owned();
        let spawned = std::thread::Builder::new()
            .name("xs-watch".into())
            .spawn(move || loop {
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                match watch.next_event(Some(STOP_CHECK)) {
                    Ok(Some(ev)) => queue.push(map(ev.path)),
                    Ok(None) => {}
                    Err(e) => {
                        if !flag.load(Ordering::Relaxed) {
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
        Ok(WatchPump { stop })
    }
}

impl Drop for WatchPump {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
