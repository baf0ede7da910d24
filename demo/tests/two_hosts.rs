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

/// `vrdma-perf --cm` between a guest of host A and a guest of host B: every test runs over a
/// connection the two backends set up (MPA over TCP from 127.0.0.2 to 127.0.0.3) and the
/// iWARP data path, in both modes, and the client reports that connection.
#[test]
fn vrdma_perf_runs_every_test_between_two_hosts_through_the_cm() {
    let mut a = Lab::start_host(None, "A", Some("127.0.0.2".parse().unwrap())).unwrap();
    let mut b = Lab::start_host(None, "B", Some("127.0.0.3".parse().unwrap())).unwrap();
    let ga = a.create_guest("a").unwrap();
    let gb = b.create_guest("b").unwrap();
    for (test, mode, sizes) in [
        ("send_lat", "bypass", "64,4096"),
        ("write_lat", "bypass", "64,65536"),
        ("read_lat", "bypass", "64,4096"),
        ("send_bw", "bypass", "4096,65536"),
        ("write_bw", "bypass", "65536,1048576"),
        ("read_bw", "bypass", "65536"),
        ("send_lat", "mediated", "64"),
        ("write_bw", "mediated", "65536"),
    ] {
        let mut srv = perf(
            &b,
            gb,
            &[test, "--port", "0", "--cm", "--mode", mode, "--events"],
        );
        let p = port(&mut srv);
        let mut cl = perf(
            &a,
            ga,
            &[
                test,
                "127.0.0.1",
                "--port",
                &p,
                "--cm",
                "--mode",
                mode,
                "--size",
                sizes,
                "--iters",
                "50",
                "--tx-depth",
                "8",
                "--events",
                "--json",
            ],
        );
        let (cok, cout, cerr) = cl.finish(T);
        let (sok, sout, serr) = srv.finish(T);
        assert!(
            cok && sok,
            "{test} {mode}: client {cok} {cout}\n{cerr}\nserver {sok} {sout}\n{serr}"
        );
        let j: serde_json::Value = serde_json::from_str(&cout).expect("the client's JSON");
        let c = &j["connection"];
        assert_eq!(c["how"], "cm", "{test} {mode}: {cout}");
        assert_eq!(c["between_hosts"], true, "{test} {mode}: {cout}");
        assert!(
            c["local"].as_str().unwrap().starts_with("127.0.0.2:")
                && c["peer"].as_str().unwrap().starts_with("127.0.0.3:"),
            "{test} {mode}: {c}"
        );
        // The server saw the same connection from its side.
        assert!(
            sout.contains("# connected through the connection manager: 127.0.0.3:")
                && sout.contains("<- 127.0.0.2:"),
            "{test} {mode}: {sout}"
        );
        let table = if test.ends_with("_lat") {
            "latency"
        } else {
            "bandwidth"
        };
        let rows = j[table].as_array().unwrap();
        let want: Vec<u64> = sizes.split(',').map(|s| s.parse().unwrap()).collect();
        let got: Vec<u64> = rows.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
        assert_eq!(got, want, "{test} {mode}: {cout}");
        for r in rows {
            let v = if table == "latency" {
                r["t_typical_usec"].as_f64()
            } else {
                r["bw_avg_mb_sec"].as_f64()
            };
            assert!(v.is_some_and(|v| v > 0.0), "{test} {mode}: {r}");
        }
    }
    // A client with --cm against a server without: a clear error on both sides, no hang.
    let mut srv = perf(&b, gb, &["send_lat", "--port", "0", "--events"]);
    let p = port(&mut srv);
    let mut cl = perf(
        &a,
        ga,
        &["send_lat", "127.0.0.1", "--port", &p, "--cm", "--events"],
    );
    let (cok, _, cerr) = cl.finish(T);
    let (sok, _, serr) = srv.finish(T);
    assert!(!cok && !sok, "{cerr}\n{serr}");
    assert!(cerr.contains("run both sides alike"), "{cerr}");
    assert!(serr.contains("run both sides alike"), "{serr}");
    a.stop().unwrap();
    b.stop().unwrap();
}
