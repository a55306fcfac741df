//! `plugin FILE NAME [ARGS]` and the commands the plugins add (3proxy's
//! conf.c `h_plugin`, src/plugins/). 3proxy loads FILE and calls its
//! export NAME; this build has the plugins 3proxy ships built in (those a
//! real cfg relies on) and never loads code: the line picks the built-in
//! one by NAME, or by FILE when several plugins export the same NAME
//! (`start`). FILE need not exist, as for 3proxy's own built-in
//! `ssl_plugin` and `pcre_plugin`. A plugin that is not built is refused
//! with its name, never skipped.

use std::sync::Arc;

use super::state::State;
use super::token::quote;

/// What a `plugin` line asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plugin {
    Transparent,
    PamAuth,
    /// LdapPlugin: its `ldap*` commands and its auth type.
    Ldap,
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
        "trafficplugin" => Plugin::NotBuilt(
            "TrafficPlugin",
            "byte counts are what the sessions carried; its `trafcorrect` \
             estimates of packet headers are not made",
        ),
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
        Some(v) => {
            let (n, whole) = atoi(v);
            if !whole {
                state.lenient(format!(
                    "'{}' is not a number: {n} used, as 3proxy's atoi reads it",
                    quote(v)
                ));
            }
            n > 0
        }
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

/// `ldaptrafgroup GROUP TYPE LIMIT RATE`: refused.
pub fn h_ldaptrafgroup(state: &mut State, _args: &[String]) -> Result<(), String> {
    ldap(state, "ldaptrafgroup")?;
    Err(
        "ldaptrafgroup is not built: 3proxy's plugin asks the directory for the \
         group's members while the cfg loads and gives each a bandwidth limit and a \
         traffic counter kept in ldapdircount's files (a limit it takes in bytes \
         where its documentation says megabytes); write bandlimin and countin \
         lines for those users instead"
            .into(),
    )
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
                by_file("trafficplugin"),
            ),
            ("/x/StringsPlugin.ld.so", "start", Some(Plugin::Strings)),
            ("c:\\3proxy\\string.dll", "start", Some(Plugin::Strings)),
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
        assert!(e.starts_with("ldaptrafgroup is not built"), "{e}");
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
        let e = run(&["plugin /x/TrafficPlugin.ld.so start"]).unwrap_err();
        assert!(
            e.contains("TrafficPlugin") && e.contains("not built"),
            "{e}"
        );
        assert!(run(&["plugin /x/ssl.so ssl_plugin"]).is_ok());
        assert!(run(&["plugin /x/pcre.so pcre_plugin"]).is_ok());
        let e = run(&["plugin /x/PamAuth.ld.so start"]).unwrap_err();
        assert!(e.contains("PAM service"), "{e}");
        let e = run(&["auth pam"]).unwrap_err();
        assert!(e.contains("PamAuth"), "{e}");
    }
}
