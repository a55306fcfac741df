//! `connlim`: parallel sessions, or new sessions per period, for the
//! sessions a rule matches.

use std::sync::Mutex;
use std::time::Instant;

/// 3proxy's `connlim`: at most `rate` parallel sessions (period 0), or a
/// rate of `rate` new sessions per `period` seconds.
#[derive(Debug)]
pub struct ConnLim {
    rate: u32,
    pub(super) period: u32,
    state: Mutex<ConnState>,
}

#[derive(Debug)]
struct ConnState {
    /// Parallel: sessions now. Rate: a count that decays linearly to 0
    /// over one period.
    rating: f64,
    base: Option<Instant>,
}

impl ConnLim {
    pub(super) fn new(rate: u32, period: u32) -> ConnLim {
        ConnLim {
            rate,
            period,
            state: Mutex::new(ConnState {
                rating: 0.0,
                base: None,
            }),
        }
    }

    /// Count a new session in; false if the limit is reached.
    pub(super) fn enter(&self, now: Instant) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if self.period == 0 {
            if st.rating >= f64::from(self.rate) {
                return false;
            }
            st.rating += 1.0;
            return true;
        }
        let period = f64::from(self.period);
        let decayed = match st.base {
            Some(b) => {
                let age = now.saturating_duration_since(b).as_secs_f64();
                st.rating * (1.0 - (age / period).min(1.0))
            }
            None => 0.0,
        };
        if decayed + 1.0 > f64::from(self.rate) + 1e-9 {
            return false;
        }
        st.rating = decayed + 1.0;
        st.base = Some(now);
        true
    }

    pub(super) fn leave(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.rating = (st.rating - 1.0).max(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rate_connlim_decays() {
        let c = ConnLim {
            rate: 2,
            period: 10,
            state: Mutex::new(ConnState {
                rating: 0.0,
                base: None,
            }),
        };
        let t0 = Instant::now();
        assert!(c.enter(t0));
        assert!(c.enter(t0));
        assert!(!c.enter(t0), "a third within the period is refused");
        assert!(!c.enter(t0 + Duration::from_secs(1)));
        // After half a period, the count has decayed enough for one more.
        assert!(c.enter(t0 + Duration::from_secs(6)));
        assert!(c.enter(t0 + Duration::from_secs(30)));
    }
}
