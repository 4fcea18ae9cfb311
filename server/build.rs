//! Build script: compiles etcd's v3 API protos in `proto/` into prost messages and tonic
//! server and client code, included by `server/src/pb.rs`.
//!
//! Invariants:
//! - BUILD-1: no `protoc` is involved: `protox` parses the files in pure Rust, so a fresh
//!   machine builds with cargo alone.
//! - BUILD-2: every `bytes` field becomes `bytes::Bytes`, the type the engine's API uses, so
//!   keys and values cross the server without copies.
//!
//! Contact points: `proto/` (the wire contract, `docs/design/wire-protocol.md`) and
//! `server/src/pb.rs`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    // `rpc.proto` imports `mvccpb/kv.proto` and `authpb/auth.proto`, so one root pulls in all
    // three packages.
    let descriptors = protox::compile(["etcdserverpb/rpc.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .bytes(".")
        .compile_fds(descriptors)?;
    Ok(())
}
