//! The owner's daemon's controls on a prime multicast object (`docs/reference/driver-interface.md`
//! §1.6 "Multicast" 4): ATTACH_REMOTE_GPU for a GPU of another node, SET_FAILURE, and the
//! failure of a prime, which every local object sees and, with a Fabric Manager linked, the
//! remote members are told of.

use openimex_simproto::handle::ExportUuid;
use openimex_simproto::inband::{FabricGpu, ToFm};
use openimex_simproto::multicast::{RemoteGpu, probe_handle};
use openimex_simproto::proto::{NO_NODE, NvStatus};

use super::Team;
use crate::rm::{ClientId, Rm};

impl Rm {
    /// ATTACH_REMOTE_GPU, the owner's daemon on the prime of `export_uuid`
    /// (`_memorymulticastfabricCtrlAttachRemoteGpu`): NV_ERR_INVALID_STATE with a stale token;
    /// NV_ERR_OBJECT_NOT_FOUND for an unknown export (the daemon's dup fails); then, each also
    /// failing the prime as SET_FAILURE does: NV_ERR_NOT_SUPPORTED on an imported object,
    /// NV_ERR_INVALID_OPERATION when full, NV_ERR_INVALID_ARGUMENT for another page size or
    /// node 0xFFFF, NV_ERR_INVALID_DEVICE for another clique or bandwidth mode,
    /// NV_ERR_INSERT_DUPLICATE_NAME for a GPU attached already. The last attach sends the team
    /// request.
    pub fn mc_attach_remote_gpu(
        &mut self,
        token: u64,
        export_uuid: &str,
        node_id: u16,
        gpu: RemoteGpu,
    ) -> Result<(), NvStatus> {
        let id = self.mc_prime_for_daemon(token, export_uuid)?;
        self.mc_attach_remote_gpu_to(id, node_id, gpu)
    }

    /// ATTACH_REMOTE_GPU on the multicast descriptor `id` for a caller whose privilege was
    /// checked (the RM ioctl path: the IMEX-capable client's dup of the prime); the checks
    /// after the privilege are [`Rm::mc_attach_remote_gpu`]'s.
    pub fn mc_attach_remote_gpu_to(
        &mut self,
        id: u64,
        node_id: u16,
        gpu: RemoteGpu,
    ) -> Result<(), NvStatus> {
        let asking = openimex_simproto::multicast::probe_handle_gpu(gpu.gpu_probe_handle);
        // An attach racing a failure (another GPU's attach was refused first) joins nothing:
        // its tray learns the failure as the members did.
        if let Team::Failed(s) = self.mc_desc(id)?.team {
            self.mc_relay_failure(id, asking.into_iter().collect(), s);
            return Err(s);
        }
        let result = self.mc_attach_remote_checked(id, node_id, gpu);
        if let Err(s) = result {
            // NOT_READY is the initial state: the real driver reports it as GENERIC.
            let s = if s == NvStatus::NotReady {
                NvStatus::Generic
            } else {
                s
            };
            self.mc_fail(id, s);
            // The refused GPU's tray waits for the team too: tell it the same way.
            self.mc_relay_failure(id, asking.into_iter().collect(), s);
            return Err(s);
        }
        Ok(())
    }

    fn mc_attach_remote_checked(
        &mut self,
        id: u64,
        node_id: u16,
        gpu: RemoteGpu,
    ) -> Result<(), NvStatus> {
        let slot = self.config.slot;
        let d = self.mc_desc(id)?;
        if !d.prime {
            return Err(NvStatus::NotSupported);
        }
        if d.num_attached == d.num_max {
            return Err(NvStatus::InvalidOperation);
        }
        if gpu.page_size != d.page_size {
            return Err(NvStatus::InvalidArgument);
        }
        let nvl = (gpu.clique_id, gpu.bw_mode, gpu.bw_mode_epoch);
        if d.nvl.is_some_and(|team| team != nvl) {
            return Err(NvStatus::InvalidDevice);
        }
        if node_id == NO_NODE {
            return Err(NvStatus::InvalidArgument);
        }
        let local_handle = |g: &u32| probe_handle(FabricGpu { slot, gpu: *g });
        let duplicate = d
            .local
            .iter()
            .any(|g| local_handle(g) == gpu.gpu_probe_handle)
            || d.remote
                .iter()
                .any(|(_, r)| r.gpu_probe_handle == gpu.gpu_probe_handle);
        if duplicate {
            return Err(NvStatus::InsertDuplicateName);
        }
        let last = d.num_attached + 1 == d.num_max;
        self.mc_desc_mut(id)?.remote.push((node_id, gpu));
        if last && let Err(s) = self.mc_team_request(id, None) {
            self.mc_desc_mut(id)?.remote.pop();
            return Err(s);
        }
        let d = self.mc_desc_mut(id)?;
        d.num_attached += 1;
        d.nvl.get_or_insert(nvl);
        Ok(())
    }

    /// SET_FAILURE, the owner's daemon on the prime of `export_uuid`
    /// (`_memorymulticastfabricCtrlSetFailure`): NV_ERR_NOT_SUPPORTED on an imported object,
    /// NV_ERR_INVALID_ARGUMENT for NV_ERR_NOT_READY (the initial state). Every local object
    /// reports the status from then on, and with an FM linked the remote members are told
    /// ([`ToFm::McTeamFailed`]).
    pub fn mc_set_failure(
        &mut self,
        token: u64,
        export_uuid: &str,
        status: NvStatus,
    ) -> Result<(), NvStatus> {
        let id = self.mc_prime_for_daemon(token, export_uuid)?;
        self.mc_set_failure_of(id, status)
    }

    /// SET_FAILURE on the multicast descriptor `id` for a caller whose privilege was checked;
    /// the rest is [`Rm::mc_set_failure`]'s (the NV_OK case is the caller's: it has no
    /// [`NvStatus`]).
    pub fn mc_set_failure_of(&mut self, id: u64, status: NvStatus) -> Result<(), NvStatus> {
        if !self.mc_desc(id)?.prime {
            return Err(NvStatus::NotSupported);
        }
        if status == NvStatus::NotReady {
            return Err(NvStatus::InvalidArgument);
        }
        self.mc_fail(id, status);
        Ok(())
    }

    /// The multicast descriptor behind `client`'s object `handle` (a multicast object, or
    /// IMPORT_MEM's dup of a prime).
    pub fn mc_desc_of_handle(&self, client: ClientId, handle: u64) -> Result<u64, NvStatus> {
        self.mc_desc_of(client, handle)
    }

    /// The prime exported as `uuid` and the exporter's channel.
    pub(in crate::rm) fn mc_export_of(&self, uuid: &ExportUuid) -> Option<(u64, u32)> {
        let id = *self.mc.primes.get(uuid)?;
        let (_, channel) = self.mc.descs.get(&id)?.export?;
        Some((id, channel))
    }

    /// One more object holds the descriptor `id`.
    pub(in crate::rm) fn mc_ref(&mut self, id: u64) {
        if let Some(d) = self.mc.descs.get_mut(&id) {
            d.refs += 1;
        }
    }

    /// The prime of `export_uuid`, for a daemon control holding `token`.
    fn mc_prime_for_daemon(&self, token: u64, export_uuid: &str) -> Result<u64, NvStatus> {
        if self.session.as_ref().is_none_or(|s| s.token != token) {
            return Err(NvStatus::InvalidState);
        }
        let uuid = ExportUuid::from_hex(export_uuid)?;
        self.mc
            .primes
            .get(&uuid)
            .copied()
            .ok_or(NvStatus::ObjectNotFound)
    }

    /// Fails the prime `id` with `status`: every local object reports it, and with an FM linked
    /// the remote members are told through it.
    pub(super) fn mc_fail(&mut self, id: u64, status: NvStatus) {
        let Some(d) = self.mc.descs.get_mut(&id) else {
            return;
        };
        d.team = Team::Failed(status);
        let members = d.remote_gpus();
        self.mc_relay_failure(id, members, status);
    }

    /// With an FM linked, tells the trays of `gpus` that the prime `id` failed with `status`
    /// ([`ToFm::McTeamFailed`]; the FM answers each with the failure).
    fn mc_relay_failure(&mut self, id: u64, gpus: Vec<FabricGpu>, status: NvStatus) {
        let Some(d) = self.mc.descs.get(&id) else {
            return;
        };
        if let (true, false, Some((uuid, _))) = (self.mc.fm_link, gpus.is_empty(), d.export) {
            self.mc.outbox.push(ToFm::McTeamFailed {
                team_key: uuid.to_hex(),
                members: gpus,
                reason: status.to_string(),
            });
        }
    }
}
