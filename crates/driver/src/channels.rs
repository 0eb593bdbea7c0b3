//! A node's IMEX channel files: creating them with tight permissions, and finding the
//! world-writable ones to warn about. The simulated driver's channels are regular files;
//! `openimex channels` makes the real driver's character devices with the same modes.
//!
//! On a real node a channel is the character device `c <major> N` and its file permissions
//! are the whole access policy (`docs/reference/driver-interface.md` §2: "ordinary file
//! permissions on the /dev node are the whole access policy"); the simulation uses a regular
//! file per channel with the same meaning. A world-writable channel lets every local user
//! share fabric memory with every job on that channel, which is what the kernel module's
//! `NVreg_CreateImexChannel0=1` does (mode 0666, with a security warning in the kernel log):
//! the default here is owner-only, and [`open_to_all`] finds what an operator should fix.
//! Read permission is as good as write: the driver takes any descriptor open on the channel's
//! inode, whatever its open mode (§2: "a channel is authenticated purely by 'this fd is open on
//! an nv-caps-imex inode'"), so a world-readable channel is as open as a world-writable one.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use openimex_simproto::node_dir::{
    CHANNELS_DIR, channel_file_name, channels_dir, parse_channel_file_name,
};
pub use openimex_simproto::proto::MAX_IMEX_CHANNEL_COUNT;

/// Mode of the channel files the driver creates: owner (root, as the driver and the
/// applications of a test cluster run) read and write, nobody else.
pub const DEFAULT_CHANNEL_MODE: u32 = 0o600;

/// The "others may read" and "others may write" bits: a channel file with either is open to
/// every local user (a read-only descriptor subscribes as well as a read-write one).
pub const OTHERS_ACCESS: u32 = 0o006;

/// "world-writable" or "world-readable", for a mode with [`OTHERS_ACCESS`] bits.
pub fn describe_open_mode(mode: u32) -> &'static str {
    if mode & 0o002 != 0 {
        "world-writable"
    } else {
        "world-readable"
    }
}

/// Creates the regular file `path` as a simulated channel with exactly `mode` (whatever the
/// umask) and, if given, the owner `uid`/`gid`. Returns `false`, changing nothing, if the
/// file exists already (an operator's own permissions are kept).
pub fn create_channel_file(
    path: &Path,
    mode: u32,
    uid: Option<u32>,
    gid: Option<u32>,
) -> io::Result<bool> {
    // Created owner-only, then opened up to `mode`: no moment in which a loose umask leaves
    // the file more open than asked.
    // Owner and mode are set through the descriptor, so they land on the file just created
    // even if the name is swapped meanwhile (create_new never follows a symbolic link).
    let file = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(e),
    };
    if uid.is_some() || gid.is_some() {
        std::os::unix::fs::fchown(&file, uid, gid)?;
    }
    file.set_permissions(fs::Permissions::from_mode(mode & 0o7777))?;
    Ok(true)
}

/// Creates `path` as the character device `c major minor` (channel `minor` of the real
/// driver) with exactly `mode` and owner `uid:gid`. Returns `false`, changing nothing, if that
/// device is there already; any other file at `path` is an error naming it.
pub fn create_channel_device(
    path: &Path,
    major: u32,
    minor: u32,
    mode: u32,
    uid: u32,
    gid: u32,
) -> io::Result<bool> {
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    use std::os::unix::fs::FileTypeExt as _;
    let dev = makedev(u64::from(major), u64::from(minor));
    if let Ok(meta) = fs::symlink_metadata(path) {
        if meta.file_type().is_char_device() && meta.rdev() == dev {
            return Ok(false);
        }
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not the character device c {major} {minor} of channel \
                 {minor}; remove it",
                path.display()
            ),
        ));
    }
    // Created owner-only, then given away and opened up: never more open than asked.
    mknod(path, SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), dev).map_err(io::Error::from)?;
    std::os::unix::fs::chown(path, Some(uid), Some(gid))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o7777))?;
    Ok(true)
}

/// Where a node's channels are, and what they are: the directory, and the channels' major
/// number when the real driver's are character devices (`None`: the simulated driver's
/// regular files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelDir {
    /// `<driver root>/dev/nvidia-caps-imex-channels`.
    pub dir: PathBuf,
    /// The `nvidia-caps-imex-channels` major of `/proc/devices`.
    pub major: Option<u32>,
}

impl ChannelDir {
    /// Creates channel `n` for a job: root's (0600) without `owner`, else `uid:gid`'s with
    /// group access (0660). Returns `false` if it was there already (kept as it is).
    pub fn create(&self, n: u32, owner: Option<(u32, u32)>) -> io::Result<bool> {
        let (mode, uid, gid) = match owner {
            Some((uid, gid)) => (0o660, uid, gid),
            None => (DEFAULT_CHANNEL_MODE, 0, 0),
        };
        fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(channel_file_name(n));
        match self.major {
            Some(major) => create_channel_device(&path, major, n, mode, uid, gid),
            None => create_channel_file(&path, mode, Some(uid), Some(gid)),
        }
    }

    /// Removes channel `n` (its job ended): no process opens it any more. Returns whether it
    /// was there.
    pub fn remove(&self, n: u32) -> io::Result<bool> {
        match fs::remove_file(self.dir.join(channel_file_name(n))) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// A channel file that every local user may open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenToAll {
    /// The channel number (the file name's suffix).
    pub channel: u32,
    /// The file.
    pub path: PathBuf,
    /// Its permission bits.
    pub mode: u32,
}

/// The channel files (`channelN`) in `dir` whose mode lets others read or write, lowest
/// number first.
/// A missing directory has none. Symbolic links are followed, as an application opening the
/// channel would.
pub fn open_to_all(dir: &Path) -> io::Result<Vec<OpenToAll>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let Some(channel) = entry.file_name().to_str().and_then(parse_channel_file_name) else {
            continue;
        };
        let path = entry.path();
        let Ok(meta) = fs::metadata(&path) else {
            continue;
        };
        let mode = meta.mode() & 0o7777;
        if mode & OTHERS_ACCESS != 0 {
            found.push(OpenToAll {
                channel,
                path,
                mode,
            });
        }
    }
    found.sort_by_key(|w| w.channel);
    Ok(found)
}

/// Logs a warning per channel file in `dir` that every local user may open (see
/// [`open_to_all`]); returns how many there were.
pub fn warn_open_to_all(dir: &Path) -> usize {
    match open_to_all(dir) {
        Ok(found) => {
            for w in &found {
                tracing::warn!(
                    channel = w.channel,
                    path = %w.path.display(),
                    "IMEX channel {} is {} (mode {:04o}): every local user can export and \
                     import fabric memory on it, across jobs; give each job its own channel \
                     owned by the job's user, e.g. chmod 0600 {} and chown it",
                    w.channel,
                    describe_open_mode(w.mode),
                    w.mode,
                    w.path.display()
                );
            }
            found.len()
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), "cannot check the IMEX channel files' modes: {e}");
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "openimex-simgpu-channels-{name}-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_jobs_channel_is_roots_or_its_owners_and_goes_with_the_job() {
        let dir = scratch("job");
        let channels = ChannelDir {
            dir: dir.join("dev").join(CHANNELS_DIR),
            major: None,
        };
        assert!(channels.create(3, None).unwrap());
        assert!(!channels.create(3, None).unwrap(), "kept as it is");
        let meta = fs::metadata(channels.dir.join("channel3")).unwrap();
        assert_eq!((meta.mode() & 0o777, meta.uid()), (0o600, 0));
        assert!(channels.create(4, Some((1234, 5678))).unwrap());
        let meta = fs::metadata(channels.dir.join("channel4")).unwrap();
        assert_eq!(
            (meta.mode() & 0o777, meta.uid(), meta.gid()),
            (0o660, 1234, 5678)
        );
        assert!(channels.remove(3).unwrap());
        assert!(!channels.remove(3).unwrap(), "gone already");
        assert!(!channels.dir.join("channel3").exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn created_files_have_exactly_the_mode_and_existing_ones_are_kept() {
        let dir = scratch("create");
        let p = dir.join("channel0");
        assert!(create_channel_file(&p, DEFAULT_CHANNEL_MODE, None, None).unwrap());
        assert_eq!(mode(&p), 0o600);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        assert!(!create_channel_file(&p, 0o600, None, None).unwrap());
        assert_eq!(mode(&p), 0o640, "an operator's mode is kept");
        let q = dir.join("channel1");
        assert!(create_channel_file(&q, 0o660, Some(65534), Some(65534)).unwrap());
        let m = fs::metadata(&q).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (65534, 65534, 0o660));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// `docs/reference/driver-interface.md` §2: the file permissions are the whole policy, and any
    /// open descriptor is the channel, so others' read bit counts as much as their write bit.
    #[test]
    fn only_channel_files_others_may_open_are_reported() {
        let dir = scratch("audit");
        assert_eq!(open_to_all(&dir.join("missing")).unwrap(), vec![]);
        for (name, m) in [
            ("channel3", 0o666),
            ("channel1", 0o602),
            ("channel0", 0o660),
            ("channel2", 0o644),
            ("channel4", 0o601),
            ("other9", 0o666),
        ] {
            let p = dir.join(name);
            fs::write(&p, b"").unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(m)).unwrap();
        }
        let found = open_to_all(&dir).unwrap();
        assert_eq!(
            found
                .iter()
                .map(|w| (w.channel, w.mode))
                .collect::<Vec<_>>(),
            vec![(1, 0o602), (2, 0o644), (3, 0o666)]
        );
        assert_eq!(
            (describe_open_mode(0o644), describe_open_mode(0o602)),
            ("world-readable", "world-writable")
        );
        assert_eq!(warn_open_to_all(&dir), 3);
        fs::remove_dir_all(&dir).unwrap();
    }
}
