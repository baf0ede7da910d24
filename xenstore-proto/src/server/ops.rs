//! The node operations (READ, WRITE, MKDIR, RM, DIRECTORY, DIRECTORY_PART, GET/SET_PERMS) on a
//! [`View`], with xenstored's permission checks and error choices.

use crate::wire::{Perms, XsErrno, PAYLOAD_MAX};

use super::config::Quotas;
use super::tree::{basename, join, parent, Caller, Node, OWNER, READ, WRITE};
use super::txn::View;
use super::watch::{Event, Match};

/// Checks that `path` exists and `caller` has `need` on it. A missing node is `ENOENT` only
/// when the caller may see the nearest existing parent, else `EACCES`, so that errors do not
/// reveal what the caller cannot read (xenstored's `errno_from_parents`).
pub(crate) fn check(view: &mut View, caller: &Caller, path: &str, need: u8) -> Result<(), XsErrno> {
    if let Some(node) = view.get(path) {
        return if caller.access(&node.perms) & need == need {
            Ok(())
        } else {
            Err(XsErrno::EACCES)
        };
    }
    let mut p = path;
    while p != "/" {
        p = parent(p);
        if let Some(node) = view.get(p) {
            return Err(if caller.access(&node.perms) & need != 0 {
                XsErrno::ENOENT
            } else {
                XsErrno::EACCES
            });
        }
    }
    Err(XsErrno::EACCES)
}

fn node<'v>(view: &'v mut View, path: &str) -> &'v Node {
    view.get(path).expect("checked node exists")
}

/// Permissions under which a watcher may see an event on `path`: the node's and its parent's.
fn event_perms(view: &mut View, path: &str, node_perms: &Perms) -> Vec<Perms> {
    let mut perms = vec![node_perms.clone()];
    if path != "/" {
        if let Some(p) = view.get(parent(path)) {
            perms.push(p.perms.clone());
        }
    }
    perms
}

pub(crate) fn read(view: &mut View, caller: &Caller, path: &str) -> Result<Vec<u8>, XsErrno> {
    check(view, caller, path, READ)?;
    Ok(node(view, path).value.clone())
}

pub(crate) fn directory(
    view: &mut View,
    caller: &Caller,
    path: &str,
) -> Result<Vec<String>, XsErrno> {
    check(view, caller, path, READ)?;
    Ok(node(view, path).children.clone())
}

pub(crate) fn get_perms(view: &mut View, caller: &Caller, path: &str) -> Result<Perms, XsErrno> {
    check(view, caller, path, READ)?;
    Ok(node(view, path).perms.clone())
}

/// One `DIRECTORY_PART` chunk: the node's generation, and as many whole names from byte
/// `offset` of the nul-separated child list as fit in a reply; `complete` on the last chunk
/// (which then ends with an extra empty string, as xenstored sends it).
pub(crate) struct Part {
    pub generation: u64,
    pub children: Vec<String>,
    pub complete: bool,
}

pub(crate) fn directory_part(
    view: &mut View,
    caller: &Caller,
    path: &str,
    offset: u32,
) -> Result<Part, XsErrno> {
    check(view, caller, path, READ)?;
    let node = node(view, path);
    let mut list = Vec::new();
    for child in &node.children {
        list.extend_from_slice(child.as_bytes());
        list.push(0);
    }
    let generation = node.generation;
    let off = offset as usize;
    if off >= list.len() {
        return Ok(Part {
            generation,
            children: Vec::new(),
            complete: true,
        });
    }
    // Room for the generation, the names and the end marker.
    let max = PAYLOAD_MAX - (generation.to_string().len() + 1) - 1;
    let mut end = off;
    while end < list.len() {
        let next = list[end..]
            .iter()
            .position(|&b| b == 0)
            .map_or(list.len(), |i| end + i + 1);
        if next - off > max {
            break;
        }
        end = next;
    }
    if end == off {
        // A single name longer than a chunk cannot be returned.
        return Err(XsErrno::E2BIG);
    }
    let children = list[off..end - 1]
        .split(|&b| b == 0)
        .map(|name| String::from_utf8_lossy(name).into_owned())
        .collect();
    Ok(Part {
        generation,
        children,
        complete: end == list.len(),
    })
}

pub(crate) fn write(
    view: &mut View,
    caller: &Caller,
    quotas: &Quotas,
    path: &str,
    value: &[u8],
    events: &mut Vec<Event>,
) -> Result<(), XsErrno> {
    match check(view, caller, path, WRITE) {
        Ok(()) => {
            let mut node = node(view, path).clone();
            node.value = value.to_vec();
            check_size(caller, quotas, &node)?;
            let perms = event_perms(view, path, &node.perms);
            view.set(path, node);
            events.push(Event {
                path: path.to_owned(),
                kind: Match::Subtree,
                perms,
            });
            Ok(())
        }
        Err(XsErrno::ENOENT) => create(view, caller, quotas, path, value, events),
        Err(e) => Err(e),
    }
}

/// The size xenstored charges a node against `node-size`: its whole database record — a
/// 24-byte header, 8 bytes per permission, the value and the nul-terminated children names.
/// So a domain's directory can only list so many children.
fn record_size(node: &Node) -> usize {
    24 + 8 * node.perms.0.len()
        + node.value.len()
        + node.children.iter().map(|c| c.len() + 1).sum::<usize>()
}

fn check_size(caller: &Caller, quotas: &Quotas, node: &Node) -> Result<(), XsErrno> {
    if !caller.privileged() && record_size(node) > quotas.node_size as usize {
        return Err(XsErrno::ENOSPC);
    }
    Ok(())
}

pub(crate) fn mkdir(
    view: &mut View,
    caller: &Caller,
    quotas: &Quotas,
    path: &str,
    events: &mut Vec<Event>,
) -> Result<(), XsErrno> {
    match check(view, caller, path, WRITE) {
        Ok(()) => Ok(()),
        Err(XsErrno::ENOENT) => create(view, caller, quotas, path, b"", events),
        Err(e) => Err(e),
    }
}

/// Creates `path` and its missing parents. New nodes copy their parent's permissions; one an
/// unprivileged domain creates is owned by that domain (xenstored's `construct_node`).
fn create(
    view: &mut View,
    caller: &Caller,
    quotas: &Quotas,
    path: &str,
    value: &[u8],
    events: &mut Vec<Event>,
) -> Result<(), XsErrno> {
    let mut missing = vec![path];
    let mut top = parent(path);
    while view.get(top).is_none() {
        missing.push(top);
        top = parent(top);
    }
    if !caller.privileged()
        && u64::from(view.owned(caller.domid)) + missing.len() as u64 > u64::from(quotas.nodes)
    {
        return Err(XsErrno::ENOSPC);
    }
    // Sizes are checked before anything changes: the existing parent gains a child name and
    // the new leaf holds the value (the nodes in between hold one short name each).
    let mut parent_node = node(view, top).clone();
    let first_new = missing.last().copied().unwrap_or(path);
    parent_node.children.push(basename(first_new).to_owned());
    check_size(caller, quotas, &parent_node)?;
    parent_node.children.pop();
    let mut leaf = Node::new(parent_node.perms.clone());
    leaf.value = value.to_vec();
    check_size(caller, quotas, &leaf)?;
    let mut parent_path = top.to_owned();
    for (i, name) in missing.iter().rev().enumerate() {
        let mut perms = parent_node.perms.clone();
        if !caller.privileged() {
            perms.0[0].domid = caller.domid;
        }
        let mut child = Node::new(perms);
        if i + 1 == missing.len() {
            child.value = value.to_vec();
        }
        parent_node.children.push(basename(name).to_owned());
        view.set(&parent_path, parent_node);
        parent_path = (*name).to_owned();
        parent_node = child;
    }
    let perms = event_perms(view, path, &parent_node.perms);
    view.set(path, parent_node);
    events.push(Event {
        path: path.to_owned(),
        kind: Match::Subtree,
        perms,
    });
    Ok(())
}

pub(crate) fn rm(
    view: &mut View,
    caller: &Caller,
    path: &str,
    events: &mut Vec<Event>,
) -> Result<(), XsErrno> {
    match check(view, caller, path, WRITE) {
        Ok(()) if path == "/" => Err(XsErrno::EINVAL),
        Ok(()) => {
            remove_subtree(view, path, events);
            Ok(())
        }
        Err(XsErrno::ENOENT) => {
            // Not there: fine, if its parent is.
            if view.get(parent(path)).is_some() {
                Ok(())
            } else {
                Err(XsErrno::ENOENT)
            }
        }
        Err(e) => Err(e),
    }
}

/// Deletes `path` (not `/`) and everything below it, unlinking it from its parent. Fires the
/// removed node's watches and, exactly, those set on each node below it.
pub(crate) fn remove_subtree(view: &mut View, path: &str, events: &mut Vec<Event>) {
    let mut stack = vec![path.to_owned()];
    let mut doomed = Vec::new();
    while let Some(p) = stack.pop() {
        let Some(node) = view.get(&p) else { continue };
        let perms = node.perms.clone();
        for child in &node.children {
            stack.push(join(&p, child));
        }
        let mut ev_perms = event_perms(view, &p, &perms);
        ev_perms.dedup();
        events.push(Event {
            kind: if p == path {
                Match::Subtree
            } else {
                Match::Exact
            },
            path: p.clone(),
            perms: ev_perms,
        });
        doomed.push(p);
    }
    for p in doomed.iter().rev() {
        view.remove(p);
    }
    let parent_path = parent(path);
    if let Some(parent_node) = view.get(parent_path) {
        let mut parent_node = parent_node.clone();
        let name = basename(path);
        parent_node.children.retain(|c| c != name);
        view.set(parent_path, parent_node);
    }
}

pub(crate) fn set_perms(
    view: &mut View,
    caller: &Caller,
    quotas: &Quotas,
    path: &str,
    perms: &Perms,
    events: &mut Vec<Event>,
) -> Result<(), XsErrno> {
    if perms.0.is_empty() {
        return Err(XsErrno::EINVAL);
    }
    if !caller.privileged() && perms.0.len() > quotas.node_permissions as usize {
        return Err(XsErrno::ENOSPC);
    }
    check(view, caller, path, WRITE | OWNER)?;
    let mut node = node(view, path).clone();
    if !caller.privileged() && perms.owner() != Some(node.owner()) {
        return Err(XsErrno::EPERM);
    }
    let mut ev_perms = event_perms(view, path, &node.perms);
    ev_perms.push(perms.clone());
    node.perms = perms.clone();
    view.set(path, node);
    events.push(Event {
        path: path.to_owned(),
        kind: Match::Subtree,
        perms: ev_perms,
    });
    Ok(())
}
