//! What every vrdma benchmark shares, so that their ratios can be compared:
//!
//! * [`CacheLinePingPong`] — **the** floor of the latency ratios of the targets table (docs/benchmarks.md) (what it measures
//!   and why is documented there and in docs/benchmarks.md, "The floor");
//! * [`Batches`] and [`time_ops`] — the one way a latency figure is sampled: batches of many
//!   operations between two clock reads, one sample = the mean time per operation of a batch;
//! * [`Samples`], [`Recorder`] and [`Spread`] — sample recording (also from criterion's
//!   `iter_custom`) and the spread statistics (min, p25, median, p75, max);
//! * [`report`] — a value ÷ floor line for people and a `bench-ratio` line for
//!   `scripts/bench-ratios.sh`, which gathers them over several runs (`bench-spread`).
//!
//! * [`tcp`] — raw TCP baselines (ping-pong, blocking or busy-polled, and streaming) between
//!   two addresses, for the inter-host rows (the simulated hosts' 127.0.0.2 and 127.0.0.3).
//!
//! One dependency (rustix, to bind a socket before connecting): criterion benches and the
//! `vrdma-perf` tool both link this crate.

mod floor;
pub mod report;
mod samples;
pub mod tcp;

pub use floor::CacheLinePingPong;
pub use samples::{time_ops, Batches, Recorder, Samples, Spread};
