//! Importing side: IMPORT_V2 allocation, waiting for it, releasing it (the unimport handshake).

use super::{Desc, DescState, ImportState, MemLocation, Owned, Released, Rm};
use crate::fla;
use openimex_simproto::handle::FabricHandle;
use openimex_simproto::proto::{
    FabricEvent, FabricPages, IMPORT_ID_MAX, NO_NODE, NvStatus, PAGE_SIZE, import_key,
};

impl Rm {
    /// cuMemImportFromShareableHandle(FABRIC): IMPORT_V2 of the handle's export packet with the
    /// caller's 48-bit `import_id`. Returns a new import handle at once; the import may still
    /// be pending ([`Rm::wait_import`]).
    ///
    /// The checks and their order are the real constructor's (`docs/reference/driver-interface.md`
    /// §1.6 "Import request" 1-4, §6.5; `mem_fabric_import_v2.c`):
    /// 1. the client must be subscribed to a channel: NV_ERR_INSUFFICIENT_PERMISSIONS;
    /// 2. the packet's *export* node ID must not be 0xFFFF (a single-node UUID, exported while
    ///    no daemon ran, §1.4): NV_ERR_NOT_SUPPORTED. The importer's own node ID is not
    ///    checked here;
    /// 3. the import ID must be below 2^48 - 1 (reserved for multicast, §1.4):
    ///    NV_ERR_INVALID_ARGUMENT;
    /// 4. the descriptor of (UUID, `(id << 16) | index`) is found or created; a cached one must
    ///    be on the caller's channel (NV_ERR_INSUFFICIENT_PERMISSIONS). Only its first importer
    ///    posts MEM_IMPORT, and posting needs a daemon session: without one the allocation
    ///    fails with NV_ERR_NOT_READY (the driver cannot notify a daemon) and nothing is kept.
    ///
    /// Memory exported on this node is imported directly, ready at once with no daemon
    /// involved (the local dup path the kernel allows, §8). Which path libcuda takes for a
    /// same-node handle is not public; this one is decided by the packet's node ID being the
    /// driver's current node ID, which needs a session (checked after step 3).
    pub fn import(
        &mut self,
        client: super::ClientId,
        handle: &str,
        import_id: u64,
    ) -> Result<u64, NvStatus> {
        let h = FabricHandle::from_hex(handle)?;
        let channel = self.subscribed_channel(client)?;
        let export_node = h.export_uuid.node();
        if export_node == NO_NODE {
            return Err(NvStatus::NotSupported);
        }
        if import_id >= IMPORT_ID_MAX {
            return Err(NvStatus::InvalidArgument);
        }
        let owned = if self.session.is_some() && export_node == self.node_id {
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
            let key = (h.export_uuid, import_key(h.index, import_id));
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
                    if self.session.is_none() {
                        // No IMEX session, no event to post the import to: the real
                        // constructor fails with the status of the failed post.
                        return Err(NvStatus::NotReady);
                    }
                    let event_id = self.next_event();
                    self.descs.insert(
                        event_id,
                        Desc {
                            key,
                            channel,
                            export_node,
                            state: DescState::Pending,
                            refs: 1,
                            unimport: None,
                            claimed: false,
                        },
                    );
                    self.import_cache.insert(key, event_id);
                    self.post_event(FabricEvent::Import {
                        event_id,
                        channel,
                        export_uuid: h.export_uuid.to_hex(),
                        index: h.index,
                        import_id,
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

    /// The state of an import: ready (where to map it), pending, or the error its use reports.
    /// For a remote import, in the real driver's order (`memoryfabricimportv2IsReady`,
    /// `docs/reference/driver-interface.md` §1.6 "Import request" 4, §6.5): NV_ERR_INVALID_STATE
    /// while no daemon session is open, NV_ERR_NOT_READY (here: pending) until VALIDATE,
    /// NV_ERR_INVALID_OBJECT once VALIDATE said IMPORT_FAILED (§4 "Failed import"). A client
    /// that was disabled gets ResetRequired, and a handle whose descriptor was removed under it
    /// the status it was left with.
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
                if self.session.is_none() {
                    return Err(NvStatus::InvalidState);
                }
                match &d.state {
                    DescState::Pending => Ok(ImportState::Pending),
                    DescState::Failed => Err(NvStatus::InvalidObject),
                    DescState::Ready(pages) => self.translate(pages).map(ImportState::Ready),
                }
            }
            Owned::Alloc(_)
            | Owned::DeadImport(_)
            | Owned::Multicast(_)
            | Owned::ExportDup(_)
            | Owned::MemoryDup(_) => Err(NvStatus::InvalidObjectHandle),
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
        let (gpu, offset) = fla::locate(addr).ok_or(NvStatus::InvalidArgument)?;
        for (i, &pfn) in (0u64..).zip(&pages.pfns) {
            let a = pfn
                .checked_mul(PAGE_SIZE)
                .ok_or(NvStatus::InvalidArgument)?;
            if fla::locate(a) != Some((gpu, offset + i * PAGE_SIZE)) {
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
        let (key, export_node, channel, failed) = (
            d.key,
            d.export_node,
            d.channel,
            matches!(d.state, DescState::Failed),
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
        self.post_unimport(
            FabricEvent::Unimport {
                unimport_event_id,
                import_event_id: event_id,
                export_node,
            },
            channel,
        );
        Released::Unimporting(unimport_event_id)
    }
}
