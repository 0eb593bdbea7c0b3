//! The daemon's objects as the RM ioctl path makes them (`docs/reference/driver-interface.md` §1.4,
//! §1.6 "Daemon A" and "Daemon B", §4): on the exporting node the dup of an export by UUID
//! (NV_MEMORY_EXPORT, DUP_BY_UUID) and IMPORT_MEM's dup of the memory attached to it, each a
//! reference on the memory held by a client; on the importing node the claim of a pending
//! import descriptor by NV_MEMORY_FABRIC_IMPORTED_REF and its VALIDATE.
//!
//! The protocol's `DescribeExport` is both dups and the DESCRIBE in one call; these are the
//! same state changes one object at a time, so that freeing each object releases what it
//! held, and a session torn down while its client still holds export dups is the "dangling
//! exports" case of `imexsessionapiDestruct` (§4).

use super::{ClientId, DescState, Owned, Rm};
use crate::fla;
use openimex_simproto::handle::ExportUuid;
use openimex_simproto::proto::{FabricPages, NvStatus, PAGE_SIZE, Validation, import_key};

/// What an export object exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exported {
    /// Unicast fabric memory (key of the allocations).
    Alloc(u64),
    /// A prime multicast object (key of the multicast descriptors).
    Multicast(u64),
}

/// Answer to [`Rm::dup_export`]: the dup's handle in the client and the export's cached
/// parameters as the simulation keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportDup {
    /// The dup (a handle of the client's, for [`Rm::release`]).
    pub handle: u64,
    /// What it exports.
    pub exported: Exported,
    /// The export's UUID.
    pub uuid: ExportUuid,
    /// `numMaxHandles`: the simulation's exports carry one handle, at index 0.
    pub num_max_handles: u16,
    /// `numCurHandles`: the handles attached (1 while the memory is).
    pub num_cur_handles: u16,
    /// `deviceInstanceMask`: the GPUs the attached memory is on (bit = device instance);
    /// 0 for device-less memory (a multicast object).
    pub device_instance_mask: u32,
}

/// Answer to [`Rm::import_export_mem`]: the memory dup and where it is parented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryDup {
    /// The dup (a handle of the client's).
    pub handle: u64,
    /// The GPU the memory is on (its Subdevice parents the dup), or `None` for device-less
    /// memory (a multicast object, parented to the client).
    pub gpu: Option<u32>,
}

/// What DESCRIBE reports of unicast fabric memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedMemory {
    /// The owner GPU.
    pub gpu: u32,
    /// Size, page size, the PFN of every page (fabric address / [`PAGE_SIZE`]) and the owner
    /// GPU's clique and bandwidth mode.
    pub pages: FabricPages,
}

impl Rm {
    /// NV_MEMORY_EXPORT with DUP_BY_UUID in `client` (`_memoryexportDup`): the export must be
    /// in the export cache (else NV_ERR_OBJECT_NOT_FOUND); a capable client (the IMEX
    /// daemon) names the importer's channel in `daemon_channel`, any other client is held to
    /// its own subscription; a channel other than the export's is
    /// NV_ERR_INSUFFICIENT_PERMISSIONS. The dup takes a reference on what is exported.
    pub fn dup_export(
        &mut self,
        client: ClientId,
        uuid: &ExportUuid,
        daemon_channel: Option<u32>,
    ) -> Result<ExportDup, NvStatus> {
        let own_channel = self.active_client_mut(client)?.channel;
        let channel = match daemon_channel {
            Some(c) => Some(c),
            None => own_channel,
        };
        let (exported, export_channel, device_instance_mask) =
            if let Some(&id) = self.export_cache.get(uuid) {
                let a = self.allocs.get(&id).ok_or(NvStatus::ObjectNotFound)?;
                let e = a.export.as_ref().ok_or(NvStatus::ObjectNotFound)?;
                (Exported::Alloc(id), e.channel, 1u32 << a.gpu)
            } else {
                let (id, ch) = self.mc_export_of(uuid).ok_or(NvStatus::ObjectNotFound)?;
                (Exported::Multicast(id), ch, 0)
            };
        if channel != Some(export_channel) {
            return Err(NvStatus::InsufficientPermissions);
        }
        match exported {
            Exported::Alloc(id) => {
                if let Some(a) = self.allocs.get_mut(&id) {
                    a.refs += 1;
                }
            }
            Exported::Multicast(id) => self.mc_ref(id),
        }
        let handle = self.new_handle();
        self.client_mut(client)?
            .handles
            .insert(handle, Owned::ExportDup(exported));
        Ok(ExportDup {
            handle,
            exported,
            uuid: *uuid,
            num_max_handles: 1,
            num_cur_handles: 1,
            device_instance_mask,
        })
    }

    /// IMPORT_MEM of index 0 of the export dup `export` (`memoryexportCtrlImportMem`): a new
    /// dup of the attached memory in `client`, holding its own reference: an NV_MEMORY_FABRIC
    /// object for unicast memory, the multicast object for a prime's export. The caller
    /// checked the index range and the importer's parent.
    pub fn import_export_mem(
        &mut self,
        client: ClientId,
        export: u64,
    ) -> Result<MemoryDup, NvStatus> {
        let Some(Owned::ExportDup(exported)) = self.client(client)?.handles.get(&export).copied()
        else {
            return Err(NvStatus::InvalidObjectHandle);
        };
        let (owned, gpu) = match exported {
            Exported::Alloc(id) => {
                let a = self.allocs.get_mut(&id).ok_or(NvStatus::ObjectNotFound)?;
                a.refs += 1;
                (Owned::MemoryDup(id), Some(a.gpu))
            }
            Exported::Multicast(id) => {
                self.mc_ref(id);
                (Owned::Multicast(id), None)
            }
        };
        let handle = self.new_handle();
        self.client_mut(client)?.handles.insert(handle, owned);
        Ok(MemoryDup { handle, gpu })
    }

    /// What an export dup of `client` exports (for IMPORT_MEM's parent check).
    pub fn export_dup_target(&self, client: ClientId, export: u64) -> Result<Exported, NvStatus> {
        match self.client(client)?.handles.get(&export) {
            Some(Owned::ExportDup(e)) => Ok(*e),
            _ => Err(NvStatus::InvalidObjectHandle),
        }
    }

    /// The GPU unicast memory exported as `exported` is on (`None` for a multicast object).
    pub fn exported_gpu(&self, exported: Exported) -> Option<u32> {
        match exported {
            Exported::Alloc(id) => self.allocs.get(&id).map(|a| a.gpu),
            Exported::Multicast(_) => None,
        }
    }

    /// DESCRIBE of the memory dup `mem` of `client` (`memoryfabricCtrlCmdDescribe`): every
    /// page's fabric PFN and the owner GPU's attributes. The caller checked the privilege.
    pub fn describe_memory(&self, client: ClientId, mem: u64) -> Result<DescribedMemory, NvStatus> {
        let Some(Owned::MemoryDup(id)) = self.client(client)?.handles.get(&mem).copied() else {
            return Err(NvStatus::InvalidObjectHandle);
        };
        let a = self.allocs.get(&id).ok_or(NvStatus::InvalidObjectHandle)?;
        let base = self.gpu_addr(a.gpu).base() + a.offset;
        let attrs = self.gpu_attrs(a.gpu);
        Ok(DescribedMemory {
            gpu: a.gpu,
            pages: FabricPages {
                size: a.size,
                page_size: PAGE_SIZE,
                pfns: (0..a.size / PAGE_SIZE)
                    .map(|i| fla::pfn(base + i * PAGE_SIZE))
                    .collect(),
                clique_id: attrs.clique_id,
                bw_mode: attrs.bw_mode,
                bw_mode_epoch: attrs.bw_mode_epoch,
            },
        })
    }

    /// NV_MEMORY_FABRIC_IMPORTED_REF's claim (`importDescriptorGetUnused`): the import
    /// descriptor of (UUID, `(id << 16) | index`) if it is cached, not yet installed
    /// (validated or failed) and not claimed by another reference object; it is claimed.
    /// `None` is the constructor's NV_WARN_NOTHING_TO_DO.
    pub fn claim_import(&mut self, uuid: &ExportUuid, index: u16, id: u64) -> Option<u64> {
        let event_id = *self.import_cache.get(&(*uuid, import_key(index, id)))?;
        let d = self.descs.get_mut(&event_id)?;
        if d.claimed || d.state != DescState::Pending || d.unimport.is_some() {
            return None;
        }
        d.claimed = true;
        Some(event_id)
    }

    /// The claim of a reference object goes (`importDescriptorPutNonBlocking`): no event.
    pub fn unclaim_import(&mut self, event_id: u64) {
        if let Some(d) = self.descs.get_mut(&event_id) {
            d.claimed = false;
        }
    }

    /// VALIDATE's install through a claim (`importDescriptorInstallMemDesc`): the pages, or
    /// the failure, wake every waiter. A descriptor gone meanwhile (unimported and finished,
    /// removed by a teardown or DISABLE_IMPORTERS) or already being unimported takes it and
    /// ignores it, as the real reference still holds the descriptor; one installed already is
    /// NV_ERR_IN_USE.
    pub fn validate_claimed(&mut self, event_id: u64, result: Validation) -> Result<(), NvStatus> {
        let Some(d) = self.descs.get_mut(&event_id) else {
            return Ok(());
        };
        if d.unimport.is_some() {
            return Ok(());
        }
        if d.state != DescState::Pending {
            return Err(NvStatus::InUse);
        }
        d.state = match result {
            Validation::Pages(p) => DescState::Ready(p),
            Validation::ImportFailed => DescState::Failed,
        };
        Ok(())
    }
}
