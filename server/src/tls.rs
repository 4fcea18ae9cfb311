//! TLS on the `https://` client listeners: the server configuration built from etcd's flags
//! (`--cert-file`, `--key-file`, `--trusted-ca-file`, `--client-cert-auth`, `--auto-tls`),
//! the handshake of each accepted connection, and the identity of a verified client
//! certificate.
//!
//! Owns: reading and checking the certificate and key files at start, the `--auto-tls`
//! certificate under the data directory, the rustls server configuration (ring provider,
//! TLS 1.2 and 1.3, ALPN `h2` then `http/1.1`), and the common-name reader.
//!
//! Invariants:
//! - TLS-1: every file flag is read and checked at start; a configuration kvd cannot serve
//!   (a missing or unreadable file, a file without a PEM certificate or key, a key that does
//!   not match the certificate, an `https://` URL without a certificate or `--auto-tls`,
//!   `--client-cert-auth` without `--trusted-ca-file`, `--cert-file` without `--key-file` or
//!   the reverse) stops the start with a message naming the flag and the file.
//! - TLS-2: when `--trusted-ca-file` is given, every TLS client must present a certificate
//!   that chains to one of its CAs, or the handshake fails; as in etcd, this holds with or
//!   without `--client-cert-auth`. Without it, no client certificate is asked for.
//! - TLS-3: the handshake runs in the connection's own task, after the connection took its
//!   slot (CONN-1), and is bounded by the header timeout (CONN-2), so a client that stalls
//!   in the handshake never blocks the accept loop and holds its slot for a bounded time.
//! - TLS-4: with `--client-cert-auth`, every request of a connection whose client presented
//!   a verified certificate carries a [`ClientCertificate`] request extension with the
//!   certificate's common name (etcd's rule: with auth enabled, that name is the user when
//!   the request has no token). Without `--client-cert-auth` no request carries one, so a
//!   verified certificate never names a user by accident. The JSON gateway's calls into
//!   the gRPC services are new requests without it, as etcd ignores the certificate
//!   identity of gateway requests.
//! - TLS-5: the common-name reader is total: a certificate it cannot read gives `None`.
//!
//! Contact points: `server::run` calls [`configure`] before the engine opens (so a bad TLS
//! flag leaves no database behind);
//! `server::connections` calls [`Tls::handshake`] for connections of `https://` listeners
//! and sets [`ClientCertificate`] on their requests; request handlers read it with
//! `request.extensions().get::<ClientCertificate>()` (tonic) or axum's `Extension`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::ServerError;
use kvd::sync::Arc;

/// The ALPN protocols offered, in order of preference: gRPC needs `h2`; HTTP/1.1 clients
/// (curl on `/health`) get `http/1.1`.
const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];
/// Where `--auto-tls` keeps its certificate and key, under the data directory (etcd's
/// place).
const AUTO_TLS_DIR: &str = "fixtures/client";
/// How long an `--auto-tls` certificate is valid (etcd's 365 days).
const AUTO_TLS_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// The organization of an `--auto-tls` certificate's subject.
const AUTO_TLS_ORGANIZATION: &str = "kvd";
/// DER tags read by [`common_name`].
const DER_SEQUENCE: u8 = 0x30;
const DER_SET: u8 = 0x31;
const DER_OID: u8 = 0x06;
const DER_VERSION: u8 = 0xa0;
/// The string types a common name is read from (UTF8String, NumericString,
/// PrintableString, TeletexString, IA5String), as Go's certificate parser reads them.
const DER_STRINGS: [u8; 5] = [0x0c, 0x12, 0x13, 0x14, 0x16];
/// The object identifier of the common name attribute (2.5.4.3).
const OID_COMMON_NAME: [u8; 3] = [0x55, 0x04, 0x03];

/// etcd's TLS flags, as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFlags {
    /// The server's certificate chain, PEM (`--cert-file`).
    pub cert_file: Option<PathBuf>,
    /// The server certificate's private key, PEM (`--key-file`).
    pub key_file: Option<PathBuf>,
    /// The CAs client certificates must chain to, PEM (`--trusted-ca-file`, TLS-2).
    pub trusted_ca_file: Option<PathBuf>,
    /// Client certificates are required and their common name identifies the caller
    /// (`--client-cert-auth`, TLS-4).
    pub client_cert_auth: bool,
    /// Serve a self-signed certificate generated at start when no `--cert-file` is given
    /// (`--auto-tls`).
    pub auto_tls: bool,
}

/// The verified client certificate of a connection, as a request extension (TLS-4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCertificate {
    /// The subject's common name, `None` if the certificate has none (or none kvd can read
    /// as text).
    pub common_name: Option<String>,
}

/// The TLS side of the `https://` listeners.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
    client_cert_auth: bool,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("client_cert_auth", &self.client_cert_auth)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Runs the server side of the handshake on `stream` and returns the encrypted stream
    /// and, with `--client-cert-auth`, the client's certificate (TLS-4).
    pub async fn handshake(
        &self,
        stream: TcpStream,
    ) -> io::Result<(TlsStream<TcpStream>, Option<ClientCertificate>)> {
        let stream = self.acceptor.accept(stream).await?;
        let certificate = if self.client_cert_auth {
            stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| ClientCertificate {
                    common_name: common_name(leaf.as_ref()),
                })
        } else {
            None
        };
        Ok((stream, certificate))
    }
}

/// Returns the TLS configuration of the `https://` URLs among `listen_urls`, `None` when
/// there are none, or the start error that names the flag and file at fault (TLS-1).
/// `--auto-tls` writes (or reuses) its certificate under `data_dir`.
pub fn configure(
    flags: &TlsFlags,
    listen_urls: &[String],
    data_dir: &Path,
) -> Result<Option<Arc<Tls>>, ServerError> {
    let https: Vec<&String> = listen_urls
        .iter()
        .filter(|url| url.starts_with("https://"))
        .collect();
    check_flag_pairs(flags)?;
    let Some(first_https) = https.first() else {
        if flags.cert_file.is_some() || flags.trusted_ca_file.is_some() || flags.auto_tls {
            // etcd starts too, and says the same.
            tracing::warn!(
                "no https:// client URL: --cert-file, --key-file, --trusted-ca-file, \
                 --client-cert-auth and --auto-tls are ignored"
            );
        }
        return Ok(None);
    };
    let identity = server_identity(flags, &https, data_dir)?.ok_or_else(|| {
        ServerError::Config(format!(
            "TLS key/cert (--cert-file, --key-file) must be provided for client url \
             {first_https} with HTTPS scheme (or give --auto-tls for a self-signed one)"
        ))
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| ServerError::Config(format!("TLS protocol versions: {e}")))?;
    let builder = match &flags.trusted_ca_file {
        Some(ca) => {
            let roots = read_roots(ca)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| {
                    ServerError::Config(format!("--trusted-ca-file {}: {e}", ca.display()))
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let ServerIdentity {
        chain,
        key,
        cert_source,
        key_source,
    } = identity;
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| mismatch_error(&e, &cert_source, &key_source))?;
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    tracing::info!(
        client_certificates_required = flags.trusted_ca_file.is_some(),
        client_cert_auth = flags.client_cert_auth,
        auto_tls = flags.cert_file.is_none(),
        "TLS on the https:// client URLs"
    );
    Ok(Some(Arc::new(Tls {
        acceptor: TlsAcceptor::from(Arc::new(config)),
        client_cert_auth: flags.client_cert_auth,
    })))
}

/// The server's certificate chain and key, and where each came from (a flag and its file)
/// for the messages of TLS-1.
struct ServerIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    cert_source: (&'static str, PathBuf),
    key_source: (&'static str, PathBuf),
}

/// Reads the server's certificate and key from `--cert-file` and `--key-file`, or from the
/// `--auto-tls` files (made first if missing); `None` if neither is asked for.
fn server_identity(
    flags: &TlsFlags,
    https: &[&String],
    data_dir: &Path,
) -> Result<Option<ServerIdentity>, ServerError> {
    let (cert_source, key_source) = match (&flags.cert_file, &flags.key_file) {
        (Some(cert), Some(key)) => {
            if flags.auto_tls {
                tracing::warn!("--cert-file is given: --auto-tls is ignored");
            }
            (("--cert-file", cert.clone()), ("--key-file", key.clone()))
        }
        _ if flags.auto_tls => {
            let (cert, key) = auto_tls_files(https, data_dir)?;
            (("--auto-tls certificate", cert), ("--auto-tls key", key))
        }
        _ => return Ok(None),
    };
    Ok(Some(ServerIdentity {
        chain: read_certificates(cert_source.0, &cert_source.1)?,
        key: read_key(key_source.0, &key_source.1)?,
        cert_source,
        key_source,
    }))
}

/// Returns the start error for a certificate and key rustls refused together.
fn mismatch_error(
    error: &rustls::Error,
    (cert_flag, cert): &(&str, PathBuf),
    (key_flag, key): &(&str, PathBuf),
) -> ServerError {
    match error {
        rustls::Error::InconsistentKeys(_) => ServerError::Config(format!(
            "{key_flag} {} does not match the certificate of {cert_flag} {} \
             (tls: private key does not match public key)",
            key.display(),
            cert.display()
        )),
        other => ServerError::Config(format!(
            "{cert_flag} {} with {key_flag} {}: {other}",
            cert.display(),
            key.display()
        )),
    }
}

/// Refuses flags that only make sense together (TLS-1).
fn check_flag_pairs(flags: &TlsFlags) -> Result<(), ServerError> {
    match (&flags.cert_file, &flags.key_file) {
        (Some(cert), None) => {
            return Err(ServerError::Config(format!(
                "--cert-file {} is given without --key-file (its private key)",
                cert.display()
            )));
        }
        (None, Some(key)) => {
            return Err(ServerError::Config(format!(
                "--key-file {} is given without --cert-file (its certificate)",
                key.display()
            )));
        }
        _ => {}
    }
    if flags.client_cert_auth && flags.trusted_ca_file.is_none() {
        return Err(ServerError::Config(
            "--client-cert-auth needs --trusted-ca-file (the CAs that sign the client \
             certificates)"
                .into(),
        ));
    }
    Ok(())
}

/// Reads `path` for `flag`, with a message naming both when it cannot.
fn read_file(flag: &str, path: &Path) -> Result<Vec<u8>, ServerError> {
    fs::read(path).map_err(|e| ServerError::Config(format!("{flag} {}: {e}", path.display())))
}

/// Reads the PEM certificates of `path` (at least one).
fn read_certificates(flag: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, ServerError> {
    let pem = read_file(flag, path)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            ServerError::Config(format!(
                "{flag} {}: not a PEM certificate file ({e})",
                path.display()
            ))
        })?;
    if chain.is_empty() {
        return Err(ServerError::Config(format!(
            "{flag} {}: no PEM certificate (-----BEGIN CERTIFICATE-----) in the file",
            path.display()
        )));
    }
    Ok(chain)
}

/// Reads the PEM private key of `path` (PKCS#8, PKCS#1 or SEC1).
fn read_key(flag: &str, path: &Path) -> Result<PrivateKeyDer<'static>, ServerError> {
    let pem = read_file(flag, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        let why = match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no PEM private key (-----BEGIN PRIVATE KEY-----) in the file".to_owned()
            }
            other => format!("not a PEM private key file ({other})"),
        };
        ServerError::Config(format!("{flag} {}: {why}", path.display()))
    })
}

/// Reads the CAs of `--trusted-ca-file` (at least one usable).
fn read_roots(path: &Path) -> Result<RootCertStore, ServerError> {
    let flag = "--trusted-ca-file";
    let certificates = read_certificates(flag, path)?;
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(certificates);
    if added == 0 {
        return Err(ServerError::Config(format!(
            "{flag} {}: none of its {ignored} certificates is a usable CA certificate",
            path.display()
        )));
    }
    if ignored > 0 {
        tracing::warn!(file = %path.display(), ignored, "--trusted-ca-file: certificates ignored");
    }
    Ok(roots)
}

/// Returns the `--auto-tls` certificate and key files under `data_dir`, generating them
/// first if either is missing (etcd reuses them the same way).
fn auto_tls_files(https: &[&String], data_dir: &Path) -> Result<(PathBuf, PathBuf), ServerError> {
    let dir = data_dir.join(AUTO_TLS_DIR);
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    if cert.exists() && key.exists() {
        tracing::info!(cert = %cert.display(), "--auto-tls: reusing the self-signed certificate");
        return Ok((cert, key));
    }
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        ServerError::Config(format!("--auto-tls: {what} in {}: {e}", dir.display()))
    };
    let hosts: Vec<String> = https.iter().map(|url| url_host(url)).collect();
    let (cert_pem, key_pem) =
        self_signed(hosts).map_err(|e| failed("generate the certificate", &e))?;
    fs::create_dir_all(&dir).map_err(|e| failed("create the directory", &e))?;
    write_private(&key, key_pem.as_bytes()).map_err(|e| failed("write key.pem", &e))?;
    fs::write(&cert, cert_pem).map_err(|e| failed("write cert.pem", &e))?;
    tracing::info!(cert = %cert.display(), "--auto-tls: generated a self-signed certificate");
    Ok((cert, key))
}

/// Writes `bytes` to a new file only its owner can read.
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Returns the host of `https://host:port` (brackets of an IPv6 address removed).
fn url_host(url: &str) -> String {
    let host_port = url
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_owned();
    if let Some(rest) = host_port.strip_prefix('[')
        && let Some((host, _)) = rest.split_once(']')
    {
        return host.to_owned();
    }
    match host_port.rsplit_once(':') {
        Some((host, _port)) => host.to_owned(),
        None => host_port,
    }
}

/// Returns a self-signed certificate for `hosts` (IP addresses as IP SANs, names as DNS
/// SANs) and its key, both PEM: ECDSA P-256, valid [`AUTO_TLS_VALIDITY`] from now, for
/// server authentication. (etcd uses P-521, which the ring provider does not sign with.)
fn self_signed(hosts: Vec<String>) -> Result<(String, String), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(hosts)?;
    let mut subject = rcgen::DistinguishedName::new();
    subject.push(rcgen::DnType::OrganizationName, AUTO_TLS_ORGANIZATION);
    params.distinguished_name = subject;
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + since_epoch;
    params.not_after = params.not_before + AUTO_TLS_VALIDITY;
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Returns the common name of a DER certificate's subject, the last one if there are
/// several (as Go's parser does), or `None` (TLS-5).
pub fn common_name(certificate: &[u8]) -> Option<String> {
    let (DER_SEQUENCE, certificate, _) = der_element(certificate)? else {
        return None;
    };
    let (DER_SEQUENCE, tbs, _) = der_element(certificate)? else {
        return None;
    };
    let mut fields = tbs;
    let (tag, _, after_version) = der_element(fields)?;
    if tag == DER_VERSION {
        fields = after_version;
    }
    // serialNumber, signature, issuer and validity come before the subject.
    for _ in 0..4 {
        fields = der_element(fields)?.2;
    }
    let (DER_SEQUENCE, mut names, _) = der_element(fields)? else {
        return None;
    };
    let mut found = None;
    // Each element read consumes at least two bytes, so both loops end.
    while !names.is_empty() {
        let (DER_SET, mut attributes, rest) = der_element(names)? else {
            return None;
        };
        names = rest;
        while !attributes.is_empty() {
            let (DER_SEQUENCE, attribute, rest) = der_element(attributes)? else {
                return None;
            };
            attributes = rest;
            let (DER_OID, oid, value) = der_element(attribute)? else {
                return None;
            };
            let (tag, text, _) = der_element(value)?;
            if oid == OID_COMMON_NAME
                && DER_STRINGS.contains(&tag)
                && let Ok(text) = std::str::from_utf8(text)
            {
                found = Some(text.to_owned());
            }
        }
    }
    found
}

/// Splits one DER element off the front of `input`: its tag, its contents and what
/// follows. `None` if the bytes are not a complete element with a low tag number.
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (length, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, rest) = rest.split_at(count);
        let length = bytes
            .iter()
            .fold(0usize, |length, byte| (length << 8) | usize::from(*byte));
        (length, rest)
    };
    if rest.len() < length {
        return None;
    }
    let (contents, rest) = rest.split_at(length);
    Some((tag, contents, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate_with(names: &[(rcgen::DnType, &str)]) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        let mut subject = rcgen::DistinguishedName::new();
        for (kind, value) in names {
            subject.push(kind.clone(), *value);
        }
        params.distinguished_name = subject;
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn common_name_is_read_from_the_subject() {
        let der = certificate_with(&[
            (rcgen::DnType::OrganizationName, "kvd"),
            (rcgen::DnType::CommonName, "alice"),
        ]);
        assert_eq!(common_name(&der).as_deref(), Some("alice"));
        let without = certificate_with(&[(rcgen::DnType::OrganizationName, "kvd")]);
        assert_eq!(common_name(&without), None);
    }

    #[test]
    fn common_name_reader_is_total() {
        let der = certificate_with(&[(rcgen::DnType::CommonName, "bob")]);
        for cut in 0..der.len() {
            // Every prefix is well defined (TLS-5); most are `None`.
            let _ = common_name(&der[..cut]);
        }
        let mut flipped = der.clone();
        for at in 0..flipped.len() {
            flipped[at] ^= 0xff;
            let _ = common_name(&flipped);
            flipped[at] ^= 0xff;
        }
        assert_eq!(common_name(&[]), None);
        assert_eq!(common_name(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }

    #[test]
    fn url_hosts_lose_port_and_brackets() {
        assert_eq!(url_host("https://127.0.0.1:2379"), "127.0.0.1");
        assert_eq!(url_host("https://localhost:0/"), "localhost");
        assert_eq!(url_host("https://[::1]:2379"), "::1");
    }

    #[test]
    fn flags_that_go_together_are_checked() {
        let alone = TlsFlags {
            client_cert_auth: true,
            ..TlsFlags::default()
        };
        let message = check_flag_pairs(&alone).unwrap_err().to_string();
        assert!(message.contains("--trusted-ca-file"), "{message}");
        let cert_only = TlsFlags {
            cert_file: Some("server.crt".into()),
            ..TlsFlags::default()
        };
        let message = check_flag_pairs(&cert_only).unwrap_err().to_string();
        assert!(message.contains("--key-file"), "{message}");
    }
}
