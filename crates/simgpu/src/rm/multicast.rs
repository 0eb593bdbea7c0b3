//! Multicast (NVLS) objects: NV_MEMORY_MULTICAST_FABRIC (class 0xFD) as
//! `mem_multicast_fabric.c` builds it (`docs/reference/driver-interface.md` §1.2-1.4, §1.6
//! "Multicast (NVLS) across nodes", §6.10).
//!
//! A *descriptor* is the team as this node sees it; client objects hold references on it.
//! - The **prime** descriptor (cuMulticastCreate) knows how many GPUs the team needs
//!   (`numGpus`) and counts attaches: its own node's (ATTACH_GPU) and other nodes' (the owner's
//!   daemon's ATTACH_REMOTE_GPU). The attach that makes the count reach `numGpus` sends the team
//!   set-up request to the Fabric Manager (MC_TEAM_SETUP_REQ, [`ToFm::McTeamSetup`], queued in
//!   an outbox the server drains: [`Rm::take_fm_messages`]), and only then.
//! - An **imported** descriptor (a multicast handle imported on another node, keyed by its
//!   export UUID and index as the real import cache keys it) has no count (`u32::MAX`); each
//!   local ATTACH_GPU posts REMOTE_GPU_ATTACH to the daemon, which forwards it to the owner.
//! - The FM answers every member's driver ([`Rm::apply_mc_team`]): each completes (the team's
//!   address range) or fails its descriptors. Until then every control but the attaches reports
//!   NV_ERR_NOT_READY (`memorymulticastfabricControl`); after a failure, the failure's status.
//!
//! A driver with no FM link (`openimex-lab gpu --probe complete`, which plays its own FM) sets up
//! a team whose members are all its own GPUs by itself, and refuses one with remote members
//! (NV_ERR_NOT_SUPPORTED, as the real driver does when the FM lacks the team set-up caps):
//! without a Fabric Manager there is no multicast across trays.
//!
//! The data path (the NVSwitch's multicast group) is [`table`]: one file per bound memory
//! range in the team's directory of the fabric directory, which the client maps.

mod daemon;
mod faults;
mod table;

use std::collections::HashMap;

use openimex_simproto::handle::{ExportUuid, FabricHandle};
use openimex_simproto::inband::{FabricGpu, McTeam, ToFm};
use openimex_simproto::multicast::{McBind, McBinding, McInfo, RemoteGpu, probe_handle, table_dir};
use openimex_simproto::probe::{CAP_MC_MULTINODE_SUPPORTED, CAP_MC_SUPPORTED, ProbeState};
use openimex_simproto::proto::{FabricEvent, NO_NODE, NvStatus, PAGE_SIZE};

use super::{ClientId, Owned, Rm};

/// The team's state (the real `mcTeamStatus`: NV_ERR_NOT_READY until the FM answered).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Team {
    NotReady,
    Ready {
        team: McTeam,
        members: Vec<FabricGpu>,
    },
    Failed(NvStatus),
}

/// A local memory range bound to the team (ATTACH_MEM).
#[derive(Debug)]
struct Bound {
    /// The allocation it holds a reference on.
    alloc: u64,
    binding: McBinding,
}

/// The NVLink attributes every member must share (`_memorymulticastfabricValidateNvlAttr`).
type NvlAttr = (u32, u16, u64);

/// One multicast descriptor. See the module doc.
#[derive(Debug)]
pub(super) struct McDesc {
    prime: bool,
    size: u64,
    page_size: u64,
    num_max: u32,
    num_attached: u32,
    /// Local GPUs attached, in order.
    local: Vec<u32>,
    /// Remote GPUs attached (prime only): IMEX node and the attach.
    remote: Vec<(u16, RemoteGpu)>,
    /// The first member's clique and bandwidth mode: the others must match.
    nvl: Option<NvlAttr>,
    team: Team,
    /// Client objects on it.
    refs: usize,
    /// Prime: its export (UUID, exporter's channel) once exported.
    export: Option<(ExportUuid, u32)>,
    /// Imported: the prime's export UUID, index and exporting node, and the importer's channel.
    import: Option<(ExportUuid, u16, u16, u32)>,
    /// The request key (the real `inbandReqId`): unique per descriptor on this node.
    key: u64,
    /// The key the FM's answer carries (set when the prime sends its request).
    team_key: Option<String>,
    bound: Vec<Bound>,
    /// Imported: the REMOTE_GPU_ATTACH event of each local attach, which the MEM_UNIMPORT
    /// posted when the object goes names (`_memMulticastFabricGpuInfoRemove`).
    attach_events: Vec<u64>,
}

impl McDesc {
    /// Whether the FM's answer for `team_key` is this descriptor's.
    fn answers(&self, team_key: &str) -> bool {
        match &self.import {
            Some((uuid, ..)) => uuid.to_hex() == team_key,
            None => self.team_key.as_deref() == Some(team_key),
        }
    }

    /// The remote GPUs attached, as the FM names them.
    fn remote_gpus(&self) -> Vec<FabricGpu> {
        self.remote
            .iter()
            .filter_map(|(_, r)| openimex_simproto::multicast::probe_handle_gpu(r.gpu_probe_handle))
            .collect()
    }

    /// The real IsReady: the team's status, which every control but the attaches checks.
    fn ready(&self) -> Result<(&McTeam, &[FabricGpu]), NvStatus> {
        match &self.team {
            Team::NotReady => Err(NvStatus::NotReady),
            Team::Failed(s) => Err(*s),
            Team::Ready { team, members } => Ok((team, members)),
        }
    }
}

/// The multicast part of the driver's state.
#[derive(Debug, Default)]
pub(super) struct McState {
    descs: HashMap<u64, McDesc>,
    next_key: u64,
    /// Prime descriptors by export UUID (the daemon's ATTACH_REMOTE_GPU and SET_FAILURE name
    /// them so).
    primes: HashMap<ExportUuid, u64>,
    /// Imported descriptors by (export UUID, index): every import of one handle shares one.
    imports: HashMap<(ExportUuid, u16), u64>,
    outbox: Vec<ToFm>,
    /// Whether a Fabric Manager answers team requests (else this driver plays it, alone).
    fm_link: bool,
}

impl McState {
    /// (descriptors, bound ranges) for the driver's stats.
    pub(super) fn counts(&self) -> (usize, usize) {
        let bound = self.descs.values().map(|d| d.bound.len()).sum();
        (self.descs.len(), bound)
    }

    /// GPUs attached to the primes here, local and remote.
    pub(super) fn attached(&self) -> usize {
        self.descs
            .values()
            .filter(|d| d.prime)
            .map(|d| d.num_attached as usize)
            .sum()
    }
}

impl Rm {
    /// Whether a Fabric Manager is linked: team requests go to it ([`Rm::take_fm_messages`])
    /// instead of being answered by this driver (see the module doc).
    pub fn set_fm_link(&mut self, linked: bool) {
        self.mc.fm_link = linked;
    }

    /// The in-band messages for the FM queued since the last call.
    pub fn take_fm_messages(&mut self) -> Vec<ToFm> {
        std::mem::take(&mut self.mc.outbox)
    }

    /// cuMulticastCreate: the prime object (`_memMulticastFabricValidateAllocParams`):
    /// NV_ERR_INVALID_ARGUMENT for 0 or `u32::MAX` GPUs, a size that is 0 or not a multiple of
    /// the page size, or a page size other than this fabric's ([`PAGE_SIZE`]; 0 picks it). The
    /// real constructor checks no probe: the object has no GPU until one attaches.
    pub fn mc_create(
        &mut self,
        client: ClientId,
        num_gpus: u32,
        size: u64,
        page_size: u64,
    ) -> Result<u64, NvStatus> {
        self.active_client_mut(client)?;
        let page_size = if page_size == 0 { PAGE_SIZE } else { page_size };
        if num_gpus == 0
            || num_gpus == u32::MAX
            || page_size != PAGE_SIZE
            || size == 0
            || !size.is_multiple_of(page_size)
        {
            return Err(NvStatus::InvalidArgument);
        }
        let desc = self.new_mc_desc(true, size, num_gpus, None);
        self.mc_own(client, desc)
    }

    /// Export of the prime object: the 64-byte handle (the same on every export). Needs a
    /// channel, as a unicast export does; the UUID carries the node ID (0xFFFF without a
    /// session: such a handle cannot be imported elsewhere).
    pub fn mc_export(&mut self, client: ClientId, mc: u64) -> Result<String, NvStatus> {
        let channel = self.subscribed_channel(client)?;
        let id = self.mc_desc_of(client, mc)?;
        let node = self.node_id;
        let exp_id = self.next_exp_id;
        let cluster_uuid = self.config.cluster_uuid;
        let d = self.mc_desc_mut(id)?;
        if !d.prime {
            return Err(NvStatus::NotSupported);
        }
        let uuid = match d.export {
            Some((uuid, _)) => uuid,
            None => {
                let uuid = ExportUuid::new(exp_id, node);
                d.export = Some((uuid, channel));
                self.next_exp_id += 1;
                self.mc.primes.insert(uuid, id);
                uuid
            }
        };
        let d = self.mc_desc_mut(id)?;
        Ok(FabricHandle {
            export_uuid: uuid,
            index: 0,
            size: d.size,
            cluster_uuid,
        }
        .to_hex())
    }

    /// Import of a multicast handle (`_memMulticastFabricConstruct`, non-prime):
    /// NV_ERR_INSUFFICIENT_PERMISSIONS without a channel, NV_ERR_NOT_SUPPORTED for a handle
    /// exported with no daemon (node 0xFFFF); imports of one handle share a descriptor, which
    /// must be on the caller's channel (NV_ERR_INSUFFICIENT_PERMISSIONS).
    pub fn mc_import(&mut self, client: ClientId, handle: &str) -> Result<u64, NvStatus> {
        let h = FabricHandle::from_hex(handle)?;
        let channel = self.subscribed_channel(client)?;
        let export_node = h.export_uuid.node();
        if export_node == NO_NODE {
            return Err(NvStatus::NotSupported);
        }
        let key = (h.export_uuid, h.index);
        let desc = match self.mc.imports.get(&key) {
            Some(&id) => {
                let d = self.mc_desc_mut(id)?;
                if d.import.is_some_and(|(.., c)| c != channel) {
                    return Err(NvStatus::InsufficientPermissions);
                }
                d.refs += 1;
                id
            }
            None => {
                let import = (h.export_uuid, h.index, export_node, channel);
                let id = self.new_mc_desc(false, 0, u32::MAX, Some(import));
                self.mc.imports.insert(key, id);
                id
            }
        };
        self.mc_own(client, desc)
    }

    /// cuMulticastAddDevice (`_memorymulticastfabricCtrlAttachGpu`), checks in the real order:
    /// an unknown GPU NV_ERR_INVALID_DEVICE; the team full NV_ERR_INVALID_OPERATION; set up
    /// already NV_ERR_STATE_IN_USE; the GPU attached already NV_ERR_INSERT_DUPLICATE_NAME; its
    /// probe not complete NV_ERR_NOT_READY (no probe handle); no multicast on it
    /// NV_ERR_NOT_SUPPORTED (the real driver has no fabric VA space then); another clique or
    /// bandwidth mode than the team's NV_ERR_INVALID_DEVICE. Then the last attach of a prime
    /// sends the team request; an attach to an imported object posts REMOTE_GPU_ATTACH (needs
    /// MC_MULTINODE in the GPU's caps, else NV_ERR_NOT_SUPPORTED, and a daemon session to post
    /// to, else NV_ERR_NOT_READY).
    pub fn mc_attach_gpu(&mut self, client: ClientId, mc: u64, gpu: u32) -> Result<(), NvStatus> {
        self.active_client_mut(client)?;
        let id = self.mc_desc_of(client, mc)?;
        if gpu >= self.hbm.gpu_count() {
            return Err(NvStatus::InvalidDevice);
        }
        let d = self.mc_desc(id)?;
        if d.num_attached == d.num_max {
            return Err(NvStatus::InvalidOperation);
        }
        if matches!(d.team, Team::Ready { .. }) {
            return Err(NvStatus::StateInUse);
        }
        if d.local.contains(&gpu) {
            return Err(NvStatus::InsertDuplicateName);
        }
        let probe = self
            .probes
            .get(gpu as usize)
            .ok_or(NvStatus::InvalidDevice)?;
        let info = match (&probe.state, &probe.info) {
            (ProbeState::Complete, Some(info)) => info.clone(),
            _ => return Err(NvStatus::NotReady),
        };
        if info.caps & CAP_MC_SUPPORTED == 0 {
            return Err(NvStatus::NotSupported);
        }
        let nvl = self.gpu_nvl(gpu);
        if d.nvl.is_some_and(|team| team != nvl) {
            return Err(NvStatus::InvalidDevice);
        }
        let (prime, last) = (d.prime, d.num_attached + 1 == d.num_max);
        let (import, key, page_size) = (d.import, d.key, d.page_size);
        let mut attach_event = None;
        if prime && last {
            if let Err(s) = self.mc_team_request(id, Some(gpu)) {
                // No team can come: every local object learns it now, not at a timeout.
                self.mc_fail(id, s);
                return Err(s);
            }
        } else if let (false, Some((uuid, index, export_node, channel))) = (prime, import) {
            if info.caps & CAP_MC_MULTINODE_SUPPORTED == 0 {
                return Err(NvStatus::NotSupported);
            }
            if self.session.is_none() {
                return Err(NvStatus::NotReady);
            }
            let event_id = self.next_event();
            let (clique_id, bw_mode, bw_mode_epoch) = nvl;
            let gpu = RemoteGpu {
                gpu_probe_handle: probe_handle(self.fabric_gpu(gpu)),
                key,
                clique_id,
                bw_mode,
                bw_mode_epoch,
                page_size,
            };
            attach_event = Some(event_id);
            self.post_event(FabricEvent::RemoteGpuAttach {
                event_id,
                channel,
                export_uuid: uuid.to_hex(),
                index,
                export_node,
                gpu,
            });
        }
        // Nothing fails past the request or the event (the real driver's rule: the FM or the
        // daemon already acts on it).
        let d = self.mc_desc_mut(id)?;
        d.num_attached += 1;
        d.local.push(gpu);
        d.nvl.get_or_insert(nvl);
        d.attach_events.extend(attach_event);
        Ok(())
    }

    /// MC_TEAM_SETUP_RSP from the FM (or its failure relay): completes, or fails, every local
    /// descriptor still waiting for the team `team_key` (a descriptor that failed meanwhile
    /// keeps its failure and, if prime, releases the team, as the real post-processor does).
    /// Returns how many descriptors it changed.
    pub fn apply_mc_team(
        &mut self,
        team_key: &str,
        members: &[FabricGpu],
        result: Result<McTeam, String>,
    ) -> usize {
        let mut changed = 0;
        let mut release = Vec::new();
        let mut matched = false;
        for d in self.mc.descs.values_mut().filter(|d| d.answers(team_key)) {
            matched = true;
            match (&d.team, &result) {
                (Team::NotReady, Ok(team)) => {
                    if !d.prime {
                        d.size = team.address_size;
                    }
                    d.team = Team::Ready {
                        team: *team,
                        members: members.to_vec(),
                    };
                }
                (Team::NotReady, Err(reason)) => {
                    tracing::warn!(team_key, reason, "multicast team refused");
                    d.team = Team::Failed(reason_status(reason));
                }
                (Team::Failed(_), Ok(team)) => {
                    release.push(ToFm::McTeamRelease {
                        team_handle: team.team_handle,
                    });
                    continue;
                }
                _ => continue,
            }
            changed += 1;
        }
        // Every member tray holds the team at the FM until it releases it: a tray whose
        // objects went before the answer releases it at once (as the real response callback
        // does for a descriptor freed meanwhile), else the range would stay taken.
        if let (false, true, Ok(team)) = (matched, self.mc.fm_link, &result) {
            release.push(ToFm::McTeamRelease {
                team_handle: team.team_handle,
            });
        }
        self.mc.outbox.extend(release);
        changed
    }

    /// cuMulticastBindMem (ATTACH_MEM): needs the team set up (NV_ERR_NOT_READY before, the
    /// failure after one); then NV_ERR_INVALID_DEVICE for a GPU that did not attach or memory
    /// that is not this client's allocation on it, NV_ERR_INVALID_ARGUMENT for a range not
    /// page-aligned or outside the object or the allocation. The binding holds a reference on
    /// the allocation until the object goes, and is written to the team's table.
    pub fn mc_attach_mem(
        &mut self,
        client: ClientId,
        mc: u64,
        bind: &McBind,
    ) -> Result<(), NvStatus> {
        let &McBind {
            gpu,
            offset,
            mem,
            mem_offset,
            size,
        } = bind;
        self.active_client_mut(client)?;
        let id = self.mc_desc_of(client, mc)?;
        let d = self.mc_desc(id)?;
        let (team, _) = d.ready()?;
        let base = team.address_base;
        if !d.local.contains(&gpu) {
            return Err(NvStatus::InvalidDevice);
        }
        let Some(Owned::Alloc(alloc)) = self.client(client)?.handles.get(&mem).copied() else {
            return Err(NvStatus::InvalidDevice);
        };
        let a = self.allocs.get(&alloc).ok_or(NvStatus::InvalidDevice)?;
        if a.gpu != gpu {
            return Err(NvStatus::InvalidDevice);
        }
        let aligned = [offset, mem_offset, size]
            .iter()
            .all(|v| v.is_multiple_of(d.page_size));
        let inside = |at: u64, len: u64| at.checked_add(size).is_some_and(|end| end <= len);
        if size == 0 || !aligned || !inside(offset, d.size) || !inside(mem_offset, a.size) {
            return Err(NvStatus::InvalidArgument);
        }
        let location = self.location_of(gpu, a.offset + mem_offset, size);
        let binding = McBinding {
            gpu: self.fabric_gpu(gpu),
            mc_offset: offset,
            size,
            file: location.file.to_string_lossy().into_owned(),
            file_offset: location.offset,
        };
        if d.bound
            .iter()
            .any(|b| b.binding.file_name() == binding.file_name())
        {
            return Err(NvStatus::InvalidArgument);
        }
        table::write(&table_dir(&self.config.fabric_dir, base), &binding)
            .map_err(|_| NvStatus::InvalidState)?;
        if let Some(a) = self.allocs.get_mut(&alloc) {
            a.refs += 1;
        }
        self.mc_desc_mut(id)?.bound.push(Bound { alloc, binding });
        Ok(())
    }

    /// GET_INFO: the object's sizes and counts, once the team is set up (NV_ERR_NOT_READY
    /// before, the failure after one), with the team and its table.
    pub fn mc_info(&self, client: ClientId, mc: u64) -> Result<McInfo, NvStatus> {
        let id = self.mc_desc_of(client, mc)?;
        let d = self.mc_desc(id)?;
        let (team, members) = d.ready()?;
        Ok(McInfo {
            size: d.size,
            page_size: d.page_size,
            num_max_gpus: d.num_max,
            num_attached_gpus: d.num_attached,
            team: Some(*team),
            members: members.to_vec(),
            table_dir: Some(
                table_dir(&self.config.fabric_dir, team.address_base)
                    .to_string_lossy()
                    .into_owned(),
            ),
        })
    }

    /// Drops one object's reference on descriptor `id`; the last unbinds its memory (dropping
    /// the allocations' references and the table entries) and, on any descriptor whose team
    /// the FM set up, releases the team (MC_TEAM_RELEASE_REQ).
    pub(super) fn mc_unref(&mut self, id: u64) {
        let Some(d) = self.mc.descs.get_mut(&id) else {
            return;
        };
        d.refs = d.refs.saturating_sub(1);
        if d.refs > 0 {
            return;
        }
        let Some(d) = self.mc.descs.remove(&id) else {
            return;
        };
        let base = match &d.team {
            Team::Ready { team, .. } => Some(*team),
            _ => None,
        };
        for b in &d.bound {
            if let Some(team) = base {
                table::remove(
                    &table_dir(&self.config.fabric_dir, team.address_base),
                    &b.binding,
                );
            }
            self.unref_alloc(b.alloc);
        }
        if let Some((uuid, _)) = d.export {
            self.mc.primes.remove(&uuid);
        }
        if let Some((uuid, index, ..)) = d.import
            && self.mc.imports.get(&(uuid, index)) == Some(&id)
        {
            // Only its own entry: a revoked descriptor left the cache already, and a later
            // import of the same handle may have a new one there.
            self.mc.imports.remove(&(uuid, index));
        }
        self.mc_post_unimports(&d);
        // `_memMulticastFabricDescriptorFree` releases the team from every node whose
        // descriptor had it installed, imported ones too: the FM frees the range once every
        // member tray released it.
        match (d.prime, base) {
            (_, Some(team)) if self.mc.fm_link => self.mc.outbox.push(ToFm::McTeamRelease {
                team_handle: team.team_handle,
            }),
            (true, Some(team)) => {
                table::remove_team(&table_dir(&self.config.fabric_dir, team.address_base));
            }
            _ => {}
        }
    }

    // ---- helpers ----

    fn new_mc_desc(
        &mut self,
        prime: bool,
        size: u64,
        num_max: u32,
        import: Option<(ExportUuid, u16, u16, u32)>,
    ) -> u64 {
        self.mc.next_key += 1;
        let key = self.mc.next_key;
        self.mc.descs.insert(
            key,
            McDesc {
                prime,
                size,
                page_size: PAGE_SIZE,
                num_max,
                num_attached: 0,
                local: Vec::new(),
                remote: Vec::new(),
                nvl: None,
                team: Team::NotReady,
                refs: 1,
                export: None,
                import,
                key,
                team_key: None,
                bound: Vec::new(),
                attach_events: Vec::new(),
            },
        );
        key
    }

    /// A new client handle on descriptor `desc` (whose reference the caller took).
    fn mc_own(&mut self, client: ClientId, desc: u64) -> Result<u64, NvStatus> {
        let mc = self.new_handle();
        self.client_mut(client)?
            .handles
            .insert(mc, Owned::Multicast(desc));
        Ok(mc)
    }

    fn mc_desc_of(&self, client: ClientId, mc: u64) -> Result<u64, NvStatus> {
        match self.client(client)?.handles.get(&mc) {
            Some(Owned::Multicast(id)) => Ok(*id),
            _ => Err(NvStatus::InvalidObjectHandle),
        }
    }

    fn mc_desc(&self, id: u64) -> Result<&McDesc, NvStatus> {
        self.mc.descs.get(&id).ok_or(NvStatus::InvalidObjectHandle)
    }

    fn mc_desc_mut(&mut self, id: u64) -> Result<&mut McDesc, NvStatus> {
        self.mc
            .descs
            .get_mut(&id)
            .ok_or(NvStatus::InvalidObjectHandle)
    }

    fn fabric_gpu(&self, gpu: u32) -> FabricGpu {
        FabricGpu {
            slot: self.config.slot,
            gpu,
        }
    }

    /// The GPU's clique, NVLink bandwidth mode and its epoch, from its probe (all 0 before it
    /// completed).
    fn gpu_nvl(&self, gpu: u32) -> NvlAttr {
        let a = self.gpu_attrs(gpu);
        (a.clique_id, a.bw_mode, a.bw_mode_epoch)
    }

    /// MC_TEAM_SETUP_REQ for the prime `id`, whose attach of local `joining` (or of the remote
    /// GPU pushed last) completes the count. With no FM linked, this driver answers: a team of
    /// its own GPUs is set up at once, one with remote members is NV_ERR_NOT_SUPPORTED.
    fn mc_team_request(&mut self, id: u64, joining: Option<u32>) -> Result<(), NvStatus> {
        let slot = self.config.slot;
        let fm_link = self.mc.fm_link;
        let d = self.mc_desc(id)?;
        let mut members: Vec<FabricGpu> = d
            .local
            .iter()
            .chain(joining.as_ref())
            .map(|&gpu| FabricGpu { slot, gpu })
            .collect();
        let remote = d.remote_gpus();
        if !fm_link && !remote.is_empty() {
            tracing::warn!(
                "multicast team with GPUs of other trays, and no Fabric Manager linked: refused"
            );
            return Err(NvStatus::NotSupported);
        }
        members.extend(remote);
        let team_key = match d.export {
            Some((uuid, _)) => uuid.to_hex(),
            None => format!("{slot}-{}", d.key),
        };
        let (size, key) = (d.size, d.key);
        self.mc_desc_mut(id)?.team_key = Some(team_key.clone());
        if fm_link {
            self.mc.outbox.push(ToFm::McTeamSetup {
                team_key,
                size,
                members,
            });
        } else {
            // This driver's own multicast range: above every unicast window, one 1 TiB slice
            // per tray, one page-aligned 16 GiB slot per request key (wrapping after 64).
            let address_base = (1 << 62) | (u64::from(slot) << 40) | ((key % 64) << 34);
            table::remove_team(&table_dir(&self.config.fabric_dir, address_base));
            let team = McTeam {
                team_handle: address_base,
                address_base,
                address_size: size,
            };
            self.apply_mc_team(&team_key, &members, Ok(team));
        }
        Ok(())
    }
}

/// The status an FM refusal reports: the status it names first (`NV_ERR_…: why`), else
/// NV_ERR_GENERIC.
fn reason_status(reason: &str) -> NvStatus {
    NvStatus::ALL
        .into_iter()
        .find(|s| {
            let name = s.to_string();
            reason.starts_with(&name) && !reason[name.len()..].starts_with('_')
        })
        .filter(|s| *s != NvStatus::NotReady)
        .unwrap_or(NvStatus::Generic)
}
