//! The OS-level escapes, handled in the kernel's Unix layer without the RM core: the API
//! version check, OS events, attaching GPUs to a file, and registering a file to a control
//! file.
//!
//! OS events (`allocate_os_event`, `free_os_event`, `osUserHandleToKernelPtr`,
//! `osSetEvent` in osapi.c and os.c) live on one node-wide list keyed by (fd number,
//! hClient); nothing is checked at allocation but that the pair is new. The simulation needs
//! the descriptor itself to post to (on a real node the post goes to the private state of the
//! file the escape was issued on, which `poll()` then reports): the fd number must be among
//! the descriptors passed with the escape, and a post writes 1 to it (8 bytes, native endian:
//! an `eventfd` becomes readable, and so does the other end of a socket pair, which the
//! daemon's transport uses so that the driver's exit reads as end-of-file there).

use std::os::fd::{AsFd, OwnedFd};

use openimex_rmabi::NvHandle;
use openimex_rmabi::escape::{
    NV_RM_API_VERSION_CMD_QUERY, NV_RM_API_VERSION_CMD_RELAXED, NV_RM_API_VERSION_REPLY_RECOGNIZED,
    NV_RM_API_VERSION_STRING_LENGTH, nv_ioctl_alloc_os_event_t, nv_ioctl_free_os_event_t,
    nv_ioctl_rm_api_version_t,
};
use openimex_simproto::escape::EscapeCall;

use super::status::{
    NV_ERR_GENERIC, NV_ERR_INSUFFICIENT_RESOURCES, NV_ERR_INVALID_ARGUMENT, NV_ERR_INVALID_EVENT,
    NV_OK,
};
use super::{Caller, FileId, Outcome, RmApi, gpus, passed_fd, read, write};
use crate::rm::Rm;

/// One OS event.
#[derive(Debug)]
struct OsEvent {
    h_client: NvHandle,
    fd: u32,
    /// The file the escape was issued on (its close frees the event).
    file: FileId,
    /// The descriptor posts go to.
    desc: OwnedFd,
    /// False once freed while the session still references it (`free_os_event_under_lock`):
    /// posts to it are dropped (`osReferenceObjectCount` fails).
    active: bool,
    /// References taken by `osUserHandleToKernelPtr` (the IMEX session's).
    refcount: u32,
}

/// The node-wide OS event list (`nv->event_list`).
#[derive(Debug, Default)]
pub(super) struct OsEvents {
    next_key: u64,
    list: std::collections::BTreeMap<u64, OsEvent>,
}

impl OsEvents {
    /// `osUserHandleToKernelPtr`: the active event of (fd, hClient), referenced. `None` is
    /// NV_ERR_OBJECT_NOT_FOUND.
    pub(super) fn reference(&mut self, h_client: NvHandle, fd: u32) -> Option<u64> {
        let (&key, e) = self
            .list
            .iter_mut()
            .find(|(_, e)| e.active && e.fd == fd && e.h_client == h_client)?;
        e.refcount += 1;
        Some(key)
    }

    /// `osDereferenceObjectCount`: the last reference of a freed event frees it.
    pub(super) fn dereference(&mut self, key: u64) {
        if let Some(e) = self.list.get_mut(&key) {
            e.refcount = e.refcount.saturating_sub(1);
            if !e.active && e.refcount == 0 {
                self.list.remove(&key);
            }
        }
    }

    /// `osSetEvent` → `nv_post_event`: a data-less event on an active event.
    pub(super) fn signal(&self, key: u64) {
        let Some(e) = self.list.get(&key).filter(|e| e.active) else {
            return;
        };
        // An eventfd adds the value to its counter; a socket gets 8 bytes. A full counter or
        // socket buffer (EAGAIN: the event is pending already, which is all a post says) or
        // a descriptor that is not writable drops the post, as a real post to a dead file
        // goes nowhere.
        match nix::unistd::write(e.desc.as_fd(), &1u64.to_ne_bytes()) {
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(err) => tracing::warn!(
                fd = e.fd,
                h_client = e.h_client,
                "OS event post failed: {err}"
            ),
        }
    }

    /// Unlinks an event (`free_os_event_under_lock`): gone now, or at its last dereference.
    fn unlink(&mut self, key: u64) {
        let Some(e) = self.list.get_mut(&key) else {
            return;
        };
        e.active = false;
        if e.refcount == 0 {
            self.list.remove(&key);
        }
    }

    /// `rm_client_free_os_events`: the events of a freed client.
    pub(super) fn free_client(&mut self, h_client: NvHandle) {
        let keys: Vec<u64> = self
            .list
            .iter()
            .filter(|(_, e)| e.active && e.h_client == h_client)
            .map(|(&k, _)| k)
            .collect();
        keys.into_iter().for_each(|k| self.unlink(k));
    }

    /// The file closed: the events issued on it go.
    pub(super) fn free_file(&mut self, file: FileId) {
        let keys: Vec<u64> = self
            .list
            .iter()
            .filter(|(_, e)| e.active && e.file == file)
            .map(|(&k, _)| k)
            .collect();
        keys.into_iter().for_each(|k| self.unlink(k));
    }

    /// Events on the list (for tests).
    #[cfg(test)]
    pub(super) fn active(&self) -> usize {
        self.list.values().filter(|e| e.active).count()
    }
}

impl RmApi {
    /// NV_ESC_CHECK_VERSION_STR (`RmPerformVersionCheck`, osapi.c): `reply` is always set to
    /// RECOGNIZED; QUERY copies the driver's version string; RELAXED compares up to the
    /// first '.'; any other command compares the whole string (STRICT). A mismatch copies the
    /// driver's string back and fails with NV_ERR_GENERIC, which `nvidia_ioctl` returns as
    /// `-EINVAL` (the argument is still copied back).
    pub(super) fn check_version(&mut self, arg: &mut [u8]) -> Outcome {
        let mut outcome = Outcome::os(NV_OK);
        let Some(mut p) = read::<nv_ioctl_rm_api_version_t>(arg) else {
            return Outcome::einval();
        };
        p.reply = NV_RM_API_VERSION_REPLY_RECOGNIZED;
        let mine = self.config.version.as_bytes();
        let copy_mine = |p: &mut nv_ioctl_rm_api_version_t| {
            p.versionString = [0; NV_RM_API_VERSION_STRING_LENGTH];
            let n = mine.len().min(NV_RM_API_VERSION_STRING_LENGTH - 1);
            p.versionString[..n].copy_from_slice(&mine[..n]);
        };
        if p.cmd == NV_RM_API_VERSION_CMD_QUERY {
            copy_mine(&mut p);
        } else {
            let relaxed = p.cmd == NV_RM_API_VERSION_CMD_RELAXED;
            let matched = (0..NV_RM_API_VERSION_STRING_LENGTH).find_map(|i| {
                let client = p.versionString[i];
                let rm = mine.get(i).copied().unwrap_or(0);
                if client != rm {
                    Some(false)
                } else if (relaxed && client == b'.') || client == 0 {
                    Some(true)
                } else {
                    None
                }
            });
            if matched != Some(true) {
                copy_mine(&mut p);
                outcome = Outcome::os(NV_ERR_GENERIC);
                outcome.errno = nix::libc::EINVAL;
            }
        }
        write(arg, &p);
        outcome
    }

    /// NV_ESC_ALLOC_OS_EVENT (`allocate_os_event`): records (hClient, fd) for the file;
    /// another event of the same pair is refused, and every failure is reported as
    /// NV_ERR_INSUFFICIENT_RESOURCES in `Status`. The simulation also needs the descriptor:
    /// an fd number not passed with the escape fails the same way (the kernel would accept
    /// it and post to the issuing file, which has no pollable state here).
    pub(super) fn alloc_os_event(
        &mut self,
        caller: &Caller<'_>,
        call: &EscapeCall,
        arg: &mut [u8],
    ) -> Outcome {
        let Some(mut p) = read::<nv_ioctl_alloc_os_event_t>(arg) else {
            return Outcome::einval();
        };
        let taken = self
            .events
            .list
            .values()
            .any(|e| e.active && e.h_client == p.hClient && e.fd == p.fd);
        let desc = passed_fd(&call.fds, i64::from(p.fd)).and_then(|fd| fd.try_clone().ok());
        p.Status = match (taken, desc) {
            (false, Some(desc)) => {
                let key = self.events.next_key;
                self.events.next_key += 1;
                self.events.list.insert(
                    key,
                    OsEvent {
                        h_client: p.hClient,
                        fd: p.fd,
                        file: caller.file,
                        desc,
                        active: true,
                        refcount: 0,
                    },
                );
                NV_OK
            }
            (true, _) => NV_ERR_INSUFFICIENT_RESOURCES,
            (false, None) => {
                tracing::warn!(
                    fd = p.fd,
                    "NV_ESC_ALLOC_OS_EVENT: descriptor {} was not passed with the call; the \
                     simulated driver posts events to the passed descriptor (an eventfd)",
                    p.fd
                );
                NV_ERR_INSUFFICIENT_RESOURCES
            }
        };
        write(arg, &p);
        Outcome::os(p.Status)
    }

    /// NV_ESC_FREE_OS_EVENT (`free_os_event`): NV_ERR_INVALID_EVENT when no event of
    /// (hClient, fd) is on the list.
    pub(super) fn free_os_event(&mut self, arg: &mut [u8]) -> Outcome {
        let Some(mut p) = read::<nv_ioctl_free_os_event_t>(arg) else {
            return Outcome::einval();
        };
        let key = self
            .events
            .list
            .iter()
            .find(|(_, e)| e.active && e.h_client == p.hClient && e.fd == p.fd)
            .map(|(&k, _)| k);
        p.Status = match key {
            Some(k) => {
                self.events.unlink(k);
                NV_OK
            }
            None => NV_ERR_INVALID_EVENT,
        };
        write(arg, &p);
        Outcome::os(p.Status)
    }

    /// NV_ESC_ATTACH_GPUS_TO_FD (nv.c): once per file (a second call is `-EINVAL`); each
    /// non-zero ID must be a GPU of the node (`nvidia_dev_get` fails otherwise: `-EINVAL`,
    /// and the file keeps no list). The simulated GPUs are always initialised, so the list
    /// only records what the file asked for.
    pub(super) fn attach_gpus(&mut self, rm: &Rm, caller: &Caller<'_>, arg: &[u8]) -> Outcome {
        let ids: Vec<u32> = arg
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let file = self.files.entry(caller.file).or_default();
        if !file.attached_gpus.is_empty() {
            return Outcome::einval();
        }
        let gpus = rm.config().gpus;
        if ids
            .iter()
            .any(|&id| id != 0 && gpus::gpu_index(id, gpus).is_none())
        {
            return Outcome::einval();
        }
        file.attached_gpus = ids;
        Outcome::os(NV_OK)
    }

    /// NV_ESC_REGISTER_FD links a GPU device file to a control file. In the simulation every
    /// escape arrives on a control file (there is no socket behind a GPU device file), and
    /// `RmIoctl` refuses to link a control file to itself (`ctl_nvfp == nvfp`:
    /// NV_ERR_INVALID_ARGUMENT, returned by `nvidia_ioctl` as `-EINVAL`); the daemon does not
    /// need it.
    pub(super) fn register_fd(&mut self) -> Outcome {
        let mut o = Outcome::os(NV_ERR_INVALID_ARGUMENT);
        o.errno = nix::libc::EINVAL;
        o
    }
}
