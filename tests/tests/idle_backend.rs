//! An idle backend stays asleep: with nothing happening, its threads do not wake up (no
//! periodic polling). Counted from the backend process's per-thread context switches in
//! `/proc` (a count, not a time): before the fix, each XenStore watch thread woke every
//! 500 ms to look at its stop flag (and the client runtime's timer with it), and the daemon's
//! stats tick ran every 2 s with no device to look at.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use vrdma_backend::daemon::STATS_INTERVAL;
use vrdma_tests::procstat::{switches_between, thread_switches, ThreadSwitches};
use vrdma_tests::Lab;

const GUEST: &str = env!("CARGO_BIN_EXE_vrdma-guest");

/// The backend's threads, once the daemon serves (its two fixed watch threads exist) and
/// their number has stayed the same for a while (start-up or a connect has settled).
fn settled(lab: &Lab) -> (u32, BTreeMap<u32, ThreadSwitches>) {
    let pid = lab.backend_pid().expect("backend running");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let t = thread_switches(pid).expect("read /proc");
        let watching = t.values().filter(|t| t.name == "xs-watch").count();
        if watching >= 2 {
            // Quiet: the engine's spin, start-up work and the first stats publication after
            // a connect (at the next stats tick) end well within this.
            std::thread::sleep(STATS_INTERVAL + Duration::from_secs(1));
            let again = thread_switches(pid).expect("read /proc");
            if again.len() == t.len() {
                return (pid, again);
            }
        }
        assert!(Instant::now() < deadline, "the backend never settled");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The context switches of every backend thread over `secs` seconds, with the per-thread
/// breakdown for the failure message.
fn wakeups_over(pid: u32, before: &BTreeMap<u32, ThreadSwitches>, secs: u64) -> (u64, String) {
    std::thread::sleep(Duration::from_secs(secs));
    let after = thread_switches(pid).expect("read /proc");
    let d = switches_between(before, &after);
    let total = d.iter().map(|(_, _, n)| n).sum();
    let detail = d
        .iter()
        .filter(|(_, _, n)| *n > 0)
        .map(|(tid, name, n)| format!("{name}[{tid}]={n}"))
        .collect::<Vec<_>>()
        .join(" ");
    (total, detail)
}

#[test]
fn backend_without_devices_does_not_wake_up() {
    let lab = Lab::start();
    let (pid, before) = settled(&lab);
    let (n, detail) = wakeups_over(pid, &before, 2);
    // Before the fix: 2 watch threads × 4 wake-ups, their runtime's timer, 1 stats tick (≥ 9).
    assert!(n <= 2, "{n} context switches in 2 s while idle: {detail}");
}

#[test]
fn backend_with_an_idle_guest_wakes_only_for_the_stats_tick() {
    let lab = Lab::start();
    let d = lab.create_guest("idle");
    lab.attach(d, &[]);
    let mut g = lab.spawn_guest(GUEST.as_ref(), d);
    g.cmd("open bypass");
    g.cmd("cq c 16");
    let ep = g.cmd("qp q c c 4 4");
    g.cmd(&format!("connect q {ep}"));
    g.cmd("mr m 4096");
    let (pid, before) = settled(&lab);
    let (n, detail) = wakeups_over(pid, &before, 4);
    // The daemon's stats tick (every 2 s while devices exist) is the only periodic wake-up:
    // 2 in 4 s, with room for one more. Before the fix: 3 watch threads × 8 wake-ups (≥ 24).
    assert!(n <= 4, "{n} context switches in 4 s while idle: {detail}");
    g.exit();
}
