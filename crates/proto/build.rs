//! Generates the gRPC code from `proto/*.proto`. protoc comes from the
//! `protoc-bin-vendored` crate so a fresh machine needs nothing installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure()
        // Prost's codec with smaller first buffers (`src/codec.rs` says why).
        .codec_path("crate::codec::SmallBufferCodec")
        .compile_protos(&["proto/peer.proto", "proto/cmd.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
