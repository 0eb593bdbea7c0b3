//! A node's directory, as the simulation lays it out: what `/` is on a real node for the files
//! the driver makes, so that a node directory is a *driver root* (`OPENIMEX_DRIVER_ROOT`, the
//! Kubernetes DRA driver's `driverRoot`) and the daemon opens the same paths under it as on a
//! GPU node.
//!
//! ```text
//! <node-dir>/dev/nvidiactl                                   the driver's socket (/dev/nvidiactl)
//! <node-dir>/dev/nvidiaN                                     GPU N's device file
//! <node-dir>/dev/nvidia-caps/nvidia-cap<minor>               the fabric-imex-mgmt capability
//! <node-dir>/dev/nvidia-caps-imex-channels/channelN          IMEX channel N (minor N)
//! <node-dir>/proc/driver/nvidia/version                      the module's version banner
//! <node-dir>/proc/driver/nvidia/capabilities/fabric-imex-mgmt  `DeviceFileMinor: <minor>` …
//! <node-dir>/proc/devices                                    the char device majors
//! ```
//!
//! The driver creates all of them. Applications open a channel file and pass the descriptor
//! to prove they hold the channel (`docs/reference/driver-interface.md` §2); the daemon opens the
//! capability file and passes it in NV_IMEX_SESSION's `capDescriptor` (§1.5). Where the real
//! files are character devices (a channel, the capability, a GPU), the simulation's are
//! regular files the driver recognises by inode; the channel number is the file name's suffix
//! here, where the real driver reads the device minor. `/dev/nvidiactl` is the driver's unix
//! socket: a transport that finds a socket there speaks the escapes over it (the `escape`
//! module), one that finds a character device issues `ioctl(2)`.

use std::io;
use std::path::{Path, PathBuf};

/// The directory of device files under a node directory.
pub const DEV_DIR: &str = "dev";
/// The driver socket's file name (in [`DEV_DIR`]): where `/dev/nvidiactl` is on a real node.
pub const SOCKET_FILE: &str = "nvidiactl";
/// The capability device directory (in [`DEV_DIR`]).
pub const CAPS_DIR: &str = "nvidia-caps";
/// The procfs directory of the driver, relative to the root.
pub const PROC_DRIVER_DIR: &str = "proc/driver/nvidia";
/// The fabric-imex-mgmt capability's procfs file, relative to the root.
pub const IMEX_CAP_PROC_FILE: &str = "proc/driver/nvidia/capabilities/fabric-imex-mgmt";
/// The module's version banner, relative to the root.
pub const VERSION_PROC_FILE: &str = "proc/driver/nvidia/version";
/// The char device majors, relative to the root.
pub const PROC_DEVICES_FILE: &str = "proc/devices";
/// The minor the simulation gives the fabric-imex-mgmt capability (as NVIDIA's nvml-mock
/// renders it; a real node's minor is whatever `nvidia-caps` handed out, read from the procfs
/// file).
pub const IMEX_CAP_MINOR: u32 = 512;

/// GPU `n`'s device file: `<root>/dev/nvidiaN`.
pub fn gpu_device_path(root: &Path, n: u32) -> PathBuf {
    root.join(DEV_DIR).join(format!("nvidia{n}"))
}

/// The capability device of minor `minor`: `<root>/dev/nvidia-caps/nvidia-cap<minor>`.
pub fn cap_device_path(root: &Path, minor: u32) -> PathBuf {
    root.join(DEV_DIR)
        .join(CAPS_DIR)
        .join(format!("nvidia-cap{minor}"))
}

/// The capability's procfs file's text, as `nv-caps.c` prints it.
pub fn cap_proc_text(minor: u32, mode: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
}

/// The `DeviceFileMinor` of a capability's procfs file text.
pub fn parse_cap_minor(text: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.strip_prefix("DeviceFileMinor:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The major of the char device `name` in a `/proc/devices` text.
pub fn parse_proc_devices_major(text: &str, name: &str) -> Option<u32> {
    text.lines()
        .skip_while(|l| !l.starts_with("Character devices:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .find_map(|l| {
            let mut it = l.split_whitespace();
            let major = it.next()?.parse().ok()?;
            (it.next()? == name).then_some(major)
        })
}
/// The channel directory's name (in [`DEV_DIR`]), as the kernel module names its devices.
pub const CHANNELS_DIR: &str = "nvidia-caps-imex-channels";
/// Channel files are this prefix followed by the channel number in decimal.
pub const CHANNEL_PREFIX: &str = "channel";

/// The driver socket of the node whose directory is `node_dir`: `<node_dir>/dev/nvidiactl`.
pub fn socket_path(node_dir: &Path) -> PathBuf {
    node_dir.join(DEV_DIR).join(SOCKET_FILE)
}

/// The IMEX channel directory of the node: `<node_dir>/dev/nvidia-caps-imex-channels`.
pub fn channels_dir(node_dir: &Path) -> PathBuf {
    node_dir.join(DEV_DIR).join(CHANNELS_DIR)
}

/// The file name of channel `n`: `channelN`.
pub fn channel_file_name(n: u32) -> String {
    format!("{CHANNEL_PREFIX}{n}")
}

/// The channel a file name stands for: `channelN` with N in canonical decimal (no sign, no
/// leading zero), so that `parse_channel_file_name(&channel_file_name(n)) == Some(n)` and no
/// two names stand for the same channel. Anything else is no channel.
pub fn parse_channel_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(CHANNEL_PREFIX)?;
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    if canonical { digits.parse().ok() } else { None }
}

/// The file of channel `n` of the node: `<node_dir>/dev/nvidia-caps-imex-channels/channelN`.
pub fn channel_path(node_dir: &Path, n: u32) -> PathBuf {
    channels_dir(node_dir).join(channel_file_name(n))
}

/// The channel files present in the node's channel directory, lowest number first. Entries
/// whose names are not channel names are skipped.
pub fn channel_files(node_dir: &Path) -> io::Result<Vec<(u32, PathBuf)>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(channels_dir(node_dir))? {
        let entry = entry?;
        let name = entry.file_name();
        if let Some(n) = name.to_str().and_then(parse_channel_file_name) {
            found.push((n, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_the_documented_layout() {
        let n = Path::new("/run/node0");
        assert_eq!(socket_path(n), Path::new("/run/node0/dev/nvidiactl"));
        assert_eq!(
            cap_device_path(n, 512),
            Path::new("/run/node0/dev/nvidia-caps/nvidia-cap512")
        );
        assert_eq!(gpu_device_path(n, 3), Path::new("/run/node0/dev/nvidia3"));
        assert_eq!(parse_cap_minor(&cap_proc_text(512, 256)), Some(512));
        let devices = "Character devices:\n  1 mem\n195 nvidia\n508 nvidia-caps-imex-channels\n\nBlock devices:\n  8 sd\n";
        assert_eq!(
            parse_proc_devices_major(devices, "nvidia-caps-imex-channels"),
            Some(508)
        );
        assert_eq!(parse_proc_devices_major(devices, "sd"), None);
        assert_eq!(
            channel_path(n, 12),
            Path::new("/run/node0/dev/nvidia-caps-imex-channels/channel12")
        );
        assert_eq!(channel_path(n, 0).parent(), Some(channels_dir(n).as_path()));
    }

    #[test]
    fn channel_names_parse_only_in_canonical_form() {
        for n in [0, 1, 7, 2047, u32::MAX] {
            assert_eq!(parse_channel_file_name(&channel_file_name(n)), Some(n));
        }
        for bad in [
            "channel",
            "channelx",
            "channel-1",
            "channel+1",
            "channel01",
            "channel 1",
            "Channel1",
            "other3",
            "channel4294967296",
            "channel1.lock",
        ] {
            assert_eq!(parse_channel_file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn channel_files_are_listed_lowest_first_skipping_other_names() {
        let dir = std::env::temp_dir().join(format!(
            "openimex-simproto-ch-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(channels_dir(&dir)).unwrap();
        assert_eq!(channel_files(&dir).unwrap(), Vec::new());
        for name in ["channel10", "channel2", "channelx", "channel02", "other3"] {
            std::fs::write(channels_dir(&dir).join(name), b"").unwrap();
        }
        let found = channel_files(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            found,
            vec![(2, channel_path(&dir, 2)), (10, channel_path(&dir, 10))]
        );
        assert!(channel_files(&dir).is_err(), "no directory");
    }
}
