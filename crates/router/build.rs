//! Generates the Rust types of `proto/siphon/outbox/v1/event.proto` with prost, parsing the
//! .proto with protox (pure Rust), so building needs no `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest.join("../../proto");
    let file = proto_root.join("siphon/outbox/v1/event.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let descriptors = protox::compile([&file], [&proto_root])?;
    prost_build::Config::new()
        .bytes(["."])
        .btree_map(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
