//! Names mode: the nodes file lists DNS names (`oimx-n0`, `oimx-n1`, …) instead of addresses,
//! and every daemon sees its own private `/etc/hosts` (`<node dir>/hosts`), as a Kubernetes pod
//! of the DRA driver does. This module owns the hosts file format, its in-place rewrite, and the
//! `pre_exec` hook that gives a daemon its own mount namespace with the node's file bound over
//! `/etc/hosts`.
//!
//! Why in place: a bind mount of a file pins its inode. Replacing the file by a rename would
//! leave the daemon reading the old inode forever, so every rewrite truncates and writes the
//! same inode (the way the DRA driver's pod-local `/etc/hosts` is updated).

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};

use crate::HarnessError;

/// The name of node `i` in names mode. The prefix keeps it from colliding with real hosts.
pub fn node_name(i: usize) -> String {
    format!("oimx-n{i}")
}

/// The text of a hosts file mapping each name to its address, after the usual localhost lines
/// (glibc and tools expect `localhost` to resolve).
pub(crate) fn render_hosts(entries: &[(String, Ipv4Addr)]) -> String {
    let mut text = String::from(
        "# written by openimex-harness (names mode)\n127.0.0.1 localhost\n::1 localhost\n",
    );
    for (name, ip) in entries {
        text.push_str(&format!("{ip} {name}\n"));
    }
    text
}

/// Rewrites `path` in place (truncate and write the same inode; see the module doc).
pub(crate) fn write_hosts(path: &Path, entries: &[(String, Ipv4Addr)]) -> Result<(), HarnessError> {
    let hint = "check that the cluster directory is writable";
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(HarnessError::io("rewrite hosts file", path, hint))?;
    file.write_all(render_hosts(entries).as_bytes())
        .map_err(HarnessError::io("rewrite hosts file", path, hint))
}

/// Makes `cmd`'s process run with `hosts` bound over `/etc/hosts` in a mount namespace of its
/// own. Needs CAP_SYS_ADMIN; without it the spawn fails (with EPERM from the hook).
pub(crate) fn private_hosts(cmd: &mut Command, hosts: &Path) -> Result<(), HarnessError> {
    // Allocated here, before fork: the hook itself must not allocate.
    let nul = |what: &Path| {
        CString::new(what.as_os_str().as_bytes()).map_err(|_| HarnessError::Io {
            action: "use as a mount source",
            path: what.to_owned(),
            source: std::io::Error::other("the path contains a NUL byte"),
            hint: "use a TMPDIR without NUL bytes",
        })
    };
    let source = nul(hosts)?;
    let target = nul(Path::new("/etc/hosts"))?;
    let root = nul(Path::new("/"))?;
    let raw = |e: nix::errno::Errno| std::io::Error::from_raw_os_error(e as i32);
    // SAFETY: the closure runs between fork and exec in the single-threaded child and only
    // makes async-signal-safe system calls (unshare, mount) on C strings prepared above; it
    // allocates nothing (errors are raw OS error codes) and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            unshare(CloneFlags::CLONE_NEWNS).map_err(raw)?;
            // Private first, so the bind below does not propagate back to the host's namespace.
            mount(
                None::<&std::ffi::CStr>,
                root.as_c_str(),
                None::<&std::ffi::CStr>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&std::ffi::CStr>,
            )
            .map_err(raw)?;
            mount(
                Some(source.as_c_str()),
                target.as_c_str(),
                None::<&std::ffi::CStr>,
                MsFlags::MS_BIND,
                None::<&std::ffi::CStr>,
            )
            .map_err(raw)
        });
    }
    Ok(())
}

/// Fails unless `binary` is an executable file, so that a later spawn failure in names mode can
/// be blamed on the namespace hook rather than on a missing program.
pub(crate) fn check_executable(binary: &Path) -> Result<(), HarnessError> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(binary) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Ok(()),
        Ok(_) => Err(HarnessError::Spawn {
            program: binary.to_owned(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            hint: "the path is not an executable file; build the openimex binary (cargo build)",
        }),
        Err(source) => Err(HarnessError::Spawn {
            program: binary.to_owned(),
            source,
            hint: "build the openimex binary first (cargo build) and pass its path",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn rewrite_keeps_the_inode() {
        let dir = crate::ScratchDir::new("hosts").expect("scratch");
        let path = dir.path().join("hosts");
        let a = Ipv4Addr::new(127, 20, 0, 1);
        write_hosts(&path, &[("oimx-n0".into(), a)]).expect("write");
        let inode = std::fs::metadata(&path).expect("stat").ino();
        let b = Ipv4Addr::new(127, 20, 0, 9);
        write_hosts(&path, &[("oimx-n0".into(), b)]).expect("rewrite");
        assert_eq!(std::fs::metadata(&path).expect("stat").ino(), inode);
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(text.contains("127.20.0.9 oimx-n0\n"), "{text}");
        assert!(!text.contains("127.20.0.1 "), "{text}");
        assert!(text.contains("127.0.0.1 localhost\n"), "{text}");
    }
}
