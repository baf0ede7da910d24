//! Two embedded simulated hosts and their backend daemons in one process (vrdma-demo's lab,
//! as `vrdma-demo --hosts 2` runs them): each serves its own guests at the same time — nothing
//! of one host (directory, XenStore, domain numbers, backend) is shared with the other.

use std::process::Command;
use std::time::Duration;

use vrdma_demo::lab::{Guest, Lab};
use xen_platform::DomId;

const DEMO: &str = env!("CARGO_BIN_EXE_vrdma-demo");
const T: Duration = Duration::from_secs(120);

fn perf(lab: &Lab, d: DomId, args: &[&str]) -> Guest {
    let mut cmd = Command::new(DEMO);
    cmd.arg("__perf").args(args).env_remove("VRDMA_MODE");
    lab.spawn(d, cmd).expect("start vrdma-perf in a guest")
}

fn port(server: &mut Guest) -> String {
    let line = server
        .stdout
        .recv_timeout(T)
        .expect("the server says where it listens");
    line.rsplit(' ').next().unwrap().to_string()
}

#[test]
fn two_embedded_hosts_in_one_process_serve_their_guests_at_once() {
    let mut a = Lab::start_host(None, "A", Some("127.0.0.2".parse().unwrap())).unwrap();
    let mut b = Lab::start_host(None, "B", Some("127.0.0.3".parse().unwrap())).unwrap();
    assert_ne!(a.dir, b.dir);
    let (a1, a2) = (a.create_guest("a1").unwrap(), a.create_guest("a2").unwrap());
    let (b1, b2) = (b.create_guest("b1").unwrap(), b.create_guest("b2").unwrap());
    // Each host numbers its own domains.
    assert_eq!((a1, a2), (b1, b2));

    let mut sa = perf(
        &a,
        a1,
        &["send_lat", "--port", "0", "--mode", "bypass", "--events"],
    );
    let mut sb = perf(
        &b,
        b1,
        &["send_lat", "--port", "0", "--mode", "mediated", "--events"],
    );
    let (pa, pb) = (port(&mut sa), port(&mut sb));
    let client = |lab: &Lab, d, p: &str, mode| {
        perf(
            lab,
            d,
            &[
                "send_lat",
                "127.0.0.1",
                "--port",
                p,
                "--mode",
                mode,
                "--size",
                "64,4096",
                "--iters",
                "200",
                "--events",
            ],
        )
    };
    // Both clients run at once, one per host.
    let mut ca = client(&a, a2, &pa, "bypass");
    let mut cb = client(&b, b2, &pb, "mediated");
    for (name, c, s, mode) in [
        ("A", &mut ca, &mut sa, "bypass"),
        ("B", &mut cb, &mut sb, "mediated"),
    ] {
        let (cok, cout, cerr) = c.finish(T);
        let (sok, sout, serr) = s.finish(T);
        assert!(
            cok && sok,
            "host {name}: client {cok} {cout}\n{cerr}\nserver {sok} {sout}\n{serr}"
        );
        assert!(
            cout.contains(&format!("mode: {mode}")),
            "host {name}: {cout}"
        );
        let rows: Vec<&str> = cout
            .lines()
            .filter(|l| l.starts_with(" 64 ") || l.starts_with(" 4096 "))
            .collect();
        assert_eq!(rows.len(), 2, "host {name}: two sizes measured:\n{cout}");
    }
    let dirs = [a.dir.clone(), b.dir.clone()];
    a.stop().unwrap();
    b.stop().unwrap();
    for d in dirs {
        assert!(!d.exists(), "{} still exists", d.display());
    }
}
