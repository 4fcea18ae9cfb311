//! Build script: compiles etcd's v3 API protos in `proto/` (the `etcdserverpb` services,
//! and the Lock and Election services of `v3lockpb` and `v3electionpb`) into prost messages
//! and tonic server and client code, and serde impls in the JSON gateway's mapping,
//! included by `server/src/pb.rs`.
//!
//! Invariants:
//! - BUILD-1: no `protoc` is involved: `protox` parses the files in pure Rust, so a fresh
//!   machine builds with cargo alone.
//! - BUILD-2: every `bytes` field becomes `bytes::Bytes`, the type the engine's API uses, so
//!   keys and values cross the server without copies.
//! - BUILD-3: the serde impls follow etcd's gateway (grpc-gateway with `OrigName`): JSON
//!   field names are the proto field names, unknown fields are ignored, and the rest of
//!   proto3's JSON mapping (base64 bytes, 64-bit integers as strings, enum names, zero
//!   values left out) is pbjson's.
//! - BUILD-4: `KVD_GIT_COMMIT` is the commit the sources were checked out at (`git
//!   rev-parse`, 12 hex digits), or `unknown` where there is no git or no repository (a
//!   source tarball); `kvd --version` prints it, so a figure measured with a binary names
//!   the code it ran. It is taken again whenever the checked-out commit changes.
//! - BUILD-5: the generated services and clients encode and decode with
//!   `server::grpc_codec::EtcdCodec` (prost's bytes, buffers sized for etcd's calls).
//! - BUILD-6: `etcdserverpb.RangeResponse` is not generated: `server::range_wire` writes it
//!   by hand (its protobuf and serde impls), so a Range's key-values can go out in the wire
//!   form the engine wrote them in; everything that names the message uses that type.
//!
//! Contact points: `proto/` (the wire contract, `docs/design/wire-protocol.md`) and
//! `server/src/pb.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

use prost::Message;

/// etcd's `RangeResponse`, and the hand-written type that stands for it (BUILD-6).
const RANGE_RESPONSE: &str = ".etcdserverpb.RangeResponse";
const RANGE_RESPONSE_RUST: &str = "crate::range_wire::RangeResponse";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    // `rpc.proto` imports `mvccpb/kv.proto` and `authpb/auth.proto`, so one root pulls in all
    // three packages.
    // The standard health service etcd registers beside its own (HEALTH-1), and etcd's
    // Lock and Election services, which import `rpc.proto` and `kv.proto`.
    let descriptors = protox::compile(
        [
            "etcdserverpb/rpc.proto",
            "grpc/health/v1/health.proto",
            "v3lockpb/v3lock.proto",
            "v3electionpb/v3election.proto",
        ],
        ["proto"],
    )?;
    let encoded = descriptors.encode_to_vec();
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .bytes(".")
        // BUILD-5.
        .codec_path("crate::grpc_codec::EtcdCodec")
        // BUILD-6.
        .extern_path(RANGE_RESPONSE, RANGE_RESPONSE_RUST)
        .compile_fds(descriptors)?;
    // BUILD-3.
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .exclude([RANGE_RESPONSE])
        .build(&[
            ".etcdserverpb",
            ".mvccpb",
            ".authpb",
            ".v3lockpb",
            ".v3electionpb",
        ])?;
    git_commit();
    Ok(())
}

/// Runs `git` with `args` in `dir` and returns its trimmed output, if it succeeded.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.trim().to_owned())
}

/// Sets `KVD_GIT_COMMIT` (BUILD-4), and asks cargo to run this again when `HEAD` or the
/// branch it names moves (only files that exist are named: cargo reruns a build script
/// every time for a missing one).
fn git_commit() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = git(&dir, &["rev-parse", "--short=12", "HEAD"]);
    if commit.is_some() {
        let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
        watched.extend(git(&dir, &["symbolic-ref", "-q", "HEAD"]));
        for name in watched {
            // `--git-path` resolves a worktree's own and common directories.
            let Some(path) = git(&dir, &["rev-parse", "--git-path", &name]) else {
                continue;
            };
            let path = dir.join(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    println!(
        "cargo:rustc-env=KVD_GIT_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}
