//! NV_ESC_RM_ALLOC and NV_ESC_RM_FREE: clients and objects, in the order of the checks of
//! `serverAllocResource` / `serverAllocResourceUnderLock` (rs_server.c, alloc_free.c) and
//! `serverFreeResourceTree`, and the constructors and destructors of the classes the daemon
//! allocates (client, Device, Subdevice, NV_IMEX_SESSION, NV_MEMORY_EXPORT by UUID,
//! NV_MEMORY_FABRIC_IMPORTED_REF).
//!
//! The argument is NVOS64 (or the older NVOS21); the status goes in its `status` field and
//! the ioctl returns 0. The allocation parameters are copied in with the class's size
//! (`rmapiParamsCopyInit` takes it from the class table, not from `paramsSize`) and copied
//! back only on success (`serverAllocApiCopyOut` skips the copy-out on an error).

use std::mem::size_of;

use openimex_rmabi::NvHandle;
use openimex_rmabi::class::client::{NV0080_ALLOC_PARAMETERS, NV2080_ALLOC_PARAMETERS};
use openimex_rmabi::class::nv00e0::{
    NV_MEM_EXPORT_FLAGS_DUP_BY_UUID, NV00E0_ALLOCATION_PARAMETERS,
};
use openimex_rmabi::class::nv00f1::{NV_FABRIC_INVALID_NODE_ID, NV00F1_ALLOCATION_PARAMETERS};
use openimex_rmabi::class::nv00fb::NV00FB_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::{
    NV_IMEX_SESSION, NV_MEMORY_EXPORT, NV_MEMORY_FABRIC_IMPORTED_REF, NV01_DEVICE_0, NV01_ROOT,
    NV01_ROOT_CLIENT, NV01_ROOT_NON_PRIV, NV20_SUBDEVICE_0,
};
use openimex_rmabi::escape::{NVOS00_PARAMETERS, NVOS21_PARAMETERS, NVOS64_PARAMETERS};
use openimex_simproto::escape::EscapeCall;
use openimex_simproto::handle::ExportUuid;

use super::handles::{Client, ImportedRef, Kind, Object};
use super::status::{
    self, NV_ERR_IN_USE, NV_ERR_INSERT_DUPLICATE_NAME, NV_ERR_INSUFFICIENT_PERMISSIONS,
    NV_ERR_INSUFFICIENT_RESOURCES, NV_ERR_INVALID_ADDRESS, NV_ERR_INVALID_ARGUMENT,
    NV_ERR_INVALID_CLASS, NV_ERR_INVALID_CLIENT, NV_ERR_INVALID_OBJECT_HANDLE,
    NV_ERR_INVALID_OBJECT_PARENT, NV_ERR_INVALID_STATE, NV_ERR_NOT_SUPPORTED,
    NV_ERR_OBJECT_NOT_FOUND, NV_ERR_STATE_IN_USE, NV_OK, NV_WARN_NOTHING_TO_DO,
};
use super::{Caller, Outcome, RmApi, SessionRec, passed_fd, read, write};
use crate::rm::Rm;

/// The fields of NVOS64 / NVOS21 the allocation uses.
#[derive(Debug, Clone, Copy)]
struct AllocArg {
    h_root: NvHandle,
    h_parent: NvHandle,
    h_new: NvHandle,
    class: u32,
    params_size: u32,
    /// NVOS64 (else NVOS21).
    v64: bool,
}

impl AllocArg {
    fn read(arg: &[u8]) -> Option<Self> {
        if arg.len() == size_of::<NVOS64_PARAMETERS>() {
            let p: NVOS64_PARAMETERS = read(arg)?;
            Some(Self {
                h_root: p.hRoot,
                h_parent: p.hObjectParent,
                h_new: p.hObjectNew,
                class: p.hClass,
                params_size: p.paramsSize,
                v64: true,
            })
        } else {
            let p: NVOS21_PARAMETERS = read(arg)?;
            Some(Self {
                h_root: p.hRoot,
                h_parent: p.hObjectParent,
                h_new: p.hObjectNew,
                class: p.hClass,
                params_size: p.paramsSize,
                v64: false,
            })
        }
    }

    /// Writes `hObjectNew`, `hClass` and `status` back.
    fn write(&self, arg: &mut [u8], status: u32) {
        if self.v64 {
            if let Some(mut p) = read::<NVOS64_PARAMETERS>(arg) {
                p.hObjectNew = self.h_new;
                p.hClass = self.class;
                p.status = status;
                write(arg, &p);
            }
        } else if let Some(mut p) = read::<NVOS21_PARAMETERS>(arg) {
            p.hObjectNew = self.h_new;
            p.hClass = self.class;
            p.status = status;
            write(arg, &p);
        }
    }
}

/// Whether `class` is one of the root (client) classes.
fn is_client_class(class: u32) -> bool {
    matches!(class, NV01_ROOT | NV01_ROOT_NON_PRIV | NV01_ROOT_CLIENT)
}

/// The allocation parameters as copied in: `None` for a NULL pointer (no bytes sent).
type Params<'a> = Option<&'a mut [u8]>;

impl RmApi {
    /// NV_ESC_RM_ALLOC. The root classes are rewritten to NV01_ROOT_CLIENT in the argument
    /// (`RmIoctl`: "Force userspace client allocations to be the _CLIENT class").
    pub(super) fn rm_alloc(
        &mut self,
        rm: &mut Rm,
        caller: &Caller<'_>,
        call: &EscapeCall,
        arg: &mut [u8],
        params: &mut [u8],
    ) -> Outcome {
        let Some(mut a) = AllocArg::read(arg) else {
            return Outcome::einval();
        };
        if is_client_class(a.class) {
            a.class = NV01_ROOT_CLIENT;
        }
        let original = params.to_vec();
        let status = self.alloc(rm, caller, call, &mut a, params);
        if status != NV_OK {
            // No copy-out on an error.
            params.copy_from_slice(&original);
        }
        a.write(arg, status);
        Outcome {
            errno: 0,
            status: Some(status),
            what: Some(a.class),
            params_size: a.params_size,
            wakes: status == NV_OK,
        }
    }

    fn alloc(
        &mut self,
        rm: &mut Rm,
        caller: &Caller<'_>,
        call: &EscapeCall,
        a: &mut AllocArg,
        params: &mut [u8],
    ) -> u32 {
        // serverAllocApiCopyIn → rmapiParamsCopyInit: an unknown class is
        // NV_ERR_INVALID_CLASS; a required block with a NULL pointer NV_ERR_INVALID_ARGUMENT;
        // a block shorter than the class's struct faults in the copy
        // (`os_memcpy_from_user`: NV_ERR_INVALID_ADDRESS).
        let layout = self.config.layout;
        let Some(size) = layout.alloc_params_size(a.class) else {
            return NV_ERR_INVALID_CLASS;
        };
        let required =
            !matches!(a.class, NV01_DEVICE_0 | NV20_SUBDEVICE_0) && !is_client_class(a.class);
        let block: Params<'_> = if params.is_empty() {
            if required {
                return NV_ERR_INVALID_ARGUMENT;
            }
            None
        } else if params.len() < size {
            return NV_ERR_INVALID_ADDRESS;
        } else {
            Some(&mut params[..size])
        };
        if is_client_class(a.class) {
            return self.alloc_client(rm, caller, a);
        }
        // _serverLockClientWithLockInfo: an unknown client is NV_ERR_INVALID_OBJECT_HANDLE;
        // an inactive (disabled) one NV_ERR_INVALID_STATE; one of another file
        // NV_ERR_INVALID_CLIENT (`rmclientValidate`, strict client validation).
        let h_client = a.h_root;
        let Some(client) = self.clients.map.get(&h_client) else {
            return NV_ERR_INVALID_OBJECT_HANDLE;
        };
        if rm.is_disabled(client.rm) {
            return NV_ERR_INVALID_STATE;
        }
        if client.file != caller.file {
            return NV_ERR_INVALID_CLIENT;
        }
        // serverAllocResourceUnderLock: a non-client object named like its client has no
        // valid parent; the parent must exist; a single-instance class (NV_IMEX_SESSION)
        // may have one object per parent (NV_ERR_STATE_IN_USE); the parent's class must be
        // one of the class's parents.
        if a.h_new == h_client {
            return NV_ERR_INVALID_OBJECT_PARENT;
        }
        let parent_kind = if a.h_parent == h_client {
            None
        } else {
            match client.objects.get(&a.h_parent) {
                Some(o) => Some(&o.kind),
                None => return NV_ERR_OBJECT_NOT_FOUND,
            }
        };
        let (parent_ok, single) = match a.class {
            NV20_SUBDEVICE_0 => (matches!(parent_kind, Some(Kind::Device { .. })), false),
            NV01_DEVICE_0 | NV_MEMORY_EXPORT | NV_MEMORY_FABRIC_IMPORTED_REF => {
                (parent_kind.is_none(), false)
            }
            NV_IMEX_SESSION => (parent_kind.is_none(), true),
            // The kernel knows these classes; the simulation serves them to applications
            // through its own protocol, not through escapes.
            _ => {
                tracing::warn!(
                    class = a.class,
                    "RM_ALLOC of class {:#x} is not simulated on the escape path",
                    a.class
                );
                return NV_ERR_NOT_SUPPORTED;
            }
        };
        if single
            && client
                .objects
                .values()
                .any(|o| o.parent == a.h_parent && o.class == a.class)
        {
            return NV_ERR_STATE_IN_USE;
        }
        if !parent_ok {
            return NV_ERR_INVALID_OBJECT_PARENT;
        }
        // clientAssignResourceHandle: 0 asks the RM for one; a taken one is
        // NV_ERR_INSERT_DUPLICATE_NAME. The handle is written back even if the constructor
        // then fails (`_rmAlloc` copies `hResource` out unconditionally).
        let Some(client) = self.clients.map.get_mut(&h_client) else {
            return NV_ERR_INVALID_OBJECT_HANDLE;
        };
        if a.h_new == 0 {
            match client.gen_handle(h_client) {
                Some(h) => a.h_new = h,
                None => return NV_ERR_INSUFFICIENT_RESOURCES,
            }
        } else if client.objects.contains_key(&a.h_new) {
            return NV_ERR_INSERT_DUPLICATE_NAME;
        }
        let built = match a.class {
            NV01_DEVICE_0 => construct_device(caller, rm.config().gpus, block),
            NV20_SUBDEVICE_0 => self.construct_subdevice(h_client, a.h_parent, block),
            NV_IMEX_SESSION => self.construct_session(rm, call, h_client, a.h_new, block),
            NV_MEMORY_EXPORT => self.construct_export(rm, h_client, block),
            NV_MEMORY_FABRIC_IMPORTED_REF => self.construct_imported_ref(rm, h_client, block),
            _ => Err(NV_ERR_NOT_SUPPORTED),
        };
        match built {
            Ok(kind) => {
                if let Some(c) = self.clients.map.get_mut(&h_client) {
                    c.objects.insert(
                        a.h_new,
                        Object {
                            class: a.class,
                            parent: a.h_parent,
                            kind,
                        },
                    );
                }
                NV_OK
            }
            Err(s) => s,
        }
    }

    /// A client (`serverAllocClient`): the handle is `hRoot`, or one the RM picks when it
    /// is 0; a handle in use is NV_ERR_INSERT_DUPLICATE_NAME
    /// (`_serverCreateEntryAndLockForNewClient`). It is returned in `hObjectNew`.
    fn alloc_client(&mut self, rm: &mut Rm, caller: &Caller<'_>, a: &mut AllocArg) -> u32 {
        let Some(h) = self.clients.assign(a.h_root) else {
            return if a.h_root == 0 {
                NV_ERR_INSUFFICIENT_RESOURCES
            } else {
                NV_ERR_INSERT_DUPLICATE_NAME
            };
        };
        let rm_client = rm.connect();
        self.clients
            .map
            .insert(h, Client::new(caller.file, rm_client));
        a.h_new = h;
        NV_OK
    }

    /// `subdeviceConstruct` (subdevice.c): one GPU per device here, so a `subDeviceId` other
    /// than 0 is NV_ERR_INVALID_CLASS; a second Subdevice of the instance under the same
    /// Device is NV_ERR_INSUFFICIENT_RESOURCES.
    fn construct_subdevice(
        &mut self,
        h_client: NvHandle,
        h_device: NvHandle,
        block: Params<'_>,
    ) -> Result<Kind, u32> {
        let sub = match block {
            None => 0,
            Some(b) => read::<NV2080_ALLOC_PARAMETERS>(b).map_or(0, |p| p.subDeviceId),
        };
        if sub != 0 {
            return Err(NV_ERR_INVALID_CLASS);
        }
        let client = self
            .clients
            .map
            .get(&h_client)
            .ok_or(NV_ERR_INVALID_OBJECT_HANDLE)?;
        let Some(Kind::Device { instance }) = client.objects.get(&h_device).map(|o| &o.kind) else {
            return Err(NV_ERR_INVALID_OBJECT_PARENT);
        };
        let gpu = *instance;
        if client
            .objects
            .values()
            .any(|o| o.parent == h_device && matches!(o.kind, Kind::Subdevice { .. }))
        {
            return Err(NV_ERR_INSUFFICIENT_RESOURCES);
        }
        Ok(Kind::Subdevice { gpu })
    }

    /// `imexsessionapiConstruct` (imex_session_api.c), in its order: `flags` other than 0,
    /// a NULL `pOsEvent` or node 0xFFFF is NV_ERR_INVALID_ARGUMENT; the OS event must be
    /// registered for (fd, hClient) (`osUserHandleToKernelPtr`: NV_ERR_OBJECT_NOT_FOUND);
    /// a session elsewhere on the node is NV_ERR_IN_USE (`fabricSetImexEvent`); then
    /// `capDescriptor` must be a descriptor open on the fabric-imex-mgmt capability device
    /// (`osRmCapAcquire` → `nv_cap_validate_and_dup_fd`: NV_ERR_INSUFFICIENT_PERMISSIONS).
    /// On success the node takes the session's node ID and allows fabric allocations.
    fn construct_session(
        &mut self,
        rm: &mut Rm,
        call: &EscapeCall,
        h_client: NvHandle,
        h_object: NvHandle,
        block: Params<'_>,
    ) -> Result<Kind, u32> {
        let p: NV00F1_ALLOCATION_PARAMETERS =
            block.and_then(|b| read(b)).ok_or(NV_ERR_INVALID_ARGUMENT)?;
        if p.flags != 0 || p.pOsEvent == 0 || p.nodeId == NV_FABRIC_INVALID_NODE_ID {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        // The fd number is the low 32 bits of the pointer-sized field (`(NvU32)(NvU64)`).
        let fd = p.pOsEvent as u32;
        let event = self
            .events
            .reference(h_client, fd)
            .ok_or(status::NV_ERR_OBJECT_NOT_FOUND)?;
        if self.session.is_some() || rm.session_client().is_some() {
            self.events.dereference(event);
            return Err(NV_ERR_IN_USE);
        }
        let cap_ok = i32::try_from(p.capDescriptor as i64)
            .ok()
            .and_then(|n| passed_fd(&call.fds, i64::from(n)))
            .is_some_and(|fd| same_file(fd, &self.config.cap_path));
        if !cap_ok {
            self.events.dereference(event);
            return Err(NV_ERR_INSUFFICIENT_PERMISSIONS);
        }
        let rm_client = self
            .clients
            .map
            .get(&h_client)
            .map(|c| c.rm)
            .ok_or(NV_ERR_INVALID_OBJECT_HANDLE)?;
        if let Err(s) = rm.open_session(rm_client, p.nodeId) {
            self.events.dereference(event);
            return Err(status::code(s));
        }
        self.session = Some(SessionRec {
            h_client,
            h_object,
            rm: rm_client,
            event,
        });
        // Events queued before the session (none: posts need one) are not the new
        // session's to signal.
        self.signalled = rm.events_posted();
        Ok(Kind::Session)
    }

    /// `memoryexportConstruct` (mem_export.c): with DUP_BY_UUID, `_memoryexportDup`; else a
    /// new export, which needs the client's IMEX channel subscription (`imexChannel == -1`:
    /// NV_ERR_INSUFFICIENT_PERMISSIONS). Clients of the escape path never subscribe (the
    /// applications' exports are the simulation protocol's), so that is the answer.
    fn construct_export(
        &mut self,
        rm: &mut Rm,
        h_client: NvHandle,
        block: Params<'_>,
    ) -> Result<Kind, u32> {
        let b = block.ok_or(NV_ERR_INVALID_ARGUMENT)?;
        let mut p: NV00E0_ALLOCATION_PARAMETERS = read(b).ok_or(NV_ERR_INVALID_ARGUMENT)?;
        if p.flags & NV_MEM_EXPORT_FLAGS_DUP_BY_UUID == 0 {
            return Err(NV_ERR_INSUFFICIENT_PERMISSIONS);
        }
        let rm_client = self
            .clients
            .map
            .get(&h_client)
            .map(|c| c.rm)
            .ok_or(NV_ERR_INVALID_OBJECT_HANDLE)?;
        // The IMEX daemon's channel is trusted; any other client is held to its own.
        let daemon_channel = self.capable(h_client).then_some(p.imexChannel);
        let uuid = ExportUuid(p.packet.uuid);
        let dup = rm
            .dup_export(rm_client, &uuid, daemon_channel)
            .map_err(status::code)?;
        // `*pAllocParams = pExportInfo->cachedParams`: what the exporter's allocation
        // cached (the packet, numMaxHandles, its flags and metadata, the attached GPUs and
        // handle count); `imexChannel` is not part of the cache (0).
        let mut cached = NV00E0_ALLOCATION_PARAMETERS::default();
        cached.packet.uuid = uuid.0;
        cached.numMaxHandles = dup.num_max_handles;
        cached.deviceInstanceMask = dup.device_instance_mask;
        cached.numCurHandles = dup.num_cur_handles;
        p = cached;
        write(b, &p);
        Ok(Kind::Export {
            rm: dup.handle,
            cached: Box::new(cached),
        })
    }

    /// `memoryfabricimportedrefConstruct` (mem_fabric_import_ref.c): only an IMEX-capable
    /// client (NV_ERR_INSUFFICIENT_PERMISSIONS); `flags` must be 0
    /// (NV_ERR_INVALID_ARGUMENT); the pending import descriptor of (UUID, index, id) must be
    /// there, not installed and not claimed (`importDescriptorGetUnused`), else
    /// NV_WARN_NOTHING_TO_DO, and the object is not created.
    fn construct_imported_ref(
        &mut self,
        rm: &mut Rm,
        h_client: NvHandle,
        block: Params<'_>,
    ) -> Result<Kind, u32> {
        if !self.capable(h_client) {
            return Err(NV_ERR_INSUFFICIENT_PERMISSIONS);
        }
        let p: NV00FB_ALLOCATION_PARAMETERS =
            block.and_then(|b| read(b)).ok_or(NV_ERR_INVALID_ARGUMENT)?;
        if p.flags != 0 {
            return Err(NV_ERR_INVALID_ARGUMENT);
        }
        let event_id = rm
            .claim_import(&ExportUuid(p.exportUuid), p.index, p.id)
            .ok_or(NV_WARN_NOTHING_TO_DO)?;
        Ok(Kind::ImportedRef(Box::new(ImportedRef::new(event_id))))
    }

    /// NV_ESC_RM_FREE (`serverFreeResourceTree`): an unknown client is
    /// NV_ERR_INVALID_OBJECT_HANDLE, one of another file NV_ERR_INVALID_CLIENT; an unknown
    /// object of the client is NV_OK (`RS_COMPATABILITY_MODE`). The client's handle frees the
    /// client, then its OS events (`RmIoctl`: `rm_client_free_os_events`); an object frees
    /// its subtree, children first.
    pub(super) fn rm_free(&mut self, rm: &mut Rm, caller: &Caller<'_>, arg: &mut [u8]) -> Outcome {
        let Some(mut p) = read::<NVOS00_PARAMETERS>(arg) else {
            return Outcome::einval();
        };
        let mut what = None;
        p.status = match self.clients.map.get(&p.hRoot) {
            None => NV_ERR_INVALID_OBJECT_HANDLE,
            Some(c) if c.file != caller.file => NV_ERR_INVALID_CLIENT,
            Some(_) if p.hObjectOld == p.hRoot => {
                what = Some(NV01_ROOT_CLIENT);
                // The unimports an escape client posts never block it: it imports nothing.
                let _ = self.free_client(rm, p.hRoot);
                NV_OK
            }
            Some(c) => match c.objects.get(&p.hObjectOld) {
                None => NV_OK,
                Some(o) => {
                    what = Some(o.class);
                    self.free_subtree(rm, p.hRoot, p.hObjectOld);
                    NV_OK
                }
            },
        };
        write(arg, &p);
        Outcome {
            errno: 0,
            status: Some(p.status),
            what,
            params_size: 0,
            wakes: true,
        }
    }

    /// Frees client `h_client` whole: its objects in the client free's order, the state
    /// machine's client, its OS events. Returns the unimports posted.
    pub(super) fn free_client(&mut self, rm: &mut Rm, h_client: NvHandle) -> Vec<u64> {
        let order = match self.clients.map.get(&h_client) {
            Some(c) => c.free_order(h_client),
            None => return Vec::new(),
        };
        for h in order {
            self.free_object(rm, h_client, h);
        }
        let mut unimports = Vec::new();
        if let Some(c) = self.clients.map.remove(&h_client) {
            unimports = rm.disconnect(c.rm);
        }
        self.events.free_client(h_client);
        unimports
    }

    fn free_subtree(&mut self, rm: &mut Rm, h_client: NvHandle, root: NvHandle) {
        let order = match self.clients.map.get(&h_client) {
            Some(c) => c.subtree(root),
            None => return,
        };
        for h in order {
            self.free_object(rm, h_client, h);
        }
    }

    /// One object's destructor.
    fn free_object(&mut self, rm: &mut Rm, h_client: NvHandle, h: NvHandle) {
        let Some(c) = self.clients.map.get_mut(&h_client) else {
            return;
        };
        let rm_client = c.rm;
        let Some(o) = c.objects.remove(&h) else {
            return;
        };
        match o.kind {
            Kind::Device { .. } | Kind::Subdevice { .. } => {}
            // imexsessionapiDestruct: the teardown of §4, then the OS event's reference.
            Kind::Session => {
                if let Some(s) = self
                    .session
                    .take_if(|s| s.h_client == h_client && s.h_object == h)
                {
                    rm.close_session(s.rm);
                    self.events.dereference(s.event);
                }
            }
            Kind::Export { rm: handle, .. }
            | Kind::FabricMemory { rm: handle }
            | Kind::Multicast { rm: handle } => {
                let _ = rm.release(rm_client, handle);
            }
            // memoryfabricimportedrefDestruct: the claim goes, no event.
            Kind::ImportedRef(r) => rm.unclaim_import(r.event_id()),
        }
    }
}

/// `deviceConstruct` (device.c): the instance is `deviceId` (NV01_DEVICE_0 + 0 without
/// parameters); an instance with no GPU is NV_ERR_INVALID_CLASS
/// (`gpumgrIsDeviceInstanceValid`); a process that does not hold the GPU's device file
/// open is NV_ERR_INSUFFICIENT_PERMISSIONS (`osIsGpuAccessible`).
fn construct_device(caller: &Caller<'_>, gpus: u32, block: Params<'_>) -> Result<Kind, u32> {
    let instance = match block {
        None => 0,
        Some(b) => read::<NV0080_ALLOC_PARAMETERS>(b).map_or(0, |p| p.deviceId),
    };
    if instance >= gpus {
        return Err(NV_ERR_INVALID_CLASS);
    }
    if !(caller.gpu_accessible)(instance) {
        return Err(NV_ERR_INSUFFICIENT_PERMISSIONS);
    }
    Ok(Kind::Device { instance })
}

/// Whether `fd` is open on the file at `path` (same device and inode), as the kernel checks
/// that a capability descriptor is open on the capability's device.
fn same_file(fd: &std::os::fd::OwnedFd, path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(st) = nix::sys::stat::fstat(fd) else {
        return false;
    };
    std::fs::metadata(path).is_ok_and(|m| m.dev() == st.st_dev && m.ino() == st.st_ino)
}
