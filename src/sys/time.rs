#![allow(unsafe_code)]
//! Broken-down calendar time, the way 3proxy gets it from `gmtime()` /
//! `localtime()` for `logformat` escapes and log-file rotation names.
//!
//! * [`utc`] is the `time` crate's calendar (proleptic Gregorian, negative
//!   timestamps too); it never touches the C library. [`days_from_civil`]
//!   goes back from a date.
//! * [`local`] asks the C library (`localtime_r`) so the system time zone
//!   database and `TZ` are honoured exactly as 3proxy honours them. `tzset()`
//!   runs once, before the first conversion. If the C library cannot convert
//!   the value, [`local`] falls back to [`utc`].
//!
//! Nothing here allocates or does I/O beyond what the C library does to load
//! the time zone once.

use std::sync::Once;

/// A broken-down time. Unlike C's `struct tm`, `year` is the full year and
/// `mon` counts from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tm {
    /// Full year, e.g. 2024.
    pub year: i32,
    /// Month, 1-12.
    pub mon: u32,
    /// Day of the month, 1-31.
    pub mday: u32,
    /// Hour, 0-23.
    pub hour: u32,
    /// Minute, 0-59.
    pub min: u32,
    /// Second, 0-60 (60 only for a leap second reported by the C library).
    pub sec: u32,
    /// Day of the week, 0 = Sunday.
    pub wday: u32,
    /// Offset of this clock from UTC, in seconds east of Greenwich.
    pub gmtoff: i64,
}

/// Convert a Unix timestamp to UTC calendar time (like `gmtime_r`), by
/// the `time` crate. A timestamp beyond its years (-9999 to 9999) is taken
/// as the nearest one it has: no clock a log reads is ever there.
pub fn utc(t: i64) -> Tm {
    let lo = ::time::PrimitiveDateTime::MIN.assume_utc().unix_timestamp();
    let hi = ::time::PrimitiveDateTime::MAX.assume_utc().unix_timestamp();
    let d = ::time::OffsetDateTime::from_unix_timestamp(t.clamp(lo, hi))
        .unwrap_or(::time::OffsetDateTime::UNIX_EPOCH);
    Tm {
        year: d.year(),
        mon: u32::from(u8::from(d.month())),
        mday: u32::from(d.day()),
        hour: u32::from(d.hour()),
        min: u32::from(d.minute()),
        sec: u32::from(d.second()),
        wday: u32::from(d.weekday().number_days_from_sunday()),
        gmtoff: 0,
    }
}

/// Days since 1970-01-01 of the civil date `year-mon-mday` (proleptic
/// Gregorian; `mon` 1-12): the inverse of [`utc`]'s date, by the `time`
/// crate. None for a date that does not exist (or beyond its years).
pub fn days_from_civil(year: i32, mon: u32, mday: u32) -> Option<i64> {
    let month = ::time::Month::try_from(u8::try_from(mon).ok()?).ok()?;
    let date = ::time::Date::from_calendar_date(year, month, u8::try_from(mday).ok()?).ok()?;
    Some(i64::from(date.to_julian_day()) - i64::from(UNIX_EPOCH_JULIAN_DAY))
}

/// The Julian day number of 1970-01-01.
const UNIX_EPOCH_JULIAN_DAY: i32 = 2_440_588;

extern "C" {
    // POSIX; the libc crate does not declare it for Unix targets.
    fn tzset();
}

static TZSET: Once = Once::new();

/// Convert a Unix timestamp to the local calendar time (like `localtime_r`).
pub fn local(t: i64) -> Tm {
    TZSET.call_once(|| {
        // SAFETY: tzset() takes no arguments and only (re)initialises the C
        // library's time zone state from TZ / the zone files. Once guarantees
        // it runs a single time, before any localtime_r() call made here.
        unsafe { tzset() };
    });
    // A 32-bit time_t cannot hold every i64: let utc() handle the rest.
    let tt = t as libc::time_t;
    if tt as i64 != t {
        return utc(t);
    }
    // SAFETY: libc::tm is a plain C struct of integers plus (on some targets)
    // a `const char *` zone name; all-zero bytes (null pointer) are a valid
    // value for every field.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers come from live, properly aligned locals that
    // outlive the call; localtime_r is re-entrant and writes only into `tm`.
    let r = unsafe { libc::localtime_r(&tt, &mut tm) };
    if r.is_null() {
        return utc(t);
    }
    Tm {
        year: tm.tm_year.saturating_add(1900),
        mon: (tm.tm_mon + 1) as u32,
        mday: tm.tm_mday as u32,
        hour: tm.tm_hour as u32,
        min: tm.tm_min as u32,
        sec: tm.tm_sec as u32,
        wday: tm.tm_wday as u32,
        gmtoff: tm.tm_gmtoff as i64, // c_long: i32 on 32-bit targets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`super::days_from_civil`] of a date the tests know exists.
    fn days_from_civil(year: i64, mon: u32, mday: u32) -> i64 {
        super::days_from_civil(year as i32, mon, mday).expect("a real date")
    }

    fn check(t: i64, ymd: (i32, u32, u32), hms: (u32, u32, u32), wday: u32) {
        let got = utc(t);
        let want = Tm {
            year: ymd.0,
            mon: ymd.1,
            mday: ymd.2,
            hour: hms.0,
            min: hms.1,
            sec: hms.2,
            wday,
            gmtoff: 0,
        };
        assert_eq!(got, want, "utc({t})");
        let back = days_from_civil(i64::from(ymd.0), ymd.1, ymd.2) * 86_400
            + i64::from(hms.0) * 3600
            + i64::from(hms.1) * 60
            + i64::from(hms.2);
        assert_eq!(back, t, "days_from_civil for utc({t})");
    }

    #[test]
    fn utc_known_timestamps() {
        check(0, (1970, 1, 1), (0, 0, 0), 4);
        check(-1, (1969, 12, 31), (23, 59, 59), 3);
        check(86_399, (1970, 1, 1), (23, 59, 59), 4);
        check(86_400, (1970, 1, 2), (0, 0, 0), 5);
        check(951_782_400, (2000, 2, 29), (0, 0, 0), 2);
        check(951_868_799, (2000, 2, 29), (23, 59, 59), 2);
        check(951_868_800, (2000, 3, 1), (0, 0, 0), 3);
        check(1_700_000_000, (2023, 11, 14), (22, 13, 20), 2);
        check(2_147_483_647, (2038, 1, 19), (3, 14, 7), 2);
        check(4_102_444_799, (2099, 12, 31), (23, 59, 59), 4);
        check(4_107_542_400, (2100, 3, 1), (0, 0, 0), 1); // 2100 is not leap
        check(253_402_300_799, (9999, 12, 31), (23, 59, 59), 5);
        check(-2_208_988_800, (1900, 1, 1), (0, 0, 0), 1);
        check(-62_135_596_800, (1, 1, 1), (0, 0, 0), 1);
    }

    #[test]
    fn utc_every_day_roundtrips() {
        // Walk day by day across several leap cycles; check continuity.
        let mut prev = utc(-400 * 86_400);
        for d in -399..40_000i64 {
            let tm = utc(d * 86_400 + 43_210);
            assert_eq!((tm.hour, tm.min, tm.sec), (12, 0, 10));
            assert_eq!(tm.wday, (prev.wday + 1) % 7);
            assert_eq!(days_from_civil(i64::from(tm.year), tm.mon, tm.mday), d);
            assert!((1..=12).contains(&tm.mon) && (1..=31).contains(&tm.mday));
            prev = tm;
        }
    }

    #[test]
    fn local_is_consistent_with_its_offset() {
        // Whatever the zone, fields minus gmtoff must give back the instant.
        for t in [
            0i64,
            951_782_400,
            1_700_000_000,
            1_711_846_800,
            4_102_444_799,
        ] {
            let tm = local(t);
            let back = days_from_civil(i64::from(tm.year), tm.mon, tm.mday) * 86_400
                + i64::from(tm.hour) * 3600
                + i64::from(tm.min) * 60
                + i64::from(tm.sec.min(59))
                - tm.gmtoff;
            assert_eq!(back, t, "local({t}) = {tm:?}");
            assert_eq!(tm.wday, utc(t + tm.gmtoff).wday);
        }
    }
}
