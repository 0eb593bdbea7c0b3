//! Fabric handles an application did not get from an export: random 64-byte strings,
//! strings with the handle's magic and random fields, and real handles with bytes flipped or
//! fields replaced, imported through the client library against the real simulated driver
//! (two nodes, loopback daemons). Each must fail cleanly: an error, never a mapping of memory
//! the handle does not name, never a panic, never a hang. A handle that still names the real
//! export (only unused bytes changed) may import, and must then map exactly that export's
//! memory. Afterwards the driver still serves a well-behaved client and holds no leftover
//! import.
//!
//! The case budget is fixed ([`CASES`]); `PROPTEST_CASES` overrides it for a longer run.

mod common;

use std::cell::Cell;
use std::time::Duration;

use common::{Domain, NODE_A, NODE_B};
use openimex_client::{Context, CuError, FabricHandleBytes, pattern};
use openimex_simgpu::testing::case_budget;
use openimex_simproto::handle::FabricHandle;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Cases per run in CI.
const CASES: u32 = 2_000;

/// A generous bound on one import: the loopback daemons answer every event at once, so an
/// import still pending after this is a hang.
const HANG: Duration = Duration::from_secs(20);

/// The pattern seed of the one real export.
const SEED: u64 = 0x5eed;

/// Handles to try, built from the real handle `valid`.
fn handles(valid: [u8; 64]) -> impl Strategy<Value = [u8; 64]> {
    let random = proptest::collection::vec(any::<u8>(), 64);
    // Past the magic check: random export UUIDs, indexes, sizes, domains.
    let with_magic = proptest::collection::vec(any::<u8>(), 60).prop_map(|tail| {
        let mut v = b"OIMX".to_vec();
        v.extend(tail);
        v
    });
    // The real handle with 1 to 4 bytes flipped.
    let flipped =
        proptest::collection::vec((0usize..64, 1u8..=255), 1..=4).prop_map(move |flips| {
            let mut v = valid.to_vec();
            for (at, x) in flips {
                v[at] ^= x;
            }
            v
        });
    // The real handle naming another export, node or index: the known nodes (the exporter,
    // the importer), the single-node ID 0xFFFF and any other.
    let node = prop_oneof![Just(NODE_A), Just(NODE_B), Just(0xFFFF_u16), any::<u16>()];
    let fields =
        (any::<u64>(), node, any::<u16>(), 0u8..4).prop_map(move |(exp_id, node, index, which)| {
            let mut v = valid.to_vec();
            match which {
                0 => v[4..12].copy_from_slice(&exp_id.to_le_bytes()),
                1 => v[12..14].copy_from_slice(&node.to_le_bytes()),
                2 => v[20..22].copy_from_slice(&index.to_le_bytes()),
                _ => {
                    v[4..12].copy_from_slice(&(exp_id % 4).to_le_bytes());
                    v[12..14].copy_from_slice(&node.to_le_bytes());
                }
            }
            v
        });
    prop_oneof![random, with_magic, flipped, fields].prop_map(|v| {
        let mut b = [0u8; 64];
        b.copy_from_slice(&v);
        b
    })
}

/// Does `bytes` still name the real export (its UUID and index 0)?
fn names_the_export(bytes: &[u8; 64], valid: &FabricHandle) -> bool {
    FabricHandle::from_bytes(bytes)
        .is_ok_and(|h| h.export_uuid == valid.export_uuid && h.index == valid.index)
}

/// Imports `bytes` on `ctx`: an error that is not a hang (`Ok(false)`), or (only for a handle
/// naming the export) a mapping of the export's bytes, released at once (`Ok(true)`).
fn try_import(ctx: &Context, bytes: [u8; 64], valid: &FabricHandle) -> Result<bool, TestCaseError> {
    let handle = FabricHandleBytes::from(bytes);
    match ctx.import_with_timeout(&handle, HANG) {
        Err(CuError::NotReady(text)) => Err(TestCaseError::fail(format!(
            "import of {} hung: {text}",
            handle.to_hex()
        ))),
        Err(_) => Ok(false),
        Ok(imported) => {
            prop_assert!(
                names_the_export(&bytes, valid),
                "imported a handle that names no export: {}",
                handle.to_hex()
            );
            let view = ctx
                .map(&imported)
                .map_err(|e| TestCaseError::fail(format!("map: {e}")))?;
            prop_assert_eq!(pattern::verify(&view, SEED), Ok(()));
            drop(view);
            ctx.release(imported)
                .map_err(|e| TestCaseError::fail(format!("release: {e}")))?;
            Ok(true)
        }
    }
}

#[test]
fn random_and_mutated_handles_fail_cleanly_and_map_nothing() {
    let d = Domain::start("handles");
    let a = Context::open(&d.a.dir).expect("context on node A");
    let b = Context::open(&d.b.dir).expect("context on node B");
    let mem = a.mem_create(0, 2 << 20).expect("create");
    let mut view = a.map(&mem).expect("map");
    pattern::fill(&mut view, SEED);
    let handle = a.export(&mem).expect("export");
    let valid_bytes = *handle.as_bytes();
    let valid = FabricHandle::from_bytes(&valid_bytes).expect("a real handle decodes");

    let cases = case_budget(CASES);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    // Imported on the exporter's node (the local dup path) and on the other node (MEM_IMPORT
    // through the daemons).
    let (imported, refused) = (Cell::new(0u32), Cell::new(0u32));
    let result = runner.run(&(handles(valid_bytes), any::<bool>()), |(bytes, on_a)| {
        let ok = try_import(if on_a { &a } else { &b }, bytes, &valid)?;
        let n = if ok { &imported } else { &refused };
        n.set(n.get() + 1);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    // Both outcomes were exercised: flips of the unused bytes still name the export.
    assert!(
        imported.get() > 0 && refused.get() > cases / 2,
        "imported {}, refused {}",
        imported.get(),
        refused.get()
    );

    // The driver still serves a well-behaved client, and nothing is left imported.
    let imported = b.import(&handle).expect("the real handle still imports");
    assert_eq!(
        pattern::verify(&b.map(&imported).expect("map"), SEED),
        Ok(())
    );
    b.release(imported).expect("release");
    let stats = d.b.stats();
    assert_eq!(
        (stats.import_descriptors, stats.pending_unimports),
        (0, 0),
        "{stats:?}"
    );
    assert_eq!(d.a.stats().daemon_export_refs, 0);
    d.check_daemons();
}
