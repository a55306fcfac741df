//! A `log radius` session's accounting ([`Accounting`], from its Start to
//! its Stop) and `radiusinterim`: one timer thread for the whole process
//! sends each live session an Interim-Update every interval, through the
//! session's [`Track`] on its live-registry entry.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use super::acct::{account, Record};
use super::fields::{Fields, SessionId};
use super::servers::{clock_ms, Conf};
use crate::proto::radius::Status;
use crate::res::Res;

/// A session's accounting so far: begun with a Start, ended with a Stop.
#[derive(Debug)]
pub struct Accounting {
    pub id: SessionId,
    /// Ties its requests together for the sender ([`super::next_key`]): none of
    /// them is sent before the one queued before it was answered or
    /// given up.
    pub key: u64,
    pub since: SystemTime,
    pub class: Vec<Vec<u8>>,
    /// Bytes already reported by Interim-Updates (`logdump` records),
    /// in and out: the Stop adds them to what came after.
    pub dumped_in: AtomicU64,
    pub dumped_out: AtomicU64,
    /// What `radiusinterim`'s timer and a Disconnect-Request by
    /// Acct-Session-Id read, also hung on the session's live entry.
    pub track: Option<Arc<Track>>,
}

/// What `radiusinterim`'s timer and `radiusdae` need of a live `log
/// radius` session:
/// the servers, what its requests say, and the live counters' values at
/// its Start (a kept-alive HTTP connection has one accounting session
/// per request, the counters one per connection).
#[derive(Debug)]
pub struct Track {
    conf: Arc<Conf>,
    /// `radiusinterim`, if set.
    every: Option<Duration>,
    pub session_id: SessionId,
    key: u64,
    since: SystemTime,
    class: Vec<Vec<u8>>,
    /// Live counters (out, in) at the Start.
    base: (u64, u64),
    /// [`clock_ms`] of the Start or the last Interim-Update, and whether
    /// the Stop was queued: under one lock, so an Interim-Update is
    /// queued before the Stop or not at all.
    state: std::sync::Mutex<(u64, bool)>,
    /// What its Interim-Updates say (only kept with `radiusinterim`).
    fields: std::sync::Mutex<Option<Fields>>,
}

impl Track {
    /// A track for session `s` of `conf`; `base` the live counters (out,
    /// in) now; `fields` what its Interim-Updates say, asked for only if
    /// `conf` has an interval (which starts the timer thread).
    pub fn new(
        conf: &Arc<Conf>,
        s: &Accounting,
        fields: impl FnOnce() -> Fields,
        base: (u64, u64),
    ) -> Track {
        let every = conf.interim;
        if every.is_some() {
            start_timer();
        }
        Track {
            conf: conf.clone(),
            every,
            session_id: s.id,
            key: s.key,
            since: s.since,
            class: s.class.clone(),
            base,
            state: std::sync::Mutex::new((clock_ms(), false)),
            fields: std::sync::Mutex::new(every.map(|_| fields())),
        }
    }

    /// Whether Interim-Updates are sent for the session.
    pub fn interim(&self) -> bool {
        self.every.is_some()
    }

    /// The session knows more of itself (its destination's address).
    pub fn set_fields(&self, f: Fields) {
        *self.fields.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
    }

    /// The Stop is about to be queued: no Interim-Update after it.
    pub fn stop(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
    }

    /// Queue an Interim-Update if one is due at `now` ([`clock_ms`]);
    /// `out` and `inb` are the live counters now.
    fn tick(&self, now: u64, out: u64, inb: u64) {
        let Some(every) = self.every else { return };
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.1 || now < st.0 + every.as_millis() as u64 {
            return;
        }
        st.0 = now;
        let fields = self.fields.lock().unwrap_or_else(|e| e.into_inner());
        let Some(f) = fields.as_ref() else { return };
        let r = Record {
            status: Status::InterimUpdate,
            fields: f.view(),
            input: inb.saturating_sub(self.base.1),
            output: out.saturating_sub(self.base.0),
            session_time: self.since.elapsed().map_or(0, |d| d.as_secs()),
            class: &self.class,
            res: Res::OK,
        };
        account(&self.conf, self.key, &r);
    }
}

/// How often the timer looks for sessions whose Interim-Update is due.
const TICK: Duration = Duration::from_millis(250);

/// Start [`interim_loop`] once per process.
fn start_timer() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("radius-interim".into())
            .stack_size(256 << 10)
            .spawn(interim_loop);
        if let Err(e) = spawned {
            log::error!("radiusinterim: cannot start the timer thread: {e}");
        }
    });
}

/// The one timer thread: every [`TICK`], each live session with a
/// [`Track`] whose interval has passed gets an Interim-Update.
fn interim_loop() {
    loop {
        std::thread::sleep(TICK);
        let now = clock_ms();
        for t in crate::live::tagged() {
            if let Some(track) = t.tag.downcast_ref::<Track>() {
                track.tick(now, t.out, t.inb);
            }
        }
    }
}
