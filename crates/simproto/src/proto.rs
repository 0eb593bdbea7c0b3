//! The wire protocol of the simulated driver: what a kernel ioctl interface is on a real node.
//!
//! One unix stream socket per node ([`crate::node_dir::socket_path`]). Every message is a
//! 4-byte big-endian length followed by that many bytes of JSON. A request may carry open file
//! descriptors (SCM_RIGHTS) on its first byte: that is how a client proves it holds an IMEX
//! channel, exactly as a real client passes the channel fd to
//! `NV0000_CTRL_CMD_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL`. Each connection is one RM *client*:
//! closing it frees everything the client owned, as process exit does on a real node.
//!
//! Calls are synchronous: one [`Request`], one [`Response`]. A call may block in the driver
//! (waiting for an import to complete, an unimport to be acknowledged, events to arrive), so
//! the daemon uses one connection for its session and event long-polls and another for controls.

use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};

use crate::probe::{ProbeInfo, ProbeState};

/// Node ID of a driver with no daemon session (the real driver's 0xFFFF).
pub const NO_NODE: u16 = 0xFFFF;
/// Fabric page size: every allocation and every PFN is in 2 MiB units.
pub const PAGE_SIZE: u64 = 2 << 20;
/// The reserved import ID (2^48 - 1, the real driver's `NV00F9_IMPORT_ID_MAX`, kept for
/// multicast): an import ID must be below it (`docs/reference/driver-interface.md` §1.4).
pub const IMPORT_ID_MAX: u64 = (1 << 48) - 1;
/// Tokens one FINISH_MEM_UNIMPORT takes at most (its `numTokens` is 1..256,
/// `docs/reference/driver-interface.md` §1.3, §1.4).
pub const MAX_UNIMPORT_TOKENS: usize = 256;
/// `NVreg_ImexChannelCount`'s default: the channel minors the driver allocates
/// (`docs/reference/driver-interface.md` §2). 0 disables IMEX channels.
pub const DEFAULT_IMEX_CHANNEL_COUNT: u32 = 2048;
/// `NVreg_ImexChannelCount`'s maximum (2^20).
pub const MAX_IMEX_CHANNEL_COUNT: u32 = 1 << 20;

/// The real driver's import cache key of (index, import ID) under an export UUID:
/// `(id << 16) | index` (`docs/reference/driver-interface.md` §1.4, §6.1).
pub fn import_key(index: u16, import_id: u64) -> u64 {
    (import_id << 16) | u64::from(index)
}

pub use crate::status::NvStatus;

/// One GPU of the node, as the driver reports it (NVML-level fields the libraries test).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Index on this node.
    pub index: u32,
    /// `GPU-xxxxxxxx-…`.
    pub uuid: String,
    /// HBM bytes.
    pub hbm_bytes: u64,
    /// Fabric probe: COMPLETED when the GPU is on the fabric.
    pub fabric_state: String,
    /// NVLink domain (e.g. one NVL72 rack), hex.
    pub cluster_uuid: String,
    /// Clique within the partition.
    pub clique_id: u32,
    /// HEALTHY, …
    pub health: String,
    /// First fabric address of this GPU's HBM.
    pub fabric_base: u64,
}

/// What the exporter's memory looks like on the fabric (the DESCRIBE answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricPages {
    /// Bytes.
    pub size: u64,
    /// Always [`PAGE_SIZE`] here.
    pub page_size: u64,
    /// Fabric PFNs in `page_size` units, one per page.
    pub pfns: Vec<u64>,
    /// Owner GPU's clique (a mapping GPU must match it).
    pub clique_id: u32,
    /// Owner GPU's NVLink bandwidth mode (a mapping GPU must match it), `NV_FABRIC_MEMORY_ATTRS`.
    #[serde(default)]
    pub bw_mode: u16,
    /// Owner GPU's bandwidth mode epoch (a mapping GPU must match it).
    #[serde(default)]
    pub bw_mode_epoch: u64,
}

/// A fabric event, as GET_FABRIC_EVENTS returns them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FabricEvent {
    /// MEM_IMPORT: a local client wants memory exported by `export_node`.
    Import {
        /// System-wide increasing event ID; names the import in VALIDATE.
        event_id: u64,
        /// The importer's channel (the exporter's daemon enforces it).
        channel: u32,
        /// Export UUID (16 bytes, hex).
        export_uuid: String,
        /// Handle index in the export.
        index: u16,
        /// The importer's 48-bit import ID (IMPORT_V2's `id`): with the index, it keys the
        /// import descriptor under the UUID.
        import_id: u64,
        /// Exporting node.
        export_node: u16,
    },
    /// MEM_UNIMPORT: the last local reference to an import went away; a thread is blocked
    /// until FINISH_MEM_UNIMPORT names `unimport_event_id`.
    Unimport {
        /// Token to finish.
        unimport_event_id: u64,
        /// The import event it undoes.
        import_event_id: u64,
        /// Exporting node.
        export_node: u16,
    },
    /// CLIQUE_ID_CHANGE (NV00F1_CTRL_FABRIC_EVENT_TYPE_CLIQUE_ID_CHANGE = 3): a Fabric Manager
    /// probe update gave GPU `gpu_id` a new clique. Posted on channel 0, only for an update
    /// that changes the clique, never for the first probe response
    /// (`_gpuFabricProbeSendCliqueIdChangeEvent` in `gpu_fabric_probe.c`).
    CliqueIdChange {
        /// System-wide increasing event ID (shared with imports and unimports).
        event_id: u64,
        /// Always 0.
        channel: u32,
        /// The GPU (its index on this node, the simulated driver's gpuId).
        gpu_id: u32,
        /// The GPU's new clique.
        clique_id: u32,
    },
    /// REMOTE_GPU_ATTACH: a local GPU attached to an imported multicast object; the owner's
    /// daemon must call ATTACH_REMOTE_GPU (or SET_FAILURE) on the prime
    /// (`docs/reference/driver-interface.md` §1.6 "Multicast" 3-4).
    RemoteGpuAttach {
        /// System-wide increasing event ID.
        event_id: u64,
        /// The importer's channel.
        channel: u32,
        /// The prime's export UUID (hex).
        export_uuid: String,
        /// Handle index in the export.
        index: u16,
        /// The exporting (prime's) node.
        export_node: u16,
        /// The attach, as ATTACH_REMOTE_GPU takes it.
        gpu: crate::multicast::RemoteGpu,
    },
}

/// Result the daemon pushes into a pending import (VALIDATE).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Validation {
    /// The exporter described the memory.
    Pages(FabricPages),
    /// VALIDATE with the IMPORT_FAILED flag. It carries no status: whatever went wrong on the
    /// daemons' side, the importer's object reports NV_ERR_INVALID_OBJECT from then on
    /// (`docs/reference/driver-interface.md` §1.4 VALIDATE flags, §4 "Failed import").
    ImportFailed,
}

/// Reference counts and table sizes, for tests and the demo's leak check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverStats {
    /// Node ID (0xFFFF with no session).
    pub node_id: u16,
    /// Whether a daemon session is open.
    pub session: bool,
    /// Live fabric allocations (backing memory not yet freed).
    pub allocations: usize,
    /// Live export objects (UUIDs that can still be duplicated).
    pub exports: usize,
    /// References held on exported memory by the daemon on behalf of remote importers: one
    /// per remote import (IMPORT_MEM's dup of the memory, or the protocol's DescribeExport).
    pub daemon_export_refs: usize,
    /// Export objects the daemon duplicated by UUID (NV_MEMORY_EXPORT with DUP_BY_UUID) and
    /// still holds: beside each memory dup while a remote import lives.
    #[serde(default)]
    pub daemon_export_objects: usize,
    /// Import descriptors on this node.
    pub import_descriptors: usize,
    /// Client references on import descriptors.
    pub import_refs: usize,
    /// Unimports posted and not yet finished.
    pub pending_unimports: usize,
    /// Events queued for the daemon.
    pub queued_events: usize,
    /// HBM bytes allocated, all GPUs.
    pub hbm_used: u64,
    /// Connected clients.
    pub clients: usize,
    /// Live multicast descriptors (prime and imported), each shared by its objects.
    #[serde(default)]
    pub multicast_objects: usize,
    /// Memory ranges bound to multicast objects (each holds a reference on its allocation).
    #[serde(default)]
    pub multicast_bindings: usize,
    /// GPUs attached to the multicast objects created here (the primes'), this node's and
    /// other nodes' (their remote attaches, once delivered by the daemons).
    #[serde(default)]
    pub multicast_attached: usize,
}

/// A request from a client (application or daemon) to its node's driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// First call of every client: who the node is.
    Hello {
        /// Caller's pid (for logs).
        pid: u32,
    },
    /// Subscribe this client to the IMEX channel whose file descriptor is attached.
    SubscribeChannel,
    /// cuMemCreate with the FABRIC handle type on `gpu`. Needs a channel.
    Create {
        /// GPU index on this node.
        gpu: u32,
        /// Bytes (rounded up to [`PAGE_SIZE`]).
        size: u64,
    },
    /// cuMemExportToShareableHandle(FABRIC): a 64-byte handle, hex.
    Export {
        /// Allocation handle from `Create`.
        mem: u64,
    },
    /// cuMemImportFromShareableHandle(FABRIC) (IMPORT_V2). With `wait_ms` 0 it returns at once
    /// (`Imported`; the import may be pending). With `wait_ms` above 0 it goes on to wait as
    /// `WaitImport` on the new import would, for up to `wait_ms`, and answers `ImportWaited`:
    /// the allocation and libcuda's wait on its OS event in one call, as
    /// cuMemImportFromShareableHandle makes them one after the other
    /// (`docs/reference/driver-interface.md` §1.6 "Import request" 1-4).
    Import {
        /// The 64-byte handle, hex.
        handle: String,
        /// The caller's import ID (below [`IMPORT_ID_MAX`]): imports of one handle with the same
        /// ID share a descriptor, with different IDs they do not. 0 when absent.
        #[serde(default)]
        import_id: u64,
        /// How long to wait for the import once allocated; 0 (or absent): not at all.
        #[serde(default)]
        wait_ms: u64,
    },
    /// Wait until the import is no longer pending (or `timeout_ms` passes), then report it.
    WaitImport {
        /// Import handle.
        import: u64,
        /// Bound on the wait.
        timeout_ms: u64,
    },
    /// cuMemRelease of an allocation or an import. Releasing the last reference to an import
    /// blocks until the daemon acknowledged the unimport (or the session is gone).
    Release {
        /// Allocation or import handle.
        handle: u64,
    },
    /// Counts for tests and leak checks.
    Stats,
    /// Daemon: open the IMEX session as `node_id` (one per driver).
    OpenSession {
        /// This node's ID in the IMEX domain.
        node_id: u16,
    },
    /// Daemon: dequeue up to `max` events, waiting up to `wait_ms` for the first.
    GetEvents {
        /// Session token.
        token: u64,
        /// At most this many.
        max: usize,
        /// Long-poll bound.
        wait_ms: u64,
    },
    /// Daemon, exporter side: dup the export by UUID (checking `channel`), take a reference
    /// that keeps the memory alive, and describe it.
    DescribeExport {
        /// Session token.
        token: u64,
        /// Export UUID, hex.
        export_uuid: String,
        /// Handle index.
        index: u16,
        /// The importer's channel.
        channel: u32,
    },
    /// Daemon, exporter side: drop a reference taken by `DescribeExport`.
    ReleaseExportRef {
        /// Session token.
        token: u64,
        /// The reference.
        export_ref: u64,
    },
    /// Daemon, importer side: complete (or fail) the import posted as `import_event_id`.
    Validate {
        /// Session token.
        token: u64,
        /// Names the import.
        import_event_id: u64,
        /// Pages, or the failure.
        result: Validation,
    },
    /// Daemon, importer side: acknowledge unimports, waking the blocked releasers
    /// (FINISH_MEM_UNIMPORT).
    FinishUnimport {
        /// Session token.
        token: u64,
        /// Tokens from `FabricEvent::Unimport`: 1 to [`MAX_UNIMPORT_TOKENS`] per call, else
        /// NV_ERR_INVALID_ARGUMENT.
        unimport_event_ids: Vec<u64>,
    },
    /// Daemon: disable every local client that imported from `node` (peer lost and cleaned).
    DisableImporters {
        /// Session token.
        token: u64,
        /// The lost exporter node.
        node: u16,
    },
    /// cuMemMap of `handle` (an allocation or an import) for GPU `gpu`: the driver's map check
    /// (`memoryfabricimportv2IsGpuMapAllowed`, §6.8). Answers `Ok` or the status that refuses
    /// the mapping; the caller then maps the memory it already knows.
    MapOnGpu {
        /// Allocation or import handle.
        handle: u64,
        /// GPU index on this node.
        gpu: u32,
    },
    /// NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO on `gpu`: any client may ask.
    FabricProbeInfo {
        /// GPU index on this node.
        gpu: u32,
    },
    /// The Fabric Manager's probe response for `gpu`: completes its probe. Root or the
    /// driver's own user only, as the IMEX session.
    CompleteFabricProbe {
        /// GPU index on this node.
        gpu: u32,
        /// The response.
        info: ProbeInfo,
    },
    /// A multicast (class 0xFD) allocation or control.
    Multicast(crate::multicast::McRequest),
}

/// The driver's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// To `Hello`.
    Hello {
        /// Current node ID (0xFFFF with no session).
        node_id: u16,
        /// This node's GPUs.
        gpus: Vec<GpuInfo>,
        /// The fabric directory (where HBM files live).
        fabric_dir: String,
    },
    /// To `SubscribeChannel`.
    Subscribed {
        /// The channel number (the channel file's name suffix / minor).
        channel: u32,
    },
    /// To `Create`.
    Created {
        /// Allocation handle.
        mem: u64,
        /// Rounded size.
        size: u64,
        /// HBM file holding the memory.
        file: String,
        /// Offset of the allocation in the file.
        offset: u64,
    },
    /// To `Export`.
    Exported {
        /// 64-byte fabric handle, hex.
        handle: String,
    },
    /// To `Import` with no wait (pending or ready).
    Imported {
        /// Import handle.
        import: u64,
    },
    /// To `Import` with a wait: the new import's handle (the caller owns it whatever the
    /// outcome, and releases it), and what `WaitImport` on it would have answered when the wait
    /// ended: `ImportReady`, or an error (`NotReady`: still pending when `wait_ms` passed; ask
    /// `WaitImport` to go on waiting).
    ImportWaited {
        /// Import handle.
        import: u64,
        /// `ImportReady` or `Error`.
        outcome: Box<Response>,
    },
    /// To `WaitImport`: ready to map.
    ImportReady {
        /// Bytes.
        size: u64,
        /// Backing file of the exporter's HBM (the "NVLink": a shared mapping of it).
        file: String,
        /// Offset in that file.
        offset: u64,
    },
    /// To `Stats`.
    Stats(DriverStats),
    /// To `OpenSession`.
    Session {
        /// Token for the daemon's other calls.
        token: u64,
    },
    /// To `GetEvents`.
    Events {
        /// Dequeued events.
        events: Vec<FabricEvent>,
        /// More are queued.
        more: bool,
    },
    /// To `DescribeExport`.
    Described {
        /// The daemon's reference (release with `ReleaseExportRef`).
        export_ref: u64,
        /// The pages.
        pages: FabricPages,
    },
    /// To `FabricProbeInfo`.
    FabricProbeInfo(FabricProbeInfo),
    /// To `Multicast`.
    Multicast(crate::multicast::McResponse),
    /// Success with nothing to report.
    Ok,
    /// Failure.
    Error {
        /// Status.
        status: NvStatus,
        /// What happened, for logs.
        detail: String,
    },
}

pub use crate::frame::{MAX_MESSAGE, WireError, recv, recv_arrived, recv_body, recv_within, send};

/// A frame of either kind as the driver reads it: a JSON [`Request`] or an escape.
pub type Incoming = crate::frame::Incoming<Request>;

/// Reads one frame of either kind ([`crate::frame::recv_incoming`]).
pub fn recv_incoming(sock: &UnixStream) -> Result<Incoming, WireError> {
    crate::frame::recv_incoming(sock)
}

/// One synchronous call: send `req` (with `fds`), read the response (within the socket's read
/// timeout).
pub fn call(sock: &UnixStream, req: &Request, fds: &[RawFd]) -> Result<Response, WireError> {
    send(sock, req, fds)?;
    Ok(recv::<Response>(sock)?.0)
}

/// [`call`] on a connection whose answers are awaited for as long as they take (no read
/// timeout), as a caller blocked in a real ioctl waits.
pub fn call_untimed(
    sock: &UnixStream,
    req: &Request,
    fds: &[RawFd],
) -> Result<Response, WireError> {
    send(sock, req, fds)?;
    Ok(recv_within::<Response>(sock, None)?.0)
}

/// The NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO answer for one GPU.
///
/// Until the state is [`ProbeState::Complete`] only `state` means anything: `status` is
/// NV_ERR_NOT_READY (no Fabric Manager response to report) and `info` is `None`. Once
/// complete, `status` is `None` (NV_OK) and `info` holds the response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FabricProbeInfo {
    /// GPU index on the node.
    pub gpu: u32,
    /// The probe's state.
    pub state: ProbeState,
    /// The probe's status: `None` is NV_OK.
    pub status: Option<NvStatus>,
    /// The response, once complete.
    pub info: Option<ProbeInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::SCM_MAX_FD;
    use std::io::Write;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::os::unix::net::UnixStream;

    #[test]
    fn frames_round_trip_with_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        send(&a, &Request::SubscribeChannel, &[file.as_raw_fd()]).unwrap();
        send(&a, &Request::Stats, &[]).unwrap();
        let (r1, fds1): (Request, _) = recv(&b).unwrap();
        let (r2, fds2): (Request, _) = recv(&b).unwrap();
        assert_eq!(r1, Request::SubscribeChannel);
        assert_eq!(fds1.len(), 1);
        assert_eq!(r2, Request::Stats);
        assert!(fds2.is_empty());
        drop(a);
        assert!(matches!(recv::<Request>(&b), Err(WireError::Closed)));
    }

    /// A peer may attach more descriptors than any request uses: every one the kernel
    /// installs is owned (and closed with the message), none is left open in the receiver.
    #[test]
    fn every_descriptor_received_is_owned_up_to_the_kernels_limit() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        for n in [5, SCM_MAX_FD] {
            send(&a, &Request::Stats, &vec![file.as_raw_fd(); n]).unwrap();
            let (r, fds): (Request, _) = recv(&b).unwrap();
            assert_eq!((r, fds.len()), (Request::Stats, n));
        }
    }

    /// A frame larger than the socket buffer goes in several writes; its descriptors still
    /// arrive with it and the next frame stays in step.
    #[test]
    fn a_frame_larger_than_the_socket_buffer_keeps_its_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let reader = std::thread::spawn(move || {
            let first: (Request, Vec<OwnedFd>) = recv(&b).unwrap();
            let second: (Request, Vec<OwnedFd>) = recv(&b).unwrap();
            (first, second)
        });
        let file = std::fs::File::open("/dev/null").unwrap();
        let big = Request::FinishUnimport {
            token: 1,
            unimport_event_ids: (0..100_000).collect(),
        };
        send(&a, &big, &[file.as_raw_fd()]).unwrap();
        send(&a, &Request::Stats, &[]).unwrap();
        let ((r1, fds1), (r2, fds2)) = reader.join().unwrap();
        assert_eq!(r1, big);
        assert_eq!(fds1.len(), 1);
        assert_eq!(r2, Request::Stats);
        assert!(fds2.is_empty());
    }

    #[test]
    fn every_status_is_listed_once_and_named_as_the_real_driver_names_it() {
        let names: std::collections::BTreeSet<String> =
            NvStatus::ALL.iter().map(ToString::to_string).collect();
        assert_eq!(names.len(), NvStatus::ALL.len());
        assert!(names.iter().all(|n| n.starts_with("NV_ERR_")), "{names:?}");
        // No wildcard: a new variant stops this from compiling, as a reminder to add it to ALL.
        for s in NvStatus::ALL {
            match s {
                NvStatus::InsufficientPermissions
                | NvStatus::NotReady
                | NvStatus::InvalidState
                | NvStatus::InvalidObject
                | NvStatus::NotSupported
                | NvStatus::ObjectNotFound
                | NvStatus::InUse
                | NvStatus::StateInUse
                | NvStatus::InvalidArgument
                | NvStatus::NoMemory
                | NvStatus::InvalidObjectHandle
                | NvStatus::ResetRequired
                | NvStatus::InvalidDevice
                | NvStatus::InvalidOperation
                | NvStatus::InsertDuplicateName
                | NvStatus::Generic => {}
            }
        }
    }

    #[test]
    fn an_import_request_without_an_import_id_means_id_0() {
        let r: Request = serde_json::from_str(r#"{"Import":{"handle":"ab"}}"#).unwrap();
        assert_eq!(
            r,
            Request::Import {
                handle: "ab".into(),
                import_id: 0,
                wait_ms: 0,
            }
        );
        assert_eq!(import_key(3, 5), (5 << 16) | 3);
        assert_eq!(
            import_key(u16::MAX, IMPORT_ID_MAX - 1) >> 16,
            IMPORT_ID_MAX - 1
        );
    }

    /// The wait for input before a frame keeps the socket's read timeout.
    #[test]
    fn a_read_timeout_bounds_the_wait_for_a_frame() {
        let (a, _b) = UnixStream::pair().unwrap();
        a.set_read_timeout(Some(std::time::Duration::from_millis(20)))
            .unwrap();
        match recv::<Request>(&a) {
            Err(WireError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
            other => panic!("a timeout, not {other:?}"),
        }
    }

    #[test]
    fn a_wait_given_by_the_caller_bounds_the_wait_whatever_the_socket_says() {
        let (a, b) = UnixStream::pair().unwrap();
        // The socket would wait a minute; the caller says 20 ms.
        a.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        let t = std::time::Instant::now();
        match recv_within::<Request>(&a, Some(std::time::Duration::from_millis(20))) {
            Err(WireError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
            other => panic!("a timeout, not {other:?}"),
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(30));
        // A frame that has arrived is read whole, and the next one after it.
        send(&b, &Request::Stats, &[]).unwrap();
        send(&b, &Request::Hello { pid: 7 }, &[]).unwrap();
        assert_eq!(recv_arrived::<Request>(&a).unwrap().0, Request::Stats);
        assert_eq!(
            recv_within::<Request>(&a, None).unwrap().0,
            Request::Hello { pid: 7 }
        );
    }

    #[test]
    fn oversized_and_malformed_frames_are_errors() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&u32::MAX.to_be_bytes()).unwrap();
        assert!(matches!(recv::<Request>(&b), Err(WireError::TooLarge(_))));
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(&3u32.to_be_bytes()).unwrap();
        (&a).write_all(b"{x}").unwrap();
        assert!(matches!(recv::<Request>(&b), Err(WireError::Json(_))));
    }
}
