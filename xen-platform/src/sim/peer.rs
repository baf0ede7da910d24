//! Who is on the other end of a host socket: the connecting process (`SO_PEERCRED`) and the
//! process tree in `/proc`, from which the host tells which simulated domain a process is in
//! (it, or its nearest ancestor, was adopted into the domain).

use std::collections::HashMap;
use std::os::fd::AsFd;

/// How far up the process tree a walk goes before giving up (a loop would be a kernel bug;
/// this only bounds the work).
const MAX_DEPTH: usize = 4096;

/// The pid and uid of the process that connected `conn` (`SO_PEERCRED`, recorded by the
/// kernel at `connect`), or `None` if the kernel could not give them (a peer in a pid
/// namespace this process cannot see reads as pid 0).
pub fn peer_cred(conn: impl AsFd) -> Option<(u32, u32)> {
    let cred = rustix::net::sockopt::socket_peercred(conn).ok()?;
    let pid = u32::try_from(cred.pid.as_raw_nonzero().get()).ok()?;
    Some((pid, cred.uid.as_raw()))
}

/// The parent of `pid` (field 4 of `/proc/<pid>/stat`), or `None` if `pid` is gone.
pub fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_ppid(&stat)
}

/// `pid (comm) state ppid ...`; `comm` may hold spaces and parentheses, so split after the
/// last `)`.
fn parse_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// `pid` and its ancestors, nearest first, up to (not including) pid 0. `Err` names the
/// process whose parent could not be read (it exited meanwhile).
pub fn ancestry(pid: u32) -> Result<Vec<u32>, u32> {
    let mut chain = vec![pid];
    let mut p = pid;
    while p > 1 && chain.len() < MAX_DEPTH {
        p = parent(p).ok_or(p)?;
        if p == 0 {
            break;
        }
        chain.push(p);
    }
    Ok(chain)
}

/// Every process's parent, from one pass over `/proc` (processes that exit meanwhile are
/// skipped).
pub fn process_tree() -> HashMap<u32, u32> {
    let mut tree = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return tree;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(ppid) = parent(pid) {
            tree.insert(pid, ppid);
        }
    }
    tree
}

/// The processes of `tree` that are one of `roots` or descend from one.
pub fn descendants(tree: &HashMap<u32, u32>, roots: &[u32]) -> Vec<u32> {
    tree.keys()
        .copied()
        .filter(|&pid| {
            let mut p = pid;
            for _ in 0..MAX_DEPTH {
                if roots.contains(&p) {
                    return true;
                }
                match tree.get(&p) {
                    Some(&pp) if pp > 0 => p = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ppid_after_a_comm_with_parentheses_and_spaces() {
        assert_eq!(parse_ppid("42 (a) b (c)) S 7 42 42 0"), Some(7));
        assert_eq!(parse_ppid("42 (sh) R 1 0"), Some(1));
        assert_eq!(parse_ppid("42 (sh"), None);
        assert_eq!(parse_ppid("42 (sh) S x"), None);
    }

    #[test]
    fn this_process_descends_from_its_parent() {
        let me = std::process::id();
        let chain = ancestry(me).unwrap();
        assert_eq!(chain[0], me);
        assert_eq!(chain.get(1).copied(), parent(me));
        let tree = process_tree();
        let mine = descendants(&tree, &[chain[1]]);
        assert!(mine.contains(&me));
        assert!(!descendants(&tree, &[me]).contains(&chain[1]));
    }
}
