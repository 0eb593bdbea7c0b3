//! HBM: one sparse file per GPU in the fabric directory, and a first-fit allocator over it in
//! [`PAGE_SIZE`] units. Freed ranges are zeroed (a punched hole, or written zeros where the
//! filesystem cannot punch) before they can be handed out again, so reused memory never shows
//! a previous owner's data.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{FallocateFlags, Flock, FlockArg, fallocate};

use crate::fla::GpuAddr;
use openimex_simproto::proto::PAGE_SIZE;

/// One GPU's HBM.
#[derive(Debug)]
struct GpuMem {
    /// The backing file, locked exclusively for as long as this driver lives, so a second driver
    /// configured with the same slot cannot zero our memory under us.
    file: Flock<File>,
    /// Where it is (what `Created`/`ImportReady` report).
    path: PathBuf,
    /// Total pages.
    pages: u64,
    /// Free ranges: first page → number of pages. Adjacent ranges are always merged.
    free: BTreeMap<u64, u64>,
}

/// Every GPU's HBM on this node.
#[derive(Debug)]
pub(crate) struct Hbm {
    gpus: Vec<GpuMem>,
}

impl Hbm {
    /// Creates (or resets to zero) the HBM files of `gpus` GPUs of node slot `slot`.
    ///
    /// A file left by an earlier run of this slot is zeroed: a restarted driver starts with
    /// empty HBM, as a GPU does after a driver reload.
    pub(crate) fn create(
        fabric_dir: &Path,
        slot: u16,
        gpus: u32,
        hbm_bytes: u64,
    ) -> io::Result<Self> {
        let pages = hbm_bytes / PAGE_SIZE;
        if pages == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "HBM size {hbm_bytes} bytes is smaller than one {PAGE_SIZE}-byte fabric page"
                ),
            ));
        }
        let mut out = Vec::new();
        for gpu in 0..gpus {
            let path = GpuAddr { node: slot, gpu }.hbm_file(fabric_dir);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)?;
            let file = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
                io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is locked by another simulated driver (slot {slot} already running?): {e}", path.display()),
                )
            })?;
            // Zeroed in place, never shrunk to nothing first: importers on other nodes may
            // still map this file (until their daemons revoke them), and a mapped page beyond
            // the end of a file is SIGBUS, not the zeros of freed memory.
            file.set_len(pages * PAGE_SIZE)?;
            zero(&file, 0, pages * PAGE_SIZE)?;
            out.push(GpuMem {
                file,
                path,
                pages,
                free: BTreeMap::from([(0, pages)]),
            });
        }
        Ok(Self { gpus: out })
    }

    /// Number of GPUs.
    pub(crate) fn gpu_count(&self) -> u32 {
        u32::try_from(self.gpus.len()).unwrap_or(u32::MAX)
    }

    /// Bytes of HBM per GPU.
    pub(crate) fn bytes_per_gpu(&self) -> u64 {
        self.gpus.first().map_or(0, |g| g.pages * PAGE_SIZE)
    }

    /// The HBM file of `gpu`.
    pub(crate) fn path(&self, gpu: u32) -> Option<&Path> {
        self.gpus.get(gpu as usize).map(|g| g.path.as_path())
    }

    /// First fit: the byte offset of `pages` free contiguous pages on `gpu`, now taken.
    pub(crate) fn alloc(&mut self, gpu: u32, pages: u64) -> Option<u64> {
        let g = self.gpus.get_mut(gpu as usize)?;
        let (&start, &len) = g.free.iter().find(|(_, len)| **len >= pages)?;
        g.free.remove(&start);
        if len > pages {
            g.free.insert(start + pages, len - pages);
        }
        Some(start * PAGE_SIZE)
    }

    /// Returns `[offset, offset + size)` of `gpu` to the free list, zeroed.
    pub(crate) fn free(&mut self, gpu: u32, offset: u64, size: u64) {
        let Some(g) = self.gpus.get_mut(gpu as usize) else {
            return;
        };
        if let Err(e) = zero(&g.file, offset, size) {
            // Not fatal for the simulation's bookkeeping, but reused memory could show old
            // bytes: say so loudly.
            tracing::error!(path = %g.path.display(), offset, size, "could not zero freed HBM: {e}");
        }
        let mut start = offset / PAGE_SIZE;
        let mut len = size / PAGE_SIZE;
        if let Some((&prev, &plen)) = g.free.range(..start).next_back()
            && prev + plen == start
        {
            g.free.remove(&prev);
            start = prev;
            len += plen;
        }
        if let Some(nlen) = g.free.remove(&(start + len)) {
            len += nlen;
        }
        g.free.insert(start, len);
    }

    /// Bytes allocated, all GPUs.
    pub(crate) fn used(&self) -> u64 {
        self.gpus
            .iter()
            .map(|g| (g.pages - g.free.values().sum::<u64>()) * PAGE_SIZE)
            .sum()
    }
}

/// Zeroes a byte range: punch a hole (keeps the size, frees the blocks), or write zeros.
fn zero(file: &File, offset: u64, size: u64) -> io::Result<()> {
    let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(size)) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "range beyond off_t",
        ));
    };
    let punch = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
    if fallocate(file, punch, off, len).is_ok() {
        return Ok(());
    }
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK as usize];
    let mut done = 0;
    while done < size {
        let n = CHUNK.min(size - done);
        file.write_all_at(&zeros[..n as usize], offset + done)?;
        done += n;
    }
    Ok(())
}
