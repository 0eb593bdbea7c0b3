//! SIGUSR1 with TLS on (docs/reference/imex-guide.md §5): read the six key/certificate/CA files again before the
//! nodes file is re-read. If they cannot be used, the daemon says why, keeps the material it
//! has and skips the re-read and re-dials of that signal. At most one reload every
//! [`MIN_RELOAD_INTERVAL`] (NVIDIA's `IMEX_MINIMUM_SSL_RELOAD_INTERVAL`): signals inside the
//! window are ignored. With TLS off nothing passes through here, so plaintext SIGUSR1 is as it
//! was.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tracing::{error, info, warn};

use super::Tls;

/// The shortest time between two credential reloads.
pub const MIN_RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// Reloads `tls` on each request from `requests`, then passes the request on to the returned
/// channel (the nodes-file re-read) when the reload worked.
pub(crate) fn before_rereads(tls: Tls, mut requests: mpsc::Receiver<()>) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        let mut last: Option<Instant> = None;
        while requests.recv().await.is_some() {
            if !tls.reloadable() {
                info!(
                    "SIGUSR1: TLS material not reloaded (IMEX_AUTH_SOURCE=ENV_VAL: it is in the daemon's environment; restart the daemon to change it)"
                );
                let _ = tx.try_send(());
                continue;
            }
            if let Some(at) = last
                && at.elapsed() < MIN_RELOAD_INTERVAL
            {
                warn!(
                    "SIGUSR1 ignored: the TLS material was reloaded {} ms ago, and reloads are at most one every {} s; send SIGUSR1 again later",
                    at.elapsed().as_millis(),
                    MIN_RELOAD_INTERVAL.as_secs()
                );
                continue;
            }
            last = Some(Instant::now());
            let reloading = tls.clone();
            match tokio::task::spawn_blocking(move || reloading.reload()).await {
                Ok(Ok(())) => {
                    info!(
                        "SIGUSR1: TLS keys and certificates reloaded; new connections use them, sessions already up keep theirs"
                    );
                    let _ = tx.try_send(());
                }
                Ok(Err(why)) => error!(
                    "SIGUSR1: cannot reload the TLS keys and certificates: {why}; the daemon keeps the ones in use and does not re-read the nodes file or re-dial for this signal. Fix the files and send SIGUSR1 again"
                ),
                Err(e) => error!("SIGUSR1: the TLS reload task failed: {e}"),
            }
        }
    });
    rx
}
