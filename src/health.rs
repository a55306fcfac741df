//! Parent health (threeproxy's own; 3proxy.cfg(5) `parenthealth`): what
//! the outcomes of real attempts (and `parentcheck`'s probes) say about a
//! parent. A parent that failed to connect or to negotiate `fails` times
//! in a row is *down* for a hold time, doubled each time it fails again
//! once the hold is over, up to a cap; a success makes it *up* again.
//! `parent::pick_avoiding` leaves a down parent out of the draw while
//! another parent of its group is up.
//!
//! The state of a parent is kept by its identity, the words of its
//! `parent` line ([`shared`]): a reload that keeps the line keeps the
//! state; a changed line starts afresh.
//!
//! Invariant: no IO here (the clock is read by the callers and passed
//! in); the state is a few numbers behind one mutex per parent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// `parenthealth FAILS HOLD MAXHOLD`, as it stood at a parent's line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Failures in a row that mark a parent down; 0 never does.
    pub fails: u32,
    /// The first hold time.
    pub hold: Duration,
    /// The longest hold time the doubling reaches.
    pub max_hold: Duration,
}

pub const DEFAULT_FAILS: u32 = 3;
pub const DEFAULT_HOLD: Duration = Duration::from_secs(30);
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(300);

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            fails: DEFAULT_FAILS,
            hold: DEFAULT_HOLD,
            max_hold: DEFAULT_MAX_HOLD,
        }
    }
}

/// One parent's health, shared by every request that draws it, across
/// reloads that keep its line.
#[derive(Debug)]
pub struct Health {
    /// How log lines name it: `TYPE HOST:PORT`.
    pub name: String,
    st: Mutex<St>,
}

#[derive(Debug, Default)]
struct St {
    /// Failures in a row.
    fails: u32,
    /// Down until then (the parent is drawn again once it has passed).
    down_until: Option<Instant>,
    /// The hold time last applied.
    hold: Duration,
    /// When it was marked down (kept through its later holds, until it
    /// is seen working).
    down_since: Option<Instant>,
}

/// What a change of state was, for the caller's tests (the log line is
/// written here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    Down(Duration),
    Up,
}

impl Health {
    pub fn new(name: String) -> Health {
        Health {
            name,
            st: Mutex::new(St::default()),
        }
    }

    fn st(&self) -> std::sync::MutexGuard<'_, St> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Down and still held at `now`.
    pub fn is_down(&self, now: Instant) -> bool {
        self.st().down_until.is_some_and(|t| t > now)
    }

    /// Marked down (held or with its hold over, not yet seen working).
    #[cfg(test)]
    pub fn marked_down(&self) -> bool {
        self.st().down_until.is_some()
    }

    /// A connect or negotiation with this parent failed at `now`.
    pub fn failed(&self, p: &Policy, now: Instant) -> Change {
        let mut st = self.st();
        st.fails = st.fails.saturating_add(1);
        log::info!(
            "parent {}: attempt failed ({} in a row)",
            self.name,
            st.fails
        );
        if p.fails == 0 {
            return Change::None;
        }
        match st.down_until {
            // Failing while held (drawn because its whole group is down):
            // the hold stands.
            Some(t) if t > now => Change::None,
            // Its hold is over and it still fails: down again, longer.
            Some(_) => {
                let hold = (st.hold * 2).min(p.max_hold).max(p.hold.min(p.max_hold));
                st.hold = hold;
                st.down_until = Some(now + hold);
                log::warn!(
                    "parent {} still fails: down for {}s more",
                    self.name,
                    hold.as_secs()
                );
                Change::Down(hold)
            }
            None if st.fails >= p.fails => {
                let hold = p.hold.min(p.max_hold);
                st.hold = hold;
                st.down_until = Some(now + hold);
                st.down_since = Some(now);
                log::warn!(
                    "parent {} is down after {} failures in a row: left out of the draw for {}s",
                    self.name,
                    st.fails,
                    hold.as_secs()
                );
                Change::Down(hold)
            }
            None => Change::None,
        }
    }

    /// A connect and negotiation (or a probe) with this parent worked.
    pub fn succeeded(&self) -> Change {
        let mut st = self.st();
        st.fails = 0;
        if st.down_until.take().is_some() {
            st.hold = Duration::ZERO;
            st.down_since = None;
            log::warn!("parent {} is up again", self.name);
            return Change::Up;
        }
        Change::None
    }
}

/// A parent's state as the admin page and `/metrics` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    /// `TYPE HOST:PORT`.
    pub name: String,
    /// Marked down: held, or its hold over but not yet seen working.
    pub down: bool,
    /// Left out of the draw now (held).
    pub held: bool,
    /// How long ago it was marked down.
    pub down_for: Option<Duration>,
    /// Failures in a row.
    pub fails: u32,
}

/// Every parent some cfg holds, at `now`, one per name (parent lines
/// with the same type and address are shown as one: down if any is, the
/// longest down time, the most failures), by name.
pub fn views(now: Instant) -> Vec<View> {
    let all: Vec<Arc<Health>> = {
        let reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        reg.iter()
            .flat_map(|m| m.values())
            .filter_map(Weak::upgrade)
            .collect()
    };
    let mut by_name: std::collections::BTreeMap<String, View> = Default::default();
    for h in all {
        let st = h.st();
        let v = View {
            name: h.name.clone(),
            down: st.down_until.is_some(),
            held: st.down_until.is_some_and(|t| t > now),
            down_for: st.down_since.map(|t| now.saturating_duration_since(t)),
            fails: st.fails,
        };
        drop(st);
        by_name
            .entry(v.name.clone())
            .and_modify(|w| {
                w.down |= v.down;
                w.held |= v.held;
                w.down_for = w.down_for.max(v.down_for);
                w.fails = w.fails.max(v.fails);
            })
            .or_insert(v);
    }
    by_name.into_values().collect()
}

/// A parent's health as a `Hop` holds it: equal only to itself, so two
/// hops compare by their lines, not by their state.
#[derive(Clone)]
pub struct Shared(pub Arc<Health>);

impl PartialEq for Shared {
    fn eq(&self, other: &Shared) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.name == other.0.name
    }
}

impl Eq for Shared {}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Health({})", self.0.name)
    }
}

impl Shared {
    /// A state of its own, kept nowhere else (a hop not from a cfg line).
    pub fn alone(name: String) -> Shared {
        Shared(Arc::new(Health::new(name)))
    }
}

impl std::ops::Deref for Shared {
    type Target = Health;
    fn deref(&self) -> &Health {
        &self.0
    }
}

/// Every parent's state by the words of its line, as long as some cfg
/// (the running one, or one whose sessions still run) holds it.
static REGISTRY: Mutex<Option<HashMap<String, Weak<Health>>>> = Mutex::new(None);

/// The state of the parent whose line has the words `key`: the one a
/// cfg loaded before made, if one still holds it, else a new one.
pub fn shared(key: &str, name: String) -> Shared {
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let map = reg.get_or_insert_with(HashMap::new);
    if let Some(h) = map.get(key).and_then(Weak::upgrade) {
        return Shared(h);
    }
    // Forget the parents no cfg holds any more.
    map.retain(|_, w| w.strong_count() > 0);
    let h = Arc::new(Health::new(name));
    map.insert(key.to_string(), Arc::downgrade(&h));
    Shared(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(fails: u32, hold: u64, max: u64) -> Policy {
        Policy {
            fails,
            hold: Duration::from_secs(hold),
            max_hold: Duration::from_secs(max),
        }
    }

    #[test]
    fn down_after_n_failures_in_a_row_and_up_on_success() {
        let p = policy(3, 10, 40);
        let h = Health::new("socks5 192.0.2.1:1080".into());
        let t = Instant::now();
        assert_eq!(h.failed(&p, t), Change::None);
        assert_eq!(h.failed(&p, t), Change::None);
        assert!(!h.is_down(t));
        // A success in between starts the count again.
        assert_eq!(h.succeeded(), Change::None);
        assert_eq!(h.failed(&p, t), Change::None);
        assert_eq!(h.failed(&p, t), Change::None);
        assert_eq!(h.failed(&p, t), Change::Down(Duration::from_secs(10)));
        assert!(h.is_down(t + Duration::from_secs(9)));
        assert!(!h.is_down(t + Duration::from_secs(10)));
        // Failing during the hold changes nothing.
        assert_eq!(h.failed(&p, t + Duration::from_secs(1)), Change::None);
        assert!(!h.is_down(t + Duration::from_secs(10)));
        // After the hold, one more failure: down again, twice as long,
        // then capped.
        let t2 = t + Duration::from_secs(10);
        assert_eq!(h.failed(&p, t2), Change::Down(Duration::from_secs(20)));
        let t3 = t2 + Duration::from_secs(20);
        assert_eq!(h.failed(&p, t3), Change::Down(Duration::from_secs(40)));
        let t4 = t3 + Duration::from_secs(40);
        assert_eq!(h.failed(&p, t4), Change::Down(Duration::from_secs(40)));
        assert!(h.marked_down());
        assert_eq!(h.succeeded(), Change::Up);
        assert!(!h.is_down(t4) && !h.marked_down());
        // Up again: the first hold is the short one.
        for _ in 0..2 {
            assert_eq!(h.failed(&p, t4), Change::None);
        }
        assert_eq!(h.failed(&p, t4), Change::Down(Duration::from_secs(10)));
    }

    #[test]
    fn views_show_down_parents_by_name() {
        let p = policy(1, 10, 40);
        let key = "views-test 1 socks5 192.0.2.9 1080";
        let name = "socks5 192.0.2.9:1080".to_string();
        let a = shared(key, name.clone());
        let b = shared(&format!("{key} 2"), name.clone());
        let t = Instant::now();
        let find = |now| views(now).into_iter().find(|v| v.name == name).unwrap();
        let v = find(t);
        assert!(!v.down && !v.held && v.down_for.is_none() && v.fails == 0);
        a.failed(&p, t);
        let v = find(t + Duration::from_secs(4));
        assert!(v.down && v.held && v.fails == 1);
        assert_eq!(v.down_for, Some(Duration::from_secs(4)));
        // The hold is over: still down, no longer held.
        let v = find(t + Duration::from_secs(11));
        assert!(v.down && !v.held);
        a.succeeded();
        b.failed(&p, t);
        b.succeeded();
        let v = find(t);
        assert!(!v.down && v.down_for.is_none());
    }

    #[test]
    fn zero_failures_never_marks_down() {
        let p = policy(0, 10, 40);
        let h = Health::new("tcp 192.0.2.1:1".into());
        let t = Instant::now();
        for _ in 0..10 {
            assert_eq!(h.failed(&p, t), Change::None);
        }
        assert!(!h.is_down(t));
    }

    #[test]
    fn the_same_line_shares_its_state_while_held() {
        let a = shared("1000 socks5 192.0.2.7 1080", "socks5 192.0.2.7:1080".into());
        let b = shared("1000 socks5 192.0.2.7 1080", "socks5 192.0.2.7:1080".into());
        assert!(Arc::ptr_eq(&a.0, &b.0));
        let c = shared("500 socks5 192.0.2.7 1080", "socks5 192.0.2.7:1080".into());
        assert!(!Arc::ptr_eq(&a.0, &c.0));
        drop((a, b));
        let d = shared("1000 socks5 192.0.2.7 1080", "socks5 192.0.2.7:1080".into());
        assert!(!Arc::ptr_eq(&c.0, &d.0));
    }
}
