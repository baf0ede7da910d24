//! Admin terminal injection (issue 10, item 8): text a guest writes into its own XenStore
//! nodes reaches `vrdmactl`'s output as visible escapes, never as terminal control sequences,
//! in the table and in `--json`.

mod daemon_common;

use std::process::Command;

use daemon_common::*;
use xen_platform::DomId;

/// Runs `vrdmactl --sim <host> ARGS`, which must succeed; returns stdout's bytes.
fn ctl_ok(s: &Stack, args: &[&str]) -> Vec<u8> {
    let out = Command::new(env!("CARGO_BIN_EXE_vrdmactl"))
        .arg("--sim")
        .arg(s.host.dir())
        .args(args)
        .env_remove("VRDMA_SIM")
        .env_remove("RUST_LOG")
        .output()
        .expect("run vrdmactl");
    assert!(
        out.status.success(),
        "vrdmactl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The output is UTF-8 and holds no control character other than the table's newlines, and
/// no character that changes how a terminal draws text.
fn assert_terminal_safe(out: &[u8]) {
    let text = std::str::from_utf8(out).expect("vrdmactl prints UTF-8");
    for c in text.chars() {
        assert!(
            c == '\n'
                || !(c.is_control()
                    || matches!(c, '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')),
            "raw {c:?} in vrdmactl output:\n{text}"
        );
    }
}

#[test]
fn list_prints_guest_written_escape_sequences_escaped() {
    let s = Stack::start();
    let d = s.new_domain();
    let dom = d.to_string();
    assert!(ctl_ok(&s, &["attach", &dom]).starts_with(b"attached"));

    // The guest writes its own channel node: retitle the window (OSC ... BEL), clear the
    // screen, go up a line and forge one, an 8-bit CSI, a bidi override, a byte that is not
    // UTF-8.
    let evil: &[u8] =
        b"\x1b]0;owned\x07\x1b[2J\x1b[1A\rdomid 0 ok\n\xc2\x9b31m\xe2\x80\xaerid\xff\\x1b";
    let shown = r"\x1b]0;owned\x07\x1b[2J\x1b[1A\rdomid 0 ok\n\u{9b}31m\u{202e}rid\xff\\x1b";
    let guest = platform(s.host.dir(), DomId(d as u16)).xenstore().unwrap();
    guest.write("device/vrdma/0/channel/7/mode", evil).unwrap();

    for args in [&["list"][..], &["list", &dom]] {
        let out = ctl_ok(&s, args);
        assert_terminal_safe(&out);
        let table = String::from_utf8(out).unwrap();
        let line = table
            .lines()
            .find(|l| l.contains("channel 7"))
            .unwrap_or_else(|| panic!("channel 7 not listed:\n{table}"));
        assert!(line.ends_with(shown), "{line}");
    }

    let out = ctl_ok(&s, &["list", "--json"]);
    assert_terminal_safe(&out);
    let listed: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let ch = listed[0]["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["channel"] == 7)
        .expect("channel 7 in --json");
    assert_eq!(ch["mode"], shown);
}
