//! The tray's NVLink in-band link to the domain's Fabric Manager (`openimex-lab gpu
//! --fabric-manager`; docs/reference/driver-interface.md §5, [`openimex_simproto::inband`]).
//!
//! One thread keeps one connection to the FM's socket in the fabric directory: it connects
//! (retrying every [`RETRY`] while no FM listens, since the drivers may start first), sends
//! `Attach`, and applies every probe answer or update through [`crate::rm::Rm::complete_probe`]
//! under the server's lock, waking its blocked calls. When the FM goes away the GPUs keep their
//! last answer, as a real GPU keeps its probe across an FM restart, and the link reconnects (a
//! restarted FM answers the attach again). A refused attach is logged and retried slowly.
//!
//! [`FmSender`] lets the rest of the driver send its own in-band requests (multicast team
//! set-up) on the current connection.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openimex_simproto::inband::{FromFm, ToFm, fm_socket_path};
use openimex_simproto::proto::{WireError, recv, send};

use crate::server::RmAccess;

/// How often the link tries again while no FM listens, or after the FM went away.
pub const RETRY: Duration = Duration::from_millis(200);
/// How long the link waits after the FM refused the attach (a config error the operator must
/// fix; retrying fast would only fill the logs).
pub const REFUSED_RETRY: Duration = Duration::from_secs(5);

/// The current connection to the FM, if any.
type Current = Arc<Mutex<Option<UnixStream>>>;

/// Sends in-band requests to the FM on the link's current connection.
#[derive(Debug, Clone)]
pub struct FmSender(Current);

impl FmSender {
    /// Sends `msg`; an error when the link is down (no FM connected) or the send failed.
    pub fn send(&self, msg: &ToFm) -> Result<(), WireError> {
        let cur = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match cur.as_ref() {
            Some(s) => send(s, msg, &[]),
            None => Err(WireError::Io(io::Error::new(
                io::ErrorKind::NotConnected,
                "no Fabric Manager connected",
            ))),
        }
    }
}

/// The running link.
#[derive(Debug)]
pub struct FmLink {
    stop: Arc<AtomicBool>,
    current: Current,
    thread: Option<JoinHandle<()>>,
}

impl FmLink {
    /// Starts the link of the tray at `slot` with `gpus` GPUs to the FM serving `fabric_dir`.
    pub fn spawn(rm: RmAccess, fabric_dir: &Path, slot: u16, gpus: u32) -> io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let current: Current = Arc::new(Mutex::new(None));
        let link = Link {
            rm,
            socket: fm_socket_path(fabric_dir),
            slot,
            gpus,
            stop: Arc::clone(&stop),
            current: Arc::clone(&current),
        };
        let thread = std::thread::Builder::new()
            .name("simgpu-fm-link".into())
            .spawn(move || link.run())?;
        Ok(Self {
            stop,
            current,
            thread: Some(thread),
        })
    }

    /// A sender on this link.
    pub fn sender(&self) -> FmSender {
        FmSender(Arc::clone(&self.current))
    }

    /// Closes the connection and waits for the thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(s) = self
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for FmLink {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The link thread's state.
struct Link {
    rm: RmAccess,
    socket: PathBuf,
    slot: u16,
    gpus: u32,
    stop: Arc<AtomicBool>,
    current: Current,
}

/// How one connection ended.
enum Ended {
    /// The FM refused the attach.
    Refused,
    /// The connection closed (the FM stopped or died) or could not be made.
    Closed,
}

impl Link {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Sleeps `d` in short slices, returning early on stop.
    fn pause(&self, d: Duration) {
        let until = Instant::now() + d;
        while !self.stopping() && Instant::now() < until {
            std::thread::sleep(RETRY.min(until.saturating_duration_since(Instant::now())));
        }
    }

    fn run(&self) {
        let mut waiting_logged = false;
        while !self.stopping() {
            let stream = match UnixStream::connect(&self.socket) {
                Ok(s) => s,
                Err(e) => {
                    if !waiting_logged {
                        tracing::info!(
                            socket = %self.socket.display(),
                            "no Fabric Manager listening ({e}); retrying every {RETRY:?} (a GPU never answered stays IN_PROGRESS)"
                        );
                        waiting_logged = true;
                    }
                    self.pause(RETRY);
                    continue;
                }
            };
            waiting_logged = false;
            match self.serve(stream) {
                Ended::Refused => self.pause(REFUSED_RETRY),
                Ended::Closed => {
                    if !self.stopping() {
                        tracing::warn!(
                            "Fabric Manager connection lost; the GPUs keep their probes, reconnecting"
                        );
                    }
                    self.pause(RETRY);
                }
            }
        }
    }

    /// One connection: attach, then apply what the FM sends until it closes.
    fn serve(&self, stream: UnixStream) -> Ended {
        let attach = ToFm::Attach {
            slot: self.slot,
            gpus: self.gpus,
        };
        // Published before the attach, so that whoever sees the FM answer can send on it.
        if let Ok(clone) = stream.try_clone() {
            *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(clone);
        }
        if let Err(e) = send(&stream, &attach, &[]) {
            tracing::warn!("cannot attach to the Fabric Manager: {e}");
            *self.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
            return Ended::Closed;
        }
        tracing::info!(
            slot = self.slot,
            gpus = self.gpus,
            "attached to the Fabric Manager"
        );
        // Multicast teams are the FM's to set up from now on (§1.6 "Multicast" 5).
        self.rm.with(|rm| rm.set_fm_link(true));
        let ended = loop {
            let msg = match recv::<FromFm>(&stream) {
                Ok((m, _)) => m,
                Err(_) => break Ended::Closed,
            };
            match msg {
                FromFm::Probe { gpu, info } => {
                    if let Err(s) = self.rm.with(|rm| rm.complete_probe(gpu, info)) {
                        tracing::warn!(gpu, "the Fabric Manager's probe answer was refused: {s}");
                    }
                }
                FromFm::Refused { reason } => {
                    tracing::error!(
                        slot = self.slot,
                        "the Fabric Manager refused this tray: {reason}; retrying every {REFUSED_RETRY:?}"
                    );
                    break Ended::Refused;
                }
                // MC_TEAM_SETUP_RSP (§1.6 "Multicast" 5): the FM answers every member's
                // driver directly; each completes (or fails) its objects of that team.
                FromFm::McTeam {
                    team_key,
                    members,
                    result,
                } => {
                    tracing::info!(
                        team_key,
                        ?result,
                        "multicast team answer from the Fabric Manager"
                    );
                    self.rm
                        .with(|rm| rm.apply_mc_team(&team_key, &members, result));
                }
            }
        };
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = None;
        self.rm.with(|rm| rm.set_fm_link(false));
        ended
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use openimex_harness::ScratchDir;
    use openimex_simproto::probe::{HealthSummary, ProbeInfo, ProbeState};

    use super::*;
    use crate::rm::ProbeStart;
    use crate::server::{DriverConfig, Server};

    fn answer(clique_id: u32) -> ProbeInfo {
        ProbeInfo {
            cluster_uuid: "ab".repeat(16),
            partition_id: 0,
            clique_id,
            fla_base: 1 << 40,
            fla_size: 1 << 40,
            caps: 3,
            health_mask: 0,
            health_summary: HealthSummary::Healthy,
            bw_mode: 0,
            bw_mode_epoch: 0,
        }
    }

    /// Accepts the link's next connection and reads its Attach.
    fn accept_attach(l: &UnixListener) -> UnixStream {
        let (s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let (m, _) = recv::<ToFm>(&s).expect("attach");
        assert_eq!(m, ToFm::Attach { slot: 2, gpus: 1 });
        s
    }

    /// docs/reference/driver-interface.md §5: the probe stays IN_PROGRESS until the FM (started after the driver)
    /// answers; the answer completes it; the FM going away leaves it as it was, and the link
    /// attaches again to the next FM. The sender reaches the FM on the current connection.
    #[test]
    fn the_link_attaches_completes_keeps_and_reconnects() {
        let dir = ScratchDir::new("simgpu-fm-link").expect("scratch");
        let config = DriverConfig {
            node_dir: dir.path().join("node"),
            fabric_dir: dir.path().join("fabric"),
            slot: 2,
            gpus: 1,
            hbm_bytes: 2 << 20,
            cluster_uuid: [0; 16],
            clique_id: 0,
            probe: ProbeStart::Pending,
            channels: 1,
            imex_channel_count: 1,
            ..DriverConfig::default()
        };
        let server = Server::bind(&config).expect("bind").spawn().expect("spawn");
        let rm = server.rm_access();
        let link = FmLink::spawn(rm.clone(), &config.fabric_dir, 2, 1).expect("link");
        // No FM yet: the link keeps trying.
        std::thread::sleep(RETRY * 2);
        let state = |rm: &RmAccess| rm.with(|r| r.probe_info(0).expect("probe"));
        assert_eq!(state(&rm).state, ProbeState::InProgress);

        let sock = fm_socket_path(&config.fabric_dir);
        let fm = UnixListener::bind(&sock).expect("listen");
        let s = accept_attach(&fm);
        send(
            &s,
            &FromFm::Probe {
                gpu: 0,
                info: answer(7),
            },
            &[],
        )
        .expect("send");
        let sender = link.sender();
        sender
            .send(&ToFm::McTeamRelease { team_handle: 9 })
            .expect("sender");
        let (m, _) = recv::<ToFm>(&s).expect("release");
        assert_eq!(m, ToFm::McTeamRelease { team_handle: 9 });
        // The link applies the answer on its own thread: wait for it (a hang guard only).
        let until = Instant::now() + Duration::from_secs(20);
        while state(&rm).state != ProbeState::Complete && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        let p = state(&rm);
        assert_eq!(
            (p.state, p.info.map(|i| i.clique_id)),
            (ProbeState::Complete, Some(7))
        );

        // The FM dies: the probe stays; a new FM gets the attach again.
        drop(s);
        drop(fm);
        std::fs::remove_file(&sock).expect("rm socket");
        let fm = UnixListener::bind(&sock).expect("listen again");
        let s = accept_attach(&fm);
        assert_eq!(state(&rm).state, ProbeState::Complete);
        send(
            &s,
            &FromFm::Refused {
                reason: "test".into(),
            },
            &[],
        )
        .expect("send");
        link.stop();
        server.stop();
    }
}
