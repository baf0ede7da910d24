//! perftest's statistics and tables: latency rows (min, max, typical = median, average,
//! standard deviation, 99% and 99.9% percentiles over the samples minus the top two) and
//! bandwidth rows (peak, average, message rate).

use std::fmt::Write as _;

/// How many of the largest samples perftest drops before computing latency statistics.
pub const DROPPED_TOP_SAMPLES: usize = 2;

/// One latency row, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyRow {
    pub bytes: usize,
    pub iterations: usize,
    pub t_min: f64,
    pub t_max: f64,
    /// The median of the kept samples.
    pub t_typical: f64,
    pub t_avg: f64,
    pub t_stdev: f64,
    pub p99: f64,
    pub p999: f64,
}

/// The value at percentile `p` (0 < p ≤ 100) of `sorted` by nearest rank: the smallest sample
/// such that at least `p`% of the samples are ≤ it.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    assert!(!sorted.is_empty(), "percentile of no samples");
    // The epsilon keeps 99.9% of 1000 at rank 999 despite binary floating point.
    let rank = (p * sorted.len() as f64 / 100.0 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of `sorted` (the mean of the two middle samples when their number is even).
pub fn median(sorted: &[f64]) -> f64 {
    assert!(!sorted.is_empty(), "median of no samples");
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

impl LatencyRow {
    /// Statistics of `samples` (microseconds, one per iteration): sorted, the
    /// [`DROPPED_TOP_SAMPLES`] largest dropped (when more than that many remain), then
    /// min/max/median/mean/stdev/percentiles of the rest. `iterations` is what was run.
    pub fn from_samples(bytes: usize, iterations: usize, samples: &[f64]) -> LatencyRow {
        let mut s: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        assert!(!s.is_empty(), "latency statistics of no samples");
        s.sort_by(f64::total_cmp);
        if s.len() > DROPPED_TOP_SAMPLES {
            s.truncate(s.len() - DROPPED_TOP_SAMPLES);
        }
        let n = s.len() as f64;
        let avg = s.iter().sum::<f64>() / n;
        let var = s.iter().map(|x| (x - avg) * (x - avg)).sum::<f64>() / n;
        LatencyRow {
            bytes,
            iterations,
            t_min: s[0],
            t_max: s[s.len() - 1],
            t_typical: median(&s),
            t_avg: avg,
            t_stdev: var.sqrt(),
            p99: percentile(&s, 99.0),
            p999: percentile(&s, 99.9),
        }
    }
}

impl LatencyRow {
    /// The row as JSON (`vrdma-perf --json`; times in µs).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"bytes": self.bytes, "iterations": self.iterations,
            "t_min_usec": self.t_min, "t_max_usec": self.t_max,
            "t_typical_usec": self.t_typical, "t_avg_usec": self.t_avg,
            "t_stdev_usec": self.t_stdev, "p99_usec": self.p99, "p99_9_usec": self.p999})
    }
}

impl BwRow {
    /// The row as JSON (`vrdma-perf --json`; MB = 2^20 bytes).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"bytes": self.bytes, "iterations": self.iterations,
            "bw_peak_mb_sec": self.bw_peak_mb, "bw_avg_mb_sec": self.bw_avg_mb,
            "msg_rate_mpps": self.msg_rate_mpps})
    }
}

/// One bandwidth row. MB is 2^20 bytes, as in perftest.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwRow {
    pub bytes: usize,
    pub iterations: usize,
    pub bw_peak_mb: f64,
    pub bw_avg_mb: f64,
    pub msg_rate_mpps: f64,
}

/// Bytes per MB in perftest's tables.
pub const MB: f64 = 1048576.0;

impl BwRow {
    /// `total_secs` from the first post to the last completion; `window_secs` the durations of
    /// consecutive windows of `window_msgs` completions each (the peak is the fastest window;
    /// with no windows the peak is the average).
    pub fn new(
        bytes: usize,
        iterations: usize,
        total_secs: f64,
        window_msgs: usize,
        window_secs: &[f64],
    ) -> BwRow {
        let avg = if total_secs > 0.0 {
            (bytes * iterations) as f64 / total_secs / MB
        } else {
            0.0
        };
        let peak = window_secs
            .iter()
            .filter(|t| **t > 0.0)
            .map(|t| (bytes * window_msgs) as f64 / t / MB)
            .fold(avg, f64::max);
        BwRow {
            bytes,
            iterations,
            bw_peak_mb: peak,
            bw_avg_mb: avg,
            msg_rate_mpps: if total_secs > 0.0 {
                iterations as f64 / total_secs / 1e6
            } else {
                0.0
            },
        }
    }
}

/// perftest's dashed rule.
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// Latency columns: heading and width (each value starts under its heading, as perftest).
const LAT_COLS: [(&str, usize); 9] = [
    ("#bytes", 8),
    ("#iterations", 13),
    ("t_min[usec]", 15),
    ("t_max[usec]", 15),
    ("t_typical[usec]", 17),
    ("t_avg[usec]", 15),
    ("t_stdev[usec]", 16),
    ("99% percentile[usec]", 23),
    ("99.9% percentile[usec]", 23),
];

/// Bandwidth columns.
const BW_COLS: [(&str, usize); 5] = [
    ("#bytes", 11),
    ("#iterations", 15),
    ("BW peak[MB/sec]", 19),
    ("BW average[MB/sec]", 21),
    ("MsgRate[Mpps]", 13),
];

fn row(cols: &[(&str, usize)], values: &[String]) -> String {
    let mut s = String::from(" ");
    for ((_, w), v) in cols.iter().zip(values) {
        let _ = write!(s, "{v:<w$}");
    }
    s.trim_end().to_string()
}

/// The latency table header.
pub fn latency_header() -> String {
    let names: Vec<String> = LAT_COLS.iter().map(|(n, _)| n.to_string()).collect();
    row(&LAT_COLS, &names)
}

/// One latency table line, column-aligned with [`latency_header`].
pub fn latency_line(r: &LatencyRow) -> String {
    let mut v = vec![r.bytes.to_string(), r.iterations.to_string()];
    v.extend(
        [
            r.t_min,
            r.t_max,
            r.t_typical,
            r.t_avg,
            r.t_stdev,
            r.p99,
            r.p999,
        ]
        .iter()
        .map(|x| format!("{x:.2}")),
    );
    row(&LAT_COLS, &v)
}

/// The bandwidth table header.
pub fn bw_header() -> String {
    let names: Vec<String> = BW_COLS.iter().map(|(n, _)| n.to_string()).collect();
    row(&BW_COLS, &names)
}

/// One bandwidth table line, column-aligned with [`bw_header`].
pub fn bw_line(r: &BwRow) -> String {
    let v = [
        r.bytes.to_string(),
        r.iterations.to_string(),
        format!("{:.2}", r.bw_peak_mb),
        format!("{:.2}", r.bw_avg_mb),
        format!("{:.6}", r.msg_rate_mpps),
    ];
    row(&BW_COLS, &v)
}

/// A whole latency table: rule, header, rows, rule.
pub fn latency_table(rows: &[LatencyRow]) -> String {
    let mut s = format!("{RULE}\n{}\n", latency_header());
    for r in rows {
        let _ = writeln!(s, "{}", latency_line(r));
    }
    s.push_str(RULE);
    s.push('\n');
    s
}

/// A whole bandwidth table: rule, header, rows, rule.
pub fn bw_table(rows: &[BwRow]) -> String {
    let mut s = format!("{RULE}\n{}\n", bw_header());
    for r in rows {
        let _ = writeln!(s, "{}", bw_line(r));
    }
    s.push_str(RULE);
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_and_even() {
        assert_eq!(median(&[1.0, 2.0, 9.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), 3.0);
        assert_eq!(median(&[5.0]), 5.0);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let s: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile(&s, 99.0), 990.0);
        assert_eq!(percentile(&s, 99.9), 999.0);
        assert_eq!(percentile(&s, 100.0), 1000.0);
        assert_eq!(percentile(&s, 50.0), 500.0);
        let few = [1.0, 2.0, 3.0];
        assert_eq!(percentile(&few, 99.0), 3.0);
        assert_eq!(percentile(&few, 1.0), 1.0);
    }

    #[test]
    fn top_two_samples_are_dropped() {
        // Two huge outliers must not show in max, average or percentiles.
        let mut s: Vec<f64> = (1..=100).map(f64::from).collect();
        s.push(1e6);
        s.push(2e6);
        let r = LatencyRow::from_samples(64, 102, &s);
        assert_eq!(r.t_max, 100.0);
        assert_eq!(r.t_min, 1.0);
        assert_eq!(r.t_typical, 50.5);
        assert!((r.t_avg - 50.5).abs() < 1e-9);
        assert_eq!(r.p99, 99.0);
        assert_eq!(r.p999, 100.0);
        assert_eq!(r.iterations, 102);
        // Unsorted input gives the same row.
        s.reverse();
        assert_eq!(LatencyRow::from_samples(64, 102, &s), r);
    }

    #[test]
    fn only_the_top_two_are_dropped() {
        // The third largest stays: it is the max.
        let s = [3.0, 1.0, 7.0, 100.0, 200.0, 2.0];
        let r = LatencyRow::from_samples(8, 6, &s);
        assert_eq!(r.t_max, 7.0);
        assert_eq!(r.t_min, 1.0);
        assert_eq!(r.t_typical, 2.5);
    }

    #[test]
    fn stdev_is_population_stdev() {
        let s = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0, 1000.0, 1000.0];
        let r = LatencyRow::from_samples(1, 10, &s);
        assert!((r.t_avg - 5.0).abs() < 1e-9);
        assert!((r.t_stdev - 2.0).abs() < 1e-9);
    }

    #[test]
    fn tiny_sample_sets_keep_everything() {
        let r = LatencyRow::from_samples(1, 2, &[3.0, 1.0]);
        assert_eq!((r.t_min, r.t_max, r.t_typical), (1.0, 3.0, 2.0));
    }

    #[test]
    fn bandwidth_average_peak_and_rate() {
        // 1000 messages of 1 MiB in 2 s: 500 MB/s, 0.0005 Mpps; fastest window 100 msgs in 0.1 s.
        let r = BwRow::new(1 << 20, 1000, 2.0, 100, &[0.3, 0.1, 0.2]);
        assert!((r.bw_avg_mb - 500.0).abs() < 1e-9);
        assert!((r.bw_peak_mb - 1000.0).abs() < 1e-9);
        assert!((r.msg_rate_mpps - 0.0005).abs() < 1e-12);
        // No windows: peak = average, never below it.
        let r = BwRow::new(64, 10, 1.0, 4, &[]);
        assert_eq!(r.bw_peak_mb, r.bw_avg_mb);
        let r = BwRow::new(64, 10, 1.0, 1, &[10.0]);
        assert_eq!(r.bw_peak_mb, r.bw_avg_mb);
    }

    #[test]
    fn latency_table_layout() {
        let r = LatencyRow::from_samples(64, 1000, &[1.5, 2.25, 3.0, 50.0, 60.0]);
        let t = latency_table(&[r]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], RULE);
        assert_eq!(lines[3], RULE);
        let heads: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            lines[1]
                .split("  ")
                .filter(|c| !c.trim().is_empty())
                .map(str::trim)
                .collect::<Vec<_>>(),
            [
                "#bytes",
                "#iterations",
                "t_min[usec]",
                "t_max[usec]",
                "t_typical[usec]",
                "t_avg[usec]",
                "t_stdev[usec]",
                "99% percentile[usec]",
                "99.9% percentile[usec]"
            ]
        );
        assert_eq!(heads[0], "#bytes");
        let cols: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            cols,
            ["64", "1000", "1.50", "3.00", "2.25", "2.25", "0.61", "3.00", "3.00"]
        );
        // Every value starts under its own column heading.
        for (name, val) in [
            ("#iterations", "1000"),
            ("t_min", "1.50"),
            ("t_max", "3.00"),
            ("t_typical", "2.25"),
            ("t_avg", "2.25"),
            ("t_stdev", "0.61"),
            ("99% percentile", "3.00"),
            ("99.9% percentile", "3.00"),
        ] {
            let h = lines[1].find(name).unwrap();
            let v = lines[2][h..].trim_start();
            assert!(v.starts_with(val), "{name}: {:?}", &lines[2][h..]);
        }
    }

    #[test]
    fn bw_table_layout() {
        let r = BwRow::new(65536, 5000, 1.0, 100, &[0.01]);
        let t = bw_table(&[r]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(
            lines[1]
                .split("  ")
                .filter(|c| !c.trim().is_empty())
                .map(str::trim)
                .collect::<Vec<_>>(),
            [
                "#bytes",
                "#iterations",
                "BW peak[MB/sec]",
                "BW average[MB/sec]",
                "MsgRate[Mpps]"
            ]
        );
        let cols: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(cols, ["65536", "5000", "625.00", "312.50", "0.005000"]);
        for (name, val) in [
            ("BW peak", "625.00"),
            ("BW average", "312.50"),
            ("MsgRate", "0.005"),
        ] {
            let h = lines[1].find(name).unwrap();
            assert!(lines[2][h..].trim_start().starts_with(val), "{name}");
        }
    }
}
