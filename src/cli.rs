//! The command line: `3proxy [-t] [--strict] [CFGFILE]`, the standalone
//! names (`3proxy_tcppm`, ...), `3proxy_crypt`, the signal loop and the
//! reload. `main.rs` only calls [`main`].
//!
//! Bird's-eye view: `3proxy CFGFILE` runs the cfg script (`conf`), whose
//! service commands each prepare a listener (`services::prepare`). When
//! the whole file has loaded, every service gets an acceptor thread
//! (`acceptor`), which hands each client to a thread of its own; that
//! thread runs `services::child`, the loop of the service's handler and
//! the handlers local redirections hand the client to. The main thread
//! then only waits for signals (reload, rotation, exit).
//!
//! The code map, the layers and the invariants are in ARCHITECTURE.md
//! (and, short, in the README).

use std::io::IsTerminal;
use std::process::ExitCode;

use nix::sys::signal::{SigSet, Signal};

use crate::{conf, crypt, limit, log, metrics, net, running, services, shutdown, sys};

/// The warning (or, with `--strict`, the error) for a cfg without services.
const NO_SERVICE: &str = "no service is started (no service line such as 'proxy' or 'tcppm')";

/// Where 3proxy looks for its cfg when none is named (its compiled-in
/// default, stringtable.c).
const DEFAULT_CFG: &str = "/usr/local/etc/3proxy/3proxy.cfg";

/// Where `make install` puts the cfg, as 3proxy's Makefile.Linux does:
/// SYSCONFDIR/3proxy/3proxy.cfg, SYSCONFDIR as the build was given it
/// (the Makefile passes its own), /etc by default. Looked at when
/// [`DEFAULT_CFG`] cannot be opened, so a bare `3proxy` finds what the
/// install wrote.
fn installed_cfg() -> String {
    let etc = option_env!("THREEPROXY_SYSCONFDIR").unwrap_or("/etc");
    format!("{}/3proxy/3proxy.cfg", etc.trim_end_matches('/'))
}
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn usage(opts: &getopts::Options) -> String {
    let brief = "Usage: 3proxy [-t] [--strict] [CFGFILE]\n\n\
        Runs the proxy services CFGFILE describes (3proxy.cfg(5)). Without\n\
        CFGFILE, reads /usr/local/etc/3proxy/3proxy.cfg, else the installed\n\
        cfg ({}), else the cfg from standard input.";
    let mut s = opts.usage(&brief.replace("{}", &installed_cfg()));
    s.push_str("\nSocket option names for -oc, -os, -ol:\n ");
    for n in sys::sockopt::names() {
        s.push(' ');
        s.push_str(n);
    }
    s.push('\n');
    s
}

/// The program: what `main.rs` runs.
pub fn main() -> ExitCode {
    // Run as `3proxy_crypt` (a symlink to this binary): the hash tool.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if crypt::invoked_as_crypt(argv.first().map(|a| a.as_os_str())) {
        return crypt::crypt_main(argv);
    }
    sys::mem::tune();
    env_logger::Builder::new()
        // odbc-api warns of every driver's informational message; the
        // ODBC log's writer reports what matters itself
        // (THREEPROXY_LOG=odbc_api=debug shows them).
        .filter_module("odbc_api", ::log::LevelFilter::Error)
        .parse_env(env_logger::Env::new().filter_or("THREEPROXY_LOG", "warn"))
        .format(|buf, rec| {
            use std::io::Write;
            writeln!(
                buf,
                "3proxy: {}: {}",
                rec.level().as_str().to_lowercase(),
                rec.args()
            )
        })
        .init();

    // Run as `3proxy_tcppm`, `3proxy_socks`, ... (links to this binary):
    // one service from the command line, as 3proxy's standalone programs.
    if let Some(service) = standalone_service(argv.first().map(|a| a.as_os_str())) {
        return standalone(service, std::env::args().skip(1).collect());
    }

    let mut opts = getopts::Options::new();
    opts.optflag(
        "t",
        "test",
        "check the cfg and exit: 0 if it is good, 1 if not",
    );
    opts.optflag(
        "",
        "strict",
        "refuse what 3proxy accepts leniently (a warning without this flag)",
    );
    opts.optflag("h", "help", "print this help and exit");
    opts.optflag("v", "version", "print the version and exit");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let m = match opts.parse(&args) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("3proxy: {e}\n{}", usage(&opts));
            return ExitCode::from(1);
        }
    };
    if m.opt_present("h") {
        print!("{}", usage(&opts));
        return ExitCode::SUCCESS;
    }
    if m.opt_present("v") {
        println!("3proxy (threeproxy) {VERSION}");
        return ExitCode::SUCCESS;
    }
    if m.free.len() > 1 {
        eprintln!("3proxy: too many arguments\n{}", usage(&opts));
        return ExitCode::from(1);
    }
    let check = m.opt_present("t");

    let sigs = match block_signals() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("3proxy: {e}");
            return ExitCode::from(1);
        }
    };

    let strict = m.opt_present("strict");

    let mut state = conf::State::new(check);
    state.strict = strict;
    let (name, text) = match read_cfg(&mut state, m.free.first().map(String::as_str)) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("3proxy: {e}");
            return ExitCode::from(1);
        }
    };
    let loaded = conf::run(&mut state, &name, &text);
    metrics::set_cfg(&text);
    for w in std::mem::take(&mut state.warnings) {
        eprintln!("3proxy: warning: {w}");
    }
    if let Err(e) = loaded {
        eprintln!("3proxy: {e}");
        return ExitCode::from(1);
    }
    state.finalize();
    if state.services.is_empty() {
        // 3proxy starts such a cfg and idles until it is stopped.
        if strict {
            eprintln!("3proxy: {name}: {NO_SERVICE} {}", conf::STRICT);
            return ExitCode::from(1);
        }
        eprintln!("3proxy: warning: {name}: {NO_SERVICE}; idling, as 3proxy does");
    }
    if check {
        eprintln!(
            "3proxy: {name}: the configuration is good ({} services)",
            state.services.len()
        );
        return ExitCode::SUCCESS;
    }
    serve(state, &name, &sigs)
}

/// Start the loaded services and run the main thread's loop until a
/// signal ends the process.
fn serve(mut state: conf::State, name: &str, sigs: &SigSet) -> ExitCode {
    let strict = state.strict;
    // Loaded and bound, and still the only thread: go to the background,
    // write the pid file, give up root (`conf::ops_cmds`, `sys::process`).
    // Background threads start only after this: none survives a fork.
    if let Err(e) = state.ops.after_load() {
        eprintln!("3proxy: {e}");
        return ExitCode::from(1);
    }
    // Where the admin service's cfg page reads the running cfg from.
    services::admin::set_cfg(
        (!name.starts_with('<') || state.ops.config.is_some()).then(|| state.ops.reload_path(name)),
    );
    services::admin::set_writable(state.ops.writable);
    if state.ops.reports {
        limit::start_reports(&state.access.limits);
    }
    crate::dae::install(state.dae.take());
    // The checker thread starts here, after `daemon`'s fork (a thread
    // started while loading would not survive it).
    crate::parentcheck::install(std::mem::take(&mut state.probes));
    for p in std::mem::take(&mut state.services) {
        let what = format!("{p:?}");
        if let Err(e) = services::start(p) {
            eprintln!("3proxy: cannot start {what}: {e}");
            return ExitCode::from(1);
        }
    }
    ::log::info!("started, pid {}", std::process::id());

    // The main thread's loop: signals, and once a second the `monitor`ed
    // files (3proxy looks once a minute; a stat per second costs nothing).
    let mut ops = state.ops;
    loop {
        match sys::signal::wait_timeout(sigs, std::time::Duration::from_secs(1)) {
            Some(Signal::SIGTERM | Signal::SIGINT) => {
                ::log::info!("exiting on signal");
                running::stop_all();
                net::remove_unix_files();
                shutdown::finish(shutdown::GRACE);
                return ExitCode::SUCCESS;
            }
            Some(Signal::SIGUSR1) => reload(name, &mut ops, strict),
            _ => {}
        }
        crate::bufpool::trim_idle();
        sys::mem::trim();
        if ops.monitors_changed() {
            ::log::warn!("monitor: a watched file changed; reloading");
            reload(name, &mut ops, strict);
        }
    }
}

/// Block the signals the main thread takes. They are taken with
/// sigtimedwait(); they must be blocked before any other thread starts, so
/// every thread inherits the mask and none of them runs a default action.
fn block_signals() -> Result<SigSet, String> {
    let mut sigs = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGUSR1] {
        sigs.add(s);
    }
    sigs.thread_block()
        .map_err(|e| format!("cannot block signals: {e}"))?;
    Ok(sigs)
}

/// The services 3proxy also installs as programs of their own.
const STANDALONE: &[&str] = &[
    "proxy", "socks", "pop3p", "smtpp", "imapp", "ftppr", "tcppm", "udppm", "tlspr",
];

/// `3proxy_<service>` as the program name: which service.
fn standalone_service(argv0: Option<&std::ffi::OsStr>) -> Option<&'static str> {
    let base = std::path::Path::new(argv0?).file_name()?.to_str()?;
    let svc = base.strip_prefix("3proxy_")?;
    STANDALONE.iter().copied().find(|s| *s == svc)
}

/// A standalone service (3proxy's `proxy`, `socks`, `pop3p`, `imapp`, `tcppm`, `udppm`
/// programs): its options and arguments come from the command line, no
/// cfg is read, every client is allowed (no user is asked for), and
/// nothing is logged unless `-l` says so.
fn standalone(service: &'static str, args: Vec<String>) -> ExitCode {
    let prog = format!("3proxy_{service}");
    if args.iter().any(|a| a == "--help" || a == "-?") {
        println!(
            "Usage: {prog} [options]{} (the service options of 3proxy.cfg(5))",
            if service.ends_with("pm") {
                " LPORT DSTHOST DSTPORT"
            } else {
                ""
            }
        );
        return ExitCode::SUCCESS;
    }
    let sigs = match block_signals() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{prog}: {e}");
            return ExitCode::from(1);
        }
    };
    let mut state = conf::State::new(false);
    // Everything allowed; never ask for a password; the HTTP proxy adds no
    // headers naming itself (3proxy builds its standalone proxy so).
    let mut line = vec![service.to_string(), "-u".to_string()];
    if service == "proxy" {
        line.push("-a".to_string());
    }
    // 3proxy's standalone mail proxies offer no STARTTLS (no tlspr there).
    if matches!(service, "pop3p" | "imapp" | "smtpp") {
        line.push("-x".to_string());
    }
    line.extend(args);
    let auth = ["auth".to_string(), "none".to_string()];
    let loaded = conf::commands::dispatch(&mut state, &auth)
        .and_then(|_| conf::commands::dispatch(&mut state, &line));
    for w in state.take_pending() {
        eprintln!("{prog}: warning: {w}");
    }
    if let Err(e) = loaded {
        eprintln!("{prog}: {e}");
        return ExitCode::from(1);
    }
    state.finalize();
    serve(state, "<command line>", &sigs)
}

/// SIGUSR1: read the cfg again and switch to it, better than 3proxy does.
/// The new cfg is loaded and its new sockets bound first; if anything fails
/// the error is logged and the running services stay as they are. Sockets
/// whose address and options did not change are kept open (no gap, no
/// second listener, no lost queued client) and only their settings change;
/// sockets no longer in the cfg are closed. Clients being served finish on
/// the settings they started with.
fn reload(cmdline_name: &str, ops: &mut conf::ops::Ops, strict: bool) {
    if cmdline_name.starts_with('<') && ops.config.is_none() {
        ::log::warn!(
            "reload: the cfg came from {cmdline_name} and cannot be read again; keeping it"
        );
        return;
    }
    // `config` names the file to re-read; after a chroot the path is the
    // one seen from inside it.
    let path = ops.reload_path(cmdline_name);
    let name = path.display().to_string();
    let name = name.as_str();
    ::log::info!("reload: reading {name}");
    // `ldaptrafgroup` reads its counter files again for the counters the
    // new cfg makes: they must hold what was counted until now.
    crate::dircount::flush();
    let Some(mut state) = load_for_reload(&path, name, strict) else {
        // What the failed cfg prepared is dropped with it (its listeners
        // close); its log files must not take over rotation either. The
        // running cfg, its logs and its pid file stay exactly as they were.
        log::discard_files();
        metrics::reload_failed();
        return;
    };
    // From here on the new cfg is the one that serves.
    state.finalize();
    let kept: Vec<std::sync::Arc<running::Running>> = state
        .services
        .iter()
        .filter_map(|p| p.reuse.clone())
        .collect();
    let unix_paths: Vec<net::Addr> = state
        .services
        .iter()
        .map(|p| p.svc.listen.clone())
        .filter(|a| !matches!(a, net::Addr::Ip(_)))
        .collect();
    running::retain(|r| {
        let keep = kept.iter().any(|k| std::ptr::eq(k.as_ref(), r));
        if !keep {
            if let net::Addr::Unix(p) = &r.current().listen {
                if !unix_paths.contains(&net::Addr::Unix(p.clone())) {
                    let _ = std::fs::remove_file(p);
                }
            }
        }
        keep
    });
    let mut started = 0;
    for p in std::mem::take(&mut state.services) {
        let what = format!("{p:?}");
        match services::start(p) {
            Ok(()) => started += 1,
            Err(e) => ::log::error!("reload: cannot start {what}: {e}"),
        }
    }
    crate::dae::install(state.dae.take());
    // The checker thread starts here, after `daemon`'s fork (a thread
    // started while loading would not survive it).
    crate::parentcheck::install(std::mem::take(&mut state.probes));
    // Sessions admitted under the old cfg are checked again (`force`).
    running::bump_generation();
    // Parked sessions are checked again too (`force`): on a thread.
    crate::park::reloaded();
    // pid file and privileges as the new cfg says (daemon never forks
    // twice); the new cfg's monitors replace the old ones.
    if let Err(e) = state.ops.after_load() {
        ::log::error!("reload: {e}");
    }
    if state.ops.reports {
        limit::start_reports(&state.access.limits);
    }
    services::admin::set_writable(state.ops.writable);
    *ops = state.ops;
    metrics::reloaded();
    ::log::warn!("reload: {name} loaded, {started} services");
}

/// Read and run the cfg for a reload; None (the error logged) if it cannot
/// serve. Nothing it did is visible until the caller commits it.
fn load_for_reload(path: &std::path::Path, name: &str, strict: bool) -> Option<conf::State> {
    let mut state = conf::State::new(false);
    state.strict = strict;
    let text = match std::fs::File::open(path) {
        Ok(f) => conf::read_cfg(&mut state, name, f),
        Err(e) => Err(format!("{name}: {e}")),
    };
    let text = match text {
        Ok(t) => t,
        Err(e) => {
            ::log::error!("reload: {e}; the running configuration stays");
            return None;
        }
    };
    let loaded = conf::run(&mut state, name, &text);
    for w in std::mem::take(&mut state.warnings) {
        ::log::warn!("reload: {w}");
    }
    if let Err(e) = loaded {
        ::log::error!("reload: {e}; the running configuration stays");
        return None;
    }
    if state.services.is_empty() {
        ::log::error!("reload: {name}: no service is started; the running configuration stays");
        return None;
    }
    metrics::set_cfg(&text);
    Some(state)
}

/// The cfg's name and bytes: the named file, else the default path, then
/// the installed one; if none can be opened, standard input (as 3proxy
/// does), unless standard input is a terminal. Either is read within the
/// load's byte limit.
fn read_cfg(state: &mut conf::State, path: Option<&str>) -> Result<(String, Vec<u8>), String> {
    let installed = installed_cfg();
    let tries = match path {
        Some(p) => vec![p],
        None if installed == DEFAULT_CFG => vec![DEFAULT_CFG],
        None => vec![DEFAULT_CFG, installed.as_str()],
    };
    let mut failed = Vec::new();
    for p in tries {
        match std::fs::File::open(p) {
            Ok(f) => return conf::read_cfg(state, p, f).map(|t| (p.to_string(), t)),
            Err(e) => failed.push(format!("{p}: {e}")),
        }
    }
    let e = failed.join("; ");
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(e);
    }
    let name = "<stdin>";
    let t = conf::read_cfg(state, name, stdin.lock()).map_err(|e2| format!("{e}; {e2}"))?;
    if t.iter().all(u8::is_ascii_whitespace) {
        return Err(format!("{e}; and standard input gave no configuration"));
    }
    Ok((name.to_string(), t))
}
