//! The IMEX classes' controls (`docs/reference/driver-interface.md` §1.3, §1.4, §1.6): the
//! session's (GET_FABRIC_EVENTS, FINISH_MEM_UNIMPORT, DISABLE_IMPORTERS), the export dup's
//! (IMPORT_MEM, GET_INFO), the fabric memory dup's (DESCRIBE, GET_INFO), the imported
//! reference's (VALIDATE) and the multicast dup's (ATTACH_REMOTE_GPU, SET_FAILURE).
//!
//! Each handler gets the parameter block the caller passed (exactly `paramsSize` bytes,
//! checked by the caller) and writes what the kernel writes; on an error the caller restores
//! the block, as the RM skips the copy-out.

use openimex_rmabi::NvHandle;
use openimex_rmabi::class::nv00f8::{
    NV_MEMORY_FABRIC_PAGE_SIZE_2M, NV_MEMORY_FABRIC_PAGE_SIZE_256G, NV_MEMORY_FABRIC_PAGE_SIZE_512M,
};
use openimex_rmabi::class::nv00fd::NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_512M;
use openimex_rmabi::class::{NV_MEMORY_FABRIC, NV_MEMORY_MULTICAST_FABRIC};
use openimex_rmabi::ctrl::nv00e0::{
    NV_IMPORT_MEM_INFO, NV00E0_ADDR_SPACE_TYPE_FABRIC, NV00E0_ADDR_SPACE_TYPE_FABRIC_MC,
    NV00E0_CTRL_GET_INFO_PARAMS, NV00E0_CTRL_IMPORT_MEM_PARAMS, NV00E0_MAX_IMPORT_HANDLES,
};
use openimex_rmabi::ctrl::nv00f1::{
    NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS, NV00F1_CTRL_FINISH_MEM_UNIMPORT_ARRAY_SIZE,
    NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS, NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE,
    get_fabric_events_tail_offsets,
};
use openimex_rmabi::ctrl::nv00f8::{
    Describe, FabricMemoryAttrs, NV_PHYSICAL_MEMORY_ATTRS, NV00F8_CTRL_DESCRIBE_PFN_ARRAY_SIZE,
    NV00F8_CTRL_GET_INFO_PARAMS,
};
use openimex_rmabi::ctrl::nv00fb::{NV00FB_CTRL_FLAGS_IMPORT_FAILED, Validate};
use openimex_rmabi::ctrl::nv00fd::{AttachRemoteGpu, NV00FD_CTRL_SET_FAILURE_PARAMS};
use openimex_simproto::handle::ExportUuid;
use openimex_simproto::multicast::RemoteGpu;
use openimex_simproto::proto::{FabricEvent, FabricPages, NvStatus, Validation};

use super::handles::{Kind, Object, TempDesc};
use super::status::{
    self, Handled, NV_ERR_INSERT_DUPLICATE_NAME, NV_ERR_INSUFFICIENT_PERMISSIONS,
    NV_ERR_INVALID_ARGUMENT, NV_ERR_INVALID_OBJECT_HANDLE, NV_ERR_NO_MEMORY, NV_ERR_NOT_SUPPORTED,
    NV_ERR_OBJECT_NOT_FOUND, NV_ERR_OUT_OF_RANGE, NV_OK,
};
use super::{RmApi, gpus, read, write};
use crate::rm::Rm;

/// `NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE_VIDMEM` (ctrl0000client.h): the physical
/// memory behind the simulation's fabric memory is always video memory. Not in
/// `openimex-rmabi`.
const ADDR_SPACE_TYPE_VIDMEM: u32 = 2;

/// The most pages an imported reference's descriptor takes here (2^24: 32 TiB of 2 MiB
/// pages, far above any GPU's memory).
const MAX_TEMP_PAGES: u64 = 1 << 24;

impl RmApi {
    /// NV00F1_CTRL_CMD_GET_FABRIC_EVENTS (`imexsessionapiCtrlCmdGetFabricEvents` →
    /// `fabricExtractEventsV2`): up to 128 events, oldest first, and `bMoreEvents`; slots past
    /// `numEvents` keep what the caller passed. Encoded in the served layout; a clique
    /// change names the GPU by its ID ([`gpus::gpu_id`]).
    pub(super) fn get_fabric_events(&mut self, rm: &mut Rm, params: &mut [u8]) -> Handled {
        let layout = self.config.layout;
        let size = layout.fabric_event_size();
        let (events, more) =
            rm.drain_events_with_channels(NV00F1_CTRL_GET_FABRIC_EVENTS_ARRAY_SIZE);
        let mut n = 0u32;
        for (i, (event, channel)) in events.iter().enumerate() {
            let ev = abi_event(event, *channel);
            let bytes = ev.encode(layout).or_else(|_| {
                // A bwMode wider than the layout's NvU8 is truncated, as a C assignment.
                let mut narrow = ev;
                if let openimex_rmabi::FabricEvent::RemoteGpuAttach { bw_mode, .. } = &mut narrow {
                    *bw_mode &= 0xFF;
                }
                narrow.encode(layout)
            });
            let (Ok(bytes), Some(slot)) = (bytes, params.get_mut(i * size..(i + 1) * size)) else {
                continue;
            };
            slot.copy_from_slice(&bytes);
            n += 1;
        }
        let (num_at, more_at) = get_fabric_events_tail_offsets(layout);
        if let Some(b) = params.get_mut(num_at..num_at + 4) {
            b.copy_from_slice(&n.to_ne_bytes());
        }
        if let Some(b) = params.get_mut(more_at) {
            *b = u8::from(more);
        }
        (NV_OK, false)
    }

    /// NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT (`imexsessionapiCtrlCmdFinishMemUnimport`):
    /// `numTokens` 0 or above 256 is NV_ERR_INVALID_ARGUMENT; unknown IDs are ignored.
    pub(super) fn finish_mem_unimport(&mut self, rm: &mut Rm, params: &mut [u8]) -> Handled {
        let Some(p) = read::<NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS>(params) else {
            return (NV_ERR_INVALID_ARGUMENT, false);
        };
        let n = p.numTokens as usize;
        if n == 0 || n > NV00F1_CTRL_FINISH_MEM_UNIMPORT_ARRAY_SIZE {
            return (NV_ERR_INVALID_ARGUMENT, false);
        }
        let ids: Vec<u64> = p.tokenArray[..n]
            .iter()
            .map(|t| t.unimportEventId)
            .collect();
        match rm.finish_unimports(&ids) {
            Ok(()) => (NV_OK, true),
            Err(s) => (status::code(s), false),
        }
    }

    /// NV00F1_CTRL_CMD_DISABLE_IMPORTERS (`imexsessionapiCtrlCmdDisableImporters`): every
    /// client that imported from the node is disabled (and its channels RC'd). The session's
    /// `DISABLE_CHANNEL_RECOVERY` flag would make it NV_ERR_NOT_SUPPORTED, but the
    /// constructor refuses every flag.
    pub(super) fn disable_importers(&mut self, rm: &mut Rm, params: &mut [u8]) -> Handled {
        let Some(p) = read::<NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS>(params) else {
            return (NV_ERR_INVALID_ARGUMENT, false);
        };
        rm.disable_importers_of(p.nodeId);
        (NV_OK, true)
    }

    /// NV00E0_CTRL_CMD_IMPORT_MEM (`memoryexportCtrlImportMem`): `numHandles` 0 or above 128
    /// is NV_ERR_INVALID_ARGUMENT; a range past `numMaxHandles` NV_ERR_OUT_OF_RANGE; an empty
    /// slot gets a zeroed `memInfos` entry; a 0 handle for an attached slot is
    /// NV_ERR_INVALID_OBJECT_HANDLE; the dup is parented as `_memoryexportFindImporterParent`
    /// finds it (unicast memory: the client's Subdevice of the owner GPU under its Device,
    /// else NV_ERR_OBJECT_NOT_FOUND; a multicast object: the client); a handle the client
    /// already uses is NV_ERR_INSERT_DUPLICATE_NAME (the dup's `clientValidateNewResourceHandle`).
    /// On a failure the dups already made are freed.
    pub(super) fn import_mem(
        &mut self,
        rm: &mut Rm,
        h_client: NvHandle,
        h_export: NvHandle,
        params: &mut [u8],
    ) -> Handled {
        let Some(mut p) = read::<NV00E0_CTRL_IMPORT_MEM_PARAMS>(params) else {
            return (NV_ERR_INVALID_ARGUMENT, false);
        };
        let Some(client) = self.clients.map.get(&h_client) else {
            return (NV_ERR_INVALID_OBJECT_HANDLE, false);
        };
        let Some(Object {
            kind:
                Kind::Export {
                    rm: export_rm,
                    cached,
                },
            ..
        }) = client.objects.get(&h_export)
        else {
            return (NV_ERR_INVALID_OBJECT_HANDLE, false);
        };
        let (export_rm, max) = (*export_rm, cached.numMaxHandles);
        let n = usize::from(p.numHandles);
        if n == 0 || n > NV00E0_MAX_IMPORT_HANDLES {
            return (NV_ERR_INVALID_ARGUMENT, false);
        }
        match p.index.checked_add(p.numHandles) {
            Some(end) if end <= max => {}
            _ => return (NV_ERR_OUT_OF_RANGE, false),
        }
        let rm_client = client.rm;
        let mut made: Vec<NvHandle> = Vec::new();
        let mut status = NV_OK;
        for i in 0..n {
            let slot = usize::from(p.index) + i;
            // The simulation's exports attach one handle, at index 0.
            if slot != 0 {
                p.memInfos[i] = NV_IMPORT_MEM_INFO::default();
                continue;
            }
            let h = p.handles[i];
            if h == 0 || h == h_client {
                status = NV_ERR_INVALID_OBJECT_HANDLE;
                break;
            }
            let exported = match rm.export_dup_target(rm_client, export_rm) {
                Ok(e) => e,
                Err(s) => {
                    status = status::code(s);
                    break;
                }
            };
            let gpu = rm.exported_gpu(exported);
            let parent = match gpu {
                None => Some(h_client),
                Some(g) => self.importer_parent(h_client, g),
            };
            let Some(parent) = parent else {
                status = NV_ERR_OBJECT_NOT_FOUND;
                break;
            };
            if self
                .clients
                .map
                .get(&h_client)
                .is_some_and(|c| c.objects.contains_key(&h))
            {
                status = NV_ERR_INSERT_DUPLICATE_NAME;
                break;
            }
            let dup = match rm.import_export_mem(rm_client, export_rm) {
                Ok(d) => d,
                Err(s) => {
                    status = status::code(s);
                    break;
                }
            };
            let (class, kind, space) = match dup.gpu {
                Some(_) => (
                    NV_MEMORY_FABRIC,
                    Kind::FabricMemory { rm: dup.handle },
                    NV00E0_ADDR_SPACE_TYPE_FABRIC,
                ),
                None => (
                    NV_MEMORY_MULTICAST_FABRIC,
                    Kind::Multicast { rm: dup.handle },
                    NV00E0_ADDR_SPACE_TYPE_FABRIC_MC,
                ),
            };
            if let Some(c) = self.clients.map.get_mut(&h_client) {
                c.objects.insert(
                    h,
                    Object {
                        class,
                        parent,
                        kind,
                    },
                );
            }
            made.push(h);
            p.memInfos[i] = NV_IMPORT_MEM_INFO {
                hParent: parent,
                addrSpace: space,
                _pad0: [0; 3],
            };
        }
        if status != NV_OK {
            for h in made {
                self.free_imported(rm, h_client, h);
            }
            return (status, false);
        }
        write(params, &p);
        (NV_OK, false)
    }

    /// Undoes one IMPORT_MEM dup.
    fn free_imported(&mut self, rm: &mut Rm, h_client: NvHandle, h: NvHandle) {
        let Some(c) = self.clients.map.get_mut(&h_client) else {
            return;
        };
        if let Some(Object {
            kind: Kind::FabricMemory { rm: r } | Kind::Multicast { rm: r },
            ..
        }) = c.objects.remove(&h)
        {
            let _ = rm.release(c.rm, r);
        }
    }

    /// `_memoryexportFindImporterParent` for memory attached with a Subdevice parent: the
    /// client's Device of the GPU (`deviceGetByGpu`), then its Subdevice of the GPU
    /// (`subdeviceGetByDeviceAndGpu`).
    fn importer_parent(&self, h_client: NvHandle, gpu: u32) -> Option<NvHandle> {
        let c = self.clients.map.get(&h_client)?;
        let device = c.find(|o| matches!(o.kind, Kind::Device { instance } if instance == gpu))?;
        c.find(|o| o.parent == device && matches!(o.kind, Kind::Subdevice { gpu: g } if g == gpu))
    }

    /// NV00E0_CTRL_CMD_GET_INFO (`memoryexportCtrlGetInfo`): the cached parameters.
    pub(super) fn export_get_info(
        &self,
        h_client: NvHandle,
        h_export: NvHandle,
        params: &mut [u8],
    ) -> Handled {
        let Some(Object {
            kind: Kind::Export { cached, .. },
            ..
        }) = self
            .clients
            .map
            .get(&h_client)
            .and_then(|c| c.objects.get(&h_export))
        else {
            return (NV_ERR_INVALID_OBJECT_HANDLE, false);
        };
        write(params, &NV00E0_CTRL_GET_INFO_PARAMS { info: **cached });
        (NV_OK, false)
    }

    /// NV00F8_CTRL_CMD_DESCRIBE (`memoryfabricCtrlCmdDescribe`): an IMEX-capable or admin
    /// client only (NV_ERR_INSUFFICIENT_PERMISSIONS); `offset` past the PFNs is
    /// NV_ERR_OUT_OF_RANGE; up to 512 PFNs from `offset` (fabric address >> 21), the total
    /// (the simulation's memory is not contiguous: one PFN per 2 MiB page), the owner GPU's
    /// clique and bandwidth mode from its probe, video memory, the creator's flags (none).
    /// Unused slots of `pfnArray` come back 0.
    pub(super) fn describe(
        &self,
        rm: &Rm,
        h_client: NvHandle,
        admin: bool,
        mem_rm: u64,
        rm_client: crate::rm::ClientId,
        params: &mut [u8],
    ) -> Handled {
        if !(self.capable(h_client) || admin) {
            return (NV_ERR_INSUFFICIENT_PERMISSIONS, false);
        }
        let layout = self.config.layout;
        // `offset` is the block's only input, its first 8 bytes in every family (as
        // `Describe::request` writes it); the rest is output, whatever the caller left there.
        let Some(offset) = read::<u64>(params) else {
            return (NV_ERR_INVALID_ARGUMENT, false);
        };
        let mem = match rm.describe_memory(rm_client, mem_rm) {
            Ok(m) => m,
            Err(s) => return (status::code(s), false),
        };
        let total = mem.pages.pfns.len() as u64;
        if offset >= total {
            return (NV_ERR_OUT_OF_RANGE, false);
        }
        let first = usize::try_from(offset).unwrap_or(usize::MAX);
        let chunk = &mem.pages.pfns[first..]
            [..(mem.pages.pfns.len() - first).min(NV00F8_CTRL_DESCRIBE_PFN_ARRAY_SIZE)];
        let Ok(pfns) = chunk
            .iter()
            .map(|&p| u32::try_from(p))
            .collect::<Result<Vec<u32>, _>>()
        else {
            tracing::error!(
                gpu = mem.gpu,
                "DESCRIBE: a fabric PFN of GPU {} does not fit the control's 32 bits (the \
                 simulation's address plan gives each GPU a 1 TiB window; slots above 126 \
                 overflow): refused",
                mem.gpu
            );
            return (NV_ERR_NOT_SUPPORTED, false);
        };
        let d = Describe {
            offset,
            total_pfns: total,
            pfns,
            attrs: FabricMemoryAttrs {
                kind: 0,
                page_size: mem.pages.page_size,
                size: mem.pages.size,
                clique_id: mem.pages.clique_id,
                bw_mode_epoch: mem.pages.bw_mode_epoch,
                bw_mode: mem.pages.bw_mode,
            },
            phys_attrs: NV_PHYSICAL_MEMORY_ATTRS {
                addressSpace: ADDR_SPACE_TYPE_VIDMEM,
                compressionCoverage: 0,
            },
            mem_flags: 0,
        };
        let bytes = d.encode(layout).or_else(|_| {
            let mut narrow = d.clone();
            narrow.attrs.bw_mode &= 0xFF;
            narrow.encode(layout)
        });
        match bytes {
            Ok(b) if b.len() == params.len() => {
                params.copy_from_slice(&b);
                (NV_OK, false)
            }
            _ => (NV_ERR_INVALID_ARGUMENT, false),
        }
    }

    /// NV00F8_CTRL_CMD_GET_INFO (`memoryfabricCtrlGetInfo`): size, page size, the creator's
    /// flags (none) and the physical attributes.
    pub(super) fn fabric_get_info(
        &self,
        rm: &Rm,
        rm_client: crate::rm::ClientId,
        mem_rm: u64,
        params: &mut [u8],
    ) -> Handled {
        match rm.describe_memory(rm_client, mem_rm) {
            Ok(m) => {
                write(
                    params,
                    &NV00F8_CTRL_GET_INFO_PARAMS {
                        size: m.pages.size,
                        pageSize: m.pages.page_size,
                        allocFlags: 0,
                        physAttrs: NV_PHYSICAL_MEMORY_ATTRS {
                            addressSpace: ADDR_SPACE_TYPE_VIDMEM,
                            compressionCoverage: 0,
                        },
                        _pad0: [0; 4],
                    },
                );
                (NV_OK, false)
            }
            Err(s) => (status::code(s), false),
        }
    }

    /// NV00FB_CTRL_CMD_VALIDATE (`memoryfabricimportedrefCtrlValidate`), in its order:
    /// `bDone` cleared; IMPORT_FAILED installs the failure at once; else `totalPfns` 0 or
    /// every PFN pushed already is NV_ERR_INVALID_ARGUMENT, `offset + numPfns` past
    /// `totalPfns` NV_ERR_OUT_OF_RANGE, a page size other than 2M/512M/256G or a size that
    /// is 0 or not a multiple of it NV_ERR_INVALID_ARGUMENT; the first chunk's attributes
    /// make the descriptor (contiguous when `totalPfns` is 1), each chunk fills its PTEs,
    /// and once the count reaches `totalPfns` the pages are installed
    /// (`importDescriptorInstallMemDesc`: NV_ERR_IN_USE if the import was installed
    /// meanwhile) and every waiting importer wakes. The control does not bound `numPfns`
    /// itself (it would read past `pfnArray`); here more than 512 is
    /// NV_ERR_INVALID_ARGUMENT.
    pub(super) fn validate(
        &mut self,
        rm: &mut Rm,
        h_client: NvHandle,
        h_ref: NvHandle,
        params: &mut [u8],
    ) -> Handled {
        let layout = self.config.layout;
        let Ok(mut v) = Validate::decode(layout, params) else {
            return (NV_ERR_INVALID_ARGUMENT, false);
        };
        let Some(Object {
            kind: Kind::ImportedRef(r),
            ..
        }) = self
            .clients
            .map
            .get_mut(&h_client)
            .and_then(|c| c.objects.get_mut(&h_ref))
        else {
            return (NV_ERR_INVALID_OBJECT_HANDLE, false);
        };
        v.done = false;
        let install = if v.flags & NV00FB_CTRL_FLAGS_IMPORT_FAILED != 0 {
            Validation::ImportFailed
        } else {
            if v.total_pfns == 0 || r.updated >= v.total_pfns {
                return (NV_ERR_INVALID_ARGUMENT, false);
            }
            match v.offset.checked_add(v.pfns.len() as u64) {
                Some(end) if end <= v.total_pfns => {}
                _ => return (NV_ERR_OUT_OF_RANGE, false),
            }
            let ps = v.attrs.page_size;
            if ![
                NV_MEMORY_FABRIC_PAGE_SIZE_2M,
                NV_MEMORY_FABRIC_PAGE_SIZE_512M,
                NV_MEMORY_FABRIC_PAGE_SIZE_256G,
            ]
            .contains(&ps)
            {
                return (NV_ERR_INVALID_ARGUMENT, false);
            }
            if v.attrs.size == 0 || v.attrs.size % ps != 0 {
                return (NV_ERR_INVALID_ARGUMENT, false);
            }
            if r.temp.is_none() {
                // `_createTempMemDesc` → `memdescCreate` of `attrs.size`: a descriptor the
                // driver cannot hold fails with NV_ERR_NO_MEMORY.
                let pages = v.attrs.size / ps;
                if pages > MAX_TEMP_PAGES {
                    return (NV_ERR_NO_MEMORY, false);
                }
                let pages = usize::try_from(pages).unwrap_or(0);
                r.temp = Some(TempDesc {
                    attrs: v.attrs,
                    contiguous: v.total_pfns == 1,
                    pfns: vec![0; if v.total_pfns == 1 { 1 } else { pages }],
                });
            }
            let Some(temp) = r.temp.as_mut() else {
                return (NV_ERR_NO_MEMORY, false);
            };
            let at = usize::try_from(v.offset).unwrap_or(usize::MAX);
            for (i, &pfn) in v.pfns.iter().enumerate() {
                if let Some(slot) = at.checked_add(i).and_then(|j| temp.pfns.get_mut(j)) {
                    *slot = pfn;
                }
            }
            r.updated += v.pfns.len() as u64;
            v.done = r.updated == v.total_pfns;
            if !v.done {
                return (write_validate(layout, &v, params), false);
            }
            Validation::Pages(pages_of(temp))
        };
        let event_id = r.event_id;
        match rm.validate_claimed(event_id, install) {
            Ok(()) => (write_validate(layout, &v, params), true),
            Err(s) => (status::code(s), false),
        }
    }

    /// NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU (`memorymulticastfabricCtrlAttachRemoteGpu`): a
    /// page size of 0 means 512M (`_memMulticastfabricResolvePageSize`); an IMEX-capable or
    /// admin client only (NV_ERR_INSUFFICIENT_PERMISSIONS, the prime not failed); the rest
    /// is the state machine's ([`Rm::mc_attach_remote_gpu_to`]).
    pub(super) fn attach_remote_gpu(
        &mut self,
        rm: &mut Rm,
        h_client: NvHandle,
        admin: bool,
        mc_rm: u64,
        params: &mut [u8],
    ) -> Handled {
        let Ok(mut a) = AttachRemoteGpu::decode(self.config.layout, params) else {
            return (NV_ERR_INVALID_ARGUMENT, false);
        };
        if a.page_size == 0 {
            a.page_size = NV_MEMORY_MULTICAST_FABRIC_PAGE_SIZE_512M;
        }
        if !(self.capable(h_client) || admin) {
            return (NV_ERR_INSUFFICIENT_PERMISSIONS, false);
        }
        let Some(rm_client) = self.clients.map.get(&h_client).map(|c| c.rm) else {
            return (NV_ERR_INVALID_OBJECT_HANDLE, false);
        };
        let gpu = RemoteGpu {
            gpu_probe_handle: a.probe_handle,
            key: a.key,
            clique_id: a.clique_id,
            bw_mode: a.bw_mode,
            bw_mode_epoch: a.bw_mode_epoch,
            page_size: a.page_size,
        };
        let result = rm
            .mc_desc_of_handle(rm_client, mc_rm)
            .and_then(|id| rm.mc_attach_remote_gpu_to(id, a.node_id, gpu));
        match result {
            Ok(()) => (NV_OK, true),
            Err(s) => (status::code(s), true),
        }
    }

    /// NV00FD_CTRL_CMD_SET_FAILURE (`_memorymulticastfabricCtrlSetFailure`): an IMEX-capable
    /// or admin client only; NV_ERR_NOT_SUPPORTED on an object that is not the prime; a
    /// status of NV_OK or NV_ERR_NOT_READY is NV_ERR_INVALID_ARGUMENT; then every object of
    /// the team reports the status.
    pub(super) fn set_failure(
        &mut self,
        rm: &mut Rm,
        h_client: NvHandle,
        admin: bool,
        mc_rm: u64,
        params: &mut [u8],
    ) -> Handled {
        let Some(p) = read::<NV00FD_CTRL_SET_FAILURE_PARAMS>(params) else {
            return (NV_ERR_INVALID_ARGUMENT, false);
        };
        if !(self.capable(h_client) || admin) {
            return (NV_ERR_INSUFFICIENT_PERMISSIONS, false);
        }
        let Some(rm_client) = self.clients.map.get(&h_client).map(|c| c.rm) else {
            return (NV_ERR_INVALID_OBJECT_HANDLE, false);
        };
        // NV_OK takes the NOT_READY path of the state machine: after the prime check, both
        // are NV_ERR_INVALID_ARGUMENT.
        let failure = if p.status == NV_OK {
            NvStatus::NotReady
        } else {
            status::from_code(p.status)
        };
        let result = rm
            .mc_desc_of_handle(rm_client, mc_rm)
            .and_then(|id| rm.mc_set_failure_of(id, failure));
        match result {
            Ok(()) => (NV_OK, true),
            Err(s) => (status::code(s), false),
        }
    }
}

/// Writes VALIDATE's block back (`bDone`; the rest as passed).
fn write_validate(layout: openimex_rmabi::Layout, v: &Validate, params: &mut [u8]) -> u32 {
    match v.encode(layout) {
        Ok(b) if b.len() == params.len() => {
            params.copy_from_slice(&b);
            NV_OK
        }
        _ => NV_ERR_INVALID_ARGUMENT,
    }
}

/// The pages a complete VALIDATE installs: one PFN per page (a contiguous descriptor's single
/// PTE expanded), in fabric PFN units of the descriptor's page size.
fn pages_of(t: &TempDesc) -> FabricPages {
    let ps = t.attrs.page_size.max(1);
    let pages = t.attrs.size / ps;
    let pfns = if t.contiguous {
        let first = u64::from(t.pfns.first().copied().unwrap_or(0));
        // PFNs are in 2 MiB units whatever the page size (`<< RM_PAGE_SHIFT_HUGE`).
        let step = ps / NV_MEMORY_FABRIC_PAGE_SIZE_2M;
        (0..pages).map(|i| first + i * step.max(1)).collect()
    } else {
        t.pfns.iter().map(|&p| u64::from(p)).collect()
    };
    FabricPages {
        size: t.attrs.size,
        page_size: ps,
        pfns,
        clique_id: t.attrs.clique_id,
        bw_mode: t.attrs.bw_mode,
        bw_mode_epoch: t.attrs.bw_mode_epoch,
    }
}

/// The state machine's event as the RM encodes it (`imexChannel` from the queue).
fn abi_event(e: &FabricEvent, channel: u32) -> openimex_rmabi::FabricEvent {
    let uuid = |hex: &str| ExportUuid::from_hex(hex).map_or([0; 16], |u| u.0);
    match e {
        FabricEvent::Import {
            event_id,
            export_uuid,
            index,
            import_id,
            export_node,
            ..
        } => openimex_rmabi::FabricEvent::Import {
            id: *event_id,
            channel,
            import_id: *import_id,
            index: *index,
            export_node: *export_node,
            export_uuid: uuid(export_uuid),
        },
        FabricEvent::Unimport {
            unimport_event_id,
            import_event_id,
            export_node,
        } => openimex_rmabi::FabricEvent::Unimport {
            id: *unimport_event_id,
            channel,
            import_event_id: *import_event_id,
            export_node: *export_node,
        },
        FabricEvent::CliqueIdChange {
            event_id,
            gpu_id,
            clique_id,
            ..
        } => openimex_rmabi::FabricEvent::CliqueIdChange {
            id: *event_id,
            channel,
            gpu_id: gpus::gpu_id(*gpu_id),
            clique_id: *clique_id,
        },
        FabricEvent::RemoteGpuAttach {
            event_id,
            export_uuid,
            index,
            export_node,
            gpu,
            ..
        } => openimex_rmabi::FabricEvent::RemoteGpuAttach {
            id: *event_id,
            channel,
            probe_handle: gpu.gpu_probe_handle,
            key: gpu.key,
            bw_mode_epoch: gpu.bw_mode_epoch,
            page_size: gpu.page_size,
            clique_id: gpu.clique_id,
            index: *index,
            export_node: *export_node,
            bw_mode: gpu.bw_mode,
            export_uuid: uuid(export_uuid),
        },
    }
}
