//! Watches and the events that fire them.

use crate::wire::Perms;

use super::tree::Caller;

/// One watch of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Watch {
    /// Absolute (or `@special`) path watched.
    pub path: String,
    pub token: String,
    /// Bytes to strip from event paths: the `/local/domain/<id>/` prefix of a relative watch.
    pub prefix_len: usize,
    /// Levels below `path` that fire it (`XENSTORE_SERVER_FEATURE_WATCHDEPTH`); `None`: all.
    pub depth: Option<u32>,
}

/// How an event path is matched against watch paths (xenstored's `enum watch_match`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Match {
    /// Watches on the path or any of its parents (an ordinary change).
    Subtree,
    /// Watches on exactly this path (a node removed with its parent).
    Exact,
    /// `@special/<domid>`: the exact special watch, or depth-limited watches above it.
    Depth,
    /// `@special`: only watches on exactly it without a depth.
    NoDepth,
}

/// A change to fire watches for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    pub path: String,
    pub kind: Match,
    /// The caller may see the event if it may read under one of these permission sets (the
    /// node's old and new permissions, and its parent's); empty for special events.
    pub perms: Vec<Perms>,
}

/// `child` is `parent` or below it, at most `depth` levels down.
pub(crate) fn is_child(child: &str, parent: &str, depth: Option<u32>) -> bool {
    let rest = if parent == "/" {
        match child.strip_prefix('/') {
            Some("") => return true,
            Some(rest) => rest,
            None => return false,
        }
    } else {
        match child.strip_prefix(parent) {
            Some("") => return true,
            Some(rest) => match rest.strip_prefix('/') {
                Some(rest) => rest,
                None => return false,
            },
            None => return false,
        }
    };
    match depth {
        None => true,
        Some(d) => rest.split('/').count() <= d as usize,
    }
}

impl Watch {
    pub fn matches(&self, event: &Event) -> bool {
        match event.kind {
            Match::Subtree => is_child(&event.path, &self.path, self.depth),
            Match::Exact => event.path == self.path,
            Match::Depth => {
                event.path == self.path
                    || (self.depth.is_some_and(|d| d > 0)
                        && is_child(&event.path, &self.path, self.depth))
            }
            Match::NoDepth => event.path == self.path && self.depth.is_none(),
        }
    }

    /// The path reported for `event`: relative when the watch was set relative.
    pub fn event_path<'e>(&self, event: &'e Event) -> &'e str {
        event.path.get(self.prefix_len..).unwrap_or(&event.path)
    }
}

impl Event {
    /// Whether `caller` may be told about this event (xenstored's `watch_permitted`).
    pub fn visible_to(&self, caller: &Caller) -> bool {
        caller.privileged()
            || self.perms.is_empty()
            || self
                .perms
                .iter()
                .any(|p| caller.access(p) & super::tree::READ != 0)
    }
}
