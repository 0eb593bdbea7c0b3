//! A stand-in for the Fabric Manager's multicast side, for tests of in-process drivers: it
//! takes the team requests the drivers queued for the FM and answers every member's driver, as
//! `openimex fabric serve` does over the in-band socket (`reference/driver-interface.md` §1.6
//! "Multicast" 5). Probes are not its business: the drivers complete their own.

use std::sync::atomic::{AtomicU64, Ordering};

use openimex_simproto::inband::{McTeam, ToFm};

use crate::server::ServerHandle;

static NEXT_TEAM: AtomicU64 = AtomicU64::new(1);

/// Links an FM to each driver: team requests go to it from now on.
pub fn link(drivers: &[&ServerHandle]) {
    for d in drivers {
        d.with_rm(|rm| rm.set_fm_link(true));
    }
}

/// One round: every message the drivers queued is answered (a team set up at a fresh range,
/// or a failure relayed) to the drivers of the members named. Returns the messages handled.
pub fn relay(drivers: &[&ServerHandle]) -> usize {
    let sent: Vec<ToFm> = drivers
        .iter()
        .flat_map(|d| d.with_rm(|rm| rm.take_fm_messages()))
        .collect();
    let handled = sent.len();
    for msg in sent {
        let (team_key, members, result) = match msg {
            ToFm::McTeamSetup {
                team_key,
                size,
                members,
            } => {
                // A fresh range per request, unique across the tests of a process.
                let n = NEXT_TEAM.fetch_add(1, Ordering::Relaxed);
                let address_base = (1 << 61) | ((n % (1 << 20)) << 34);
                let team = McTeam {
                    team_handle: address_base,
                    address_base,
                    address_size: size,
                };
                (team_key, members, Ok(team))
            }
            ToFm::McTeamFailed {
                team_key,
                members,
                reason,
            } => (team_key, members, Err(reason)),
            ToFm::McTeamRelease { .. } | ToFm::Attach { .. } => continue,
        };
        for d in drivers {
            d.with_rm(|rm| {
                if members.iter().any(|m| m.slot == rm.config().slot) {
                    rm.apply_mc_team(&team_key, &members, result.clone());
                }
            });
        }
    }
    handled
}
