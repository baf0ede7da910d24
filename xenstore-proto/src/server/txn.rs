//! Transactions: private changes over the committed tree, committed atomically when nothing
//! they read or wrote changed meanwhile (else `EAGAIN`), as xenstored's generation check.
//! A transaction keeps a copy of every committed node it looked at, as first seen, and keeps
//! seeing that copy (xenstored writes the same transaction-private copy on first read): a
//! change committed by someone else after that shows through only as the commit's `EAGAIN`.
//!
//! [`View`] is the store as one request sees it: the committed tree, or a transaction over it.

use std::collections::HashMap;

use super::tree::{Node, Tree};
use super::watch::Event;

/// An open transaction of one connection.
#[derive(Debug, Default)]
pub(crate) struct Txn {
    /// Nodes this transaction changed: `None` means deleted.
    overlay: HashMap<String, Option<Node>>,
    /// Committed nodes it looked at, as it first saw them (`None`: absent). Their generation
    /// is what the commit checks.
    accessed: HashMap<String, Option<Node>>,
    /// Watch events to fire if it commits.
    events: Vec<Event>,
    /// Change in nodes owned, per domain.
    delta: HashMap<u32, i64>,
}

impl Txn {
    fn adjust(&mut self, old_owner: Option<u32>, new_owner: Option<u32>) {
        if let Some(d) = old_owner {
            *self.delta.entry(d).or_insert(0) -= 1;
        }
        if let Some(d) = new_owner {
            *self.delta.entry(d).or_insert(0) += 1;
        }
    }

    /// Queues watch events to fire if it commits.
    pub fn queue_events(&mut self, events: &mut Vec<Event>) {
        self.events.append(events);
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

    /// `path` as this transaction sees it: its own change, else the committed node as first
    /// seen (recording that it looked).
    fn get(&mut self, tree: &Tree, path: &str) -> Option<&Node> {
        if self.overlay.contains_key(path) {
            return self.overlay.get(path).and_then(Option::as_ref);
        }
        self.accessed
            .entry(path.to_owned())
            .or_insert_with(|| tree.nodes.get(path).cloned())
            .as_ref()
    }

    fn set(&mut self, tree: &Tree, path: &str, mut node: Node) {
        let old_owner = self.owner_of(tree, path);
        node.generation = tree.next_generation();
        self.adjust(old_owner, Some(node.owner()));
        self.overlay.insert(path.to_owned(), Some(node));
    }

    fn remove(&mut self, tree: &Tree, path: &str) {
        let old_owner = self.owner_of(tree, path);
        self.adjust(old_owner, None);
        self.overlay.insert(path.to_owned(), None);
    }

    /// Nodes `domid` owns as this transaction sees them.
    fn owned(&self, tree: &Tree, domid: u32) -> u32 {
        let n = i64::from(tree.owned(domid)) + self.owned_delta(domid);
        u32::try_from(n.max(0)).unwrap_or(u32::MAX)
    }

    /// Owner of `path` as this transaction sees it, recording the access.
    fn owner_of(&mut self, tree: &Tree, path: &str) -> Option<u32> {
        self.get(tree, path).map(Node::owner)
    }
}

/// The store as one request sees it: committed, or through an open transaction.
pub(crate) enum View<'a> {
    Direct(&'a mut Tree),
    Txn(&'a Tree, &'a mut Txn),
}

impl View<'_> {
    pub fn get(&mut self, path: &str) -> Option<&Node> {
        match self {
            View::Direct(tree) => tree.nodes.get(path),
            View::Txn(tree, txn) => txn.get(tree, path),
        }
    }

    pub fn set(&mut self, path: &str, node: Node) {
        match self {
            View::Direct(tree) => tree.set(path, node),
            View::Txn(tree, txn) => txn.set(tree, path, node),
        }
    }

    pub fn remove(&mut self, path: &str) {
        match self {
            View::Direct(tree) => tree.remove(path),
            View::Txn(tree, txn) => txn.remove(tree, path),
        }
    }

    /// Nodes `domid` owns as this view sees them.
    pub fn owned(&self, domid: u32) -> u32 {
        match self {
            View::Direct(tree) => tree.owned(domid),
            View::Txn(tree, txn) => txn.owned(tree, domid),
        }
    }
}
