//! Running Wireshark's `tshark` on a capture: present or not (a test without it fails unless
//! `VRDMA_SKIP_TSHARK=1`, when it says loudly that it did not run), the per-frame `-V`
//! dissection, and the expert infos and malformed marks.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Options of every run: the payloads of the tests are arbitrary bytes, so the heuristic ULP
/// dissectors Wireshark runs on iWARP payloads (RPC-over-RDMA, SMB Direct) are off — they
/// would judge the test pattern, not the framing.
pub const OPTIONS: [&str; 7] = [
    "-n",
    "--disable-protocol",
    "rpcordma",
    "--disable-protocol",
    "smb_direct",
    "-o",
    "tcp.check_checksum:TRUE",
];

/// Whether `tshark` runs here.
pub fn present() -> bool {
    Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether `test` can run: true with tshark; false (said loudly) without it when
/// `VRDMA_SKIP_TSHARK=1`; a panic without it otherwise.
pub fn need(test: &str) -> bool {
    if present() {
        return true;
    }
    if std::env::var("VRDMA_SKIP_TSHARK").as_deref() == Ok("1") {
        eprintln!(
            "\n!!!!! {test} DID NOT RUN: tshark is not installed and VRDMA_SKIP_TSHARK=1 !!!!!\n"
        );
        return false;
    }
    panic!(
        "tshark not found: install it (`apt-get install tshark`, listed in \
         scripts/host-packages.txt) or set VRDMA_SKIP_TSHARK=1 to skip this check"
    );
}

/// A capture file in the temporary directory, removed when dropped (also when an assertion
/// fails) unless `VRDMA_KEEP_PCAP` is set.
pub struct TempPcap(PathBuf);

impl TempPcap {
    /// `bytes` written as `vrdma-<name>-<pid>.pcap`.
    pub fn write(name: &str, bytes: &[u8]) -> TempPcap {
        let path = std::env::temp_dir().join(format!("vrdma-{name}-{}.pcap", std::process::id()));
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        TempPcap(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempPcap {
    fn drop(&mut self) {
        if std::env::var_os("VRDMA_KEEP_PCAP").is_none() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// `tshark -V` of a capture, one string per frame (index 0 = frame 1).
pub fn dissect(path: &Path) -> Vec<String> {
    let out = Command::new("tshark")
        .args(OPTIONS)
        .arg("-r")
        .arg(path)
        .arg("-V")
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut frames: Vec<String> = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if line.starts_with("Frame ") && line.contains(" bytes on wire") {
            frames.push(String::new());
        }
        if let Some(f) = frames.last_mut() {
            f.push_str(line);
            f.push('\n');
        }
    }
    frames
}

/// Expert infos and malformed marks of a capture: (frame, severity, message), from `-T
/// fields`.
pub fn expert(path: &Path) -> Vec<(usize, String, String)> {
    let out = Command::new("tshark")
        .args(OPTIONS)
        .arg("-r")
        .arg(path)
        .args(["-T", "fields", "-e", "frame.number"])
        .args(["-e", "_ws.expert.severity", "-e", "_ws.expert.message"])
        .args(["-e", "_ws.malformed"])
        .output()
        .expect("run tshark");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let c: Vec<&str> = line.split('\t').collect();
            let (sev, msg, bad) = (c.get(1)?, c.get(2).unwrap_or(&""), c.get(3).unwrap_or(&""));
            (!sev.is_empty() || !bad.is_empty()).then(|| {
                (
                    c[0].parse().expect("frame number"),
                    sev.to_string(),
                    format!("{msg} {bad}"),
                )
            })
        })
        .collect()
}
