//! The traffic counters (`countin`/`countout`/`countall`): bytes per
//! period, their periods in local time, what the admin service and the
//! reports show of them. The counter file keeps their records
//! (`crate::counter_file`, which reads a counter's state through
//! [`Record`]).

use std::sync::{Arc, Mutex};

use crate::acl::Rule;
use crate::counter_file::{Record, Saved};

/// Which traffic a counter rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountKind {
    In,
    Out,
    All,
    NoIn,
    NoOut,
    NoAll,
}

/// A traffic counter (`countin` & co): bytes in the current period.
#[derive(Debug)]
pub struct Counter {
    /// Record number in the counter file; 0 = not saved.
    pub number: u32,
    period: Period,
    limit: u64,
    /// After the `/` of `N/comment`; shown in reports.
    comment: String,
    state: Mutex<CounterState>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct CounterState {
    traf: u64,
    cleared: i64,
    updated: i64,
    /// What `traf` was when it was last reset (not saved in the file):
    /// the total of the period just ended, for a report.
    prev: u64,
}

/// How often a counter starts again from 0. Ordered as 3proxy's
/// ROTATION: a report lists the counters of its period or a longer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Period {
    Minutely,
    Hourly,
    Daily,
    Weekly,
    Monthly,
    Annually,
    Never,
}

impl Period {
    /// 3proxy's letters; anything else means never.
    pub fn from_letter(s: &str) -> Period {
        match s.as_bytes().first().map(u8::to_ascii_uppercase) {
            Some(b'C') => Period::Minutely,
            Some(b'H') => Period::Hourly,
            Some(b'D') => Period::Daily,
            Some(b'W') => Period::Weekly,
            Some(b'M') => Period::Monthly,
            Some(b'Y') => Period::Annually,
            _ => Period::Never,
        }
    }

    pub(super) fn to_log(self) -> crate::log::Period {
        use crate::log::Period as L;
        match self {
            Period::Minutely => L::Minute,
            Period::Hourly => L::Hour,
            Period::Daily => L::Day,
            Period::Weekly => L::Week,
            Period::Monthly => L::Month,
            Period::Annually => L::Year,
            Period::Never => L::Never,
        }
    }

    /// Whether `new` is in a later period than `old` (3proxy's
    /// `timechanged`), in local time.
    pub(super) fn changed(self, old: i64, new: i64) -> bool {
        let (a, b) = (crate::sys::time::local(old), crate::sys::time::local(new));
        match self {
            Period::Minutely => {
                (a.min, a.hour, a.mday, a.mon, a.year) != (b.min, b.hour, b.mday, b.mon, b.year)
            }
            Period::Hourly => (a.hour, a.mday, a.mon, a.year) != (b.hour, b.mday, b.mon, b.year),
            Period::Daily => (a.mday, a.mon, a.year) != (b.mday, b.mon, b.year),
            Period::Monthly => (a.mon, a.year) != (b.mon, b.year),
            Period::Annually => a.year != b.year,
            // A new week starts on Sunday.
            Period::Weekly => {
                new - old > 7 * 86400
                    || b.wday < a.wday
                    || (b.wday == a.wday && new - old > 6 * 86400)
            }
            Period::Never => false,
        }
    }
}

impl Counter {
    /// Counter `number` (0: not saved) of `limit` bytes per `period`, from
    /// its `saved` record, or new at `now`.
    pub(super) fn new(
        number: u32,
        comment: String,
        period: Period,
        limit: u64,
        saved: Option<Saved>,
        now: i64,
    ) -> Counter {
        let fresh = CounterState {
            traf: 0,
            cleared: now,
            updated: 0,
            prev: 0,
        };
        Counter {
            number,
            period,
            limit,
            comment,
            state: Mutex::new(saved.map_or(fresh, CounterState::from)),
        }
    }

    /// Its settings and its value at `now` (starting its period again if
    /// one has begun), as the admin service shows them.
    pub(super) fn value(&self, now: i64) -> CounterValue {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.roll(&mut st, now);
        CounterValue {
            number: self.number,
            comment: self.comment.clone(),
            period: self.period,
            limit: self.limit,
            traf: st.traf,
            cleared: st.cleared,
            updated: st.updated,
        }
    }

    /// Start again from 0 if a new period has begun by `now`; whether it
    /// did (its record is then to be written).
    pub(super) fn restart(&self, now: i64) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let before = st.cleared;
        self.roll(&mut st, now);
        st.cleared != before
    }

    /// Bytes left in this period (resetting the counter if a new period
    /// has begun).
    pub(super) fn remaining(&self, now: i64) -> u64 {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.roll(&mut st, now);
        self.limit.saturating_sub(st.traf)
    }

    fn roll(&self, st: &mut CounterState, now: i64) {
        if self.period != Period::Never && self.period.changed(st.cleared, now) {
            st.prev = st.traf;
            st.traf = 0;
            st.cleared = now;
        }
    }

    /// One report line (3proxy's format: the number, the bytes, then ` #`
    /// and the comment). `last` is when the reported period was last seen
    /// running: a counter reset since then reports its total before the
    /// reset.
    fn report_line(&self, last: i64) -> String {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let traf = if st.cleared > last { st.prev } else { st.traf };
        format!("{:05} {:020} #{}\n", self.number, traf, self.comment)
    }

    pub(super) fn add(&self, n: u64, now: i64) -> CounterState {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.roll(&mut st, now);
        st.traf = st.traf.saturating_add(n);
        st.updated = now;
        *st
    }

    #[cfg(test)]
    pub(super) fn traffic(&self) -> u64 {
        self.state.lock().unwrap().traf
    }
}

/// One counter rule as [`super::Limits::counter_views`] reports it.
#[derive(Debug, Clone)]
pub struct CounterView {
    pub kind: CountKind,
    /// The rule's user list; None is any user.
    pub users: Option<Vec<String>>,
    /// None for the `nocount*` rules.
    pub counter: Option<CounterValue>,
}

/// A counter's settings and current value.
#[derive(Debug, Clone)]
pub struct CounterValue {
    pub number: u32,
    pub comment: String,
    pub period: Period,
    /// Bytes allowed per period.
    pub limit: u64,
    /// Bytes counted in this period.
    pub traf: u64,
    /// Unix times of the last reset and the last update (0 = never).
    pub cleared: i64,
    pub updated: i64,
}

/// The text of a report of period `min` that was last seen running at
/// `last`: one line per counter rule of that period or a longer one, in
/// cfg order.
pub(super) fn report_text(
    count: &[(Rule, CountKind, Option<Arc<Counter>>)],
    min: Period,
    last: i64,
) -> String {
    count
        .iter()
        .filter_map(|(_, _, c)| c.as_ref())
        .filter(|c| c.period >= min)
        .map(|c| c.report_line(last))
        .collect()
}

impl From<Saved> for CounterState {
    fn from(s: Saved) -> CounterState {
        CounterState {
            traf: s.traf,
            cleared: s.cleared,
            updated: s.updated,
            prev: 0,
        }
    }
}

impl Record for Counter {
    fn saved(&self) -> Saved {
        let st = *self.state.lock().unwrap_or_else(|e| e.into_inner());
        Saved {
            traf: st.traf,
            cleared: st.cleared,
            updated: st.updated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counter_file::CounterFile;
    use crate::counter_file::Reports;
    use crate::limit::tests::{q, rule};
    use crate::limit::{unix_now, Limits};

    #[test]
    fn periods_change_at_their_boundaries() {
        use crate::sys::time::local;
        /// A field of the local time at a given second.
        type Field = fn(i64) -> i32;
        // The first second at which `f` of the local time differs from
        // its value at `t`, found by scanning forward in `step`s and then
        // second by second.
        let next_change = |t: i64, step: i64, f: Field| {
            let v = f(t);
            let mut a = t;
            while f(a + step) == v {
                a += step;
            }
            let mut b = a + 1;
            while f(b) == v {
                b += 1;
            }
            b
        };
        // Mid-January 2024, away from any DST change.
        let t = 1_705_500_000;
        let cases: [(Period, i64, Field); 5] = [
            (Period::Minutely, 1, |x| local(x).min as i32),
            (Period::Hourly, 60, |x| local(x).hour as i32),
            (Period::Daily, 600, |x| local(x).mday as i32),
            (Period::Monthly, 3600, |x| local(x).mon as i32),
            (Period::Annually, 86400, |x| local(x).year),
        ];
        for (p, step, f) in cases {
            let b = next_change(t, step, f);
            assert!(p.changed(b - 1, b), "{p:?} changes at {b}");
            assert!(!p.changed(t, b - 1), "{p:?} holds until {b}");
        }
        // Two times within one minute are in the same period of any kind.
        let m = next_change(t, 1, |x| local(x).min as i32);
        for p in [
            Period::Minutely,
            Period::Hourly,
            Period::Daily,
            Period::Weekly,
            Period::Monthly,
            Period::Annually,
        ] {
            assert!(!p.changed(m, m + 30), "{p:?}");
        }
        // A week starts on Sunday.
        let sunday = next_change(t, 600, |x| i32::from(local(x).wday == 0));
        assert_eq!(local(sunday).wday, 0);
        assert!(Period::Weekly.changed(sunday - 1, sunday));
        assert!(!Period::Weekly.changed(sunday, sunday + 6 * 86400));
        assert!(Period::Weekly.changed(sunday, sunday + 7 * 86400));
        assert!(!Period::Never.changed(0, t));
    }

    #[test]
    fn a_counter_record_is_written_with_the_state_at_writing() {
        // Two sessions that end at once each add, then mark, and the marks
        // may come in the other order: here the second session's mark
        // came first, and the first session marks after the second's add.
        // (When a mark carried its session's state, that one wrote 100.)
        let (dir, path) = crate::counter_file::tests::scratch("dump");
        let f = Arc::new(CounterFile::open(path.to_str().unwrap(), Default::default()).unwrap());
        let c = Arc::new(Counter {
            number: 2,
            period: Period::Daily,
            limit: 1 << 30,
            comment: String::new(),
            state: Mutex::new(CounterState {
                cleared: unix_now(),
                ..CounterState::default()
            }),
        });
        let now = unix_now();
        c.add(100, now);
        c.add(100, now);
        crate::counter_file::mark(&f, 2, c.clone());
        crate::counter_file::flush();
        assert_eq!(f.read(2).unwrap().map(|st| st.traf), Some(200));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reports_list_counters_of_their_period_or_longer() {
        let (dir, file) = crate::counter_file::tests::scratch("report");
        let l = Arc::new(Limits::default());
        let report = dir.join("rep").to_str().unwrap().to_string();
        l.set_counter_file(
            CounterFile::open(file.to_str().unwrap(), Default::default()).unwrap(),
            Some((Period::Daily, report.clone())),
        );
        let mb = 1 << 20;
        for (key, n, comment, period, src) in [
            ("test-rep h", 1, "hourly", Period::Hourly, "* 10.0.0.1"),
            ("test-rep d", 2, "daily", Period::Daily, "* 10.0.0.2"),
            ("test-rep m", 0, "", Period::Monthly, "* 10.0.0.3"),
        ] {
            l.add_counter(
                key,
                CountKind::All,
                Some((n, comment.to_string(), period, 100 * mb)),
                rule(src),
            )
            .unwrap();
        }
        l.add_counter("test-rep no", CountKind::NoOut, None, rule("*"))
            .unwrap();
        // A noon, so that an hour on is the same day and a day on is not.
        let tm = crate::sys::time::local(1_700_000_000);
        let noon = 1_700_000_000 - i64::from(tm.hour) * 3600 + 12 * 3600;
        for (src, n) in [("10.0.0.1", 111), ("10.0.0.2", 222), ("10.0.0.3", 333)] {
            let s = l.start(&q(src), None).unwrap().unwrap();
            for c in s.count_in.iter() {
                c.state.lock().unwrap().cleared = noon;
                c.add(n, noon);
            }
            // Its drop would count (nothing) on today's clock.
            std::mem::forget(s);
        }
        // The report thread's ticks (`counter_file`): an hour on, then a
        // day on.
        assert_eq!(l.tick(noon, noon + 3600), None, "same day: no report yet");
        let (name, text) = l.tick(noon + 3600, noon + 86400).unwrap();
        assert_eq!(
            name,
            crate::log::period_file_name(&report, crate::log::Period::Day, noon)
        );
        assert!(
            name.starts_with(&report) && name.len() == report.len() + 11,
            "{name}"
        );
        assert_eq!(
            text,
            "00002 00000000000000000222 #daily\n00000 00000000000000000333 #\n",
        );
        // The daily counter started again; the monthly one maybe, too.
        let c = l.read().count[1].2.clone().unwrap();
        assert_eq!(c.traffic(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
