//! cuMemMap on a GPU: the driver's check that a GPU may map a piece of fabric memory
//! (`docs/reference/driver-interface.md` §1.6 "Map", §5, §6.8).
//!
//! The real driver checks on the map, not on the import: an import succeeds across cliques and
//! only the mapping on a GPU whose cliqueId, bwMode or bwModeEpoch differs from the owner's is
//! refused (`memoryfabricimportv2IsGpuMapAllowed`, called from `dmaAllocMapping_GM107` and
//! `nvGpuOpsDupMemory`, which answer NV_ERR_INVALID_STATE).

use super::{ClientId, DescState, ImportState, Owned, Rm};
use openimex_simproto::proto::{FabricPages, NvStatus};

use super::probe::MemAttrs;

impl Rm {
    /// May `client` map `handle` on `gpu`? For memory of this node (an allocation, a local
    /// import) any GPU of the node may: the owner's attributes are the node's own. For remote
    /// memory, the owner's attributes the daemon validated the import with must equal the
    /// mapping GPU's current ones. Errors: an unknown GPU is NV_ERR_INVALID_ARGUMENT, an import
    /// that is not ready reports what [`Rm::wait_import`] reports, and a refused mapping is
    /// NV_ERR_INVALID_STATE with the real driver's reason.
    pub fn map_on_gpu(
        &self,
        client: ClientId,
        handle: u64,
        gpu: u32,
    ) -> Result<(), (NvStatus, String)> {
        let plain = |s: NvStatus| (s, s.to_string());
        if gpu >= self.config.gpus {
            return Err((
                NvStatus::InvalidArgument,
                format!("GPU {gpu} is not on this node ({} GPUs)", self.config.gpus),
            ));
        }
        let c = self.client(client).map_err(plain)?;
        let owned = *c
            .handles
            .get(&handle)
            .ok_or(plain(NvStatus::InvalidObjectHandle))?;
        match owned {
            Owned::Alloc(_) if c.disabled => Err(plain(NvStatus::ResetRequired)),
            Owned::Alloc(_) => Ok(()),
            // A multicast object is mapped through its team's table (the client's multicast
            // mapping), not as one GPU's memory.
            Owned::Multicast(_) => Err((
                NvStatus::InvalidArgument,
                "a multicast object is mapped through its team, not on one GPU".into(),
            )),
            Owned::LocalImport(_) | Owned::DeadImport(_) => {
                self.wait_import(client, handle).map(drop).map_err(plain)
            }
            // The daemon's dups are never mapped (it only describes them).
            Owned::ExportDup(_) | Owned::MemoryDup(_) => Err(plain(NvStatus::InvalidObjectHandle)),
            Owned::RemoteImport(event_id) => {
                match self.wait_import(client, handle).map_err(plain)? {
                    ImportState::Pending => return Err(plain(NvStatus::NotReady)),
                    ImportState::Ready(_) => {}
                }
                let Some(DescState::Ready(pages)) = self.descs.get(&event_id).map(|d| &d.state)
                else {
                    return Err(plain(NvStatus::InvalidState));
                };
                self.check_map_allowed(gpu, owner_attrs(pages))
                    .map_err(|why| {
                        (
                            NvStatus::InvalidState,
                            format!(
                                "Mapping Gpu is not attached to the given memory object: {why}"
                            ),
                        )
                    })
            }
        }
    }
}

fn owner_attrs(p: &FabricPages) -> MemAttrs {
    MemAttrs {
        clique_id: p.clique_id,
        bw_mode: p.bw_mode,
        bw_mode_epoch: p.bw_mode_epoch,
    }
}
