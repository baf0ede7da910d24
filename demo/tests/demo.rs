//! `vrdma-demo --quick` end to end: embedded host, backend, two guest domains, vrdma-perf
//! between them in both modes. Checks the output makes sense (tables present and parse,
//! latencies and bandwidths positive, both modes, baselines and ratios printed) and that the
//! demo cleaned up after itself. No timing assertions.

use std::process::Command;

/// The numeric rows of the table after the heading line containing `header`, per section.
fn rows_after(section: &str, header: &str) -> Vec<Vec<f64>> {
    let mut lines = section.lines().skip_while(|l| !l.contains(header));
    lines.next();
    lines
        .take_while(|l| !l.starts_with("---") && !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            l.split_whitespace()
                .map(|x| {
                    x.parse::<f64>()
                        .unwrap_or_else(|_| panic!("not a number in {l:?}"))
                })
                .collect()
        })
        .collect()
}

fn section<'a>(out: &'a str, title: &str) -> &'a str {
    let start = out
        .find(title)
        .unwrap_or_else(|| panic!("no section {title:?} in:\n{out}"));
    let rest = &out[start + title.len()..];
    &rest[..rest.find("\n=== ").unwrap_or(rest.len())]
}

#[test]
fn quick_demo_runs_both_modes_and_cleans_up() {
    let out = Command::new(env!("CARGO_BIN_EXE_vrdma-demo"))
        .arg("--quick")
        .output()
        .expect("run vrdma-demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "vrdma-demo --quick failed: {}\n--- stdout:\n{stdout}\n--- stderr:\n{stderr}",
        out.status
    );
    for mode in ["bypass", "mediated"] {
        let lat = section(&stdout, &format!("=== send_lat, {mode}:"));
        assert!(lat.contains(&format!("mode: {mode}")), "{lat}");
        assert!(lat.contains("# spinning threads:"), "{lat}");
        let rows = rows_after(lat, "t_typical[usec]");
        assert_eq!(rows.len(), 2, "two sizes of send_lat {mode}:\n{lat}");
        for r in &rows {
            assert_eq!(r.len(), 9, "{lat}");
            // min ≤ typical ≤ max, min ≤ avg ≤ max, percentiles ordered, all positive.
            let (min, max, typ, avg, p99, p999) = (r[2], r[3], r[4], r[5], r[7], r[8]);
            assert!(min > 0.0 && min <= typ && typ <= max, "{r:?}");
            assert!(min <= avg && avg <= max, "{r:?}");
            assert!(typ <= p99 && p99 <= p999 && p999 <= max, "{r:?}");
        }
        let base = rows_after(lat, "cache-line[usec]");
        assert_eq!(base.len(), 2, "baseline ratios for send_lat {mode}:\n{lat}");
        assert!(base.iter().all(|r| r.iter().all(|x| *x > 0.0)), "{base:?}");

        let bw = section(&stdout, &format!("=== write_bw, {mode}:"));
        assert!(bw.contains(&format!("mode: {mode}")), "{bw}");
        let rows = rows_after(bw, "BW average[MB/sec]");
        assert_eq!(rows.len(), 2, "two sizes of write_bw {mode}:\n{bw}");
        for r in &rows {
            assert_eq!(r.len(), 5, "{bw}");
            assert!(
                r[2] > 0.0 && r[3] > 0.0 && r[4] > 0.0,
                "nonzero bandwidth: {r:?}"
            );
            assert!(r[2] >= r[3], "peak ≥ average: {r:?}");
        }
        let base = rows_after(bw, "memcpy[MB/sec]");
        assert_eq!(base.len(), 2, "{bw}");
        assert!(base.iter().all(|r| r.iter().all(|x| *x > 0.0)), "{base:?}");
    }
    assert!(
        stdout.contains("mediated ÷ bypass SEND 64 B latency"),
        "{stdout}"
    );
    assert!(stdout.contains("bypass WRITE 1048576 B"), "{stdout}");
    // The targets are named where the repository has them (there is no DESIGN.md to read).
    assert!(
        stdout.contains("=== summary: the speed targets (docs/benchmarks.md"),
        "{stdout}"
    );
    assert!(
        !stdout.contains("DESIGN"),
        "the demo cites a DESIGN document the repository does not contain:\n{stdout}"
    );
    // Cleaned up: the host directory is gone.
    let done = stdout
        .lines()
        .find(|l| l.contains("nothing left running"))
        .unwrap_or_else(|| panic!("no closing line in:\n{stdout}"));
    let dir = done
        .split_whitespace()
        .find(|w| w.starts_with("/tmp/"))
        .expect("the removed directory is named");
    assert!(
        !std::path::Path::new(dir).exists(),
        "{dir} still exists after the demo"
    );
}

/// The first number after `prefix` in `line`.
fn number_after(line: &str, prefix: &str) -> f64 {
    let rest = &line[line
        .find(prefix)
        .unwrap_or_else(|| panic!("no {prefix:?} in {line:?}"))
        + prefix.len()..];
    let n: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    n.parse()
        .unwrap_or_else(|_| panic!("no number after {prefix:?} in {line:?}"))
}

/// The line of `text` containing `what`.
fn line_with<'a>(text: &'a str, what: &str) -> &'a str {
    text.lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no line with {what:?} in:\n{text}"))
}

/// `shown` (printed with `decimals` decimals) is the figure `x` read from a table (printed
/// with 2 decimals, possibly halved): within both roundings.
fn printed(x: f64, shown: f64, decimals: i32) -> bool {
    (x - shown).abs() <= 0.5 * 10f64.powi(-decimals) + 0.006
}

/// A ratio printed with 2 decimals, of numbers the tables printed rounded: within 1 %.
fn ratio_printed(of_tables: f64, shown: f64) -> bool {
    (of_tables - shown).abs() <= 0.005 + 0.01 * of_tables.abs()
}

/// `vrdma-demo --hosts 2 --quick`: two simulated hosts (host A at 127.0.0.2, host B at
/// 127.0.0.3), a guest on each; the raw TCP baselines between the two addresses, and the
/// inter-host vrdma rows — SEND 64 B latency, RDMA WRITE 64 KiB and 1 MiB bandwidth — measured
/// between guest-a and guest-b over connections the two backends set up (the client's and the
/// server's own reports name them: 127.0.0.2 -> 127.0.0.3). The summary's figures are the
/// tables' figures of this run and its ratios are computed from them (nothing hard-coded:
/// each summary number is checked against the table it comes from, each ratio and verdict
/// against its numbers). Both hosts' directories are gone at the end.
#[test]
fn two_hosts_quick_measures_the_inter_host_rows_beside_tcp() {
    let out = Command::new(env!("CARGO_BIN_EXE_vrdma-demo"))
        .args(["--hosts", "2", "--quick"])
        .output()
        .expect("run vrdma-demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "vrdma-demo --hosts 2 --quick failed: {}\n--- stdout:\n{stdout}\n--- stderr:\n{stderr}",
        out.status
    );
    for (host, addr) in [("A", "127.0.0.2"), ("B", "127.0.0.3")] {
        assert!(
            stdout.contains(&format!(
                "the vrdma backend {host} (software RDMA device) as dom0, address {addr}"
            )),
            "{stdout}"
        );
    }
    let base = section(
        &stdout,
        "=== TCP baselines between the two hosts' addresses (127.0.0.2 -> 127.0.0.3)",
    );
    assert!(base.contains("TCP 127.0.0.2 -> 127.0.0.3"), "{base}");
    // Two ping-pong tables (blocking: 0 threads spin; busy-poll: 2), one 64 B row each.
    let blocking = &base[base
        .find("# polling: blocking  spinning threads: 0")
        .expect(base)..];
    let busy = &base[base
        .find("# polling: busy-poll  spinning threads: 2")
        .expect(base)..];
    let mut tcp_rtt = Vec::new();
    for t in [blocking, busy] {
        let rows = rows_after(t, "t_typical[usec]");
        assert_eq!(rows.len(), 1, "{t}");
        let r = &rows[0];
        assert_eq!(r[0], 64.0);
        let (min, max, typ) = (r[2], r[3], r[4]);
        assert!(min > 0.0 && min <= typ && typ <= max, "{r:?}");
        tcp_rtt.push(typ);
    }
    let stream = section(
        &stdout,
        "=== TCP stream between the two hosts' addresses (127.0.0.2 -> 127.0.0.3)",
    );
    let rows = rows_after(stream, "BW average[MB/sec]");
    let sizes: Vec<f64> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(sizes, [65536.0, 1048576.0], "{stream}");
    assert!(rows.iter().all(|r| r[3] > 0.0), "{rows:?}");
    let tcp_bw: Vec<f64> = rows.iter().map(|r| r[3]).collect();

    // The vrdma rows: real connections between the two backends, one per test.
    let mut ports = Vec::new();
    let mut vrdma = Vec::new();
    for (test, header) in [
        ("send_lat", "t_typical[usec]"),
        ("write_bw", "BW average[MB/sec]"),
    ] {
        let sec = section(
            &stdout,
            &format!("=== inter-host vrdma {test} (bypass): client guest-a on host A -> server guest-b on host B, --cm ==="),
        );
        let conn = line_with(sec, "# connection: connection manager, 127.0.0.2:");
        assert!(
            conn.contains(" -> 127.0.0.3:") && conn.contains("between two hosts' backends"),
            "{sec}"
        );
        let server = line_with(sec, "[server]");
        assert!(
            server.contains("# connected through the connection manager: 127.0.0.3:")
                && server.contains("<- 127.0.0.2:"),
            "{sec}"
        );
        ports.push(conn.to_string());
        assert!(sec.contains("# spinning threads:"), "{sec}");
        let rows = rows_after(sec, header);
        let want: &[f64] = if test == "send_lat" {
            &[64.0]
        } else {
            &[65536.0, 1048576.0]
        };
        assert_eq!(rows.iter().map(|r| r[0]).collect::<Vec<_>>(), want, "{sec}");
        for r in &rows {
            if test == "send_lat" {
                let (min, max, typ) = (r[2], r[3], r[4]);
                assert!(min > 0.0 && min <= typ && typ <= max, "{r:?}");
                vrdma.push(typ);
            } else {
                assert!(r[3] > 0.0 && r[2] >= r[3], "{r:?}");
                vrdma.push(r[3]);
            }
        }
    }
    assert_ne!(ports[0], ports[1], "two tests, two connections");

    let summary = section(&stdout, "=== summary: the inter-host speed targets");
    assert!(summary.contains("127.0.0.2:"), "{summary}");
    assert!(
        summary.contains("the engine of each of the 2 backends"),
        "{summary}"
    );
    // SEND: vrdma one-way ÷ the like-for-like TCP ping-pong's one-way (half its round trip).
    let l = line_with(summary, "inter-host SEND 64 B latency, one-way: vrdma");
    let busy_like = l.contains("ping-pong busy-poll");
    let (v, t, ratio) = (
        number_after(l, "vrdma"),
        number_after(
            l,
            if busy_like {
                "ping-pong busy-poll"
            } else {
                "ping-pong blocking"
            },
        ),
        number_after(l, "usec = "),
    );
    let like_rtt = if busy_like { tcp_rtt[1] } else { tcp_rtt[0] };
    assert!(printed(vrdma[0], v, 2), "{l}: the table says {}", vrdma[0]);
    assert!(
        printed(like_rtt / 2.0, t, 2),
        "{l}: the TCP table says {like_rtt} RTT"
    );
    assert!(ratio_printed(vrdma[0] / (like_rtt / 2.0), ratio), "{l}");
    // (A printed ratio at the target itself, rounded, could go either way.)
    if (ratio - 1.1).abs() > 0.006 {
        assert_eq!(l.contains("target ≤ 1.1: met"), ratio <= 1.1, "{l}");
    }
    // WRITE: vrdma ÷ TCP stream, per size.
    for (i, (size, target)) in [(65536, 0.9), (1048576, 0.95)].into_iter().enumerate() {
        let l = line_with(
            summary,
            &format!("inter-host RDMA WRITE {size} B bandwidth: vrdma"),
        );
        let (v, t, ratio) = (
            number_after(l, "vrdma"),
            number_after(l, "raw TCP stream"),
            number_after(l, "MB/s = "),
        );
        assert!(
            printed(vrdma[1 + i], v, 0),
            "{l}: the table says {}",
            vrdma[1 + i]
        );
        assert!(
            printed(tcp_bw[i], t, 0),
            "{l}: the TCP table says {}",
            tcp_bw[i]
        );
        assert!(ratio_printed(vrdma[1 + i] / tcp_bw[i], ratio), "{l}");
        if (ratio - target).abs() > 0.006 {
            assert_eq!(
                l.contains(&format!("target ≥ {target}: met")),
                ratio >= target,
                "{l}"
            );
        }
    }
    assert!(
        !stdout.contains("not measured"),
        "every inter-host row is measured:\n{stdout}"
    );

    let done = stdout
        .lines()
        .find(|l| l.contains("nothing left running"))
        .unwrap_or_else(|| panic!("no closing line in:\n{stdout}"));
    let dirs: Vec<&str> = done
        .split_whitespace()
        .filter(|w| w.starts_with("/tmp/"))
        .collect();
    assert_eq!(dirs.len(), 2, "{done}");
    assert_ne!(dirs[0], dirs[1]);
    for d in dirs {
        assert!(
            !std::path::Path::new(d).exists(),
            "{d} still exists after the demo"
        );
    }
}
