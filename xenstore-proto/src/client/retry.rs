//! How the transaction helpers retry a transaction that conflicted (`EAGAIN` on commit).

use std::time::Duration;

/// Bounded retries for the `transaction` helpers. The default retries at once, as libxl does:
/// xenstored only reports a conflict when another transaction committed, so every retry round
/// makes progress for someone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (0 counts as 1).
    pub max_attempts: u32,
    /// Pause before the second attempt, doubled for each further one (zero: no pause).
    pub backoff: Duration,
    /// Longest pause.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 32,
            backoff: Duration::ZERO,
            max_backoff: Duration::from_millis(100),
        }
    }
}

impl RetryPolicy {
    /// At most `max_attempts` attempts, no pause between them.
    pub fn attempts(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            ..RetryPolicy::default()
        }
    }

    pub(crate) fn attempts_bound(&self) -> u32 {
        self.max_attempts.max(1)
    }

    /// The pause after failed attempt number `attempt` (1-based).
    pub(crate) fn pause(&self, attempt: u32) -> Duration {
        if self.backoff.is_zero() {
            return Duration::ZERO;
        }
        let factor = 1u32 << (attempt - 1).min(16);
        self.backoff.saturating_mul(factor).min(self.max_backoff)
    }
}
