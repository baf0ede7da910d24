//! Matching replies to requests by `req_id`, and watch events to watches by token.
//!
//! The reader task owns nothing but an `Arc<Demux>`: it hands every frame to [`Demux::dispatch`].
//! Waiters hold a oneshot receiver; when the connection dies every sender is dropped, so a
//! waiter learns of it at once and reads the reason from [`Demux::lost_reason`].

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::{mpsc, oneshot};

use super::watch::WatchEvent;
use super::Error;
use crate::wire::{MsgType, Packet, Response};

#[derive(Default)]
struct State {
    next_req_id: u32,
    pending: HashMap<u32, oneshot::Sender<Vec<u8>>>,
    watches: HashMap<String, mpsc::UnboundedSender<WatchEvent>>,
    next_token: u64,
    lost: Option<String>,
}

/// The per-connection table of requests in flight and active watches.
#[derive(Default)]
pub(crate) struct Demux {
    state: Mutex<State>,
}

impl Demux {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves the maps consistent (single inserts/removes).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates a `req_id` not in flight and a slot for its reply.
    pub(crate) fn register(&self) -> Result<(u32, oneshot::Receiver<Vec<u8>>), Error> {
        let mut st = self.lock();
        if let Some(reason) = &st.lost {
            return Err(Error::ConnectionLost {
                reason: reason.clone(),
            });
        }
        let mut id = st.next_req_id;
        while st.pending.contains_key(&id) {
            id = id.wrapping_add(1);
        }
        st.next_req_id = id.wrapping_add(1);
        let (tx, rx) = oneshot::channel();
        st.pending.insert(id, tx);
        Ok((id, rx))
    }

    /// Forgets a request whose caller stopped waiting; a late reply is then dropped.
    pub(crate) fn cancel(&self, req_id: u32) {
        self.lock().pending.remove(&req_id);
    }

    /// A fresh watch token and the channel its events arrive on.
    pub(crate) fn add_watch(
        &self,
        prefix: &str,
    ) -> Result<(String, mpsc::UnboundedReceiver<WatchEvent>), Error> {
        let mut st = self.lock();
        if let Some(reason) = &st.lost {
            return Err(Error::ConnectionLost {
                reason: reason.clone(),
            });
        }
        let token = format!("{prefix}{}", st.next_token);
        st.next_token += 1;
        let (tx, rx) = mpsc::unbounded_channel();
        st.watches.insert(token.clone(), tx);
        Ok((token, rx))
    }

    /// Stops delivering events for `token` (its stream ends).
    pub(crate) fn remove_watch(&self, token: &str) {
        self.lock().watches.remove(token);
    }

    /// Whether events for `token` are still delivered.
    pub(crate) fn has_watch(&self, token: &str) -> bool {
        self.lock().watches.contains_key(token)
    }

    /// Ends every watch stream (after `RESET_WATCHES`).
    pub(crate) fn clear_watches(&self) {
        self.lock().watches.clear();
    }

    /// Why the connection died, if it did.
    pub(crate) fn lost_reason(&self) -> Option<String> {
        self.lock().lost.clone()
    }

    /// The error a waiter reports when its reply slot was dropped.
    pub(crate) fn lost_error(&self) -> Error {
        Error::ConnectionLost {
            reason: self
                .lost_reason()
                .unwrap_or_else(|| "connection closed".to_owned()),
        }
    }

    /// Marks the connection dead and wakes every waiter and watch (their senders drop here).
    pub(crate) fn fail_all(&self, reason: String) {
        let (pending, watches) = {
            let mut st = self.lock();
            if st.lost.is_none() {
                st.lost = Some(reason.clone());
            }
            (
                std::mem::take(&mut st.pending),
                std::mem::take(&mut st.watches),
            )
        };
        tracing::debug!(
            %reason,
            waiters = pending.len(),
            watches = watches.len(),
            "xenstore connection lost"
        );
        drop(pending);
        drop(watches);
    }

    /// Routes one whole frame from the daemon. An error means the stream is corrupt.
    pub(crate) fn dispatch(&self, frame: Vec<u8>) -> Result<(), String> {
        let packet = Packet::new_checked(&frame[..]).map_err(|e| e.to_string())?;
        if packet.msg_type() == Ok(MsgType::WatchEvent) {
            let event = match Response::parse(MsgType::WatchEvent, packet.payload()) {
                Ok(Response::WatchEvent { path, token }) => WatchEvent {
                    path: path.to_owned(),
                    token: token.to_owned(),
                },
                Ok(_) => unreachable!("WATCH_EVENT parses to WatchEvent"),
                Err(e) => return Err(format!("malformed WATCH_EVENT: {e}")),
            };
            let st = self.lock();
            match st.watches.get(&event.token) {
                // A send error means the watch is being dropped: nothing to deliver to.
                Some(sink) => {
                    let _ = sink.send(event);
                }
                None => tracing::debug!(token = %event.token, path = %event.path,
                    "watch event for no active watch"),
            }
            return Ok(());
        }
        let req_id = packet.req_id();
        let waiter = self.lock().pending.remove(&req_id);
        match waiter {
            // The caller may have given up meanwhile; then the reply is dropped.
            Some(waiter) => {
                let _ = waiter.send(frame);
            }
            None => tracing::warn!(req_id, "xenstore reply for no request in flight"),
        }
        Ok(())
    }
}

/// Forgets the request if the waiting future is dropped before its reply arrives.
pub(crate) struct PendingGuard<'a> {
    pub(crate) demux: &'a Demux,
    pub(crate) req_id: u32,
    pub(crate) armed: bool,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.demux.cancel(self.req_id);
        }
    }
}
