//! What Linux says about a process, read from `/proc`: resident memory, CPU time and the
//! context switches of each thread (how often it went to sleep or was preempted). Used by
//! `vrdma-scale` and the idle-backend test, always on another process (the backend), so the
//! figures are that process's own.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// Memory of a process, in KiB (`/proc/<pid>/status` `VmRSS`, `/proc/<pid>/smaps_rollup` `Pss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    pub rss_kib: u64,
    pub pss_kib: u64,
    /// Address space mapped (`VmSize`): includes guest pages mapped but not touched.
    pub size_kib: u64,
}

/// Reads the process's resident and proportional set sizes.
pub fn memory(pid: u32) -> std::io::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    Ok(Memory {
        rss_kib: kib_field(&status, "VmRSS:").unwrap_or(0),
        pss_kib: kib_field(&rollup, "Pss:").unwrap_or(0),
        size_kib: kib_field(&status, "VmSize:").unwrap_or(0),
    })
}

fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Clock ticks per second of `/proc/<pid>/stat` times (`getconf CLK_TCK`, else the usual 100).
pub fn clock_ticks() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// CPU time the process used so far (user + system, all its threads, dead ones included), in
/// clock ticks (see [`clock_ticks`]).
pub fn cpu_ticks(pid: u32) -> std::io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name is in parentheses and may contain spaces: fields count after the last ')'.
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // After ')': state is field 3 of the man page, so utime (14) and stime (15) are at 11, 12.
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    Ok(get(11) + get(12))
}

/// One thread's context switches so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadSwitches {
    /// The thread's name (`comm`).
    pub name: String,
    /// It blocked (slept, waited).
    pub voluntary: u64,
    /// It was preempted while runnable.
    pub nonvoluntary: u64,
}

impl ThreadSwitches {
    /// Both kinds.
    pub fn total(&self) -> u64 {
        self.voluntary + self.nonvoluntary
    }
}

/// The context switches of every thread of the process, by thread id.
pub fn thread_switches(pid: u32) -> std::io::Result<BTreeMap<u32, ThreadSwitches>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let entry = entry?;
        let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let dir: PathBuf = entry.path();
        // A thread may end between the listing and the read: skip it.
        let (Ok(status), Ok(comm)) = (
            std::fs::read_to_string(dir.join("status")),
            std::fs::read_to_string(dir.join("comm")),
        ) else {
            continue;
        };
        out.insert(
            tid,
            ThreadSwitches {
                name: comm.trim().to_owned(),
                voluntary: count_field(&status, "voluntary_ctxt_switches:"),
                nonvoluntary: count_field(&status, "nonvoluntary_ctxt_switches:"),
            },
        );
    }
    Ok(out)
}

fn count_field(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Per thread, the switches between two snapshots: (tid, name, switches). A thread that is in
/// `after` only counts all its switches; one that ended is left out (its switches are gone
/// with it, so compare thread counts too).
pub fn switches_between(
    before: &BTreeMap<u32, ThreadSwitches>,
    after: &BTreeMap<u32, ThreadSwitches>,
) -> Vec<(u32, String, u64)> {
    after
        .iter()
        .map(|(tid, a)| {
            let b = before.get(tid).map_or(0, ThreadSwitches::total);
            (*tid, a.name.clone(), a.total().saturating_sub(b))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        let m = memory(pid).unwrap();
        assert!(m.rss_kib > 0 && m.pss_kib > 0, "{m:?}");
        // Burn some CPU so the tick count cannot stay at zero.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(cpu_ticks(pid).unwrap() > 0);
        let threads = thread_switches(pid).unwrap();
        assert!(threads.contains_key(&pid), "{threads:?}");
    }

    #[test]
    fn a_sleeping_thread_counts_its_sleeps() {
        let pid = std::process::id();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            let tid = std::fs::read_link("/proc/thread-self")
                .ok()
                .and_then(|p| p.file_name()?.to_str()?.parse::<u32>().ok())
                .unwrap();
            tid_tx.send(tid).unwrap();
            while rx.recv().is_ok() {}
        });
        let tid = tid_rx.recv().unwrap();
        let before = thread_switches(pid).unwrap();
        for _ in 0..5 {
            tx.send(()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let after = thread_switches(pid).unwrap();
        drop(tx);
        h.join().unwrap();
        let d = switches_between(&before, &after);
        let mine = d.iter().find(|(t, _, _)| *t == tid).unwrap();
        assert!(mine.2 >= 5, "{d:?}");
    }
}
