//! Printing figures and value ÷ floor ratios, and gathering ratios over several runs.
//!
//! A bench prints, for each ratio it measures, one human line ([`ratio_line`]) and one
//! machine line ([`RatioRecord`]'s `Display`):
//!
//! ```text
//! bench-ratio id=device/post_to_cqe_64B value=706.9 floor=368.6 ratio=1.918
//! ```
//!
//! `scripts/bench-ratios.sh` runs benches several times and pipes their output through the
//! `bench-spread` binary, which prints the spread of each id's ratio over the runs
//! ([`spread_table`]).

use std::fmt;

use crate::samples::{Samples, Spread};

/// `label  median ns  (min p25 p75 max, n samples)`.
pub fn figure_line(label: &str, s: &Samples) -> String {
    match s.spread() {
        Some(p) => format!(
            "{label:<30} {:>10.1} ns   (min {:.1}, p25 {:.1}, p75 {:.1}, max {:.1}; {} samples)",
            p.median, p.min, p.p25, p.p75, p.max, p.n
        ),
        None => format!("{label:<30} {:>10} ns   (no samples)", "NaN"),
    }
}

/// `label  value ÷ floor = ratio  (target ...)`, medians.
pub fn ratio_line(label: &str, r: &RatioRecord, target: &str) -> String {
    format!(
        "{label:<30} {:.1} / {:.1} = {:.2}   (target {target})",
        r.value,
        r.floor,
        r.ratio()
    )
}

/// One measured ratio of one run: `value ÷ floor` (medians, both measured in that run).
#[derive(Debug, Clone, PartialEq)]
pub struct RatioRecord {
    /// `bench/figure`, the same in every run (no spaces).
    pub id: String,
    pub value: f64,
    pub floor: f64,
}

impl RatioRecord {
    /// The ratio of the medians of `value` and `floor`.
    pub fn of(id: &str, value: &Samples, floor: &Samples) -> RatioRecord {
        RatioRecord {
            id: id.into(),
            value: value.median(),
            floor: floor.median(),
        }
    }

    pub fn ratio(&self) -> f64 {
        self.value / self.floor
    }

    /// Parses a `bench-ratio ...` line (anything else is `None`).
    pub fn parse(line: &str) -> Option<RatioRecord> {
        let rest = line.trim().strip_prefix("bench-ratio ")?;
        let (mut id, mut value, mut floor) = (None, None, None);
        for kv in rest.split_whitespace() {
            match kv.split_once('=')? {
                ("id", v) => id = Some(v.to_string()),
                ("value", v) => value = v.parse().ok(),
                ("floor", v) => floor = v.parse().ok(),
                _ => {}
            }
        }
        Some(RatioRecord {
            id: id?,
            value: value?,
            floor: floor?,
        })
    }
}

impl fmt::Display for RatioRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bench-ratio id={} value={:.3} floor={:.3} ratio={:.4}",
            self.id,
            self.value,
            self.floor,
            self.ratio()
        )
    }
}

/// For each id (in order of first appearance): the spread of its ratio over the records, and
/// the medians of the values and floors.
pub fn spread_table(records: &[RatioRecord]) -> String {
    let mut ids: Vec<&str> = Vec::new();
    for r in records {
        if !ids.contains(&r.id.as_str()) {
            ids.push(&r.id);
        }
    }
    let mut s = format!(
        "{:<34} {:>4} {:>7} {:>7} {:>7} {:>7} {:>7}   {:>10} {:>10}\n",
        "ratio (value / floor)", "runs", "min", "p25", "median", "p75", "max", "value", "floor"
    );
    for id in ids {
        let of = |f: fn(&RatioRecord) -> f64| -> Vec<f64> {
            records.iter().filter(|r| r.id == id).map(f).collect()
        };
        let (Some(r), Some(v), Some(fl)) = (
            Spread::of(&of(RatioRecord::ratio)),
            Spread::of(&of(|r| r.value)),
            Spread::of(&of(|r| r.floor)),
        ) else {
            continue;
        };
        s.push_str(&format!(
            "{id:<34} {:>4} {:>7.2} {:>7.2} {:>7.2} {:>7.2} {:>7.2}   {:>10.1} {:>10.1}\n",
            r.n, r.min, r.p25, r.median, r.p75, r.max, v.median, fl.median
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips_through_its_line() {
        let r = RatioRecord {
            id: "device/post_to_cqe_64B".into(),
            value: 706.9,
            floor: 368.6,
        };
        let line = r.to_string();
        assert_eq!(
            line,
            "bench-ratio id=device/post_to_cqe_64B value=706.900 floor=368.600 ratio=1.9178"
        );
        assert_eq!(RatioRecord::parse(&line), Some(r));
        assert_eq!(RatioRecord::parse("post_to_cqe_64B  time: [1 ns]"), None);
        assert_eq!(RatioRecord::parse("bench-ratio id=x value=1"), None);
    }

    #[test]
    fn spread_table_gathers_runs_per_id() {
        let rec = |id: &str, value: f64| RatioRecord {
            id: id.into(),
            value,
            floor: 100.0,
        };
        let t = spread_table(&[
            rec("a", 300.0),
            rec("b", 50.0),
            rec("a", 100.0),
            rec("a", 200.0),
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        let a: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            a[..7],
            ["a", "3", "1.00", "1.00", "2.00", "3.00", "3.00"],
            "{t}"
        );
        assert!(lines[2].starts_with("b "), "{t}");
    }
}
