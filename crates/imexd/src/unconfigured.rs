//! The daemon *unconfigured*: started on a nodes file that holds placeholder entries
//! (`0.0.0.0`, see the config crate's `nodes` module) but no entry for this host.
//!
//! AWS ParallelCluster seeds the nodes file with nine placeholder lines so that the service
//! starts before a job writes the real list. NVIDIA's daemon starts on that file and answers
//! `nvidia-imex-ctl`: the unconfigured sample (`ctl-N-j.570.172.unconfigured.json`) shows node 0
//! UNAVAILABLE at host `0.0.0.0`, its one connection (to itself) INVALID, the domain DOWN, and
//! `-N -j` exits 0. This module does the same:
//!
//! - It binds the command service only (no peer listener: there is no node ID to listen as)
//!   and dials nobody. The GPU driver is not opened.
//! - `ctl -q` prints `UNAVAILABLE`: the state NVIDIA reports for this node in `-N`, and not
//!   READY, so the DRA driver's and Slurm's readiness gates (`-q` == READY) keep waiting.
//! - `ctl -N` / `-N -j` describe this daemon alone as node 0 at `0.0.0.0` (it has no entry, so
//!   no ID or address of its own), its link INVALID, `changed` false, version `""`, domain DOWN:
//!   exactly the sample's shape, whatever else the file lists. `ctl --peers` lists no peer.
//! - On SIGUSR1 the file is read again ([`Check`]); once it names this host, [`run`] returns
//!   [`Outcome::Configured`], and the caller re-executes the daemon (same PID) so it starts
//!   configured. A file that still does not name this host is logged and changes nothing.
//! - With systemd (`Type=notify`) the start is reported complete (`READY=1`) with
//!   `STATUS=UNAVAILABLE …`: the service runs, as NVIDIA's does; the re-execution is announced
//!   as a reload (`RELOADING=1`), and the new image reports READY again when it is.

use std::future::Future;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;

use openimex_core::{DaemonState, DomainStatus};
use openimex_proto::cmd::command_server::Command;
use openimex_proto::cmd::{
    ConfigReply, ConfigRequest, DomainReply, DomainRequest, JobCreateReply, JobCreateRequest,
    JobEndReply, JobEndRequest, JobWaitReply, JobWaitRequest, JobsReply, JobsRequest, PeersReply,
    PeersRequest, StateReply, StateRequest,
};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::{DaemonError, Notifier, Reloads};

/// The host an unconfigured daemon reports for itself: the placeholder address.
pub const UNCONFIGURED_HOST: &str = "0.0.0.0";

/// Reads the nodes file again and says whether it now names this host (`Ok`), or why not.
/// Called off the runtime (it may resolve names).
pub type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// How an unconfigured run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// SIGTERM, SIGINT or SIGQUIT: exit.
    Stopped,
    /// The nodes file now names this host: re-execute to start configured.
    Configured,
}

/// The command service's listeners, and the socket path to remove at the end.
#[derive(Debug)]
pub struct CmdListeners {
    /// `IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT`.
    pub tcp: Option<TcpListener>,
    /// `IMEX_CMD_UNIX_DOMAIN_PATH`.
    pub unix: Option<UnixListener>,
    /// The unix socket's path.
    pub unix_path: Option<PathBuf>,
}

/// Serves `ctl` as an unconfigured daemon until `shutdown` resolves or a SIGUSR1 (on
/// `reloads`) finds this host in the nodes file (`check`). `why` is the reason this host
/// matched no entry, logged once.
pub async fn run(
    listeners: CmdListeners,
    why: String,
    check: Check,
    shutdown: impl Future<Output = ()>,
    mut reloads: Reloads,
    notify: Notifier,
) -> Result<Outcome, DaemonError> {
    warn!(
        "this host matches no entry of the nodes file, which holds placeholder entries (0.0.0.0): running unconfigured (state UNAVAILABLE, domain DOWN, no peers dialled) until the file names this host and SIGUSR1 is sent. {why}"
    );
    let servers = crate::cmd_server::serve(
        |_| Unconfigured { why: why.clone() },
        listeners.tcp,
        listeners.unix,
        listeners.unix_path.as_deref(),
        None,
    )?;
    notify.unconfigured();
    tokio::pin!(shutdown);
    let outcome = loop {
        tokio::select! {
            () = &mut shutdown => break Outcome::Stopped,
            request = reloads.recv() => {
                if request.is_none() {
                    break Outcome::Stopped;
                }
                let check = Arc::clone(&check);
                match tokio::task::spawn_blocking(move || check()).await {
                    Ok(Ok(())) => {
                        info!("SIGUSR1: the nodes file now names this host: re-executing the daemon (same PID) to start configured");
                        notify.reexecuting();
                        break Outcome::Configured;
                    }
                    Ok(Err(e)) => info!("SIGUSR1: still unconfigured: {e}"),
                    Err(e) => warn!("SIGUSR1: the nodes file check failed: {e}; still unconfigured"),
                }
            }
        }
    };
    for s in &servers {
        s.abort();
    }
    if let Some(path) = &listeners.unix_path {
        let _ = std::fs::remove_file(path);
    }
    Ok(outcome)
}

/// The command service of an unconfigured daemon (module docs).
struct Unconfigured {
    /// Why this host matched no entry of the nodes file.
    why: String,
}

/// The `-N` reply of an unconfigured daemon: the unconfigured sample's content, and (ours)
/// the node's `state_reason` saying it is not configured, and why, rather than broken.
pub fn domain_reply(why: &str) -> DomainReply {
    let mut node = crate::cmd_server::unavailable_row(0, UNCONFIGURED_HOST.to_string());
    node.state_reason = format!(
        "not configured: the nodes file holds placeholder entries (0.0.0.0) and none names \
         this host, so this daemon serves no IMEX domain; write the node list and send SIGUSR1 \
         (or restart). {why}"
    );
    DomainReply {
        local_node_id: 0,
        nodes: vec![node],
        status: DomainStatus::Down.as_str().to_string(),
    }
}

/// Why an unconfigured daemon takes no job: it is in no domain yet.
const UNCONFIGURED_JOBS: &str = "the daemon is unconfigured (its nodes file does not name this \
     host yet): it holds no jobs until it is configured";

#[tonic::async_trait]
impl Command for Unconfigured {
    async fn state(&self, _request: Request<StateRequest>) -> Result<Response<StateReply>, Status> {
        Ok(Response::new(StateReply {
            state: DaemonState::Unavailable.as_str().to_string(),
        }))
    }

    async fn domain(
        &self,
        _request: Request<DomainRequest>,
    ) -> Result<Response<DomainReply>, Status> {
        Ok(Response::new(domain_reply(&self.why)))
    }

    async fn peers(&self, _request: Request<PeersRequest>) -> Result<Response<PeersReply>, Status> {
        Ok(Response::new(PeersReply {
            local_node_id: 0,
            state: DaemonState::Unavailable.as_str().to_string(),
            peers: Vec::new(),
        }))
    }

    async fn jobs(&self, _: Request<JobsRequest>) -> Result<Response<JobsReply>, Status> {
        Ok(Response::new(JobsReply::default()))
    }

    async fn job_create(
        &self,
        _: Request<JobCreateRequest>,
    ) -> Result<Response<JobCreateReply>, Status> {
        Err(Status::failed_precondition(UNCONFIGURED_JOBS))
    }

    async fn job_end(&self, _: Request<JobEndRequest>) -> Result<Response<JobEndReply>, Status> {
        Err(Status::failed_precondition(UNCONFIGURED_JOBS))
    }

    async fn job_wait(&self, _: Request<JobWaitRequest>) -> Result<Response<JobWaitReply>, Status> {
        Err(Status::failed_precondition(UNCONFIGURED_JOBS))
    }

    async fn job_channel_clear(
        &self,
        _: Request<openimex_proto::cmd::JobChannelClearRequest>,
    ) -> Result<Response<openimex_proto::cmd::JobChannelClearReply>, Status> {
        Err(Status::failed_precondition(UNCONFIGURED_JOBS))
    }

    async fn config(&self, _: Request<ConfigRequest>) -> Result<Response<ConfigReply>, Status> {
        Err(Status::failed_precondition(
            "the daemon is unconfigured: its nodes file does not name this host yet",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_is_the_unconfigured_sample() {
        let r = domain_reply("this host is 10.0.0.9");
        assert_eq!(r.status, "DOWN");
        assert_eq!(r.nodes.len(), 1);
        let n = &r.nodes[0];
        assert_eq!((n.node_id, n.host.as_str()), (0, "0.0.0.0"));
        assert_eq!((n.state.as_str(), n.version.as_str()), ("UNAVAILABLE", ""));
        assert!(!n.reachable && n.cells.is_empty());
        assert!(
            n.state_reason.starts_with("not configured: ")
                && n.state_reason.ends_with("this host is 10.0.0.9"),
            "{}",
            n.state_reason
        );
    }
}
