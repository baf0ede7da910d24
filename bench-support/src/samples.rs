//! Samples (ns per operation), how they are taken in batches, and their spread.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How a latency figure is sampled: one warm-up batch (not kept), then batches of `size`
/// operations each timed by one pair of clock reads, one sample = mean ns per operation of a
/// batch; at least `min` and at most `max` batches, no new batch after `time_cap` once `min`
/// are in (on a loaded machine one operation can cost a scheduler time slice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batches {
    pub size: u64,
    pub min: usize,
    pub max: usize,
    pub time_cap: Duration,
}

impl Batches {
    /// The floor's standalone sampling: 5 to 31 batches of 10 000 round trips, within about 1 s.
    pub const FLOOR: Batches = Batches {
        size: 10_000,
        min: 5,
        max: 31,
        time_cap: Duration::from_secs(1),
    };

    /// Exactly `count` batches of `size` (no time cap).
    pub const fn fixed(count: usize, size: u64) -> Batches {
        Batches {
            size,
            min: count,
            max: count,
            time_cap: Duration::MAX,
        }
    }

    /// Runs the batches; `batch(n)` performs `n` operations and returns the time they took.
    pub fn run(self, mut batch: impl FnMut(u64) -> Duration) -> Samples {
        let size = self.size.max(1);
        batch(size);
        let start = Instant::now();
        let mut s = Samples::default();
        while s.len() < self.max && (s.len() < self.min || start.elapsed() < self.time_cap) {
            s.push(batch(size), size);
        }
        s
    }
}

/// Times `n` calls of `op` back to back.
pub fn time_ops(n: u64, mut op: impl FnMut()) -> Duration {
    let t = Instant::now();
    for _ in 0..n {
        op();
    }
    t.elapsed()
}

/// Samples of one figure, in ns per operation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Samples(Vec<f64>);

impl Samples {
    /// From ns-per-operation values.
    pub fn from_ns(ns: Vec<f64>) -> Samples {
        Samples(ns)
    }

    /// One sample: `elapsed` over `ops` operations.
    pub fn push(&mut self, elapsed: Duration, ops: u64) {
        self.0.push(elapsed.as_nanos() as f64 / ops.max(1) as f64);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The samples, ns per operation, in the order taken.
    pub fn ns(&self) -> &[f64] {
        &self.0
    }

    /// Their spread; `None` without samples.
    pub fn spread(&self) -> Option<Spread> {
        Spread::of(&self.0)
    }

    /// The median, or NaN without samples (so a missing figure prints as NaN, not a panic).
    pub fn median(&self) -> f64 {
        self.spread().map_or(f64::NAN, |s| s.median)
    }

    /// The sample of rank `q × n` (0-based, nearest below; `q` in 0..=1) in ascending order,
    /// e.g. `percentile(0.1)` of 150 samples is the 16th smallest; NaN without samples.
    pub fn percentile(&self, q: f64) -> f64 {
        let mut v = self.0.clone();
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(f64::total_cmp);
        let i = (q.clamp(0.0, 1.0) * v.len() as f64) as usize;
        v[i.min(v.len() - 1)]
    }
}

/// Min, quartiles, median and max of a set of values (NaNs ignored).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub n: usize,
    pub min: f64,
    pub p25: f64,
    /// The middle value, or the mean of the two middle values when `n` is even.
    pub median: f64,
    pub p75: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; `None` if none is a number.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            n,
            min: v[0],
            p25: percentile(&v, 25.0),
            median,
            p75: percentile(&v, 75.0),
            max: v[n - 1],
        })
    }

    /// `(p75 - p25) / median`: the relative width of the middle half.
    pub fn iqr_rel(&self) -> f64 {
        (self.p75 - self.p25) / self.median
    }
}

/// Nearest rank: the smallest value such that at least `p`% of `sorted` are ≤ it.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = (p * sorted.len() as f64 / 100.0 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Samples of several named figures, recorded as they are taken — a `static` a criterion
/// bench's `iter_custom` closures write into (criterion keeps its own samples to itself).
///
/// Criterion also calls `iter_custom` while warming up, with 1, 2, 4, 8, ... iterations; those
/// calls are recorded too, and [`Recorder::samples`] leaves them out (a one-iteration "batch"
/// is mostly clock reads and cold caches, and some twenty of them beside a hundred real samples
/// would move the median).
#[derive(Debug, Default)]
pub struct Recorder(Mutex<Vec<(&'static str, u64, f64)>>);

impl Recorder {
    pub const fn new() -> Recorder {
        Recorder(Mutex::new(Vec::new()))
    }

    /// Records one sample of `name` (`elapsed` over `ops` operations) and returns `elapsed`,
    /// so it can end an `iter_custom` closure.
    pub fn record(&self, name: &'static str, elapsed: Duration, ops: u64) -> Duration {
        let ns = elapsed.as_nanos() as f64 / ops.max(1) as f64;
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name, ops, ns));
        elapsed
    }

    /// The samples of `name`, without criterion's warm-up: the leading run of samples of
    /// 1, 2, 4, 8, ... operations is dropped, unless nothing else was recorded (`cargo test
    /// --benches` runs each bench once with one iteration).
    pub fn samples(&self, name: &str) -> Samples {
        let all: Vec<(u64, f64)> = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(n, _, _)| *n == name)
            .map(|(_, ops, ns)| (*ops, *ns))
            .collect();
        let warm_up = all
            .iter()
            .enumerate()
            .take_while(|(i, (ops, _))| *i < 64 && *ops == 1u64 << i)
            .count();
        let kept = if warm_up < all.len() {
            &all[warm_up..]
        } else {
            &all[..]
        };
        Samples(kept.iter().map(|(_, ns)| *ns).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_of_odd_and_even_counts() {
        let s = Spread::of(&[5.0, 1.0, 4.0, 2.0, 3.0]).unwrap();
        assert_eq!(
            (s.n, s.min, s.p25, s.median, s.p75, s.max),
            (5, 1.0, 2.0, 3.0, 4.0, 5.0)
        );
        let s = Spread::of(&[4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.p25, s.median, s.p75), (1.0, 2.5, 3.0));
        assert!((s.iqr_rel() - 0.8).abs() < 1e-12);
        let s = Spread::of(&[f64::NAN, 7.0]).unwrap();
        assert_eq!((s.n, s.median), (1, 7.0));
        assert!(Spread::of(&[]).is_none());
        assert!(Samples::default().median().is_nan());
    }

    #[test]
    fn percentiles_are_ranks_of_the_sorted_samples() {
        let s = Samples::from_ns((0..150).rev().map(f64::from).collect());
        assert_eq!(
            (s.percentile(0.0), s.percentile(0.1), s.percentile(0.5)),
            (0.0, 15.0, 75.0)
        );
        assert_eq!(s.percentile(1.0), 149.0);
        let s = Samples::from_ns((0..200).map(f64::from).collect());
        assert_eq!(s.percentile(0.1), 20.0);
        assert!(Samples::default().percentile(0.5).is_nan());
    }

    #[test]
    fn batches_warm_up_then_respect_min_max_and_cap() {
        let mut calls = Vec::new();
        let s = Batches::fixed(4, 10).run(|n| {
            calls.push(n);
            Duration::from_nanos(50 * n)
        });
        assert_eq!(calls, [10; 5], "one warm-up batch, then 4");
        assert_eq!(s.ns(), [50.0; 4]);
        // A zero time cap stops at `min`.
        let b = Batches {
            size: 1,
            min: 2,
            max: 100,
            time_cap: Duration::ZERO,
        };
        assert_eq!(b.run(|_| Duration::from_nanos(1)).len(), 2);
    }

    #[test]
    fn recorder_keeps_figures_apart() {
        static R: Recorder = Recorder::new();
        assert_eq!(
            R.record("a", Duration::from_nanos(300), 3),
            Duration::from_nanos(300)
        );
        R.record("b", Duration::from_nanos(10), 1);
        R.record("a", Duration::from_nanos(200), 1);
        assert_eq!(R.samples("a").ns(), [100.0, 200.0]);
        assert_eq!(R.samples("b").median(), 10.0, "only a warm-up: kept");
        assert!(R.samples("c").is_empty());
    }

    #[test]
    fn recorder_drops_criterions_warm_up() {
        let r = Recorder::new();
        for ops in [1, 2, 4, 8] {
            r.record("x", Duration::from_nanos(1000 * ops), ops); // 1000 ns each
        }
        for ops in [8, 16, 24] {
            r.record("x", Duration::from_nanos(100 * ops), ops); // 100 ns each
        }
        assert_eq!(r.samples("x").ns(), [100.0; 3]);
    }

    #[test]
    fn time_ops_runs_op_n_times() {
        let mut k = 0;
        time_ops(7, || k += 1);
        assert_eq!(k, 7);
    }
}
