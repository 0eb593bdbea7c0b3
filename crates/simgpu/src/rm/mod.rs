//! The driver's state ("RM", the resource manager of the real kernel module) as a plain,
//! synchronous state machine: no sockets, no threads, no clock.
//!
//! The socket server ([`crate::server`]) owns one [`Rm`] behind a mutex and turns each request
//! into one method call. Calls that block in the real driver are split in two here:
//! - [`Rm::wait_import`] answers [`ImportState::Pending`] while the import is in flight; the
//!   caller waits for a state change (any later call may have made one) and asks again.
//! - [`Rm::release`] of the last reference to a remote import answers
//!   [`Released::Unimporting`] with the unimport event ID; the caller blocks until
//!   [`Rm::unimport_pending`] turns false (FINISH_MEM_UNIMPORT named it, or the session was torn
//!   down).
//! - [`Rm::get_events`] never waits; the caller long-polls on "some event was queued".
//!
//! State follows `docs/reference/driver-interface.md` §6: the node ID (0xFFFF without a session), one
//! session slot, `allow_fabric_alloc` (true from load until a daemon session ends holding
//! export references, §4), a monotonically increasing event ID, the event FIFO, the export
//! cache, the import descriptors keyed by (UUID, `(id << 16) | index`), the unimport wait table
//! and the IMEX channel count (`NVreg_ImexChannelCount`, §2). Fabric addresses use the node's
//! *slot* (its position in the simulated NVLink domain), never the IMEX node ID, which only
//! goes into export UUIDs.

mod hbm;
mod import;
mod map;
mod multicast;
mod probe;
mod session;
mod session_dups;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::fla::GpuAddr;
use openimex_simproto::handle::{ExportUuid, FabricHandle, encode_hex};
use openimex_simproto::probe::ProbeState;
use openimex_simproto::proto::{
    DriverStats, FabricEvent, FabricPages, GpuInfo, MAX_IMEX_CHANNEL_COUNT, NO_NODE, NvStatus,
    PAGE_SIZE,
};

use hbm::Hbm;
pub use probe::{NO_FLA_RANGE, ProbeStart};
pub use session::ABRUPT_SHUTDOWN_LOG;
pub use session_dups::{ExportDup, Exported, MemoryDup};

/// A connected client (one socket connection: an application process or a daemon connection).
pub type ClientId = u64;

/// What a node's driver is built with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RmConfig {
    /// Physical position of the node in the simulated NVLink domain: names its fabric addresses
    /// and HBM files.
    pub slot: u16,
    /// GPUs on this node.
    pub gpus: u32,
    /// HBM bytes per GPU (whole [`PAGE_SIZE`] pages are used).
    pub hbm_bytes: u64,
    /// The fabric directory shared by every node (HBM files).
    pub fabric_dir: PathBuf,
    /// The NVLink domain (clusterUuid) reported by the fabric probe.
    pub cluster_uuid: [u8; 16],
    /// The GPUs' clique ID.
    pub clique_id: u32,
    /// Where the GPUs' fabric probes stand at start ([`ProbeStart::Complete`]: done, with
    /// `cluster_uuid` and `clique_id`).
    pub probe: ProbeStart,
    /// `NVreg_ImexChannelCount`: channel numbers below it are channels; 0 disables IMEX
    /// channels (subscription is NV_ERR_NOT_SUPPORTED), `docs/reference/driver-interface.md` §2.
    pub imex_channel_count: u32,
}

/// Where a piece of fabric memory lives: map `size` bytes of `file` at `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemLocation {
    /// Bytes.
    pub size: u64,
    /// HBM file.
    pub file: PathBuf,
    /// Offset in the file.
    pub offset: u64,
}

/// Answer to [`Rm::create`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Created {
    /// Allocation handle.
    pub mem: u64,
    /// The memory (size rounded up to [`PAGE_SIZE`]).
    pub location: MemLocation,
}

/// Answer to [`Rm::wait_import`] when it is not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportState {
    /// The daemon has not validated the import yet: wait and ask again.
    Pending,
    /// Mappable.
    Ready(MemLocation),
}

/// Answer to [`Rm::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// Done.
    Done,
    /// An unimport event with this ID was posted; the release completes once
    /// [`Rm::unimport_pending`] is false for it.
    Unimporting(u64),
}

/// An allocation's export object.
#[derive(Debug, Clone)]
struct ExportInfo {
    /// The handle handed out (the same on every export of the allocation).
    handle: FabricHandle,
    /// The exporter's channel: dups must name it.
    channel: u32,
}

/// Physical fabric memory.
#[derive(Debug)]
struct Alloc {
    gpu: u32,
    offset: u64,
    size: u64,
    /// The creator's handle (1 while not released) + daemon export references + local imports.
    /// The memory, and the export object with it, lives while this is above 0.
    refs: usize,
    export: Option<ExportInfo>,
}

/// The import cache key: the export UUID and `(id << 16) | index`
/// ([`openimex_simproto::proto::import_key`]).
type ImportKey = (ExportUuid, u64);

/// An import descriptor: every local import of one (export UUID, index, import ID) shares it.
#[derive(Debug)]
struct Desc {
    key: ImportKey,
    channel: u32,
    export_node: u16,
    state: DescState,
    /// Client references (import handles).
    refs: usize,
    /// Set once the last reference went and the unimport event was posted.
    unimport: Option<u64>,
    /// Claimed by the daemon's NV_MEMORY_FABRIC_IMPORTED_REF (`extUsageCount` of
    /// `importDescriptorGetUnused`): no second reference object may claim it.
    claimed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum DescState {
    Pending,
    Ready(FabricPages),
    /// VALIDATE with IMPORT_FAILED: the real driver installs a NULL memdesc, and every use
    /// reports NV_ERR_INVALID_OBJECT.
    Failed,
}

/// An object a client holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owned {
    /// An allocation it created (the key of `Rm::allocs`).
    Alloc(u64),
    /// An import of memory exported on this node: a reference on the allocation.
    LocalImport(u64),
    /// An import of remote memory: a reference on the descriptor (key: its import event ID).
    RemoteImport(u64),
    /// An import whose descriptor was removed under it (DISABLE_IMPORTERS, session teardown);
    /// every use reports the status.
    DeadImport(NvStatus),
    /// A multicast object: a reference on the descriptor (key of the multicast state's
    /// descriptors).
    Multicast(u64),
    /// A dup by UUID of an export object (NV_MEMORY_EXPORT with DUP_BY_UUID): a reference on
    /// what it exports, as the dup's `refCount` on the export descriptor keeps the attached
    /// memory (`_memoryexportDup`).
    ExportDup(Exported),
    /// IMPORT_MEM's dup of exported unicast memory (an NV_MEMORY_FABRIC object in the
    /// importing client): a reference on the allocation (key of `Rm::allocs`).
    MemoryDup(u64),
}

#[derive(Debug, Default)]
struct Client {
    /// `None` until subscribed; one channel for life.
    channel: Option<u32>,
    /// RC'd: every later GPU operation fails with ResetRequired.
    disabled: bool,
    handles: BTreeMap<u64, Owned>,
}

#[derive(Debug)]
struct Session {
    client: ClientId,
    token: u64,
}

/// One node's driver state. See the module doc.
#[derive(Debug)]
pub struct Rm {
    config: RmConfig,
    hbm: Hbm,
    /// IMEX node ID ([`NO_NODE`] without a session).
    node_id: u16,
    session: Option<Session>,
    allow_fabric_alloc: bool,
    /// Next fabric event ID (imports and unimports share the sequence).
    next_event_id: u64,
    /// Next handle for allocations, imports and daemon export references.
    next_handle: u64,
    next_exp_id: u64,
    next_client: ClientId,
    events: VecDeque<FabricEvent>,
    /// Events queued since load (never decreases; a teardown's flush does not undo it): the
    /// server signals the session's OS event whenever it grew (`osSetEvent` in
    /// `_fabricNotifyEvent`).
    events_posted: u64,
    /// The importer's channel of each queued MEM_UNIMPORT (the protocol's event has none;
    /// the RM's carries it: `_initUnimportFabricEvent`), by unimport event ID.
    unimport_channels: HashMap<u64, u32>,
    clients: HashMap<ClientId, Client>,
    allocs: HashMap<u64, Alloc>,
    /// Export UUID → allocation, for dup by UUID and local imports.
    export_cache: HashMap<ExportUuid, u64>,
    /// The daemon's references (DescribeExport) → allocation.
    export_refs: HashMap<u64, u64>,
    /// Import descriptors by import event ID.
    descs: HashMap<u64, Desc>,
    /// (export UUID, `(id << 16) | index`) → import event ID, for descriptors still taking
    /// references.
    import_cache: HashMap<ImportKey, u64>,
    /// Unimport wait table: unimport event ID → import event ID.
    unimports: HashMap<u64, u64>,
    /// Clients disabled since the server last asked ([`Rm::take_revoked`]): their processes
    /// are killed, as the real driver RCs their channels and the job dies.
    revoked: Vec<ClientId>,
    /// Each GPU's fabric probe, by index.
    probes: Vec<probe::Probe>,
    /// Multicast descriptors and the messages for the Fabric Manager.
    mc: multicast::McState,
}

impl Rm {
    /// Builds the driver, creating (or resetting) the GPUs' HBM files in the fabric directory.
    pub fn new(config: RmConfig) -> io::Result<Self> {
        if config.gpus == 0 || config.gpus > crate::fla::MAX_GPUS_PER_NODE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} GPUs: a node has 1 to {}",
                    config.gpus,
                    crate::fla::MAX_GPUS_PER_NODE
                ),
            ));
        }
        if config.imex_channel_count > MAX_IMEX_CHANNEL_COUNT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "IMEX channel count {}: the driver allows 0 to {MAX_IMEX_CHANNEL_COUNT}",
                    config.imex_channel_count
                ),
            ));
        }
        if config.slot == NO_NODE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "slot 65535 is reserved",
            ));
        }
        let hbm = Hbm::create(
            &config.fabric_dir,
            config.slot,
            config.gpus,
            config.hbm_bytes,
        )?;
        let probes = vec![probe::Probe::at_start(config.probe); config.gpus as usize];
        let mut rm = Self {
            config,
            hbm,
            node_id: NO_NODE,
            session: None,
            // The real driver allows fabric allocations from load; only a daemon session that
            // ends holding export references disables them (§4, "Daemon dies or restarts" 1).
            allow_fabric_alloc: true,
            next_event_id: 1,
            next_handle: 1,
            next_exp_id: 1,
            next_client: 1,
            events: VecDeque::new(),
            events_posted: 0,
            unimport_channels: HashMap::new(),
            clients: HashMap::new(),
            allocs: HashMap::new(),
            export_cache: HashMap::new(),
            export_refs: HashMap::new(),
            descs: HashMap::new(),
            import_cache: HashMap::new(),
            unimports: HashMap::new(),
            revoked: Vec::new(),
            probes,
            mc: Default::default(),
        };
        if rm.config.probe == ProbeStart::Complete {
            for gpu in 0..rm.config.gpus {
                let info = rm.default_probe_info(gpu);
                rm.complete_probe(gpu, info)
                    .map_err(|s| io::Error::new(io::ErrorKind::InvalidInput, s.to_string()))?;
            }
        }
        Ok(rm)
    }

    /// Clients disabled (RC'd) since the last call, for the server to kill their processes.
    pub fn take_revoked(&mut self) -> Vec<ClientId> {
        std::mem::take(&mut self.revoked)
    }

    /// The configuration.
    pub fn config(&self) -> &RmConfig {
        &self.config
    }

    /// Current node ID ([`NO_NODE`] without a session).
    pub fn node_id(&self) -> u16 {
        self.node_id
    }

    /// Whether fabric allocations are allowed: true from load, false once a daemon session
    /// ended holding export references, true again when the next session opens (§4).
    pub fn allow_fabric_alloc(&self) -> bool {
        self.allow_fabric_alloc
    }

    /// Whether `client` was disabled (RC'd).
    pub fn is_disabled(&self, client: ClientId) -> bool {
        self.clients.get(&client).is_some_and(|c| c.disabled)
    }

    /// The node's GPUs as the driver reports them: the fabric fields come from each GPU's
    /// probe (an all-zero clusterUuid, clique 0 and no health before it completes, as NVML
    /// reports them).
    pub fn gpus(&self) -> Vec<GpuInfo> {
        (0..self.hbm.gpu_count())
            .map(|index| {
                let probe = self.probes.get(index as usize);
                let info = probe.and_then(|p| p.info.as_ref());
                GpuInfo {
                    index,
                    uuid: gpu_uuid(&self.config.cluster_uuid, self.config.slot, index),
                    hbm_bytes: self.hbm.bytes_per_gpu(),
                    fabric_state: probe
                        .map_or(ProbeState::Unsupported, |p| p.state)
                        .nvml_name()
                        .into(),
                    cluster_uuid: info
                        .map_or_else(|| encode_hex(&[0; 16]), |i| i.cluster_uuid.clone()),
                    clique_id: info.map_or(0, |i| i.clique_id),
                    health: info.map_or("", |i| i.health_summary.name()).into(),
                    fabric_base: self.gpu_addr(index).base(),
                }
            })
            .collect()
    }

    /// The fabric directory.
    pub fn fabric_dir(&self) -> &Path {
        &self.config.fabric_dir
    }

    /// A new client (a connection opened).
    pub fn connect(&mut self) -> ClientId {
        let id = self.next_client;
        self.next_client += 1;
        self.clients.insert(id, Client::default());
        id
    }

    /// The client went away (process exit, crash): release everything it owned as if it called
    /// [`Rm::release`] on each handle, and tear the session down if it owned it. Returns the
    /// unimports posted; the caller waits for each as a blocking release would.
    pub fn disconnect(&mut self, client: ClientId) -> Vec<u64> {
        if self.session.as_ref().is_some_and(|s| s.client == client) {
            self.teardown_session();
        }
        let Some(c) = self.clients.get(&client) else {
            return Vec::new();
        };
        let handles: Vec<u64> = c.handles.keys().copied().collect();
        let mut unimports = Vec::new();
        for h in handles {
            if let Ok(Released::Unimporting(id)) = self.release(client, h) {
                unimports.push(id);
            }
        }
        self.clients.remove(&client);
        unimports
    }

    /// SUBSCRIBE_TO_IMEX_CHANNEL, once the caller resolved the passed descriptor to `channel`.
    /// See [`Rm::subscribe_descriptor`].
    pub fn subscribe(&mut self, client: ClientId, channel: u32) -> Result<u32, NvStatus> {
        self.subscribe_descriptor(client, Some(channel))
    }

    /// SUBSCRIBE_TO_IMEX_CHANNEL with the passed descriptor resolved to the number of the
    /// channel file it is open on (`None`: not open on a channel file of this node).
    /// `docs/reference/driver-interface.md` §2: NV_ERR_NOT_SUPPORTED when the channel count is 0
    /// (checked first: with no channels there is no channel device to check the descriptor
    /// against); NV_ERR_INSUFFICIENT_PERMISSIONS when the descriptor is not a channel, which is
    /// also the case of a file numbered at or above the channel count (no such minor);
    /// idempotent for the same channel; NV_ERR_STATE_IN_USE for a different one.
    pub fn subscribe_descriptor(
        &mut self,
        client: ClientId,
        channel: Option<u32>,
    ) -> Result<u32, NvStatus> {
        let count = self.config.imex_channel_count;
        let c = self.active_client_mut(client)?;
        if count == 0 {
            return Err(NvStatus::NotSupported);
        }
        let channel = channel
            .filter(|&n| n < count)
            .ok_or(NvStatus::InsufficientPermissions)?;
        match c.channel {
            Some(cur) if cur != channel => Err(NvStatus::StateInUse),
            _ => {
                c.channel = Some(channel);
                Ok(channel)
            }
        }
    }

    /// cuMemCreate(FABRIC) on `gpu`.
    pub fn create(&mut self, client: ClientId, gpu: u32, size: u64) -> Result<Created, NvStatus> {
        self.subscribed_channel(client)?;
        if !self.allow_fabric_alloc {
            return Err(NvStatus::InvalidState);
        }
        if size == 0 || gpu >= self.hbm.gpu_count() {
            return Err(NvStatus::InvalidArgument);
        }
        self.check_fla_range(gpu)?;
        let pages = size.div_ceil(PAGE_SIZE);
        let size = pages
            .checked_mul(PAGE_SIZE)
            .ok_or(NvStatus::InvalidArgument)?;
        let offset = self.hbm.alloc(gpu, pages).ok_or(NvStatus::NoMemory)?;
        let mem = self.new_handle();
        self.allocs.insert(
            mem,
            Alloc {
                gpu,
                offset,
                size,
                refs: 1,
                export: None,
            },
        );
        self.client_mut(client)?
            .handles
            .insert(mem, Owned::Alloc(mem));
        Ok(Created {
            mem,
            location: self.location_of(gpu, offset, size),
        })
    }

    /// cuMemExportToShareableHandle(FABRIC): the 64-byte handle, hex. Exporting the same
    /// allocation again returns the same handle. The UUID carries the node ID at export time:
    /// 0xFFFF while no daemon session is open, which no other node can ever import
    /// (`docs/reference/driver-interface.md` §1.4, export packet).
    pub fn export(&mut self, client: ClientId, mem: u64) -> Result<String, NvStatus> {
        let channel = self.subscribed_channel(client)?;
        let Some(Owned::Alloc(id)) = self.client(client)?.handles.get(&mem).copied() else {
            return Err(NvStatus::InvalidObjectHandle);
        };
        let alloc = self.allocs.get(&id).ok_or(NvStatus::InvalidObjectHandle)?;
        if let Some(e) = &alloc.export {
            return Ok(e.handle.to_hex());
        }
        let export_uuid = ExportUuid::new(self.next_exp_id, self.node_id);
        self.next_exp_id += 1;
        let handle = FabricHandle {
            export_uuid,
            index: 0,
            size: alloc.size,
            cluster_uuid: self.config.cluster_uuid,
        };
        if let Some(a) = self.allocs.get_mut(&id) {
            a.export = Some(ExportInfo { handle, channel });
        }
        self.export_cache.insert(export_uuid, id);
        Ok(handle.to_hex())
    }

    /// cuMemRelease of an allocation or an import handle.
    ///
    /// Allowed on a disabled client: freeing always works, as it does for an RC'd process.
    pub fn release(&mut self, client: ClientId, handle: u64) -> Result<Released, NvStatus> {
        let owned = self
            .client_mut(client)?
            .handles
            .remove(&handle)
            .ok_or(NvStatus::InvalidObjectHandle)?;
        match owned {
            Owned::Alloc(id) | Owned::LocalImport(id) => {
                self.unref_alloc(id);
                Ok(Released::Done)
            }
            Owned::DeadImport(_) => Ok(Released::Done),
            Owned::RemoteImport(event_id) => Ok(self.unref_desc(event_id)),
            Owned::Multicast(id) | Owned::ExportDup(Exported::Multicast(id)) => {
                self.mc_unref(id);
                Ok(Released::Done)
            }
            Owned::ExportDup(Exported::Alloc(id)) | Owned::MemoryDup(id) => {
                self.unref_alloc(id);
                Ok(Released::Done)
            }
        }
    }

    /// Whether the unimport `id` is still waiting for FINISH_MEM_UNIMPORT (false once finished,
    /// after a session teardown, or for an unknown ID).
    pub fn unimport_pending(&self, id: u64) -> bool {
        self.unimports.contains_key(&id)
    }

    /// Reference counts and table sizes. `import_refs` counts local imports too (each holds a
    /// reference on the exporter's allocation), so that it returns to 0 only when every import
    /// handle is gone.
    pub fn stats(&self) -> DriverStats {
        let local_imports = self
            .clients
            .values()
            .flat_map(|c| c.handles.values())
            .filter(|o| matches!(o, Owned::LocalImport(_)))
            .count();
        let count = |pred: fn(&Owned) -> bool| {
            self.clients
                .values()
                .flat_map(|c| c.handles.values())
                .filter(|o| pred(o))
                .count()
        };
        let memory_dups = count(|o| matches!(o, Owned::MemoryDup(_)));
        let export_dups = count(|o| matches!(o, Owned::ExportDup(_)));
        DriverStats {
            node_id: self.node_id,
            session: self.session.is_some(),
            allocations: self.allocs.len(),
            exports: self.export_cache.len(),
            daemon_export_refs: self.export_refs.len() + memory_dups,
            daemon_export_objects: export_dups,
            import_descriptors: self.descs.len(),
            import_refs: self.descs.values().map(|d| d.refs).sum::<usize>() + local_imports,
            pending_unimports: self.unimports.len(),
            queued_events: self.events.len(),
            hbm_used: self.hbm.used(),
            clients: self.clients.len(),
            multicast_objects: self.mc.counts().0,
            multicast_bindings: self.mc.counts().1,
            multicast_attached: self.mc.attached(),
        }
    }

    // ---- helpers ----

    fn new_handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    /// Queues `event` for the daemon (`fabricPostEventsV2`): the server signals the session's
    /// OS event because [`Rm::events_posted`] grew.
    fn post_event(&mut self, event: FabricEvent) {
        self.events.push_back(event);
        self.events_posted += 1;
    }

    /// Queues MEM_UNIMPORT `event` of an import on `channel`.
    fn post_unimport(&mut self, event: FabricEvent, channel: u32) {
        if let FabricEvent::Unimport {
            unimport_event_id, ..
        } = event
        {
            self.unimport_channels.insert(unimport_event_id, channel);
        }
        self.post_event(event);
    }

    fn next_event(&mut self) -> u64 {
        let id = self.next_event_id;
        self.next_event_id += 1;
        id
    }

    fn gpu_addr(&self, gpu: u32) -> GpuAddr {
        GpuAddr {
            node: self.config.slot,
            gpu,
        }
    }

    fn location_of(&self, gpu: u32, offset: u64, size: u64) -> MemLocation {
        let file = self.hbm.path(gpu).map_or_else(
            || self.gpu_addr(gpu).hbm_file(&self.config.fabric_dir),
            Path::to_path_buf,
        );
        MemLocation { size, file, offset }
    }

    fn client(&self, client: ClientId) -> Result<&Client, NvStatus> {
        self.clients.get(&client).ok_or(NvStatus::InvalidArgument)
    }

    fn client_mut(&mut self, client: ClientId) -> Result<&mut Client, NvStatus> {
        self.clients
            .get_mut(&client)
            .ok_or(NvStatus::InvalidArgument)
    }

    fn active_client_mut(&mut self, client: ClientId) -> Result<&mut Client, NvStatus> {
        let c = self.client_mut(client)?;
        if c.disabled {
            Err(NvStatus::ResetRequired)
        } else {
            Ok(c)
        }
    }

    /// The client's channel: ResetRequired when disabled, InsufficientPermissions when not
    /// subscribed.
    fn subscribed_channel(&mut self, client: ClientId) -> Result<u32, NvStatus> {
        self.active_client_mut(client)?
            .channel
            .ok_or(NvStatus::InsufficientPermissions)
    }

    /// Drops one reference on an allocation; the last frees the memory and its export.
    fn unref_alloc(&mut self, id: u64) {
        let Some(a) = self.allocs.get_mut(&id) else {
            return;
        };
        a.refs = a.refs.saturating_sub(1);
        if a.refs > 0 {
            return;
        }
        if let Some(a) = self.allocs.remove(&id) {
            if let Some(e) = &a.export
                && self.export_cache.get(&e.handle.export_uuid) == Some(&id)
            {
                self.export_cache.remove(&e.handle.export_uuid);
            }
            self.hbm.free(a.gpu, a.offset, a.size);
        }
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, deterministic in (cluster, slot, gpu).
pub fn gpu_uuid(cluster_uuid: &[u8; 16], slot: u16, gpu: u32) -> String {
    let mut h = Sha256::new();
    h.update(b"openimex-gpu");
    h.update(cluster_uuid);
    h.update(slot.to_le_bytes());
    h.update(gpu.to_le_bytes());
    let d = encode_hex(&h.finalize()[..16]);
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &d[..8],
        &d[8..12],
        &d[12..16],
        &d[16..20],
        &d[20..32]
    )
}
