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
        "ldapauth" | "ldapplugin" => Plugin::NotBuilt(
            "LdapPlugin",
            "3proxy itself no longer builds it (unsupported upstream)",
        ),
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
