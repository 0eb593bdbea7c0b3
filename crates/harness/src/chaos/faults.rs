//! The faults: what each kind does, as a plan of timed actions drawn from the seeded RNG, and
//! what is recorded about each one injected.

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;

/// A kind of fault. Each is injected into a running workload; the node or app it hits is
/// drawn from the ones that play the role its name says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// kill -9 an exporting application (`app churn`); it is started again, as a job would be.
    KillExporterApp,
    /// kill -9 an importing application (`app reader`); started again.
    KillImporterApp,
    /// kill -9 the daemon of a node that exports; the operator restarts it after a pause.
    KillExporterDaemon,
    /// kill -9 the daemon of a node that imports; restarted after a pause.
    KillImporterDaemon,
    /// kill -9 the simulated GPU driver of a node that exports. Its daemon exits (lost the
    /// driver) and the node's applications go with it (a job does not outlive its GPU driver);
    /// the operator starts driver and daemon again.
    KillExporterDriver,
    /// SIGSTOP a daemon (it accepts connections and answers nothing) for less than the peer
    /// timeout plus the grace time, then SIGCONT.
    HangBelowGrace,
    /// SIGSTOP a daemon past the peer timeout plus the grace time (its peers clean up), then
    /// SIGCONT (the same instance comes back). Its applications keep running meanwhile and
    /// nothing can disable them while their daemon is frozen, so stale reads are expected: a
    /// grace time declares a peer silent that long dead (docs/operator/daemon.md, "Peer loss and recovery").
    HangPastGrace,
    /// A flapping node: its daemon killed and restarted 3 to 5 times in quick succession.
    Flap,
    /// kill -9 a node's daemon and restart it at once (for long kill/restart series).
    RestartNode,
    /// Cut a node off from every peer (TCP proxies stop forwarding, connections stay open)
    /// for less than the peer timeout plus the grace time, then heal. Needs
    /// [`crate::chaos::ChaosSpec::partitions`].
    PartitionBelowGrace,
    /// The same, healed after the peer timeout plus the grace time (both sides clean up).
    PartitionPastGrace,
    /// The same cut, healed once both sides have fenced (disabled their importers of each
    /// other's memory) but inside the fence margin that follows (peer timeout + two
    /// heartbeats), before either side's release step: that step must release only the
    /// references of imports made before the fence, never those of the imports the workload
    /// makes after the heal (issue 28).
    PartitionHealInMargin,
}

impl FaultKind {
    /// Every kind, in the order of the list.
    pub const ALL: [FaultKind; 12] = [
        FaultKind::KillExporterApp,
        FaultKind::KillImporterApp,
        FaultKind::KillExporterDaemon,
        FaultKind::KillImporterDaemon,
        FaultKind::KillExporterDriver,
        FaultKind::HangBelowGrace,
        FaultKind::HangPastGrace,
        FaultKind::Flap,
        FaultKind::RestartNode,
        FaultKind::PartitionBelowGrace,
        FaultKind::PartitionPastGrace,
        FaultKind::PartitionHealInMargin,
    ];

    /// Whether the kind needs the partition proxies ([`crate::chaos::ChaosSpec::partitions`]).
    pub fn needs_proxies(self) -> bool {
        matches!(
            self,
            FaultKind::PartitionBelowGrace
                | FaultKind::PartitionPastGrace
                | FaultKind::PartitionHealInMargin
        )
    }

    /// The kinds `openimex-lab demo --chaos` draws by default: the kills and restarts of apps,
    /// daemons and drivers (issue 7 item 8). The hangs and partitions are left to `--faults`;
    /// a hang past the grace time breaks the grace time's premise ([`FaultKind::HangPastGrace`]).
    pub const KILLS: [FaultKind; 7] = [
        FaultKind::KillExporterApp,
        FaultKind::KillImporterApp,
        FaultKind::KillExporterDaemon,
        FaultKind::KillImporterDaemon,
        FaultKind::KillExporterDriver,
        FaultKind::Flap,
        FaultKind::RestartNode,
    ];

    /// The kind named `name` (as [`FaultKind::name`] prints it).
    pub fn from_name(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Short name (JSON, tables).
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillExporterApp => "kill-exporter-app",
            FaultKind::KillImporterApp => "kill-importer-app",
            FaultKind::KillExporterDaemon => "kill-exporter-daemon",
            FaultKind::KillImporterDaemon => "kill-importer-daemon",
            FaultKind::KillExporterDriver => "kill-exporter-driver",
            FaultKind::HangBelowGrace => "hang-below-grace",
            FaultKind::HangPastGrace => "hang-past-grace",
            FaultKind::Flap => "flap",
            FaultKind::RestartNode => "restart-node",
            FaultKind::PartitionBelowGrace => "partition-below-grace",
            FaultKind::PartitionPastGrace => "partition-past-grace",
            FaultKind::PartitionHealInMargin => "partition-heal-in-margin",
        }
    }
}

/// One step of a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// SIGKILL workload app `i` (it is respawned by the supervisor).
    KillApp(usize),
    /// SIGKILL node `n`'s daemon.
    Kill9(usize),
    /// Start node `n`'s driver (if down) and daemon (waiting for a daemon that is exiting).
    Start(usize),
    /// SIGKILL node `n`'s driver and the node's apps.
    KillDriver(usize),
    /// SIGSTOP node `n`'s daemon.
    Stop(usize),
    /// SIGCONT node `n`'s daemon.
    Cont(usize),
    /// Cut node `n` off from every peer.
    Cut(usize),
    /// Heal node `n`'s links.
    Heal(usize),
}

/// A fault to inject: its steps, at offsets from the injection.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) node: usize,
    /// What was hit, for the report (`daemon`, `driver`, an app name …).
    pub(crate) target: String,
    pub(crate) steps: Vec<(Duration, Action)>,
}

/// What can be hit.
pub(crate) struct Targets<'a> {
    /// (app index, node, name) of exporting apps.
    pub(crate) exporter_apps: &'a [(usize, usize, String)],
    /// (app index, node, name) of reading apps.
    pub(crate) reader_apps: &'a [(usize, usize, String)],
    pub(crate) exporter_nodes: &'a [usize],
    pub(crate) reader_nodes: &'a [usize],
    pub(crate) nodes: usize,
    /// Peer timeout + grace time: how long a hang must last for peers to clean up.
    pub(crate) cleanup_after: Duration,
    /// The daemons' heartbeat interval and peer timeout (the fence margin is the peer timeout
    /// plus two intervals).
    pub(crate) heartbeat: Duration,
    pub(crate) peer_timeout: Duration,
}

fn ms(rng: &mut StdRng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.random_range(lo..=hi))
}

/// Draws a fault of `kind`. `None` when nothing plays the role (e.g. no reader).
pub(crate) fn plan(kind: FaultKind, rng: &mut StdRng, t: &Targets<'_>) -> Option<Plan> {
    let all: Vec<usize> = (0..t.nodes).collect();
    let app = |rng: &mut StdRng, apps: &[(usize, usize, String)]| {
        let (i, n, name) = apps.choose(rng)?.clone();
        Some(Plan {
            node: n,
            target: name,
            steps: vec![(Duration::ZERO, Action::KillApp(i))],
        })
    };
    let node = |rng: &mut StdRng, nodes: &[usize]| nodes.choose(rng).copied();
    let zero = Duration::ZERO;
    let (n, target, steps) = match kind {
        FaultKind::KillExporterApp => return app(rng, t.exporter_apps),
        FaultKind::KillImporterApp => return app(rng, t.reader_apps),
        FaultKind::KillExporterDaemon | FaultKind::KillImporterDaemon => {
            let nodes = if kind == FaultKind::KillExporterDaemon {
                t.exporter_nodes
            } else {
                t.reader_nodes
            };
            let n = node(rng, nodes)?;
            let down = ms(rng, 300, 2000);
            (
                n,
                "daemon",
                vec![(zero, Action::Kill9(n)), (down, Action::Start(n))],
            )
        }
        FaultKind::KillExporterDriver => {
            let n = node(rng, t.exporter_nodes)?;
            let down = ms(rng, 500, 2000);
            (
                n,
                "driver",
                vec![(zero, Action::KillDriver(n)), (down, Action::Start(n))],
            )
        }
        FaultKind::HangBelowGrace
        | FaultKind::HangPastGrace
        | FaultKind::PartitionBelowGrace
        | FaultKind::PartitionPastGrace => {
            let n = node(rng, &all)?;
            let base = t.cleanup_after.as_millis() as u64;
            let below = matches!(
                kind,
                FaultKind::HangBelowGrace | FaultKind::PartitionBelowGrace
            );
            let lasts = if below {
                ms(rng, base / 3, base * 2 / 3)
            } else {
                ms(rng, base + 1500, base + 3000)
            };
            let (what, start, end) = match kind {
                FaultKind::HangBelowGrace | FaultKind::HangPastGrace => {
                    ("daemon", Action::Stop(n), Action::Cont(n))
                }
                _ => ("links", Action::Cut(n), Action::Heal(n)),
            };
            (n, what, vec![(zero, start), (lasts, end)])
        }
        FaultKind::PartitionHealInMargin => {
            let n = node(rng, &all)?;
            let (lo, hi) = heal_in_margin(t);
            let lasts = ms(rng, lo, hi);
            (
                n,
                "links",
                vec![(zero, Action::Cut(n)), (lasts, Action::Heal(n))],
            )
        }
        FaultKind::Flap => {
            let n = node(rng, &all)?;
            let mut at = zero;
            let mut steps = Vec::new();
            for _ in 0..rng.random_range(3..=5) {
                steps.push((at, Action::Kill9(n)));
                at += ms(rng, 200, 600);
                steps.push((at, Action::Start(n)));
                at += ms(rng, 300, 900);
            }
            (n, "daemon", steps)
        }
        FaultKind::RestartNode => {
            let n = node(rng, &all)?;
            (
                n,
                "daemon",
                vec![(zero, Action::Kill9(n)), (zero, Action::Start(n))],
            )
        }
    };
    Some(Plan {
        node: n,
        target: target.to_owned(),
        steps,
    })
}

/// The bounds, in ms from the cut, of a [`FaultKind::PartitionHealInMargin`] heal. Each side
/// sees the loss between a peer timeout and a peer timeout plus one heartbeat after its last
/// sign of life, which the cut finds at most two heartbeats old (openimex-core's
/// `mesh::liveness` and `node::grace`): each fences between `cleanup_after` - 2 heartbeats and
/// `cleanup_after` + 1 heartbeat after the cut, and releases a fence margin (peer timeout + 2
/// heartbeats) after its fence, so at the earliest `cleanup_after` + peer timeout after the
/// cut. The heal comes in the first half of the window between the last fence (with a
/// heartbeat to spare) and that earliest release, which leaves the other half for the links
/// to be CONNECTED again (with the chaos timings, 300 ms and 2 s: 600 to 1300 ms after
/// `cleanup_after`).
fn heal_in_margin(t: &Targets<'_>) -> (u64, u64) {
    let ms = |d: Duration| d.as_millis() as u64;
    let lo = ms(t.cleanup_after) + 2 * ms(t.heartbeat);
    let hi = lo + ms(t.peer_timeout).saturating_sub(2 * ms(t.heartbeat)) / 2;
    (lo, hi)
}

/// How a fault ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The domain was UP again and every importer read fresh data from every exporter.
    Recovered,
    /// The next fault came first (fixed-rate pacing); the end of the run checks recovery.
    Overlapped,
    /// Not recovered within the bound.
    NotRecovered,
}

impl Outcome {
    /// Word for tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Recovered => "recovered",
            Outcome::Overlapped => "overlapped",
            Outcome::NotRecovered => "NOT RECOVERED",
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    /// What was done.
    pub kind: FaultKind,
    /// The node hit.
    pub node: usize,
    /// `daemon`, `driver` or the app's name.
    pub target: String,
    /// Injected at, from the start of the workload.
    pub at: Duration,
    /// From the injection to the last repair step (restart, SIGCONT); 0 for an app kill.
    pub down: Duration,
    /// How it ended (`None` while still in progress).
    pub outcome: Option<Outcome>,
    /// From the last repair step to recovered.
    pub recover: Option<Duration>,
    /// Apps revoked (killed by their driver) while it lasted.
    pub revoked: u64,
    /// Imports that failed while it lasted (the documented errors, expected).
    pub import_failures: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// (node, GPU, name) of each app.
    type Apps = Vec<(usize, usize, String)>;

    fn targets() -> (Apps, Apps) {
        (
            vec![(0, 0, "n0g0".into())],
            vec![(1, 1, "n1g0".into()), (2, 2, "n2g0".into())],
        )
    }

    #[test]
    fn plans_are_seeded_and_hit_the_named_role() {
        let (e, r) = targets();
        let t = Targets {
            exporter_apps: &e,
            reader_apps: &r,
            exporter_nodes: &[0],
            reader_nodes: &[1, 2],
            nodes: 3,
            cleanup_after: Duration::from_secs(4),
            heartbeat: Duration::from_millis(300),
            peer_timeout: Duration::from_secs(2),
        };
        for kind in FaultKind::ALL {
            let a = plan(kind, &mut StdRng::seed_from_u64(7), &t).expect("a plan");
            let b = plan(kind, &mut StdRng::seed_from_u64(7), &t).expect("a plan");
            assert_eq!(a.steps, b.steps, "{kind:?} is reproducible from the seed");
            match kind {
                FaultKind::KillExporterApp
                | FaultKind::KillExporterDaemon
                | FaultKind::KillExporterDriver => assert_eq!(a.node, 0, "{kind:?}"),
                FaultKind::KillImporterApp | FaultKind::KillImporterDaemon => {
                    assert!(a.node > 0, "{kind:?}")
                }
                _ => {}
            }
        }
        let past =
            plan(FaultKind::HangPastGrace, &mut StdRng::seed_from_u64(1), &t).expect("a plan");
        assert!(past.steps[1].0 > Duration::from_secs(4));
        let below =
            plan(FaultKind::HangBelowGrace, &mut StdRng::seed_from_u64(1), &t).expect("a plan");
        assert!(below.steps[1].0 < Duration::from_secs(4));
        // Healed after both sides fenced (4 s + one heartbeat at the latest), before the
        // earliest release (4 s + the peer timeout).
        for seed in 0..50 {
            let p = plan(
                FaultKind::PartitionHealInMargin,
                &mut StdRng::seed_from_u64(seed),
                &t,
            )
            .expect("a plan");
            assert_eq!(p.target, "links");
            assert_eq!(p.steps[0], (Duration::ZERO, Action::Cut(p.node)));
            let (heal, action) = p.steps[1];
            assert_eq!(action, Action::Heal(p.node));
            assert!(
                heal >= Duration::from_millis(4600) && heal <= Duration::from_millis(5300),
                "{heal:?}"
            );
        }
    }
}
