//! Multicast (NVLS) under faults, with real processes and the real Fabric Manager (issue 14:
//! "multicast under an importer and a daemon kill -9 (nothing stale, nothing leaked)";
//! `docs/reference/driver-interface.md` §1.6 "Multicast" 7, §4). A team of three trays: the prime
//! on tray 0 (this test process), an `openimex-lab app multicast --import --hold` process on each
//! of trays 1 and 2, each GPU 0 binding 2 MiB. Then:
//! - the importer application on tray 2 is killed -9: its driver frees its object, which
//!   unbinds its memory (`_memMulticastFabricDescriptorFree`);
//! - the importer tray's daemon is killed -9 (and restarted): its driver's session teardown
//!   disables every holder of an imported object (`rcAndDisableOutstandingClientsWithImportedMemory`),
//!   so the importer application is killed and freed the same way;
//! - the prime tray's daemon is killed -9 (and restarted): the prime's holder keeps its object
//!   (a prime is never revoked), and the other trays' daemons, seeing the prime's node restart,
//!   send DISABLE_IMPORTERS for it: every importer of the team is killed and unbound.
//!
//! Each asserts nothing stale (a later store through the team, even through a mapping made
//! before the fault, does not reach the dead member's freed memory, now allocated again) and
//! nothing leaked (every driver's multicast and allocation counters back to zero, the team's
//! table gone from the fabric directory, the FM's team freed).

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use openimex_client::{Context, Multicast};
use openimex_harness::Cluster;
use openimex_simproto::multicast::McBinding;
use serde_json::Value;

use crate::apps::{Held, app, wait_session};
use crate::common::NOTICE;
use crate::multicast_fm::fm_trays;

const TRAYS: usize = 3;

#[track_caller]
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + NOTICE;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {NOTICE:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The team's bindings, as its table in the fabric directory lists them.
fn bindings(table: &Path) -> Vec<McBinding> {
    let Ok(dir) = fs::read_dir(table) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let path = e.ok()?.path();
        let text = fs::read(&path).ok()?;
        (path.extension()? == "json")
            .then(|| serde_json::from_slice(&text).ok())
            .flatten()
    })
    .collect()
}

/// `len` bytes at `at` of the memory `b` bound (read from the simulated HBM directly: the
/// memory stays readable whoever holds it, or after it was freed).
fn raw(fabric_dir: &Path, b: &McBinding, at: u64, len: usize) -> Vec<u8> {
    let f = File::open(fabric_dir.join(&b.file)).expect("the member's HBM file");
    let mut buf = vec![0; len];
    f.read_exact_at(&mut buf, b.file_offset + at)
        .expect("read the member's HBM");
    buf
}

/// The team: the prime on tray 0 with its GPU 0's memory bound, and a held importer process on
/// each other tray. Returns the importers and the team's table directory.
fn team<'a>(
    cluster: &Cluster,
    ctx: &'a Context,
) -> (
    Multicast<'a>,
    openimex_client::Allocation,
    Vec<Held>,
    PathBuf,
) {
    let size = ctx.multicast_granularity();
    let prime = ctx
        .multicast_create(TRAYS as u32, size)
        .expect("create the prime");
    let handle = prime.export().expect("export").to_hex();
    prime.add_device(0).expect("attach tray 0's GPU 0");
    let importers: Vec<Held> = (1..TRAYS)
        .map(|i| {
            let mut cmd = app("multicast", cluster.node(i).dir());
            cmd.args(["--gpus", "0", "--size", &size.to_string(), "--hold"])
                .args(["--import", &handle]);
            Held::spawn(&format!("tray {i}'s importer"), &mut cmd)
        })
        .collect();
    let mem = ctx.mem_create(0, size).expect("tray 0's memory");
    prime
        .bind_mem(0, 0, &mem, 0, size)
        .expect("bind tray 0's memory (waits for the team)");
    let info = prime.info(Duration::ZERO).expect("the team");
    let base = info.team.expect("a team").address_base;
    for h in &importers {
        let said: Value = serde_json::from_str(&h.line(NOTICE)).expect("a JSON line");
        assert_eq!(said["imported"], Value::Bool(true), "{}", h.what);
        assert_eq!(said["address_base"].as_u64(), Some(base), "{}", h.what);
    }
    let table = PathBuf::from(info.table_dir.expect("a table"));
    assert_eq!(bindings(&table).len(), TRAYS, "every tray's memory bound");
    (prime, mem, importers, table)
}

/// Tray `i`'s driver counters: (multicast objects, bindings, allocations).
fn counters(cluster: &Cluster, i: usize) -> (usize, usize, usize) {
    let s = Context::open(cluster.node(i).dir())
        .and_then(|c| c.stats())
        .expect("driver stats");
    (s.multicast_objects, s.multicast_bindings, s.allocations)
}

/// After the `dead` trays' members left: their bindings are out of the table and their
/// trays' drivers hold nothing; the freed memory is allocated again on each such tray; a store
/// through the team (through `old`, a mapping made before the fault, and through a new one)
/// lands in every live member's memory and in none of the dead members' memory. Returns the
/// new allocations (context, memory) for the caller to release.
fn assert_nothing_stale(
    cluster: &Cluster,
    prime: &Multicast<'_>,
    table: &Path,
    mut old: openimex_client::McMapping,
    before: &[McBinding],
    dead: &[usize],
) -> Vec<(Context, openimex_client::Allocation)> {
    let fabric_dir = cluster.fabric_dir();
    wait_until("the dead members' bindings leave the table", || {
        bindings(table).len() == TRAYS - dead.len()
    });
    let now = bindings(table);
    let (gone, live): (Vec<&McBinding>, Vec<&McBinding>) =
        before.iter().partition(|b| !now.contains(b));
    assert_eq!(gone.len(), dead.len(), "{gone:?}");
    for &i in dead {
        wait_until(&format!("tray {i}'s driver frees the dead member"), || {
            counters(cluster, i) == (0, 0, 0)
        });
    }
    let size = prime.info(Duration::ZERO).expect("the team").size;
    let fresh: Vec<_> = dead
        .iter()
        .map(|&i| {
            let c = Context::open(cluster.node(i).dir()).expect("a context");
            let m = c.mem_create(0, size).expect("memory again");
            c.map(&m).expect("map")[..1024].fill(0);
            (c, m)
        })
        .collect();
    old.store(128, b"through the old map")
        .expect("store through the mapping made before");
    prime
        .map()
        .expect("map the team again")
        .store(512, b"through a new map")
        .expect("store");
    for b in &live {
        assert_eq!(
            raw(&fabric_dir, b, 128, 19),
            b"through the old map",
            "{b:?}"
        );
        assert_eq!(raw(&fabric_dir, b, 512, 17), b"through a new map", "{b:?}");
    }
    for b in &gone {
        assert_ne!(
            raw(&fabric_dir, b, 128, 19),
            b"through the old map",
            "stale: {b:?}"
        );
        assert_ne!(
            raw(&fabric_dir, b, 512, 17),
            b"through a new map",
            "stale: {b:?}"
        );
    }
    for (c, m) in &fresh {
        let view = c.map(m).expect("map");
        assert!(
            view[..1024].iter().all(|&x| x == 0),
            "a store through the team reached the new owner's memory"
        );
    }
    fresh
}

/// Releases everything the test holds and asserts nothing is left: every tray's multicast
/// and allocation counters zero, the team's table gone from the fabric directory.
fn assert_nothing_leaked(
    cluster: &Cluster,
    ctx: &Context,
    (prime, mem, table): (Multicast<'_>, openimex_client::Allocation, &Path),
    importers: Vec<Held>,
    fresh: Vec<(Context, openimex_client::Allocation)>,
) {
    for h in importers {
        h.exit();
    }
    prime.release().expect("release the prime");
    ctx.release(mem).expect("release tray 0's memory");
    for (c, m) in fresh {
        c.release(m).expect("release");
    }
    for i in 0..TRAYS {
        wait_until(&format!("tray {i}: nothing left"), || {
            counters(cluster, i) == (0, 0, 0)
        });
    }
    wait_until("the team's table leaves the fabric directory", || {
        !table.exists()
    });
    // Every member tray released the team at the FM (or was forgotten with its driver).
    wait_until("the FM frees the team", || {
        cluster
            .fabric(&["status", "--json"])
            .ok()
            .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
            .is_some_and(|s| s["mc_teams"].as_u64() == Some(0))
    });
}

/// The team set up, mapped on tray 0 and a first store checked in every member's memory:
/// (the mapping, the bindings).
fn mapped(
    cluster: &Cluster,
    prime: &Multicast<'_>,
    table: &Path,
) -> (openimex_client::McMapping, Vec<McBinding>) {
    let before = bindings(table);
    let mut old = prime.map().expect("map the team");
    old.store(0, b"before").expect("store");
    for b in &before {
        assert_eq!(raw(&cluster.fabric_dir(), b, 0, 6), b"before", "{b:?}");
    }
    (old, before)
}

/// §1.6 "Multicast" 7, `_memMulticastFabricDescriptorFree`: the importer process on tray 2
/// dies of SIGKILL; its driver frees its object and with it the binding.
#[test]
fn an_importer_killed_9_is_unbound_and_leaves_nothing() {
    let cluster = fm_trays(TRAYS);
    let ctx = Context::open(cluster.node(0).dir()).expect("a context");
    let (prime, mem, mut importers, table) = team(&cluster, &ctx);
    let (old, before) = mapped(&cluster, &prime, &table);

    importers.pop().expect("tray 2's importer").kill9();
    let fresh = assert_nothing_stale(&cluster, &prime, &table, old, &before, &[2]);
    assert_nothing_leaked(&cluster, &ctx, (prime, mem, &table), importers, fresh);
}

/// §4 "Daemon dies or restarts", `rcAndDisableOutstandingClientsWithImportedMemory`: tray 2's
/// daemon dies of SIGKILL; its driver's session teardown disables (kills) the importer holding
/// the imported object, whose free unbinds it. The daemon restarts and opens a new session.
#[test]
fn an_importer_trays_daemon_killed_9_revokes_and_unbinds_its_importer() {
    let mut cluster = fm_trays(TRAYS);
    let ctx = Context::open(cluster.node(0).dir()).expect("a context");
    let (prime, mem, mut importers, table) = team(&cluster, &ctx);
    let (old, before) = mapped(&cluster, &prime, &table);

    cluster.kill9(2).expect("kill -9 tray 2's daemon");
    let mut victim = importers.pop().expect("tray 2's importer");
    let status = victim.wait(NOTICE);
    assert_eq!(
        status.signal(),
        Some(9),
        "the revoked importer is killed: {status:?}"
    );
    let fresh = assert_nothing_stale(&cluster, &prime, &table, old, &before, &[2]);
    cluster.start_node(2).expect("restart tray 2's daemon");
    wait_session(&cluster, 2);
    assert!(
        prime.info(Duration::ZERO).is_ok(),
        "the prime and the live members keep the team"
    );
    assert_nothing_leaked(&cluster, &ctx, (prime, mem, &table), importers, fresh);
}

/// The prime's tray loses its daemon (SIGKILL, then a restart): per
/// `_checkClientDesiredImporterAndClearCache` a prime is never revoked, so the prime's holder
/// on tray 0 keeps its object, team and memory; the other trays' daemons see node 0 come back
/// as a new instance and send DISABLE_IMPORTERS(0), which disables (kills) every importer of
/// node 0's team. Their objects go, their memory is unbound: the team reaches tray 0 only.
#[test]
fn the_prime_trays_daemon_killed_9_revokes_every_importer_but_not_the_prime() {
    let mut cluster = fm_trays(TRAYS);
    let ctx = Context::open(cluster.node(0).dir()).expect("a context");
    let (prime, mem, mut importers, table) = team(&cluster, &ctx);
    let (old, before) = mapped(&cluster, &prime, &table);

    cluster.kill9(0).expect("kill -9 tray 0's daemon");
    cluster.start_node(0).expect("restart tray 0's daemon");
    wait_session(&cluster, 0);
    for mut h in importers.drain(..) {
        let status = h.wait(NOTICE);
        assert_eq!(
            status.signal(),
            Some(9),
            "{}: revoked, killed: {status:?}",
            h.what
        );
    }
    assert!(prime.info(Duration::ZERO).is_ok(), "the prime is kept");
    let fresh = assert_nothing_stale(&cluster, &prime, &table, old, &before, &[1, 2]);
    assert_nothing_leaked(&cluster, &ctx, (prime, mem, &table), importers, fresh);
}
