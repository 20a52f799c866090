//! Compiles the etcd-v3-compatible protobuf definitions in `proto/`.
//!
//! A vendored `protoc` is used so that no system protobuf compiler is needed.

use std::io;

const PROTOS: &[&str] = &[
    "proto/mvccpb/kv.proto",
    "proto/authpb/auth.proto",
    "proto/etcdserverpb/rpc.proto",
    "proto/v3lockpb/v3lock.proto",
    "proto/v3electionpb/v3election.proto",
    // ephd's own messages between cluster members (not etcd's wire format).
    "proto/ephd/raft_entry.proto",
    "proto/ephd/membership.proto",
];

fn main() -> io::Result<()> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");

    match protoc_bin_vendored::protoc_bin_path() {
        // Edition 2021: `set_var` is safe; build scripts are single-threaded here.
        Ok(path) => std::env::set_var("PROTOC", path),
        // Unsupported host: fall back to an explicitly provided PROTOC, if any.
        Err(err) if std::env::var_os("PROTOC").is_none() => {
            return Err(io::Error::other(format!("no vendored protoc: {err}")));
        }
        Err(_) => {}
    }

    // The descriptors of every message, so the JSON gateway (src/gateway)
    // converts JSON to and from protobuf by name, as grpc-gateway does.
    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("ephd_descriptors.bin"))
        .build_server(true)
        .build_client(true)
        // Decode every protobuf `bytes` field as `bytes::Bytes` (cheap clones).
        .bytes(".")
        // Our codec sizes each encode buffer exactly (see src/proto/codec.rs).
        .codec_path("crate::proto::codec::ExactCodec")
        .compile_protos(PROTOS, &["proto"])
}
