//! `plugin FILE NAME [ARGS]` and the commands the plugins add (3proxy's
//! conf.c `h_plugin`, src/plugins/). 3proxy loads FILE and calls its
//! export NAME; this build has the plugins 3proxy ships built in (those a
//! real cfg relies on) and never loads code: the line picks the built-in
//! one by NAME, or by FILE when several plugins export the same NAME
//! (`start`). FILE need not exist, as for 3proxy's own built-in
//! `ssl_plugin` and `pcre_plugin`. A plugin that is not built is refused
//! with its name, never skipped.

use std::sync::Arc;

use super::state::{State, TrafficPlugin};
use super::token::quote;
use crate::limit::Period;
use crate::traffic::{Form, Rule};

/// What a `plugin` line asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plugin {
    Transparent,
    PamAuth,
    /// LdapPlugin: its `ldap*` commands and its auth type.
    Ldap,
    /// TrafficPlugin: its `trafcorrect` rules.
    Traffic,
    /// utf8tocp1251: its auth type, and Windows-1251 cfg lines.
    Utf8ToCp1251,
    /// FilePlugin: a service for other plugins (which we never load);
    /// alone it stores nothing. Its two commands are checked.
    File,
    /// StringsPlugin: its file's texts replace the built-in ones.
    Strings,
    /// Known, not built; the text says why.
    NotBuilt(&'static str, &'static str),
    /// PCREPlugin: its commands (`pcre`, `pcre_rewrite`, ...) are built
    /// in and always there; loading it changes nothing.
    Pcre,
    /// SSLPlugin: TLS (`ssl_*`) is built in; loading it changes nothing
    /// (3proxy 1.0 returns before it looks at FILE).
    Ssl,
}

/// The plugins 3proxy ships, by export name. `start` is shared by
/// several: [`by_file`] tells them apart.
const BY_EXPORT: &[(&str, Plugin)] = &[
    ("transparent_plugin", Plugin::Transparent),
    ("ssl_plugin", Plugin::Ssl),
    ("pcre_plugin", Plugin::Pcre),
    ("file_plugin", Plugin::File),
    ("utf8tocp1251", Plugin::Utf8ToCp1251),
    (
        "WindowsAuthentication",
        Plugin::NotBuilt("WindowsAuthentication", "it exists only on Windows"),
    ),
];

/// The plugins whose export is `start`, by the name of their file.
fn by_file(file: &str) -> Option<Plugin> {
    let base = file.rsplit(['/', '\\']).next().unwrap_or(file);
    let stem = base.split('.').next().unwrap_or(base).to_ascii_lowercase();
    Some(match stem.as_str() {
        "pamauth" | "pamplugin" => Plugin::PamAuth,
        "trafficplugin" => Plugin::Traffic,
        // Its ReadMe's example loads it as "string.dll".
        "stringsplugin" | "string" => Plugin::Strings,
        "ldapauth" | "ldapplugin" => Plugin::Ldap,
        _ => return None,
    })
}

fn identify(file: &str, name: &str) -> Option<Plugin> {
    if name == "start" {
        return by_file(file);
    }
    BY_EXPORT.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
}

/// `plugin FILE NAME [ARGS]`.
pub fn h_plugin(state: &mut State, args: &[String]) -> Result<(), String> {
    let (file, name) = (args[1].as_str(), args[2].as_str());
    let Some(plugin) = identify(file, name) else {
        return Err(format!(
            "plugin '{}' from '{}' is not built: this 3proxy loads no plugin \
             files, it has the plugins 3proxy ships built in (see PLUGINS in \
             3proxy.cfg(5))",
            quote(name),
            quote(file)
        ));
    };
    match plugin {
        Plugin::Transparent => {
            // Loading it turns transparency on for the services that
            // follow; loading it again changes nothing, as in 3proxy.
            if state.transparent.is_none() {
                state.transparent = Some(true);
            }
            Ok(())
        }
        Plugin::PamAuth => {
            let Some(service) = args.get(3) else {
                return Err("PamAuth needs the PAM service name: plugin FILE start SERVICE".into());
            };
            crate::sys::pam::available().map_err(|e| format!("PamAuth: {e}"))?;
            state.access.pam_service = Some(Arc::from(service.as_str()));
            Ok(())
        }
        Plugin::Ldap => {
            crate::sys::ldap::available().map_err(|e| format!("LdapPlugin: {e}"))?;
            // Loading it again keeps what its commands set, as 3proxy's
            // plugin keeps its settings.
            state.ldap.get_or_insert_with(Default::default);
            Ok(())
        }
        Plugin::Traffic => {
            traffic_plugin(state, &args[3..]);
            Ok(())
        }
        Plugin::Utf8ToCp1251 => {
            state.utf8tocp1251 = true;
            state.cp1251_text = true;
            Ok(())
        }
        Plugin::File => {
            state.file_plugin = true;
            Ok(())
        }
        Plugin::Strings => {
            let Some(path) = args.get(3) else {
                return Err(
                    "StringsPlugin needs its strings file: plugin FILE start STRINGSFILE".into(),
                );
            };
            load_strings(state, path)
        }
        Plugin::NotBuilt(p, why) => Err(format!(
            "plugin {p} ('{}' from '{}') is not built: {why}",
            quote(name),
            quote(file)
        )),
        Plugin::Pcre | Plugin::Ssl => Ok(()),
    }
}

/// LdapPlugin's settings, or the error of a command used before the
/// plugin's line (3proxy knows the commands only once it has loaded).
fn ldap<'a>(state: &'a mut State, command: &str) -> Result<&'a mut super::state::LdapCmds, String> {
    state.ldap.as_mut().ok_or_else(|| {
        format!("{command} comes with the LdapPlugin plugin: load it first (plugin LdapPlugin.ld.so start)")
    })
}

/// `ldapconnect SERVERS BINDDN [PASSWORD]`: the servers (host[:port],
/// space-separated, as libldap's `ldap_init` takes them), and the DN the
/// search binds as.
pub fn h_ldapconnect(state: &mut State, args: &[String]) -> Result<(), String> {
    ldap(state, "ldapconnect")?;
    let uris = crate::sys::ldap::server_uris(&args[1])?;
    ldap(state, "ldapconnect")?.connect = Some((uris, args[2].clone(), args.get(3).cloned()));
    Ok(())
}

/// `ldapattr USERATTR GROUPATTR [LOWERCASE]`: LOWERCASE is read as C's
/// atoi reads it; above 0, user names are lowercased.
pub fn h_ldapattr(state: &mut State, args: &[String]) -> Result<(), String> {
    ldap(state, "ldapattr")?;
    let lowercase = match args.get(3) {
        None => false,
        Some(v) => atoi_warn(state, v) > 0,
    };
    ldap(state, "ldapattr")?.attr = Some((args[1].clone(), args[2].clone(), lowercase));
    Ok(())
}

/// C's atoi: leading blanks, a sign, digits; and whether that was all.
fn atoi(s: &str) -> (i64, bool) {
    let t = s.trim_start();
    let (neg, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let end = digits.bytes().take_while(u8::is_ascii_digit).count();
    let n = digits[..end].bytes().fold(0i64, |n, d| {
        n.saturating_mul(10).saturating_add(i64::from(d - b'0'))
    });
    (if neg { -n } else { n }, end > 0 && end == digits.len())
}

/// `ldapaccess VALUE`, `ldapsbase DN`, `ldapuserenv DN`, `ldapdircount DIR`.
pub fn h_ldap_value(state: &mut State, args: &[String]) -> Result<(), String> {
    let l = ldap(state, &args[0])?;
    let v = Some(args[1].clone());
    match args[0].as_str() {
        "ldapaccess" => l.access = v,
        "ldapsbase" => l.sbase = v,
        "ldapuserenv" => l.userenv = v,
        _ => l.dircount = v,
    }
    Ok(())
}

/// `ldaptrafgroup GROUP TYPE LIMIT RATE`: now, as the plugin does while
/// the cfg loads, bind with `ldapconnect`'s DN, search `ldapsbase`'s
/// subtree for `(GROUPATTR=GROUP)` (GROUP as written: the plugin does not
/// escape it), and give each entry's first USERATTR value (lowercased
/// when `ldapattr` asks it) a `bandlimin RATE` and a `countin` of LIMIT
/// *bytes* per TYPE (`MONTHLY`, `WEEKLY` or `DAILY`, in capitals or small
/// letters), before every limit rule so far; its counter is kept in
/// `ldapdircount`'s DIR + name + `.lc`. A name that could leave DIR
/// (`/`, `\`, `..`) or is empty is passed over, as by the plugin.
pub fn h_ldaptrafgroup(state: &mut State, args: &[String]) -> Result<(), String> {
    let l = ldap(state, "ldaptrafgroup")?.clone();
    let need =
        |what: &str| format!("ldaptrafgroup needs {what} before it (the plugin uses it here)");
    let (uris, bind_dn, bind_pw) = l.connect.ok_or_else(|| need("ldapconnect"))?;
    let (user_attr, group_attr, lowercase) = l.attr.ok_or_else(|| need("ldapattr"))?;
    let base = l.sbase.ok_or_else(|| need("ldapsbase"))?;
    let dir = l.dircount.ok_or_else(|| need("ldapdircount"))?;
    let period = match args[2].as_str() {
        "MONTHLY" | "monthly" => Period::Monthly,
        "WEEKLY" | "weekly" => Period::Weekly,
        "DAILY" | "daily" => Period::Daily,
        t => {
            return Err(format!(
                "'{}' is not a counter period: MONTHLY, WEEKLY or DAILY (3proxy's plugin \
                 leaves the period undefined for anything else)",
                quote(t)
            ))
        }
    };
    // C's unsigned long: a negative LIMIT wraps to a huge one, as there.
    let limit = atoi_warn(state, &args[3]) as u64;
    let rate = atoi_warn(state, &args[4]);
    if rate <= 0 || rate > i64::from(i32::MAX) {
        return Err(format!(
            "'{}' is not a rate in bits per second (1 or more; 3proxy divides by it)",
            quote(&args[4])
        ));
    }
    let q = crate::sys::ldap::GroupSearch {
        uris,
        bind_dn,
        bind_pw,
        base,
        filter: format!("({group_attr}={})", args[1]),
        attr: user_attr,
        timeout: state.timeouts.get(crate::timeouts::Timeouts::BYTE_LONG),
    };
    let members = crate::sys::ldap::group_members(&q).map_err(|e| format!("ldaptrafgroup: {e}"))?;
    let line = super::access_cmds::limit_key(state, args);
    for name in members {
        let Ok(mut name) = String::from_utf8(name) else {
            state.lenient(format!(
                "ldaptrafgroup: a member of {} whose name is not UTF-8 is passed over",
                quote(&args[1])
            ));
            continue;
        };
        if lowercase {
            name = name.to_ascii_lowercase();
        }
        if name.is_empty()
            || name.contains(['/', '\\'])
            || name.contains("..")
            || name.contains('\0')
        {
            continue;
        }
        let lc = format!("{dir}{name}.lc");
        state.access.limits.add_group_member(
            &format!("{line} {name}"),
            &name,
            rate as u64,
            period,
            limit,
            lc,
        );
    }
    Ok(())
}

/// A number as C's atoi reads it, with a warning when that was not all
/// of it.
fn atoi_warn(state: &mut State, v: &str) -> i64 {
    let (n, whole) = atoi(v);
    if !whole {
        state.lenient(format!(
            "'{}' is not a number: {n} used, as 3proxy's atoi reads it",
            quote(v)
        ));
    }
    n
}

/// StringsPlugin's file: read now (3proxy's plugin reads it when its
/// line runs, at every load), its texts for every service. A file that
/// cannot be read fails the line, as 3proxy's plugin does; what looks
/// wrong inside is one warning, and the rest is used.
fn load_strings(state: &mut State, path: &str) -> Result<(), String> {
    let text = std::fs::File::open(path)
        .map_err(super::state::ReadError::Io)
        .and_then(|f| state.read_counted(f, u64::MAX))
        .map_err(|e| match e {
            super::state::ReadError::Io(e) => {
                format!(
                    "StringsPlugin cannot read its strings file '{}': {e}",
                    quote(path)
                )
            }
            super::state::ReadError::TooBig(_) => super::state::too_big(),
        })?;
    let parsed = crate::stringtable::parse(&text);
    if !parsed.problems.is_empty() {
        state.lenient(format!(
            "StringsPlugin: '{}': {}",
            quote(path),
            parsed.problems.join("; ")
        ));
    }
    state.strings = Some(Arc::new(parsed.strings));
    Ok(())
}

/// `file_cachedir DIR` and `file_preview BYTES` (FilePlugin's commands).
/// FilePlugin keeps a copy of the data it passes in DIR for the plugins
/// that register with it to look at (an antivirus, say), and hands them
/// the first BYTES first. No plugin code is ever loaded here, so no
/// plugin registers and, as with 3proxy's FilePlugin loaded alone,
/// nothing is stored: the commands are checked as 3proxy checks them.
pub fn h_file(state: &mut State, args: &[String]) -> Result<(), String> {
    if !state.file_plugin {
        return Err(format!(
            "{} comes with FilePlugin: load it first \
             (plugin FilePlugin.ld.so file_plugin)",
            args[0]
        ));
    }
    if args[0] == "file_preview" {
        // 3proxy reads it with atoi.
        state.atoi(&args[1], 0u64, u64::from(u32::MAX))?;
        return Ok(());
    }
    let dir = &args[1];
    if dir.is_empty() || dir.len() > 200 || dir.contains('%') {
        return Err(format!(
            "'{}' is not a directory FilePlugin takes: 1 to 200 bytes, no '%'",
            quote(dir)
        ));
    }
    Ok(())
}

/// `transparent` / `notransparent` (TransparentPlugin's commands): later
/// services take the original destination of redirected clients, or not.
pub fn h_transparent(state: &mut State, args: &[String]) -> Result<(), String> {
    if state.transparent.is_none() {
        return Err(format!(
            "{} comes with TransparentPlugin: load it first \
             (plugin TransparentPlugin.ld.so transparent_plugin)",
            args[0]
        ));
    }
    state.transparent = Some(args[0] == "transparent");
    Ok(())
}

/// TrafficPlugin's `plugin` line (`plugin FILE start [debug]`): the
/// services that follow take the `trafcorrect` rules, and the command is
/// there from now on. Loaded again, the plugin starts its list afresh, as
/// 3proxy's does; `debug` prints each record's correction to stdout.
fn traffic_plugin(state: &mut State, args: &[String]) {
    let mut debug = false;
    for (i, a) in args.iter().enumerate() {
        if i == 0 && a == "debug" {
            debug = true;
        } else {
            state.lenient(format!(
                "TrafficPlugin takes only 'debug'; '{}' ignored, as 3proxy ignores it",
                quote(a)
            ));
        }
    }
    let first_service = state.services.len();
    let t = state.traffic.get_or_insert(TrafficPlugin {
        first_service,
        rules: Default::default(),
    });
    t.rules.rules.clear();
    if debug && !t.rules.debug {
        // Not println!, which panics when stdout is closed (a daemon).
        use std::io::Write;
        let _ = writeln!(
            std::io::stdout().lock(),
            "TrafficPlugin: debug: each record's correction is printed here"
        );
    }
    t.rules.debug |= debug;
}

const TRAFCORRECT_M: &str = "trafcorrect m SERVICE PORT COEFFICIENT";
const TRAFCORRECT_P: &str = "trafcorrect p SERVICE tcp|udp PORT [PACKETSIZE]";

/// `trafcorrect m SERVICE PORT COEFFICIENT` and `trafcorrect p SERVICE
/// tcp|udp PORT [PACKETSIZE]` (TrafficPlugin's command): a rule at the
/// end of the list. What 3proxy's plugin refuses (its return 1 and 2) is
/// an error.
pub fn h_trafcorrect(state: &mut State, args: &[String]) -> Result<(), String> {
    if state.traffic.is_none() {
        return Err("trafcorrect comes with TrafficPlugin: load it first \
             (plugin TrafficPlugin.ld.so start)"
            .into());
    }
    let usage = |what: &str| format!("{what}: {TRAFCORRECT_M}, or {TRAFCORRECT_P}");
    let (form, most) = match args.get(1).map(String::as_str) {
        Some(f @ ("m" | "p")) if args.len() < 5 => {
            let u = if f == "m" {
                TRAFCORRECT_M
            } else {
                TRAFCORRECT_P
            };
            return Err(format!("too few arguments: {u}"));
        }
        Some("m") => ("m", 5),
        Some("p") => ("p", 6),
        Some(other) => {
            return Err(usage(&format!(
                "'{}' is no form of trafcorrect",
                quote(other)
            )))
        }
        None => return Err(usage("the form is missing")),
    };
    if args.len() > most {
        state.lenient(format!(
            "{} arguments after the rule ignored, as 3proxy ignores them",
            args.len() - most
        ));
    }
    let service = rule_service(state, &args[2]);
    let rule = if form == "m" {
        let port = rule_port(state, &args[3])?;
        let k = coefficient(state, &args[4])?;
        Rule {
            service,
            port,
            form: Form::Scale(k),
        }
    } else {
        let udp = match args[3].as_str() {
            "udp" if service.is_some_and(crate::traffic::tcp_only) => {
                state.lenient(format!(
                    "{} is TCP only: a tcp rule, as 3proxy's plugin makes it",
                    args[2]
                ));
                false
            }
            "udp" => true,
            "tcp" => false,
            other => {
                state.lenient(format!(
                    "'{}' is neither tcp nor udp: a tcp rule, as 3proxy takes it",
                    quote(other)
                ));
                false
            }
        };
        let port = rule_port(state, &args[4])?;
        let size = match args.get(5) {
            Some(s) => u64::from(state.atoi::<u32>(s, 1, i32::MAX as u32)?),
            None if udp => crate::traffic::UDP_PACKET,
            None => crate::traffic::TCP_PACKET,
        };
        Rule {
            service,
            port,
            form: Form::Packets { udp, size },
        }
    };
    if let Some(t) = state.traffic.as_mut() {
        t.rules.rules.push(rule);
    }
    Ok(())
}

/// A rule's service: one of 3proxy's names, or any (`*`, and with a
/// warning a name the plugin does not know, which 3proxy takes as any).
fn rule_service(state: &mut State, name: &str) -> Option<&'static str> {
    let s = crate::traffic::service(name);
    if s.is_none() && name != "*" {
        let known: Vec<&str> = crate::traffic::service_names().collect();
        state.lenient(format!(
            "'{}' is none of {}: the rule is for any service, as 3proxy takes it",
            quote(name),
            known.join(", ")
        ));
    }
    s
}

/// A rule's port, read as 3proxy's `atoi`: `*`, 0 and below are any
/// port; above 65535 is an error.
fn rule_port(state: &mut State, s: &str) -> Result<u16, String> {
    if s == "*" {
        return Ok(0);
    }
    let v = super::value::atoi(s);
    if v > 65535 {
        return Err(format!("port '{}' is above 65535", quote(s)));
    }
    if s.parse::<i64>().is_err() {
        state.lenient(super::value::not_a_number(s, &v.max(0).to_string()));
    } else if v < 0 {
        state.lenient(format!("port {v} is below 0: any port, as 3proxy takes it"));
    }
    Ok(u16::try_from(v).unwrap_or(0))
}

/// The `m` form's coefficient, read as C's `atof`: above 0, at most 100.
fn coefficient(state: &mut State, s: &str) -> Result<f64, String> {
    let (k, plain) = match s.parse::<f64>() {
        Ok(k) => (k, true),
        Err(_) => (atof(s), false),
    };
    if !(k > 0.0 && k <= 100.0) {
        return Err(format!(
            "coefficient '{}' is not above 0 and at most 100",
            quote(s)
        ));
    }
    if !plain {
        state.lenient(super::value::not_a_number(s, &k.to_string()));
    }
    Ok(k)
}

/// What C's `atof` makes of `s`: the longest number at its start (after
/// blanks), 0 if there is none.
fn atof(s: &str) -> f64 {
    let t = s.trim_start();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-' | 'e' | 'E')))
        .unwrap_or(t.len());
    (1..=end)
        .rev()
        .find_map(|n| t[..n].parse::<f64>().ok())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::super::commands::run_lines as run;
    use super::*;

    #[test]
    fn plugins_by_export_and_by_file() {
        let cases = [
            (
                "/x/TransparentPlugin.ld.so",
                "transparent_plugin",
                Some(Plugin::Transparent),
            ),
            ("/x/PamAuth.ld.so", "start", Some(Plugin::PamAuth)),
            ("pamauth.so", "start", Some(Plugin::PamAuth)),
            (
                "C:\\3proxy\\TrafficPlugin.dll",
                "start",
                Some(Plugin::Traffic),
            ),
            ("/x/StringsPlugin.ld.so", "start", Some(Plugin::Strings)),
            ("c:\\3proxy\\string.dll", "start", Some(Plugin::Strings)),
            ("TrafficPlugin.ld.so", "start", Some(Plugin::Traffic)),
            ("/x/whatever.so", "start", None),
            ("/x/whatever.so", "my_plugin", None),
            ("/nowhere/ssl.so", "ssl_plugin", Some(Plugin::Ssl)),
        ];
        for (file, name, want) in cases {
            assert_eq!(identify(file, name), want, "{file} {name}");
        }
    }

    #[test]
    fn transparent_is_on_once_loaded_and_scoped_by_its_commands() {
        assert!(run(&["transparent"])
            .unwrap_err()
            .contains("comes with TransparentPlugin"));
        let st = run(&["plugin /none/TransparentPlugin.ld.so transparent_plugin"]).unwrap();
        assert_eq!(st.transparent, Some(true));
        let st = run(&[
            "plugin T.so transparent_plugin",
            "notransparent",
            "plugin T.so transparent_plugin",
        ])
        .unwrap();
        assert_eq!(st.transparent, Some(false));
        let st = run(&[
            "plugin T.so transparent_plugin",
            "notransparent",
            "transparent",
        ])
        .unwrap();
        assert_eq!(st.transparent, Some(true));
    }

    #[test]
    fn ldap_plugin_commands() {
        assert_eq!(identify("/x/LdapPlugin.ld.so", "start"), Some(Plugin::Ldap));
        assert_eq!(identify("ldapauth.dll", "start"), Some(Plugin::Ldap));
        let e = run(&["ldapconnect 127.0.0.1 cn=a"]).unwrap_err();
        assert!(e.contains("comes with the LdapPlugin plugin"), "{e}");
        let e = run(&["auth ldap"]).unwrap_err();
        assert!(e.contains("comes with the LdapPlugin plugin"), "{e}");
        let st = run(&[
            "plugin LdapPlugin.ld.so start",
            "auth ldap",
            "ldapconnect 127.0.0.1:3890 cn=admin,dc=x pw",
            "ldapattr uid memberOf 1",
            "ldapuserenv ou=people,dc=x",
            "ldapsbase dc=x",
            "ldapaccess cn=internet,dc=x",
            "ldapdircount /tmp/",
        ])
        .unwrap();
        let l = st.ldap.clone().unwrap();
        assert!(l.used && l.missing().is_empty());
        let s = l.settings().unwrap();
        assert_eq!(s.uris, "ldap://127.0.0.1:3890");
        assert_eq!(s.bind_pw.as_deref(), Some("pw"));
        assert!(s.lowercase);
        let st = run(&[
            "plugin LdapPlugin.ld.so start",
            "ldapconnect h1 cn=a",
            "ldapattr uid ou 0",
        ])
        .unwrap();
        let l = st.ldap.unwrap();
        assert_eq!(
            l.connect.clone().unwrap(),
            ("ldap://h1".into(), "cn=a".into(), None)
        );
        assert!(!l.attr.as_ref().unwrap().2);
        assert_eq!(l.missing(), ["ldapuserenv", "ldapsbase", "ldapaccess"]);
        let mut st = run(&["plugin LdapPlugin.ld.so start", "ldapattr uid ou yes"]).unwrap();
        assert_eq!(st.take_pending().len(), 1);
        let e = run(&[
            "plugin LdapPlugin.ld.so start",
            "ldaptrafgroup cn=g,dc=x MONTHLY 200 60000",
        ])
        .unwrap_err();
        assert!(e.contains("needs ldapconnect before it"), "{e}");
        let e = run(&["plugin LdapPlugin.ld.so start", "ldapconnect ldap://h cn=a"]).unwrap_err();
        assert!(e.contains("not a host[:port]"), "{e}");
        assert_eq!(atoi(" 12x"), (12, false));
        assert_eq!(atoi("-3"), (-3, true));
        assert_eq!(atoi("yes"), (0, false));
    }

    #[test]
    fn strings_plugin_reads_its_file_at_its_line() {
        let e = run(&["plugin /x/StringsPlugin.ld.so start"]).unwrap_err();
        assert!(e.contains("needs its strings file"), "{e}");
        let e = run(&["plugin /x/StringsPlugin.ld.so start /nonexistent/strings"]).unwrap_err();
        assert!(
            e.contains("cannot read its strings file '/nonexistent/strings'"),
            "{e}"
        );
        let path = std::env::temp_dir().join(format!("tp-strings-unit-{}", std::process::id()));
        std::fs::write(&path, "[--proxy--]\nx\n[end]\n[/--proxy--]\n").unwrap();
        let line = format!("plugin StringsPlugin.ld.so start {}", path.display());
        let got = run(&[&line]);
        let _ = std::fs::remove_file(&path);
        let mut st = got.unwrap();
        let s = st.strings.clone().unwrap();
        assert_eq!(s.proxy(0), Some(&b"x"[..]));
        assert_eq!(s.proxy(1), None);
        let warned = st.take_pending();
        assert_eq!(warned.len(), 1, "{warned:?}");
        assert!(
            warned[0].starts_with(&format!("StringsPlugin: '{}': ", path.display())),
            "{warned:?}"
        );
    }

    #[test]
    fn refusals_name_the_plugin() {
        let e = run(&["plugin /x/my.so my_plugin"]).unwrap_err();
        assert!(e.contains("'my_plugin'") && e.contains("not built"), "{e}");
        let e = run(&["plugin /x/wa.dll WindowsAuthentication"]).unwrap_err();
        assert!(
            e.contains("WindowsAuthentication") && e.contains("not built"),
            "{e}"
        );
        assert!(run(&["plugin /x/ssl.so ssl_plugin"]).is_ok());
        assert!(run(&["plugin /x/pcre.so pcre_plugin"]).is_ok());
        let e = run(&["plugin /x/PamAuth.ld.so start"]).unwrap_err();
        assert!(e.contains("PAM service"), "{e}");
        let e = run(&["auth pam"]).unwrap_err();
        assert!(e.contains("PamAuth"), "{e}");
    }

    fn rules(st: &State) -> Vec<Rule> {
        st.traffic.as_ref().unwrap().rules.rules.clone()
    }

    #[test]
    fn trafcorrect_comes_with_its_plugin() {
        let e = run(&["trafcorrect m tcppm 0 2"]).unwrap_err();
        assert!(e.contains("TrafficPlugin"), "{e}");
        let st = run(&["plugin /nowhere/TrafficPlugin.ld.so start"]).unwrap();
        assert!(rules(&st).is_empty());
        assert!(!st.traffic.as_ref().unwrap().rules.debug);
        let st = run(&["plugin TrafficPlugin.so start debug"]).unwrap();
        assert!(st.traffic.as_ref().unwrap().rules.debug);
    }

    #[test]
    fn trafcorrect_forms() {
        let st = run(&[
            "plugin TrafficPlugin.ld.so start",
            "trafcorrect m socks5 6112 4.5",
            "trafcorrect m * * 1.1",
            "trafcorrect p proxy tcp 80",
            "trafcorrect p udppm udp 53",
            "trafcorrect p socks5 udp 0 30",
            "trafcorrect p tcppm tcp 0 60",
        ])
        .unwrap();
        let r = rules(&st);
        assert_eq!(
            r,
            vec![
                Rule {
                    service: Some("SOCK5"),
                    port: 6112,
                    form: Form::Scale(4.5)
                },
                Rule {
                    service: None,
                    port: 0,
                    form: Form::Scale(1.1)
                },
                Rule {
                    service: Some("PROXY"),
                    port: 80,
                    form: Form::Packets {
                        udp: false,
                        size: 52
                    }
                },
                Rule {
                    service: Some("UDPPM"),
                    port: 53,
                    form: Form::Packets {
                        udp: true,
                        size: 48
                    }
                },
                Rule {
                    service: Some("SOCK5"),
                    port: 0,
                    form: Form::Packets {
                        udp: true,
                        size: 30
                    }
                },
                Rule {
                    service: Some("TCPPM"),
                    port: 0,
                    form: Form::Packets {
                        udp: false,
                        size: 60
                    }
                },
            ]
        );
        assert!(st.warnings.is_empty() && st.pending.is_empty());
    }

    #[test]
    fn trafcorrect_refuses_what_3proxy_refuses() {
        let load = "plugin TrafficPlugin.ld.so start";
        for (line, says) in [
            ("trafcorrect", "form is missing"),
            ("trafcorrect x tcppm 0 1", "no form"),
            ("trafcorrect m tcppm 0", "too few"),
            ("trafcorrect p tcppm tcp", "too few"),
            ("trafcorrect m tcppm 0 0", "coefficient"),
            ("trafcorrect m tcppm 0 -1", "coefficient"),
            ("trafcorrect m tcppm 0 100.5", "coefficient"),
            ("trafcorrect m tcppm 0 nan", "coefficient"),
            ("trafcorrect m tcppm 0 x", "coefficient"),
            ("trafcorrect m tcppm 65536 2", "above 65535"),
            ("trafcorrect p tcppm tcp 70000", "above 65535"),
            ("trafcorrect p tcppm tcp 0 0", "not a number from 1"),
            ("trafcorrect p tcppm tcp 0 -52", "not a number from 1"),
        ] {
            let e = run(&[load, line]).unwrap_err();
            assert!(e.contains(says), "{line}: {e}");
        }
        // The boundaries are taken.
        assert!(run(&[load, "trafcorrect m tcppm 65535 100"]).is_ok());
        assert!(run(&[load, "trafcorrect m tcppm 0 0.001"]).is_ok());
    }

    #[test]
    fn trafcorrect_takes_leniently_what_3proxy_takes() {
        let mut st = State::new(true);
        let lines = [
            "plugin TrafficPlugin.ld.so start",
            "trafcorrect m socks 0 2",
            "trafcorrect m tcppm -3 2",
            "trafcorrect m tcppm 80x 1.5x",
            "trafcorrect p tcppm udp 0",
            "trafcorrect p udppm UDP 0",
            "trafcorrect m tcppm 0 2 extra",
        ];
        let mut warned = 0;
        for l in lines {
            let args: Vec<String> = l.split_whitespace().map(String::from).collect();
            super::super::commands::dispatch(&mut st, &args).unwrap();
            warned += usize::from(!st.take_pending().is_empty());
        }
        assert_eq!(warned, lines.len() - 1);
        let r = rules(&st);
        assert_eq!((r[0].service, r[0].port), (None, 0));
        assert_eq!(r[1].port, 0);
        assert_eq!((r[2].port, r[2].form), (80, Form::Scale(1.5)));
        // tcppm is TCP only; "UDP" is not "udp": both tcp, 52 bytes.
        for r in &r[3..5] {
            assert_eq!(
                r.form,
                Form::Packets {
                    udp: false,
                    size: 52
                }
            );
        }
    }

    #[test]
    fn loading_the_plugin_again_starts_the_rules_afresh() {
        let st = run(&[
            "plugin TrafficPlugin.ld.so start",
            "trafcorrect m tcppm 0 2",
            "plugin TrafficPlugin.ld.so start",
            "trafcorrect m tcppm 0 3",
        ])
        .unwrap();
        assert_eq!(rules(&st).len(), 1);
        assert_eq!(rules(&st)[0].form, Form::Scale(3.0));
    }

    #[test]
    fn atof_reads_a_number_at_the_start() {
        assert_eq!(atof("1.5x"), 1.5);
        assert_eq!(atof("  2e1,"), 20.0);
        assert_eq!(atof("1,5"), 1.0);
        assert_eq!(atof("x"), 0.0);
        assert_eq!(atof("-"), 0.0);
    }
}
