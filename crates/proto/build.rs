//! Generates the gRPC code from `proto/*.proto`. protoc comes from the
//! `protoc-bin-vendored` crate so a fresh machine needs nothing installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    tonic_prost_build::configure()
        // Prost's codec with smaller first buffers (`src/codec.rs` says why).
        .codec_path("crate::codec::SmallBufferCodec")
        // A session frame's rare, large parts boxed (the identities, the handshake, a status
        // row), so the frame itself is small (400 bytes before, 136 now): a session's send
        // queue holds frames unboxed, and each import's request and answer cost no allocation.
        .boxed(".openimex.peer.v1.SessionMsg.from")
        .boxed(".openimex.peer.v1.SessionMsg.body.status_reply")
        .boxed(".openimex.peer.v1.SessionMsg.body.goodbye")
        .boxed(".openimex.peer.v1.SessionMsg.body.hello")
        .boxed(".openimex.peer.v1.SessionMsg.body.hello_reply")
        .boxed(".openimex.peer.v1.ImportRequest.from")
        .boxed(".openimex.peer.v1.UnimportRequest.from")
        .compile_protos(&["proto/peer.proto", "proto/cmd.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
