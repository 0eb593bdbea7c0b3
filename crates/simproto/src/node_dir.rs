//! A node's directory, as the simulation lays it out: what `/dev` is on a real node.
//!
//! ```text
//! <node-dir>/dev/nvidiactl.sock                      the driver's socket (/dev/nvidiactl)
//! <node-dir>/dev/nvidia-caps-imex-channels/channelN  IMEX channel N (the char device of minor N)
//! ```
//!
//! The driver creates both; applications open a channel file and pass the descriptor to prove
//! they hold the channel (`reference/driver-interface.md` §2). The channel number is the file
//! name's suffix here, where the real driver reads the device minor.

use std::io;
use std::path::{Path, PathBuf};

/// The directory of device files under a node directory.
pub const DEV_DIR: &str = "dev";
/// The driver socket's file name (in [`DEV_DIR`]).
pub const SOCKET_FILE: &str = "nvidiactl.sock";
/// The channel directory's name (in [`DEV_DIR`]), as the kernel module names its devices.
pub const CHANNELS_DIR: &str = "nvidia-caps-imex-channels";
/// Channel files are this prefix followed by the channel number in decimal.
pub const CHANNEL_PREFIX: &str = "channel";

/// The driver socket of the node whose directory is `node_dir`:
/// `<node_dir>/dev/nvidiactl.sock`.
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
        assert_eq!(socket_path(n), Path::new("/run/node0/dev/nvidiactl.sock"));
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
