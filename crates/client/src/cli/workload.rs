//! `openimex-lab app churn` and `openimex-lab app reader`: the two halves of the fault-injection
//! workload (`openimex-lab demo --chaos` and the chaos tests) as processes, so that a fault can
//! kill them as it kills a real job.
//!
//! ```text
//! openimex-lab app churn  --node-dir DIR --handle-file FILE [--gpu N] [--size SIZE]
//!                     [--hold-ms MS] [--canary-ms MS]
//! openimex-lab app reader --node-dir DIR --source FILE... [--interval-ms MS]
//!                     [--import-timeout SECS] [--tick-ms MS]
//! ```
//!
//! `churn` loops over generations: create SIZE bytes on the GPU, fill them with [`CANARY`]
//! (memory freed by someone else and handed to us: any other mapping of it that still reads
//! must be a stale one), wait `--canary-ms` so such a reader has time to see it, fill the
//! pattern of a fresh seed, export, publish `GEN SEED HANDLE` in `--handle-file` (atomically),
//! hold it `--hold-ms`, check it is intact, release it. Lines on stdout:
//! - `exported GEN SEED` / `released GEN`;
//! - `fail OP CODE`: a driver call failed (expected while a daemon is down); retried;
//! - `corrupt self GEN OFFSET`: its own memory changed under it.
//!
//! `reader` follows every `--source` handle file (its tag is the file name): imports each
//! published handle, maps it, checks every byte once, then samples one word in 64 every
//! `--interval-ms`; when the file names a new seed it releases the old import and imports the
//! new one. Lines on stdout (SEED in hex):
//! - `imported TAG SEED MICROS`, `released TAG SEED`;
//! - `fail import TAG SEED CODE`: the import failed (expected during a fault); retried;
//! - `ok TAG SEED N`: N checks of the import of SEED that found the pattern, every `--tick-ms`
//!   and when a new import replaces it;
//! - `stale TAG SEED OFFSET`: the canary, i.e. memory freed and reused under a live mapping;
//! - `freed TAG SEED OFFSET`: zeros, i.e. memory freed (the driver zeroes freed HBM);
//! - `corrupt TAG SEED OFFSET`: anything else that is not the pattern.
//!
//! Both stop on `exit`, end of stdin, SIGTERM or SIGINT, release what they hold and exit 0.
//! A lost driver connection (the node's `openimex-lab gpu` died) exits 3: a job does not outlive
//! its GPU driver.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;

use super::{NodeArgs, TERMINATED, catch_termination, open, parse_secs, parse_size, say};
use crate::{Allocation, Context, CuError, FabricHandleBytes, Imported, Mapping, pattern};

/// What a new owner writes into memory before using it: eight bytes repeated. No pattern word
/// equals it (a 2^-64 chance per word), so a reader that sees it reads reused memory.
pub(super) const CANARY: u64 = 0xCA4A_2D00_DEAD_BEEF;
/// The reader checks one word in this many after the first full check.
const SAMPLE_STRIDE: usize = 64;
/// Pause after a failed driver call before the next try.
const RETRY: Duration = Duration::from_millis(200);
/// Exit code when the driver connection is gone.
const LOST_DRIVER: u8 = 3;

#[derive(Debug, Args)]
pub(super) struct ChurnArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// GPU index on the node.
    #[arg(long, value_name = "N", default_value_t = 0)]
    gpu: u32,
    /// Bytes per generation (K/M/G suffixes).
    #[arg(long, value_name = "SIZE", default_value = "2M", value_parser = parse_size)]
    size: u64,
    /// Where to publish `GEN SEED HANDLE` (replaced atomically).
    #[arg(long, value_name = "FILE")]
    handle_file: PathBuf,
    /// How long each generation stays exported.
    #[arg(long, value_name = "MS", default_value_t = 600)]
    hold_ms: u64,
    /// How long new memory holds the canary before the pattern is written.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    canary_ms: u64,
}

#[derive(Debug, Args)]
pub(super) struct ReaderArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// A handle file written by `app churn` (repeat for several exporters).
    #[arg(long = "source", value_name = "FILE", required = true)]
    sources: Vec<PathBuf>,
    /// Pause between two checks of every mapping.
    #[arg(long, value_name = "MS", default_value_t = 50)]
    interval_ms: u64,
    /// Bound on one import.
    #[arg(long, value_name = "SECS", default_value = "5", value_parser = parse_secs)]
    import_timeout: Duration,
    /// How often the `ok` counts are printed.
    #[arg(long, value_name = "MS", default_value_t = 250)]
    tick_ms: u64,
}

/// Set when stdin ended or said `exit`.
static STDIN_DONE: AtomicBool = AtomicBool::new(false);

/// Watches stdin for `exit` or its end, on a thread.
fn watch_stdin() {
    std::thread::spawn(|| {
        use std::io::BufRead;
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) if l.trim() == "exit" => break,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        STDIN_DONE.store(true, Ordering::SeqCst);
    });
}

fn stopping() -> bool {
    STDIN_DONE.load(Ordering::SeqCst) || TERMINATED.load(Ordering::SeqCst)
}

/// Sleeps up to `d`, waking early when asked to stop; false then.
fn nap(d: Duration) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if stopping() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10).min(end - Instant::now()));
    }
    !stopping()
}

/// A driver error that means the driver itself is gone.
fn lost(e: &CuError) -> bool {
    matches!(e, CuError::Transport(_) | CuError::NoDevice { .. })
}

/// Ends the process for a lost driver (exit 3), after saying why.
fn lost_driver(e: &CuError) -> ExitCode {
    eprintln!("openimex-lab app: lost the GPU driver: {e}");
    ExitCode::from(LOST_DRIVER)
}

fn start(node: &NodeArgs) -> Result<Context, ExitCode> {
    catch_termination();
    watch_stdin();
    open(node).map_err(|f| {
        eprintln!("openimex-lab app: {f}");
        ExitCode::from(LOST_DRIVER)
    })
}

/// `app churn`.
pub(super) fn churn(a: &ChurnArgs) -> ExitCode {
    let ctx = match start(&a.node) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // Seeds differ between runs and restarts of the same exporter: a reader can never
    // mistake an earlier instance's data for the current one's.
    let nonce = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 32);
    let mut generation = 0u64;
    while !stopping() {
        generation += 1;
        let seed = pattern::word_at(nonce, generation);
        match churn_one(&ctx, a, generation, seed) {
            Ok(()) => {}
            Err(Some(e)) => return lost_driver(&e),
            Err(None) => {
                nap(RETRY);
            }
        }
    }
    ExitCode::SUCCESS
}

/// One generation. `Err(Some)`: the driver is gone; `Err(None)`: a call failed (said).
fn churn_one(
    ctx: &Context,
    a: &ChurnArgs,
    generation: u64,
    seed: u64,
) -> Result<(), Option<CuError>> {
    let fail = |op: &str, e: CuError| {
        if lost(&e) {
            return Some(e);
        }
        say(&format!("fail {op} {}", e.name()));
        None
    };
    let alloc = ctx
        .mem_create(a.gpu, a.size)
        .map_err(|e| fail("create", e))?;
    let mut map = match ctx.map(&alloc) {
        Ok(m) => m,
        Err(e) => {
            let failed = fail("map", e);
            return Err(release_alloc(ctx, alloc, None).err().or(failed));
        }
    };
    fill_canary(&mut map);
    if nap(Duration::from_millis(a.canary_ms)) {
        pattern::fill(&mut map, seed);
        let handle = match ctx.export(&alloc) {
            Ok(h) => h,
            Err(e) => {
                let failed = fail("export", e);
                return Err(release_alloc(ctx, alloc, Some(map)).err().or(failed));
            }
        };
        if let Err(e) = publish(&a.handle_file, generation, seed, &handle) {
            say(&format!("fail publish {e}"));
            return Err(release_alloc(ctx, alloc, Some(map)).err());
        }
        say(&format!("exported {generation} {seed:x}"));
        nap(Duration::from_millis(a.hold_ms));
        if let Err(off) = pattern::verify(&map, seed) {
            say(&format!("corrupt self {generation} {off}"));
        }
    }
    release_alloc(ctx, alloc, Some(map)).map_err(Some)?;
    say(&format!("released {generation}"));
    Ok(())
}

/// Unmaps and releases; only a lost driver is an error (anything else is said).
fn release_alloc(ctx: &Context, alloc: Allocation, map: Option<Mapping>) -> Result<(), CuError> {
    drop(map);
    match ctx.release(alloc) {
        Err(e) if lost(&e) => Err(e),
        Err(e) => {
            say(&format!("fail release {}", e.name()));
            Ok(())
        }
        Ok(()) => Ok(()),
    }
}

fn fill_canary(buf: &mut [u8]) {
    for c in buf.chunks_exact_mut(8) {
        c.copy_from_slice(&CANARY.to_le_bytes());
    }
}

fn publish(path: &Path, generation: u64, seed: u64, h: &FabricHandleBytes) -> Result<(), String> {
    super::write_atomically(path, &format!("{generation} {seed:x} {h}\n"))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// What a handle file says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Published {
    seed: u64,
    handle: FabricHandleBytes,
}

/// Reads `GEN SEED HANDLE` (at most one line of a few hundred bytes is expected).
fn read_published(path: &Path) -> Option<Published> {
    let text = super::read_handle_file(path).ok()?;
    let mut words = text.split_whitespace();
    let _generation = words.next()?;
    let seed = u64::from_str_radix(words.next()?, 16).ok()?;
    let handle = FabricHandleBytes::from_hex(words.next()?).ok()?;
    Some(Published { seed, handle })
}

/// One followed exporter.
struct Source {
    tag: String,
    file: PathBuf,
    current: Option<(u64, Imported, Mapping)>,
    /// A seed whose import failed, and when to try it again.
    failed: Option<(u64, Instant)>,
    ok: u64,
}

/// What a check of a mapping found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    Ok,
    Stale(usize),
    Corrupt(usize),
    Freed(usize),
}

/// Checks every `stride`-th word of `buf` against the pattern of `seed`. The canary anywhere
/// wins over other damage, which wins over zeros.
fn check(buf: &[u8], seed: u64, stride: usize) -> Check {
    let (mut corrupt, mut freed) = (None, None);
    for (k, w) in buf.chunks_exact(8).enumerate().step_by(stride) {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        let v = u64::from_le_bytes(b);
        if v == pattern::word_at(seed, k as u64) {
            continue;
        }
        let off = k * 8;
        if v == CANARY {
            return Check::Stale(off);
        } else if v == 0 {
            freed.get_or_insert(off);
        } else {
            corrupt.get_or_insert(off);
        }
    }
    match (corrupt, freed) {
        (Some(off), _) => Check::Corrupt(off),
        (None, Some(off)) => Check::Freed(off),
        (None, None) => Check::Ok,
    }
}

/// `app reader`.
pub(super) fn reader(a: &ReaderArgs) -> ExitCode {
    let ctx = match start(&a.node) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut sources: Vec<Source> = a
        .sources
        .iter()
        .map(|f| Source {
            tag: f
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            file: f.clone(),
            current: None,
            failed: None,
            ok: 0,
        })
        .collect();
    let mut tick = Instant::now();
    let mut result = ExitCode::SUCCESS;
    'run: while !stopping() {
        for s in &mut sources {
            if let Err(e) = follow(&ctx, s, a.import_timeout) {
                result = lost_driver(&e);
                break 'run;
            }
            if let Some((seed, _, map)) = &s.current {
                let seed = *seed;
                match check(map, seed, SAMPLE_STRIDE) {
                    Check::Ok => s.ok += 1,
                    Check::Stale(off) => say(&format!("stale {} {seed:x} {off}", s.tag)),
                    Check::Corrupt(off) => say(&format!("corrupt {} {seed:x} {off}", s.tag)),
                    Check::Freed(off) => say(&format!("freed {} {seed:x} {off}", s.tag)),
                }
            }
        }
        if tick.elapsed() >= Duration::from_millis(a.tick_ms) {
            tick = Instant::now();
            for s in &mut sources {
                if let (Some((seed, _, _)), n @ 1..) = (&s.current, s.ok) {
                    say(&format!("ok {} {seed:x} {n}", s.tag));
                }
                s.ok = 0;
            }
        }
        nap(Duration::from_millis(a.interval_ms));
    }
    for s in &mut sources {
        if let Some((seed, imported, map)) = s.current.take() {
            drop(map);
            match ctx.release(imported) {
                Ok(()) => say(&format!("released {} {seed:x}", s.tag)),
                Err(e) => say(&format!("fail release {} {seed:x} {}", s.tag, e.name())),
            }
        }
    }
    result
}

/// Moves `s` to the seed its file names: imports and fully checks the new one, then releases
/// the old one. Until the new import succeeds the old mapping stays and is read (a job holds
/// its memory across a fault; that is where a stale mapping would show). Only a lost driver is
/// an error.
fn follow(ctx: &Context, s: &mut Source, timeout: Duration) -> Result<(), CuError> {
    let Some(p) = read_published(&s.file) else {
        return Ok(());
    };
    if s.current
        .as_ref()
        .is_some_and(|(seed, _, _)| *seed == p.seed)
    {
        return Ok(());
    }
    if s.failed
        .is_some_and(|(seed, at)| seed == p.seed && at > Instant::now())
    {
        return Ok(());
    }
    let t = Instant::now();
    let fail = |s: &mut Source, op: &str, e: CuError| {
        if lost(&e) {
            return Err(e);
        }
        say(&format!("fail {op} {} {:x} {}", s.tag, p.seed, e.name()));
        s.failed = Some((p.seed, Instant::now() + RETRY * 2));
        Ok(())
    };
    let imported = match ctx.import_with_timeout(&p.handle, timeout) {
        Ok(i) => i,
        Err(e) => return fail(s, "import", e),
    };
    let micros = t.elapsed().as_micros();
    let map = match ctx.map(&imported) {
        Ok(m) => m,
        Err(e) => {
            let _ = ctx.release(imported);
            return fail(s, "map", e);
        }
    };
    // The good checks of the import being replaced are reported under its own seed, so an
    // `ok` line under the new seed counts checks of the new memory only.
    if let (Some((seed, _, _)), n @ 1..) = (&s.current, s.ok) {
        say(&format!("ok {} {seed:x} {n}", s.tag));
    }
    s.ok = 0;
    say(&format!("imported {} {:x} {micros}", s.tag, p.seed));
    match check(&map, p.seed, 1) {
        Check::Ok => s.ok += 1,
        Check::Stale(off) => say(&format!("stale {} {:x} {off}", s.tag, p.seed)),
        Check::Corrupt(off) => say(&format!("corrupt {} {:x} {off}", s.tag, p.seed)),
        Check::Freed(off) => say(&format!("freed {} {:x} {off}", s.tag, p.seed)),
    }
    s.failed = None;
    if let Some((seed, old, old_map)) = s.current.replace((p.seed, imported, map)) {
        drop(old_map);
        match ctx.release(old) {
            Ok(()) => say(&format!("released {} {seed:x}", s.tag)),
            Err(e) if lost(&e) => return Err(e),
            Err(e) => say(&format!("fail release {} {seed:x} {}", s.tag, e.name())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_tell_canary_zeros_and_damage_apart() {
        let mut buf = vec![0u8; 64 << 10];
        pattern::fill(&mut buf, 9);
        assert_eq!(check(&buf, 9, 1), Check::Ok);
        assert_eq!(check(&buf, 9, SAMPLE_STRIDE), Check::Ok);
        let mut zeroed = buf.clone();
        zeroed[4096..8192].fill(0);
        assert_eq!(check(&zeroed, 9, 1), Check::Freed(4096));
        let mut canary = zeroed.clone();
        fill_canary(&mut canary[8192..16384]);
        assert_eq!(check(&canary, 9, 1), Check::Stale(8192));
        assert_eq!(check(&canary, 9, SAMPLE_STRIDE), Check::Stale(8192));
        let mut other = buf.clone();
        pattern::fill(&mut other[..512], 10);
        assert_eq!(check(&other, 9, 1), Check::Corrupt(0));
        assert_eq!(check(&buf, 10, SAMPLE_STRIDE), Check::Corrupt(0));
    }
}
