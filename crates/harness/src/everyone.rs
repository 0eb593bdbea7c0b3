//! Running a binary as another user (tests that check what `nobody` may do): the user must be
//! able to reach the file. A checkout under a private directory (`mktemp -d` makes it 0700)
//! is not reachable, so the binary is offered at a path everyone can traverse: a hard link
//! (or, across file systems, a copy) in a 0755 directory of the temp dir, made for one caller
//! and removed when its [`Runnable`] drops. A hard link left behind would keep a deleted
//! checkout's binary on disk, so directories of processes that died before dropping theirs are
//! swept by the next caller.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::HarnessError;

/// Prefix of the directories made here, followed by `<pid>-<n>`.
const PREFIX: &str = "openimex-exec-";

/// A binary at a path every user can execute. Drop it once the command that runs it has been
/// spawned (a running process keeps its file).
#[derive(Debug)]
pub struct Runnable {
    path: PathBuf,
    /// The directory made for it, removed on drop (`None`: the binary was reachable as it is).
    dir: Option<PathBuf>,
}

impl Runnable {
    /// Where to run it from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Runnable {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = fs::remove_dir_all(dir);
        }
    }
}

/// `exe` at a path every user can execute: `exe` itself when every directory above it is
/// searchable by others and it is executable by others; else a link to it in a fresh
/// `<temp>/openimex-exec-<pid>-<n>/`, removed when the result drops.
pub fn runnable_by_everyone(exe: &Path) -> Result<Runnable, HarnessError> {
    if reachable(exe) {
        return Ok(Runnable {
            path: exe.to_path_buf(),
            dir: None,
        });
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let temp = std::env::temp_dir();
    sweep(&temp);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = temp.join(format!("{PREFIX}{}-{n}", std::process::id()));
    const HINT: &str = "check that the temp dir (TMPDIR) is writable";
    fs::create_dir_all(&dir).map_err(HarnessError::io("create directory", &dir, HINT))?;
    // From here the directory is removed on every path out.
    let mut offered = Runnable {
        path: dir.clone(),
        dir: Some(dir.clone()),
    };
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).map_err(HarnessError::io(
        "set mode 0755 on",
        &dir,
        HINT,
    ))?;
    let name = exe.file_name().unwrap_or(exe.as_os_str());
    let target = dir.join(name);
    if fs::hard_link(exe, &target).is_err() {
        fs::copy(exe, &target).map_err(HarnessError::io("copy the binary to", &target, HINT))?;
    }
    fs::set_permissions(&target, fs::Permissions::from_mode(0o755)).map_err(HarnessError::io(
        "set mode 0755 on",
        &target,
        HINT,
    ))?;
    offered.path = target;
    Ok(offered)
}

/// Removes the directories of processes that are gone (killed before their drop), and those
/// named in another form (made by an older build, which kept one per binary path).
fn sweep(temp: &Path) {
    let Ok(entries) = fs::read_dir(temp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let pid = rest
            .split_once('-')
            .and_then(|(p, _)| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| Path::new("/proc").join(p.to_string()).exists());
        if !alive {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Whether others may search every directory above `exe` and execute it.
fn reachable(exe: &Path) -> bool {
    let others_x = |p: &Path| fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o001 != 0);
    others_x(exe)
        && exe
            .ancestors()
            .skip(1)
            .all(|d| d.as_os_str().is_empty() || others_x(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary under a private directory is offered elsewhere, reachable by all, until the
    /// offer drops; one that is reachable already is used as it is.
    #[test]
    fn a_binary_in_a_private_directory_is_offered_where_everyone_can_run_it() {
        let scratch = crate::ScratchDir::new("everyone").expect("scratch dir");
        let private = scratch.path().join("private");
        fs::create_dir(&private).expect("dir");
        fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).expect("chmod");
        let exe = private.join("tool");
        fs::write(&exe, b"#!/bin/sh\n").expect("write");
        fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).expect("chmod");
        let offered = runnable_by_everyone(&exe).expect("offered");
        let path = offered.path().to_path_buf();
        assert_ne!(path, exe);
        assert!(reachable(&path), "{}", path.display());
        assert_eq!(fs::read(&path).expect("read"), b"#!/bin/sh\n");
        let again = runnable_by_everyone(&path).expect("as is");
        assert_eq!(again.path(), path);
        drop(again);
        assert!(path.exists(), "an offer used as it is removes nothing");
        drop(offered);
        assert!(!path.exists(), "the link is gone with the offer");
        assert!(
            !path.parent().expect("its directory").exists(),
            "and its directory"
        );
    }

    /// A directory left by a process that died before dropping its offer is swept. The sweep
    /// runs over a scratch directory of this test's own: in the shared temp dir any other
    /// caller's sweep (the test above, or another test binary) would remove the stale directory
    /// before this test wrote into it.
    #[test]
    fn a_dead_processs_directory_is_swept() {
        let scratch = crate::ScratchDir::new("everyone-sweep").expect("scratch dir");
        let temp = scratch.path();
        // PIDs above the kernel's maximum (2^22) never run.
        let stale = temp.join(format!("{PREFIX}{}-0", 1u32 << 23));
        fs::create_dir_all(&stale).expect("dir");
        fs::write(stale.join("tool"), b"x").expect("write");
        let live = temp.join(format!("{PREFIX}{}-999999", std::process::id()));
        fs::create_dir_all(&live).expect("dir");
        sweep(temp);
        assert!(!stale.exists(), "swept");
        assert!(live.exists(), "a live process's directory stays");
    }
}
