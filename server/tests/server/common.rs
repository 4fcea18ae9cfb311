//! Helpers shared by the server tests: start `kvd` or Debian's etcd 3.4 on a loopback port
//! with a temporary data directory, stop it when dropped, run `etcdctl` with a timeout (and
//! `etcdctl watch` bounded in time, with writes while it runs), and make plain HTTP requests.
//!
//! The tests that use etcd or etcdctl fail (never skip) when the binaries are missing:
//! `.ci/install-deps.sh` installs them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a server may take to start listening.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one etcdctl invocation may take.
pub const ETCDCTL_TIMEOUT: Duration = Duration::from_secs(20);

/// A running server (kvd or etcd), killed when dropped.
pub struct Server {
    child: Child,
    /// The client URL, `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The peer URL (etcd only; kvd shows a placeholder).
    pub peer_url: Option<String>,
    /// The data directory (inside `_dir` unless the caller gave one).
    pub data_dir: PathBuf,
    log: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    /// Returns the server's log so far (stderr of the process).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Returns the server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Returns the server's resident memory in KiB (`VmRSS` of `/proc/PID/status`).
    pub fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }

    /// Returns the server's peak resident memory in KiB (`VmHWM` of `/proc/PID/status`),
    /// since it started or since the last [`Server::reset_peak_rss`].
    pub fn peak_rss_kib(&self) -> u64 {
        self.status_kib("VmHWM:")
    }

    /// Resets the server's peak resident memory to its current one (writes 5 to
    /// `/proc/PID/clear_refs`).
    pub fn reset_peak_rss(&self) {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid()), "5")
            .expect("reset the peak RSS through /proc/PID/clear_refs");
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/PID/status"))
    }

    /// Sends `signal` (e.g. "-INT", "-TERM") to the server and waits for it to exit,
    /// returning its exit code.
    pub fn signal_and_wait(&mut self, signal: &str) -> Option<i32> {
        let status = Command::new("kill")
            .arg(signal)
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
        wait_with_timeout(&mut self.child, START_TIMEOUT)
            .expect("server did not exit")
            .code()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Returns the path of the kvd binary Cargo built for these tests.
pub fn kvd_binary() -> &'static str {
    env!("CARGO_BIN_EXE_kvd")
}

/// Starts kvd on a free loopback port with a fresh temporary data directory.
pub fn start_kvd(extra_args: &[&str]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut server = start_kvd_in(&data_dir, extra_args).unwrap_or_else(|e| panic!("{e}"));
    server._dir = Some(dir);
    server
}

/// Starts kvd on a free loopback port on `data_dir`; `Err` carries the exit code and log if
/// it exits instead of listening.
pub fn start_kvd_in(data_dir: &Path, extra_args: &[&str]) -> Result<Server, String> {
    start_kvd_with_env(data_dir, extra_args, &[])
}

/// Starts kvd as [`start_kvd`] does, with its open-file limit (soft and hard) set to
/// `open_files` by the shell that execs it.
pub fn start_kvd_with_open_files(open_files: u32, extra_args: &[&str]) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let script = format!("ulimit -n {open_files} && exec \"$0\" \"$@\"");
    let mut server = start_kvd_wrapped(
        &["sh", "-c", &script],
        Path::new(kvd_binary()),
        &data_dir,
        extra_args,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    server._dir = Some(dir);
    server
}

/// Starts kvd as [`start_kvd_in`] does, with `env` added to its environment (the child's
/// only: this process's environment is left alone).
pub fn start_kvd_with_env(
    data_dir: &Path,
    extra_args: &[&str],
    env: &[(&str, &str)],
) -> Result<Server, String> {
    let mut command = Command::new(kvd_binary());
    command.envs(env.iter().copied());
    start_kvd_command(command, data_dir, extra_args)
}

/// Starts kvd as [`start_kvd_in`] does, through `wrapper`: a program and its arguments that
/// end by running the command that follows them (`setpriv ...`), with `binary` as kvd.
pub fn start_kvd_wrapped(
    wrapper: &[&str],
    binary: &Path,
    data_dir: &Path,
    extra_args: &[&str],
) -> Result<Server, String> {
    let mut command = Command::new(wrapper[0]);
    command.args(&wrapper[1..]).arg(binary);
    start_kvd_command(command, data_dir, extra_args)
}

// The child is waited for by `Server`'s `Drop`, or before returning an error.
#[allow(clippy::zombie_processes)]
fn start_kvd_command(
    mut command: Command,
    data_dir: &Path,
    extra_args: &[&str],
) -> Result<Server, String> {
    let log = data_dir.with_extension(format!("kvd-{}.log", unique()));
    let log_file = File::create(&log).unwrap();
    let mut child = command
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen-client-urls", "http://127.0.0.1:0"])
        .args(extra_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .spawn()
        .expect("start kvd");
    // The first stdout line names the URL (kvd prints it once the listener is bound).
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().and_then(|l| l.ok());
        let _ = tx.send(first);
        // Keep draining so kvd never blocks on a full pipe.
        for _ in lines {}
    });
    let endpoint = match rx.recv_timeout(START_TIMEOUT) {
        Ok(Some(line)) => {
            let url = line
                .rsplit(' ')
                .next()
                .filter(|url| url.starts_with("http://"))
                .map(str::to_owned);
            let Some(url) = url else {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("unexpected kvd stdout line: {line}"));
            };
            url
        }
        Ok(None) | Err(_) => {
            let code = wait_with_timeout(&mut child, Duration::from_secs(5)).and_then(|s| s.code());
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!(
                "kvd did not start (exit code {code:?}); log:\n{log}"
            ));
        }
    };
    Ok(Server {
        child,
        endpoint,
        peer_url: None,
        data_dir: data_dir.to_owned(),
        log,
        _dir: None,
    })
}

/// Runs `command`, a kvd expected to refuse to start, for at most [`START_TIMEOUT`] and
/// returns its exit status and standard error. A kvd still running then has started instead
/// of refusing: it is killed and the test fails.
pub fn run_refused(mut command: Command) -> (std::process::ExitStatus, String) {
    let mut stderr = tempfile::tempfile().unwrap();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(stderr.try_clone().unwrap()))
        .spawn()
        .expect("start kvd");
    let Some(status) = wait_with_timeout(&mut child, START_TIMEOUT) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("kvd still ran after {START_TIMEOUT:?} instead of refusing to start");
    };
    stderr.rewind().unwrap();
    let mut text = String::new();
    stderr.read_to_string(&mut text).unwrap();
    (status, text)
}

/// How many times etcd is started on fresh ports before giving up (another process may take
/// a port between [`free_ports`] and etcd's bind).
const ETCD_START_ATTEMPTS: usize = 3;

/// Starts Debian's etcd (3.4) as a single member on free loopback ports with a fresh
/// temporary data directory, and waits until `/health` answers.
pub fn start_etcd() -> Server {
    let mut last_log = String::new();
    for _ in 0..ETCD_START_ATTEMPTS {
        match try_start_etcd() {
            Ok(server) => return server,
            Err(log) => last_log = log,
        }
    }
    panic!(
        "etcd did not become healthy after {ETCD_START_ATTEMPTS} attempts; last log:\n{last_log}"
    )
}

/// Starts etcd once; `Err` carries its log if it exits or does not get healthy in time.
fn try_start_etcd() -> Result<Server, String> {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("etcd-data");
    let [client_port, peer_port] = free_ports();
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut server = start_etcd_on(&data_dir, client_port, &peer)?;
    server._dir = Some(dir);
    Ok(server)
}

/// Starts etcd as member `default` on `data_dir` (which may hold a restored snapshot) with
/// the client port and peer URL given, and waits until `/health` answers; `Err` carries its
/// log if it exits or does not get healthy in time. Its logs go beside `data_dir`.
pub fn start_etcd_on(data_dir: &Path, client_port: u16, peer: &str) -> Result<Server, String> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = peer.to_owned();
    let logs = data_dir.parent().unwrap().to_path_buf();
    let stderr = logs.join(format!("etcd-{client_port}.stderr"));
    let child = Command::new("etcd")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--name", "default"])
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("default={peer}")])
        .stdin(Stdio::null())
        .stdout(Stdio::from(
            File::create(logs.join(format!("etcd-{client_port}.stdout"))).unwrap(),
        ))
        .stderr(Stdio::from(File::create(&stderr).unwrap()))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `etcd` ({e}); install it with .ci/install-deps.sh"));
    let mut server = Server {
        child,
        endpoint: client,
        peer_url: Some(peer),
        data_dir: data_dir.to_path_buf(),
        log: stderr,
        _dir: None,
    };
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Ok((200, _)) = http_get(&server.endpoint, "/health") {
            return Ok(server);
        }
        let exited = server.child.try_wait().unwrap().is_some();
        if exited || Instant::now() >= deadline {
            return Err(server.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts etcd again on the data directory and URLs of `stopped` (which has exited and
/// still owns the temporary directory), and waits until `/health` answers.
pub fn restart_etcd(stopped: &Server) -> Server {
    let peer = stopped
        .peer_url
        .clone()
        .expect("an etcd server has a peer URL");
    let stderr = stopped
        .data_dir
        .with_extension(format!("restart-{}.log", unique()));
    let child = Command::new("etcd")
        .arg("--data-dir")
        .arg(&stopped.data_dir)
        .args(["--name", "default"])
        .args(["--listen-client-urls", &stopped.endpoint])
        .args(["--advertise-client-urls", &stopped.endpoint])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("default={peer}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(File::create(&stderr).unwrap()))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `etcd` ({e}); install it with .ci/install-deps.sh"));
    let mut server = Server {
        child,
        endpoint: stopped.endpoint.clone(),
        peer_url: Some(peer),
        data_dir: stopped.data_dir.clone(),
        log: stderr,
        _dir: None,
    };
    let healthy = wait_until(START_TIMEOUT, || {
        matches!(http_get(&server.endpoint, "/health"), Ok((200, _)))
            || server.child.try_wait().unwrap().is_some()
    });
    assert!(
        healthy && server.child.try_wait().unwrap().is_none(),
        "etcd did not restart; log:\n{}",
        server.log()
    );
    server
}

/// Returns two distinct ports that were free a moment ago (bound together, then released).
pub fn free_ports() -> [u16; 2] {
    let first = TcpListener::bind("127.0.0.1:0").unwrap();
    let second = TcpListener::bind("127.0.0.1:0").unwrap();
    [
        first.local_addr().unwrap().port(),
        second.local_addr().unwrap().port(),
    ]
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Waits for `child` to exit for at most `timeout`.
pub fn wait_with_timeout(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What one etcdctl run printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The exit code (-1 if killed by a signal).
    pub code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs `etcdctl --endpoints=<endpoint> args...` with `stdin`, killed after
/// [`ETCDCTL_TIMEOUT`]. Panics if etcdctl is not installed.
pub fn etcdctl(endpoint: &str, args: &[&str], stdin: Option<&[u8]>) -> Run {
    let mut out = tempfile::tempfile().unwrap();
    let mut err = tempfile::tempfile().unwrap();
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(err.try_clone().unwrap()))
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run `etcdctl` ({e}); install it with .ci/install-deps.sh")
        });
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(input).unwrap();
    }
    let Some(status) = wait_with_timeout(&mut child, ETCDCTL_TIMEOUT) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("etcdctl {args:?} did not finish within {ETCDCTL_TIMEOUT:?}");
    };
    let read = |file: &mut File| {
        file.rewind().unwrap();
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        text
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout: read(&mut out),
        stderr: read(&mut err),
    }
}

/// How long a watch waits for the output it expects before it is stopped anyway.
pub const WATCH_WAIT_MAX: Duration = Duration::from_secs(30);
/// How long a watch keeps running after the expected output arrived, so that anything
/// extra the server sends shows in the transcript.
pub const WATCH_SETTLE: Duration = Duration::from_millis(300);
/// The exit code recorded for an etcdctl that was still running and had to be killed.
pub const KILLED: i32 = -1;

/// Returns the number of watchers the server at `endpoint` reports in `/metrics`: kvd's
/// `kvd_watchers`, or etcd 3.4's `etcd_debugging_mvcc_watcher_total`.
pub fn watchers(endpoint: &str) -> Option<u64> {
    let (_, body) = http_get(endpoint, "/metrics").ok()?;
    body.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        matches!(name, "kvd_watchers" | "etcd_debugging_mvcc_watcher_total")
            .then(|| value.trim().parse::<f64>().ok().map(|v| v as u64))
            .flatten()
    })
}

/// Waits until `done` holds, for at most `max`; returns whether it held.
pub fn wait_until(max: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + max;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `done` resolves to true, for at most `max`; returns whether it did.
pub async fn wait_until_async<F, Fut>(max: Duration, mut done: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + max;
    loop {
        if done().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `etcdctl --endpoints=<endpoint> watch-args...` bounded in time: once the server
/// counts the new watcher, runs `during` (the writes the watch should see), then waits until
/// etcdctl exits or its stdout satisfies `enough` (at most [`WATCH_WAIT_MAX`]), lets it run
/// [`WATCH_SETTLE`] longer, and kills it. A killed etcdctl has exit code [`KILLED`].
pub fn etcdctl_watch(
    endpoint: &str,
    args: &[&str],
    during: impl FnOnce(),
    enough: impl Fn(&str) -> bool,
) -> Run {
    etcdctl_watch_counted(endpoint, endpoint, args, during, enough)
}

/// Runs a watch as [`etcdctl_watch`] does, with etcdctl on `endpoint` and the watchers
/// counted on `metrics_endpoint` (a plain `http://` listener of the same server, for a
/// watch over TLS).
// The child is waited for before returning.
#[allow(clippy::zombie_processes)]
pub fn etcdctl_watch_counted(
    endpoint: &str,
    metrics_endpoint: &str,
    args: &[&str],
    during: impl FnOnce(),
    enough: impl Fn(&str) -> bool,
) -> Run {
    // A watcher of an earlier, killed etcdctl may linger until the server notices.
    let before = watchers(metrics_endpoint).unwrap_or(0);
    let out = tempfile::NamedTempFile::new().unwrap();
    let err = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.reopen().unwrap()))
        .stderr(Stdio::from(err.reopen().unwrap()))
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run `etcdctl` ({e}); install it with .ci/install-deps.sh")
        });
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    let exited = |child: &mut Child| child.try_wait().unwrap().is_some();
    let registered = wait_until(WATCH_WAIT_MAX, || {
        exited(&mut child) || watchers(metrics_endpoint).is_some_and(|n| n > before)
    });
    assert!(
        registered,
        "etcdctl {args:?}: the server never counted the watch"
    );
    during();
    wait_until(WATCH_WAIT_MAX, || {
        exited(&mut child) || enough(&read(out.path()))
    });
    wait_until(WATCH_SETTLE, || exited(&mut child));
    let code = match child.try_wait().unwrap() {
        Some(status) => status.code().unwrap_or(KILLED),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            KILLED
        }
    };
    // Let the server drop this watch before the next call reads its baseline: a watch that
    // lingers and then goes away while the next one registers would hide the new one.
    wait_until(WATCH_WAIT_MAX, || {
        watchers(metrics_endpoint).is_none_or(|n| n <= before)
    });
    Run {
        code,
        stdout: read(out.path()),
        stderr: read(err.path()),
    }
}

/// Makes a plain HTTP/1.1 GET and returns the status code and body.
pub fn http_get(endpoint: &str, path: &str) -> std::io::Result<(u16, String)> {
    let host = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad HTTP response: {head}")))?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((code, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// Opens a gRPC channel to `endpoint` (`http://127.0.0.1:PORT`).
pub async fn connect(endpoint: &str) -> tonic::transport::Channel {
    tonic::transport::Channel::from_shared(endpoint.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Asserts `result` failed with exactly `code` and `message`.
pub fn assert_status<T: std::fmt::Debug>(
    result: Result<T, tonic::Status>,
    code: tonic::Code,
    message: &str,
) {
    let status = result.expect_err("the request should fail");
    assert_eq!(
        (status.code(), status.message()),
        (code, message),
        "{status:?}"
    );
}

/// Returns `message` as a gRPC request carrying the auth `token`.
pub fn with_token<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("token", token.parse().unwrap());
    request
}
