//! `openimex channels create N`: the IMEX channel files of a node, as an administrator
//! creates them (`docs/reference/imex-guide.md` §8, `docs/reference/driver-interface.md` §2): `DIR/channel0..channel{N-1}`
//! (or N channels from `--first F`, e.g. one channel for one job),
//! each the character device `c <major> <n>` where the major is the one `/proc/devices` lists
//! for `nvidia-caps-imex-channels`; on a node without that driver, the simulated driver's
//! channel files (regular files: see `openimex_driver::channels`).
//!
//! A channel's file permissions are its whole access policy, so the defaults are tight: mode
//! 0600 (0660 with `--gid`: the group is meant to use it), owner root unless `--uid`/`--gid`.
//! A `--mode` others may read or write is refused unless `--allow-world`, and then warned
//! about (any open descriptor is the channel, so read access is as open as write).
//! Existing files are kept as they are (a scheduler may have given one to a job), but a
//! one others may open is warned about.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use openimex_driver::channels::{
    CHANNELS_DIR, MAX_IMEX_CHANNEL_COUNT, OTHERS_ACCESS, channel_file_name, create_channel_device,
    create_channel_file, describe_open_mode, open_to_all,
};

/// Where the real driver's channel devices live.
const DEFAULT_DIR: &str = "/dev/nvidia-caps-imex-channels";

/// `openimex channels …`.
#[derive(Debug, Subcommand)]
pub enum ChannelsCommand {
    /// Create channel0..channel{N-1} in DIR (character devices of the nvidia-caps-imex-channels
    /// driver; without it, the simulated driver's channel files), not open to others.
    Create(CreateArgs),
}

/// `openimex channels create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// How many channels: channel0 to channel{N-1} (from --first).
    #[arg(value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_IMEX_CHANNEL_COUNT)))]
    count: u32,
    /// The first channel's number (a scheduler's per-job channel: --first K with N = 1).
    #[arg(long, value_name = "K", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..i64::from(MAX_IMEX_CHANNEL_COUNT)))]
    first: u32,
    /// The channel directory (created if missing).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_DIR)]
    dir: PathBuf,
    /// Owner of the new files [default: root (0)].
    #[arg(long, value_name = "UID")]
    uid: Option<u32>,
    /// Group of the new files [default: root (0)].
    #[arg(long, value_name = "GID")]
    gid: Option<u32>,
    /// Octal mode of the new files [default: 0600, or 0660 with --gid].
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    mode: Option<u32>,
    /// Allow a --mode that others may read or write (every local user can then share memory
    /// on the channel).
    #[arg(long)]
    allow_world: bool,
    /// (testing) Where the character-device majors are listed.
    #[arg(long, hide = true, default_value = "/proc/devices")]
    proc_devices: PathBuf,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    let digits = s.strip_prefix("0o").unwrap_or(s);
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!(
            "{s:?} is not a file mode: give 3 or 4 octal digits up to 0777, e.g. 0600 or 0660"
        )),
    }
}

/// The major of the `nvidia-caps-imex-channels` character devices in `/proc/devices`' text.
fn channel_major(proc_devices: &str) -> Option<u32> {
    let mut in_char = false;
    for line in proc_devices.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_char = line == "Character devices:";
            continue;
        }
        let mut fields = line.split_whitespace();
        if let (true, Some(major), Some(CHANNELS_DIR), None) =
            (in_char, fields.next(), fields.next(), fields.next())
        {
            return major.parse().ok();
        }
    }
    None
}

/// Runs `openimex channels …`.
pub(crate) fn channels(cmd: &ChannelsCommand) -> Result<()> {
    match cmd {
        ChannelsCommand::Create(a) => create(a),
    }
}

fn create(a: &CreateArgs) -> Result<()> {
    let end = a.first.saturating_add(a.count);
    if end > MAX_IMEX_CHANNEL_COUNT {
        bail!(
            "channels {} to {} go past the driver's last channel number {}; lower N or --first",
            a.first,
            end - 1,
            MAX_IMEX_CHANNEL_COUNT - 1
        );
    }
    let mode = a
        .mode
        .unwrap_or(if a.gid.is_some() { 0o660 } else { 0o600 });
    if mode & OTHERS_ACCESS != 0 {
        let open = describe_open_mode(mode);
        if !a.allow_world {
            bail!(
                "--mode {mode:04o} is {open}: every local user could export and import fabric \
                 memory on these channels, across jobs (a descriptor of any open mode is the \
                 channel); use 0600 or 0660 with --uid/--gid for the job's user, or pass \
                 --allow-world if that is really meant"
            );
        }
        eprintln!(
            "WARNING: creating {open} IMEX channels (mode {mode:04o}): every local user can \
             share fabric memory with every job on them"
        );
    }
    // An unreadable /proc/devices is a node without the driver, as a missing entry is.
    let major = std::fs::read_to_string(&a.proc_devices)
        .ok()
        .and_then(|t| channel_major(&t));
    if major.is_none() {
        eprintln!(
            "no {CHANNELS_DIR} driver in {}: creating the simulated driver's channel files \
             (regular files)",
            a.proc_devices.display()
        );
    }
    std::fs::create_dir_all(&a.dir).with_context(|| {
        format!(
            "cannot create the channel directory {}; run as root or pass --dir",
            a.dir.display()
        )
    })?;
    // Owner root unless told otherwise, whoever runs this.
    let (uid, gid) = (a.uid.unwrap_or(0), a.gid.unwrap_or(0));
    for n in a.first..end {
        let path = a.dir.join(channel_file_name(n));
        let created = match major {
            Some(major) => {
                create_channel_device(&path, major, n, mode, uid, gid).with_context(|| {
                    format!(
                        "cannot create the device {} (c {major} {n}); run as root",
                        path.display()
                    )
                })?
            }
            None => create_channel_file(&path, mode, Some(uid), Some(gid)).with_context(|| {
                format!(
                    "cannot create {}; run as root (owner {uid}:{gid} needs it)",
                    path.display()
                )
            })?,
        };
        let kind = major.map_or("file".to_owned(), |m| format!("c {m} {n}"));
        if created {
            println!(
                "created {} ({kind}, mode {mode:04o}, owner {uid}:{gid})",
                path.display()
            );
        } else {
            println!("kept {} (exists)", path.display());
        }
    }
    let open = open_to_all(&a.dir).with_context(|| format!("cannot list {}", a.dir.display()))?;
    for w in &open {
        eprintln!(
            "WARNING: {} is {} (mode {:04o}): every local user can share fabric memory on \
             channel {}; chmod 0600 it and chown it to the user who should have it",
            w.path.display(),
            describe_open_mode(w.mode),
            w.mode,
            w.channel
        );
    }
    Ok(())
}

/// `mknod path c major minor`, then owner and mode (never looser than asked, even briefly:
/// the node is made owner-only first). `false` if a file of that name exists; a file that
/// is not that channel's device is an error.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_major_is_read_from_the_character_devices_only() {
        let text = "Character devices:\n  1 mem\n195 nvidia\n508 nvidia-caps-imex-channels\n\n\
                    Block devices:\n  7 loop\n";
        assert_eq!(channel_major(text), Some(508));
        assert_eq!(channel_major("Character devices:\n  1 mem\n"), None);
        assert_eq!(
            channel_major("Block devices:\n 9 nvidia-caps-imex-channels\n"),
            None,
            "a block device of that name is not it"
        );
    }

    #[test]
    fn modes_are_octal_up_to_0777() {
        assert_eq!(parse_mode("0600"), Ok(0o600));
        assert_eq!(parse_mode("660"), Ok(0o660));
        assert_eq!(parse_mode("0o640"), Ok(0o640));
        for bad in ["4755", "0800", "rw", "", "-1"] {
            assert!(parse_mode(bad).is_err(), "{bad}");
        }
    }
}
