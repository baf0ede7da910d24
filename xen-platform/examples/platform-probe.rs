//! Ping-pong between two domains through xen-platform, on real Xen or a simulated host.
//!
//! This is the program the Xen lab runs against the real `/dev/xen` devices (no Xen here):
//!
//! ```sh
//! # in the offering domain (e.g. dom0), peer = the mapping domain's id:
//! platform-probe offer <peer-domid> <offer-file> [rounds]
//! # in the mapping domain, once <offer-file> (contents "domid gref port") is there:
//! platform-probe map <offer-file> [rounds]
//! ```
//!
//! On a simulated host: `vrdma-simhost run ID -- platform-probe ...`.

#[path = "../tests/common/pingpong.rs"]
mod pingpong;

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let rounds = |i: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(1000);
    let r = match args.get(1).map(String::as_str) {
        Some("offer") if args.len() >= 4 => match args[2].parse() {
            Ok(peer) => pingpong::offer(xen_platform::DomId(peer), Path::new(&args[3]), rounds(4)),
            Err(_) => Err(format!("bad domid {:?}", args[2])),
        },
        Some("map") if args.len() >= 3 => pingpong::map(Path::new(&args[2]), rounds(3)),
        _ => Err("usage: platform-probe offer <peer> <file> [rounds] | map <file> [rounds]".into()),
    };
    match r {
        Ok(()) => {
            println!("PLATFORM-PROBE: PASS");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("PLATFORM-PROBE: FAIL: {e}");
            ExitCode::from(1)
        }
    }
}
