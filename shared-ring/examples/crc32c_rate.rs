//! CRC32c rate of `SharedRegion::crc32c_append` over a cache-resident shared region, beside
//! the `crc32c` crate over the same bytes (private memory) in the same run:
//! `cargo run --release -p shared-ring --example crc32c_rate [ROUNDS]`.
//! Per size, ROUNDS (default 5) alternating timings of each, best of each printed, and the
//! ratio. Sizes: 4 KiB, an FPDU payload on loopback (65 483 B), 1 MiB.

use std::time::Instant;

use shared_ring::SharedRegion;

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let size = (1 << 20) + 64;
    let region = SharedRegion::alloc(size).expect("region");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    region.write_bytes(0, &data).expect("fill");
    println!(
        "{:>9} {:>16} {:>16} {:>7}",
        "bytes", "shared GB/s", "crc32c crate", "ratio"
    );
    for len in [4096usize, 65_483, 1 << 20] {
        let off = 16;
        assert_eq!(
            region.crc32c_append(0, off, len).expect("in bounds"),
            crc32c::crc32c(&data[off..off + len])
        );
        let reps = ((256usize << 20) / len).max(1);
        let (mut ours, mut theirs) = (f64::MAX, f64::MAX);
        for _ in 0..rounds {
            let t = Instant::now();
            let mut acc = 0u32;
            for _ in 0..reps {
                acc ^= region.crc32c_append(acc, off, len).expect("in bounds");
            }
            std::hint::black_box(acc);
            ours = ours.min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let mut acc = 0u32;
            for _ in 0..reps {
                acc ^= crc32c::crc32c_append(acc, std::hint::black_box(&data[off..off + len]));
            }
            std::hint::black_box(acc);
            theirs = theirs.min(t.elapsed().as_secs_f64());
        }
        let gb = |s: f64| (reps * len) as f64 / s / 1e9;
        println!(
            "{len:>9} {:>16.2} {:>16.2} {:>7.2}",
            gb(ours),
            gb(theirs),
            theirs / ours
        );
    }
}
