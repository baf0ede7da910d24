//! Transactions: private changes over the committed tree, committed atomically when nothing
//! they read or wrote changed meanwhile (else `EAGAIN`), as xenstored's generation check.
//! A transaction keeps a copy of every committed node it looked at, as first seen, and keeps
//! seeing that copy (xenstored writes the same transaction-private copy on first read): a
//! change committed by someone else after that shows through only as the commit's `EAGAIN`.

use std::collections::HashMap;

use super::tree::{Node, Tree};
use super::watch::Event;

/// An open transaction of one connection.
#[derive(Debug, Default)]
pub(crate) struct Txn {
    /// Nodes this transaction changed: `None` means deleted.
    pub overlay: HashMap<String, Option<Node>>,
    /// Committed nodes it looked at, as it first saw them (`None`: absent). Their generation
    /// is what the commit checks.
    pub accessed: HashMap<String, Option<Node>>,
    /// Watch events to fire if it commits.
    pub events: Vec<Event>,
    /// Change in nodes owned, per domain.
    delta: HashMap<u32, i64>,
}

impl Txn {
    pub fn adjust(&mut self, old_owner: Option<u32>, new_owner: Option<u32>) {
        if let Some(d) = old_owner {
            *self.delta.entry(d).or_insert(0) -= 1;
        }
        if let Some(d) = new_owner {
            *self.delta.entry(d).or_insert(0) += 1;
        }
    }

    /// Nodes this transaction has touched (xenstored's `transaction-nodes` count).
    pub fn size(&self) -> usize {
        self.accessed.len() + self.overlay.len()
    }

    pub fn owned_delta(&self, domid: u32) -> i64 {
        self.delta.get(&domid).copied().unwrap_or(0)
    }

    /// Whether committing now would conflict: something it accessed changed since.
    pub fn conflicts(&self, tree: &Tree) -> bool {
        self.accessed.iter().any(|(path, seen)| {
            tree.nodes.get(path).map(|n| n.generation) != seen.as_ref().map(|n| n.generation)
        })
    }

    /// Applies the changes to the tree (after [`Txn::conflicts`] said no) and returns the
    /// queued watch events.
    pub fn apply(self, tree: &mut Tree) -> Vec<Event> {
        for (path, node) in self.overlay {
            match node {
                Some(node) => tree.set(&path, node),
                None => tree.remove(&path),
            }
        }
        self.events
    }
}
