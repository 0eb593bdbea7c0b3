//! Deterministic simulation of whole nodes (issue 12 item 4): several [`openimex_core::Node`]s,
//! each with an in-memory model of its GPU driver (`docs/reference/driver-interface.md` §4, §6), on a
//! simulated network in virtual time, under export/import traffic and seeded faults: kill -9 and
//! restart, clean shutdown with goodbyes, partitions and heals, connection resets, message loss,
//! long delays and slow driver calls, names that move and SIGUSR1 re-reads, strangers that
//! connect and never say hello.
//!
//! Checked during every run: each import is validated or failed within its timeout; no
//! validation names released memory, or memory its exporter holds no reference for, or comes
//! from an exporter instance the importer no longer knows; no reference is released (and no
//! memory freed) while its import is still mapped, except by the exporter daemon's own death;
//! importers of a peer that restarted or left are disabled as soon as that is learned; a blocked
//! releaser is woken within twice the import timeout; no double release, double finish, double
//! validation, or refusal of an honest peer; no more imports in flight to an exporter than the
//! bound; after SIGUSR1 no session to an address its entry no longer resolves to; every
//! deadline the nodes decide (a hello, a retired session, the shutdown's goodbyes) kept exactly
//! (`world/owed.rs`). After the faults stop, the domain heals and every
//! application releases: every export's reference count is zero, nobody is blocked, and every
//! node's tables are empty.
//!
//! - `cargo test -p openimex-core --test node_sim` runs 1,000 fixed seeds and a window of
//!   20,000 more whose start is derived from the commit checked out (printed as
//!   `commit window: …`), and prints `N seeds, …` for each.
//! - `OPENIMEX_SIM_SEEDS=<n>` runs `n` seeds (`OPENIMEX_SIM_FIRST=<k>` starts at seed `k`).
//! - `OPENIMEX_SIM_SEED=<seed>` replays one seed alone with a trace of every event; a failing
//!   seed is printed with that command.
//! - `OPENIMEX_SIM_TRACE=1` traces the targeted scenarios (`scenarios.rs`).

#![allow(unreachable_pub)]

#[path = "../sim/mod.rs"]
mod sim;

mod chaos;
mod driver;
mod rng;
mod scenarios;
mod world;

use std::io::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use world::Stats;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(e) => panic!("{name}={v:?} is not a number: {e}"),
    }
}

fn summary(seeds: u64, failures: usize, s: &Stats) -> String {
    format!(
        "{seeds} seeds, {failures} failures, {} imports ({} validated, {} failed), {} unimports, \
         {} faults, {} messages lost, {} steps, {} imports behind others in flight, {} failed \
         in their turn with no session, {} SIGUSR1 re-reads ({} peers redialled), {} \
         connections and {} silent streams closed at the hello deadline, {} retired sessions \
         ended at the wait, {} \
         goodbyes not waited for, {} requests refused on a retired session, {} GPUs moved to \
         another clique ({} clique notifications delivered), {} jobs started ({} definitions \
         taken, {} refused), {} nodes-file lines removed ({} holes made by re-reads), {} \
         hellos sent again with the node map's entries",
        s.imports,
        s.validated_ok,
        s.validated_err,
        s.unimports,
        s.faults,
        s.lost,
        s.steps,
        s.waited,
        s.not_sent,
        s.rereads,
        s.redialled,
        s.hello_deadlines,
        s.silent_streams_ended,
        s.retired_ended,
        s.goodbyes_unanswered,
        s.refused_on_retired,
        s.gpu_moves,
        s.cliques_told,
        s.jobs_started,
        s.jobs_defined,
        s.jobs_refused,
        s.lines_removed,
        s.holes,
        s.maps_asked
    )
}

#[test]
fn seeded_chaos() {
    let mut err = std::io::stderr();
    if let Some(seed) = env_u64("OPENIMEX_SIM_SEED") {
        let out = chaos::run_seed(seed, true);
        let _ = writeln!(
            err,
            "{}",
            summary(1, usize::from(!out.violations.is_empty()), &out.stats)
        );
        assert!(
            out.violations.is_empty(),
            "seed {seed} failed:\n  {}",
            out.violations.join("\n  ")
        );
        return;
    }
    let count = env_u64("OPENIMEX_SIM_SEEDS").unwrap_or(1000);
    let first = env_u64("OPENIMEX_SIM_FIRST").unwrap_or(0);
    run_window(first, count);
}

/// Seeds the fixed 1,000 never reach: a window of [`WINDOW`] seeds whose start is derived from
/// the commit checked out (`git rev-parse HEAD`), so every commit explores seeds of its own and
/// a run is reproducible from the commit alone. The window is printed, and a failing seed's
/// replay command with it. Skipped when `OPENIMEX_SIM_SEED` replays one seed or
/// `OPENIMEX_SIM_SEEDS` chooses the seeds (`seeded_chaos` runs those).
#[test]
fn seeds_of_this_commit() {
    if env_u64("OPENIMEX_SIM_SEED").is_some() || env_u64("OPENIMEX_SIM_SEEDS").is_some() {
        return;
    }
    let mut err = std::io::stderr();
    let (commit, first) = match commit_window() {
        Ok(w) => w,
        Err(why) => {
            // Outside a git checkout (a source tarball): a fixed window, said so.
            let _ = writeln!(
                err,
                "commit window: {why}; using the window at {FALLBACK_FIRST}"
            );
            ("(none)".to_string(), FALLBACK_FIRST)
        }
    };
    let _ = writeln!(
        err,
        "commit window: seeds {first}..{} of commit {commit} (OPENIMEX_SIM_FIRST={first} \
         OPENIMEX_SIM_SEEDS={WINDOW} runs it again)",
        first + WINDOW
    );
    run_window(first, WINDOW);
}

/// How many seeds [`seeds_of_this_commit`] runs.
const WINDOW: u64 = 20_000;
/// Its start outside a git checkout.
const FALLBACK_FIRST: u64 = 1_000_000;

/// The commit checked out and the first seed of its window: past the fixed 1,000, from the
/// commit hash's first 12 hex digits (below 2^48, so the window never wraps).
fn commit_window() -> Result<(String, u64), String> {
    let dir = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("git")
        .args(["-C", dir, "rev-parse", "HEAD"])
        .output()
        .map_err(|e| format!("git rev-parse HEAD: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git rev-parse HEAD: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let commit = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let prefix = commit.get(..12).unwrap_or(&commit);
    let n = u64::from_str_radix(prefix, 16)
        .map_err(|e| format!("commit {commit:?} is not hex: {e}"))?;
    // The window is the commit's; say when the tree differs from it.
    let clean = std::process::Command::new("git")
        .args(["-C", dir, "diff", "--quiet", "HEAD", "--"])
        .status()
        .is_ok_and(|s| s.success());
    let label = if clean {
        commit
    } else {
        format!("{commit} (+ uncommitted changes)")
    };
    Ok((label, 1000 + n))
}

/// Runs seeds `first..first + count` on every core and fails with each failing seed's replay
/// command.
fn run_window(first: u64, count: u64) {
    let mut err = std::io::stderr();
    let next = AtomicU64::new(first);
    let total = Mutex::new(Stats::default());
    let failures: Mutex<Vec<(u64, Vec<String>)>> = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= first.saturating_add(count) {
                        return;
                    }
                    let out = chaos::run_seed(seed, false);
                    total.lock().unwrap().add(&out.stats);
                    if !out.violations.is_empty() {
                        failures.lock().unwrap().push((seed, out.violations));
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort_by_key(|f| f.0);
    let total = total.into_inner().unwrap();
    let _ = writeln!(err, "{}", summary(count, failures.len(), &total));
    for (seed, v) in failures.iter().take(10) {
        let _ = writeln!(
            err,
            "seed {seed} FAILED:\n  {}\n  reproduce: OPENIMEX_SIM_SEED={seed} cargo test -p \
             openimex-core --test node_sim seeded_chaos",
            v.iter().take(5).cloned().collect::<Vec<_>>().join("\n  ")
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {count} seeds from {first} failed (first: {}, replay: OPENIMEX_SIM_SEED={} cargo \
         test -p openimex-core --test node_sim seeded_chaos); see above. In the commit's window \
         this may be a seed no run explored before rather than a regression: replay it, fix the \
         cause, and keep it as a targeted scenario (scenarios.rs)",
        failures.len(),
        failures[0].0,
        failures[0].0,
    );
}

#[test]
fn a_seed_replays_identically() {
    for seed in [3, 17] {
        let a = chaos::run_seed(seed, false);
        let b = chaos::run_seed(seed, false);
        assert_eq!(a.digest, b.digest, "seed {seed} is not deterministic");
        assert_eq!(a.violations, b.violations);
    }
}
