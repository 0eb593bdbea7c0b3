//! SIGUSR1's I/O: read the nodes file again (with the config crate's parser and its file:line
//! errors) and resolve every DNS name in it, then hand the result to the engine, which decides
//! (through the core node) what changes. At start-up the entries the daemon started with are
//! resolved once, so the first re-read can say which names now resolve elsewhere.
//!
//! One task does this, one request at a time: signals that arrive during a re-read are folded
//! into the next one (the channel holds one pending request), so a burst of SIGUSR1 costs at
//! most two re-reads and two can never race each other into the engine.

use std::net::IpAddr;
use std::path::PathBuf;

use openimex_config::NodeConfig;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::mailbox::{Input, NodesFile, Reread};
use crate::net::Resolver;

/// Resolves the start-up `hosts`, then re-reads `path` on every request from `requests`,
/// reporting each outcome to `engine`. Ends when either channel closes.
pub(crate) async fn serve(
    path: Option<PathBuf>,
    hosts: Vec<String>,
    mut requests: mpsc::Receiver<()>,
    engine: mpsc::Sender<Input>,
    resolver: Resolver,
) {
    let addrs = resolve_all(&hosts, &resolver).await;
    let initial = NodesFile {
        path: path.clone().unwrap_or_default(),
        hosts,
        lines: Vec::new(),
        addrs,
    };
    let first = Input::NodesFile(Reread {
        initial: true,
        result: Ok(initial),
    });
    if engine.send(first).await.is_err() {
        return;
    }
    while requests.recv().await.is_some() {
        let result = match &path {
            Some(path) => read(path.clone(), &resolver).await,
            None => Err("the daemon was started without a nodes file path".to_string()),
        };
        let input = Input::NodesFile(Reread {
            initial: false,
            result,
        });
        if engine.send(input).await.is_err() {
            return;
        }
    }
}

/// Reads and parses the file off the runtime, then resolves its names.
async fn read(path: PathBuf, resolver: &Resolver) -> Result<NodesFile, String> {
    // The error as text: it goes into a log line, with the file and line it names.
    let parsed = tokio::task::spawn_blocking({
        let path = path.clone();
        move || NodeConfig::load(&path).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("the reading task failed: {e}"))??;
    let hosts = parsed.hosts();
    let addrs = resolve_all(&hosts, resolver).await;
    Ok(NodesFile {
        path,
        lines: parsed.entries.iter().map(|e| e.line).collect(),
        hosts,
        addrs,
    })
}

/// The addresses of every entry, in entry order: an IP entry is its own address, a name is
/// looked up (all names at once); a name that does not resolve has none.
pub(crate) async fn resolve_all(hosts: &[String], resolver: &Resolver) -> Vec<Vec<IpAddr>> {
    let mut addrs: Vec<Vec<IpAddr>> = vec![Vec::new(); hosts.len()];
    let mut lookups = JoinSet::new();
    for (i, host) in hosts.iter().enumerate() {
        match host.parse::<IpAddr>() {
            Ok(ip) => addrs[i] = vec![ip.to_canonical()],
            Err(_) => {
                let (host, resolver) = (host.clone(), resolver.clone());
                lookups.spawn(async move { (i, resolver.lookup(&host).await) });
            }
        }
    }
    while let Some(done) = lookups.join_next().await {
        if let Ok((i, found)) = done
            && let Some(slot) = addrs.get_mut(i)
        {
            *slot = found;
        }
    }
    addrs
}
