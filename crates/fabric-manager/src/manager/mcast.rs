//! Multicast (NVLS) team set-up on the FM's side (docs/reference/driver-interface.md §1.6 step 5): the prime
//! driver's MC_TEAM_SETUP request, checked and answered to every member tray, and the address
//! ranges of live teams.
//!
//! The FM refuses a team whose members it cannot program together: a member whose tray is not
//! attached, members in different cliques (RM's multicast attach checks the same cliqueId, §5),
//! a GPU without the multicast caps (or without MC_MULTINODE for a team spanning trays), an
//! empty team or size. Team ranges sit above every GPU's unicast FLA window and never overlap
//! one another.

use std::collections::{BTreeMap, BTreeSet};

use openimex_simproto::inband::{FabricGpu, FromFm, McTeam};

use super::{Manager, Outbox};
use crate::GpuId;
use crate::probe::caps;

/// First multicast address. Unicast windows are `(slot * 64 + gpu + 1) << 40` with a u16 slot
/// and fewer than 64 GPUs per tray, so they all end at or below `(1 << 62) + (1 << 40)`.
pub const MC_BASE: u64 = 1 << 63;
/// Team ranges are whole multiples of this (the simulated driver's 2 MiB page).
pub const MC_GRANULARITY: u64 = 2 << 20;

/// A live team.
#[derive(Debug, Clone)]
struct Team {
    base: u64,
    size: u64,
    slots: BTreeSet<u16>,
}

/// Live teams by handle.
#[derive(Debug, Default)]
pub(super) struct Teams {
    by_handle: BTreeMap<u64, Team>,
    next: u64,
}

impl Teams {
    pub(super) fn len(&self) -> usize {
        self.by_handle.len()
    }

    /// Forgets the trays that are not attached any more (their drivers are gone and will never
    /// release), and frees the teams left with no tray.
    pub(super) fn forget_detached(&mut self, attached: &BTreeSet<u16>) {
        for t in self.by_handle.values_mut() {
            t.slots.retain(|s| attached.contains(s));
        }
        self.by_handle.retain(|_, t| !t.slots.is_empty());
    }

    /// The lowest free range of `size` bytes (first fit among live teams).
    fn place(&self, size: u64) -> Option<u64> {
        let mut ranges: Vec<(u64, u64)> =
            self.by_handle.values().map(|t| (t.base, t.size)).collect();
        ranges.sort_unstable();
        let mut cursor = MC_BASE;
        for (base, len) in ranges {
            if cursor.checked_add(size)? <= base {
                return Some(cursor);
            }
            cursor = cursor.max(base.checked_add(len)?);
        }
        cursor.checked_add(size).map(|_| cursor)
    }
}

impl Manager {
    /// MC_TEAM_SETUP from the driver of `from`: one [`FromFm::McTeam`] per attached member
    /// tray (and `from`), all with the same result.
    pub fn mc_team_setup(
        &mut self,
        from: u16,
        team_key: &str,
        size: u64,
        members: &[FabricGpu],
    ) -> Outbox {
        let result = self.check_team(size, members).and_then(|()| {
            let size = size.div_ceil(MC_GRANULARITY) * MC_GRANULARITY;
            let base = self.teams.place(size).ok_or_else(|| {
                format!("no free multicast address range of {size} bytes; release teams first")
            })?;
            self.teams.next += 1;
            let handle = self.teams.next;
            let slots = members.iter().map(|m| m.slot).collect();
            self.teams
                .by_handle
                .insert(handle, Team { base, size, slots });
            Ok(McTeam {
                team_handle: handle,
                address_base: base,
                address_size: size,
            })
        });
        let mut to: BTreeSet<u16> = members
            .iter()
            .map(|m| m.slot)
            .filter(|s| self.attached.contains(s))
            .collect();
        to.insert(from);
        to.into_iter()
            .map(|slot| {
                let msg = FromFm::McTeam {
                    team_key: team_key.to_owned(),
                    members: members.to_vec(),
                    result: result.clone(),
                };
                (slot, msg)
            })
            .collect()
    }

    /// Why the FM cannot set up this team, if it cannot.
    fn check_team(&self, size: u64, members: &[FabricGpu]) -> Result<(), String> {
        if size == 0 {
            return Err("a multicast team of 0 bytes: ask for a size above 0".into());
        }
        if members.is_empty() {
            return Err("a multicast team without members".into());
        }
        let multinode = members.iter().any(|m| m.slot != members[0].slot);
        let mut clique = None;
        for m in members {
            let id = GpuId {
                slot: m.slot,
                gpu: m.gpu,
            };
            let Some(info) = self.answers.get(&id) else {
                return Err(format!(
                    "member GPU {} of slot {} is not in the topology",
                    m.gpu, m.slot
                ));
            };
            if !self.attached.contains(&m.slot) {
                return Err(format!(
                    "member GPU {} of slot {}: its tray's driver is not attached to the Fabric \
                     Manager",
                    m.gpu, m.slot
                ));
            }
            let need = if multinode {
                caps::MC_SUPPORTED | caps::MC_MULTINODE_SUPPORTED
            } else {
                caps::MC_SUPPORTED
            };
            if info.caps & need != need {
                return Err(format!(
                    "member GPU {} of slot {} lacks the multicast caps {need:#x} (it has {:#x})",
                    m.gpu, m.slot, info.caps
                ));
            }
            match clique {
                None if info.clique_id == 0 => {
                    return Err(format!(
                        "member GPU {} of slot {} is in no fabric partition",
                        m.gpu, m.slot
                    ));
                }
                None => clique = Some(info.clique_id),
                Some(c) if c != info.clique_id => {
                    return Err(format!(
                        "members in different cliques ({c} and {}, GPU {} of slot {}): a \
                         multicast team stays within one fabric partition",
                        info.clique_id, m.gpu, m.slot
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// MC_TEAM_RELEASE from the driver of tray `from`: that tray's objects of the team are
    /// gone (every member tray's driver sends it when its object goes,
    /// `_memMulticastFabricDescriptorFree`, not only the prime's). The range is freed once
    /// every member tray released it (or detached): a new team placed there earlier would
    /// share its multicast table with a member still bound to the old one. Whether the handle
    /// named a live team that tray had not released yet.
    pub fn mc_team_release(&mut self, from: u16, team_handle: u64) -> bool {
        let Some(team) = self.teams.by_handle.get_mut(&team_handle) else {
            return false;
        };
        let released = team.slots.remove(&from);
        if team.slots.is_empty() {
            self.teams.by_handle.remove(&team_handle);
        }
        released
    }

    /// A prime object failed while remote GPUs had attached (`ToFm::McTeamFailed` from tray
    /// `from`): every attached member tray but the sender gets a `FromFm::McTeam` with
    /// `Err(reason)` and the team's key, so the failure reaches every member. No team was set
    /// up for it, so there is nothing to free.
    pub fn mc_team_failed(
        &self,
        from: u16,
        team_key: &str,
        members: &[FabricGpu],
        reason: &str,
    ) -> Outbox {
        let to: BTreeSet<u16> = members
            .iter()
            .map(|m| m.slot)
            .filter(|s| *s != from && self.attached.contains(s))
            .collect();
        to.into_iter()
            .map(|slot| {
                let msg = FromFm::McTeam {
                    team_key: team_key.to_string(),
                    members: members.to_vec(),
                    result: Err(reason.to_string()),
                };
                (slot, msg)
            })
            .collect()
    }
}
