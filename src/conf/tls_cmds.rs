//! Handlers of the TLS commands (`ssl_*`, 3proxy.cfg(5) "TLS"; 3proxy's
//! ssl.c). Files are read when their command runs, so a file that cannot
//! be read or parsed is an error of that line; the settings are state
//! that every later service line snapshots (`tls::Settings::server_config`).
//! `plugin FILE ssl_plugin` is accepted and does nothing, as in 3proxy 1.0
//! where TLS is built in.

use super::state::State;
use crate::tls::{self, Version};

fn arg(args: &[String]) -> Option<&str> {
    args.get(1).map(String::as_str)
}

pub fn h_serv(state: &mut State, _: &[String]) -> Result<(), String> {
    if state.tls.mitm {
        return Err(MITM_AND_SERV.into());
    }
    state.tls.serv = true;
    Ok(())
}

pub fn h_noserv(state: &mut State, _: &[String]) -> Result<(), String> {
    state.tls.serv = false;
    Ok(())
}

pub fn h_cli(state: &mut State, _: &[String]) -> Result<(), String> {
    if state.tls.mitm && !state.tls.cli {
        return Err(
            "ssl_cli cannot follow ssl_mitm (as in 3proxy): under ssl_mitm the \
                    origin is reached over TLS already; ssl_nomitm first"
                .into(),
        );
    }
    state.tls.cli = true;
    Ok(())
}

pub fn h_nocli(state: &mut State, _: &[String]) -> Result<(), String> {
    state.tls.cli = false;
    Ok(())
}

const MITM_AND_SERV: &str = "ssl_mitm and ssl_serv cannot both be on (as in 3proxy): \
                             interception is TLS inside the client's tunnel, ssl_serv TLS \
                             around it; ssl_noserv or ssl_nomitm first";

/// `ssl_mitm`: later services intercept their tunnels' TLS.
pub fn h_mitm(state: &mut State, _: &[String]) -> Result<(), String> {
    if state.tls.serv {
        return Err(MITM_AND_SERV.into());
    }
    state.tls.mitm = true;
    Ok(())
}

pub fn h_nomitm(state: &mut State, _: &[String]) -> Result<(), String> {
    state.tls.mitm = false;
    Ok(())
}

/// `ssl_certcache DIR/`: the directory must end in `/` (3proxy joins
/// file names to it as written) and exist.
pub fn h_certcache(state: &mut State, args: &[String]) -> Result<(), String> {
    let d = &args[1];
    if !d.ends_with('/') {
        return Err(format!(
            "'{d}' must end in / (3proxy appends file names to it as written)"
        ));
    }
    if !std::path::Path::new(d).is_dir() {
        return Err(format!("'{d}' is not a directory"));
    }
    state.tls.certcache = Some(d.into());
    Ok(())
}

pub fn h_server_ca_key(state: &mut State, args: &[String]) -> Result<(), String> {
    state.tls.server.ca_key = arg(args).map(tls::load_key).transpose()?;
    Ok(())
}

pub fn h_server_cert(state: &mut State, args: &[String]) -> Result<(), String> {
    state.tls.server.cert = arg(args).map(tls::load_certs).transpose()?;
    Ok(())
}

pub fn h_server_key(state: &mut State, args: &[String]) -> Result<(), String> {
    state.tls.server.key = arg(args).map(tls::load_key).transpose()?;
    Ok(())
}

pub fn h_server_ca_file(state: &mut State, args: &[String]) -> Result<(), String> {
    let certs = arg(args).map(tls::load_certs).transpose()?;
    state.tls.server.ca = certs.as_ref().map(tls::roots_of).transpose()?;
    state.tls.server.ca_cert = certs;
    Ok(())
}

pub fn h_server_verify(state: &mut State, args: &[String]) -> Result<(), String> {
    state.tls.server.verify = args[0] == "ssl_server_verify";
    Ok(())
}

fn version(args: &[String]) -> Result<Option<Version>, String> {
    arg(args).map(Version::parse).transpose()
}

pub fn h_server_version(state: &mut State, args: &[String]) -> Result<(), String> {
    let v = version(args)?;
    if args[0].ends_with("_min_proto_version") {
        state.tls.server.min = v;
    } else {
        state.tls.server.max = v;
    }
    Ok(())
}

pub fn h_client_version(state: &mut State, args: &[String]) -> Result<(), String> {
    let v = version(args)?;
    if args[0].ends_with("_min_proto_version") {
        state.tls.client.min = v;
    } else {
        state.tls.client.max = v;
    }
    Ok(())
}

/// `ssl_{server,client}_{ciphersuites,cipher_list} [LIST]`: the suites
/// of TLS 1.3 and of TLS 1.2 (`tls::suites`); no list: all of them.
pub fn h_suites(state: &mut State, args: &[String]) -> Result<(), String> {
    let list = |f: fn(&str) -> Result<Vec<tls::SupportedCipherSuite>, String>| {
        arg(args).map(f).transpose()
    };
    let (s13, s12) = if args[0].starts_with("ssl_server_") {
        (
            &mut state.tls.server.suites13,
            &mut state.tls.server.suites12,
        )
    } else {
        (
            &mut state.tls.client.suites13,
            &mut state.tls.client.suites12,
        )
    };
    if args[0].ends_with("_ciphersuites") {
        *s13 = list(tls::suites::ciphersuites)?;
    } else {
        *s12 = list(tls::suites::cipher_list)?;
    }
    Ok(())
}

/// `ssl_{server,client}_ca_dir DIR`, `ssl_{server,client}_ca_store URI`:
/// read at the line, like the CA files; without an argument, forget it.
pub fn h_ca_more(state: &mut State, args: &[String]) -> Result<(), String> {
    let dir = args[0].ends_with("_dir");
    let roots = arg(args)
        .map(|a| {
            if dir {
                tls::load_dir(a)
            } else {
                tls::load_store(a)
            }
        })
        .transpose()?;
    let (d, s) = if args[0].starts_with("ssl_server_") {
        (&mut state.tls.server.ca_dir, &mut state.tls.server.ca_store)
    } else {
        (&mut state.tls.client.ca_dir, &mut state.tls.client.ca_store)
    };
    if dir {
        *d = roots;
    } else {
        *s = roots;
    }
    Ok(())
}

/// `ssl_client_alpn [PROTO ...]`: the ALPN protocols offered to parents
/// and destinations, in order; none: no ALPN. Each is 1 to 254 bytes, as
/// in 3proxy.
pub fn h_client_alpn(state: &mut State, args: &[String]) -> Result<(), String> {
    let mut v = Vec::new();
    for a in &args[1..] {
        if a.is_empty() || a.len() > 254 {
            return Err(format!(
                "an ALPN protocol name is 1 to 254 bytes, not {}",
                a.len()
            ));
        }
        v.push(a.as_bytes().to_vec());
    }
    state.tls.client.alpn = v;
    Ok(())
}

pub fn h_client_cert(state: &mut State, args: &[String]) -> Result<(), String> {
    state.tls.client.cert = arg(args).map(tls::load_certs).transpose()?;
    Ok(())
}

pub fn h_client_key(state: &mut State, args: &[String]) -> Result<(), String> {
    state.tls.client.key = arg(args).map(tls::load_key).transpose()?;
    Ok(())
}

pub fn h_client_ca_file(state: &mut State, args: &[String]) -> Result<(), String> {
    state.tls.client.ca = arg(args).map(tls::load_roots).transpose()?;
    Ok(())
}

pub fn h_client_verify(state: &mut State, args: &[String]) -> Result<(), String> {
    state.tls.client.verify = args[0] == "ssl_client_verify";
    Ok(())
}

pub fn h_client_sni(state: &mut State, args: &[String]) -> Result<(), String> {
    state.tls.client.sni = arg(args).map(str::to_string);
    Ok(())
}

/// `ssl_client_mode [0-3]`: when the TLS handshake with the server
/// happens; no argument is 0, as in 3proxy.
pub fn h_client_mode(state: &mut State, args: &[String]) -> Result<(), String> {
    state.tls.client.mode = match arg(args) {
        None => 0,
        Some(a) => super::value::number(a, 0u8, 3)?,
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::commands::run_lines as run;
    use super::*;

    #[test]
    fn ssl_plugin_is_built_in_whatever_the_file() {
        assert!(run(&["plugin /nonexistent/SSLPlugin.so ssl_plugin"]).is_ok());
    }

    #[test]
    fn versions() {
        let st = run(&[
            "ssl_server_min_proto_version tlsv1.3",
            "ssl_client_max_proto_version TLSv1.2",
        ])
        .unwrap();
        assert_eq!(st.tls.server.min, Some(Version::Tls13));
        assert_eq!(st.tls.client.max, Some(Version::Tls12));
        for weak in ["SSLv3", "TLSv1", "tlsv1.1"] {
            let e = run(&[&format!("ssl_server_min_proto_version {weak}")]).unwrap_err();
            assert!(e.contains("weak protocol"), "{e}");
        }
        let e = run(&["ssl_server_max_proto_version TLSv9"]).unwrap_err();
        assert!(e.contains("unknown protocol version 'TLSv9'"), "{e}");
        let st = run(&[
            "ssl_server_min_proto_version TLSv1.3",
            "ssl_server_max_proto_version TLSv1.2",
        ])
        .unwrap();
        assert!(st.tls.server.config().is_err());
    }

    #[test]
    fn files_are_read_at_their_line() {
        let e = run(&["ssl_server_cert /nonexistent/cert.pem"]).unwrap_err();
        assert!(e.contains("cannot read '/nonexistent/cert.pem'"), "{e}");
        let e = run(&["ssl_client_key /nonexistent/k"]).unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
        // Without a file: forget it.
        let st = run(&["ssl_server_cert"]).unwrap();
        assert!(st.tls.server.cert.is_none());
    }

    #[test]
    fn ssl_serv_without_cert_is_an_error_at_the_service() {
        let st = run(&["ssl_serv"]).unwrap();
        let e = st.tls.server_config().unwrap_err();
        assert!(e.contains("ssl_server_cert and ssl_server_key"), "{e}");
        let st = run(&["ssl_serv", "ssl_noserver"]).unwrap();
        assert!(st.tls.server_config().unwrap().is_none());
    }

    #[test]
    fn unbuilt_commands_say_so() {
        let st = run(&["ssl_client_alpn h2 http/1.1"]).unwrap();
        assert_eq!(st.tls.client.alpn, [b"h2".to_vec(), b"http/1.1".to_vec()]);
        assert!(run(&["ssl_client_alpn h2", "ssl_client_alpn"])
            .unwrap()
            .tls
            .client
            .alpn
            .is_empty());
        let long = format!("ssl_client_alpn {}", "x".repeat(255));
        assert!(run(&[&long]).unwrap_err().contains("1 to 254 bytes"));
        let e = run(&["ssl_client_ca_store org.openssl.winstore://"]).unwrap_err();
        assert!(e.contains("not supported"), "{e}");
        let e = run(&["ssl_server_ca_dir /nonexistent/dir"]).unwrap_err();
        assert!(e.contains("cannot read directory"), "{e}");
        assert_eq!(run(&["ssl_client_mode 3"]).unwrap().tls.client.mode, 3);
        // ssl_cli modes 0-2: TLS to the server, for the services that
        // connect to one (tlspr's TLS goes inside ours); ftppr and the
        // mail proxies not in mode 2.
        let modes: [&[&str]; 3] = [
            &["ssl_cli"],
            &["ssl_client_mode 1", "ssl_cli"],
            &["ssl_client_mode 2", "ssl_client"],
        ];
        for (mode, lines) in modes.into_iter().enumerate() {
            let st = run(lines).unwrap();
            for svc in ["tcppm", "proxy", "socks", "auto", "tlspr"] {
                let c = st.tls.client(false, svc).unwrap().unwrap();
                assert!(c.to_server && c.mode() == mode as u8, "{svc}");
            }
            for svc in ["pop3p", "imapp", "smtpp", "ftppr"] {
                let c = st.tls.client(false, svc);
                match mode {
                    2 => assert!(c.unwrap_err().contains("use ssl_client_mode 0 or 1")),
                    _ => assert!(c.unwrap().unwrap().to_server),
                }
            }
        }
        // Mode 3 (parents only) refuses no service.
        let st = run(&["ssl_client_mode 3", "ssl_cli"]).unwrap();
        assert!(!st.tls.client(false, "ftppr").unwrap().unwrap().to_server);
        let st = run(&["ssl_client", "ssl_client_mode 3"]).unwrap();
        let c = st.tls.client(false, "proxy").unwrap().unwrap();
        assert!(!c.to_server);
        let st = run(&["ssl_client", "ssl_noclient"]).unwrap();
        assert!(st.tls.client(false, "tcppm").unwrap().is_none());
        assert!(!st.tls.client(true, "tcppm").unwrap().unwrap().to_server);
        assert!(run(&["ssl_client_mode 4"]).is_err());
    }
}
