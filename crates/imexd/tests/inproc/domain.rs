//! A domain of in-process daemons: each on its own address of one [`MemNet`], started with
//! [`openimex_imexd::run`] and the `nogpu` driver, stopped by its shutdown future, re-read by
//! its reload channel (SIGUSR1), and asked through its command service as `ctl` asks.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use openimex_core::{Backoff, InstanceId, NodeId, QuorumPolicy};
use openimex_imexd::net::{MemConn, MemNet};
use openimex_imexd::settings::DEFAULT_IMPORT_TIMEOUT;
use openimex_imexd::{DaemonError, Entropy, Notifier, Settings, World};
use openimex_proto::cmd::command_client::CommandClient;
use openimex_proto::cmd::{DomainReply, DomainRequest};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Slack on an instant: the work the daemons do at it (no time passes while they do).
pub(crate) const AT_ONCE: Duration = Duration::from_millis(50);

/// Every daemon's peer port.
pub(crate) const PEER_PORT: u16 = 50000;
/// Every daemon's command port.
pub(crate) const CMD_PORT: u16 = 50005;
/// Heartbeats and the peer timeout of the in-process daemons (the harness's defaults). The
/// peer timeout is each dial's timeout too (`Settings::dial_timeout`).
const HEARTBEAT: Duration = Duration::from_millis(500);
pub(crate) const PEER_TIMEOUT: Duration = Duration::from_secs(3);

/// Node `i`'s address: 10.0.0.(i+1).
pub(crate) fn ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(
        10,
        0,
        0,
        u8::try_from(i + 1).expect("few nodes"),
    ))
}

/// The address tests and `ctl` connect from.
pub(crate) fn client_ip() -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 1, 1))
}

/// One running daemon.
pub(crate) struct Daemon {
    /// Its node ID.
    pub(crate) id: usize,
    /// Its address.
    pub(crate) ip: IpAddr,
    stop: Option<oneshot::Sender<()>>,
    reload: mpsc::Sender<()>,
    task: Option<JoinHandle<Result<(), DaemonError>>>,
}

/// What a daemon needs besides its world: the domain's entries and the nodes file.
pub(crate) struct Options {
    /// The nodes file's entries, in node-ID order.
    pub(crate) hosts: Vec<String>,
    /// The nodes file SIGUSR1 re-reads (`None`: nothing to re-read).
    pub(crate) nodes_file: Option<PathBuf>,
    /// The reconnect backoff.
    pub(crate) backoff: Backoff,
    /// Each daemon's `OPENIMEX_JOBS_DIR` is `node-<id>` under this (`None`: no jobs dir).
    pub(crate) jobs_dir: Option<PathBuf>,
}

impl Options {
    /// `nodes` nodes at [`ip`]`(0..nodes)`, the harness's backoff, no nodes file.
    pub(crate) fn nodes(nodes: usize) -> Self {
        Self {
            hosts: (0..nodes).map(|i| ip(i).to_string()).collect(),
            nodes_file: None,
            jobs_dir: None,
            backoff: Backoff {
                min: Duration::from_millis(250),
                max: Duration::from_secs(5),
            },
        }
    }
}

impl Options {
    /// Writes the entries to a nodes file of this test's own (in a scratch directory named
    /// after `test`: tests run at once in one process) for SIGUSR1 to re-read; the directory,
    /// to remove at the end.
    pub(crate) fn write_nodes_file(&mut self, test: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("openimex-inproc-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let file = dir.join("nodes_config.cfg");
        std::fs::write(&file, self.hosts.join("\n") + "\n").expect("write the nodes file");
        self.nodes_file = Some(file);
        dir
    }

    /// `nodes` nodes listed by name (`node-I`), each name resolving on `net` to [`ip`]`(I)`.
    pub(crate) fn named(nodes: usize, net: &MemNet) -> Self {
        let mut options = Self::nodes(nodes);
        for (i, host) in options.hosts.iter_mut().enumerate() {
            *host = format!("node-{i}");
            net.set_name(host, &[ip(i)]);
        }
        options
    }
}

fn settings(local: usize, options: &Options) -> Settings {
    Settings {
        local: NodeId(u16::try_from(local).expect("few nodes")),
        hosts: options.hosts.clone(),
        server_port: PEER_PORT,
        domain_id: None,
        quorum: QuorumPolicy::None,
        heartbeat_interval: HEARTBEAT,
        peer_timeout: PEER_TIMEOUT,
        backoff: options.backoff,
        host_name: format!("inproc-{local}"),
        cmd_unix_path: None,
        import_timeout: DEFAULT_IMPORT_TIMEOUT,
        peer_any_source: false,
        grace: None,
        persist_path: None,
        nodes_file: options.nodes_file.clone(),
        jobs_dir: options
            .jobs_dir
            .as_ref()
            .map(|d| d.join(format!("node-{local}"))),
        // With jobs, each node's channels in a directory of its own beside its job files.
        channels: (options.jobs_dir.as_ref()).map(|d| openimex_driver::channels::ChannelDir {
            dir: d.join(format!("channels-{local}")),
            major: None,
        }),
        network_interface: None,
        link_scope: 0,
        conn_wait_timeout: None,
        tls: None,
        config_dump: Default::default(),
    }
}

thread_local! {
    /// The log lines of the daemons that run on this thread (a test's runtime is its thread).
    static LOG: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Where the daemons' log lines go: the test's output (shown when it fails) and [`LOG`].
struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = String::from_utf8_lossy(buf);
        print!("{line}");
        LOG.with(|log| log.borrow_mut().push_str(&line));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether a daemon of this test logged a line containing `text`.
pub(crate) fn logged(text: &str) -> bool {
    LOG.with(|log| log.borrow().contains(text))
}

/// Starts node `id` at `at` on `net`, with the `nogpu` driver.
pub(crate) fn start(net: &MemNet, id: usize, at: IpAddr, options: &Options) -> Daemon {
    start_with(
        net,
        id,
        at,
        options,
        Box::new(openimex_driver::NoGpu::default()),
    )
}

/// Starts node `id` at `at` on `net`, with `driver`.
pub(crate) fn start_with(
    net: &MemNet,
    id: usize,
    at: IpAddr,
    options: &Options,
    driver: Box<dyn openimex_driver::Driver>,
) -> Daemon {
    start_bound(id, bind(net, at), options, driver)
}

/// The listeners of a daemon at `at` on `net`, bound: connections to them wait, as in a
/// listener's backlog, until a daemon runs on them ([`start_bound`]).
pub(crate) fn bind(net: &MemNet, at: IpAddr) -> World {
    World::in_memory(
        net,
        SocketAddr::new(at, PEER_PORT),
        SocketAddr::new(at, CMD_PORT),
    )
    .expect("free addresses on the in-process network")
}

/// Starts node `id` on listeners already bound (`world`, from [`bind`]), with `driver`.
pub(crate) fn start_bound(
    id: usize,
    world: World,
    options: &Options,
    driver: Box<dyn openimex_driver::Driver>,
) -> Daemon {
    let _ = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
    let at = world.peer.local_addr().expect("a bound listener").ip();
    let (stop, stopped) = oneshot::channel::<()>();
    let (reload, reloads) = mpsc::channel(1);
    // Every start is a new instance, as a restarted daemon's is (its peers tell a restart
    // by it): numbered, so a run is the same every time.
    static STARTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let start = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let entropy = Entropy {
        instance: InstanceId(1000 + start),
        seed: start,
    };
    let task = tokio::spawn(openimex_imexd::run(
        settings(id, options),
        world,
        driver,
        entropy,
        async move {
            let _ = stopped.await;
        },
        reloads,
        Notifier::disabled(),
    ));
    Daemon {
        id,
        ip: at,
        stop: Some(stop),
        reload,
        task: Some(task),
    }
}

impl Daemon {
    /// Asks it to stop (SIGTERM) and waits for its `run` to return; how long that took.
    pub(crate) async fn stop(&mut self) -> Duration {
        let t0 = Instant::now();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let ended = task.await.expect("the daemon's task");
            ended.unwrap_or_else(|e| panic!("node {} stopped with an error: {e}", self.id));
        }
        t0.elapsed()
    }

    /// SIGUSR1: re-read the nodes file.
    pub(crate) fn reload(&self) {
        let _ = self.reload.try_send(());
    }

    /// `ctl -N -j`'s answer of this daemon.
    pub(crate) async fn domain(&self, net: &MemNet) -> DomainReply {
        self.ask(net, false).await
    }

    /// `ctl -N -j --fabric`'s answer: the domain with each node's GPUs.
    pub(crate) async fn fabric(&self, net: &MemNet) -> DomainReply {
        self.ask(net, true).await
    }

    /// `ctl jobs -j`'s answer of this daemon.
    pub(crate) async fn jobs(&self, net: &MemNet) -> openimex_proto::cmd::JobsReply {
        let channel = net
            .channel(client_ip(), SocketAddr::new(self.ip, CMD_PORT))
            .await
            .expect("the command service answers");
        CommandClient::new(channel)
            .jobs(openimex_proto::cmd::JobsRequest {})
            .await
            .expect("a jobs reply")
            .into_inner()
    }

    async fn ask(&self, net: &MemNet, fabric: bool) -> DomainReply {
        let channel = net
            .channel(client_ip(), SocketAddr::new(self.ip, CMD_PORT))
            .await
            .expect("the command service answers");
        CommandClient::new(channel)
            .domain(DomainRequest {
                reasons: true,
                fabric,
            })
            .await
            .expect("a domain reply")
            .into_inner()
    }

    /// Waits (in virtual time, polling every 10 ms) until `ok` holds for its domain reply,
    /// at most `limit`; the reply.
    pub(crate) async fn wait_domain(
        &self,
        net: &MemNet,
        limit: Duration,
        what: &str,
        ok: impl Fn(&DomainReply) -> bool,
    ) -> DomainReply {
        let deadline = Instant::now() + limit;
        loop {
            let reply = self.domain(net).await;
            if ok(&reply) {
                return reply;
            }
            assert!(
                Instant::now() < deadline,
                "node {}: {what} not within {limit:?}: {reply:?}",
                self.id
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Whether every node of the reply is READY and the domain UP.
pub(crate) fn up(reply: &DomainReply) -> bool {
    reply.status == "UP" && reply.nodes.iter().all(|n| n.state == "READY")
}

/// The link state node `from` reports towards node `to` in `reply` (`CONNECTED`, …).
pub(crate) fn link(reply: &DomainReply, from: usize, to: usize) -> String {
    reply
        .nodes
        .iter()
        .find(|n| n.node_id as usize == from)
        .and_then(|n| n.connections.iter().find(|c| c.node_id as usize == to))
        .map(|c| c.status.clone())
        .unwrap_or_default()
}

/// One daemon per driver (node `i` runs `drivers[i]`), started together on `net`, and UP.
pub(crate) async fn formed_with(
    net: &MemNet,
    drivers: Vec<Box<dyn openimex_driver::Driver>>,
) -> Vec<Daemon> {
    let options = Options::nodes(drivers.len());
    let daemons: Vec<Daemon> = (drivers.into_iter().enumerate())
        .map(|(i, driver)| start_with(net, i, ip(i), &options, driver))
        .collect();
    daemons[0]
        .wait_domain(net, Duration::from_secs(10), "domain UP", up)
        .await;
    daemons
}

/// The connections node `from` dialled to node `to`'s peer port that are open, oldest first.
pub(crate) fn dialled(net: &MemNet, from: usize, to: usize) -> Vec<MemConn> {
    let listener = SocketAddr::new(ip(to), PEER_PORT);
    (net.connections(ip(from), ip(to)).into_iter())
        .filter(|c| c.dialler.ip() == ip(from) && c.listener == listener)
        .collect()
}

/// The one connection of `conns`.
pub(crate) fn only(conns: Vec<MemConn>) -> MemConn {
    assert_eq!(conns.len(), 1, "one connection: {conns:?}");
    conns[0]
}

/// Whether `conn` is still open (neither end closed it).
pub(crate) fn open(net: &MemNet, conn: MemConn) -> bool {
    (net.connections(conn.dialler.ip(), conn.listener.ip())).contains(&conn)
}

/// Waits (1 ms steps of virtual time) until `ok`, at most `limit`; how long it took.
pub(crate) async fn within(limit: Duration, what: &str, ok: impl Fn() -> bool) -> Duration {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() <= limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    t0.elapsed()
}
