//! TrafficPlugin (3proxy's src/plugins/TrafficPlugin): the `trafcorrect`
//! rules, which turn a record's byte counts (the application data a
//! session carried) into an estimate of what the network carried, for
//! billing. 3proxy's plugin wraps the log function, so the corrected
//! figures are what the record says (%I, %O) and what its log function
//! does next sees: the traffic counters (`countin`, `countout`,
//! `countall`) and `log radius`'s accounting. The records' writers
//! (`client`, udppm's and dnspr's own records) ask [`Rules::apply`] and
//! hand the figures on.
//!
//! A rule is `m` (both counts times a coefficient) or `p` (a packet
//! header estimate added per read and write of the server, see
//! [`Form::Packets`]); the first rule that matches a record applies, the
//! others are not looked at. Matching is what 3proxy's documentation
//! says, not what its code does: 3proxy.cfg(5), PLUGINS, lists each
//! difference.
//!
//! Pure but for the `debug` lines, which go to stdout as 3proxy's do.

use std::io::Write;

/// What a record's session did on the server's side, for the `p` form:
/// reads that took bytes from the server, writes that put bytes to it
/// (one datagram each way for UDP), and connections made to it (to the
/// first parent when there is one). Counted per record, as 3proxy's
/// `nreads`, `nwrites` and `nconnects` (cleared with the byte counts
/// after each record).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Ops {
    pub reads: u64,
    pub writes: u64,
    pub connects: u64,
}

impl Ops {
    pub fn add(&mut self, o: Ops) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.connects += o.connects;
    }
}

/// How a rule corrects the counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Form {
    /// `m`: both counts times the coefficient (0 < c <= 100), rounded
    /// down.
    Scale(f64),
    /// `p`: `size` bytes of headers per packet. TCP: %I gains
    /// (reads + 3 * connects) * size, %O (writes + 3 * connects) * size
    /// (a connection's handshake taken as 3 packets each way). UDP: %I
    /// gains reads * size, %O writes * size.
    Packets { udp: bool, size: u64 },
}

/// Default header sizes of the `p` form, as 3proxy's plugin has them.
pub const TCP_PACKET: u64 = 52;
pub const UDP_PACKET: u64 = 48;

/// One `trafcorrect` line.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// The service as `%N` prints it; None: any service.
    pub service: Option<&'static str>,
    /// The port of the server the session connected to (`%r`'s); 0: any.
    pub port: u16,
    pub form: Form,
}

/// The service names a rule may give, 3proxy's, and the `%N` of the
/// records they match (a SOCKS record by the protocol the client spoke:
/// `socks45` is SOCKS4a).
const NAMES: &[(&str, &str)] = &[
    ("proxy", "PROXY"),
    ("socks4", "SOCK4"),
    ("socks45", "SOC45"),
    ("socks5", "SOCK5"),
    ("tcppm", "TCPPM"),
    ("udppm", "UDPPM"),
    ("admin", "ADMIN"),
    ("pop3p", "POP3P"),
];

/// The `%N` a rule's service name stands for; None for `*` and for a
/// name 3proxy's plugin does not know (both mean any service).
pub fn service(name: &str) -> Option<&'static str> {
    NAMES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// The names [`service`] knows, for messages.
pub fn service_names() -> impl Iterator<Item = &'static str> {
    NAMES.iter().map(|(n, _)| *n)
}

/// Services whose `p` rules are TCP even when they say `udp` (3proxy's
/// plugin keeps them so since its 0.1.1).
pub fn tcp_only(service: &str) -> bool {
    matches!(service, "PROXY" | "TCPPM" | "POP3P")
}

/// What a record is, for matching.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// `%N`.
    pub service: &'a str,
    /// The port of the server the session is connected to (`%r`'s).
    pub port: Option<u16>,
    /// A datagram record: udppm, a SOCKS UDP association, dnspr.
    pub datagram: bool,
    pub ops: Ops,
}

impl Rule {
    fn matches(&self, s: &Seen<'_>) -> bool {
        self.service.is_none_or(|n| n == s.service)
            && (self.port == 0 || s.port == Some(self.port))
            && match self.form {
                Form::Scale(_) => true,
                Form::Packets { udp, .. } => udp == s.datagram,
            }
    }

    /// The counts (out, in) after this rule.
    fn correct(&self, ops: Ops, out: u64, inb: u64) -> (u64, u64) {
        match self.form {
            Form::Scale(k) => {
                // `as` rounds toward zero and saturates.
                let scale = |n: u64| (n as f64 * k) as u64;
                (scale(out), scale(inb))
            }
            Form::Packets { udp, size } => {
                let hs = if udp {
                    0
                } else {
                    ops.connects.saturating_mul(3)
                };
                let add = |n: u64| n.saturating_add(hs).saturating_mul(size);
                (
                    out.saturating_add(add(ops.writes)),
                    inb.saturating_add(add(ops.reads)),
                )
            }
        }
    }
}

/// The rules of a cfg, in their order, and whether the plugin was loaded
/// with `debug`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rules {
    pub rules: Vec<Rule>,
    pub debug: bool,
}

/// What [`Rules::correct`] made of a record's counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrected {
    pub out: u64,
    pub inb: u64,
    /// The rule that applied, from 1; None: none matched.
    pub rule: Option<usize>,
}

impl Rules {
    /// The counts a record says: as the first matching rule corrects
    /// them, or as they are.
    pub fn correct(&self, s: &Seen<'_>, out: u64, inb: u64) -> Corrected {
        match self.rules.iter().position(|r| r.matches(s)) {
            Some(i) => {
                let (out, inb) = self.rules[i].correct(s.ops, out, inb);
                Corrected {
                    out,
                    inb,
                    rule: Some(i + 1),
                }
            }
            None => Corrected {
                out,
                inb,
                rule: None,
            },
        }
    }

    /// [`Rules::correct`], printing a line to stdout under `debug` (as
    /// 3proxy's plugin prints its own). Returns (out, in).
    pub fn apply(&self, s: &Seen<'_>, out: u64, inb: u64) -> (u64, u64) {
        let c = self.correct(s, out, inb);
        if self.debug {
            let line = debug_line(s, (out, inb), &c);
            let _ = writeln!(std::io::stdout().lock(), "{line}");
        }
        (c.out, c.inb)
    }
}

/// The `debug` line of one record.
fn debug_line(s: &Seen<'_>, before: (u64, u64), c: &Corrected) -> String {
    let port = s.port.unwrap_or(0);
    match c.rule {
        Some(rule) => format!(
            "trafcorrect: rule {rule}: service {} port {port}: in {} out {} -> in {} out {} \
             (reads {} writes {} connects {})",
            s.service, before.1, before.0, c.inb, c.out, s.ops.reads, s.ops.writes, s.ops.connects
        ),
        None => format!(
            "trafcorrect: no rule for service {} port {port}{}",
            s.service,
            if s.datagram { " (udp)" } else { "" }
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(service: &'static str, port: u16, datagram: bool, ops: Ops) -> Seen<'static> {
        Seen {
            service,
            port: Some(port),
            datagram,
            ops,
        }
    }

    const OPS: Ops = Ops {
        reads: 3,
        writes: 2,
        connects: 1,
    };

    fn rule(service: Option<&'static str>, port: u16, form: Form) -> Rule {
        Rule {
            service,
            port,
            form,
        }
    }

    #[test]
    fn scale_multiplies_both_and_rounds_down() {
        let r = Rules {
            rules: vec![rule(Some("TCPPM"), 0, Form::Scale(1.5))],
            debug: false,
        };
        let c = r.correct(&seen("TCPPM", 80, false, OPS), 101, 7);
        assert_eq!((c.out, c.inb, c.rule), (151, 10, Some(1)));
        let r = Rules {
            rules: vec![rule(None, 0, Form::Scale(100.0))],
            debug: false,
        };
        // No wrap at 32 bits (3proxy's plugin truncates to unsigned).
        let c = r.correct(&seen("PROXY", 1, false, OPS), 1 << 40, u64::MAX);
        assert_eq!((c.out, c.inb), (100 << 40, u64::MAX));
    }

    #[test]
    fn packets_add_headers_per_read_write_and_connect() {
        let tcp = rule(
            None,
            0,
            Form::Packets {
                udp: false,
                size: TCP_PACKET,
            },
        );
        let udp = rule(
            None,
            0,
            Form::Packets {
                udp: true,
                size: UDP_PACKET,
            },
        );
        let r = Rules {
            rules: vec![tcp, udp],
            debug: false,
        };
        let c = r.correct(&seen("TCPPM", 80, false, OPS), 1000, 2000);
        // out: (2 + 3) * 52, in: (3 + 3) * 52.
        assert_eq!(
            (c.out, c.inb, c.rule),
            (1000 + 5 * 52, 2000 + 6 * 52, Some(1))
        );
        let c = r.correct(&seen("UDPPM", 53, true, OPS), 10, 20);
        // No handshake for UDP.
        assert_eq!((c.out, c.inb, c.rule), (10 + 2 * 48, 20 + 3 * 48, Some(2)));
    }

    #[test]
    fn the_first_matching_rule_applies() {
        let r = Rules {
            rules: vec![
                rule(Some("SOCK5"), 6112, Form::Scale(4.5)),
                rule(Some("SOCK5"), 0, Form::Scale(1.1)),
                rule(Some("SOCK5"), 6112, Form::Scale(2.0)),
            ],
            debug: false,
        };
        let at = |port| r.correct(&seen("SOCK5", port, false, OPS), 100, 100);
        assert_eq!((at(6112).out, at(6112).rule), (450, Some(1)));
        assert_eq!((at(80).out, at(80).rule), (110, Some(2)));
        // Another service, no rule: unchanged.
        let c = r.correct(&seen("SOCK4", 6112, false, OPS), 100, 100);
        assert_eq!((c.out, c.inb, c.rule), (100, 100, None));
    }

    #[test]
    fn port_service_and_transport_must_all_match() {
        let p = |udp| Form::Packets { udp, size: 10 };
        let r = Rules {
            rules: vec![rule(Some("PROXY"), 80, p(false))],
            debug: false,
        };
        assert_eq!(
            r.correct(&seen("PROXY", 80, false, OPS), 0, 0).rule,
            Some(1)
        );
        assert_eq!(r.correct(&seen("PROXY", 81, false, OPS), 0, 0).rule, None);
        assert_eq!(r.correct(&seen("TCPPM", 80, false, OPS), 0, 0).rule, None);
        assert_eq!(r.correct(&seen("PROXY", 80, true, OPS), 0, 0).rule, None);
        // No server: only an any-port rule matches.
        let none = Seen {
            port: None,
            ..seen("PROXY", 0, false, OPS)
        };
        assert_eq!(r.correct(&none, 0, 0).rule, None);
        let any = Rules {
            rules: vec![rule(None, 0, p(true))],
            debug: false,
        };
        assert_eq!(any.correct(&none, 0, 0).rule, None);
        assert_eq!(
            any.correct(
                &Seen {
                    datagram: true,
                    ..none
                },
                0,
                0
            )
            .rule,
            Some(1)
        );
    }

    #[test]
    fn names_are_3proxys() {
        assert_eq!(service("socks45"), Some("SOC45"));
        assert_eq!(service("proxy"), Some("PROXY"));
        assert_eq!(service("*"), None);
        assert_eq!(service("socks"), None);
        assert!(tcp_only("POP3P") && !tcp_only("UDPPM"));
        assert_eq!(service_names().count(), 8);
    }

    #[test]
    fn debug_lines_say_the_rule_and_the_figures() {
        let s = seen("TCPPM", 80, false, OPS);
        let c = Corrected {
            out: 5,
            inb: 6,
            rule: Some(2),
        };
        let l = debug_line(&s, (1, 2), &c);
        assert!(
            l.contains("rule 2") && l.contains("in 2 out 1 -> in 6 out 5"),
            "{l}"
        );
        assert!(l.contains("reads 3 writes 2 connects 1"), "{l}");
        let l = debug_line(&s, (1, 2), &Corrected { rule: None, ..c });
        assert!(l.contains("no rule"), "{l}");
    }
}
