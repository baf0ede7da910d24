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

/// When `pid` started (field 22 of `/proc/<pid>/stat`, clock ticks since boot), or `None` if
/// it is gone: a pid plus its start time names one process, even after the pid is reused.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_field(&stat, 22)?.parse().ok()
}

/// `pid (comm) state ppid ...`; `comm` may hold spaces and parentheses, so split after the
/// last `)`.
fn parse_ppid(stat: &str) -> Option<u32> {
    stat_field(stat, 4)?.parse().ok()
}

/// Field `n` (1-based, as in proc(5)) of a `/proc/<pid>/stat` line; `n` ≥ 3.
fn stat_field(stat: &str, n: usize) -> Option<&str> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(n.checked_sub(3)?)
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
        let stat = "42 (a) b) S 7 42 42 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 98765 1 2";
        assert_eq!(stat_field(stat, 22), Some("98765"));
    }

    #[test]
    fn a_process_keeps_its_start_time() {
        let me = std::process::id();
        assert!(start_time(me).is_some());
        assert_eq!(start_time(me), start_time(me));
        assert_eq!(start_time(u32::MAX), None);
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
