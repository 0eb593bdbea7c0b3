//! End-to-end tests of the `openimex` binary: real daemon processes on loopback addresses,
//! started and observed through the cluster harness (`crates/harness`). One test binary; each
//! module below is one area. Every wait is bounded, and a failing test prints every node's
//! log tail and keeps the cluster directory for inspection.

// shared by the fabric tests: GPU clusters, `openimex-lab app` processes, driver counters
#[path = "e2e/apps.rs"]
mod apps;
// issue 7: SIGTERM under live imports: references released after peers acknowledge
#[path = "e2e/clean_stop.rs"]
mod clean_stop;
// issue 7: kill -9 of apps, daemons and drivers, hung and flapping peers, partitions, 100
// restarts, under an import storm of real app processes; `demo --chaos --json`
#[path = "e2e/chaos.rs"]
mod chaos;
// issue 10: `channels create` (tight modes, devices of the driver's major); the GPU driver's
// world-writable channel warning
#[path = "e2e/channels.rs"]
mod channels;
// issue 10: the command service: root-only unix socket, TCP on the configured address only
#[path = "e2e/cmd_access.rs"]
mod cmd_access;
// ctl without a daemon, nvidia-imex / nvidia-imex-ctl links, DAEMONIZE=1
#[path = "e2e/cli.rs"]
mod cli;
// issue 32: names in usage and errors, help ctl, unknown arguments, wrapped help, man pages,
// the demo's refusals and picture, no warning for DRA's stock GSS keys
#[path = "e2e/cli_conventions.rs"]
mod cli_conventions;
// shared helpers: the binary under test, time limits, checks on failed commands
#[path = "e2e/common.rs"]
mod common;
// issue 13: bounds on peer connections, HTTP/2 streams, message sizes and peer strings
#[path = "e2e/bounds.rs"]
mod bounds;
// bad config files fail before binding, naming file:line and the fix
#[path = "e2e/config_errors.rs"]
mod config_errors;
// issue 14: `demo --topology`, topology file errors, `demo --partitions` across cliques
#[path = "e2e/demo_topology.rs"]
mod demo_topology;
// issue 31: `demo --jobs K`: jobs over overlapping trays, all-to-all within, refused across
#[path = "e2e/demo_jobs.rs"]
mod demo_jobs;
// issue 9: ctl domain-check HOST..., -N --svg FILE and -N --watch -j on a live domain
#[path = "e2e/domain_tools.rs"]
mod domain_tools;
// issue 14: cliques enforced (CLIQUE_ID_CHANGE, ctl --fabric, the map check) and GPU fabric
// health in ctl and the metrics
#[path = "e2e/cliques.rs"]
mod cliques;
// fabric memory across nodes: import refusals, lifetimes, shared descriptors, demo JSON
#[path = "e2e/memory_sharing.rs"]
mod memory_sharing;
// daemon or GPU driver killed under live imports: revocation and clean-up
#[path = "e2e/fabric_faults.rs"]
mod fabric_faults;
// issue 14: `fabric topology`: presets, topology files, partitions' cliques
#[path = "e2e/fabric_topology.rs"]
mod fabric_topology;
// issue 14: the simulated Fabric Manager: probes from it, partitions and switch trays at run
// time, refused trays, FM restarts, the operator's control socket
#[path = "e2e/fabric_manager.rs"]
mod fabric_manager;
// issue 9: the Kubernetes DaemonSet (dist/kubernetes): its probes against real daemons
#[path = "e2e/kubernetes.rs"]
mod kubernetes;
// issue 14: multicast (NVLS) attaches across trays through the daemons
#[path = "e2e/multicast.rs"]
mod multicast;
// issue 14: a multicast team over four trays set up by the real Fabric Manager, and its failure
#[path = "e2e/multicast_fm.rs"]
mod multicast_fm;
// issue 14: multicast under an importer's, an importer tray daemon's and the prime tray
// daemon's kill -9 (nothing stale, nothing leaked)
#[path = "e2e/multicast_faults.rs"]
mod multicast_faults;
// kill -9 and restart, clean SIGTERM departure, mismatched node maps
#[path = "e2e/faults.rs"]
mod faults;
// issue 13: forged peer messages against a live import change nothing and are counted
#[path = "e2e/forged.rs"]
mod forged;
// issue 9: LOG_LEVEL filtering, LOG_FILE_MAX_SIZE / LOG_MAX_ROTATE_COUNT rotation, LOG_USE_SYSLOG
#[path = "e2e/log_keys.rs"]
mod log_keys;
// a domain forms: states, `ctl -q` and `ctl -N -j` output as tools parse them
#[path = "e2e/formation.rs"]
mod formation;
// issue 10: a hostile peer (floods, random bytes, oversized frames) while imports are served
#[path = "e2e/hostile.rs"]
mod hostile;
// issue 13: ignored signals logged, socket mode, bounded echoes and reads, refused port 0
#[path = "e2e/hardening.rs"]
mod hardening;
// issue 7: a peer lost past the grace time is cleaned up on both sides; issue 28: a partition
// healed inside the fence margin that follows keeps the references of the imports made after it
#[path = "e2e/grace.rs"]
mod grace;
// issue 7: ctl --peers shows references, imports, pending unimports and clean-ups per peer
#[path = "e2e/peer_state.rs"]
mod peer_state;
// issue 7: RECOVERY after a crash waits for the recorded importers
#[path = "e2e/recovery.rs"]
mod recovery;
// issue 13: ctl -N on 1,000 nodes, live nodes among 10,000 node-file entries
#[path = "e2e/scale.rs"]
mod scale;
// issue 9: Prometheus metrics on GET /metrics of a live domain during imports
#[path = "e2e/metrics.rs"]
mod metrics;
// hung peers, FULL quorum, SIGINT/SIGQUIT, ctl over unix socket and TCP, demo and bench
#[path = "e2e/lifecycle.rs"]
mod lifecycle;
// issue 31: jobs from job files through real processes: READY per job, imports inside only
#[path = "e2e/jobs.rs"]
mod jobs;
// issue 31: malformed job files, a member killed and restarted, a job ended under mapped
// imports, a stray exporter outliving its job, 10,000 job files
#[path = "e2e/jobs_faults.rs"]
mod jobs_faults;
// issue 9: placeholder nodes files (0.0.0.0): unconfigured start, re-exec on SIGUSR1, fill-in
#[path = "e2e/placeholders.rs"]
mod placeholders;
// issue 9: Slurm prolog and epilog (dist/slurm) against real daemons, stub scontrol
#[path = "e2e/slurm.rs"]
mod slurm;
// issue 31: dist/slurm job mode under a real Slurm (slurmctld, 3 slurmd) and a stub scontrol
#[path = "e2e/slurm_jobs.rs"]
mod slurm_jobs;
// the real Slurm cluster slurm_jobs runs on: slurmctld, three slurmd and munged of its own
#[path = "e2e/slurm_cluster.rs"]
mod slurm_cluster;
// issue 10: mutual TLS between daemons: formation, refusals with named reasons, rotation
#[path = "e2e/tls.rs"]
mod tls;
// issue 10: openimex init writes a domain (TLS on, root-only command socket) that forms UP
#[path = "e2e/init.rs"]
mod init;
// issue 32: init for several nodes on one host: configs that start as written, no shared path
#[path = "e2e/init_one_host.rs"]
mod init_one_host;
// issue 32: `openimex-lab local up|status|down`: a simulated domain in one command
#[path = "e2e/local_domain.rs"]
mod local_domain;
// names mode (private /etc/hosts per daemon); SIGUSR1 re-reads the nodes file and re-resolves
#[path = "e2e/sigusr1.rs"]
mod sigusr1;
// issue 9: NVIDIA's performance statistics file (STATS_FILE_NAME) during imports; in the main log
#[path = "e2e/stats_file.rs"]
mod stats_file;
// issue 9: systemd Type=notify (STATUS, READY=1 only when READY, RELOADING=1, STOPPING=1), the unit
#[path = "e2e/systemd.rs"]
mod systemd;
// issue 7: SIGHUP writes the verbose log buffer (messages below LOG_LEVEL); so does a clean stop
#[path = "e2e/verbose_log.rs"]
mod verbose_log;
// issue 29: the daemon on the RM interface (golden trace on two driver versions, driver-check,
// no driver, the session held, the capability missing, not root)
#[path = "e2e/rm_driver.rs"]
mod rm_driver;
// issue 9, item 1: NETWORK_INTERFACE (link-local domain in network namespaces),
// IMEX_CONN_WAIT_TIMEOUT
#[path = "e2e/net_keys.rs"]
mod net_keys;
