//! TLS as a stream layer (3proxy's `ssl_*` commands, its ssl.c): the
//! settings the cfg gathers, the rustls configurations built from them,
//! and [`TlsStream`], a rustls connection driven over a socket of ours.
//!
//! No async runtime: rustls's `ServerConnection` is fed with `read_tls` /
//! `process_new_packets` and drained with `write_tls`, over recv()/send()
//! on the socket's descriptor, blocking (the socket's own timeouts) or
//! non-blocking (`MSG_DONTWAIT`, for the relay's poll loop). The crypto
//! provider is ring. Nothing here imports from the crate: `net` wraps a
//! [`TlsStream`] of its own stream type in `net::Stream::Tls`.

use std::io::{self, BufRead, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, send, MsgFlags};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{Connection, RootCertStore, ServerConfig, ServerConnection};

pub mod mitm;
pub mod suites;

pub use rustls::SupportedCipherSuite;

/// The protocol versions rustls offers, by 3proxy's (OpenSSL's) names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    Tls12,
    Tls13,
}

impl Version {
    /// `ssl_*_min_proto_version NAME`: TLSv1.2 or TLSv1.3, in any case, as
    /// 3proxy compares them. The weak ones 3proxy's OpenSSL may still
    /// offer are refused by name rather than silently raised.
    pub fn parse(s: &str) -> Result<Version, String> {
        match s.to_ascii_lowercase().as_str() {
            "tlsv1.2" => Ok(Version::Tls12),
            "tlsv1.3" => Ok(Version::Tls13),
            "sslv3" | "tlsv1" | "tlsv1.1" => Err(format!(
                "{s} is a weak protocol version, not offered: use TLSv1.2 or TLSv1.3"
            )),
            _ => Err(format!(
                "unknown protocol version '{s}': TLSv1.2 or TLSv1.3"
            )),
        }
    }
}

/// A PEM file as the cfg named it, read when its command ran.
#[derive(Debug, Clone)]
pub struct Pem<T> {
    pub path: String,
    pub value: T,
}

/// A certificate chain (`ssl_server_cert`, `ssl_client_cert`).
pub type Certs = Pem<Arc<Vec<CertificateDer<'static>>>>;
/// A private key (`ssl_server_key`, `ssl_client_key`).
pub type Key = Pem<Arc<PrivateKeyDer<'static>>>;
/// Trust roots (`ssl_server_ca_file`, `ssl_client_ca_file`).
pub type Roots = Pem<Arc<RootCertStore>>;

fn read_file(path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(Path::new(path)).map_err(|e| format!("cannot read '{path}': {e}"))
}

/// Read a PEM certificate chain: one certificate at least.
pub fn load_certs(path: &str) -> Result<Certs, String> {
    let bytes = read_file(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("'{path}' is not a PEM certificate file: {e}"))?;
    if certs.is_empty() {
        return Err(format!("'{path}' holds no PEM certificate"));
    }
    Ok(Pem {
        path: path.to_string(),
        value: Arc::new(certs),
    })
}

/// Read a PEM private key (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &str) -> Result<Key, String> {
    let bytes = read_file(path)?;
    let key = PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| format!("'{path}' holds no PEM private key: {e}"))?;
    Ok(Pem {
        path: path.to_string(),
        value: Arc::new(key),
    })
}

/// Read PEM trust roots: every certificate in the file.
pub fn load_roots(path: &str) -> Result<Roots, String> {
    roots_of(&load_certs(path)?)
}

/// `ssl_*_ca_dir DIR`: every PEM certificate in the files of `DIR` (an
/// OpenSSL hashed directory's links and any other name alike; files with
/// none, CRLs say, are passed over). None at all is an error.
pub fn load_dir(path: &str) -> Result<Roots, String> {
    let rd = std::fs::read_dir(path).map_err(|e| format!("cannot read directory '{path}': {e}"))?;
    let mut names: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    names.sort();
    let mut store = RootCertStore::empty();
    for f in names {
        let Ok(bytes) = std::fs::read(&f) else {
            continue;
        };
        for c in CertificateDer::pem_slice_iter(&bytes).flatten() {
            let _ = store.add(c);
        }
    }
    if store.is_empty() {
        return Err(format!("'{path}' holds no PEM CA certificate"));
    }
    Ok(Pem {
        path: path.to_string(),
        value: Arc::new(store),
    })
}

/// `ssl_*_ca_store URI`: OpenSSL 3's store, as far as it is files: a
/// path or a `file:` URI naming a PEM file or a directory of them.
/// Other schemes (a Windows store, PKCS#11) are refused by name.
pub fn load_store(uri: &str) -> Result<Roots, String> {
    let path = if let Some(rest) = uri.strip_prefix("file://") {
        rest
    } else if let Some(rest) = uri.strip_prefix("file:") {
        rest
    } else {
        uri
    };
    if let Some((scheme, _)) = path.split_once(':') {
        if !scheme.contains('/') {
            return Err(format!(
                "'{uri}': a store of scheme '{scheme}' is not supported: a file or a \
                 directory (a path or a file: URI) is"
            ));
        }
    }
    if Path::new(path).is_dir() {
        load_dir(path)
    } else {
        load_roots(path)
    }
}

/// Where certificates are checked against: the CA file and directory
/// together if either is named, else the store, else the built-in roots
/// (as 3proxy: `SSL_CTX_load_verify_locations`, else `_store`, else the
/// defaults).
fn trust(file: &Option<Roots>, dir: &Option<Roots>, store: &Option<Roots>) -> Arc<RootCertStore> {
    match (file, dir, store) {
        (Some(f), None, _) => f.value.clone(),
        (None, Some(d), _) => d.value.clone(),
        (Some(f), Some(d), _) => {
            let mut all = (*f.value).clone();
            all.roots.extend(d.value.roots.iter().cloned());
            Arc::new(all)
        }
        (None, None, Some(s)) => s.value.clone(),
        (None, None, None) => default_roots(),
    }
}

/// Trust roots of every certificate in `certs`.
pub fn roots_of(certs: &Certs) -> Result<Roots, String> {
    let path = &certs.path;
    let mut store = RootCertStore::empty();
    for c in certs.value.iter() {
        store
            .add(c.clone())
            .map_err(|e| format!("'{path}': a certificate is not a usable CA: {e}"))?;
    }
    Ok(Pem {
        path: path.to_string(),
        value: Arc::new(store),
    })
}

/// The server-side settings as the cfg has them so far (`ssl_server_*`).
#[derive(Debug, Clone, Default)]
pub struct ServerSettings {
    pub cert: Option<Certs>,
    pub key: Option<Key>,
    pub ca: Option<Roots>,
    /// `ssl_server_ca_dir`, `ssl_server_ca_store`.
    pub ca_dir: Option<Roots>,
    pub ca_store: Option<Roots>,
    /// `ssl_server_ca_file` as certificates: the signing CA of `ssl_mitm`.
    pub ca_cert: Option<Certs>,
    /// `ssl_server_ca_key`: the key of that CA.
    pub ca_key: Option<Key>,
    pub verify: bool,
    pub min: Option<Version>,
    pub max: Option<Version>,
    /// `ssl_server_ciphersuites`, `ssl_server_cipher_list`: None is
    /// every suite rustls has.
    pub suites13: Option<Vec<SupportedCipherSuite>>,
    pub suites12: Option<Vec<SupportedCipherSuite>>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn versions(
    min: Option<Version>,
    max: Option<Version>,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, String> {
    let lo = min.unwrap_or(Version::Tls12);
    let hi = max.unwrap_or(Version::Tls13);
    let mut v = Vec::new();
    if lo <= Version::Tls12 && Version::Tls12 <= hi {
        v.push(&rustls::version::TLS12);
    }
    if lo <= Version::Tls13 && Version::Tls13 <= hi {
        v.push(&rustls::version::TLS13);
    }
    if v.is_empty() {
        return Err("the minimum protocol version is above the maximum".into());
    }
    Ok(v)
}

/// The provider with the cipher suites the cfg chose (each version's own
/// list, or all of that version's) and the versions that are left with
/// some: an empty `ciphersuites` turns TLS 1.3 off, as in OpenSSL.
fn suited(
    min: Option<Version>,
    max: Option<Version>,
    s13: &Option<Vec<SupportedCipherSuite>>,
    s12: &Option<Vec<SupportedCipherSuite>>,
) -> Result<
    (
        Arc<rustls::crypto::CryptoProvider>,
        Vec<&'static rustls::SupportedProtocolVersion>,
    ),
    String,
> {
    let mut p = rustls::crypto::ring::default_provider();
    let is13 = |s: &SupportedCipherSuite| matches!(s, SupportedCipherSuite::Tls13(_));
    let all13: Vec<_> = p.cipher_suites.iter().copied().filter(is13).collect();
    let all12: Vec<_> = p
        .cipher_suites
        .iter()
        .copied()
        .filter(|s| !is13(s))
        .collect();
    let c13 = s13.clone().unwrap_or(all13);
    let c12 = s12.clone().unwrap_or(all12);
    let mut v = versions(min, max)?;
    v.retain(|v| {
        if v.version == rustls::ProtocolVersion::TLSv1_3 {
            !c13.is_empty()
        } else {
            !c12.is_empty()
        }
    });
    if v.is_empty() {
        return Err(
            "no protocol version is left with a cipher suite (see the ciphersuites, \
             cipher_list and proto_version commands)"
                .into(),
        );
    }
    p.cipher_suites = c13.into_iter().chain(c12).collect();
    Ok((Arc::new(p), v))
}

/// Mozilla's roots, compiled in (webpki-roots): where the cfg names no
/// CA file.
pub fn default_roots() -> Arc<RootCertStore> {
    Arc::new(RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    })
}

impl ServerSettings {
    /// The rustls configuration for a service under `ssl_serv`.
    pub fn config(&self) -> Result<Arc<ServerConfig>, String> {
        let (Some(cert), Some(key)) = (&self.cert, &self.key) else {
            return Err("ssl_serv needs ssl_server_cert and ssl_server_key before it".into());
        };
        let (p, v) = suited(self.min, self.max, &self.suites13, &self.suites12)?;
        let b = ServerConfig::builder_with_provider(p)
            .with_protocol_versions(&v)
            .map_err(|e| format!("protocol versions: {e}"))?;
        let b = if self.verify {
            let roots = trust(&self.ca, &self.ca_dir, &self.ca_store);
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| format!("ssl_server_verify: {e}"))?;
            b.with_client_cert_verifier(v)
        } else {
            b.with_no_client_auth()
        };
        let mut cfg = b
            .with_single_cert(cert.value.to_vec(), key.value.clone_key())
            .map_err(|e| {
                format!(
                    "ssl_server_key '{}' cannot serve ssl_server_cert '{}': {e}",
                    key.path, cert.path
                )
            })?;
        // HTTP/1.1 only: what every service here speaks inside TLS.
        cfg.alpn_protocols = Vec::new();
        Ok(Arc::new(cfg))
    }
}

/// `ssl_mitm`'s TLS to origins: the `ssl_client_*` settings, but never
/// HTTP/2 offered (`ssl_client_alpn h2`): the HTTP proxy inside the
/// tunnel speaks HTTP/1.1 to the origin, as the client does to it.
fn origin_config(cfg: Arc<rustls::ClientConfig>) -> Arc<rustls::ClientConfig> {
    if !cfg.alpn_protocols.iter().any(|p| p == b"h2") {
        return cfg;
    }
    let mut c = (*cfg).clone();
    c.alpn_protocols.retain(|p| p != b"h2");
    Arc::new(c)
}

/// What the `ssl_*` commands have set so far.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `ssl_serv`: later services accept TLS.
    pub serv: bool,
    /// `ssl_cli`: TLS towards parents (with `ssl_client_mode 3`) or
    /// the destination (modes 0-2).
    pub cli: bool,
    /// `ssl_mitm`: later services serve certificates of their own making
    /// for the destinations of their clients' tunnels.
    pub mitm: bool,
    /// `ssl_certcache DIR`: where those certificates are kept (and
    /// `3proxy.pem`, `3proxy.key`, `server.key` looked for).
    pub certcache: Option<std::path::PathBuf>,
    pub server: ServerSettings,
    /// The client-side settings (`ssl_client_*`).
    pub client: ClientSettings,
}

/// `ssl_client_*` as the cfg has them so far.
#[derive(Debug, Clone, Default)]
pub struct ClientSettings {
    pub cert: Option<Certs>,
    pub key: Option<Key>,
    pub ca: Option<Roots>,
    pub verify: bool,
    pub sni: Option<String>,
    pub mode: u8,
    pub min: Option<Version>,
    pub max: Option<Version>,
    /// `ssl_client_ca_dir`, `ssl_client_ca_store`.
    pub ca_dir: Option<Roots>,
    pub ca_store: Option<Roots>,
    /// `ssl_client_alpn`: the protocols offered, in order (none: no ALPN).
    pub alpn: Vec<Vec<u8>>,
    /// `ssl_client_ciphersuites`, `ssl_client_cipher_list`.
    pub suites13: Option<Vec<SupportedCipherSuite>>,
    pub suites12: Option<Vec<SupportedCipherSuite>>,
}

impl Settings {
    /// The TLS configuration a TCP service takes at its line: Some under
    /// `ssl_serv`. Errors name what is missing or does not fit.
    pub fn server_config(&self) -> Result<Option<Arc<ServerConfig>>, String> {
        if !self.serv {
            return Ok(None);
        }
        self.server.config().map(Some)
    }
}

impl Settings {
    /// What a TCP service takes at its line under `ssl_mitm`: the CA
    /// (`ssl_server_ca_file` and `ssl_server_ca_key`, else `3proxy.pem`
    /// and `3proxy.key` in `ssl_certcache`), the leaf key
    /// (`ssl_server_key`, else `server.key` there if it exists, else the
    /// CA's key), the server side's protocol versions and the client side's
    /// settings for the origin. Errors name what is missing.
    pub fn mitm(&self) -> Result<Option<Arc<mitm::Mitm>>, String> {
        if !self.mitm {
            return Ok(None);
        }
        let dir = self.certcache.as_deref();
        let in_dir = |f: &str| dir.map(|d| d.join(f).to_string_lossy().into_owned());
        let missing = |what: &str, file: &str| {
            format!("ssl_mitm needs {what} before the service, or ssl_certcache DIR holding {file}")
        };
        let ca_cert = match (&self.server.ca_cert, in_dir("3proxy.pem")) {
            (Some(c), _) => c.clone(),
            (None, Some(f)) => load_certs(&f)?,
            (None, None) => return Err(missing("ssl_server_ca_file", "3proxy.pem")),
        };
        let ca_key = match (&self.server.ca_key, in_dir("3proxy.key")) {
            (Some(k), _) => k.clone(),
            (None, Some(f)) => load_key(&f)?,
            (None, None) => return Err(missing("ssl_server_ca_key", "3proxy.key")),
        };
        let leaf_key = match (&self.server.key, in_dir("server.key")) {
            (Some(k), _) => Some(k.clone()),
            (None, Some(f)) if Path::new(&f).exists() => Some(load_key(&f)?),
            _ => None,
        };
        let s = &self.server;
        let (p, v) = suited(s.min, s.max, &s.suites13, &s.suites12)?;
        let base = ServerConfig::builder_with_provider(p)
            .with_protocol_versions(&v)
            .map_err(|e| format!("protocol versions: {e}"))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(mitm::NoCert));
        let named_key = |k: Key| (k.path, k.value);
        let m = mitm::Mitm::new(mitm::Parts {
            ca_cert: (ca_cert.path.clone(), ca_cert.value[0].clone()),
            ca_key: named_key(ca_key),
            leaf_key: leaf_key.map(named_key),
            provider: provider(),
            dir: self.certcache.clone(),
            base,
            client: origin_config(self.client.config()?),
        })?;
        Ok(Some(Arc::new(m)))
    }
}

/// TLS towards parents, and under `ssl_cli` with `ssl_client_mode` 0-2
/// towards the destination itself, as a service has it: the
/// configuration and the name to ask for.
#[derive(Debug)]
pub struct Client {
    pub config: Arc<rustls::ClientConfig>,
    /// `ssl_cli` with mode 0, 1 or 2: the connection to the destination
    /// is TLS (after the chain, if any).
    pub to_server: bool,
    settings: ClientSettings,
}

impl Client {
    /// The name to ask the parent at `host` for (see
    /// [`ClientSettings::server_name`]).
    pub fn server_name(&self, host: &str) -> Option<rustls::pki_types::ServerName<'static>> {
        self.settings.server_name(host)
    }

    /// `ssl_client_mode`: 0 and 1 handshake with the destination as soon
    /// as it is reached, 2 only in a tunnel, once the client was told it
    /// is open.
    pub fn mode(&self) -> u8 {
        self.settings.mode
    }
}

/// Why `ssl_cli` to the server cannot serve a service (3proxy's ssl.c
/// applies it to every service that connects; some make no sense).
fn to_server_refused(service: &str, mode: u8) -> Option<String> {
    let why = match service {
        "pop3p" | "imapp" | "smtpp" | "ftppr" if mode == 2 => format!(
            "ssl_client_mode 2 handshakes just before the data, which for {service} is after \
             the login it has relayed in clear (as in 3proxy), so no server follows it; use \
             ssl_client_mode 0 or 1 (TLS as soon as the server is reached)"
        ),
        _ => return None,
    };
    Some(why)
}

impl Settings {
    /// The TLS towards parents and servers a TCP service takes at its
    /// line: Some when it has a parent whose type ends in `s`
    /// (`tls_hops`) or `ssl_cli` is on. `ssl_cli` with `ssl_client_mode
    /// 3` does TLS to those parents only; with modes 0-2, TLS to the
    /// destination itself, refused by name for the services where it
    /// makes no sense (`to_server_refused`).
    pub fn client(&self, tls_hops: bool, service: &str) -> Result<Option<Arc<Client>>, String> {
        let to_server = self.cli && self.client.mode != 3;
        if to_server {
            if let Some(why) = to_server_refused(service, self.client.mode) {
                return Err(format!(
                    "ssl_cli with ssl_client_mode {} (TLS to the server) cannot serve \
                     {service}: {why}; ssl_nocli before this line (ssl_client_mode 3, TLS to \
                     parents whose type ends in s, serves every TCP service)",
                    self.client.mode
                ));
            }
        }
        if !tls_hops && !self.cli {
            return Ok(None);
        }
        Ok(Some(Arc::new(Client {
            config: self.client.config()?,
            to_server,
            settings: self.client.clone(),
        })))
    }
}

impl ClientSettings {
    /// The rustls configuration for TLS towards parents. Without
    /// `ssl_client_verify` the server's certificate is not checked, as in
    /// 3proxy (the handshake's signatures still are).
    pub fn config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        let (p, v) = suited(self.min, self.max, &self.suites13, &self.suites12)?;
        let b = rustls::ClientConfig::builder_with_provider(p)
            .with_protocol_versions(&v)
            .map_err(|e| format!("protocol versions: {e}"))?;
        let b = if self.verify {
            b.with_root_certificates(trust(&self.ca, &self.ca_dir, &self.ca_store))
        } else {
            b.dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider())))
        };
        let mut cfg = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => b
                .with_client_auth_cert(c.value.to_vec(), k.value.clone_key())
                .map_err(|e| {
                    format!(
                        "ssl_client_key '{}' cannot serve ssl_client_cert '{}': {e}",
                        k.path, c.path
                    )
                })?,
            (Some(_), None) => return Err("ssl_client_cert needs ssl_client_key".into()),
            _ => b.with_no_client_auth(),
        };
        cfg.alpn_protocols.clone_from(&self.alpn);
        Ok(Arc::new(cfg))
    }

    /// The name a parent or destination is asked for: `ssl_client_sni`,
    /// else its host as the cfg or the client wrote it (an IP sends no
    /// SNI and is checked against the certificate's IP addresses).
    pub fn server_name(&self, host: &str) -> Option<rustls::pki_types::ServerName<'static>> {
        let h = self.sni.as_deref().unwrap_or(host);
        rustls::pki_types::ServerName::try_from(h.to_string()).ok()
    }
}

/// `ssl_client_no_verify` (3proxy's default): any certificate is taken,
/// but the handshake's signatures are still checked with it.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Why a handshake with a client failed.
#[derive(Debug)]
pub enum HandshakeError {
    /// The first byte was not a TLS handshake record (plain text).
    NotTls(u8),
    /// The deadline passed.
    Timeout,
    /// The peer's certificate was missing or refused by our check (a
    /// peer that refuses ours sends an alert: that is `Failed`).
    Certificate(String),
    /// Anything else: a protocol error, the peer closed, a socket error.
    Failed(String),
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::NotTls(b) => {
                write!(
                    f,
                    "TLS handshake: the client did not speak TLS (first byte 0x{b:02x})"
                )
            }
            HandshakeError::Timeout => write!(f, "TLS handshake: timed out"),
            HandshakeError::Certificate(e) => {
                write!(f, "TLS handshake: the peer's certificate: {e}")
            }
            HandshakeError::Failed(e) => write!(f, "TLS handshake: {e}"),
        }
    }
}

/// The socket calls of a [`TlsStream`]: recv()/send() with flags, on a
/// descriptor rustls reads records from and writes records to.
struct FdIo {
    fd: RawFd,
    flags: MsgFlags,
}

impl Read for FdIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match recv(self.fd, buf, self.flags) {
                Err(Errno::EINTR) => continue,
                r => return r.map_err(io::Error::from),
            }
        }
    }
}

impl Write for FdIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        loop {
            match send(self.fd, buf, self.flags | MsgFlags::MSG_NOSIGNAL) {
                Err(Errno::EINTR) => continue,
                r => return r.map_err(io::Error::from),
            }
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct Inner {
    conn: Connection,
    /// The peer's EOF (close_notify, or the socket's end) has been seen.
    eof: bool,
}

/// A TLS session over the socket `S`. Shared references read and write,
/// as with a `TcpStream`; the rustls state sits behind a mutex that only
/// the session's own thread takes.
pub struct TlsStream<S: AsFd> {
    sock: S,
    inner: Mutex<Inner>,
}

/// A session that ends without our close_notify sent (the service closes
/// the client): send it now if the socket takes it at once, so a client
/// reading to the end sees a clean end rather than a cut.
impl<S: AsFd> Drop for TlsStream<S> {
    fn drop(&mut self) {
        let g = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        g.conn.send_close_notify();
        let mut io = FdIo {
            fd: self.sock.as_fd().as_raw_fd(),
            flags: MsgFlags::MSG_DONTWAIT,
        };
        while g.conn.wants_write() {
            if !matches!(g.conn.write_tls(&mut io), Ok(1..)) {
                break;
            }
        }
    }
}

impl<S: AsFd> std::fmt::Debug for TlsStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsStream")
    }
}

fn tls_err(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// The longest a blocking read waits to send records owed to the peer
/// when the socket has no read timeout.
const MAX_FLUSH_WAIT: Duration = Duration::from_secs(60);

/// Send every record `conn` holds within `limit` (TimedOut if not).
fn flush_within(sock: &impl AsFd, conn: &mut Connection, limit: Duration) -> io::Result<()> {
    let deadline = Instant::now() + limit;
    let mut io = FdIo {
        fd: sock.as_fd().as_raw_fd(),
        flags: MsgFlags::MSG_DONTWAIT,
    };
    while conn.wants_write() {
        match conn.write_tls(&mut io) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                wait_fd(sock, PollFlags::POLLOUT, deadline)
                    .map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Wait until `fd` is ready for `ev` or `deadline` passes.
fn wait_fd(fd: &impl AsFd, ev: PollFlags, deadline: Instant) -> Result<(), HandshakeError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HandshakeError::Timeout);
        }
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        let mut fds = [PollFd::new(fd.as_fd(), ev)];
        match poll(
            &mut fds,
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(0) | Err(Errno::EINTR) => continue,
            Ok(_) => return Ok(()),
            Err(e) => return Err(HandshakeError::Failed(e.to_string())),
        }
    }
}

fn classify(e: rustls::Error) -> HandshakeError {
    use rustls::Error as E;
    match e {
        E::NoCertificatesPresented | E::InvalidCertificate(_) | E::InvalidCertRevocationList(_) => {
            HandshakeError::Certificate(e.to_string())
        }
        e => HandshakeError::Failed(e.to_string()),
    }
}

impl<S: AsFd> TlsStream<S> {
    fn fd(&self) -> RawFd {
        self.sock.as_fd().as_raw_fd()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Accept a TLS session from a client on `sock` by `deadline`: the
    /// first byte must open a handshake record (else [`HandshakeError::NotTls`]).
    pub fn accept(
        sock: S,
        cfg: Arc<ServerConfig>,
        deadline: Instant,
    ) -> Result<TlsStream<S>, HandshakeError> {
        let fd = sock.as_fd().as_raw_fd();
        let mut first = [0u8; 1];
        loop {
            wait_fd(&sock, PollFlags::POLLIN, deadline)?;
            match recv(fd, &mut first, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
                Ok(0) => return Err(HandshakeError::Failed("the client closed".into())),
                Ok(_) => break,
                Err(Errno::EAGAIN | Errno::EINTR) => continue,
                Err(e) => return Err(HandshakeError::Failed(e.to_string())),
            }
        }
        if first[0] != 0x16 {
            return Err(HandshakeError::NotTls(first[0]));
        }
        let conn = ServerConnection::new(cfg).map_err(|e| HandshakeError::Failed(e.to_string()))?;
        TlsStream::handshake(sock, Connection::Server(conn), deadline)
    }

    /// [`TlsStream::accept`] of a client whose first records (`hello`,
    /// its ClientHello) were read off the socket already (`tlspr`, which
    /// routes by the SNI in them): the session takes them first.
    pub fn accept_after(
        sock: S,
        cfg: Arc<ServerConfig>,
        hello: &[u8],
        deadline: Instant,
    ) -> Result<TlsStream<S>, HandshakeError> {
        if hello.first() != Some(&0x16) {
            return Err(HandshakeError::NotTls(hello.first().copied().unwrap_or(0)));
        }
        let mut conn =
            ServerConnection::new(cfg).map_err(|e| HandshakeError::Failed(e.to_string()))?;
        let mut rest = hello;
        while !rest.is_empty() {
            match conn.read_tls(&mut rest) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => return Err(HandshakeError::Failed(e.to_string())),
            }
            conn.process_new_packets().map_err(classify)?;
        }
        TlsStream::handshake(sock, Connection::Server(conn), deadline)
    }

    /// Open a TLS session to a server (a parent whose type ends in `s`)
    /// on `sock` by `deadline`, as `name` (SNI and the certificate check).
    pub fn connect(
        sock: S,
        cfg: Arc<rustls::ClientConfig>,
        name: rustls::pki_types::ServerName<'static>,
        deadline: Instant,
    ) -> Result<TlsStream<S>, HandshakeError> {
        let conn = rustls::ClientConnection::new(cfg, name)
            .map_err(|e| HandshakeError::Failed(e.to_string()))?;
        TlsStream::handshake(sock, Connection::Client(conn), deadline)
    }

    fn handshake(
        sock: S,
        mut conn: Connection,
        deadline: Instant,
    ) -> Result<TlsStream<S>, HandshakeError> {
        let fd = sock.as_fd().as_raw_fd();
        let mut io = FdIo {
            fd,
            flags: MsgFlags::MSG_DONTWAIT,
        };
        let mut eof = false;
        while conn.is_handshaking() || conn.wants_write() {
            if conn.wants_write() {
                match conn.write_tls(&mut io) {
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        wait_fd(&sock, PollFlags::POLLOUT, deadline)?;
                        continue;
                    }
                    Err(e) => return Err(HandshakeError::Failed(e.to_string())),
                }
            }
            match conn.read_tls(&mut io) {
                Ok(0) => {
                    eof = true;
                    if conn.is_handshaking() {
                        return Err(HandshakeError::Failed("the peer closed".into()));
                    }
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    wait_fd(&sock, PollFlags::POLLIN, deadline)?;
                    continue;
                }
                Err(e) => return Err(HandshakeError::Failed(e.to_string())),
            }
            if let Err(e) = conn.process_new_packets() {
                // Tell the peer why (the alert rustls queued), briefly.
                let _ = conn.write_tls(&mut io);
                return Err(classify(e));
            }
        }
        Ok(TlsStream {
            sock,
            inner: Mutex::new(Inner { conn, eof }),
        })
    }

    /// The socket under the session.
    pub fn socket(&self) -> &S {
        &self.sock
    }

    /// Plaintext is waiting in the session: a read returns at once.
    pub fn buffered(&self) -> bool {
        let mut g = self.lock();
        matches!(g.conn.reader().fill_buf(), Ok(b) if !b.is_empty())
    }

    /// A read returns at once without the socket: plaintext is waiting,
    /// or the peer's end (its close_notify, or the socket's end) came in
    /// with the records a read took. The socket then need not be readable
    /// again (a server may send its last data and close_notify together
    /// and wait for ours before it closes).
    pub fn ready(&self) -> bool {
        let mut g = self.lock();
        let eof = g.eof;
        match g.conn.reader().fill_buf() {
            Ok(_) => true,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => eof,
            Err(_) => true,
        }
    }

    /// Records are waiting to be sent (a non-blocking write left them).
    pub fn wants_write(&self) -> bool {
        self.lock().conn.wants_write()
    }

    /// Read plaintext into `buf` (or, with `peek`, look at it without
    /// consuming). Non-blocking (`nonblock`): WouldBlock when nothing can
    /// be had now; else the socket's read timeout bounds each wait.
    /// Ok(0) is the peer's end. As many bytes as are there without
    /// waiting: a short count means nothing more can be read now.
    pub fn read_plain(&self, buf: &mut [u8], nonblock: bool, peek: bool) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut g = self.lock();
        let mut got = 0;
        let mut io = FdIo {
            fd: self.fd(),
            flags: MsgFlags::MSG_DONTWAIT,
        };
        loop {
            let Inner { conn, eof } = &mut *g;
            if !peek || got == 0 {
                match conn.reader().fill_buf() {
                    Ok(b) if !b.is_empty() => {
                        let n = b.len().min(buf.len() - got);
                        buf[got..got + n].copy_from_slice(&b[..n]);
                        if peek {
                            return Ok(n);
                        }
                        conn.reader().consume(n);
                        got += n;
                        if got == buf.len() {
                            return Ok(got);
                        }
                        continue;
                    }
                    // A clean close_notify, or the socket's end.
                    Ok(_) => return Ok(got),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    // The peer closed without close_notify: an end too.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(got),
                    Err(e) => return Err(e),
                }
            }
            if *eof {
                return Ok(got);
            }
            // Records the session owes the peer (the rest of an answer a
            // non-blocking write left, a key update's reply): send what
            // goes now; before a blocking read, all of it, since the peer
            // may be waiting for it before it sends anything, within the
            // socket's read timeout (the wait this read would take).
            if conn.wants_write() {
                let _ = conn.write_tls(&mut io);
                if !nonblock && got == 0 && conn.wants_write() {
                    let limit = socket2::SockRef::from(&self.sock)
                        .read_timeout()
                        .ok()
                        .flatten()
                        .unwrap_or(MAX_FLUSH_WAIT);
                    flush_within(&self.sock, conn, limit)?;
                }
            }
            // Once some bytes are in hand, only what is there now.
            io.flags = if nonblock || got > 0 {
                MsgFlags::MSG_DONTWAIT
            } else {
                MsgFlags::empty()
            };
            match conn.read_tls(&mut io) {
                Ok(0) => *eof = true,
                Ok(_) => {}
                Err(e) if got > 0 && e.kind() == io::ErrorKind::WouldBlock => return Ok(got),
                Err(e) => return Err(e),
            }
            io.flags = MsgFlags::MSG_DONTWAIT;
            if let Err(e) = conn.process_new_packets() {
                let _ = conn.write_tls(&mut io);
                return Err(tls_err(e));
            }
        }
    }

    /// Send every record the session holds within `limit`.
    pub fn flush_within(&self, limit: Duration) -> io::Result<()> {
        let mut g = self.lock();
        flush_within(&self.sock, &mut g.conn, limit)
    }

    /// Send records waiting in the session. Non-blocking: WouldBlock if
    /// some are left.
    pub fn flush_tls(&self, nonblock: bool) -> io::Result<()> {
        let mut g = self.lock();
        self.flush_locked(&mut g, nonblock)
    }

    fn flush_locked(&self, g: &mut Inner, nonblock: bool) -> io::Result<()> {
        let mut io = FdIo {
            fd: self.fd(),
            flags: if nonblock {
                MsgFlags::MSG_DONTWAIT
            } else {
                MsgFlags::empty()
            },
        };
        while g.conn.wants_write() {
            if g.conn.write_tls(&mut io)? == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
        }
        Ok(())
    }

    /// Write plaintext: what the session takes (its buffer limit) is
    /// encrypted and as much sent as the socket takes. Blocking: every
    /// record is sent before returning. Non-blocking: WouldBlock while
    /// earlier records wait; records of this call may stay behind
    /// ([`TlsStream::wants_write`]).
    pub fn write_plain(&self, bufs: &[IoSlice<'_>], nonblock: bool) -> io::Result<usize> {
        let mut g = self.lock();
        self.flush_locked(&mut g, nonblock)?;
        let n = g.conn.writer().write_vectored(bufs)?;
        match self.flush_locked(&mut g, nonblock) {
            Err(e) if nonblock && e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        Ok(n)
    }

    /// End our direction: close_notify, sent within `limit`.
    pub fn close_notify(&self, limit: Duration) {
        let mut g = self.lock();
        g.conn.send_close_notify();
        let deadline = Instant::now() + limit;
        loop {
            match self.flush_locked(&mut g, true) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if wait_fd(&self.sock, PollFlags::POLLOUT, deadline).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    }
}
