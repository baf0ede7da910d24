//! Per-device pacing of XenStore work a guest can trigger: a token bucket for frontend scans
//! and a minimum interval for stats publications. A guest that makes its nodes fire without
//! pause gets its device looked at a bounded number of times per second; others are not slowed.

use std::time::{Duration, Instant};

/// A token bucket: `burst` at once, then `per_sec` per second.
#[derive(Debug, Clone)]
pub(super) struct TokenBucket {
    tokens: f64,
    burst: f64,
    per_sec: f64,
    at: Instant,
}

impl TokenBucket {
    pub(super) fn new(burst: u32, per_sec: u32, now: Instant) -> TokenBucket {
        TokenBucket {
            tokens: f64::from(burst),
            burst: f64::from(burst),
            per_sec: f64::from(per_sec),
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * self.per_sec).min(self.burst);
        self.at = now;
    }

    /// Takes a token if there is one.
    pub(super) fn try_take(&mut self, now: Instant) -> bool {
        self.refill(now);
        // A hair of slack so the token promised by `next_at` is there at `next_at`.
        if self.tokens >= 1.0 - 1e-9 {
            self.tokens = (self.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }

    /// When the next token will be there.
    pub(super) fn next_at(&self) -> Instant {
        let missing = (1.0 - self.tokens).max(0.0);
        self.at + Duration::from_secs_f64(missing / self.per_sec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(3, 10, t0);
        assert!((0..3).all(|_| b.try_take(t0)));
        assert!(!b.try_take(t0));
        let next = b.next_at();
        assert_eq!(next - t0, Duration::from_millis(100));
        assert!(!b.try_take(t0 + Duration::from_millis(50)));
        assert!(b.try_take(next));
        // A second of calls at any rate gets at most the rate (plus the token already due).
        let granted = (1..=10_000)
            .filter(|i| b.try_take(next + Duration::from_micros(i * 100)))
            .count();
        assert!(granted <= 10, "{granted}");
    }
}
