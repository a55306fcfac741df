//! `logformat` compilation and expansion.
//!
//! Mirrors 3proxy's record formatter (`dobuf`/`dobuf2` in src/log.c), the
//! `-XYZ+R` filter prefix that 3proxy strips per service (`srvinit2` in
//! src/proxymain.c) and the escapes listed under `logformat` in 3proxy.cfg(5).
//!
//! Layout of a format string, as 3proxy reads it:
//!
//! 1. optional filter prefix: `-` + the characters to filter + `+` + one
//!    replacement character. It applies only if the string starts with `-`
//!    and a `+` followed by at least one more character comes later; the set
//!    runs up to the *first* `+`. When present, every byte below 0x20 and
//!    every byte of the set is replaced in %U, %n (host name) and %T/%N1-N2T.
//! 2. one clock character, always consumed, never printed: `G`/`g` = UTC,
//!    anything else (normally `L`) = local time.
//! 3. the body: literal bytes and `%` escapes.
//!
//! Invariants:
//! * pure: no I/O and no state beyond the C library's time zone (local clock);
//! * [`LogFormat::parse`] never fails and does all the parsing; the result is
//!   a list of segments, so [`LogFormat::render`] only appends to `out`;
//! * byte-oriented like the C code (3proxy is not UTF-8 aware), so output may
//!   be cut inside a multi-byte character by the cap;
//! * the cap is 3proxy's: no new segment starts once the record is
//!   [`LOOP_CAP`] bytes long, and user-controlled text (%U, %n, %T, %N1-N2T)
//!   stops at [`TEXT_CAP`] bytes. Other escapes may overshoot slightly (by at
//!   most one address), exactly like 3proxy.
//!
//! Deliberate differences from 3proxy, all in cases where 3proxy prints
//! garbage or reads out of bounds: `%z` is correct for zones west of UTC with
//! half-hour offsets (3proxy prints `-0342` for -03:30), a `%N1-N2` selector
//! at the very end of the string ends the record, and %b/%B saturate instead
//! of wrapping above 4294967295.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::sys::time::{self, Tm};

/// A record stops growing once it has this many bytes (3proxy's 4040).
pub const LOOP_CAP: usize = 4040;
/// User-controlled text stops at this many bytes (3proxy's 4000).
pub const TEXT_CAP: usize = 4000;
/// %N prints at most this many bytes of the service name.
const SERVICE_MAX: usize = 20;

const MONTHS: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// Everything one access-log record can print. Filled by `Client` on drop.
#[derive(Debug, Clone)]
pub struct LogRecord<'a> {
    /// %N: service name as 3proxy prints it ("TCPPM", "UDPPM", "PROXY", "SOCK5" ...).
    pub service: &'a str,
    /// %p: the port the service listens on.
    pub listen_port: u16,
    /// %E: result code, printed as 5 digits.
    pub res: u32,
    /// %U: user name, `-` when None.
    pub user: Option<&'a str>,
    /// %C %c: client address.
    pub client: Option<SocketAddr>,
    /// %i: the local address the client connected to.
    pub local: Option<SocketAddr>,
    /// %e: source address of the outgoing connection.
    pub ext: Option<SocketAddr>,
    /// %R %r: the actual peer (server or parent).
    pub remote: Option<SocketAddr>,
    /// %Q %q: the requested destination address (ip may be unspecified when only a name is known).
    pub req: Option<SocketAddr>,
    /// %n: requested host name; when None, `%n` prints the requested IP as 3proxy does.
    pub req_host: Option<&'a str>,
    /// %I: bytes server -> client.
    pub bytes_in: u64,
    /// %O: bytes client -> server.
    pub bytes_out: u64,
    /// %h: parent hops.
    pub hops: u32,
    /// %T: service text (request line, "CONNECT host:port", ...).
    pub text: &'a str,
    /// When the session (or this record's period) began: %D and %b/%B.
    /// `UNIX_EPOCH` means "unknown" (3proxy's `time_start == 0`): %D/%b/%B print 0.
    pub start: SystemTime,
    /// The record's time stamp.
    pub now: SystemTime,
}

/// One escape, resolved at parse time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    /// %y
    Year2,
    /// %Y
    Year4,
    /// %m
    Month,
    /// %o
    MonthName,
    /// %d
    Day,
    /// %H
    Hour,
    /// %M
    Minute,
    /// %S
    Second,
    /// %t
    Unix,
    /// %.
    Millis,
    /// %z
    Zone,
    /// %D
    Duration,
    /// %b: client -> server bytes per second.
    RateOut,
    /// %B: server -> client bytes per second.
    RateIn,
    /// %U
    User,
    /// %N
    Service,
    /// %p
    ListenPort,
    /// %E
    Result,
    /// %C
    ClientIp,
    /// %c
    ClientPort,
    /// %R
    RemoteIp,
    /// %r
    RemotePort,
    /// %i
    LocalIp,
    /// %e
    ExtIp,
    /// %Q
    ReqIp,
    /// %q
    ReqPort,
    /// %n
    ReqHost,
    /// %I
    BytesIn,
    /// %O
    BytesOut,
    /// %h
    Hops,
    /// %T
    Text,
    /// %L: 3proxy's `cycles` counter, which nothing ever sets.
    Cycles,
    /// %N1-N2T, stored zero-based (3proxy's `pmin`/`pmax`).
    Fields { first: i64, last: i64 },
}

impl Item {
    fn needs_tm(self) -> bool {
        matches!(
            self,
            Item::Year2
                | Item::Year4
                | Item::Month
                | Item::MonthName
                | Item::Day
                | Item::Hour
                | Item::Minute
                | Item::Second
                | Item::Zone
        )
    }
}

#[derive(Debug, Clone)]
enum Seg {
    Lit(Box<[u8]>),
    Item(Item),
}

/// The `-XYZ+R` prefix: bytes of the set and all bytes < 0x20 become `replace`.
#[derive(Debug, Clone, Copy)]
struct Filter {
    set: [u64; 4],
    replace: u8,
}

impl Filter {
    fn new(chars: &[u8], replace: u8) -> Filter {
        let mut set = [0u64; 4];
        for &c in chars {
            set[usize::from(c >> 6)] |= 1 << (c & 63);
        }
        Filter { set, replace }
    }

    #[inline]
    fn apply(&self, c: u8) -> u8 {
        if c < 0x20 || self.set[usize::from(c >> 6)] & (1 << (c & 63)) != 0 {
            self.replace
        } else {
            c
        }
    }
}

impl<'a> LogRecord<'a> {
    /// A record with nothing known but the service and the time: the
    /// start of service events and of file name templates.
    pub fn blank(service: &'a str, when: SystemTime) -> LogRecord<'a> {
        LogRecord {
            service,
            listen_port: 0,
            res: 0,
            user: None,
            client: None,
            local: None,
            ext: None,
            remote: None,
            req: None,
            req_host: None,
            bytes_in: 0,
            bytes_out: 0,
            hops: 0,
            text: "",
            start: when,
            now: when,
        }
    }
}

/// A compiled `logformat` string.
#[derive(Debug, Clone)]
pub struct LogFormat {
    segs: Vec<Seg>,
    utc: bool,
    filter: Option<Filter>,
    needs_tm: bool,
}

impl LogFormat {
    /// 3proxy's built-in default format.
    pub const DEFAULT: &'static str = "G%y%m%d%H%M%S.%. %p %E %U %C:%c %R:%r %O %I %h %T";

    /// Compile a format string (the argument of `logformat` or `-f`). Never fails.
    pub fn parse(fmt: &str) -> LogFormat {
        let mut b = until_nul(fmt.as_bytes());
        let mut filter = None;
        if b.first() == Some(&b'-') {
            if let Some(p) = b[1..].iter().position(|&c| c == b'+').map(|p| p + 1) {
                if let Some(&replace) = b.get(p + 1) {
                    filter = Some(Filter::new(&b[1..p], replace));
                    b = &b[p + 2..];
                }
            }
        }
        // The clock character is consumed whatever it is. (3proxy reads past
        // the end of an empty format; here it is just empty.)
        let utc = matches!(b.first(), Some(b'G' | b'g'));
        let body = b.get(1..).unwrap_or(&[]);
        Self::compile(body, utc, filter)
    }

    /// Compile a `log` file name template (a name containing `%`): 3proxy
    /// expands the whole name, with no clock character and no filter prefix,
    /// always in local time.
    pub fn template(name: &str) -> LogFormat {
        Self::compile(until_nul(name.as_bytes()), false, None)
    }

    fn compile(b: &[u8], utc: bool, filter: Option<Filter>) -> LogFormat {
        let mut segs = Vec::new();
        let mut lit = Vec::new();
        let mut j = 0;
        while j < b.len() {
            if b[j] != b'%' || j + 1 >= b.len() {
                lit.push(b[j]);
                j += 1;
                continue;
            }
            j += 1;
            let item = match b[j] {
                b'y' => Item::Year2,
                b'Y' => Item::Year4,
                b'm' => Item::Month,
                b'o' => Item::MonthName,
                b'd' => Item::Day,
                b'H' => Item::Hour,
                b'M' => Item::Minute,
                b'S' => Item::Second,
                b't' => Item::Unix,
                b'.' => Item::Millis,
                b'z' => Item::Zone,
                b'D' => Item::Duration,
                b'b' => Item::RateOut,
                b'B' => Item::RateIn,
                b'U' => Item::User,
                b'N' => Item::Service,
                b'p' => Item::ListenPort,
                b'E' => Item::Result,
                b'C' => Item::ClientIp,
                b'c' => Item::ClientPort,
                b'R' => Item::RemoteIp,
                b'r' => Item::RemotePort,
                b'i' => Item::LocalIp,
                b'e' => Item::ExtIp,
                b'Q' => Item::ReqIp,
                b'q' => Item::ReqPort,
                b'n' => Item::ReqHost,
                b'I' => Item::BytesIn,
                b'O' => Item::BytesOut,
                b'h' => Item::Hops,
                b'T' => Item::Text,
                b'L' => Item::Cycles,
                b'1'..=b'9' => {
                    // 3proxy's selector. Only the full `N1-N2` form moves the
                    // cursor past the digits; a bare `%N` leaves it on the
                    // first digit, so the following digits and the `T` come
                    // out as literal text (`%5T` prints field 1, then "T").
                    let mut k = skip_digits(b, j);
                    let (mut first, mut last) = (0, 0);
                    if b.get(k) == Some(&b'-') && b.get(k + 1).is_some_and(u8::is_ascii_digit) {
                        first = atoi(&b[j..]) - 1;
                        last = atoi(&b[k + 1..]) - 1;
                        k = skip_digits(b, k + 1);
                        j = k;
                    }
                    j += 1;
                    if b.get(k) == Some(&b'T') {
                        flush(&mut segs, &mut lit);
                        segs.push(Seg::Item(Item::Fields { first, last }));
                    }
                    continue;
                }
                // `%%`, and any unknown escape: the character itself.
                other => {
                    lit.push(other);
                    j += 1;
                    continue;
                }
            };
            flush(&mut segs, &mut lit);
            segs.push(Seg::Item(item));
            j += 1;
        }
        flush(&mut segs, &mut lit);
        let needs_tm = segs
            .iter()
            .any(|s| matches!(s, Seg::Item(it) if it.needs_tm()));
        LogFormat {
            segs,
            utc,
            filter,
            needs_tm,
        }
    }

    fn ctx<'r, 'a>(&self, rec: &'r LogRecord<'a>, base: usize) -> Ctx<'r, 'a> {
        let (now_s, now_ms) = split_time(rec.now);
        let tm = if !self.needs_tm {
            time::utc(0)
        } else if self.utc {
            time::utc(now_s)
        } else {
            time::local(now_s)
        };
        let delay = delay_ms(rec.start, now_s, now_ms);
        Ctx {
            rec,
            tm,
            now_s,
            now_ms,
            delay,
            base,
            filter: self.filter,
        }
    }

    /// Append the expanded record (no trailing newline) to `out`.
    pub fn render(&self, rec: &LogRecord<'_>, out: &mut Vec<u8>) {
        let base = out.len();
        let cx = self.ctx(rec, base);
        for seg in &self.segs {
            let len = out.len() - base;
            if len >= LOOP_CAP {
                break;
            }
            match seg {
                Seg::Lit(l) => out.extend_from_slice(&l[..l.len().min(LOOP_CAP - len)]),
                Seg::Item(it) => cx.item(*it, out),
            }
        }
    }
}

/// One record of an SQL log target (`log &DSN`): the statement with a `?`
/// for each value that came from a client, and those values in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlRecord {
    pub statement: Vec<u8>,
    pub params: Vec<Vec<u8>>,
}

impl LogFormat {
    /// The record as an SQL statement with parameters, for `log &DSN`.
    ///
    /// The format's literal text is the statement. A single-quoted SQL
    /// literal in it that holds at least one escape (`'%U'`,
    /// `'%Y-%m-%d %H:%M:%S'`) becomes one `?` whose value is the literal's
    /// expanded contents (a doubled `''` in the format stands for one
    /// quote); a quoted literal with no escape stays as written. Outside
    /// quotes, the escapes whose text a client chooses (`%U`, `%n`, `%T`,
    /// `%N1-N2T`) become a `?` each too; the others (numbers, addresses,
    /// times, the service name) are written into the statement, since
    /// their bytes are digits, dots, colons and letters of our own. So no
    /// byte a client sends is ever part of the statement's text. The
    /// `-XYZ+R` filter applies to the values as in a text log. A quote
    /// left open at the end is closed by nothing: the rest is kept as
    /// literal text, its values with quotes doubled.
    pub fn render_sql(&self, rec: &LogRecord<'_>) -> SqlRecord {
        let cx = self.ctx(rec, 0);
        let mut st = SqlState {
            out: SqlRecord {
                statement: Vec::with_capacity(256),
                params: Vec::new(),
            },
            quote: None,
            closing: false,
        };
        let mut tmp = Vec::new();
        for seg in &self.segs {
            match seg {
                Seg::Lit(l) => {
                    for &c in l.iter() {
                        st.byte(c);
                    }
                }
                Seg::Item(it) => {
                    tmp.clear();
                    cx.item(*it, &mut tmp);
                    st.item(*it, &tmp);
                }
            }
        }
        st.finish()
    }
}

/// An SQL literal being read: as written (values with quotes doubled)
/// and as its value, and whether an escape was in it.
struct Quoted {
    raw: Vec<u8>,
    value: Vec<u8>,
    has_item: bool,
}

struct SqlState {
    out: SqlRecord,
    quote: Option<Quoted>,
    /// A quote was seen inside a literal: it closes it unless the next
    /// byte is a quote too (`''`).
    closing: bool,
}

impl SqlState {
    fn byte(&mut self, c: u8) {
        if self.closing {
            self.closing = false;
            if c == b'\'' {
                let q = self.quote.as_mut().expect("closing inside a literal");
                q.raw.extend_from_slice(b"''");
                q.value.push(b'\'');
                return;
            }
            self.close();
        }
        match &mut self.quote {
            None if c == b'\'' => {
                self.quote = Some(Quoted {
                    raw: vec![b'\''],
                    value: Vec::new(),
                    has_item: false,
                })
            }
            None => self.out.statement.push(c),
            Some(_) if c == b'\'' => self.closing = true,
            Some(q) => {
                q.raw.push(c);
                q.value.push(c);
            }
        }
    }

    fn item(&mut self, it: Item, text: &[u8]) {
        if self.closing {
            self.closing = false;
            self.close();
        }
        match &mut self.quote {
            Some(q) => {
                q.has_item = true;
                q.value.extend_from_slice(text);
                for &c in text {
                    q.raw.push(c);
                    if c == b'\'' {
                        q.raw.push(c);
                    }
                }
            }
            None if matches!(
                it,
                Item::User | Item::ReqHost | Item::Text | Item::Fields { .. }
            ) =>
            {
                self.out.statement.push(b'?');
                self.out.params.push(text.to_vec());
            }
            None => self.out.statement.extend_from_slice(text),
        }
    }

    /// The literal ended with its closing quote.
    fn close(&mut self) {
        let Some(q) = self.quote.take() else { return };
        if q.has_item {
            self.out.statement.push(b'?');
            self.out.params.push(q.value);
        } else {
            self.out.statement.extend_from_slice(&q.raw);
            self.out.statement.push(b'\'');
        }
    }

    fn finish(mut self) -> SqlRecord {
        if self.closing {
            self.close();
        } else if let Some(q) = self.quote.take() {
            self.out.statement.extend_from_slice(&q.raw);
        }
        self.out
    }
}

/// Per-render values shared by all segments.
struct Ctx<'r, 'a> {
    rec: &'r LogRecord<'a>,
    tm: Tm,
    now_s: i64,
    now_ms: u32,
    delay: u32,
    base: usize,
    filter: Option<Filter>,
}

impl Ctx<'_, '_> {
    fn item(&self, it: Item, out: &mut Vec<u8>) {
        let rec = self.rec;
        let tm = &self.tm;
        match it {
            Item::Year2 => push_fixed(out, i64::from(tm.year - 1900) % 100, 2),
            Item::Year4 => push_fixed(out, i64::from(tm.year), 4),
            Item::Month => push_fixed(out, i64::from(tm.mon), 2),
            Item::MonthName => {
                let m = tm.mon.wrapping_sub(1) as usize;
                out.extend_from_slice(MONTHS.get(m).map_or(b"???", |m| *m));
            }
            Item::Day => push_fixed(out, i64::from(tm.mday), 2),
            Item::Hour => push_fixed(out, i64::from(tm.hour), 2),
            Item::Minute => push_fixed(out, i64::from(tm.min), 2),
            Item::Second => push_fixed(out, i64::from(tm.sec), 2),
            // 3proxy prints `(unsigned)sec`: wraps in 2106.
            Item::Unix => push_fixed(out, i64::from(self.now_s as u32), 10),
            Item::Millis => push_fixed(out, i64::from(self.now_ms), 3),
            Item::Zone => {
                let mins = tm.gmtoff / 60;
                out.push(if mins < 0 { b'-' } else { b'+' });
                let mins = mins.abs();
                push_fixed(out, mins / 60, 2);
                push_fixed(out, mins % 60, 2);
            }
            Item::Duration => push_u64(out, u64::from(self.delay)),
            Item::RateOut => push_u64(out, u64::from(rate(rec.bytes_out, self.delay))),
            Item::RateIn => push_u64(out, u64::from(rate(rec.bytes_in, self.delay))),
            Item::User => match rec.user.map(|u| until_nul(u.as_bytes())) {
                Some(u) if !u.is_empty() => self.push_text(out, u),
                _ => out.push(b'-'),
            },
            Item::Service => {
                let s = until_nul(rec.service.as_bytes());
                if s.is_empty() {
                    out.push(b'-');
                } else {
                    out.extend_from_slice(&s[..s.len().min(SERVICE_MAX)]);
                }
            }
            Item::ListenPort => push_u64(out, u64::from(rec.listen_port)),
            // `%.05d` of a C int, then exactly 5 bytes are kept.
            Item::Result => push_fixed(out, i64::from(rec.res as i32), 5),
            Item::ClientIp => push_ip(out, rec.client),
            Item::ClientPort => push_port(out, rec.client),
            Item::RemoteIp => push_ip(out, rec.remote),
            Item::RemotePort => push_port(out, rec.remote),
            Item::LocalIp => push_ip(out, rec.local),
            Item::ExtIp => push_ip(out, rec.ext),
            Item::ReqIp => push_ip(out, rec.req),
            Item::ReqPort => push_port(out, rec.req),
            Item::ReqHost => match rec.req_host.map(|h| until_nul(h.as_bytes())) {
                // A name with ':' (an IPv6 literal) is shown as the address.
                Some(h) if !h.is_empty() && !h.contains(&b':') => self.push_text(out, h),
                _ => {
                    out.push(b'[');
                    push_ip(out, rec.req);
                    out.push(b']');
                }
            },
            Item::BytesIn => push_u64(out, rec.bytes_in),
            Item::BytesOut => push_u64(out, rec.bytes_out),
            Item::Hops => push_u64(out, u64::from(rec.hops)),
            Item::Text => self.push_text(out, until_nul(rec.text.as_bytes())),
            Item::Cycles => out.push(b'0'),
            Item::Fields { first, last } => {
                self.push_fields(out, until_nul(rec.text.as_bytes()), first, last);
            }
        }
    }

    #[inline]
    fn room(&self, out: &[u8]) -> usize {
        TEXT_CAP.saturating_sub(out.len() - self.base)
    }

    /// User-controlled bytes: filtered, and stopped at [`TEXT_CAP`].
    fn push_text(&self, out: &mut Vec<u8>, s: &[u8]) {
        let s = &s[..s.len().min(self.room(out))];
        match self.filter {
            Some(f) => out.extend(s.iter().map(|&c| f.apply(c))),
            None => out.extend_from_slice(s),
        }
    }

    /// %N1-N2T. Fields are separated by runs of C `isspace` bytes; a text
    /// that starts with a space has an empty field 1. Between two printed
    /// fields the *last* byte of the separating run is printed; the run
    /// in front of the first selected field is not.
    fn push_fields(&self, out: &mut Vec<u8>, s: &[u8], first: i64, last: i64) {
        let mut field = 0i64;
        let mut i = 0;
        while i < s.len() && field <= last && self.room(out) > 0 {
            if is_c_space(s[i]) {
                field += 1;
                while i + 1 < s.len() && is_c_space(s[i + 1]) {
                    i += 1;
                }
                if field == first {
                    i += 1;
                    continue;
                }
            }
            if field >= first && field <= last {
                let c = s[i];
                out.push(self.filter.map_or(c, |f| f.apply(c)));
            }
            i += 1;
        }
    }
}

fn flush(segs: &mut Vec<Seg>, lit: &mut Vec<u8>) {
    if !lit.is_empty() {
        segs.push(Seg::Lit(std::mem::take(lit).into_boxed_slice()));
    }
}

/// C strings end at the first NUL; so does everything 3proxy prints.
fn until_nul(s: &[u8]) -> &[u8] {
    s.iter().position(|&c| c == 0).map_or(s, |p| &s[..p])
}

fn skip_digits(b: &[u8], mut k: usize) -> usize {
    while b.get(k).is_some_and(u8::is_ascii_digit) {
        k += 1;
    }
    k
}

/// Leading decimal digits, saturating (C `atoi` on a digit string).
fn atoi(b: &[u8]) -> i64 {
    b.iter()
        .take_while(|c| c.is_ascii_digit())
        .fold(0i64, |n, &c| {
            n.saturating_mul(10)
                .saturating_add(i64::from(c - b'0'))
                .min(i64::from(i32::MAX))
        })
}

/// C `isspace` in the C locale.
fn is_c_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Seconds (floored) and milliseconds since the epoch, like `gettimeofday`
/// split into `tv_sec` and `tv_usec / 1000`.
fn split_time(t: SystemTime) -> (i64, u32) {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (
            i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            d.subsec_millis(),
        ),
        Err(e) => {
            let d = e.duration();
            let s = i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            match d.subsec_nanos() {
                0 => (-s, 0),
                ns => (-s - 1, (1_000_000_000 - ns) / 1_000_000),
            }
        }
    }
}

/// 3proxy's `delay`: unsigned 32-bit milliseconds, 0 when the start is unset.
fn delay_ms(start: SystemTime, now_s: i64, now_ms: u32) -> u32 {
    let (start_s, start_ms) = split_time(start);
    if start_s == 0 {
        return 0;
    }
    (now_s.wrapping_sub(start_s) as u32)
        .wrapping_mul(1000)
        .wrapping_add(now_ms)
        .wrapping_sub(start_ms)
}

/// Bytes per second over `delay` ms, computed in floating point like 3proxy.
fn rate(bytes: u64, delay: u32) -> u32 {
    if delay == 0 {
        0
    } else {
        (bytes as f64 * 1000.0 / f64::from(delay)) as u32
    }
}

fn push_u64(out: &mut Vec<u8>, v: u64) {
    let mut buf = [0u8; 20];
    out.extend_from_slice(crate::addr::decimal(v, &mut buf));
}

/// C `printf("%.Nd", v)` followed by 3proxy's `i += N`: at least `width`
/// digits after the sign, and only the first `width` bytes survive.
fn push_fixed(out: &mut Vec<u8>, v: i64, width: usize) {
    let mut buf = [0u8; 24];
    let mut i = buf.len();
    let mut u = v.unsigned_abs();
    let mut digits = 0;
    loop {
        i -= 1;
        buf[i] = b'0' + (u % 10) as u8;
        u /= 10;
        digits += 1;
        if u == 0 && digits >= width {
            break;
        }
    }
    if v < 0 {
        i -= 1;
        buf[i] = b'-';
    }
    let s = &buf[i..];
    out.extend_from_slice(&s[..s.len().min(width)]);
}

fn push_port(out: &mut Vec<u8>, a: Option<SocketAddr>) {
    push_u64(out, u64::from(a.map_or(0, |a| a.port())));
}

/// An address as 3proxy's `myinet_ntop` prints it: dotted quad for IPv4,
/// glibc `inet_ntop` text for IPv6 (no brackets, no scope), `0.0.0.0` when
/// unset (3proxy's zeroed `AF_INET` sockaddr).
fn push_ip(out: &mut Vec<u8>, a: Option<SocketAddr>) {
    match a {
        None => push_ipv4(out, Ipv4Addr::UNSPECIFIED),
        Some(SocketAddr::V4(a)) => push_ipv4(out, *a.ip()),
        Some(SocketAddr::V6(a)) => push_ipv6(out, a.ip()),
    }
}

fn push_ipv4(out: &mut Vec<u8>, a: Ipv4Addr) {
    for (n, o) in a.octets().into_iter().enumerate() {
        if n != 0 {
            out.push(b'.');
        }
        push_u64(out, u64::from(o));
    }
}

fn push_hex(out: &mut Vec<u8>, w: u16) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut started = false;
    for shift in [12u16, 8, 4, 0] {
        let d = (w >> shift) & 0xf;
        if d != 0 || started || shift == 0 {
            out.push(HEX[usize::from(d)]);
            started = true;
        }
    }
}

/// glibc `inet_ntop(AF_INET6)`: the longest run (first on ties) of two or
/// more zero words becomes `::`; `::a.b.c.d` and `::ffff:a.b.c.d` keep the
/// IPv4 tail dotted.
fn push_ipv6(out: &mut Vec<u8>, a: &Ipv6Addr) {
    let w = a.segments();
    let (mut best, mut best_len) = (0usize, 0usize);
    let mut i = 0;
    while i < 8 {
        if w[i] != 0 {
            i += 1;
            continue;
        }
        let start = i;
        while i < 8 && w[i] == 0 {
            i += 1;
        }
        if i - start > best_len {
            (best, best_len) = (start, i - start);
        }
    }
    if best_len < 2 {
        best_len = 0;
    }
    for (i, &word) in w.iter().enumerate() {
        if best_len > 0 && i >= best && i < best + best_len {
            if i == best {
                out.push(b':');
            }
            continue;
        }
        if i != 0 {
            out.push(b':');
        }
        if i == 6 && best == 0 && (best_len == 6 || (best_len == 5 && w[5] == 0xffff)) {
            let o = a.octets();
            push_ipv4(out, Ipv4Addr::new(o[12], o[13], o[14], o[15]));
            return;
        }
        push_hex(out, word);
    }
    if best_len > 0 && best + best_len == 8 {
        out.push(b':');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn sa(s: &str) -> Option<SocketAddr> {
        Some(s.parse().unwrap())
    }

    /// 2023-11-14 22:13:20.042 UTC; the session began 2.5 s earlier.
    fn rec() -> LogRecord<'static> {
        LogRecord {
            service: "PROXY",
            listen_port: 3128,
            res: 0,
            user: Some("alice"),
            client: sa("192.168.1.10:51234"),
            local: sa("192.168.1.1:3128"),
            ext: sa("10.0.0.2:40000"),
            remote: sa("93.184.216.34:80"),
            req: sa("93.184.216.34:8080"),
            req_host: Some("example.com"),
            bytes_in: 12345,
            bytes_out: 678,
            hops: 1,
            text: "GET http://example.com/ HTTP/1.1",
            start: at(1_699_999_997_542),
            now: at(1_700_000_000_042),
        }
    }

    /// A record with nothing set.
    fn empty() -> LogRecord<'static> {
        LogRecord::blank("", UNIX_EPOCH)
    }

    fn render(fmt: &str, r: &LogRecord<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        LogFormat::parse(fmt).render(r, &mut out);
        out
    }

    fn check_bytes(fmt: &str, r: &LogRecord<'_>, want: &[u8]) {
        let got = render(fmt, r);
        assert_eq!(
            got,
            want,
            "format {fmt:?}: got {:?}, want {:?}",
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(want)
        );
    }

    fn check(fmt: &str, r: &LogRecord<'_>, want: &str) {
        check_bytes(fmt, r, want.as_bytes());
    }

    #[test]
    fn default_format() {
        check(
            LogFormat::DEFAULT,
            &rec(),
            "231114221320.042 3128 00000 alice 192.168.1.10:51234 93.184.216.34:80 678 12345 1 \
             GET http://example.com/ HTTP/1.1",
        );
        check(
            LogFormat::DEFAULT,
            &empty(),
            "700101000000.000 0 00000 - 0.0.0.0:0 0.0.0.0:0 0 0 0 ",
        );
    }

    #[test]
    fn time_escapes() {
        let r = rec();
        check("G%y", &r, "23");
        check("G%Y", &r, "2023");
        check("G%m", &r, "11");
        check("G%o", &r, "Nov");
        check("G%d", &r, "14");
        check("G%H", &r, "22");
        check("G%M", &r, "13");
        check("G%S", &r, "20");
        check("G%t", &r, "1700000000");
        check("G%.", &r, "042");
        check("G%z", &r, "+0000");
        check("g%Y-%m-%d %H:%M:%S", &r, "2023-11-14 22:13:20");
        check("G%d/%o/%Y", &rec_at(951_782_400_007), "29/Feb/2000");
        check("G%y%m%d%H%M%S.%.", &rec_at(7), "700101000000.007");
        check("G%o", &rec_at(0), "Jan");
        check("G%o", &rec_at(1_702_000_000_000), "Dec");
        check("G%t", &rec_at(999_999), "0000000999");
        check("G%t", &rec_at(4_294_967_295_000), "4294967295");
        check("G%t", &rec_at(4_294_967_296_000), "0000000000"); // 32-bit wrap
        check("G%y %Y", &rec_at(4_102_444_799_000), "99 2099");
        check("G%y", &rec_at(978_307_200_000), "01");
        // %t and %. are clock independent.
        check("L%t.%.", &r, "1700000000.042");
    }

    fn rec_at(ms: u64) -> LogRecord<'static> {
        LogRecord {
            now: at(ms),
            ..rec()
        }
    }

    #[test]
    fn durations_and_rates() {
        let r = rec();
        check("G%D", &r, "2500");
        check("G%b", &r, "271"); // 678 * 1000 / 2500
        check("G%B", &r, "4938"); // 12345 * 1000 / 2500
        let e = empty();
        check("G%D %b %B", &e, "0 0 0");
        // start unknown (epoch): everything 0, as 3proxy's time_start == 0.
        let unset = LogRecord {
            start: UNIX_EPOCH,
            ..rec()
        };
        check("G%D %b %B", &unset, "0 0 0");
        // same millisecond: delay 0 avoids dividing by zero.
        let same = LogRecord {
            start: r.now,
            ..rec()
        };
        check("G%D %b %B", &same, "0 0 0");
        let sub_ms = LogRecord {
            start: at(1_699_999_999_000),
            now: at(1_700_000_000_999),
            bytes_out: 1,
            bytes_in: u64::MAX,
            ..rec()
        };
        check("G%D %b %B", &sub_ms, "1999 0 4294967295");
        // a start after now wraps like 3proxy's unsigned arithmetic.
        let future = LogRecord {
            start: at(1_700_000_001_042),
            ..rec()
        };
        check("G%D", &future, "4294966296");
    }

    #[test]
    fn session_escapes() {
        let r = rec();
        check("G%U", &r, "alice");
        check("G%N", &r, "PROXY");
        check("G%p", &r, "3128");
        check("G%E", &r, "00000");
        check("G%C", &r, "192.168.1.10");
        check("G%c", &r, "51234");
        check("G%R", &r, "93.184.216.34");
        check("G%r", &r, "80");
        check("G%i", &r, "192.168.1.1");
        check("G%e", &r, "10.0.0.2");
        check("G%Q", &r, "93.184.216.34");
        check("G%q", &r, "8080");
        check("G%n", &r, "example.com");
        check("G%I", &r, "12345");
        check("G%O", &r, "678");
        check("G%h", &r, "1");
        check("G%T", &r, "GET http://example.com/ HTTP/1.1");
        check("G%L", &r, "0");
        check("G%%", &r, "%");
        check("G100%%", &r, "100%");
    }

    #[test]
    fn result_code_width() {
        let with = |res| LogRecord { res, ..rec() };
        check("G%E", &with(0), "00000");
        check("G%E", &with(7), "00007");
        check("G%E", &with(508), "00508");
        check("G%E", &with(99999), "99999");
        check("G%E", &with(123_456), "12345");
        check("G%E.", &with(123_456), "12345.");
        check("G%E", &with(u32::MAX), "-0000"); // C int -1 as "%.05d", 5 bytes
    }

    #[test]
    fn service_name() {
        let with = |service| LogRecord { service, ..rec() };
        check("G%N", &with("SOCK5"), "SOCK5");
        check("G%N", &with(""), "-");
        check(
            "G%N",
            &with("ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
            "ABCDEFGHIJKLMNOPQRST",
        );
        // not filtered
        check("- +_G%N", &with("A B"), "A B");
    }

    #[test]
    fn unset_values() {
        let e = empty();
        check("G%U", &e, "-");
        check(
            "G%U",
            &LogRecord {
                user: Some(""),
                ..rec()
            },
            "-",
        );
        check("G%N", &e, "-");
        check(
            "G%C:%c %R:%r %i %e %Q:%q",
            &e,
            "0.0.0.0:0 0.0.0.0:0 0.0.0.0 0.0.0.0 0.0.0.0:0",
        );
        check("G%n", &e, "[0.0.0.0]");
        check("G[%T]", &e, "[]");
        check("G[%1-3T]", &e, "[]");
        check("G%I %O %h %L", &e, "0 0 0 0");
    }

    #[test]
    fn requested_host() {
        let with = |req_host, req| LogRecord {
            req,
            req_host,
            ..rec()
        };
        check("G%n", &with(Some("example.com"), None), "example.com");
        check("G%n", &with(None, sa("1.2.3.4:80")), "[1.2.3.4]");
        check("G%n", &with(Some(""), sa("1.2.3.4:80")), "[1.2.3.4]");
        check("G%n", &with(Some("::1"), sa("[::1]:80")), "[::1]");
        check("G%n", &with(Some("host:80"), sa("1.2.3.4:80")), "[1.2.3.4]");
        check("G%n", &with(None, sa("[2001:db8::1]:443")), "[2001:db8::1]");
        check("G%n", &with(None, None), "[0.0.0.0]");
        check(
            "G%Q:%q",
            &with(Some("example.com"), sa("0.0.0.0:443")),
            "0.0.0.0:443",
        );
    }

    #[test]
    fn ipv6_like_glibc() {
        let ip = |s: &str| {
            let a: Ipv6Addr = s.parse().unwrap();
            let mut out = Vec::new();
            push_ip(&mut out, Some(SocketAddr::new(a.into(), 0)));
            String::from_utf8(out).unwrap()
        };
        for (a, want) in [
            ("::", "::"),
            ("::1", "::1"),
            ("1::", "1::"),
            ("2001:db8::1", "2001:db8::1"),
            (
                "2001:0db8:0000:0000:0000:ff00:0042:8329",
                "2001:db8::ff00:42:8329",
            ),
            ("2001:db8:0:1:0:0:0:1", "2001:db8:0:1::1"),
            ("1:0:0:2:0:0:3:4", "1::2:0:0:3:4"), // tie: first run
            ("1:0:2:3:4:5:6:7", "1:0:2:3:4:5:6:7"), // single zero stays
            ("1:2:3:4:5:6:7:0", "1:2:3:4:5:6:7:0"),
            ("fe80::abcd:ef01", "fe80::abcd:ef01"),
            ("FFFF:ABCD::", "ffff:abcd::"),
            ("::ffff:1.2.3.4", "::ffff:1.2.3.4"),
            ("::ffff:0.0.0.0", "::ffff:0.0.0.0"),
            ("::1.2.3.4", "::1.2.3.4"), // IPv4-compatible: dotted in glibc
            ("::0.0.1.2", "::102"),     // run of 7: hex
            ("::1:0:0", "::1:0:0"),
            ("::ffff:0:1.2.3.4", "::ffff:0:102:304"),
            ("64:ff9b::1.2.3.4", "64:ff9b::102:304"),
        ] {
            assert_eq!(ip(a), want, "{a}");
        }
        let scoped = LogRecord {
            client: sa("[fe80::1%2]:5000"),
            ..rec()
        };
        check("G%C %c", &scoped, "fe80::1 5000");
        check(
            "G%C:%c",
            &LogRecord {
                client: sa("[::1]:1080"),
                ..rec()
            },
            "::1:1080",
        );
    }

    #[test]
    fn clock_char_is_consumed() {
        let r = rec();
        check("", &r, "");
        check("G", &r, "");
        check("L", &r, "");
        check("Lx", &r, "x");
        check("Xhello %U", &r, "hello alice");
        check("%U", &r, "U"); // '%' is the clock char, then a plain "U"
        check("%%U", &r, "alice");
        check("g%Y", &r, "2023");
    }

    #[test]
    fn unknown_and_trailing_escapes() {
        let r = rec();
        check("G%X", &r, "X");
        check("G%a%Z%0%-", &r, "aZ0-");
        check("G%", &r, "%");
        check("Gab%", &r, "ab%");
        check("G% ", &r, " ");
    }

    #[test]
    fn filter_prefix() {
        let user = |u| LogRecord {
            user: Some(u),
            ..rec()
        };
        // the prefix comes first, then the clock char
        check("- +_L%U", &user("a b\x01c"), "a_b_c");
        check("- +_G%Y", &rec(), "2023");
        // no prefix: nothing is replaced
        check("L%U", &user("a b\x01c"), "a b\x01c");
        // empty set still replaces control characters
        check("-+_L%U", &user("a b\tc"), "a b_c");
        // DEL and non-ASCII are not control characters for 3proxy
        check("-+_L%U", &user("a\x7fé"), "a\x7fé");
        // the 3proxy.cfg(5) example: comma and percent become spaces
        check(
            "-,%+ L%U,%T",
            &LogRecord {
                text: "a,b%c",
                ..user("x,y")
            },
            "x y,a b c",
        );
        // %n (names only) and %T are filtered; literals and addresses not
        let r = LogRecord {
            req_host: Some("ex ample"),
            text: "CONNECT a b\r\n",
            ..rec()
        };
        check("- +_L%n|%T| %C", &r, "ex_ample|CONNECT_a_b__| 192.168.1.10");
        check("- +_L%2-3T", &r, "a_b");
        // the set ends at the first '+'
        check("-++_L%U", &user("a+b"), "La+b"); // set "", R '+', clock '_'

        check("-a+b+L%U", &user("a+b"), "Lb+b"); // clock '+'

        // not a prefix: no '+', or nothing after it; '-' is then the clock char
        check("-ab", &rec(), "ab");
        check("-ab+", &rec(), "ab+");
        check("-ab+_", &rec(), "");
        // several characters and a multi-byte set
        check("-ab+.L%U", &user("abc"), "..c");
    }

    #[test]
    fn common_format_from_the_docs() {
        let r = LogRecord {
            user: Some("John Smith\x07"),
            service: "SOCK5",
            res: 508,
            text: "CONNECT example.com:443",
            ..rec()
        };
        check(
            "- +_L%t.%. %N.%p %E %U %C:%c %R:%r %O %I %h %T",
            &r,
            "1700000000.042 SOCK5.3128 00508 John_Smith_ 192.168.1.10:51234 \
             93.184.216.34:80 678 12345 1 CONNECT_example.com:443",
        );
    }

    #[test]
    fn field_selector() {
        let text = |text| LogRecord { text, ..rec() };
        let r = rec(); // "GET http://example.com/ HTTP/1.1"
        check("G%1-1T", &r, "GET");
        check("G%2-2T", &r, "http://example.com/");
        check("G%3-3T", &r, "HTTP/1.1");
        check("G%1-2T", &r, "GET http://example.com/");
        check("G%2-3T", &r, "http://example.com/ HTTP/1.1");
        check("G%1-9T", &r, "GET http://example.com/ HTTP/1.1");
        check("G%3-99T", &r, "HTTP/1.1");
        check("G%4-9T", &r, "");
        check("G%2-1T", &r, "");
        check("G%1-0T", &r, "");
        check("G%01-1T", &r, "01-1T"); // '0' does not start a selector
        check("G[%2-2T]", &r, "[http://example.com/]");
        check("G%10-12T", &text("a b c d e f g h i j k l m"), "j k l");
        // runs of whitespace: one separator, the run's last byte is printed
        check("G%1-3T", &text("a  \tb \n c"), "a\tb c");
        check("G%2-3T", &text("a  \tb \n c"), "b c");
        // a leading space opens an empty first field
        check("G%1-1T", &text(" a b"), "");
        check("G%2-2T", &text(" a b"), "a");
        check("G%1-2T", &text(" a b"), " a");
        // trailing whitespace belongs to the range
        check("G%1-5T|", &text("a b "), "a b |");
        check("G%2-2T|", &text("a b "), "b|");
        // bare `%N`: field 1, then the rest of the digits and the T as text
        check("G%5T", &r, "GETT");
        check("G%12T", &r, "GET2T");
        check("G%5", &r, "");
        check("G%5X", &r, "X");
        check("G%12X", &r, "2X");
        // full `N1-N2` without T: consumed, prints nothing
        check("G%1-2X.", &r, ".");
        check("G%1-2", &r, "");
        check("G%1-xT", &r, "-xT");
        check("G%1-T", &r, "-T");
        check("G%99999999999999-1T", &r, "");
        check(
            "G%1-99999999999999T",
            &r,
            "GET http://example.com/ HTTP/1.1",
        );
    }

    #[test]
    fn nul_ends_strings() {
        let r = LogRecord {
            user: Some("ab\0cd"),
            text: "x\0y",
            req_host: Some("\0host"),
            req: sa("1.2.3.4:1"),
            ..rec()
        };
        check("G%U|%T|%n|%1-2T", &r, "ab|x|[1.2.3.4]|x");
        check("G%U\0%T", &r, "ab");
    }

    #[test]
    fn cap() {
        let long = "u".repeat(5000);
        let r = LogRecord {
            user: Some(&long),
            text: &long,
            req_host: Some(&long),
            ..rec()
        };
        let u4000 = "u".repeat(TEXT_CAP);
        check("G%U", &r, &u4000);
        check("G%T", &r, &u4000);
        check("G%n", &r, &u4000);
        check("G%1-1T", &r, &u4000);
        check("G%U%U%T%n%1-1T", &r, &u4000);
        check("Gab%U", &r, &format!("ab{}", &u4000[2..]));
        // non-text escapes still print, then literals fill up to LOOP_CAP
        check("G%U %C", &r, &format!("{u4000} 192.168.1.10"));
        check("G%U%E%E", &r, &format!("{u4000}0000000000"));
        let tail = "x".repeat(100);
        check(
            &format!("G%U{tail}"),
            &r,
            &format!("{u4000}{}", &tail[..40]),
        );
        check(
            &format!("G%U{tail}%C"),
            &r,
            &format!("{u4000}{}", &tail[..40]),
        );
        // at the cap %U prints nothing at all, not even '-'
        let nohost = LogRecord {
            req_host: None,
            ..r.clone()
        };
        check("G%U%n", &nohost, &format!("{u4000}[93.184.216.34]"));
        check("G%U%U%n", &nohost, &format!("{u4000}[93.184.216.34]"));
        let anon = LogRecord {
            user: None,
            ..r.clone()
        };
        check("G%T%U", &anon, &format!("{u4000}-"));
        // long literal formats stop at LOOP_CAP
        let lit = "y".repeat(5000);
        check(&format!("G{lit}"), &r, &lit[..LOOP_CAP]);
        check(&format!("G{lit}%C"), &r, &lit[..LOOP_CAP]);
        // the cap counts this record only, not what `out` already held
        let mut out = b"prefix".to_vec();
        LogFormat::parse("G%U").render(&r, &mut out);
        assert_eq!(out.len(), 6 + TEXT_CAP);
    }

    #[test]
    fn template_has_no_clock_char() {
        let r = rec();
        let mut out = Vec::new();
        LogFormat::template("%t.log").render(&r, &mut out);
        assert_eq!(out, b"1700000000.log");
        out.clear();
        LogFormat::template("-a+bc%t").render(&r, &mut out);
        assert_eq!(out, b"-a+bc1700000000");
    }

    #[test]
    fn render_appends_and_reuses() {
        let f = LogFormat::parse(LogFormat::DEFAULT);
        let mut out = Vec::new();
        f.render(&rec(), &mut out);
        let first = out.clone();
        out.push(b'\n');
        f.render(&rec(), &mut out);
        assert_eq!(out.len(), first.len() * 2 + 1);
        assert_eq!(&out[first.len() + 1..], &first[..]);
    }

    #[test]
    fn push_fixed_is_c_precision_then_truncate() {
        let f = |v, w| {
            let mut o = Vec::new();
            push_fixed(&mut o, v, w);
            String::from_utf8(o).unwrap()
        };
        assert_eq!(f(5, 2), "05");
        assert_eq!(f(0, 3), "000");
        assert_eq!(f(123, 2), "12");
        assert_eq!(f(-5, 2), "-0");
        assert_eq!(f(-50, 2), "-5");
        assert_eq!(f(2023, 4), "2023");
        assert_eq!(f(12345, 4), "1234");
    }

    fn sql(fmt: &str, r: &LogRecord<'_>) -> (String, Vec<String>) {
        let out = LogFormat::parse(fmt).render_sql(r);
        (
            String::from_utf8(out.statement).unwrap(),
            out.params
                .into_iter()
                .map(|p| String::from_utf8(p).unwrap())
                .collect(),
        )
    }

    #[test]
    fn sql_statement_takes_client_text_as_parameters() {
        // 3proxy's cfg/sql sample, without its filter prefix.
        let fmt = "Ginsert into log (time, bytesin, username, url, host, port, service) \
                   values ('%Y-%m-%d %H:%M:%S', %I, '%U', '%T', '%n', %r, '%N');";
        let (st, params) = sql(fmt, &rec());
        assert_eq!(
            st,
            "insert into log (time, bytesin, username, url, host, port, service) \
             values (?, 12345, ?, ?, ?, 80, ?);"
        );
        assert_eq!(
            params,
            [
                "2023-11-14 22:13:20",
                "alice",
                "GET http://example.com/ HTTP/1.1",
                "example.com",
                "PROXY"
            ]
        );
        // A quote from a client is a value, never statement text.
        let mut r = rec();
        r.user = Some("o'brien'); drop table log; --");
        r.text = "GET http://x/'q HTTP/1.1";
        let (st, params) = sql("Linsert into t values ('%U', %T, %U)", &r);
        assert_eq!(st, "insert into t values (?, ?, ?)");
        assert_eq!(
            params,
            [
                "o'brien'); drop table log; --",
                "GET http://x/'q HTTP/1.1",
                "o'brien'); drop table log; --"
            ]
        );
        // The sample's prefix filters the quote out of the values.
        let (_, params) = sql("-'+_Linsert into t values ('%U')", &r);
        assert_eq!(params, ["o_brien_); drop table log; --"]);
    }

    #[test]
    fn sql_literals_without_escapes_and_doubled_quotes() {
        let r = rec();
        let (st, params) = sql("Linsert into t values ('it''s', 'a''%U''b', %E, '%C')", &r);
        assert_eq!(st, "insert into t values ('it''s', ?, 00000, ?)");
        assert_eq!(params, ["a'alice'b", "192.168.1.10"]);
        // A literal at the very end, and one never closed.
        let (st, params) = sql("Lselect '%U'", &r);
        assert_eq!((st.as_str(), params.len()), ("select ?", 1));
        let mut q = rec();
        q.user = Some("a'b");
        let (st, params) = sql("Lselect 'x%U", &q);
        assert_eq!((st.as_str(), params.len()), ("select 'xa''b", 0));
        // No quotes at all: numbers inline, client text bound.
        let (st, params) = sql("Lvalues (%O, %n, %p)", &r);
        assert_eq!(st, "values (678, ?, 3128)");
        assert_eq!(params, ["example.com"]);
    }
}
