//! Multicast objects under faults (`docs/reference/driver-interface.md` §1.6 "Multicast" 7, §4):
//! the MEM_UNIMPORT an imported object posts when it goes, and what a session teardown or
//! DISABLE_IMPORTERS does to the holders of imported multicast objects. Decisions follow
//! `mem_multicast_fabric.c` and `imex_session_api.c`:
//!
//! - The last reference on an imported descriptor goes (`_memMulticastFabricDescriptorFree`):
//!   its bindings are detached first (`_memorymulticastfabricDetachMem`, here: the table
//!   entries removed, so no later store through the team reaches the freed memory), then
//!   `_memMulticastFabricGpuInfoRemove` posts one MEM_UNIMPORT per attached GPU, naming the
//!   REMOTE_GPU_ATTACH event as its import (`_memMulticastFabricInitUnimportEvent`). Unlike a
//!   unicast unimport the free does not wait for FINISH_MEM_UNIMPORT: nothing is put in the
//!   unimport cache, so the daemon's FINISH for it finds nothing (ignored, as
//!   `imexsessionapiCtrlCmdFinishMemUnimport` ignores unknown IDs). The prime keeps the remote
//!   member in its `remoteGpuInfoMap` until the prime itself goes: the real driver has no
//!   control that detaches a remote GPU, so the owner's side has nothing to drop.
//! - Session teardown (`imexsessionapiDestruct` → `rcAndDisableOutstandingClientsWithImportedMemory`
//!   with NV_FABRIC_INVALID_NODE_ID) and DISABLE_IMPORTERS(node) (the same with that node):
//!   `_checkClientDesiredImporterAndClearCache` matches every client holding an *imported*
//!   multicast object (`bImported`) of that node (any node on teardown), takes the descriptor
//!   out of the import cache (`memorymulticastfabricRemoveFromCache`: a re-import builds a new
//!   one) and the client is disabled and its channels RC'd (here: the server kills its
//!   process). The objects themselves go when the killed process's handles are freed, through
//!   the path above. A prime is never matched: its holder keeps it.
//! - Events are posted only while a daemon session is open (a teardown drops the queue, and
//!   with no daemon nobody would read them).

use std::collections::HashSet;

use openimex_simproto::proto::FabricEvent;

use super::McDesc;
use crate::rm::{Owned, Rm};

impl Rm {
    /// MEM_UNIMPORT for each local GPU the imported descriptor `d` (just removed) attached.
    pub(super) fn mc_post_unimports(&mut self, d: &McDesc) {
        let Some((_, _, export_node, channel)) = d.import else {
            return;
        };
        if self.session.is_none() {
            return;
        }
        for &import_event_id in &d.attach_events {
            let unimport_event_id = self.next_event();
            self.post_unimport(
                FabricEvent::Unimport {
                    unimport_event_id,
                    import_event_id,
                    export_node,
                },
                channel,
            );
        }
    }

    /// Session teardown (`node` None: every exporting node) or DISABLE_IMPORTERS(`node`): the
    /// imported multicast descriptors of that node leave the import cache and every client
    /// holding one is disabled (and killed by the server). Returns (descriptors, clients newly
    /// disabled).
    pub(in crate::rm) fn mc_revoke_importers(&mut self, node: Option<u16>) -> (usize, usize) {
        let gone: HashSet<u64> = self
            .mc
            .descs
            .iter()
            .filter(|(_, d)| {
                d.import
                    .is_some_and(|(_, _, export_node, _)| node.is_none_or(|n| n == export_node))
            })
            .map(|(&id, _)| id)
            .collect();
        self.mc.imports.retain(|_, id| !gone.contains(id));
        let mut disabled = 0;
        for (client_id, c) in self.clients.iter_mut() {
            let holds = c
                .handles
                .values()
                .any(|o| matches!(o, Owned::Multicast(id) if gone.contains(id)));
            if holds && !c.disabled {
                c.disabled = true;
                disabled += 1;
                self.revoked.push(*client_id);
            }
        }
        if !gone.is_empty() {
            tracing::warn!(
                node = node.map(i32::from).unwrap_or(-1),
                descriptors = gone.len(),
                clients = disabled,
                "imported multicast objects revoked: {} descriptor(s) out of the import cache, \
                 {disabled} holding client(s) disabled",
                gone.len()
            );
        }
        (gone.len(), disabled)
    }
}
