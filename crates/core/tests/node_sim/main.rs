//! Deterministic simulation of whole nodes (issue 12 item 4): several [`openimex_core::Node`]s,
//! each with an in-memory model of its GPU driver (`reference/driver-interface.md` §4, §6), on a
//! simulated network in virtual time, under export/import traffic and seeded faults.
//!
//! `cargo test -p openimex-core --test node_sim` runs 1,000 seeds (`OPENIMEX_SIM_SEEDS=<n>`
//! for more) and prints `N seeds, …`. A failing seed is printed with the command that replays
//! it alone with a trace: `OPENIMEX_SIM_SEED=<seed> cargo test -p openimex-core --test node_sim`.

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
         {} faults, {} messages lost, {} steps",
        s.imports, s.validated_ok, s.validated_err, s.unimports, s.faults, s.lost, s.steps
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
    let next = AtomicU64::new(0);
    let total = Mutex::new(Stats::default());
    let failures: Mutex<Vec<(u64, Vec<String>)>> = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= count {
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
             openimex-core --test node_sim",
            v.iter().take(5).cloned().collect::<Vec<_>>().join("\n  ")
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {count} seeds failed (first: {}); see above",
        failures.len(),
        failures[0].0
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
