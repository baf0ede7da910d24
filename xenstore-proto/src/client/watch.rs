//! Watches: a stream (tokio) or iterator (blocking) of the paths that changed.
//!
//! Each watch gets its own token, so events are routed to exactly the watch that asked for
//! them. The first event is xenstored's initial fire on the watched path itself. Spurious
//! events are normal (xenstored fires on any change below the path, and again after a
//! transaction commits): treat an event as "look again", never as "this changed".

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc;

use super::async_client::AsyncClient;
use super::blocking::Runtime;
use super::{Error, Result};

/// One watch firing: `path` is the node that changed (or the watched path on the initial fire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    pub path: String,
    pub token: String,
}

/// A watch on a tokio client: a [`Stream`](futures_core::Stream) of events. When the
/// connection dies the stream yields one [`Error::ConnectionLost`] and ends; after
/// `reset_watches` it just ends. Dropping it unwatches.
pub struct AsyncWatch {
    client: AsyncClient,
    path: String,
    token: String,
    events: mpsc::UnboundedReceiver<WatchEvent>,
    /// The watch is registered with the daemon (not yet unwatched).
    registered: bool,
    /// The stream has ended (and reported why).
    finished: bool,
}

impl std::fmt::Debug for AsyncWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncWatch")
            .field("path", &self.path)
            .field("token", &self.token)
            .finish()
    }
}

impl AsyncWatch {
    pub(crate) fn new(
        client: AsyncClient,
        path: String,
        token: String,
        events: mpsc::UnboundedReceiver<WatchEvent>,
    ) -> AsyncWatch {
        AsyncWatch {
            client,
            path,
            token,
            events,
            registered: true,
            finished: false,
        }
    }

    /// The watched path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The token the daemon echoes in this watch's events.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The next event; `None` once the stream has ended.
    pub async fn next(&mut self) -> Option<Result<WatchEvent>> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// An event already received, without waiting.
    pub fn try_next(&mut self) -> Option<WatchEvent> {
        self.events.try_recv().ok()
    }

    /// Polls for the next event (the [`Stream`](futures_core::Stream) implementation).
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<WatchEvent>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        match self.events.poll_recv(cx) {
            Poll::Ready(Some(event)) => Poll::Ready(Some(Ok(event))),
            Poll::Ready(None) => {
                self.finished = true;
                Poll::Ready(
                    self.client
                        .connection_lost()
                        .map(|reason| Err(Error::ConnectionLost { reason })),
                )
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Unwatches and waits for the daemon to confirm.
    pub async fn unwatch(mut self) -> Result<()> {
        self.registered = false;
        self.client.unwatch(&self.path, &self.token).await
    }

    /// A handle that ends this watch from another thread (see [`WatchStopper`]).
    pub fn stopper(&self) -> WatchStopper {
        WatchStopper {
            client: self.client.clone(),
            path: self.path.clone(),
            token: self.token.clone(),
        }
    }
}

/// Ends a watch from any thread, without waiting: the daemon is told to unwatch, and the
/// watch's stream ends once the events already received are taken, so a thread blocked on
/// [`Watch::next_timeout`] wakes with [`Error::WatchEnded`]. This is how a thread that waits
/// on a watch with no timeout is stopped, instead of waking now and then to look at a flag.
#[derive(Clone)]
pub struct WatchStopper {
    client: AsyncClient,
    path: String,
    token: String,
}

impl std::fmt::Debug for WatchStopper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStopper")
            .field("path", &self.path)
            .field("token", &self.token)
            .finish()
    }
}

impl WatchStopper {
    /// Ends the watch (a second call, or one after the watch was dropped, does nothing).
    pub fn stop(&self) {
        if self.client.has_watch(&self.token) && self.client.connection_lost().is_none() {
            self.client.unwatch_detached(&self.path, &self.token);
        }
    }
}

impl futures_core::Stream for AsyncWatch {
    type Item = Result<WatchEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx)
    }
}

impl Drop for AsyncWatch {
    fn drop(&mut self) {
        // A stopped watch ([`WatchStopper`]) was unwatched already.
        if self.registered
            && self.client.connection_lost().is_none()
            && self.client.has_watch(&self.token)
        {
            self.client.unwatch_detached(&self.path, &self.token);
        }
    }
}

/// A watch on a blocking client: an iterator of events that blocks for the next one. When the
/// connection dies it yields one [`Error::ConnectionLost`] and ends. Dropping it unwatches.
pub struct Watch {
    // Declared before `rt` so the watch is unwatched before the runtime can go away.
    inner: AsyncWatch,
    rt: Arc<Runtime>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Watch {
    pub(crate) fn new(inner: AsyncWatch, rt: Arc<Runtime>) -> Watch {
        Watch { inner, rt }
    }

    /// The watched path.
    pub fn path(&self) -> &str {
        self.inner.path()
    }

    /// The token the daemon echoes in this watch's events.
    pub fn token(&self) -> &str {
        self.inner.token()
    }

    /// The next event, waiting at most `timeout` (`None`: forever). `Ok(None)` when the
    /// timeout passed first; [`Error::ConnectionLost`] when the connection died;
    /// [`Error::WatchEnded`] once the stream has ended.
    pub fn next_timeout(&mut self, timeout: Option<Duration>) -> Result<Option<WatchEvent>> {
        let inner = &mut self.inner;
        let item = match timeout {
            None => self.rt.block_on(inner.next()),
            Some(t) => match self
                .rt
                .block_on(async { tokio::time::timeout(t, inner.next()).await })
            {
                Ok(item) => item,
                Err(_elapsed) => return Ok(None),
            },
        };
        match item {
            Some(item) => item.map(Some),
            None => Err(Error::WatchEnded),
        }
    }

    /// An event already received, without waiting.
    pub fn try_next(&mut self) -> Option<WatchEvent> {
        self.inner.try_next()
    }

    /// A handle that ends this watch from another thread (see [`WatchStopper`]).
    pub fn stopper(&self) -> WatchStopper {
        self.inner.stopper()
    }

    /// Unwatches and waits for the daemon to confirm.
    pub fn unwatch(self) -> Result<()> {
        let Watch { inner, rt } = self;
        rt.block_on(inner.unwatch())
    }
}

impl Iterator for Watch {
    type Item = Result<WatchEvent>;

    fn next(&mut self) -> Option<Self::Item> {
        let inner = &mut self.inner;
        self.rt.block_on(inner.next())
    }
}
