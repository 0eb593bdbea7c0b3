//! `openimex-lab app`: the client library as a command, for scripts and tests.
//!
//! ```text
//! openimex-lab app export --node-dir DIR [--gpu N] --size SIZE --pattern SEED [--handle-out FILE] [--hold]
//! openimex-lab app import --node-dir DIR --handle HEX|@FILE [--verify SEED] [--write SEED]
//!                     [--hold] [--no-release] [--timeout SECS] [--import-id ID]
//! openimex-lab app stats  --node-dir DIR
//! openimex-lab app gpus   --node-dir DIR [-j]
//! openimex-lab app multicast --node-dir DIR [--gpus 0,1,…] [--size SIZE] [--hold]
//! openimex-lab app churn  --node-dir DIR --handle-file FILE [--gpu N] [--size SIZE] …
//! openimex-lab app reader --node-dir DIR --source FILE… [--interval-ms MS] …
//! ```
//! Every subcommand also takes `--channel FILE` (subscribe with that channel file instead of
//! the first accessible one) or `--no-channel`.
//!
//! - `export` creates SIZE bytes (plain bytes or a binary K/M/G/T suffix: `4M` = 4 MiB) on
//!   GPU N, fills them with the pattern of SEED ([`crate::pattern`]), exports them and prints
//!   the handle (128 hex digits) as its first line. `--handle-out` also writes it to FILE
//!   (atomically: a temporary file renamed into place, before the handle is printed).
//! - `import` imports the handle (hex, or `@FILE` to read it from FILE, at most 4 KiB), maps
//!   it, checks it holds the pattern of `--verify` SEED (prints `verified BYTES`, or `mismatch
//!   at OFFSET` and fails), writes the pattern of `--write` SEED (prints `written BYTES`),
//!   then releases it. `--no-release` exits without releasing (the driver cleans up, as at
//!   process exit). `--import-id` sets the import ID (default 0): imports of one handle on a
//!   node with the same ID share one import descriptor, with different IDs they do not.
//! - `stats` prints the driver's counters as one JSON line.
//! - `multicast` makes a multicast team of the listed GPUs of the node (all by default), binds
//!   SIZE bytes (default 2M) of each GPU's memory, stores a word through the team and checks
//!   every GPU got it, load-reduces each GPU's index + 1, and prints one JSON line
//!   (`{"gpus":4,"size":…,"stored":true,"load_reduce_u32":10,"address_base":…}`); with
//!   `--hold` it keeps everything until standard input ends, `exit` or SIGTERM.
//! - `churn` and `reader` are the fault-injection workload, with a line protocol of their own
//!   (the `workload` module's docs describe it).
//! - `gpus` prints each GPU as NVML's fabric info gives it to NCCL and NVSHMEM (UUID,
//!   clusterUuid, cliqueId, fabric probe state, health summary), as a table, or with `-j` as
//!   one JSON line each (also HBM, probe status, partition, health mask, fabric base address).
//!
//! With `--hold`, the memory stays mapped until standard input ends, a SIGTERM or SIGINT
//! arrives, or an `exit` line is read; it is then released and the command exits 0 (`import`
//! prints `holding` when it starts to hold). While holding, each line on standard input gets
//! one line of answer:
//! - `verify SEED` / `verify-write SEED`: `ok` if the memory holds the pattern of SEED (e.g.
//!   written by an importer), else `mismatch at OFFSET`;
//! - `write SEED`: writes the pattern of SEED, `written BYTES`;
//! - `release`: releases the memory but keeps running, `released`;
//! - anything else: `error: …`.
//!
//! Exit codes: 0 success; 1 a CUDA error (printed as `openimex-lab app: import failed:
//! CUDA_ERROR_NOT_PERMITTED (800): …`), a pattern mismatch or an unreadable handle file;
//! 2 a usage error.

use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::{Context, CuError, FabricHandleBytes, Mappable, Mapping, pattern};

mod gpus;
mod multicast;
mod workload;

#[derive(Debug, Parser)]
#[command(
    name = "openimex-lab app",
    about = "Create, export, import and check fabric memory through the node's GPU driver"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create memory, fill it with a pattern, export it and print the fabric handle.
    Export(ExportArgs),
    /// Import a fabric handle, map it, verify and/or write a pattern, release it.
    Import(ImportArgs),
    /// Print the driver's counters as one JSON line.
    Stats(NodeArgs),
    /// Export a new generation of memory again and again, writing a canary into each new
    /// allocation first (fault-injection workload; see `app churn --help`).
    Churn(workload::ChurnArgs),
    /// Import what `app churn` publishes and check it continuously (fault-injection workload).
    Reader(workload::ReaderArgs),
    /// Print the node's GPUs and their fabric probe (UUID, clusterUuid, cliqueId, state,
    /// health) as NVML reports them: a table, or one JSON object per line with -j.
    Gpus(gpus::GpusArgs),
    /// A multicast team of this node's GPUs: bind memory on each, store through the team and
    /// load-reduce, print the result as one JSON line (`--hold`: keep it until stdin ends).
    Multicast(multicast::MulticastArgs),
}

#[derive(Debug, Args)]
struct NodeArgs {
    /// The node's directory (holds dev/nvidiactl and dev/nvidia-caps-imex-channels/).
    #[arg(long, value_name = "DIR")]
    node_dir: PathBuf,
    /// Subscribe with this IMEX channel file instead of the first accessible one.
    #[arg(long, value_name = "FILE", conflicts_with = "no_channel")]
    channel: Option<PathBuf>,
    /// Subscribe to no IMEX channel.
    #[arg(long)]
    no_channel: bool,
}

#[derive(Debug, Args)]
struct ExportArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// GPU index on the node.
    #[arg(long, value_name = "N", default_value_t = 0)]
    gpu: u32,
    /// Bytes, or with a binary suffix: 4096, 64K, 4M, 1G.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    size: u64,
    /// Seed of the pattern to fill the memory with (decimal or 0x-hex).
    #[arg(long, value_name = "SEED", value_parser = parse_seed)]
    pattern: u64,
    /// Also write the handle to FILE (atomically).
    #[arg(long, value_name = "FILE")]
    handle_out: Option<PathBuf>,
    /// Keep the memory until stdin ends or SIGTERM; answer commands read from stdin.
    #[arg(long)]
    hold: bool,
}

#[derive(Debug, Args)]
struct ImportArgs {
    #[command(flatten)]
    node: NodeArgs,
    /// The fabric handle: 128 hex digits, or @FILE to read them from FILE (at most 4 KiB).
    #[arg(long, value_name = "HEX|@FILE")]
    handle: String,
    /// Check that the memory holds the pattern of SEED.
    #[arg(long, value_name = "SEED", value_parser = parse_seed)]
    verify: Option<u64>,
    /// Then write the pattern of SEED.
    #[arg(long, value_name = "SEED", value_parser = parse_seed)]
    write: Option<u64>,
    /// Keep the memory mapped until stdin ends or SIGTERM; answer commands read from stdin.
    #[arg(long)]
    hold: bool,
    /// Map the memory for this GPU of the node (cuMemSetAccess's device): the driver refuses
    /// a GPU whose cliqueId, bwMode or bwModeEpoch differs from the owner GPU's.
    #[arg(long, value_name = "N", default_value_t = 0)]
    gpu: u32,
    /// Exit without releasing the import (the driver cleans up as at process exit).
    #[arg(long)]
    no_release: bool,
    /// Bound on the wait for the import to complete, in seconds.
    #[arg(long, value_name = "SECS", default_value = "30", value_parser = parse_secs)]
    timeout: Duration,
    /// Import ID (below 2^48 - 1): imports of a handle with the same ID share one descriptor.
    #[arg(long, value_name = "ID", default_value = "0", value_parser = parse_import_id)]
    import_id: u64,
}

/// Why a command failed (exit code 1).
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("{what} failed: {err}")]
    Cuda { what: &'static str, err: CuError },
    #[error("verify failed: mismatch at {0}")]
    Mismatch(u64),
    #[error("{0}")]
    Io(String),
}

fn cuda(what: &'static str) -> impl FnOnce(CuError) -> Failure {
    move |err| Failure::Cuda { what, err }
}

/// The command line `openimex-lab app` parses, named `program` (for `help app` and the man
/// page: one definition).
pub fn command(program: &str) -> clap::Command {
    <Cli as clap::CommandFactory>::command().bin_name(program)
}

/// Runs `openimex-lab app` with `args` (including the program name, e.g. `openimex-lab app`, as
/// clap's `parse_from` takes them) and returns the exit code (see the module docs).
pub fn main(args: Vec<OsString>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let result = match cli.command {
        Command::Export(a) => export(&a),
        Command::Import(a) => import(&a),
        Command::Stats(node) => stats(&node),
        Command::Churn(a) => return workload::churn(&a),
        Command::Reader(a) => return workload::reader(&a),
        Command::Gpus(a) => gpus::gpus(&a),
        Command::Multicast(a) => multicast::multicast(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            let _ = writeln!(std::io::stderr(), "openimex-lab app: {f}");
            ExitCode::from(1)
        }
    }
}

fn open(node: &NodeArgs) -> Result<Context, Failure> {
    let ctx = if node.no_channel {
        Context::open_with_channel(&node.node_dir, None)
    } else if let Some(ch) = &node.channel {
        Context::open_with_channel(&node.node_dir, Some(ch))
    } else {
        Context::open(&node.node_dir)
    };
    ctx.map_err(cuda("open"))
}

/// One line on stdout, flushed; a closed stdout is not an error of ours.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn export(a: &ExportArgs) -> Result<(), Failure> {
    if a.hold {
        catch_termination();
    }
    let ctx = open(&a.node)?;
    let alloc = ctx.mem_create(a.gpu, a.size).map_err(cuda("create"))?;
    let mut mapping = ctx.map_on(&alloc, a.gpu).map_err(cuda("map"))?;
    pattern::fill(&mut mapping, a.pattern);
    let handle = ctx.export(&alloc).map_err(cuda("export"))?;
    if let Some(path) = &a.handle_out {
        write_atomically(path, &format!("{handle}\n")).map_err(|e| {
            Failure::Io(format!(
                "cannot write the handle to {}: {e}",
                path.display()
            ))
        })?;
    }
    say(&handle.to_hex());
    let mut held = Some((alloc, mapping));
    if a.hold {
        hold(&ctx, &mut held);
    }
    release(&ctx, held)
}

fn import(a: &ImportArgs) -> Result<(), Failure> {
    let text = match a.handle.strip_prefix('@') {
        Some(path) => read_handle_file(Path::new(path))?,
        None => a.handle.clone(),
    };
    let handle = FabricHandleBytes::from_hex(&text).map_err(cuda("import"))?;
    if a.hold {
        catch_termination();
    }
    let ctx = open(&a.node)?;
    let imported = ctx
        .import_with_id(&handle, a.import_id, a.timeout)
        .map_err(cuda("import"))?;
    let mut mapping = ctx.map_on(&imported, a.gpu).map_err(cuda("map"))?;
    let mut result = Ok(());
    if let Some(seed) = a.verify {
        match pattern::verify(&mapping, seed) {
            Ok(()) => say(&format!("verified {}", mapping.len())),
            Err(off) => {
                say(&format!("mismatch at {off}"));
                result = Err(Failure::Mismatch(off));
            }
        }
    }
    if let (Ok(()), Some(seed)) = (&result, a.write) {
        pattern::fill(&mut mapping, seed);
        say(&format!("written {}", mapping.len()));
    }
    let mut held = Some((imported, mapping));
    if result.is_ok() && a.hold {
        say("holding");
        hold(&ctx, &mut held);
    }
    if a.no_release {
        // Closing the context without a release: the driver frees the import as it does when
        // a process exits.
        return result;
    }
    release(&ctx, held)?;
    result
}

fn stats(node: &NodeArgs) -> Result<(), Failure> {
    let ctx = open(node)?;
    let s = ctx.stats().map_err(cuda("stats"))?;
    let line = serde_json::to_string(&s)
        .map_err(|e| Failure::Io(format!("cannot encode the stats: {e}")))?;
    say(&line);
    Ok(())
}

/// The most a handle file may hold: a handle is 128 hex digits, the rest is room for line
/// ends, spaces and a byte-order mark. Nothing longer is read (`@/dev/zero` ends here).
const HANDLE_FILE_MAX: u64 = 4096;

/// Reads a handle file (`--handle @FILE`), at most [`HANDLE_FILE_MAX`] bytes.
fn read_handle_file(path: &Path) -> Result<String, Failure> {
    use std::io::Read;
    let shown = path.display();
    let file = std::fs::File::open(path)
        .map_err(|e| Failure::Io(format!("cannot read the handle from {shown}: {e}")))?;
    let mut bytes = Vec::new();
    file.take(HANDLE_FILE_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Failure::Io(format!("cannot read the handle from {shown}: {e}")))?;
    if bytes.len() as u64 > HANDLE_FILE_MAX {
        return Err(Failure::Io(format!(
            "cannot read the handle from {shown}: it holds more than {HANDLE_FILE_MAX} bytes \
             (reading stopped there), and a handle file holds one fabric handle of 128 hex \
             digits; pass the file `openimex-lab app export --handle-out` wrote, or the handle itself"
        )));
    }
    String::from_utf8(bytes).map_err(|_| {
        Failure::Io(format!(
            "cannot read the handle from {shown}: it is not text, and a handle file holds one \
             fabric handle of 128 hex digits; pass the file `openimex-lab app export --handle-out` \
             wrote, or the handle itself"
        ))
    })
}

/// Unmaps, then releases, what is still held.
fn release<M: Mappable>(ctx: &Context, held: Option<(M, Mapping)>) -> Result<(), Failure> {
    if let Some((mem, mapping)) = held {
        drop(mapping);
        ctx.release(mem).map_err(cuda("release"))?;
    }
    Ok(())
}

/// Writes `path` through a temporary file in the same directory renamed into place, so a
/// reader never sees half a handle.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

static TERMINATED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_termination(_: nix::libc::c_int) {
    TERMINATED.store(true, Ordering::SeqCst);
}

/// SIGTERM and SIGINT set [`TERMINATED`] (once: a second one kills as usual, for a release
/// that hangs on a dead daemon).
fn catch_termination() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_termination),
        SaFlags::SA_RESTART | SaFlags::SA_RESETHAND,
        SigSet::empty(),
    );
    for sig in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe, and it
        // replaces no handler that other code relies on (this is a command's own process).
        let _ = unsafe { sigaction(sig, &action) };
    }
}

/// The lines of standard input, read on a thread of their own.
fn stdin_lines() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The next line of `rx`; `None` once standard input ended or a termination signal came.
fn next_line(rx: &mpsc::Receiver<String>) -> Option<String> {
    loop {
        if TERMINATED.load(Ordering::SeqCst) {
            return None;
        }
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => return Some(line),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// Answers commands on stdin until it ends, `exit`, or a termination signal.
fn hold<M: Mappable>(ctx: &Context, held: &mut Option<(M, Mapping)>) {
    let rx = stdin_lines();
    while let Some(line) = next_line(&rx) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let reply = match words.as_slice() {
            [] => continue,
            ["exit"] => return,
            ["release"] => match held.take() {
                Some((mem, mapping)) => {
                    drop(mapping);
                    match ctx.release(mem) {
                        Ok(()) => "released".to_string(),
                        Err(e) => format!("error: release failed: {e}"),
                    }
                }
                None => "error: already released".to_string(),
            },
            [cmd @ ("verify" | "verify-write" | "write"), seed] => {
                match (held.as_mut(), parse_seed(seed)) {
                    (None, _) => "error: released".to_string(),
                    (_, Err(e)) => format!("error: {e}"),
                    (Some((_, mapping)), Ok(seed)) if *cmd == "write" => {
                        pattern::fill(mapping, seed);
                        format!("written {}", mapping.len())
                    }
                    (Some((_, mapping)), Ok(seed)) => match pattern::verify(mapping, seed) {
                        Ok(()) => "ok".to_string(),
                        Err(off) => format!("mismatch at {off}"),
                    },
                }
            }
            _ => format!(
                "error: unknown command {line:?} (verify SEED, verify-write SEED, write SEED, release, exit)"
            ),
        };
        say(&reply);
    }
}

/// Parses a size: plain bytes, or a number with a binary suffix K, M, G or T (also `KiB`,
/// `KB`, any case): `4M` is 4 MiB.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bytes, or a number with K, M, G or T)"))?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "{s:?}: unknown size suffix {suffix:?} (K, M, G or T)"
            ));
        }
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Parses a pattern seed: decimal, or hex with `0x`.
pub fn parse_seed(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| format!("{s:?} is not a seed (a decimal or 0x-hex 64-bit number)"))
}

/// `--import-id`: decimal or 0x-hex, below 2^48 - 1 (the driver reserves that one).
fn parse_import_id(s: &str) -> Result<u64, String> {
    let limit = openimex_simproto::proto::IMPORT_ID_MAX;
    parse_seed(s).ok().filter(|&id| id < limit).ok_or_else(|| {
        format!("{s:?} is not an import ID (a decimal or 0x-hex number below 2^48 - 1 = {limit})")
    })
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .and_then(|v| Duration::try_from_secs_f64(v).ok())
        .ok_or_else(|| format!("{s:?} is not a number of seconds"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4M"), Ok(4 << 20));
        assert_eq!(parse_size("4m"), Ok(4 << 20));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("2 GB"), Ok(2 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("0"), Ok(0));
        for bad in ["", "M", "4X", "-1", "1.5M", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn seeds_and_timeouts_parse() {
        assert_eq!(parse_seed("42"), Ok(42));
        assert_eq!(parse_seed("0xff"), Ok(255));
        assert!(parse_seed("x").is_err());
        assert_eq!(parse_secs("0.5"), Ok(Duration::from_millis(500)));
        assert!(parse_secs("-1").is_err());
    }

    #[test]
    fn handle_files_are_read_with_a_bound() {
        let dir = std::env::temp_dir().join(format!("openimex-client-hf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("ok");
        let handle = "ab".repeat(64);
        std::fs::write(&ok, format!("{handle}\n")).unwrap();
        assert_eq!(read_handle_file(&ok).unwrap().trim(), handle);
        let big = dir.join("big");
        std::fs::write(&big, vec![b'0'; HANDLE_FILE_MAX as usize + 1]).unwrap();
        let msg = read_handle_file(&big).unwrap_err().to_string();
        assert!(msg.contains("more than 4096 bytes"), "{msg}");
        assert!(msg.contains(&big.display().to_string()), "{msg}");
        let binary = dir.join("binary");
        std::fs::write(&binary, [0xff, 0xfe, 0]).unwrap();
        assert!(
            read_handle_file(&binary)
                .unwrap_err()
                .to_string()
                .contains("not text")
        );
        // An endless file stops at the bound.
        let msg = read_handle_file(Path::new("/dev/zero"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("more than 4096 bytes"), "{msg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn handle_files_are_replaced_whole() {
        let dir = std::env::temp_dir().join(format!("openimex-client-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("handle");
        write_atomically(&path, "one\n").unwrap();
        write_atomically(&path, "two\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two\n");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary file is left"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
