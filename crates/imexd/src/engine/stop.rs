//! The engine's shutdown: goodbyes to every peer while still answering peers, the driver's
//! queued calls finished (bounded), the last persist record written, the sessions closed. The
//! node decides when the goodbye wait is over (`GOODBYE_WAIT`, on its timer); this performs.

use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{Engine, NodeTimer, now};
use crate::mailbox::Input;
use crate::peer_client;

/// How long shutdown waits for the driver to finish the calls already queued.
const DRIVER_STOP_TIMEOUT: Duration = Duration::from_secs(2);

impl Engine {
    /// Shutdown: goodbye to every peer (answering peers meanwhile), then the driver threads
    /// finish the calls already queued, then the sessions close.
    pub(super) async fn stop(mut self, mut rx: mpsc::Receiver<Input>) {
        info!(
            "Shutting down: saying goodbye to {} connected peers",
            self.sessions.len()
        );
        self.node.handle_shutdown(now());
        let _ = self.perform();
        for (peer, session) in std::mem::take(&mut self.goodbyes) {
            let tx = self.tx.clone();
            tokio::spawn(async move {
                let delivered = peer_client::goodbye(peer, session).await;
                let _ = tx.send(Input::GoodbyeDelivered { peer, delivered }).await;
            });
        }
        // Keep answering peers (their goodbyes, hellos refused) while ours are in flight; each
        // acknowledged goodbye releases what we held for that peer's importers. The node says
        // when to stop waiting (all reported, or its goodbye wait is over), on its timer.
        let mut timer = NodeTimer::new();
        while !self.goodbyes_over {
            timer.set(self.node.poll_timeout());
            tokio::select! {
                () = timer.fired() => {
                    self.node.handle_timeout(now());
                    let _ = self.perform();
                }
                input = rx.recv() => match input {
                    Some(input) => {
                        if self.handle(input).and_then(|()| self.perform()).is_err() {
                            break;
                        }
                    }
                    None => break,
                },
            }
        }
        let dangling = self.node.export_refs_held();
        if dangling > 0 {
            warn!(
                "{dangling} export references stay held for peers that could not be told of this shutdown: the GPU driver keeps fabric allocation disabled until a daemon recovers them"
            );
        }
        let driver = self.driver;
        let finished = tokio::time::timeout(DRIVER_STOP_TIMEOUT, driver.stop());
        tokio::pin!(finished);
        // The driver worker may still post results; drain them so it never blocks.
        loop {
            tokio::select! {
                r = &mut finished => {
                    if r.is_err() {
                        warn!("the GPU driver did not finish its calls within {} ms; closing anyway", DRIVER_STOP_TIMEOUT.as_millis());
                    }
                    break;
                }
                input = rx.recv() => if input.is_none() { break },
            }
        }
        // The last record (references released by the goodbyes) must be on disk before exit.
        if let Some(writer) = self.persist.take() {
            writer.finish(&mut rx).await;
        }
        for (_, (_, link)) in self.sessions.drain() {
            link.reader.abort();
        }
    }
}
