//! Running a binary as another user (tests that check what `nobody` may do): the user must be
//! able to reach the file. A checkout under a private directory (`mktemp -d` makes it 0700)
//! is not reachable, so the binary is offered at a path everyone can traverse: a hard link
//! (or, across file systems, a copy) in a 0755 directory of the temp dir, one per source path.

use std::collections::HashMap;
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::HarnessError;

/// Links made by this process, by source path.
static MADE: Mutex<Option<HashMap<PathBuf, PathBuf>>> = Mutex::new(None);

/// `exe` at a path every user can execute: `exe` itself when every directory above it is
/// searchable by others and it is executable by others; else a link to it in
/// `<temp>/openimex-exec-<hash of the path>/`, made once per process.
pub fn runnable_by_everyone(exe: &Path) -> Result<PathBuf, HarnessError> {
    if reachable(exe) {
        return Ok(exe.to_path_buf());
    }
    let mut made = MADE.lock().unwrap_or_else(PoisonError::into_inner);
    let made = made.get_or_insert_with(HashMap::new);
    if let Some(p) = made.get(exe) {
        return Ok(p.clone());
    }
    let mut h = DefaultHasher::new();
    exe.hash(&mut h);
    let dir = std::env::temp_dir().join(format!("openimex-exec-{:016x}", h.finish()));
    const HINT: &str = "check that the temp dir (TMPDIR) is writable";
    fs::create_dir_all(&dir).map_err(HarnessError::io("create directory", &dir, HINT))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).map_err(HarnessError::io(
        "set mode 0755 on",
        &dir,
        HINT,
    ))?;
    let name = exe.file_name().unwrap_or(exe.as_os_str());
    let target = dir.join(name);
    // A link left by an earlier build names the old file: replace it.
    let _ = fs::remove_file(&target);
    if fs::hard_link(exe, &target).is_err() {
        fs::copy(exe, &target).map_err(HarnessError::io("copy the binary to", &target, HINT))?;
    }
    fs::set_permissions(&target, fs::Permissions::from_mode(0o755)).map_err(HarnessError::io(
        "set mode 0755 on",
        &target,
        HINT,
    ))?;
    made.insert(exe.to_path_buf(), target.clone());
    Ok(target)
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

    /// A binary under a private directory is offered elsewhere, reachable by all; one that is
    /// reachable already is used as it is.
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
        assert_ne!(offered, exe);
        assert!(reachable(&offered), "{}", offered.display());
        assert_eq!(fs::read(&offered).expect("read"), b"#!/bin/sh\n");
        assert_eq!(runnable_by_everyone(&offered).expect("as is"), offered);
    }
}
