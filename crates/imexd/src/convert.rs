//! Conversions between the wire types (`openimex-proto`) and the core's types.

use openimex_core::{Hello, InstanceId, LinkView, Mismatch, NodeId};
use openimex_proto::peer::{ConnectionStatus, Identity, Refusal};

/// Our identity as sent on the wire.
pub(crate) fn identity(hello: &Hello, driver_version: &str) -> Identity {
    Identity {
        domain_id: hello.domain_id.clone(),
        node_id: u32::from(hello.node.0),
        instance_id: hello.instance.0,
        node_map_digest: hello.digest.clone(),
        software_version: env!("CARGO_PKG_VERSION").to_string(),
        protocol_version: hello.protocol_version,
        node_map: hello.node_map.clone(),
        driver_version: driver_version.to_string(),
    }
}

/// A peer's identity, or why it cannot be one (node ID out of range).
pub(crate) fn hello(id: &Identity) -> Result<Hello, String> {
    let node =
        u16::try_from(id.node_id).map_err(|_| format!("node ID {} out of range", id.node_id))?;
    Ok(Hello {
        domain_id: id.domain_id.clone(),
        node: NodeId(node),
        instance: InstanceId(id.instance_id),
        digest: id.node_map_digest.clone(),
        node_map: id.node_map.clone(),
        protocol_version: id.protocol_version,
    })
}

pub(crate) fn refusal(m: Mismatch) -> Refusal {
    match m {
        Mismatch::NodeMap => Refusal::NodeMapMismatch,
        Mismatch::Domain => Refusal::DomainMismatch,
        Mismatch::Version => Refusal::ProtocolVersion,
        Mismatch::WrongNode => Refusal::WrongNode,
    }
}

pub(crate) fn mismatch(r: Refusal) -> Mismatch {
    match r {
        Refusal::NodeMapMismatch => Mismatch::NodeMap,
        Refusal::DomainMismatch => Mismatch::Domain,
        Refusal::ProtocolVersion => Mismatch::Version,
        Refusal::WrongNode | Refusal::ShuttingDown | Refusal::None => Mismatch::WrongNode,
    }
}

pub(crate) fn connection(l: &LinkView) -> ConnectionStatus {
    let reason = match &l.last_error {
        Some(e) if e != &l.reason => format!("{}; last attempt: {e}", l.reason),
        _ => l.reason.clone(),
    };
    ConnectionStatus {
        node_id: u32::from(l.node.0),
        status: l.status.as_str().to_string(),
        changed: l.changed,
        reason,
    }
}
