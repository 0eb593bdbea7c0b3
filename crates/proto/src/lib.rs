//! Generated gRPC code for openimex.
//!
//! - [`peer`]: daemon ↔ daemon (handshake, session, status row).
//! - [`cmd`]: the command service `openimex ctl` talks to.

#![allow(missing_docs, unreachable_pub, clippy::all)]

pub mod codec;

/// Generated modules, nested as the proto packages are so cross-package paths resolve.
pub mod openimex {
    pub mod peer {
        pub mod v1 {
            tonic::include_proto!("openimex.peer.v1");
        }
    }
    pub mod cmd {
        pub mod v1 {
            tonic::include_proto!("openimex.cmd.v1");
        }
    }
}

/// Daemon ↔ daemon protocol.
pub use openimex::peer::v1 as peer;

/// Command service protocol.
pub use openimex::cmd::v1 as cmd;

/// Wire protocol version carried in every handshake. Bump on incompatible change.
/// 3: requests and answers travel on the session stream (`SessionMsg`), both ways.
/// 4: the hello is the session stream's first frame each way, not a unary call before it.
pub const PROTOCOL_VERSION: u32 = 4;

/// The innermost cause of a transport error ("Connection refused (os error 111)"): tonic wraps
/// the OS error in layers whose own texts ("transport error") tell an operator nothing.
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        msg = s.to_string();
        cur = s.source();
    }
    msg
}
