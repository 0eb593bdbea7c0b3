//! What the daemon would find on this host, step by step, for `openimex driver-check`: every
//! step of the start is tried and reported on its own, so an operator (or a Slurm prolog)
//! sees all that is wrong at once, not the first failure only.

use std::path::{Path, PathBuf};

use openimex_core::NodeId;
use openimex_rmabi::layout_for;

use super::files;
use super::transport::Ctl;
use super::{Nvidia, rm};
use crate::{Driver, DriverError, GpuFabric};

/// One finding: what was looked at, whether it is usable, and the detail (or the fix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Usable as the daemon needs it.
    pub ok: bool,
    /// What was found, or what is wrong and how to fix it.
    pub detail: String,
}

impl Finding {
    fn ok(detail: impl Into<String>) -> Self {
        Self {
            ok: true,
            detail: detail.into(),
        }
    }

    fn bad(detail: impl Into<String>) -> Self {
        Self {
            ok: false,
            detail: detail.into(),
        }
    }
}

/// Whether an IMEX session could be opened now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionCheck {
    /// Not tried: an earlier step failed.
    NotTried,
    /// Not asked for ([`check`]'s `open_session`): opening one is not free of effects.
    NotAsked,
    /// Opened and closed at once: a daemon could take it.
    Available,
    /// NV_ERR_IN_USE: another daemon holds the node's session.
    HeldByAnotherDaemon,
    /// Refused for another reason.
    Refused(String),
}

/// The report of `openimex driver-check`.
#[derive(Debug, Clone)]
pub struct Report {
    /// The driver root looked under.
    pub root: PathBuf,
    /// `<root>/dev/nvidiactl`, and which transport it is ("kernel", "sim").
    pub ctl: Finding,
    /// The transport, when the control device opened.
    pub transport: Option<&'static str>,
    /// The version the driver reports (version check, else the procfs banner).
    pub version: Option<String>,
    /// Whether this build knows that version's layouts.
    pub version_supported: Finding,
    /// The capability's procfs file (its minor).
    pub cap_file: Finding,
    /// The capability's device node.
    pub cap_node: Finding,
    /// `nvidia-caps-imex-channels` in `<root>/proc/devices`.
    pub channels_major: Option<u32>,
    /// The channel nodes present.
    pub channels: Vec<u32>,
    /// The GPUs and their fabric probes.
    pub gpus: Vec<GpuFabric>,
    /// Whether a session could be opened.
    pub session: SessionCheck,
}

impl Report {
    /// Whether a daemon could start on this host now (the exit status of `driver-check`):
    /// everything it needs is there, and the session was available if it was tried.
    pub fn daemon_could_start(&self) -> bool {
        self.ctl.ok
            && self.version_supported.ok
            && self.cap_file.ok
            && self.cap_node.ok
            && matches!(
                self.session,
                SessionCheck::Available | SessionCheck::NotAsked
            )
    }
}

/// Looks at everything under `root`. With `open_session` it also opens an IMEX session (as
/// node 0) and closes it at once when no daemon holds it, to learn whether one could be
/// opened. That is not free of effects, so it is asked for: creating a session re-enables the
/// node's fabric allocations (`imexsessionapiConstruct` → `fabricEnableMemAlloc`), which the
/// kernel disabled if the last daemon died holding exports, until a daemon that recovers the
/// domain starts (`docs/reference/driver-interface.md` §4).
pub fn check(root: &Path, open_session: bool) -> Report {
    let mut r = Report {
        root: root.to_path_buf(),
        ctl: Finding::bad("not tried"),
        transport: None,
        version: files::banner_version(root),
        version_supported: Finding::bad("not tried"),
        cap_file: Finding::bad("not tried"),
        cap_node: Finding::bad("not tried"),
        channels_major: files::channels_major(root),
        channels: files::channels(root),
        gpus: Vec::new(),
        session: SessionCheck::NotTried,
    };
    let minor = match files::imex_cap_minor(root) {
        Ok(m) => {
            r.cap_file = Finding::ok(format!("DeviceFileMinor {m}"));
            Some(m)
        }
        Err(e) => {
            r.cap_file = Finding::bad(e.to_string());
            None
        }
    };
    if let Some(m) = minor {
        r.cap_node = match files::open_imex_cap(root, m) {
            Ok((path, _)) => Finding::ok(path.display().to_string()),
            Err(e) => Finding::bad(e.to_string()),
        };
    }
    let ctl_path = files::ctl_path(root);
    match Ctl::open(&ctl_path) {
        Ok(ctl) => {
            r.ctl = Finding::ok(format!("{} ({})", ctl_path.display(), ctl.kind()));
            r.transport = Some(ctl.kind());
            match rm::query_version(&ctl) {
                Ok(v) => r.version = Some(v),
                Err(e) => r.version_supported = Finding::bad(format!("version check: {e}")),
            }
        }
        Err(e) => r.ctl = Finding::bad(format!("{e}; {}", super::start::INSTALL)),
    }
    if let Some(v) = &r.version {
        r.version_supported = match layout_for(v) {
            Ok(layout) => Finding::ok(format!("{v} (layout {})", layout.name())),
            Err(e) => Finding::bad(e.to_string()),
        };
    }
    if !(r.ctl.ok && r.version_supported.ok && r.cap_node.ok) {
        return r;
    }
    match Nvidia::open(root) {
        Ok(nv) => {
            r.session = SessionCheck::NotAsked;
            match nv.gpu_fabric() {
                Ok(g) => r.gpus = g,
                Err(e) => r.session = SessionCheck::Refused(format!("fabric probe: {e}")),
            }
            if open_session && r.session == SessionCheck::NotAsked {
                r.session = match nv.open_session(NodeId(0)) {
                    Ok(_) => SessionCheck::Available,
                    Err(DriverError::SessionBusy) => SessionCheck::HeldByAnotherDaemon,
                    Err(e) => SessionCheck::Refused(e.to_string()),
                };
            }
        }
        Err(e) => r.session = SessionCheck::Refused(e.to_string()),
    }
    r
}
