//! Build script: compiles etcd's v3 API protos in `proto/` into prost messages and tonic
//! server and client code, and serde impls in the JSON gateway's mapping, included by
//! `server/src/pb.rs`.
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
//!
//! Contact points: `proto/` (the wire contract, `docs/design/wire-protocol.md`) and
//! `server/src/pb.rs`.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    // `rpc.proto` imports `mvccpb/kv.proto` and `authpb/auth.proto`, so one root pulls in all
    // three packages.
    let descriptors = protox::compile(["etcdserverpb/rpc.proto"], ["proto"])?;
    let encoded = descriptors.encode_to_vec();
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .bytes(".")
        .compile_fds(descriptors)?;
    // BUILD-3.
    pbjson_build::Builder::new()
        .register_descriptors(&encoded)?
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .build(&[".etcdserverpb", ".mvccpb", ".authpb"])?;
    Ok(())
}
