//! The files the driver makes under its node directory at bind, the node directory being the
//! driver root (`openimex_simproto::node_dir`): the GPUs' device files, the fabric-imex-mgmt
//! capability's device file and procfs file, the version banner and `/proc/devices`.
//!
//! The device files are regular files (the simulation has no character devices): the driver
//! recognises a descriptor of one by its (device, inode), as the kernel recognises the file
//! operations and the minor. The capability file is created mode 0400 and owned by the
//! driver's user, as nvidia-modprobe creates `/dev/nvidia-caps/nvidia-cap<minor>` root-only;
//! an existing one keeps its mode and owner, which are the node's access policy (who may open
//! it may open the IMEX session). The procfs files are rewritten at every bind, as the kernel
//! module renders them.
//!
//! `/proc/devices` lists `195 nvidia` and `195 nvidiactl` (the real fixed major,
//! `NV_MAJOR_DEVICE_NUMBER`) and two dynamic majors the simulation picks:
//! [`NVIDIA_CAPS_MAJOR`] and [`IMEX_CHANNELS_MAJOR`] (on a real node the kernel hands out
//! dynamic majors from 511 down; these are plausible values, nothing reads them but tools
//! that resolve the names).

use std::fs;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use openimex_simproto::node_dir::{
    IMEX_CAP_MINOR, IMEX_CAP_PROC_FILE, PROC_DEVICES_FILE, VERSION_PROC_FILE, cap_device_path,
    cap_proc_text, gpu_device_path,
};

/// The character major of `/dev/nvidia*` and `/dev/nvidiactl` (`NV_MAJOR_DEVICE_NUMBER`).
pub const NVIDIA_MAJOR: u32 = 195;
/// The dynamic major the simulation gives `nvidia-caps`.
pub const NVIDIA_CAPS_MAJOR: u32 = 509;
/// The dynamic major the simulation gives `nvidia-caps-imex-channels`.
pub const IMEX_CHANNELS_MAJOR: u32 = 508;
/// The capability device's mode (`DeviceFileMode` of the procfs file, 0400).
pub const IMEX_CAP_MODE: u32 = 0o400;
/// A GPU device file's mode (0666, as `/dev/nvidiaN` on a real node).
const GPU_DEVICE_MODE: u32 = 0o666;

/// The module's version banner (`nv_procfs_read_version` printing `pNVRM_ID`, built by
/// `GENERATE_NVIDSTRING` in `utils.mk`).
pub fn version_banner(version: &str) -> String {
    format!(
        "NVRM version: NVIDIA UNIX Open Kernel Module for {}  {version}  Release Build  \
         (openimex@simgpu)  Thu Jan  1 00:00:00 UTC 1970\nGCC version:  gcc version 12.2.0 \
         (openimex simulated driver)\n",
        std::env::consts::ARCH
    )
}

/// `/proc/devices` as the simulated node shows it.
pub fn proc_devices_text() -> String {
    format!(
        "Character devices:\n  1 mem\n  4 /dev/vc/0\n  5 /dev/tty\n{NVIDIA_MAJOR} nvidia\n\
         {NVIDIA_MAJOR} nvidiactl\n{IMEX_CHANNELS_MAJOR} nvidia-caps-imex-channels\n\
         {NVIDIA_CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n  7 loop\n  8 sd\n"
    )
}

/// Creates the device and procfs files of a node of `gpus` GPUs running driver `version`.
/// Returns the capability device's path.
pub fn create(root: &Path, gpus: u32, version: &str) -> io::Result<PathBuf> {
    for n in 0..gpus {
        create_keep(&gpu_device_path(root, n), GPU_DEVICE_MODE)?;
    }
    let cap = cap_device_path(root, IMEX_CAP_MINOR);
    create_keep(&cap, IMEX_CAP_MODE)?;
    write_file(
        &root.join(IMEX_CAP_PROC_FILE),
        &cap_proc_text(IMEX_CAP_MINOR, IMEX_CAP_MODE),
    )?;
    write_file(&root.join(VERSION_PROC_FILE), &version_banner(version))?;
    write_file(&root.join(PROC_DEVICES_FILE), &proc_devices_text())?;
    Ok(cap)
}

/// Creates `path` with `mode` if it does not exist (an existing file is kept as it is).
fn create_keep(path: &Path, mode: u32) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
    {
        // The umask may have taken bits off.
        Ok(_) => fs::set_permissions(path, fs::Permissions::from_mode(mode)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Writes `text` to `path` (its directory created), replacing it whole.
fn write_file(path: &Path, text: &str) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp-openimex");
    fs::write(&tmp, text)?;
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use openimex_simproto::node_dir::{parse_cap_minor, parse_proc_devices_major};

    #[test]
    fn the_files_read_back_as_a_real_nodes_tools_parse_them() {
        let dir = openimex_harness::ScratchDir::new("simgpu-node-files").unwrap();
        let root = dir.path();
        let cap = create(root, 2, "595.45.04").unwrap();
        assert!(gpu_device_path(root, 1).is_file());
        assert!(!gpu_device_path(root, 2).exists());
        let mode = fs::metadata(&cap).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o400, "root-only, as nvidia-modprobe creates it");
        let proc = fs::read_to_string(root.join(IMEX_CAP_PROC_FILE)).unwrap();
        assert_eq!(parse_cap_minor(&proc), Some(IMEX_CAP_MINOR));
        let devices = fs::read_to_string(root.join(PROC_DEVICES_FILE)).unwrap();
        assert_eq!(parse_proc_devices_major(&devices, "nvidiactl"), Some(195));
        assert_eq!(
            parse_proc_devices_major(&devices, "nvidia-caps-imex-channels"),
            Some(IMEX_CHANNELS_MAJOR)
        );
        let banner = fs::read_to_string(root.join(VERSION_PROC_FILE)).unwrap();
        let first = banner.lines().next().unwrap();
        // The version is the field after the architecture, two spaces either side, as
        // nvidia-smi and the container toolkit cut it out.
        let version = first
            .split("  ")
            .nth(1)
            .expect("NVRM version: … for ARCH  VERSION  …");
        assert_eq!(version, "595.45.04");
        assert!(first.starts_with("NVRM version: NVIDIA UNIX Open Kernel Module for "));
        // A second bind keeps an administrator's mode on the capability.
        fs::set_permissions(&cap, fs::Permissions::from_mode(0o440)).unwrap();
        create(root, 2, "580.65.06").unwrap();
        let mode = fs::metadata(&cap).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o440);
    }
}
