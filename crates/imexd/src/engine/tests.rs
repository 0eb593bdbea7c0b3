//! The engine loop in paused tokio time, with a recording driver: the loop performs the node's
//! actions and posts their results back, the session open stays off the runtime, a lost driver stops
//! the daemon, and shutdown finishes queued driver calls before it returns.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use openimex_core::{
    Backoff, DaemonState, Event, InstanceId, MeshConfig, Node, NodeConfig, NodeId, NodeMap, Pages,
    QuorumPolicy, Status,
};
use openimex_driver::{Driver, DriverError, SessionInfo};
use tokio::sync::{mpsc, oneshot, watch};

use super::Engine;
use crate::error::DaemonError;
use crate::mailbox::{Input, Snapshot};
use crate::settings::{DEFAULT_IMPORT_TIMEOUT, Settings};

/// What the recording driver saw, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    OpenSession(NodeId),
    /// open_session returned (after its gate opened).
    SessionReturned,
    Validate(u64, Result<(), Status>),
    Finish(Vec<u64>),
    Disable(NodeId),
    Release(u64),
}

#[derive(Default)]
struct Shared {
    seen: Vec<Seen>,
    events: VecDeque<Event>,
    /// `Some(false)`: open_session blocks until the test sets it to `Some(true)`.
    gate: Option<bool>,
    /// The next call of this name fails with `Lost`.
    lose: Option<&'static str>,
    /// finish_unimport takes this long (real time).
    finish_delay: Duration,
}

#[derive(Clone, Default)]
struct Recorder(Arc<(Mutex<Shared>, Condvar)>);

impl Recorder {
    fn with<T>(&self, f: impl FnOnce(&mut Shared) -> T) -> T {
        let (m, cv) = &*self.0;
        let out = f(&mut m.lock().unwrap());
        cv.notify_all();
        out
    }

    fn seen(&self) -> Vec<Seen> {
        self.with(|s| s.seen.clone())
    }

    fn push_event(&self, e: Event) {
        self.with(|s| s.events.push_back(e));
    }

    fn lost(&self, call: &'static str) -> Result<(), DriverError> {
        self.with(|s| {
            if s.lose == Some(call) {
                s.lose = None;
                Err(DriverError::Lost(format!("{call}: connection reset")))
            } else {
                Ok(())
            }
        })
    }
}

impl Driver for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }

    fn open_session(&self, node: NodeId) -> Result<SessionInfo, DriverError> {
        self.with(|s| s.seen.push(Seen::OpenSession(node)));
        let (m, cv) = &*self.0;
        let guard = m.lock().unwrap();
        let (mut guard, _) = cv
            .wait_timeout_while(guard, Duration::from_secs(10), |s| s.gate == Some(false))
            .unwrap();
        guard.seen.push(Seen::SessionReturned);
        drop(guard);
        self.lost("open_session")?;
        Ok(SessionInfo {
            version: "test-1".into(),
        })
    }

    fn next_events(&self, wait: Duration) -> Result<Vec<Event>, DriverError> {
        self.lost("next_events")?;
        let (m, cv) = &*self.0;
        let guard = m.lock().unwrap();
        let (mut guard, _) = cv
            .wait_timeout_while(guard, wait, |s| s.events.is_empty() && s.lose.is_none())
            .unwrap();
        let events = guard.events.drain(..).collect();
        drop(guard);
        self.lost("next_events")?;
        Ok(events)
    }

    fn describe_export(&self, _: [u8; 16], _: u16, _: u32) -> Result<(u64, Pages), DriverError> {
        Err(DriverError::Refused {
            call: "describe",
            status: Status::ObjectNotFound,
            detail: "no exports here".into(),
        })
    }

    fn release_export_ref(&self, export_ref: u64) -> Result<(), DriverError> {
        self.with(|s| s.seen.push(Seen::Release(export_ref)));
        Ok(())
    }

    fn validate_import(
        &self,
        event_id: u64,
        result: Result<Pages, Status>,
    ) -> Result<(), DriverError> {
        self.lost("validate_import")?;
        let r = result.map(drop);
        self.with(|s| s.seen.push(Seen::Validate(event_id, r)));
        Ok(())
    }

    fn finish_unimport(&self, ids: &[u64]) -> Result<(), DriverError> {
        let delay = self.with(|s| s.finish_delay);
        std::thread::sleep(delay);
        self.with(|s| s.seen.push(Seen::Finish(ids.to_vec())));
        Ok(())
    }

    fn disable_importers(&self, node: NodeId) -> Result<(), DriverError> {
        self.with(|s| s.seen.push(Seen::Disable(node)));
        Ok(())
    }
}

/// A port on loopback that refuses connections (bound, then closed).
fn refused_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Node 0 of a two-node domain whose peer never answers (its port refuses).
fn settings() -> Settings {
    Settings {
        local: NodeId(0),
        hosts: vec!["127.0.0.1".into(), "127.0.0.1".into()],
        server_port: refused_port(),
        domain_id: None,
        quorum: QuorumPolicy::None,
        heartbeat_interval: Duration::from_millis(500),
        peer_timeout: Duration::from_secs(3),
        backoff: Backoff {
            min: Duration::from_millis(250),
            max: Duration::from_secs(5),
        },
        host_name: "test".into(),
        cmd_unix_path: None,
        import_timeout: DEFAULT_IMPORT_TIMEOUT,
        peer_any_source: false,
        grace: None,
        persist_path: None,
        jobs_dir: None,
        channels: None,
        nodes_file: None,
        network_interface: None,
        link_scope: 0,
        conn_wait_timeout: None,
        tls: None,
        config_dump: Default::default(),
    }
}

struct Running {
    tx: mpsc::Sender<Input>,
    state: watch::Receiver<DaemonState>,
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<Result<(), DaemonError>>,
}

fn start(driver: Recorder) -> Running {
    let settings = settings();
    #[allow(clippy::disallowed_methods)]
    let now = tokio::time::Instant::now().into_std();
    let map = NodeMap::new(settings.hosts.clone());
    let node = Node::new(
        NodeConfig {
            mesh: MeshConfig {
                local: settings.local,
                domain_id: map.derived_domain_id(),
                map,
                instance: InstanceId(7),
                protocol_version: 1,
                quorum: settings.quorum,
                heartbeat_interval: settings.heartbeat_interval,
                peer_timeout: settings.peer_timeout,
                dial_timeout: settings.dial_timeout(),
                backoff: settings.backoff,
                seed: 7,
            },
            import_timeout: settings.import_timeout,
            max_describes_per_peer: openimex_core::node::DEFAULT_MAX_DESCRIBES_PER_PEER,
            grace: None,
            recover_from: Vec::new(),
            recovery_wait: openimex_core::node::DEFAULT_RECOVERY_WAIT,
            conn_wait_timeout: None,
        },
        now,
    );
    let (tx, rx) = mpsc::channel(64);
    let (state_tx, state) = watch::channel(DaemonState::Initializing);
    let engine = Engine::new(node, settings, Box::new(driver), tx.clone(), state_tx).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(engine.run(rx, async move {
        let _ = stopped.await;
    }));
    Running {
        tx,
        state,
        stop: Some(stop),
        done,
    }
}

/// [`start`], waited for until READY.
async fn ready(d: &Recorder) -> Running {
    let mut r = start(d.clone());
    wait_state(&mut r, DaemonState::Ready).await;
    r
}

/// Stops the engine and checks it returned cleanly.
async fn stop(mut r: Running) {
    r.stop.take().unwrap().send(()).unwrap();
    engine_result(r.done).await.unwrap();
}

async fn snapshot(tx: &mpsc::Sender<Input>) -> Snapshot {
    crate::mailbox::ask(tx, |reply| Input::Snapshot { reply })
        .await
        .unwrap()
}

async fn wait_state(r: &mut Running, want: DaemonState) {
    r.state.wait_for(|s| *s == want).await.unwrap();
}

/// Waits for the engine to return, bounded in real time (the driver threads are real threads,
/// so a virtual-time timeout would fire while they work).
async fn engine_result(
    done: tokio::task::JoinHandle<Result<(), DaemonError>>,
) -> Result<(), DaemonError> {
    for _ in 0..2000 {
        if done.is_finished() {
            return done.await.unwrap();
        }
        tokio::task::yield_now().await;
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the engine did not stop within 10 s");
}

/// Waits (in real time: driver threads are real threads) until the recorder has seen `pred`.
async fn wait_seen(d: &Recorder, pred: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
    for _ in 0..1000 {
        let seen = d.seen();
        if pred(&seen) {
            return seen;
        }
        tokio::task::yield_now().await;
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!(
        "the driver never saw what was expected; it saw {:?}",
        d.seen()
    );
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn driver_session_opens_off_the_runtime() {
    let d = Recorder::default();
    d.with(|s| s.gate = Some(false));
    let mut r = start(d.clone());
    wait_seen(&d, |s| s.contains(&Seen::OpenSession(NodeId(0)))).await;
    // open_session is blocked in the driver; the loop (on this one runtime thread) still
    // answers.
    let snap = snapshot(&r.tx).await;
    assert_eq!(snap.state, DaemonState::InitGpu);
    assert!(!d.seen().contains(&Seen::SessionReturned));
    d.with(|s| s.gate = Some(true));
    wait_state(&mut r, DaemonState::Ready).await;
    assert_eq!(snapshot(&r.tx).await.driver_version, "test-1");
    stop(r).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_loop_performs_the_nodes_actions_and_posts_their_results() {
    let d = Recorder::default();
    let r = ready(&d).await;
    // Node 1 is not connected: the node fails the import at once (INVALID_STATE), and the
    // worker performs that on the driver.
    d.push_event(Event::Import {
        event_id: 41,
        channel: 0,
        export_uuid: [1; 16],
        index: 0,
        export_node: NodeId(1),
    });
    // An unimport of an import the node never forwarded: nothing is held remotely, so it is
    // finished at once.
    d.push_event(Event::Unimport {
        unimport_event_id: 42,
        import_event_id: 40,
        export_node: NodeId(1),
    });
    let seen = wait_seen(&d, |s| s.contains(&Seen::Finish(vec![42]))).await;
    let validate = seen
        .iter()
        .position(|s| *s == Seen::Validate(41, Err(Status::InvalidState)))
        .expect("the import was failed");
    let finish = seen
        .iter()
        .position(|s| *s == Seen::Finish(vec![42]))
        .unwrap();
    assert!(validate < finish, "calls run in the order the node asked");
    // Meanwhile the mesh keeps dialling the absent peer with backoff (virtual time).
    tokio::time::sleep(Duration::from_secs(30)).await;
    let snap = snapshot(&r.tx).await;
    assert!(
        snap.links[1]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("cannot connect")),
        "{:?}",
        snap.links[1]
    );
    stop(r).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_lost_driver_stops_the_daemon_with_an_error() {
    for call in ["next_events", "validate_import"] {
        let d = Recorder::default();
        let mut r = start(d.clone());
        wait_state(&mut r, DaemonState::Ready).await;
        d.with(|s| s.lose = Some(call));
        d.push_event(Event::Import {
            event_id: 1,
            channel: 0,
            export_uuid: [1; 16],
            index: 0,
            export_node: NodeId(1),
        });
        let err = engine_result(r.done)
            .await
            .expect_err("the daemon stops with an error");
        let msg = err.to_string();
        assert!(
            matches!(err, DaemonError::DriverLost { .. }) && msg.contains("lost the GPU driver"),
            "{call}: {msg}"
        );
        assert!(msg.contains("restart the daemon"), "says what to do: {msg}");
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn shutdown_finishes_queued_driver_calls_before_returning() {
    let d = Recorder::default();
    let mut r = ready(&d).await;
    d.with(|s| s.finish_delay = Duration::from_millis(200));
    for id in [7, 8, 9] {
        d.push_event(Event::Unimport {
            unimport_event_id: id,
            import_event_id: 100 + id,
            export_node: NodeId(1),
        });
    }
    // The first acknowledgement is done, the other two are queued behind it in the driver
    // worker (each takes 200 ms) when the stop comes.
    wait_seen(&d, |s| s.contains(&Seen::Finish(vec![7]))).await;
    assert!(!d.seen().contains(&Seen::Finish(vec![9])));
    r.stop.take().unwrap().send(()).unwrap();
    engine_result(r.done).await.unwrap();
    assert_eq!(*r.state.borrow(), DaemonState::ShuttingDown);
    let finished: Vec<_> = d
        .seen()
        .into_iter()
        .filter(|s| matches!(s, Seen::Finish(_)))
        .collect();
    assert_eq!(
        finished,
        vec![
            Seen::Finish(vec![7]),
            Seen::Finish(vec![8]),
            Seen::Finish(vec![9])
        ],
        "every acknowledgement the node asked for reached the driver before run returned"
    );
}

/// Node 1's hello to the engine's node 0, from instance `instance`, of node map `hosts`, its
/// entries sent or left out (`entries`, as a dial's hello leaves them), and the engine's
/// answer (base: `settings()`'s two entries).
async fn hello_of(
    tx: &mpsc::Sender<Input>,
    instance: u64,
    hosts: Vec<String>,
    entries: bool,
) -> (openimex_core::Verdict, openimex_proto::peer::Identity) {
    let map = NodeMap::new(hosts.clone());
    let hello = openimex_core::Hello {
        domain_id: NodeMap::new(settings().hosts).derived_domain_id(),
        node: NodeId(1),
        instance: InstanceId(instance),
        digest: map.digest().to_string(),
        node_map: if entries {
            hosts.into()
        } else {
            Vec::new().into()
        },
        map_base_len: 2,
        protocol_version: 1,
    };
    crate::mailbox::ask(tx, |reply| Input::Hello {
        hello,
        cliques: (Vec::new(), 0),
        conn: 1000 + instance,
        from_node_address: true,
        reply,
    })
    .await
    .unwrap()
}

/// [`hello_of`] with the entries.
async fn hello_from_1(
    tx: &mpsc::Sender<Input>,
    instance: u64,
    hosts: Vec<String>,
) -> (openimex_core::Verdict, openimex_proto::peer::Identity) {
    hello_of(tx, instance, hosts, true).await
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hello_without_entries_is_judged_by_its_digest_or_asked_for_them() {
    use openimex_core::Verdict;
    let d = Recorder::default();
    let r = ready(&d).await;
    // Our digest: accepted on it, as a dial's hello is between daemons of one map.
    let (verdict, me) = hello_of(&r.tx, 5, settings().hosts, false).await;
    assert_eq!(verdict, Verdict::Accept);
    assert!(me.node_map.is_empty(), "same digest: no entries answered");
    // Another digest (a map grown by SIGUSR1, compatible with ours): its entries decide, so
    // they are asked for, and nothing is counted meanwhile...
    let mut grown = settings().hosts;
    grown.push("127.0.0.9".into());
    let (verdict, _) = hello_of(&r.tx, 6, grown.clone(), false).await;
    assert_eq!(verdict, Verdict::MapNeeded);
    let snapshot = snapshot(&r.tx).await;
    assert!(
        snapshot.refusals.is_empty(),
        "asking for entries is no refusal: {:?}",
        snapshot.refusals
    );
    // ...and the same hello with them is accepted.
    let (verdict, _) = hello_from_1(&r.tx, 6, grown).await;
    assert_eq!(verdict, Verdict::Accept);
    stop(r).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hello_answer_carries_the_node_map_only_to_a_peer_whose_map_differs() {
    let d = Recorder::default();
    let r = ready(&d).await;
    let same = settings().hosts;
    let (verdict, me) = hello_from_1(&r.tx, 5, same).await;
    assert_eq!(verdict, openimex_core::Verdict::Accept);
    assert_eq!(me.node_map_digest, NodeMap::new(settings().hosts).digest());
    assert!(me.node_map.is_empty(), "same digest: no entries sent");
    // A peer whose map SIGUSR1 grew: accepted (its first two entries are ours), and it gets
    // our entries, which it needs to accept us in turn.
    let mut grown = settings().hosts;
    grown.push("127.0.0.9".into());
    let (verdict, me) = hello_from_1(&r.tx, 5, grown).await;
    assert_eq!(verdict, openimex_core::Verdict::Accept);
    assert_eq!(me.node_map, settings().hosts);
    stop(r).await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_restarted_peers_hello_is_answered_after_its_importers_are_disabled() {
    let d = Recorder::default();
    let r = ready(&d).await;
    let _ = hello_from_1(&r.tx, 5, settings().hosts).await;
    assert!(!d.seen().contains(&Seen::Disable(NodeId(1))));
    // A new instance: its old instance's memory is disabled here before the answer goes, so a
    // recovering peer that has our answer knows nothing of its old self is mapped here.
    let (verdict, _) = hello_from_1(&r.tx, 6, settings().hosts).await;
    assert_eq!(verdict, openimex_core::Verdict::Accept);
    assert!(
        d.seen().contains(&Seen::Disable(NodeId(1))),
        "answered before the driver disabled node 1's importers: {:?}",
        d.seen()
    );
    stop(r).await;
}

/// A job file of node 0 and node 1 (the two nodes of [`settings`]).
fn job_file(name: &str, channel: u32) -> openimex_config::jobfile::JobFile {
    openimex_config::jobfile::JobFile {
        path: format!("/jobs/{name}.job").into(),
        name: name.to_string(),
        channel,
        members: [0, 1].into_iter().collect(),
        owner: None,
    }
}

/// What `ctl jobs create` waits for after writing a job file ([`crate::mailbox::JobWant::Read`]):
/// answered by the read of the directory that takes the file, the job held or its
/// definition refused, however late that read comes or if it came before the wait; a read
/// without the file answers nothing, and a refusal of another definition under that name does
/// not answer.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_create_is_answered_by_the_read_that_takes_its_file_and_by_nothing_else() {
    use crate::mailbox::{JobFiles, JobWant};
    let d = Recorder::default();
    let r = ready(&d).await;
    let read = |jobs| {
        Input::JobFiles(JobFiles {
            jobs,
            ..JobFiles::default()
        })
    };
    let wait = |name: &str, channel: u32| {
        let (reply, rx) = oneshot::channel();
        let input = Input::JobWait {
            name: name.to_string(),
            want: JobWant::Read(crate::jobs_dir::spec_of(&job_file(name, channel))),
            reply,
        };
        (input, rx)
    };

    // Job a holds channel 5; b's file, written later, asks for channel 5 too.
    let (ask_b, mut b) = wait("b", 5);
    r.tx.send(ask_b).await.unwrap();
    r.tx.send(read(vec![job_file("a", 5)])).await.unwrap();
    snapshot(&r.tx).await;
    assert!(
        b.try_recv().is_err(),
        "a read without b's file answers nothing"
    );
    r.tx.send(read(vec![job_file("a", 5), job_file("b", 5)]))
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(1), &mut b)
        .await
        .expect("answered by the read that took b's file")
        .unwrap();
    assert!(answer.is_none(), "b refused: another job holds channel 5");

    // The read came before the wait (they race: the watch reads the file as soon as it is
    // written): the refusal of that very definition answers.
    let (ask_b, b) = wait("b", 5);
    r.tx.send(ask_b).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(1), b)
        .await
        .expect("answered by the read that came first")
        .unwrap();
    assert!(answer.is_none(), "b refused");
    // Another definition under the name: the refusal of b on channel 5 says nothing of it.
    let (ask_b, mut b) = wait("b", 7);
    r.tx.send(ask_b).await.unwrap();
    snapshot(&r.tx).await;
    assert!(
        b.try_recv().is_err(),
        "only a read of that definition answers"
    );

    // c on a free channel: held.
    let (ask_c, c) = wait("c", 6);
    r.tx.send(ask_c).await.unwrap();
    r.tx.send(read(vec![job_file("a", 5), job_file("c", 6)]))
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(1), c)
        .await
        .expect("answered")
        .unwrap();
    assert_eq!(answer.map(|j| j.channel), Some(6));
    drop(b);
    stop(r).await;
}
