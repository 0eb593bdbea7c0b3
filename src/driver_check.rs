//! `openimex driver-check [-j] [--driver-root DIR]`: what the daemon would find on this host —
//! the driver version and whether this build supports it, `/dev/nvidiactl`, the GPUs and their
//! fabric probes, the fabric-imex-mgmt capability (its procfs file and device node), the IMEX
//! channels' major and the channel nodes present, and whether an IMEX session could be opened
//! now (or another daemon holds it). For operators and prologs: the exit status is 0 only when
//! a daemon could start.

use std::path::PathBuf;
use std::process::ExitCode;

use openimex_driver::nvidia::check::{Finding, Report, SessionCheck, check};
use openimex_driver::nvidia::files::driver_root;
use serde_json::json;

/// Arguments of `openimex driver-check`.
#[derive(Debug, clap::Args)]
pub struct DriverCheckArgs {
    /// Print JSON.
    #[arg(short = 'j', long = "json")]
    json: bool,
    /// The driver root [default: $OPENIMEX_DRIVER_ROOT, else /]; a simulated tray's node
    /// directory reports the simulated node.
    #[arg(long, value_name = "DIR")]
    driver_root: Option<PathBuf>,
    /// Also open an IMEX session (as node 0) and close it at once, to learn whether one could
    /// be opened now or another daemon holds it. Not by default: creating a session
    /// re-enables fabric allocations the kernel disabled after a daemon died holding exports.
    #[arg(long)]
    open_session: bool,
}

/// Runs the check and prints it; the exit status says whether a daemon could start.
pub(crate) fn run(args: &DriverCheckArgs) -> ExitCode {
    let report = check(&driver_root(args.driver_root.as_deref()), args.open_session);
    if args.json {
        println!("{:#}", to_json(&report));
    } else {
        print!("{}", to_text(&report));
    }
    if report.daemon_could_start() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// What the report says of a session not asked for.
const NOT_ASKED: &str = "not opened (--open-session opens one and closes it at once; it \
    re-enables fabric allocations the kernel disabled after a daemon died holding exports)";

fn session_json(s: &SessionCheck) -> serde_json::Value {
    match s {
        SessionCheck::NotTried => json!({"state": "NOT_TRIED"}),
        SessionCheck::NotAsked => json!({"state": "NOT_ASKED", "detail": NOT_ASKED}),
        SessionCheck::Available => json!({"state": "AVAILABLE"}),
        SessionCheck::HeldByAnotherDaemon => json!({"state": "HELD_BY_ANOTHER_DAEMON"}),
        SessionCheck::Refused(why) => json!({"state": "REFUSED", "detail": why}),
    }
}

fn finding(f: &Finding) -> serde_json::Value {
    json!({"ok": f.ok, "detail": f.detail})
}

fn to_json(r: &Report) -> serde_json::Value {
    json!({
        "driverRoot": r.root.display().to_string(),
        "daemonCouldStart": r.daemon_could_start(),
        "nvidiactl": finding(&r.ctl),
        "transport": r.transport,
        "version": r.version,
        "versionSupported": finding(&r.version_supported),
        "capabilityFile": finding(&r.cap_file),
        "capabilityDevice": finding(&r.cap_node),
        "channelMajor": r.channels_major,
        "channels": r.channels,
        "gpus": r.gpus.iter().map(|g| json!({
            "gpu": g.gpu,
            "state": g.state,
            "clusterUuid": g.cluster_uuid,
            "partitionId": g.partition_id,
            "cliqueId": g.clique_id,
            "healthMask": g.health_mask,
            "healthSummary": g.health_summary,
        })).collect::<Vec<_>>(),
        "session": session_json(&r.session),
    })
}

fn mark(ok: bool) -> &'static str {
    if ok { "ok  " } else { "FAIL" }
}

fn to_text(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "driver root        {}", r.root.display());
    let _ = writeln!(out, "{} nvidiactl      {}", mark(r.ctl.ok), r.ctl.detail);
    let _ = writeln!(
        out,
        "{} version        {}",
        mark(r.version_supported.ok),
        r.version_supported.detail
    );
    let _ = writeln!(
        out,
        "{} capability     {}",
        mark(r.cap_file.ok),
        r.cap_file.detail
    );
    let _ = writeln!(
        out,
        "{} cap device     {}",
        mark(r.cap_node.ok),
        r.cap_node.detail
    );
    let _ = writeln!(
        out,
        "     channels       major {}, present: {}",
        r.channels_major
            .map_or_else(|| "none".to_string(), |m| m.to_string()),
        if r.channels.is_empty() {
            "none".to_string()
        } else {
            r.channels
                .iter()
                .map(|c| format!("channel{c}"))
                .collect::<Vec<_>>()
                .join(" ")
        }
    );
    for g in &r.gpus {
        let _ = writeln!(
            out,
            "     GPU {}          probe {} cluster {} clique {} health {}",
            g.gpu,
            g.state,
            if g.cluster_uuid.is_empty() {
                "-"
            } else {
                &g.cluster_uuid
            },
            g.clique_id,
            if g.health_summary.is_empty() {
                "-"
            } else {
                &g.health_summary
            }
        );
    }
    let (ok, what) = match &r.session {
        SessionCheck::NotTried => (false, "not tried (see above)".to_string()),
        SessionCheck::NotAsked => (true, NOT_ASKED.to_string()),
        SessionCheck::Available => (true, "could be opened now".to_string()),
        SessionCheck::HeldByAnotherDaemon => (
            false,
            "held by another daemon (NV_ERR_IN_USE): stop it before starting one".to_string(),
        ),
        SessionCheck::Refused(why) => (false, format!("refused: {why}")),
    };
    let _ = writeln!(out, "{} IMEX session   {what}", mark(ok));
    let _ = writeln!(
        out,
        "{}",
        if r.daemon_could_start() {
            "a daemon could start on this host"
        } else {
            "a daemon could NOT start on this host"
        }
    );
    out
}
