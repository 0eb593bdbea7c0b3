//! The daemon's side: the IMEX session, fabric events and the controls that answer them, and
//! what happens when the session goes away.

use std::collections::HashSet;

use super::{ClientId, DescState, Owned, Rm, Session};
use crate::fla;
use openimex_simproto::handle::ExportUuid;
use openimex_simproto::proto::{
    FabricEvent, FabricPages, MAX_UNIMPORT_TOKENS, NO_NODE, NvStatus, PAGE_SIZE, Validation,
};

/// The real driver's log line when a daemon dies holding export references.
pub const ABRUPT_SHUTDOWN_LOG: &str =
    "Abrupt nvidia-imex daemon shutdown detected, disabled fabric allocations";

impl Rm {
    /// NV_IMEX_SESSION alloc: become node `node_id`, enable fabric allocations. The session lives
    /// until [`Rm::disconnect`] of `client`. Returns the token for the daemon's other calls.
    pub fn open_session(&mut self, client: ClientId, node_id: u16) -> Result<u64, NvStatus> {
        self.client(client)?;
        if self.session.is_some() {
            return Err(NvStatus::InUse);
        }
        if node_id == NO_NODE {
            return Err(NvStatus::InvalidArgument);
        }
        // From the OS directly: `rand::random` seeds a generator per thread first, and each
        // client connection is a thread of its own here, so every session paid for a seeding
        // (and its `cpuid`, trapped by a hypervisor) to draw one number.
        let token = loop {
            use rand::{RngCore as _, TryRngCore as _};
            let t = rand::rngs::OsRng.unwrap_err().next_u64();
            if t != 0 {
                break t;
            }
        };
        self.session = Some(Session { client, token });
        self.node_id = node_id;
        self.allow_fabric_alloc = true;
        tracing::info!(
            node_id,
            slot = self.config.slot,
            "IMEX session opened: node {node_id}, fabric allocations enabled"
        );
        Ok(token)
    }

    /// The client holding the session, if one is open.
    pub fn session_client(&self) -> Option<ClientId> {
        self.session.as_ref().map(|s| s.client)
    }

    /// The session's token, if one is open.
    pub fn session_token(&self) -> Option<u64> {
        self.session.as_ref().map(|s| s.token)
    }

    /// GET_FABRIC_EVENTS: dequeue up to `max` events; the flag says more are queued. Never
    /// waits (the caller long-polls while the queue is empty).
    pub fn get_events(
        &mut self,
        token: u64,
        max: usize,
    ) -> Result<(Vec<FabricEvent>, bool), NvStatus> {
        self.check_token(token)?;
        Ok(self.drain_events(max))
    }

    /// Dequeues up to `max` events, oldest first, and whether more stay queued
    /// (`fabricExtractEventsV2`). The caller checked that it holds the session.
    pub fn drain_events(&mut self, max: usize) -> (Vec<FabricEvent>, bool) {
        let (events, more) = self.drain_events_with_channels(max);
        (events.into_iter().map(|(e, _)| e).collect(), more)
    }

    /// [`Rm::drain_events`] with each event's IMEX channel (the RM event's `imexChannel`:
    /// the importer's for imports, unimports and remote attaches, 0 for clique changes).
    pub fn drain_events_with_channels(&mut self, max: usize) -> (Vec<(FabricEvent, u32)>, bool) {
        let n = max.min(self.events.len());
        let events: Vec<FabricEvent> = self.events.drain(..n).collect();
        let out = events
            .into_iter()
            .map(|e| {
                let channel = match &e {
                    FabricEvent::Import { channel, .. }
                    | FabricEvent::CliqueIdChange { channel, .. }
                    | FabricEvent::RemoteGpuAttach { channel, .. } => *channel,
                    FabricEvent::Unimport {
                        unimport_event_id, ..
                    } => self
                        .unimport_channels
                        .remove(unimport_event_id)
                        .unwrap_or(0),
                };
                (e, channel)
            })
            .collect();
        (out, !self.events.is_empty())
    }

    /// Events queued since load: it grows with every post, so a caller that remembers the
    /// last value it saw knows the session's OS event is due (`osSetEvent`).
    pub fn events_posted(&self) -> u64 {
        self.events_posted
    }

    /// Events queued for the daemon.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Exporter side: dup the export by UUID for an importer on `channel`, take a reference that
    /// keeps the memory alive, and describe its fabric pages.
    pub fn describe_export(
        &mut self,
        token: u64,
        export_uuid: &str,
        index: u16,
        channel: u32,
    ) -> Result<(u64, FabricPages), NvStatus> {
        self.check_token(token)?;
        let uuid = ExportUuid::from_hex(export_uuid)?;
        let id = *self
            .export_cache
            .get(&uuid)
            .ok_or(NvStatus::ObjectNotFound)?;
        let a = self.allocs.get(&id).ok_or(NvStatus::ObjectNotFound)?;
        let e = a.export.as_ref().ok_or(NvStatus::ObjectNotFound)?;
        if index != 0 {
            return Err(NvStatus::InvalidArgument);
        }
        if e.channel != channel {
            return Err(NvStatus::InsufficientPermissions);
        }
        let base = self.gpu_addr(a.gpu).base() + a.offset;
        let pfns = (0..a.size / PAGE_SIZE)
            .map(|i| fla::pfn(base + i * PAGE_SIZE))
            .collect();
        let attrs = self.gpu_attrs(a.gpu);
        let pages = FabricPages {
            size: a.size,
            page_size: PAGE_SIZE,
            pfns,
            clique_id: attrs.clique_id,
            bw_mode: attrs.bw_mode,
            bw_mode_epoch: attrs.bw_mode_epoch,
        };
        if let Some(a) = self.allocs.get_mut(&id) {
            a.refs += 1;
        }
        let export_ref = self.new_handle();
        self.export_refs.insert(export_ref, id);
        Ok((export_ref, pages))
    }

    /// Exporter side: drop a reference taken by [`Rm::describe_export`]. The last reference of
    /// an allocation its creator released frees it and removes the export from the cache.
    pub fn release_export_ref(&mut self, token: u64, export_ref: u64) -> Result<(), NvStatus> {
        self.check_token(token)?;
        let id = self
            .export_refs
            .remove(&export_ref)
            .ok_or(NvStatus::InvalidObjectHandle)?;
        self.unref_alloc(id);
        Ok(())
    }

    /// Importer side: VALIDATE the import posted as `import_event_id` with its pages, or with
    /// the IMPORT_FAILED flag, which wakes every waiter. IMPORT_FAILED carries no status: every
    /// use of a failed import reports NV_ERR_INVALID_OBJECT, whatever the daemons saw
    /// (`docs/reference/driver-interface.md` §1.4 VALIDATE, §1.6 "Daemon B" 2, §4 "Failed import").
    /// An import already being unimported accepts (and ignores) it.
    pub fn validate(
        &mut self,
        token: u64,
        import_event_id: u64,
        result: Validation,
    ) -> Result<(), NvStatus> {
        self.check_token(token)?;
        let d = self
            .descs
            .get_mut(&import_event_id)
            .ok_or(NvStatus::InvalidArgument)?;
        if d.unimport.is_some() {
            return Ok(());
        }
        if d.state != DescState::Pending {
            return Err(NvStatus::InvalidState);
        }
        d.state = match result {
            Validation::Pages(p) => DescState::Ready(p),
            Validation::ImportFailed => DescState::Failed,
        };
        Ok(())
    }

    /// Importer side: FINISH_MEM_UNIMPORT. Completes the blocked releases; unknown IDs are
    /// ignored (the releasing thread may be gone). One call takes 1 to [`MAX_UNIMPORT_TOKENS`]
    /// tokens (`numTokens`, `docs/reference/driver-interface.md` §1.3, §1.4); 0 or more is
    /// NV_ERR_INVALID_ARGUMENT and finishes nothing. The reference gives the range, not the
    /// status: NV_ERR_INVALID_ARGUMENT is what `imexsessionapiCtrlCmdFinishMemUnimport`
    /// returns in open-gpu-kernel-modules.
    pub fn finish_unimport(&mut self, token: u64, ids: &[u64]) -> Result<(), NvStatus> {
        self.check_token(token)?;
        self.finish_unimports(ids)
    }

    /// FINISH_MEM_UNIMPORT for a caller that holds the session (see
    /// [`Rm::finish_unimport`]).
    pub fn finish_unimports(&mut self, ids: &[u64]) -> Result<(), NvStatus> {
        if ids.is_empty() || ids.len() > MAX_UNIMPORT_TOKENS {
            return Err(NvStatus::InvalidArgument);
        }
        for id in ids {
            if let Some(event_id) = self.unimports.remove(id) {
                self.descs.remove(&event_id);
            }
        }
        Ok(())
    }

    /// DISABLE_IMPORTERS(node): every client holding an import from `node` is disabled (RC'd);
    /// the descriptors go without unimport events, so re-imports query again.
    pub fn disable_importers(&mut self, token: u64, node: u16) -> Result<(), NvStatus> {
        self.check_token(token)?;
        self.disable_importers_of(node);
        Ok(())
    }

    /// DISABLE_IMPORTERS(node) for a caller that holds the session (see
    /// [`Rm::disable_importers`]).
    pub fn disable_importers_of(&mut self, node: u16) {
        let gone: HashSet<u64> = self
            .descs
            .iter()
            .filter(|(_, d)| d.export_node == node && d.unimport.is_none())
            .map(|(&id, _)| id)
            .collect();
        let disabled = self.kill_imports(&gone, |state| match state {
            DescState::Failed => NvStatus::InvalidObject,
            DescState::Pending | DescState::Ready(_) => NvStatus::ResetRequired,
        });
        // Holders of imported multicast objects of that node too (`bImported` in
        // `_checkClientDesiredImporterAndClearCache`).
        let disabled = disabled + self.mc_revoke_importers(Some(node)).1;
        tracing::warn!(
            node,
            descriptors = gone.len(),
            clients = disabled,
            "DISABLE_IMPORTERS(node {node}): disabled {disabled} importing client(s), dropped {} import descriptor(s)",
            gone.len()
        );
    }

    /// The session of `client` ends (its NV_IMEX_SESSION object was freed, or the client,
    /// or its connection): the teardown of §4. Returns whether `client` held the session.
    pub fn close_session(&mut self, client: ClientId) -> bool {
        if self.session.as_ref().is_none_or(|s| s.client != client) {
            return false;
        }
        self.teardown_session();
        true
    }

    /// The session's connection closed: the daemon died or stopped. See
    /// `docs/reference/driver-interface.md` §4, "Daemon dies or restarts".
    pub(super) fn teardown_session(&mut self) {
        let Some(session) = self.session.take() else {
            return;
        };
        let old_node = self.node_id;
        self.node_id = NO_NODE;
        // `_checkDanglingExports`: the session's client still holds export objects (its dups
        // by UUID; here also the protocol's DescribeExport references).
        let dups = self.clients.get(&session.client).map_or(0, |c| {
            c.handles
                .values()
                .filter(|o| matches!(o, Owned::ExportDup(_)))
                .count()
        });
        let dangling = self.export_refs.len() + dups;
        if dangling > 0 {
            self.allow_fabric_alloc = false;
            tracing::warn!("{ABRUPT_SHUTDOWN_LOG}");
            let refs: Vec<u64> = self.export_refs.drain().map(|(_, id)| id).collect();
            for id in refs {
                self.unref_alloc(id);
            }
        }
        // Exports minted under the old node ID can no longer be resolved (the real driver
        // clears the export cache of that node ID only: exports made while no daemon ran keep
        // their 0xFFFF UUIDs).
        let before = self.export_cache.len();
        self.export_cache.retain(|uuid, _| uuid.node() != old_node);
        let exports = before - self.export_cache.len();
        let events = self.events.len();
        self.events.clear();
        self.unimport_channels.clear();
        // Every thread blocked in an unimport is woken: the releases complete.
        let unimports = self.unimports.len();
        for (_, event_id) in self.unimports.drain() {
            self.descs.remove(&event_id);
        }
        // Pending imports fail with InvalidState; every client holding remote memory is RC'd.
        let all: HashSet<u64> = self.descs.keys().copied().collect();
        let disabled = self.kill_imports(&all, |state| match state {
            DescState::Pending => NvStatus::InvalidState,
            DescState::Ready(_) => NvStatus::ResetRequired,
            DescState::Failed => NvStatus::InvalidObject,
        });
        let disabled = disabled + self.mc_revoke_importers(None).1;
        tracing::info!(
            node = old_node,
            token = session.token,
            dangling_export_refs = dangling,
            "IMEX session of node {old_node} closed: node ID reset to 0xFFFF; dropped {dangling} daemon export reference(s), \
             {exports} cached export(s), {events} queued event(s); woke {unimports} blocked unimport(s); \
             failed {} import descriptor(s); disabled {disabled} importing client(s); fabric allocations {}",
            all.len(),
            if self.allow_fabric_alloc {
                "still enabled"
            } else {
                "disabled"
            },
        );
    }

    /// Removes the descriptors `gone` (no unimport events): their holders' handles report
    /// `status(state)` from now on, and every holder of a pending or ready one is disabled.
    /// Returns how many clients were newly disabled.
    fn kill_imports(
        &mut self,
        gone: &HashSet<u64>,
        status: impl Fn(&DescState) -> NvStatus,
    ) -> usize {
        let mut disabled = 0;
        for (id, c) in self.clients.iter_mut() {
            let mut hit = false;
            for owned in c.handles.values_mut() {
                if let Owned::RemoteImport(id) = *owned
                    && gone.contains(&id)
                    && let Some(d) = self.descs.get(&id)
                {
                    hit |= !matches!(d.state, DescState::Failed);
                    *owned = Owned::DeadImport(status(&d.state));
                }
            }
            if hit && !c.disabled {
                c.disabled = true;
                disabled += 1;
                self.revoked.push(*id);
            }
        }
        for id in gone {
            if let Some(d) = self.descs.remove(id)
                && self.import_cache.get(&d.key) == Some(id)
            {
                self.import_cache.remove(&d.key);
            }
        }
        disabled
    }

    fn check_token(&self, token: u64) -> Result<(), NvStatus> {
        match &self.session {
            Some(s) if s.token == token => Ok(()),
            _ => Err(NvStatus::InvalidState),
        }
    }
}
