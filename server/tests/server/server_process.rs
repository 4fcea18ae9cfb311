//! The kvd process: clean shutdown on SIGINT and SIGTERM (open Watch and LeaseKeepAlive
//! streams end with "server stopped" instead of holding it up), data and identity that survive
//! a restart, a clear refusal to share a data directory, flag errors, `--version`, and the
//! HTTP routes (`/health`, `/version`, `/metrics`) on the client port.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::common;

use std::process::Command;

fn member_id(endpoint: &str) -> String {
    let run = common::etcdctl(endpoint, &["member", "list"], None);
    assert_eq!(run.code, 0, "{run:?}");
    run.stdout.split(", ").next().unwrap().to_owned()
}

#[test]
fn sigterm_and_sigint_shut_down_cleanly_and_data_and_identity_survive() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut first = common::start_kvd_in(&data_dir, &[]).unwrap();
    let put = common::etcdctl(&first.endpoint, &["put", "k", "v1"], None);
    assert_eq!(put.stdout, "OK\n", "{put:?}");
    let id = member_id(&first.endpoint);
    assert_eq!(
        first.signal_and_wait("-TERM"),
        Some(0),
        "log:\n{}",
        first.log()
    );
    assert!(
        first.log().contains("engine closed"),
        "log:\n{}",
        first.log()
    );
    // etcdctl prints the id in hex without leading zeros; the file keeps all 16 digits.
    let stored = std::fs::read_to_string(data_dir.join("member_id")).unwrap();
    let parse = |hex: &str| u64::from_str_radix(hex.trim(), 16).unwrap();
    assert_eq!(parse(&stored), parse(&id));

    let mut second = common::start_kvd_in(&data_dir, &[]).unwrap();
    let get = common::etcdctl(&second.endpoint, &["get", "k"], None);
    assert_eq!(get.stdout, "k\nv1\n", "{get:?}");
    assert_eq!(member_id(&second.endpoint), id);
    assert_eq!(
        second.signal_and_wait("-INT"),
        Some(0),
        "log:\n{}",
        second.log()
    );
    assert!(
        second.log().contains("engine closed"),
        "log:\n{}",
        second.log()
    );
}

#[test]
fn a_second_kvd_on_the_same_data_dir_exits_with_a_clear_message() {
    let first = common::start_kvd(&[]);
    let mut second = Command::new(common::kvd_binary());
    second
        .arg("--data-dir")
        .arg(&first.data_dir)
        .args(["--listen-client-urls", "http://127.0.0.1:0"]);
    let (status, stderr) = common::run_refused(second);
    assert!(!status.success());
    assert!(
        stderr.contains("is in use by another kvd process"),
        "{stderr}"
    );
    // The first server is unharmed.
    let run = common::etcdctl(&first.endpoint, &["put", "k", "v"], None);
    assert_eq!(run.stdout, "OK\n", "{run:?}");
}

#[test]
fn unsupported_urls_are_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(common::kvd_binary());
    command
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--listen-client-urls", "unix:///tmp/kvd.sock"]);
    let (status, stderr) = common::run_refused(command);
    assert!(!status.success());
    assert!(
        stderr.contains("only http:// and https:// URLs are served"),
        "{stderr}"
    );
}

#[test]
fn a_prepare_queue_of_no_slots_is_refused_at_startup() {
    for value in ["0", "-5"] {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new(common::kvd_binary());
        command
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", "http://127.0.0.1:0"])
            .args(["--prepare-queue-length", value]);
        let (status, stderr) = common::run_refused(command);
        assert!(
            !status.success(),
            "--prepare-queue-length {value} was accepted"
        );
        assert!(
            stderr.contains(&format!(
                "--prepare-queue-length must be at least 1, got {value}"
            )),
            "{stderr}"
        );
        assert!(
            !dir.path().join("data").join("kvd.redb").exists(),
            "nothing opened"
        );
    }
}

/// Runs kvd on `data_dir` listening on `url`, which it cannot use, and returns its standard
/// error; asserts it exited with an error.
fn refused_to_listen(data_dir: &std::path::Path, url: &str) -> String {
    let mut command = Command::new(common::kvd_binary());
    command
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen-client-urls", url]);
    let (status, stderr) = common::run_refused(command);
    assert!(!status.success(), "{url} was accepted");
    stderr
}

/// Every file under `dir` (recursively), with its length and modification time.
fn file_stamps(
    dir: &std::path::Path,
) -> std::collections::BTreeMap<std::path::PathBuf, (u64, std::time::SystemTime)> {
    let mut stamps = std::collections::BTreeMap::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                pending.push(path.clone());
            }
            stamps.insert(path, (meta.len(), meta.modified().unwrap()));
        }
    }
    stamps
}

/// SRV-5: the listeners are bound before the data directory is touched, so a listen address
/// kvd cannot use is refused with a message naming it and changes nothing: a data directory
/// that does not exist is not created, and one left by a killed kvd is neither replayed nor
/// rewritten.
#[test]
fn a_listen_address_in_use_is_refused_before_the_data_directory_is_touched() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap();
    let url = format!("http://{address}");
    let dir = tempfile::tempdir().unwrap();

    // (a) A data directory that does not exist stays so; also for addresses that cannot be
    // bound at all.
    let absent = dir.path().join("absent");
    let in_use = format!("kvd: listen on {address}: Address already in use");
    for (url, message) in [
        (url.as_str(), in_use.as_str()),
        ("http://127.0.0.1:99999", "kvd: listen on 127.0.0.1:99999: "),
        ("http://127.0.0.1", "kvd: listen on 127.0.0.1: "),
    ] {
        let stderr = refused_to_listen(&absent, url);
        assert!(stderr.contains(message), "{url}: {stderr}");
        assert!(!absent.exists(), "{url}: the data directory was created");
    }

    // (b) A data directory left by a kvd killed after a few writes keeps every file as it was.
    let data_dir = dir.path().join("data");
    let mut killed = common::start_kvd_in(&data_dir, &[]).unwrap();
    for n in 0..5 {
        let put = common::etcdctl(&killed.endpoint, &["put", &format!("k{n}"), "v"], None);
        assert_eq!(put.stdout, "OK\n", "{put:?}");
    }
    assert_eq!(
        killed.signal_and_wait("-KILL"),
        None,
        "killed by the signal"
    );
    let before = file_stamps(&data_dir);
    let redb = std::fs::read(data_dir.join("kvd.redb")).unwrap();
    assert!(before.contains_key(&data_dir.join("kvd.wal")), "{before:?}");

    let stderr = refused_to_listen(&data_dir, &url);
    assert!(stderr.contains(&in_use), "{stderr}");
    assert_eq!(file_stamps(&data_dir), before, "the data directory changed");
    assert!(
        std::fs::read(data_dir.join("kvd.redb")).unwrap() == redb,
        "kvd.redb was rewritten"
    );

    // The directory is unharmed: a kvd on a free port replays it and serves the writes.
    let server = common::start_kvd_in(&data_dir, &[]).unwrap();
    let get = common::etcdctl(&server.endpoint, &["get", "k4"], None);
    assert_eq!(get.stdout, "k4\nv\n", "{get:?}");
}

/// Starts kvd on a fresh data directory with `flags`, expects it to exit at once with an
/// error, and returns its standard error; asserts it opened nothing.
fn refused_at_start(flags: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(common::kvd_binary());
    command
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--listen-client-urls", "http://127.0.0.1:0"])
        .args(flags);
    let (status, stderr) = common::run_refused(command);
    assert!(!status.success(), "{flags:?} was accepted");
    assert!(
        !dir.path().join("data").exists(),
        "{flags:?}: nothing opened"
    );
    stderr
}

#[test]
fn a_pipeline_priority_outside_1_to_99_or_a_tiny_log_is_refused_at_startup() {
    for value in ["0", "100", "-1"] {
        let stderr = refused_at_start(&[&format!("--pipeline-priority={value}")]);
        assert!(
            stderr.contains(&format!("invalid value '{value}' for '--pipeline-priority")),
            "{stderr}"
        );
    }
    // The log between checkpoints has a floor too.
    let stderr = refused_at_start(&["--wal-file-bytes=1000"]);
    assert!(
        stderr.contains("invalid value '1000' for '--wal-file-bytes"),
        "{stderr}"
    );
}

/// BIN-6: a negative count or duration given as a separate argument is the flag's value,
/// refused with a message naming the flag (not taken for an unknown option), and a zero
/// timeout or token lifetime, which would close every connection or expire every token at
/// once, is refused too.
#[test]
fn negative_and_zero_values_are_refused_naming_their_flag() {
    for (flag, value) in [
        ("--max-txn-ops", "-3"),
        ("--max-request-bytes", "-1"),
        ("--auth-token-ttl", "-1"),
        ("--auto-compaction-retention", "-1"),
        ("--connection-idle-timeout", "-5s"),
        ("--auth-token-ttl", "0"),
        ("--connection-header-timeout", "0"),
        ("--connection-idle-timeout", "0"),
        ("--grpc-keepalive-interval", "0"),
        ("--grpc-keepalive-timeout", "0"),
        ("--snapshot-stall-timeout", "0"),
    ] {
        let stderr = refused_at_start(&[flag, value]);
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
        assert!(
            !stderr.contains("unexpected argument"),
            "{flag} {value}: {stderr}"
        );
    }
}

/// The real-time policy and priority of each of `pid`'s threads named `kvd-apply` or
/// `kvd-commit` (fields 41 and 40 of `/proc/PID/task/TID/stat`; policy 1 is `SCHED_FIFO`).
fn pipeline_scheduling(pid: u32) -> Vec<(String, u64, u64)> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(stat) = std::fs::read_to_string(task.unwrap().path().join("stat")) else {
            continue; // a thread may end between the listing and the read
        };
        let (open, close) = (stat.find('(').unwrap(), stat.rfind(')').unwrap());
        let name = &stat[open + 1..close];
        // After the name come the fields from the third (state) on.
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let field = |n: usize| fields[n - 3].parse::<u64>().unwrap();
        if name == "kvd-apply" || name == "kvd-commit" {
            found.push((name.to_owned(), field(41), field(40)));
        }
    }
    found.sort();
    found
}

/// RT-1 from outside, and the way `docs/operations.md` gives to grant it: an unprivileged user
/// is refused `--pipeline-priority` at start with a message naming what it lacks, and the
/// capability `CAP_SYS_NICE` alone, without root, is enough. Changing user needs root, as CI
/// has (like the tmpfs test of `tests/space.rs`); `setpriv` is util-linux's.
#[test]
fn pipeline_priority_is_refused_to_an_unprivileged_user_and_needs_only_cap_sys_nice() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // A copy the unprivileged user can run wherever the build directory lies.
    let binary = dir.path().join("kvd");
    std::fs::copy(common::kvd_binary(), &binary).unwrap();
    let nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    let priority = ["--pipeline-priority", "10"];

    let refused = common::start_kvd_wrapped(&nobody, &binary, &dir.path().join("plain"), &priority)
        .err()
        .expect("an unprivileged user was given real-time threads");
    assert!(
        refused.contains("cannot run the kvd-apply thread under SCHED_FIFO at priority 10")
            && refused.contains("CAP_SYS_NICE"),
        "{refused}"
    );

    let capable = [
        &nobody[..],
        &["--inh-caps=+sys_nice", "--ambient-caps=+sys_nice"],
    ]
    .concat();
    let server =
        common::start_kvd_wrapped(&capable, &binary, &dir.path().join("capable"), &priority)
            .unwrap_or_else(|e| panic!("{e}"));
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid.split_whitespace().skip(1).all(|id| id == "65534"),
        "{uid}"
    );
    assert_eq!(
        pipeline_scheduling(server.pid()),
        vec![
            ("kvd-apply".to_owned(), 1, 10),
            ("kvd-commit".to_owned(), 1, 10)
        ],
        "both pipeline threads under SCHED_FIFO at priority 10"
    );
    let put = common::etcdctl(&server.endpoint, &["put", "k", "v"], None);
    assert_eq!(put.stdout, "OK\n", "{put:?}");
}

#[test]
fn advertise_urls_show_in_member_list() {
    let server = common::start_kvd(&["--advertise-client-urls", "http://kvd.example:2379"]);
    let run = common::etcdctl(&server.endpoint, &["member", "list"], None);
    assert!(
        run.stdout
            .ends_with(", default, http://127.0.0.1:2380, http://kvd.example:2379, false\n"),
        "{run:?}"
    );
}

#[test]
fn http_routes_share_the_client_port() {
    let server = common::start_kvd(&[]);
    let (code, body) = common::http_get(&server.endpoint, "/health").unwrap();
    assert_eq!(
        (code, body.as_str()),
        (200, "{\"health\":\"true\",\"reason\":\"\"}")
    );
    let (code, body) = common::http_get(&server.endpoint, "/version").unwrap();
    assert_eq!(
        (code, body.as_str()),
        (200, "{\"etcdserver\":\"3.6.0\",\"etcdcluster\":\"3.6.0\"}")
    );
    // The JSON gateway answers POST only, as etcd's: a GET is 405; other paths are 404.
    let (code, _) = common::http_get(&server.endpoint, "/v3/kv/range").unwrap();
    assert_eq!(code, 405);
    let (code, _) = common::http_get(&server.endpoint, "/v2/keys").unwrap();
    assert_eq!(code, 404);

    for args in [
        &["put", "m", "v"][..],
        &["get", "m"],
        &["get", "m", "--rev", "9"],
    ] {
        common::etcdctl(&server.endpoint, args, None);
    }
    let (code, metrics) = common::http_get(&server.endpoint, "/metrics").unwrap();
    assert_eq!(code, 200);
    for line in [
        "kvd_engine_up 1",
        "kvd_current_revision 2",
        "kvd_compact_revision -1",
        "kvd_grpc_requests_total{grpc_service=\"etcdserverpb.KV\",grpc_method=\"Put\",grpc_code=\"OK\"} 1",
        "kvd_grpc_requests_total{grpc_service=\"etcdserverpb.KV\",grpc_method=\"Range\",grpc_code=\"OK\"} 1",
        "kvd_grpc_requests_total{grpc_service=\"etcdserverpb.KV\",grpc_method=\"Range\",grpc_code=\"OutOfRange\"} 1",
        "kvd_grpc_request_duration_seconds_count{grpc_service=\"etcdserverpb.KV\",grpc_method=\"Range\"} 2",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing from /metrics:\n{metrics}"
        );
    }
    for gauge in ["kvd_db_size_bytes ", "kvd_db_size_in_use_bytes "] {
        assert!(
            metrics.lines().any(|l| l.starts_with(gauge)),
            "{gauge} missing:\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_and_keep_alive_streams_end_at_shutdown_without_the_grace_period() {
    use kvd_server::pb::etcdserverpb::lease_client::LeaseClient;
    use kvd_server::pb::etcdserverpb::watch_client::WatchClient;
    use kvd_server::pb::etcdserverpb::watch_request::RequestUnion;
    use kvd_server::pb::etcdserverpb::{
        LeaseGrantRequest, LeaseKeepAliveRequest, WatchCreateRequest, WatchRequest,
    };
    use tonic::codegen::tokio_stream::wrappers::ReceiverStream;

    let mut server = common::start_kvd(&[]);
    let channel = tonic::transport::Channel::from_shared(server.endpoint.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (watch_requests, receiver) = tokio::sync::mpsc::channel(1);
    let mut watch = WatchClient::new(channel.clone())
        .watch(ReceiverStream::new(receiver))
        .await
        .unwrap()
        .into_inner();
    let create = WatchCreateRequest {
        key: "k".into(),
        ..WatchCreateRequest::default()
    };
    watch_requests
        .send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(create)),
        })
        .await
        .unwrap();
    assert!(watch.message().await.unwrap().unwrap().created);
    let mut lease = LeaseClient::new(channel);
    let id = lease
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
        .await
        .unwrap()
        .into_inner()
        .id;
    let (keep_alive_requests, receiver) = tokio::sync::mpsc::channel(1);
    let mut keep_alive = lease
        .lease_keep_alive(ReceiverStream::new(receiver))
        .await
        .unwrap()
        .into_inner();
    keep_alive_requests
        .send(LeaseKeepAliveRequest { id })
        .await
        .unwrap();
    assert_eq!(keep_alive.message().await.unwrap().unwrap().ttl, 60);

    let (code, server) = tokio::task::spawn_blocking(move || {
        let code = server.signal_and_wait("-TERM");
        (code, server)
    })
    .await
    .unwrap();
    let log = server.log();
    assert_eq!(code, Some(0), "log:\n{log}");
    // The listener drained with the streams ended, not cut off when the grace period ran out.
    assert!(log.contains("listener closed"), "log:\n{log}");
    assert!(
        !log.contains("requests still in flight after the grace period"),
        "open streams held the shutdown up for the grace period; log:\n{log}"
    );
    // Each stream ended with etcd's "server stopped".
    for ended in [
        watch.message().await.map(|_| ()),
        keep_alive.message().await.map(|_| ()),
    ] {
        let status = ended.expect_err("the stream ends with an error");
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::Unavailable, "etcdserver: server stopped")
        );
    }
    drop((watch_requests, keep_alive_requests));
}

#[test]
fn version_names_the_commit_the_binary_was_built_from() {
    let output = Command::new(common::kvd_binary())
        .arg("--version")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    // The same `git rev-parse` that `server/build.rs` ran, or `unknown` without git.
    let commit = Command::new("git")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8(out.stdout).unwrap().trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        format!("kvd {} (git {commit})\n", env!("CARGO_PKG_VERSION"))
    );
}
