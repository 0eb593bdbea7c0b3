//! The driver's files under a driver root (`OPENIMEX_DRIVER_ROOT`, default `/`): the control
//! device, the fabric-imex-mgmt capability (its procfs file and its device node), the version
//! banner, the char device majors and the IMEX channel nodes. Every path the `nvidia` backend
//! opens is made here, and every error names the file and what to do about it.

use std::fs::OpenOptions;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use openimex_simproto::node_dir::{
    IMEX_CAP_PROC_FILE, PROC_DEVICES_FILE, VERSION_PROC_FILE, cap_device_path, channel_files,
    parse_cap_minor, parse_proc_devices_major,
};

/// The environment variable naming the driver root when the config does not.
pub const DRIVER_ROOT_ENV: &str = "OPENIMEX_DRIVER_ROOT";

/// The char device name of the IMEX channels in `/proc/devices`.
pub const CHANNELS_DEVICE: &str = "nvidia-caps-imex-channels";

/// The driver root: `configured`, else `OPENIMEX_DRIVER_ROOT`, else `/`.
pub fn driver_root(configured: Option<&Path>) -> PathBuf {
    configured
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(DRIVER_ROOT_ENV).map(PathBuf::from))
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// `<root>/dev/nvidiactl`.
pub fn ctl_path(root: &Path) -> PathBuf {
    openimex_simproto::node_dir::socket_path(root)
}

/// Why a driver file could not be used, with the fix.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}; {fix}", path.display())]
pub struct FileError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: String,
    /// What the operator can do.
    pub fix: String,
}

fn read(path: &Path, fix: &str) -> Result<String, FileError> {
    std::fs::read_to_string(path).map_err(|e| FileError {
        path: path.to_path_buf(),
        problem: if e.kind() == std::io::ErrorKind::NotFound {
            "does not exist".into()
        } else {
            format!("cannot be read: {e}")
        },
        fix: fix.into(),
    })
}

/// The fabric-imex-mgmt capability's minor, from its procfs file.
pub fn imex_cap_minor(root: &Path) -> Result<u32, FileError> {
    let path = root.join(IMEX_CAP_PROC_FILE);
    let fix = "load an NVIDIA driver with IMEX support (550.40.07 or later, the open or \
               proprietary kernel module); on a container, point OPENIMEX_DRIVER_ROOT at the \
               host's driver root";
    let text = read(&path, fix)?;
    parse_cap_minor(&text).ok_or_else(|| FileError {
        path,
        problem: format!("no `DeviceFileMinor: N` line in {text:?}"),
        fix: fix.into(),
    })
}

/// The capability's device node, `<root>/dev/nvidia-caps/nvidia-cap<minor>`, opened read-only
/// (what `osRmCapAcquire` takes). Missing, the error gives the `mknod` line that makes it.
pub fn open_imex_cap(root: &Path, minor: u32) -> Result<(PathBuf, OwnedFd), FileError> {
    let path = cap_device_path(root, minor);
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_CLOEXEC)
        .open(&path);
    match opened {
        Ok(f) => Ok((path, f.into())),
        Err(e) => {
            let major = caps_major(root);
            let (problem, fix) = match e.kind() {
                std::io::ErrorKind::NotFound => (
                    "the fabric-imex-mgmt capability's device node does not exist".to_string(),
                    format!(
                        "create it: `nvidia-modprobe -f {}` or `mkdir -p {dir} && mknod -m 400 {} c {} {minor}`",
                        root.join(IMEX_CAP_PROC_FILE).display(),
                        path.display(),
                        major.map_or_else(
                            || "<major of nvidia-caps in /proc/devices>".to_string(),
                            |m| m.to_string()
                        ),
                        dir = path
                            .parent()
                            .map(|p| p.display().to_string())
                            .unwrap_or_default(),
                    ),
                ),
                std::io::ErrorKind::PermissionDenied => (
                    "permission denied (the capability is root's)".to_string(),
                    "run the daemon as root (or as the user the capability's device node \
                     belongs to)"
                        .to_string(),
                ),
                _ => (
                    format!("cannot be opened: {e}"),
                    "check the device node".to_string(),
                ),
            };
            Err(FileError { path, problem, fix })
        }
    }
}

/// Every GPU device file `<root>/dev/nvidiaN`, opened read-write, lowest N first.
pub fn open_gpu_files(root: &Path) -> Result<Vec<OwnedFd>, FileError> {
    let dev = root.join("dev");
    let mut minors: Vec<u32> = std::fs::read_dir(&dev)
        .map_err(|e| FileError {
            path: dev.clone(),
            problem: format!("cannot be listed: {e}"),
            fix: "check the driver root".into(),
        })?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name();
            let digits = name.to_str()?.strip_prefix("nvidia")?;
            (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| digits.parse().ok())
                .flatten()
        })
        .collect();
    minors.sort_unstable();
    minors
        .into_iter()
        .map(|n| {
            let path = openimex_simproto::node_dir::gpu_device_path(root, n);
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(nix::libc::O_CLOEXEC)
                .open(&path)
                .map(OwnedFd::from)
                .map_err(|e| FileError {
                    problem: format!("cannot be opened: {e}"),
                    fix: "run the daemon as root, or give its user access to the GPU device files"
                        .into(),
                    path,
                })
        })
        .collect()
}

/// The `nvidia-caps` major in `<root>/proc/devices`.
pub fn caps_major(root: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(root.join(PROC_DEVICES_FILE)).ok()?;
    parse_proc_devices_major(&text, "nvidia-caps")
}

/// Whether the driver under `root` is the simulated one speaking the RM interface: its control
/// node is a unix socket, not the kernel's character device (`transport`). Its channels are
/// then regular files, which it recognises; a character device of the major its
/// `/proc/devices` names would reach no driver on the host (ENXIO on open).
pub fn is_simulated(root: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt as _;
    std::fs::metadata(ctl_path(root)).is_ok_and(|m| m.file_type().is_socket())
}

/// The IMEX channels' major in `<root>/proc/devices`.
pub fn channels_major(root: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(root.join(PROC_DEVICES_FILE)).ok()?;
    parse_proc_devices_major(&text, CHANNELS_DEVICE)
}

/// The IMEX channel nodes present under the root, lowest first.
pub fn channels(root: &Path) -> Vec<u32> {
    channel_files(root)
        .map(|found| found.into_iter().map(|(n, _)| n).collect())
        .unwrap_or_default()
}

/// The version in the module's banner (`NVRM version: … Kernel Module for x86_64  V  …`):
/// the first word that looks like a driver version.
pub fn banner_version(root: &Path) -> Option<String> {
    let text = std::fs::read_to_string(root.join(VERSION_PROC_FILE)).ok()?;
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| {
            w.split('.').count() >= 2
                && w.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "openimex-driver-files-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_missing_capability_file_names_it_and_how_to_get_one() {
        let r = root("nocap");
        let e = imex_cap_minor(&r).unwrap_err().to_string();
        assert!(
            e.contains("capabilities/fabric-imex-mgmt") && e.contains("does not exist"),
            "{e}"
        );
        std::fs::remove_dir_all(&r).unwrap();
    }

    #[test]
    fn a_missing_device_node_gives_the_mknod_line_with_the_major() {
        let r = root("nonode");
        std::fs::create_dir_all(r.join("proc")).unwrap();
        std::fs::write(
            r.join(PROC_DEVICES_FILE),
            "Character devices:\n195 nvidia\n237 nvidia-caps\n238 nvidia-caps-imex-channels\n\nBlock devices:\n",
        )
        .unwrap();
        let e = open_imex_cap(&r, 512).unwrap_err().to_string();
        assert!(
            e.contains("nvidia-cap512") && e.contains("mknod -m 400") && e.contains("c 237 512"),
            "{e}"
        );
        assert_eq!(channels_major(&r), Some(238));
        std::fs::remove_dir_all(&r).unwrap();
    }

    #[test]
    fn the_banner_gives_the_version() {
        let r = root("banner");
        std::fs::create_dir_all(r.join("proc/driver/nvidia")).unwrap();
        std::fs::write(
            r.join(VERSION_PROC_FILE),
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  595.45.04  Release Build  (dvs-builder@U16)  Tue Jan 1 2026\nGCC version:  gcc version 12.2.0\n",
        )
        .unwrap();
        assert_eq!(banner_version(&r).as_deref(), Some("595.45.04"));
        std::fs::remove_dir_all(&r).unwrap();
    }
}
