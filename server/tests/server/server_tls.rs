//! TLS on `https://` client URLs (issue 13, TLS half): etcdctl 3.4 over TLS against kvd and
//! against Debian's etcd 3.4.23 with the same certificates, the transcripts compared;
//! client certificates (`--client-cert-auth`, and `--trusted-ca-file` alone); `--auto-tls`;
//! every bad configuration refused at start with its message; `/health` and the JSON gateway
//! through curl over HTTP/1.1 and HTTP/2; a client silent in the handshake closed after the
//! header timeout.
//!
//! The certificates are made by the test with rcgen in a temporary directory: a CA, a
//! server certificate for 127.0.0.1 and localhost, a client certificate (CN `alice`) signed
//! by the CA, and a client certificate signed by a second, foreign CA.
//!
//! Each server under test gets an `https://` listener (what etcdctl talks to) and a plain
//! `http://` one (where the test counts watchers through `/metrics`, as
//! `common::etcdctl_watch` needs); etcd serves a plain URL beside TLS ones the same way.
//!
//! Masking: the endpoint, member ids, raft term and index, database sizes, the server
//! version (kvd reports 3.6.0, etcd 3.4.23: a documented difference) and the peer URL of
//! `member list` (kvd shows a placeholder) are masked; everything else is compared as
//! printed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::common::{self, Run};

/// How long etcdctl waits to connect and for an answer in the refused cases.
const REFUSED_TIMEOUTS: [&str; 2] = ["--dial-timeout=2s", "--command-timeout=3s"];

/// The certificates of one test, in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = make_ca("kvd test CA");
        let foreign = make_ca("foreign CA");
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.crt", &ca.pem());
        write("foreign-ca.crt", &foreign.pem());
        let (cert, key) = leaf(
            &ca,
            "kvd test server",
            &["127.0.0.1", "localhost"],
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        );
        write("server.crt", &cert);
        write("server.key", &key);
        let (cert, key) = leaf(
            &ca,
            "alice",
            &[],
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        );
        write("client.crt", &cert);
        write("client.key", &key);
        let (cert, key) = leaf(&ca, "root", &[], rcgen::ExtendedKeyUsagePurpose::ClientAuth);
        write("root.crt", &cert);
        write("root.key", &key);
        let (cert, key) = leaf(
            &foreign,
            "mallory",
            &[],
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        );
        write("foreign.crt", &cert);
        write("foreign.key", &key);
        // A key that matches no certificate here.
        write(
            "other.key",
            &rcgen::KeyPair::generate().unwrap().serialize_pem(),
        );
        write("garbage.pem", "this is not PEM\n");
        Pki { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_owned()
    }

    /// The server flags of etcd and kvd for TLS with this CA's server certificate.
    fn server_flags(&self) -> Vec<String> {
        vec![
            format!("--cert-file={}", self.path("server.crt")),
            format!("--key-file={}", self.path("server.key")),
        ]
    }

    /// The server flags that require client certificates signed by the CA.
    fn client_auth_flags(&self) -> Vec<String> {
        let mut flags = self.server_flags();
        flags.push(format!("--trusted-ca-file={}", self.path("ca.crt")));
        flags.push("--client-cert-auth".to_owned());
        flags
    }

    /// etcdctl's flags: trust the CA, and present `client` (`client` or `foreign`) if
    /// given.
    fn etcdctl_flags(&self, client: Option<&str>) -> Vec<String> {
        let mut flags = vec![format!("--cacert={}", self.path("ca.crt"))];
        if let Some(name) = client {
            flags.push(format!("--cert={}", self.path(&format!("{name}.crt"))));
            flags.push(format!("--key={}", self.path(&format!("{name}.key"))));
        }
        flags
    }
}

fn make_ca(name: &str) -> rcgen::CertifiedIssuer<'static, rcgen::KeyPair> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.distinguished_name = subject(name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap()
}

/// Returns a certificate signed by `issuer` and its key, both PEM.
fn leaf(
    issuer: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    common_name: &str,
    names: &[&str],
    usage: rcgen::ExtendedKeyUsagePurpose,
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let mut params = rcgen::CertificateParams::new(names).unwrap();
    params.distinguished_name = subject(common_name);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn subject(common_name: &str) -> rcgen::DistinguishedName {
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::CommonName, common_name);
    name
}

/// A kvd or etcd with an `https://` and an `http://` client URL, killed when dropped.
struct TlsServer {
    child: Child,
    /// The `https://` client URL.
    tls: String,
    /// The plain `http://` client URL (watchers, `/metrics`).
    plain: String,
    /// etcd's peer URL (kvd shows a placeholder).
    peer: Option<String>,
    log: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl TlsServer {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts kvd on `data_dir` listening on `urls` with `flags`, and waits for its listening
/// lines (BIN-3); `Err` has the exit code and stderr when it exits instead.
// The child is waited for by `TlsServer`'s `Drop`, or before returning an error.
#[allow(clippy::zombie_processes)]
fn start_kvd(data_dir: &Path, urls: &str, flags: &[String]) -> Result<TlsServer, String> {
    let log = data_dir.with_extension("kvd.log");
    let mut child = Command::new(common::kvd_binary())
        .arg("--data-dir")
        .arg(data_dir)
        .arg(format!("--listen-client-urls={urls}"))
        .args(flags)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    let expected = urls.split(',').count();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut listening = Vec::new();
    while listening.len() < expected {
        match rx.recv_timeout(common::START_TIMEOUT) {
            Ok(line) => listening.push(line.rsplit(' ').next().unwrap_or_default().to_owned()),
            Err(_) => {
                let status = common::wait_with_timeout(&mut child, Duration::from_secs(5));
                let _ = child.kill();
                let _ = child.wait();
                let stderr = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!(
                    "kvd did not start (exit {:?}); stderr:\n{stderr}",
                    status.and_then(|s| s.code())
                ));
            }
        }
    }
    let pick = |scheme: &str| {
        listening
            .iter()
            .find(|url| url.starts_with(scheme))
            .cloned()
            .unwrap_or_default()
    };
    Ok(TlsServer {
        tls: pick("https://"),
        plain: pick("http://"),
        child,
        peer: None,
        log,
        _dir: None,
    })
}

/// Starts kvd in a fresh directory with an https:// and an http:// listener, advertising
/// the https:// one only (as the etcd of [`start_etcd_tls`]).
fn start_kvd_tls(flags: &[String]) -> TlsServer {
    let dir = tempfile::tempdir().unwrap();
    let [tls_port, plain_port] = common::free_ports();
    let tls = format!("https://127.0.0.1:{tls_port}");
    let flags = [flags, &[format!("--advertise-client-urls={tls}")]].concat();
    let mut server = start_kvd(
        &dir.path().join("data"),
        &format!("{tls},http://127.0.0.1:{plain_port}"),
        &flags,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    server._dir = Some(dir);
    server
}

/// Starts Debian's etcd 3.4 with an https:// and an http:// client URL and `flags`, and
/// waits until the plain URL's `/health` answers.
fn start_etcd_tls(flags: &[String]) -> TlsServer {
    let mut last = String::new();
    // Another process may take a port between `free_ports` and etcd's bind.
    for _ in 0..3 {
        match try_start_etcd(flags) {
            Ok(server) => return server,
            Err(log) => last = log,
        }
    }
    panic!("etcd did not become healthy; last log:\n{last}")
}

fn try_start_etcd(flags: &[String]) -> Result<TlsServer, String> {
    let dir = tempfile::tempdir().unwrap();
    let [tls_port, peer_port] = common::free_ports();
    let [plain_port, _] = common::free_ports();
    let tls = format!("https://127.0.0.1:{tls_port}");
    let plain = format!("http://127.0.0.1:{plain_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let log = dir.path().join("etcd.stderr");
    let child = Command::new("etcd")
        .arg("--data-dir")
        .arg(dir.path().join("etcd-data"))
        .args(["--name", "default"])
        .arg(format!("--listen-client-urls={tls},{plain}"))
        .arg(format!("--advertise-client-urls={tls}"))
        .arg(format!("--listen-peer-urls={peer}"))
        .arg(format!("--initial-advertise-peer-urls={peer}"))
        .arg(format!("--initial-cluster=default={peer}"))
        .args(flags)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(File::create(&log).unwrap()))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `etcd` ({e}); install it with .ci/install-deps.sh"));
    let mut server = TlsServer {
        child,
        tls,
        plain,
        peer: Some(peer),
        log,
        _dir: Some(dir),
    };
    let healthy = common::wait_until(common::START_TIMEOUT, || {
        matches!(common::http_get(&server.plain, "/health"), Ok((200, _)))
            || server.child.try_wait().unwrap().is_some()
    });
    if healthy && server.child.try_wait().unwrap().is_none() {
        Ok(server)
    } else {
        Err(server.log())
    }
}

/// Runs etcdctl against the server's TLS URL with `tls` flags and then `args`.
fn ctl(server: &TlsServer, tls: &[String], args: &[&str]) -> Run {
    let mut all: Vec<&str> = tls.iter().map(String::as_str).collect();
    all.extend_from_slice(args);
    common::etcdctl(&server.tls, &all, None)
}

/// Returns `text` with what legitimately differs between kvd and etcd masked (module doc).
fn mask(text: &str, server: &TlsServer) -> String {
    let mut text = text.replace(&server.tls, "<EP>");
    if let Some(peer) = &server.peer {
        text = text.replace(peer, "<PEER>");
    }
    text = text.replace(kvd_server::PEER_URL_PLACEHOLDER, "<PEER>");
    for key in ["cluster_id", "member_id", "raft_term"] {
        text = mask_json_number(&text, key);
    }
    text.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(", ").collect();
            match fields.as_slice() {
                // endpoint status: endpoint, id, version, size, leader, learner, term,
                // index, applied index, errors.
                [ep, _, _, _, leader, learner, _, _, _, errors] if *ep == "<EP>" => {
                    format!("<EP>, <ID>, <V>, <SIZE>, {leader}, {learner}, <T>, <I>, <A>, {errors}")
                }
                // member list: id, status, name, peer URLs, client URLs, learner.
                [_, status, name, _, clients, learner] if status.starts_with("started") => {
                    format!("<ID>, {status}, {name}, <PEER>, {clients}, {learner}")
                }
                _ => match line.split_once(" is healthy: successfully committed proposal: took = ")
                {
                    Some((ep, _)) => format!("{ep} is healthy: took <D>"),
                    None => line.to_owned(),
                },
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn mask_json_number(text: &str, key: &str) -> String {
    let pattern = format!("\"{key}\":");
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(&pattern) {
        let after = at + pattern.len();
        out.push_str(&rest[..after]);
        let tail = &rest[after..];
        let digits = tail
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(tail.len());
        out.push_str("<N>");
        rest = &tail[digits..];
    }
    out.push_str(rest);
    out
}

/// The last line of stderr that is etcdctl's verdict: `Error: ...`, or the line of
/// `endpoint health` (printed on stderr). The JSON retry warnings before it carry
/// timestamps.
fn error_line(stderr: &str) -> String {
    stderr
        .lines()
        .rfind(|line| line.starts_with("Error:") || line.contains(" is healthy: "))
        .unwrap_or_default()
        .to_owned()
}

/// One step's masked outcome: the command, exit code, stdout and the error line.
fn outcome(name: &str, run: &Run, server: &TlsServer) -> String {
    format!(
        "$ {name}\nexit {}\n{}\n{}\n",
        run.code,
        mask(&run.stdout, server).trim_end(),
        mask(&error_line(&run.stderr), server)
    )
}

/// The TLS scenario (server certificate only): put, get (simple and JSON), a watch that
/// sees one put, del, endpoint status, endpoint health and member list, over `https://`.
fn tls_scenario(server: &TlsServer, pki: &Pki) -> String {
    let tls = pki.etcdctl_flags(None);
    let mut transcript = String::new();
    for args in [
        &["put", "greeting", "hello"][..],
        &["get", "greeting"],
        &["get", "greeting", "-w", "json"],
    ] {
        transcript.push_str(&outcome(&args.join(" "), &ctl(server, &tls, args), server));
    }
    let mut watch_args: Vec<&str> = tls.iter().map(String::as_str).collect();
    watch_args.extend(["watch", "greeting"]);
    let watched = common::etcdctl_watch_counted(
        &server.tls,
        &server.plain,
        &watch_args,
        || {
            let run = ctl(server, &tls, &["put", "greeting", "again"]);
            assert_eq!(run.stdout, "OK\n", "{run:?}");
        },
        |out| out.contains("again"),
    );
    transcript.push_str(&outcome("watch greeting", &watched, server));
    for args in [
        &["del", "greeting"][..],
        &["endpoint", "status"],
        &["endpoint", "health"],
        &["member", "list"],
    ] {
        transcript.push_str(&outcome(&args.join(" "), &ctl(server, &tls, args), server));
    }
    transcript
}

/// What the TLS scenario prints on etcd 3.4.23 (and must print on kvd).
const TLS_SCENARIO_EXPECTED: &str = "$ put greeting hello\nexit 0\nOK\n\n\
$ get greeting\nexit 0\ngreeting\nhello\n\n\
$ get greeting -w json\nexit 0\n{\"header\":{\"cluster_id\":<N>,\"member_id\":<N>,\"revision\":2,\"raft_term\":<N>},\"kvs\":[{\"key\":\"Z3JlZXRpbmc=\",\"create_revision\":2,\"mod_revision\":2,\"version\":1,\"value\":\"aGVsbG8=\"}],\"count\":1}\n\n\
$ watch greeting\nexit -1\nPUT\ngreeting\nagain\n\n\
$ del greeting\nexit 0\n1\n\n\
$ endpoint status\nexit 0\n<EP>, <ID>, <V>, <SIZE>, true, false, <T>, <I>, <A>,\n\n\
$ endpoint health\nexit 0\n\n<EP> is healthy: took <D>\n\
$ member list\nexit 0\n<ID>, started, default, <PEER>, <EP>, false\n\n";

#[test]
fn etcdctl_over_tls_matches_etcd() {
    let pki = Pki::new();
    let kvd = start_kvd_tls(&pki.server_flags());
    assert!(kvd.tls.starts_with("https://127.0.0.1:"), "{}", kvd.tls);
    let kvd_transcript = tls_scenario(&kvd, &pki);
    let etcd = start_etcd_tls(&pki.server_flags());
    let etcd_transcript = tls_scenario(&etcd, &pki);
    assert_eq!(
        etcd_transcript, TLS_SCENARIO_EXPECTED,
        "etcd 3.4.23 changed"
    );
    assert_eq!(
        kvd_transcript,
        etcd_transcript,
        "kvd differs from etcd over TLS; kvd log:\n{}",
        kvd.log()
    );
}

/// The client-certificate scenario: with the CA's client certificate, put and get work;
/// without a certificate, with the foreign CA's, and in plain text on the TLS port, the
/// client is refused at the handshake (etcdctl: `context deadline exceeded`).
fn client_cert_scenario(server: &TlsServer, pki: &Pki) -> String {
    let mut transcript = String::new();
    let good = pki.etcdctl_flags(Some("client"));
    for args in [&["put", "k", "v"][..], &["get", "k"]] {
        transcript.push_str(&outcome(
            &format!("good cert: {}", args.join(" ")),
            &ctl(server, &good, args),
            server,
        ));
    }
    let mut refused = |name: &str, tls: Vec<String>, endpoint: &str| {
        let mut all: Vec<&str> = REFUSED_TIMEOUTS.to_vec();
        all.extend(tls.iter().map(String::as_str));
        all.extend(["get", "k"]);
        let run = common::etcdctl(endpoint, &all, None);
        transcript.push_str(&outcome(name, &run, server));
    };
    refused("no cert: get k", pki.etcdctl_flags(None), &server.tls);
    refused(
        "foreign cert: get k",
        pki.etcdctl_flags(Some("foreign")),
        &server.tls,
    );
    let plain_text = server.tls.replace("https://", "http://");
    refused("plain text on the TLS port: get k", Vec::new(), &plain_text);
    transcript
}

const CLIENT_CERT_EXPECTED: &str = "$ good cert: put k v\nexit 0\nOK\n\n\
$ good cert: get k\nexit 0\nk\nv\n\n\
$ no cert: get k\nexit 1\n\nError: context deadline exceeded\n\
$ foreign cert: get k\nexit 1\n\nError: context deadline exceeded\n\
$ plain text on the TLS port: get k\nexit 1\n\nError: context deadline exceeded\n";

#[test]
fn client_certificates_are_required_as_etcd_requires_them() {
    let pki = Pki::new();
    let debug = [
        pki.client_auth_flags(),
        vec!["--log-level=debug".to_owned()],
    ]
    .concat();
    let kvd = start_kvd_tls(&debug);
    let kvd_transcript = client_cert_scenario(&kvd, &pki);
    // The accept loop read the verified certificate's common name (TLS-4), the name the
    // request extension carries: alice's connections (put, get) and no other.
    let log = kvd.log();
    let verified: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("TLS client certificate verified"))
        .collect();
    assert!(
        !verified.is_empty(),
        "no verified certificate in the log:\n{log}"
    );
    assert!(
        verified
            .iter()
            .all(|line| line.contains("common_name=\"alice\"")),
        "{verified:#?}"
    );
    let etcd = start_etcd_tls(&pki.client_auth_flags());
    let etcd_transcript = client_cert_scenario(&etcd, &pki);
    assert_eq!(etcd_transcript, CLIENT_CERT_EXPECTED, "etcd 3.4.23 changed");
    assert_eq!(
        kvd_transcript,
        etcd_transcript,
        "kvd differs from etcd with --client-cert-auth; kvd log:\n{}",
        kvd.log()
    );
}

#[test]
fn auto_tls_serves_a_self_signed_certificate_kept_in_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let insecure = [
        "--insecure-transport=false".to_owned(),
        "--insecure-skip-tls-verify".to_owned(),
    ];
    let cert = data_dir.join("fixtures/client/cert.pem");
    let first_cert = {
        let server = start_kvd(&data_dir, "https://127.0.0.1:0", &["--auto-tls".to_owned()])
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(server.tls.starts_with("https://"), "{}", server.tls);
        let run = ctl(&server, &insecure, &["put", "k", "v"]);
        assert_eq!((run.code, run.stdout.as_str()), (0, "OK\n"), "{run:?}");
        // The certificate is self-signed: a client that verifies it against its CAs fails.
        let mut verified: Vec<&str> = REFUSED_TIMEOUTS.to_vec();
        verified.extend(["--insecure-transport=false", "get", "k"]);
        let run = common::etcdctl(&server.tls, &verified, None);
        assert_eq!(run.code, 1, "{run:?}");
        std::fs::read(&cert).unwrap()
    };
    let key = data_dir.join("fixtures/client/key.pem");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&key).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "key.pem is readable by others: {mode:o}");
    // A restart reuses the certificate.
    let server = start_kvd(&data_dir, "https://127.0.0.1:0", &["--auto-tls".to_owned()])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(std::fs::read(&cert).unwrap(), first_cert);
    let run = ctl(&server, &insecure, &["get", "k", "--print-value-only"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "v\n"), "{run:?}");
}

/// Starts kvd with `flags` on an https:// URL and returns its exit code and stderr; it
/// must exit instead of listening.
fn refused_start(flags: &[String]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut command = Command::new(common::kvd_binary());
    command
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("--listen-client-urls=https://127.0.0.1:0")
        .args(flags);
    let (status, stderr) = common::run_refused(command);
    assert!(
        !data_dir.join("kvd.redb").exists(),
        "a refused start opened a database"
    );
    (status.code(), stderr)
}

#[test]
fn bad_tls_configurations_are_refused_at_start_naming_flag_and_file() {
    let pki = Pki::new();
    let flag = |name: &str, file: &str| format!("--{name}={}", pki.path(file));
    let missing = pki.path("missing.crt");
    let cases: Vec<(Vec<String>, Vec<String>)> = vec![
        (
            vec![],
            vec![
                "TLS key/cert (--cert-file, --key-file) must be provided for client url \
                 https://127.0.0.1:0"
                    .into(),
            ],
        ),
        (
            vec![
                flag("cert-file", "missing.crt"),
                flag("key-file", "server.key"),
            ],
            vec![
                format!("--cert-file {missing}"),
                "No such file or directory".into(),
            ],
        ),
        (
            vec![
                flag("cert-file", "garbage.pem"),
                flag("key-file", "server.key"),
            ],
            vec![
                format!("--cert-file {}", pki.path("garbage.pem")),
                "no PEM certificate".into(),
            ],
        ),
        (
            vec![
                flag("cert-file", "server.crt"),
                flag("key-file", "garbage.pem"),
            ],
            vec![
                format!("--key-file {}", pki.path("garbage.pem")),
                "no PEM private key".into(),
            ],
        ),
        (
            vec![
                flag("cert-file", "server.crt"),
                flag("key-file", "other.key"),
            ],
            vec![
                format!("--key-file {}", pki.path("other.key")),
                format!(
                    "does not match the certificate of --cert-file {}",
                    pki.path("server.crt")
                ),
            ],
        ),
        (
            vec![flag("cert-file", "server.crt")],
            vec!["is given without --key-file".into()],
        ),
        (
            [pki.server_flags(), vec!["--client-cert-auth".into()]].concat(),
            vec!["--client-cert-auth needs --trusted-ca-file".into()],
        ),
        (
            [
                pki.server_flags(),
                vec![flag("trusted-ca-file", "missing.crt")],
            ]
            .concat(),
            vec![
                format!("--trusted-ca-file {missing}"),
                "No such file or directory".into(),
            ],
        ),
        (
            [
                pki.server_flags(),
                vec![flag("trusted-ca-file", "garbage.pem")],
            ]
            .concat(),
            vec![format!("--trusted-ca-file {}", pki.path("garbage.pem"))],
        ),
    ];
    for (flags, expected) in cases {
        let (code, stderr) = refused_start(&flags);
        // BIN-2: the exit code of every other start error.
        assert_eq!(code, Some(1), "{flags:?}: {stderr}");
        for text in &expected {
            assert!(
                stderr.contains(text.as_str()),
                "{flags:?}: want {text:?} in:\n{stderr}"
            );
        }
    }
}

/// Runs curl on `url` with `args` and returns its exit code and stdout (the body, then
/// the HTTP version curl used on a line of its own).
fn curl(args: &[String], url: &str) -> (i32, String) {
    let output = Command::new("curl")
        .args(["--silent", "--show-error", "--max-time", "10"])
        .args(["--write-out", "\n%{http_version}"])
        .args(args)
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("cannot run `curl` ({e}); install it with .ci/install-deps.sh"));
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[test]
fn health_and_the_gateway_over_tls_answer_curl_on_http1_and_http2() {
    let pki = Pki::new();
    let server = start_kvd_tls(&pki.client_auth_flags());
    let health = format!("{}/health", server.tls);
    let cert = vec![
        "--cacert".to_owned(),
        pki.path("ca.crt"),
        "--cert".to_owned(),
        pki.path("client.crt"),
        "--key".to_owned(),
        pki.path("client.key"),
    ];
    let healthy = "{\"health\":\"true\",\"reason\":\"\"}";
    for (version, printed) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let args = [cert.clone(), vec![version.to_owned()]].concat();
        let (code, out) = curl(&args, &health);
        assert_eq!(
            (code, out.as_str()),
            (0, format!("{healthy}\n{printed}").as_str()),
            "curl {version}"
        );
    }
    // The JSON gateway shares the TLS port too.
    let args = [
        cert.clone(),
        vec!["--data".to_owned(), "{\"key\":\"aw==\"}".to_owned()],
    ]
    .concat();
    let (code, out) = curl(&args, &format!("{}/v3/kv/range", server.tls));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"revision\":\"1\""), "{out}");
    // Without a client certificate the handshake fails.
    let (code, out) = curl(&["--cacert".to_owned(), pki.path("ca.crt")], &health);
    assert_ne!(code, 0, "{out}");
    // The plain listener of the same server answers too.
    let (code, out) = curl(&[], &format!("{}/health", server.plain));
    assert_eq!(
        (code, out.as_str()),
        (0, format!("{healthy}\n1.1").as_str())
    );
}

#[test]
fn a_trusted_ca_alone_requires_client_certificates_but_names_no_caller() {
    let pki = Pki::new();
    let flags = [
        pki.server_flags(),
        vec![
            format!("--trusted-ca-file={}", pki.path("ca.crt")),
            "--log-level=debug".to_owned(),
        ],
    ]
    .concat();
    let server = start_kvd_tls(&flags);
    // TLS-2: with --trusted-ca-file, a certificate of the CA is needed, as in etcd.
    let run = ctl(
        &server,
        &pki.etcdctl_flags(Some("client")),
        &["put", "k", "v"],
    );
    assert_eq!((run.code, run.stdout.as_str()), (0, "OK\n"), "{run:?}");
    let mut refused: Vec<&str> = REFUSED_TIMEOUTS.to_vec();
    let tls = pki.etcdctl_flags(None);
    refused.extend(tls.iter().map(String::as_str));
    refused.extend(["get", "k"]);
    let run = common::etcdctl(&server.tls, &refused, None);
    assert_eq!(run.code, 1, "{run:?}");
    assert_eq!(error_line(&run.stderr), "Error: context deadline exceeded");
    // TLS-4: without --client-cert-auth the certificate identifies nobody.
    let log = server.log();
    assert!(log.contains("TLS on the https:// client URLs"), "{log}");
    assert!(!log.contains("TLS client certificate verified"), "{log}");
}

#[test]
fn a_silent_client_is_closed_after_the_header_timeout_during_the_handshake() {
    use std::io::Read;
    let pki = Pki::new();
    let flags = [
        pki.server_flags(),
        vec!["--connection-header-timeout=1s".to_owned()],
    ]
    .concat();
    let server = start_kvd_tls(&flags);
    let host = server.tls.trim_start_matches("https://");
    // TLS-3: a client that never sends its ClientHello holds its connection for the header
    // timeout only. The read's own limit is far beyond it, so only a closed connection
    // passes.
    let mut silent = std::net::TcpStream::connect(host).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut byte = [0u8; 1];
    let read = silent.read(&mut byte);
    assert!(
        matches!(read, Ok(0))
            || read
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the silent connection was not closed: {read:?}"
    );
    // The server still serves others.
    let run = ctl(&server, &pki.etcdctl_flags(None), &["put", "k", "v"]);
    assert_eq!((run.code, run.stdout.as_str()), (0, "OK\n"), "{run:?}");
}

/// With auth enabled and `--client-cert-auth`, a client with no token is the user its
/// certificate names (etcd's rule): root's certificate sets up users and roles and enables
/// auth, then alice's certificate writes inside her role's prefix and is denied outside it.
fn cert_auth_scenario(server: &TlsServer, pki: &Pki) -> String {
    let mut transcript = String::new();
    let root = pki.etcdctl_flags(Some("root"));
    let alice = pki.etcdctl_flags(Some("client"));
    let steps: [(&str, &[String], &[&str]); 11] = [
        (
            "root",
            &root,
            &["user", "add", "root", "--new-user-password=rootpw"],
        ),
        ("root", &root, &["user", "grant-role", "root", "root"]),
        ("root", &root, &["role", "add", "dev"]),
        (
            "root",
            &root,
            &[
                "role",
                "grant-permission",
                "dev",
                "readwrite",
                "/dev/",
                "--prefix=true",
            ],
        ),
        (
            "root",
            &root,
            &["user", "add", "alice", "--new-user-password=alicepw"],
        ),
        ("root", &root, &["user", "grant-role", "alice", "dev"]),
        ("root", &root, &["auth", "enable"]),
        ("alice", &alice, &["put", "/dev/a", "1"]),
        ("alice", &alice, &["put", "/other", "1"]),
        ("alice", &alice, &["user", "list"]),
        ("root", &root, &["get", "/dev/a"]),
    ];
    for (who, tls, args) in steps {
        transcript.push_str(&outcome(
            &format!("{who} cert: {}", args.join(" ")),
            &ctl(server, tls, args),
            server,
        ));
    }
    transcript
}

#[test]
fn with_auth_enabled_the_client_certificate_names_the_user_as_in_etcd() {
    let pki = Pki::new();
    let kvd = start_kvd_tls(&pki.client_auth_flags());
    let kvd_transcript = cert_auth_scenario(&kvd, &pki);
    assert!(
        kvd_transcript.contains("$ alice cert: put /dev/a 1\nexit 0\nOK"),
        "{kvd_transcript}"
    );
    assert!(
        kvd_transcript.contains("permission denied"),
        "alice is denied outside /dev/: {kvd_transcript}"
    );
    let etcd = start_etcd_tls(&pki.client_auth_flags());
    let etcd_transcript = cert_auth_scenario(&etcd, &pki);
    assert_eq!(
        kvd_transcript,
        etcd_transcript,
        "kvd differs from etcd; kvd log:\n{}",
        kvd.log()
    );
}
