//! `ssl_mitm`: the certificates served to clients in place of the
//! origin's. For each destination name the client asked for, one leaf
//! certificate signed by the cfg's CA (`ssl_server_ca_file` and
//! `ssl_server_ca_key`, or `3proxy.pem` and `3proxy.key` in the
//! `ssl_certcache` directory) is made with rcgen, kept in memory (at most
//! [`MEMORY_CERTS`] names) and, with `ssl_certcache`, in a file there
//! (`NAME.pem`, written whole under a temporary name and renamed, mode
//! 0600) that a later start reuses while it is signed by the same CA, for
//! the same key, and valid for [`RENEW_BEFORE`] more.
//!
//! Every leaf carries the same public key, as in 3proxy: `ssl_server_key`,
//! else `server.key` in the cache directory, else the CA's own key; only
//! the certificate is made per name.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

/// Names whose certificates are kept in memory; past it, one is dropped
/// for each new one (the cache directory still has it).
pub const MEMORY_CERTS: usize = 1024;
/// How long a new leaf is valid (it starts a day back, for clocks behind).
const LEAF_VALID: Duration = Duration::from_secs(365 * 86400);
/// A cached leaf valid for less than this more is made anew.
pub const RENEW_BEFORE: Duration = Duration::from_secs(30 * 86400);

/// The CA, the leaf key and the certificates made so far: one per service
/// line under `ssl_mitm`, shared by its client threads.
pub struct Mitm {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    provider: Arc<rustls::crypto::CryptoProvider>,
    leaf_key: rcgen::KeyPair,
    signer: Arc<dyn rustls::sign::SigningKey>,
    /// Checks a cached leaf: signed by our CA, for its name, valid.
    check: Arc<rustls::client::WebPkiServerVerifier>,
    dir: Option<PathBuf>,
    certs: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    /// The server side's protocol settings; each session gets a copy
    /// serving its leaf.
    base: ServerConfig,
    /// TLS to the origin: the `ssl_client_*` settings.
    pub client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Mitm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mitm").field("dir", &self.dir).finish()
    }
}

/// A file the cfg named, read: its path (for messages) and its value.
pub type Named<T> = (String, T);

/// What a [`Mitm`] is made of, as the cfg named it (files already read).
/// Nothing here imports from `tls`, which builds it.
pub struct Parts {
    /// The CA's certificate (the first of its file).
    pub ca_cert: Named<CertificateDer<'static>>,
    pub ca_key: Named<Arc<PrivateKeyDer<'static>>>,
    /// The key every leaf carries; None: the CA's key.
    pub leaf_key: Option<Named<Arc<PrivateKeyDer<'static>>>>,
    pub dir: Option<PathBuf>,
    pub base: ServerConfig,
    pub client: Arc<rustls::ClientConfig>,
    pub provider: Arc<rustls::crypto::CryptoProvider>,
}

/// An rcgen key from a PEM key the cfg named: PKCS#8 only (what ring
/// signs with), else an error saying how to convert it.
fn key_pair(key: &Named<Arc<PrivateKeyDer<'static>>>) -> Result<rcgen::KeyPair, String> {
    let (path, key) = key;
    match &**key {
        PrivateKeyDer::Pkcs8(k) => rcgen::KeyPair::try_from(k.secret_pkcs8_der())
            .map_err(|e| format!("'{path}': not a key ssl_mitm can sign with: {e}")),
        _ => Err(format!(
            "'{path}' is a PKCS#1 or SEC1 key; ssl_mitm takes PKCS#8 (\"BEGIN PRIVATE KEY\"): \
             convert it with openssl pkcs8 -topk8 -nocrypt -in {path}"
        )),
    }
}

/// The cache file of `name` in `dir`: the name in lower case (a DNS name
/// or an IP address has no `/`), `.pem`.
fn cache_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.pem"))
}

/// A name as a certificate carries it: brackets off an IPv6 literal, a
/// DNS name in lower case, an IP address in its canonical form. None if
/// it is neither.
pub fn leaf_name(host: &str) -> Option<String> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    match ServerName::try_from(h.to_ascii_lowercase()).ok()? {
        ServerName::DnsName(d) => Some(d.as_ref().to_string()),
        ServerName::IpAddress(ip) => Some(std::net::IpAddr::from(ip).to_string()),
        _ => None,
    }
}

/// The resolver of the base configuration: every session replaces it.
#[derive(Debug)]
pub struct NoCert;

impl ResolvesServerCert for NoCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        None
    }
}

#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

static TMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl Mitm {
    pub fn new(p: Parts) -> Result<Mitm, String> {
        let provider = p.provider.clone();
        let ca_der = p.ca_cert.1.clone();
        let ca_pair = key_pair(&p.ca_key)?;
        let issuer = rcgen::Issuer::from_ca_cert_der(&ca_der, ca_pair).map_err(|e| {
            format!(
                "ssl_mitm: '{}' is not a CA certificate rcgen can sign with: {e}",
                p.ca_cert.0
            )
        })?;
        let leaf = p.leaf_key.as_ref().unwrap_or(&p.ca_key);
        let leaf_key = key_pair(leaf)?;
        let signer = provider
            .key_provider
            .load_private_key(leaf.1.clone_key())
            .map_err(|e| format!("'{}': {e}", leaf.0))?;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(ca_der)
            .map_err(|e| format!("ssl_mitm: '{}' is not a usable CA: {e}", p.ca_cert.0))?;
        let check = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .map_err(|e| format!("ssl_mitm: {e}"))?;
        Ok(Mitm {
            issuer,
            provider,
            leaf_key,
            signer,
            check,
            dir: p.dir,
            certs: Mutex::new(HashMap::new()),
            base: p.base,
            client: p.client,
        })
    }

    /// The rustls configuration for the client of a session to `host`:
    /// the server settings, serving `host`'s leaf.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, String> {
        let name = leaf_name(host).ok_or_else(|| format!("'{host}' is not a name to certify"))?;
        let ck = self.leaf(&name)?;
        let mut cfg = self.base.clone();
        cfg.cert_resolver = Arc::new(Fixed(ck));
        Ok(Arc::new(cfg))
    }

    /// `name`'s leaf: from memory, else the cache directory, else made
    /// now (and written there). The lock is held throughout, so a name is
    /// made once however many clients ask at the same time.
    pub fn leaf(&self, name: &str) -> Result<Arc<CertifiedKey>, String> {
        let mut certs = self.certs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ck) = certs.get(name) {
            return Ok(ck.clone());
        }
        let file = self.dir.as_deref().map(|d| cache_file(d, name));
        let cached = file.as_deref().and_then(|f| self.cached(f, name));
        let ck = match cached {
            Some(ck) => ck,
            None => {
                let cert = self.make(name)?;
                if let Some(f) = &file {
                    if let Err(e) = write_atomic(f, &cert.pem()) {
                        log::warn!("ssl_certcache: cannot write '{}': {e}", f.display());
                    }
                }
                Arc::new(CertifiedKey::new(
                    vec![cert.der().clone()],
                    self.signer.clone(),
                ))
            }
        };
        if certs.len() >= MEMORY_CERTS {
            if let Some(k) = certs.keys().next().cloned() {
                certs.remove(&k);
            }
        }
        certs.insert(name.to_string(), ck.clone());
        Ok(ck)
    }

    /// A cached leaf of `name` in `file` that still serves: signed by
    /// our CA for `name`, valid [`RENEW_BEFORE`] from now, for our key.
    fn cached(&self, file: &Path, name: &str) -> Option<Arc<CertifiedKey>> {
        let der = CertificateDer::from_pem_file(file).ok()?;
        let sn = ServerName::try_from(name.to_string()).ok()?;
        let later = SystemTime::now() + RENEW_BEFORE;
        let at = UnixTime::since_unix_epoch(later.duration_since(SystemTime::UNIX_EPOCH).ok()?);
        self.check
            .verify_server_cert(&der, &[], &sn, &[], at)
            .ok()?;
        let ck = CertifiedKey::new(vec![der], self.signer.clone());
        match ck.keys_match() {
            Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => None,
            _ => Some(Arc::new(ck)),
        }
    }

    /// A new leaf for `name`, signed by the CA: the name as its only
    /// subjectAltName (and CN), serverAuth, not a CA, a random serial.
    fn make(&self, name: &str) -> Result<rcgen::Certificate, String> {
        let why =
            |e: rcgen::Error| format!("ssl_mitm: cannot make a certificate for '{name}': {e}");
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).map_err(why)?;
        let mut dn = rcgen::DistinguishedName::new();
        if name.len() <= 64 {
            dn.push(rcgen::DnType::CommonName, name);
        }
        params.distinguished_name = dn;
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + LEAF_VALID;
        let mut serial = [0u8; 16];
        self.provider
            .secure_random
            .fill(&mut serial)
            .map_err(|e| format!("ssl_mitm: no random serial: {e:?}"))?;
        // Positive and of full length.
        serial[0] = (serial[0] & 0x7f) | 0x40;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        params.signed_by(&self.leaf_key, &self.issuer).map_err(why)
    }
}

/// Write `pem` to `file` whole or not at all: a temporary file of mode
/// 0600 in the same directory, renamed over it.
fn write_atomic(file: &Path, pem: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = file.parent().unwrap_or(Path::new("."));
    let base = file.file_name().and_then(|n| n.to_str()).unwrap_or("leaf");
    let tmp = dir.join(format!(
        ".{base}.{}.{}.tmp",
        std::process::id(),
        TMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let r = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(pem.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, file)
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_names() {
        assert_eq!(
            leaf_name("WWW.Example.COM").as_deref(),
            Some("www.example.com")
        );
        assert_eq!(leaf_name("[::1]").as_deref(), Some("::1"));
        assert_eq!(leaf_name("127.0.0.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(leaf_name("a/b"), None);
        assert_eq!(leaf_name(".."), None);
    }
}
