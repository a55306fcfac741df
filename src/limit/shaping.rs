//! `bandlimin`/`bandlimout`: a token bucket per rule, shared by the
//! sessions it matches, that may go into debt (the relay waits it out).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A bandwidth limit shared by the sessions of one rule.
#[derive(Debug)]
pub struct Bucket {
    /// Bytes per second.
    rate: f64,
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    /// Bytes that may go now; negative is a debt to wait out.
    tokens: f64,
    last: Instant,
}

/// Most a bucket saves up while idle: a twentieth of a second's worth.
const BURST_SECS: f64 = 0.05;

impl Bucket {
    pub fn new(bits_per_sec: u64) -> Bucket {
        Bucket {
            rate: bits_per_sec as f64 / 8.0,
            state: Mutex::new(BucketState {
                tokens: 0.0,
                last: Instant::now(),
            }),
        }
    }

    /// Refill for the time passed; return how long until the debt is paid.
    pub(super) fn ready_in(&self, now: Instant) -> Duration {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.refill(&mut st, now);
        if st.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-st.tokens / self.rate)
        }
    }

    pub(super) fn charge(&self, n: usize, now: Instant) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.refill(&mut st, now);
        st.tokens -= n as f64;
    }

    fn refill(&self, st: &mut BucketState, now: Instant) {
        let dt = now.saturating_duration_since(st.last).as_secs_f64();
        st.last = st.last.max(now);
        st.tokens = (st.tokens + dt * self.rate).min(self.rate * BURST_SECS);
    }

    /// Largest read worth making at once: a twentieth of a second.
    pub(super) fn chunk(&self) -> usize {
        ((self.rate * BURST_SECS) as usize).max(512)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_debt_sets_the_wait() {
        let b = Bucket::new(8000); // 1000 bytes/s
        let t0 = Instant::now();
        b.state.lock().unwrap().last = t0;
        assert_eq!(b.ready_in(t0), Duration::ZERO);
        b.charge(500, t0);
        let w = b.ready_in(t0);
        assert!((w.as_secs_f64() - 0.5).abs() < 0.01, "{w:?}");
        assert_eq!(b.ready_in(t0 + Duration::from_millis(500)), Duration::ZERO);
        // Idle time saves up at most a burst's worth.
        assert_eq!(b.ready_in(t0 + Duration::from_secs(100)), Duration::ZERO);
        assert!(b.state.lock().unwrap().tokens <= 1000.0 * BURST_SECS);
    }
}
