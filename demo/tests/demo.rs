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
