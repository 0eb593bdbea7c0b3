//! Importing side: IMPORT_V2 allocation, waiting for it, releasing it (the unimport handshake).

use super::{Desc, DescState, ImportState, MemLocation, Owned, Released, Rm};
use crate::fabric;
use openimex_simproto::handle::FabricHandle;
use openimex_simproto::proto::{FabricEvent, FabricPages, NO_NODE, NvStatus, PAGE_SIZE};

impl Rm {
    /// cuMemImportFromShareableHandle(FABRIC). Returns a new import handle at once; the import
    /// may still be pending ([`Rm::wait_import`]).
    ///
    /// Memory exported on this node is imported directly (ready at once, no daemon involved).
    /// Remote memory goes through the import descriptor of (export UUID, index): the first
    /// importer creates it and posts one MEM_IMPORT event; later importers share it (their
    /// channel must match).
    pub fn import(&mut self, client: super::ClientId, handle: &str) -> Result<u64, NvStatus> {
        let h = FabricHandle::from_hex(handle)?;
        let channel = self.subscribed_channel(client)?;
        if self.node_id == NO_NODE {
            // The real driver refuses IMPORT_V2 while nodeId == 0xFFFF (no daemon session).
            return Err(NvStatus::NotSupported);
        }
        let owned = if h.export_uuid.node() == self.node_id {
            let id = *self
                .export_cache
                .get(&h.export_uuid)
                .ok_or(NvStatus::ObjectNotFound)?;
            let a = self.allocs.get_mut(&id).ok_or(NvStatus::ObjectNotFound)?;
            let e = a.export.as_ref().ok_or(NvStatus::ObjectNotFound)?;
            if h.index != 0 {
                return Err(NvStatus::InvalidArgument);
            }
            if e.channel != channel {
                return Err(NvStatus::InsufficientPermissions);
            }
            a.refs += 1;
            Owned::LocalImport(id)
        } else {
            let key = (h.export_uuid, h.index);
            let event_id = match self.import_cache.get(&key) {
                Some(&event_id) => {
                    let d = self
                        .descs
                        .get_mut(&event_id)
                        .ok_or(NvStatus::InvalidState)?;
                    if d.channel != channel {
                        return Err(NvStatus::InsufficientPermissions);
                    }
                    d.refs += 1;
                    event_id
                }
                None => {
                    let event_id = self.next_event();
                    let export_node = h.export_uuid.node();
                    self.descs.insert(
                        event_id,
                        Desc {
                            key,
                            channel,
                            export_node,
                            state: DescState::Pending,
                            refs: 1,
                            unimport: None,
                        },
                    );
                    self.import_cache.insert(key, event_id);
                    self.events.push_back(FabricEvent::Import {
                        event_id,
                        channel,
                        export_uuid: h.export_uuid.to_hex(),
                        index: h.index,
                        import_id: 0,
                        export_node,
                    });
                    event_id
                }
            };
            Owned::RemoteImport(event_id)
        };
        let import = self.new_handle();
        self.client_mut(client)?.handles.insert(import, owned);
        Ok(import)
    }

    /// The state of an import: ready (where to map it), pending, or the error its use reports
    /// (the failure status the daemon validated with, InvalidState when the session went away
    /// while it was pending, ResetRequired once the client is disabled).
    pub fn wait_import(
        &self,
        client: super::ClientId,
        import: u64,
    ) -> Result<ImportState, NvStatus> {
        let c = self.client(client)?;
        let owned = c
            .handles
            .get(&import)
            .copied()
            .ok_or(NvStatus::InvalidObjectHandle)?;
        if let Owned::DeadImport(status) = owned {
            return Err(status);
        }
        if c.disabled {
            return Err(NvStatus::ResetRequired);
        }
        match owned {
            Owned::LocalImport(id) => {
                let a = self.allocs.get(&id).ok_or(NvStatus::InvalidState)?;
                Ok(ImportState::Ready(
                    self.location_of(a.gpu, a.offset, a.size),
                ))
            }
            Owned::RemoteImport(event_id) => {
                let d = self.descs.get(&event_id).ok_or(NvStatus::InvalidState)?;
                match &d.state {
                    DescState::Pending if self.session.is_none() => Err(NvStatus::InvalidState),
                    DescState::Pending => Ok(ImportState::Pending),
                    DescState::Failed(s) => Err(*s),
                    DescState::Ready(pages) => self.translate(pages).map(ImportState::Ready),
                }
            }
            Owned::Alloc(_) | Owned::DeadImport(_) => Err(NvStatus::InvalidObjectHandle),
        }
    }

    /// Fabric pages → HBM file range. The PFNs must be contiguous within one GPU's window.
    fn translate(&self, pages: &FabricPages) -> Result<MemLocation, NvStatus> {
        let first = *pages.pfns.first().ok_or(NvStatus::InvalidArgument)?;
        let count = u64::try_from(pages.pfns.len()).map_err(|_| NvStatus::InvalidArgument)?;
        if pages.page_size != PAGE_SIZE
            || pages.size == 0
            || pages.size > count.saturating_mul(PAGE_SIZE)
        {
            return Err(NvStatus::InvalidArgument);
        }
        let addr = first
            .checked_mul(PAGE_SIZE)
            .ok_or(NvStatus::InvalidArgument)?;
        let (gpu, offset) = fabric::locate(addr).ok_or(NvStatus::InvalidArgument)?;
        for (i, &pfn) in (0u64..).zip(&pages.pfns) {
            let a = pfn
                .checked_mul(PAGE_SIZE)
                .ok_or(NvStatus::InvalidArgument)?;
            if fabric::locate(a) != Some((gpu, offset + i * PAGE_SIZE)) {
                return Err(NvStatus::InvalidArgument);
            }
        }
        Ok(MemLocation {
            size: pages.size,
            file: gpu.hbm_file(&self.config.fabric_dir),
            offset,
        })
    }

    /// Drops one client reference on a remote import descriptor. The last one posts MEM_UNIMPORT
    /// unless the import failed (then the descriptor just goes).
    pub(super) fn unref_desc(&mut self, event_id: u64) -> Released {
        let Some(d) = self.descs.get_mut(&event_id) else {
            return Released::Done;
        };
        d.refs = d.refs.saturating_sub(1);
        if d.refs > 0 {
            return Released::Done;
        }
        let (key, export_node, failed) = (
            d.key,
            d.export_node,
            matches!(d.state, DescState::Failed(_)),
        );
        // A new import of the same handle from now on gets a fresh descriptor and event: this
        // one is on its way out.
        if self.import_cache.get(&key) == Some(&event_id) {
            self.import_cache.remove(&key);
        }
        if failed {
            self.descs.remove(&event_id);
            return Released::Done;
        }
        let unimport_event_id = self.next_event();
        if let Some(d) = self.descs.get_mut(&event_id) {
            d.unimport = Some(unimport_event_id);
        }
        self.unimports.insert(unimport_event_id, event_id);
        self.events.push_back(FabricEvent::Unimport {
            unimport_event_id,
            import_event_id: event_id,
            export_node,
        });
        Released::Unimporting(unimport_event_id)
    }
}
