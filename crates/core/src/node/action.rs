//! What a [`Node`] asks its owner to do (the module contract of [`Node`] says how): one enum
//! for every side of the node, so the owner has one place to match.

use std::time::Duration;

#[allow(unused_imports)] // named by the docs only
use super::{
    FABRIC_REFRESH, GOODBYE_WAIT, HELLO_DEADLINE, MAX_IMPORTS_IN_FLIGHT, Node, RETIRE_WAIT,
};
use super::{Ids, ImportRequest, RequestId, StreamId};
use crate::gpu::{ImportAnswer, ImportError, Pages, RemoteGpuAttach, Status};
use crate::ids::{ConnId, NodeId};
use crate::mesh::{self, Via};

/// What the owner must do. See the module contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A mesh action: connections, heartbeats, goodbyes, link and state changes (log them),
    /// and opening the driver session (`InitDriver`).
    Mesh(mesh::Action),
    /// Importer side: ask `peer` for an import; report with [`Node::handle_import_answer`].
    /// At most [`MAX_IMPORTS_IN_FLIGHT`] are unreported per exporter (`node/outbox.rs`).
    SendImport {
        /// The exporter.
        peer: NodeId,
        /// What to ask.
        request: ImportRequest,
    },
    /// Importer side: an import that waited for a slot could not be sent when its turn came
    /// (no session carries the pair with `peer`); it failed with `error` as a transport error
    /// would have failed it, and its [`Action::ValidateImport`] follows. Count it; nothing is
    /// sent and nothing is reported back.
    ImportNotSent {
        /// The exporter.
        peer: NodeId,
        /// The import.
        import_event_id: u64,
        /// The failure, as the daemon's transport words it.
        error: ImportError,
    },
    /// Importer side: tell `peer` the import is gone; report with
    /// [`Node::handle_unimport_delivered`].
    SendUnimport {
        /// The exporter.
        peer: NodeId,
        /// The import.
        import_event_id: u64,
    },
    /// Importer side: complete a pending import with pages, or fail it.
    ValidateImport {
        /// The MEM_IMPORT event.
        import_event_id: u64,
        /// Pages or the status to fail with.
        result: Result<Pages, Status>,
    },
    /// Importer side: acknowledge unimports, waking their blocked releasers.
    FinishUnimports {
        /// Unimport event IDs.
        ids: Ids,
    },
    /// Importer side: disable every local client that imported from `node`.
    DisableImporters {
        /// The node whose memory they map.
        node: NodeId,
    },
    /// Exporter side: take a reference on an export and describe it; report with
    /// [`Node::handle_described`].
    DescribeExport {
        /// The peer request this is for.
        request: RequestId,
        /// Export UUID.
        export_uuid: [u8; 16],
        /// Handle index.
        index: u16,
        /// The importer's channel.
        channel: u32,
    },
    /// Exporter side: drop references taken by describes, then (if `ack` is set) answer that
    /// peer unimport request with `released: true`.
    ReleaseExportRefs {
        /// The references.
        refs: Ids,
        /// The unimport request to answer once they are gone.
        ack: Option<RequestId>,
    },
    /// Exporter side: answer a peer's import request.
    AnswerImport {
        /// The request.
        request: RequestId,
        /// The answer.
        answer: ImportAnswer,
    },
    /// Write the persist record: these nodes hold (or may hold) references to this node's
    /// memory. Performed before the actions that follow it (an import's answer among them).
    Persist {
        /// Importer nodes, in ID order (empty: nothing held).
        importers: Vec<NodeId>,
    },
    /// The recovery gate waits for these nodes (log it); `wait` is its bound at the start.
    RecoveryWait {
        /// Nodes still awaited.
        awaiting: Vec<NodeId>,
        /// How long it waits in all (zero in the periodic reminders).
        wait: Duration,
    },
    /// The FULL quorum stopped waiting after `IMEX_CONN_WAIT_TIMEOUT`: the node goes on to
    /// INIT_GPU without these peers (log it as a warning).
    PeersWaitOver {
        /// Peers not connected when the wait ended, in ID order.
        missing: Vec<NodeId>,
        /// How long it waited.
        waited: Duration,
    },
    /// An awaited node no longer holds anything here (log it).
    Recovered {
        /// The node.
        peer: NodeId,
        /// How.
        how: &'static str,
    },
    /// A peer's imports and exports were cleaned up here (log it).
    CleanedUp {
        /// The peer.
        peer: NodeId,
        /// Why.
        reason: &'static str,
    },
    /// A peer message was refused (counted under `reason`, `count` so far): log it, sparingly.
    Refused {
        /// The key it is counted under.
        reason: &'static str,
        /// Refusals under that key since start.
        count: u64,
        /// What was refused (peer-supplied parts are bounded by the owner's decoding).
        detail: String,
    },
    /// Exporter side: answer a peer's unimport request that released nothing.
    AnswerUnimport {
        /// The request.
        request: RequestId,
        /// Whether a reference was released (always `false` here; see `ReleaseExportRefs`).
        released: bool,
    },
    /// Exporter side: refuse a peer's unimport that no session proves (sent on a connection
    /// that no longer carries the pair, or without a hello). Unlike `AnswerUnimport`, the
    /// importer must not take it as delivered: it sends the unimport again on the pair's
    /// session, or the reference it names would stay held.
    RefuseUnimport {
        /// The request.
        request: RequestId,
        /// Why, for the importer's log.
        reason: String,
    },
    /// Close inbound connection `conn` now: it said no accepted hello within
    /// [`HELLO_DEADLINE`] of [`Node::handle_conn_accepted`] (counted as a refusal already).
    /// Its end is reported as any connection's ([`Node::handle_conn_closed`]).
    CloseConn {
        /// The connection.
        conn: ConnId,
    },
    /// End session stream `stream` now: its first frame (the hello) did not come within
    /// [`HELLO_DEADLINE`] of [`Node::handle_stream_opened`].
    CloseStream {
        /// The stream.
        stream: StreamId,
    },
    /// End session `via` of the pair with `peer` now if it is still open, failing what is
    /// still in flight on it: it was closed ([`mesh::Action::CloseSession`]) [`RETIRE_WAIT`]
    /// ago, which let the requests on it finish (a closed session ends by itself once nothing
    /// is in flight on it).
    EndSession {
        /// The peer.
        peer: NodeId,
        /// The session.
        via: Via,
    },
    /// Shutting down: stop waiting for the goodbyes ([`mesh::Action::SendGoodbye`]) and go
    /// on with the stop. Emitted once, when the last goodbye was reported
    /// ([`Node::handle_goodbye_delivered`]) or [`GOODBYE_WAIT`] after
    /// [`Node::handle_shutdown`], whichever comes first (at once if there was nobody to tell).
    GoodbyesOver {
        /// Peers whose goodbye was neither acknowledged nor failed by then, in ID order.
        unanswered: Vec<NodeId>,
    },
    /// Importer side (multicast): forward a local GPU's REMOTE_GPU_ATTACH to the prime's node
    /// (`node/multicast.rs`). Its answer is only logged: the team's outcome reaches the
    /// importer's driver from the Fabric Manager.
    SendRemoteGpuAttach {
        /// The prime's node.
        peer: NodeId,
        /// The attach.
        attach: RemoteGpuAttach,
    },
    /// Owner side (multicast): ATTACH_REMOTE_GPU of `from`'s GPU on the prime; report with
    /// [`Node::handle_remote_gpu_attached`].
    AttachRemoteGpu {
        /// The peer request this is for.
        request: RequestId,
        /// The attaching node.
        from: NodeId,
        /// The attach.
        attach: RemoteGpuAttach,
    },
    /// Owner side (multicast): SET_FAILURE on the prime of `export_uuid`.
    SetMulticastFailure {
        /// The prime's export UUID.
        export_uuid: [u8; 16],
        /// Its index in the export.
        index: u16,
        /// The importer's channel (the daemon's dup of the export names it).
        channel: u32,
        /// The failure.
        status: Status,
    },
    /// Owner side (multicast): answer a peer's remote GPU attach.
    AnswerRemoteGpuAttach {
        /// The request.
        request: RequestId,
        /// Done, or why not.
        result: Result<(), ImportError>,
    },
    /// Read the GPUs' fabric probes (off the runtime: a driver call); report with
    /// [`Node::handle_gpu_fabric`]. Asked every [`FABRIC_REFRESH`] and after a
    /// CLIQUE_ID_CHANGE; a failed read is not reported (log it).
    ReadGpuFabric,
    /// Tell `peer` the node's cliques (a notification on the pair's session: nothing answers
    /// it); report whether the session took it with [`Node::handle_cliques_sent`].
    SendCliques {
        /// The peer.
        peer: NodeId,
        /// The node's cliques now.
        cliques: Vec<u32>,
        /// Their epoch ([`Node::cliques_epoch`]).
        epoch: u64,
    },
    /// Tell `peer` the jobs it shares with this node, as (name, definition digest) (a
    /// notification on the pair's session: nothing answers it); report whether the session
    /// took it with [`Node::handle_jobs_sent`].
    SendJobs {
        /// The peer.
        peer: NodeId,
        /// Every job here with `peer` as a member.
        jobs: Vec<(String, String)>,
        /// This list's number (the node's lists count up): the peer keeps the newest.
        epoch: u64,
    },
    /// The driver posted CLIQUE_ID_CHANGE: `gpu` moved from clique `from` (`None`: a GPU the
    /// last read did not list) to `to` (log it, in NVIDIA's event name).
    CliqueChanged {
        /// The GPU index.
        gpu: u32,
        /// Its clique before.
        from: Option<u32>,
        /// Its clique now.
        to: u32,
    },
    /// A GPU's fabric health changed between two reads (log it): (summary, mask) before and
    /// after.
    GpuHealthChanged {
        /// The GPU index.
        gpu: u32,
        /// Health summary and mask before.
        from: (String, u32),
        /// Health summary and mask now.
        to: (String, u32),
    },
    /// A peer said its cliques (log it): outside every clique of this node (`shared` false),
    /// its memory imports here but does not map on this node's GPUs.
    PeerCliques {
        /// The peer.
        peer: NodeId,
        /// Its cliques.
        cliques: Vec<u32>,
        /// It shares a clique with this node (or either side's cliques are unknown).
        shared: bool,
        /// Said by a notification (a change), not a hello.
        notified: bool,
    },
}
