//! The committed node tree and permission checks.

use std::cell::Cell;
use std::collections::HashMap;

use crate::wire::{PermKind, Perms};

/// One node: a value, its permissions, its children's names (in creation order, as
/// xenstored lists them) and the generation of its last change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    pub value: Vec<u8>,
    pub perms: Perms,
    pub children: Vec<String>,
    pub generation: u64,
}

impl Node {
    pub fn new(perms: Perms) -> Node {
        Node {
            value: Vec::new(),
            perms,
            children: Vec::new(),
            generation: 0,
        }
    }

    pub fn owner(&self) -> u32 {
        self.perms.owner().unwrap_or(0)
    }
}

/// The committed store: every node by absolute path, and how many nodes each domain owns.
#[derive(Debug)]
pub(crate) struct Tree {
    pub nodes: HashMap<String, Node>,
    /// Bumped on every change; a node's `generation` is the value at its last change.
    generation: Cell<u64>,
    owned: HashMap<u32, u32>,
}

impl Tree {
    /// A tree holding what xenstored creates at start: `/`, `/tool`, `/tool/xenstored`.
    pub fn new() -> Tree {
        let mut tree = Tree {
            nodes: HashMap::new(),
            generation: Cell::new(0),
            owned: HashMap::new(),
        };
        let perms = Perms::owned_by(0, PermKind::None);
        let mut root = Node::new(perms.clone());
        root.children.push("tool".into());
        tree.set("/", root);
        let mut tool = Node::new(perms.clone());
        tool.children.push("xenstored".into());
        tree.set("/tool", tool);
        tree.set("/tool/xenstored", Node::new(perms));
        tree
    }

    pub fn next_generation(&self) -> u64 {
        let g = self.generation.get() + 1;
        self.generation.set(g);
        g
    }

    pub fn owned(&self, domid: u32) -> u32 {
        self.owned.get(&domid).copied().unwrap_or(0)
    }

    /// Stores a node with a fresh generation, keeping the per-owner counts.
    pub fn set(&mut self, path: &str, mut node: Node) {
        node.generation = self.next_generation();
        *self.owned.entry(node.owner()).or_insert(0) += 1;
        if let Some(old) = self.nodes.insert(path.to_owned(), node) {
            self.disown(old.owner());
        }
    }

    /// Deletes one node (not its children), keeping the per-owner counts.
    pub fn remove(&mut self, path: &str) {
        self.next_generation();
        if let Some(old) = self.nodes.remove(path) {
            self.disown(old.owner());
        }
    }

    fn disown(&mut self, domid: u32) {
        if let Some(n) = self.owned.get_mut(&domid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.owned.remove(&domid);
            }
        }
    }

    /// Checks the tree's invariants; returns what is wrong (`CONTROL check`, tests, fuzzing).
    pub fn check(&self) -> Result<(), String> {
        let root = self.nodes.get("/").ok_or("no root")?;
        let mut seen = 0usize;
        let mut stack = vec![("/".to_owned(), root)];
        let mut owned: HashMap<u32, u32> = HashMap::new();
        while let Some((path, node)) = stack.pop() {
            seen += 1;
            *owned.entry(node.owner()).or_insert(0) += 1;
            if node.perms.0.is_empty() {
                return Err(format!("{path}: no permissions"));
            }
            for (i, child) in node.children.iter().enumerate() {
                if node.children[..i].contains(child) {
                    return Err(format!("{path}: duplicate child {child}"));
                }
                let cpath = join(&path, child);
                let cnode = self
                    .nodes
                    .get(&cpath)
                    .ok_or_else(|| format!("{path}: missing child {child}"))?;
                stack.push((cpath, cnode));
            }
        }
        if seen != self.nodes.len() {
            return Err(format!(
                "{} nodes reachable, {} stored",
                seen,
                self.nodes.len()
            ));
        }
        if owned != self.owned {
            return Err(format!(
                "owner counts {:?} != recount {owned:?}",
                self.owned
            ));
        }
        Ok(())
    }
}

/// `parent/name`.
pub(crate) fn join(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// The parent of an absolute path other than `/`.
pub(crate) fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// The last component of an absolute path other than `/`.
pub(crate) fn basename(path: &str) -> &str {
    path.rfind('/').map_or(path, |i| &path[i + 1..])
}

/// Drops `domid` from a permission list as xenstored does when the domain goes: an owner entry
/// naming it passes to dom0, other entries naming it are removed.
pub(crate) fn forget_domid(perms: &mut Perms, domid: u32) {
    let Some(first) = perms.0.first_mut() else {
        return;
    };
    if first.domid == domid {
        first.domid = 0;
    }
    let first = *first;
    let rest = perms.0[1..].iter().filter(|p| p.domid != domid).copied();
    perms.0 = std::iter::once(first).chain(rest).collect();
}

/// Access bits, as xenstored's `XS_PERM_*`.
pub(crate) const READ: u8 = 1;
pub(crate) const WRITE: u8 = 2;
pub(crate) const OWNER: u8 = 4;

/// Who is asking: a domain, the domain it targets (`SET_TARGET`), and whether it is privileged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller {
    pub domid: u32,
    pub target: Option<u32>,
}

impl Caller {
    pub fn privileged(&self) -> bool {
        self.domid == 0
    }

    fn is(&self, domid: u32) -> bool {
        domid == self.domid || Some(domid) == self.target
    }

    /// xenstored's `perm_for_conn`: owners (and their targeters) and dom0 get everything; else
    /// the first entry naming the caller; else the owner entry's default.
    pub fn access(&self, perms: &Perms) -> u8 {
        let Some(first) = perms.0.first() else {
            return 0;
        };
        if self.privileged() || self.is(first.domid) {
            return READ | WRITE | OWNER;
        }
        let kind = perms.0[1..]
            .iter()
            .find(|p| self.is(p.domid))
            .map_or(first.kind, |p| p.kind);
        let mut bits = 0;
        if kind.can_read() {
            bits |= READ;
        }
        if kind.can_write() {
            bits |= WRITE;
        }
        bits
    }
}
