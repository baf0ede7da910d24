//! `bench-spread`: reads bench output on stdin, keeps the `bench-ratio ...` lines (one per
//! ratio per run) and prints the spread of each ratio over the runs (min, p25, median, p75,
//! max) with the median value and floor. Used by `scripts/bench-ratios.sh`.

use std::io::BufRead;
use std::process::ExitCode;

use bench_support::report::{spread_table, RatioRecord};

fn main() -> ExitCode {
    let mut records = Vec::new();
    for line in std::io::stdin().lock().lines() {
        match line {
            Ok(l) => records.extend(RatioRecord::parse(&l)),
            Err(e) => {
                eprintln!("bench-spread: reading stdin: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if records.is_empty() {
        eprintln!("bench-spread: no `bench-ratio` lines on stdin");
        return ExitCode::FAILURE;
    }
    print!("{}", spread_table(&records));
    ExitCode::SUCCESS
}
