//! The NVLink domain's simulated Fabric Manager (`openimex-lab fabric serve`) for a test cluster:
//! started before the trays' drivers (or after, to show them waiting), killed -9 and
//! restarted, and operated through its control socket with `openimex-lab fabric …`.
//!
//! The trays of a cluster are the topology's first compute trays: node `i` is the tray at slot
//! `i`, its driver started with `--fabric-manager` ([`crate::ClusterSpec::from_topology`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::HarnessError;
use crate::gpu::{append_log, spawn_ready};
use crate::process::run_with_timeout;

/// Time limit of one `openimex-lab fabric …` operator command.
pub const FABRIC_CMD_TIMEOUT: Duration = Duration::from_secs(20);

/// Which FM to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricManagerSpec {
    /// A topology preset (`--topology`), or a topology file (`--file`) when `file` is set.
    pub topology: String,
    /// A topology file instead of the preset.
    pub file: Option<PathBuf>,
    /// Partitions at start (`--partitions`).
    pub partitions: usize,
}

impl FabricManagerSpec {
    /// The preset `name`, one partition.
    pub fn preset(name: &str) -> Self {
        Self {
            topology: name.to_owned(),
            file: None,
            partitions: 1,
        }
    }
}

/// A running FM process, killed on drop.
#[derive(Debug)]
pub struct FabricManager {
    child: Option<Child>,
    binary: PathBuf,
    fabric_dir: PathBuf,
    log: PathBuf,
    spec: FabricManagerSpec,
}

impl FabricManager {
    /// Starts `binary fabric serve` on `fabric_dir` (stderr appended to `log`) and waits for
    /// its `ready` line.
    pub fn start(
        binary: &Path,
        fabric_dir: &Path,
        log: &Path,
        spec: &FabricManagerSpec,
    ) -> Result<Self, HarnessError> {
        let mut fm = Self {
            child: None,
            binary: binary.to_owned(),
            fabric_dir: fabric_dir.to_owned(),
            log: log.to_owned(),
            spec: spec.clone(),
        };
        fm.restart()?;
        Ok(fm)
    }

    /// Starts the FM again (after [`FabricManager::kill9`]); a no-op while it runs.
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        if let Some(c) = self.child.as_mut()
            && matches!(c.try_wait(), Ok(None))
        {
            return Ok(());
        }
        std::fs::create_dir_all(&self.fabric_dir).map_err(HarnessError::io(
            "create the fabric directory",
            &self.fabric_dir,
            "check that the cluster directory is writable",
        ))?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("fabric")
            .arg("serve")
            .arg("--fabric-dir")
            .arg(&self.fabric_dir);
        match &self.spec.file {
            Some(f) => cmd.arg("--file").arg(f),
            None => cmd.arg("--topology").arg(&self.spec.topology),
        };
        cmd.arg("--partitions")
            .arg(self.spec.partitions.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(append_log(&self.log)?);
        self.child = Some(spawn_ready(
            cmd,
            &self.binary,
            &self.log,
            "start the Fabric Manager",
        )?);
        Ok(())
    }

    /// SIGTERMs the FM and waits up to `timeout` for it (SIGKILL after that): its exit
    /// status, `None` if it was not running or had to be killed.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id()).unwrap_or(i32::MAX));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        match crate::process::wait_timeout(&mut c, timeout) {
            Some(s) => Some(s),
            None => {
                let _ = c.kill();
                let _ = c.wait();
                None
            }
        }
    }

    /// SIGKILLs the FM (its socket files stay behind, as after a crash).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs `openimex-lab fabric ARGS --control <socket>` (e.g. `["partition", "split", "2"]`).
    pub fn command(&self, args: &[&str]) -> Result<Output, HarnessError> {
        Self::command_at(&self.binary, &self.fabric_dir, args)
    }

    /// Runs `binary fabric ARGS --fabric-dir DIR`: an operator command on the FM serving
    /// `fabric_dir`, whether or not this harness started it.
    pub fn command_at(
        binary: &Path,
        fabric_dir: &Path,
        args: &[&str],
    ) -> Result<Output, HarnessError> {
        let mut cmd = Command::new(binary);
        cmd.arg("fabric")
            .args(args)
            .arg("--fabric-dir")
            .arg(fabric_dir);
        run_with_timeout(&mut cmd, FABRIC_CMD_TIMEOUT)
    }

    /// The FM's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for FabricManager {
    fn drop(&mut self) {
        self.kill9();
    }
}
