//! Generates the gRPC code for `proto/idemd/v1/idempotency.proto`.
//!
//! The build must not depend on a system `protoc`: the `protoc-bin-vendored`
//! crate ships one, and its bundled include directory provides the
//! well-known types (`google/protobuf/duration.proto`, ...).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let well_known = protoc_bin_vendored::include_path()?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);

    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("idemd_descriptor.bin"))
        .compile_with_config(
            config,
            &[PathBuf::from("proto/idemd/v1/idempotency.proto")],
            &[PathBuf::from("proto"), well_known],
        )?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
