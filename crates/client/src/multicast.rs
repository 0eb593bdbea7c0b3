//! Multicast (NVLS) objects, shaped like CUDA's cuMulticast* API
//! (`docs/reference/driver-interface.md` §3, §1.6 "Multicast (NVLS) across nodes"):
//! [`Context::multicast_create`] (cuMulticastCreate) for a team of `num_devices` GPUs,
//! [`Multicast::export`] to a 64-byte fabric handle that other trays
//! [`Context::multicast_import`], [`Multicast::add_device`] (cuMulticastAddDevice) on every
//! member GPU, [`Multicast::bind_mem`] (cuMulticastBindMem) of each member's memory, and
//! [`Multicast::map`], whose [`McMapping::store`] lands in every bound GPU's memory and whose
//! [`McMapping::load_reduce_u32`] / [`McMapping::load_reduce_f32`] sum the members' values as
//! `multimem.ld_reduce` does.
//!
//! The team exists only once every member GPU was added (the Fabric Manager sets it up after
//! the last attach); binding and mapping wait for it, as cuMulticastBindMem blocks. A mapping
//! reaches the memory bound when it was made: map after every member bound (NCCL's ranks bind,
//! then meet at a barrier, then use it).
//!
//! ```no_run
//! use std::path::Path;
//! use openimex_client::Context;
//! let ctx = Context::open(Path::new("/run/openimex/node0"))?;
//! let size = 2 << 20;
//! let mc = ctx.multicast_create(2, size)?;
//! let mems = [ctx.mem_create(0, size)?, ctx.mem_create(1, size)?];
//! for m in &mems {
//!     mc.add_device(m.gpu())?;
//! }
//! for m in &mems {
//!     mc.bind_mem(m.gpu(), 0, m, 0, size)?;
//! }
//! let mut map = mc.map()?;
//! map.store(0, &7u32.to_le_bytes())?; // both GPUs' memory now starts with 7
//! assert_eq!(map.load_reduce_u32(0, 1)?, vec![14]);
//! # Ok::<(), openimex_client::CuError>(())
//! ```

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use memmap2::{MmapMut, MmapOptions};
use openimex_simproto::multicast::{McBind, McBinding, McInfo, McRequest, McResponse};
use openimex_simproto::proto::{PAGE_SIZE, Request, Response};

use crate::context::{Allocation, Context, FabricHandleBytes, unexpected};
use crate::error::CuError;

/// How long binding and mapping wait for the team (every member added) by default.
pub const DEFAULT_TEAM_TIMEOUT: Duration = Duration::from_secs(30);

/// A multicast object of a [`Context`] (prime or imported). Dropping it does nothing; the
/// driver frees it at [`Multicast::release`] or when the context closes.
#[derive(Debug)]
pub struct Multicast<'a> {
    ctx: &'a Context,
    mc: u64,
}

impl Context {
    /// cuMulticastCreate: a team of `num_devices` GPUs (on any trays) over `size` bytes, a
    /// multiple of [`Context::multicast_granularity`].
    pub fn multicast_create(&self, num_devices: u32, size: u64) -> Result<Multicast<'_>, CuError> {
        let req = McRequest::Create {
            num_gpus: num_devices,
            size,
            page_size: 0,
        };
        self.mc_object(req, false)
    }

    /// Imports a multicast handle exported on another tray (or this one). Needs the
    /// exporter's IMEX channel.
    pub fn multicast_import(&self, h: &FabricHandleBytes) -> Result<Multicast<'_>, CuError> {
        self.mc_object(McRequest::Import { handle: h.to_hex() }, true)
    }

    /// cuMulticastGetGranularity: sizes and offsets are multiples of this (the fabric's page;
    /// real NVLS uses 512 MiB, the simulation's small HBM uses 2 MiB).
    pub fn multicast_granularity(&self) -> u64 {
        PAGE_SIZE
    }

    fn mc_object(&self, req: McRequest, handle_arg: bool) -> Result<Multicast<'_>, CuError> {
        match self.call(&Request::Multicast(req), &[], handle_arg)? {
            Response::Multicast(McResponse::Object { mc }) => Ok(Multicast { ctx: self, mc }),
            other => Err(unexpected("multicast create/import", &other)),
        }
    }
}

impl Multicast<'_> {
    /// The driver's handle of the object (for logs).
    pub fn handle(&self) -> u64 {
        self.mc
    }

    /// cuMemExportToShareableHandle(FABRIC) of the prime object: the 64-byte handle other
    /// trays import. Needs a channel.
    pub fn export(&self) -> Result<FabricHandleBytes, CuError> {
        match self.call(McRequest::Export { mc: self.mc }, true)? {
            Response::Multicast(McResponse::Exported { handle }) => {
                FabricHandleBytes::from_hex(&handle)
            }
            other => Err(unexpected("multicast export", &other)),
        }
    }

    /// cuMulticastAddDevice: local GPU `gpu` joins the team. The last member's add makes the
    /// Fabric Manager set the team up; on an imported object the add goes to the owner's
    /// node through the IMEX daemons.
    pub fn add_device(&self, gpu: u32) -> Result<(), CuError> {
        self.ok(McRequest::AttachGpu { mc: self.mc, gpu })
    }

    /// cuMulticastBindMem: binds `size` bytes of `mem` (at `mem_offset`, on local GPU `gpu`,
    /// which was added) at `offset` of the object. Waits up to [`DEFAULT_TEAM_TIMEOUT`] for
    /// the team.
    pub fn bind_mem(
        &self,
        gpu: u32,
        offset: u64,
        mem: &Allocation,
        mem_offset: u64,
        size: u64,
    ) -> Result<(), CuError> {
        self.ctx.check_mappable(mem)?;
        self.info(DEFAULT_TEAM_TIMEOUT)?;
        let bind = McBind {
            gpu,
            offset,
            mem: crate::context::Mappable::handle(mem),
            mem_offset,
            size,
        };
        self.ok(McRequest::AttachMem { mc: self.mc, bind })
    }

    /// The object's sizes, counts and team, waiting up to `timeout` for the team
    /// ([`CuError::NotReady`] once it passed; a failed team's error at once).
    pub fn info(&self, timeout: Duration) -> Result<McInfo, CuError> {
        let wait_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        match self.call(
            McRequest::GetInfo {
                mc: self.mc,
                wait_ms,
            },
            false,
        )? {
            Response::Multicast(McResponse::Info(info)) => Ok(info),
            other => Err(unexpected("multicast info", &other)),
        }
    }

    /// Maps the object: every memory range bound to it so far, on every member's tray. Waits
    /// up to [`DEFAULT_TEAM_TIMEOUT`] for the team.
    pub fn map(&self) -> Result<McMapping, CuError> {
        let info = self.info(DEFAULT_TEAM_TIMEOUT)?;
        let dir = info
            .table_dir
            .as_deref()
            .map(PathBuf::from)
            .ok_or_else(|| {
                CuError::Unknown("the driver set the team up without a multicast table".into())
            })?;
        let os = |what: &str, e: std::io::Error| {
            CuError::OperatingSystem(format!("{what} {}: {e}", dir.display()))
        };
        let mut ranges = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| os("read", e))? {
            let path = entry.map_err(|e| os("read", e))?.path();
            if path.extension().is_none_or(|x| x != "json") {
                continue; // a binding being written
            }
            let text = fs::read(&path).map_err(|e| os("read", e))?;
            let b: McBinding = serde_json::from_slice(&text).map_err(|e| {
                CuError::OperatingSystem(format!("{}: not a binding: {e}", path.display()))
            })?;
            ranges.push(self.map_binding(b)?);
        }
        ranges.sort_by_key(|r| r.mc_offset);
        let stamp = table_stamp(&dir);
        Ok(McMapping {
            size: info.size,
            ranges,
            dir,
            stamp: Mutex::new(stamp),
        })
    }

    /// cuMemRelease of the object. Bound memory stays allocated until its last object goes.
    pub fn release(self) -> Result<(), CuError> {
        match self
            .ctx
            .call(&Request::Release { handle: self.mc }, &[], true)?
        {
            Response::Ok => Ok(()),
            other => Err(unexpected("Release", &other)),
        }
    }

    fn map_binding(&self, b: McBinding) -> Result<Range, CuError> {
        let file = self.ctx.fabric_dir().join(&b.file);
        let os = |what: &str, e: std::io::Error| {
            CuError::OperatingSystem(format!("{what} {}: {e}", file.display()))
        };
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
            .map_err(|e| os("open", e))?;
        let len = f.metadata().map_err(|e| os("stat", e))?.len();
        if b.file_offset
            .checked_add(b.size)
            .is_none_or(|end| end > len)
        {
            return Err(CuError::OperatingSystem(format!(
                "{} is {len} bytes, shorter than the bound range at {} + {}",
                file.display(),
                b.file_offset,
                b.size
            )));
        }
        let size = usize::try_from(b.size)
            .map_err(|_| CuError::InvalidValue(format!("{} bytes do not fit", b.size)))?;
        // SAFETY: as for `Context::map`: the file is simulated HBM that its driver sizes once
        // and never shrinks (the range was checked to lie inside it); concurrent stores by
        // other mappings are shared GPU memory's point, and ordering them is the program's job.
        let mmap = unsafe {
            MmapOptions::new()
                .offset(b.file_offset)
                .len(size)
                .map_mut(&f)
        }
        .map_err(|e| os("mmap", e))?;
        Ok(Range {
            mc_offset: b.mc_offset,
            binding: b,
            mmap,
        })
    }

    fn ok(&self, req: McRequest) -> Result<(), CuError> {
        match self.call(req, false)? {
            Response::Ok => Ok(()),
            other => Err(unexpected("multicast control", &other)),
        }
    }

    fn call(&self, req: McRequest, handle_arg: bool) -> Result<Response, CuError> {
        self.ctx.call(&Request::Multicast(req), &[], handle_arg)
    }
}

/// One bound range, mapped.
#[derive(Debug)]
struct Range {
    mc_offset: u64,
    binding: McBinding,
    mmap: MmapMut,
}

/// A mapping of a multicast object: stores go to every bound member memory, load-reduces read
/// them all. Unmapped on drop.
#[derive(Debug)]
pub struct McMapping {
    size: u64,
    ranges: Vec<Range>,
    /// The team's table, and its modification time when mapped: while it is unchanged every
    /// mapped range is still bound.
    dir: PathBuf,
    stamp: Mutex<Option<SystemTime>>,
}

impl McMapping {
    /// The object's bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The bound ranges mapped: (GPU's tray slot, GPU index, offset in the object, bytes).
    pub fn bindings(&self) -> Vec<(u16, u32, u64, u64)> {
        self.ranges
            .iter()
            .map(|r| {
                let b = &r.binding;
                (b.gpu.slot, b.gpu.gpu, b.mc_offset, b.size)
            })
            .collect()
    }

    /// A multicast store: `bytes` at `offset` of the object land in every member memory bound
    /// there (the NVSwitch replicates the write).
    pub fn store(&mut self, offset: u64, bytes: &[u8]) -> Result<(), CuError> {
        let len = self.check(offset, bytes.len())?;
        let live = self.live();
        for (r, _) in self.ranges.iter_mut().zip(live).filter(|(_, l)| *l) {
            if let Some((at, from, n)) = overlap(r.mc_offset, r.binding.size, offset, len) {
                r.mmap[at..at + n].copy_from_slice(&bytes[from..from + n]);
            }
        }
        Ok(())
    }

    /// `multimem.ld_reduce.add.u32`: `count` u32 (little-endian) at `offset`, each the
    /// wrapping sum over every member memory bound there.
    pub fn load_reduce_u32(&self, offset: u64, count: usize) -> Result<Vec<u32>, CuError> {
        let mut sum = vec![0u32; count];
        self.reduce(offset, &mut sum, |s, b| {
            *s = s.wrapping_add(u32::from_le_bytes(b));
        })?;
        Ok(sum)
    }

    /// `multimem.ld_reduce.add.f32`: `count` f32 (little-endian) at `offset`, each the sum
    /// over every member memory bound there.
    pub fn load_reduce_f32(&self, offset: u64, count: usize) -> Result<Vec<f32>, CuError> {
        let mut sum = vec![0f32; count];
        self.reduce(offset, &mut sum, |s, b| *s += f32::from_le_bytes(b))?;
        Ok(sum)
    }

    /// Calls `add(&mut sum[i], bytes)` for element `i` (4 bytes at `offset + 4i`) of every
    /// range covering it. Range by range over plain slices, so the compiler can vectorise the
    /// integer sum: this loop is what bounds an all-reduce through the simulated switch.
    fn reduce<T>(
        &self,
        offset: u64,
        sum: &mut [T],
        add: impl Fn(&mut T, [u8; 4]),
    ) -> Result<(), CuError> {
        if !offset.is_multiple_of(4) {
            return Err(CuError::InvalidValue(format!(
                "load-reduce at offset {offset}: elements are 4-byte aligned"
            )));
        }
        let count = sum.len();
        let bytes = count
            .checked_mul(4)
            .ok_or_else(|| CuError::InvalidValue(format!("{count} elements is too many")))?;
        let len = self.check(offset, bytes)?;
        let live = self.live();
        for (r, _) in self.ranges.iter().zip(live).filter(|(_, l)| *l) {
            // Ranges start on pages and the access on 4 bytes: `from` and `n` are whole
            // elements.
            if let Some((at, from, n)) = overlap(r.mc_offset, r.binding.size, offset, len) {
                let src = &r.mmap[at..at + n];
                for (s, b) in sum[from / 4..(from + n) / 4]
                    .iter_mut()
                    .zip(src.chunks_exact(4))
                {
                    add(s, [b[0], b[1], b[2], b[3]]);
                }
            }
        }
        Ok(())
    }

    /// Which mapped ranges are still bound. The switch stops replicating to a member the moment
    /// its driver detaches the memory (`_memorymulticastfabricDetachMem`): a store through an
    /// older mapping must not land in memory that was freed and maybe reused. The table's
    /// modification time says whether anything changed since the mapping (one `stat` per
    /// access); if it did, each range counts only while its binding is still listed as mapped.
    fn live(&self) -> Vec<bool> {
        let now = table_stamp(&self.dir);
        let mut stamp = self.stamp.lock().unwrap_or_else(|e| e.into_inner());
        if now.is_some() && now == *stamp {
            return vec![true; self.ranges.len()];
        }
        let live: Vec<bool> = self
            .ranges
            .iter()
            .map(|r| {
                fs::read(self.dir.join(r.binding.file_name()))
                    .ok()
                    .and_then(|text| serde_json::from_slice::<McBinding>(&text).ok())
                    .is_some_and(|b| b == r.binding)
            })
            .collect();
        if live.iter().all(|l| *l) {
            // Only bindings added (or nothing that matters): the fast path again.
            *stamp = now;
        }
        live
    }

    /// `len` bytes at `offset` must lie in the object.
    fn check(&self, offset: u64, len: usize) -> Result<u64, CuError> {
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(CuError::InvalidValue(format!(
                "{len} bytes at offset {offset} are outside the {}-byte multicast object",
                self.size
            )));
        }
        Ok(len)
    }
}

/// The modification time of the team's table `dir` (None once it is gone).
fn table_stamp(dir: &Path) -> Option<SystemTime> {
    fs::metadata(dir).and_then(|m| m.modified()).ok()
}

/// Where the access `[offset, offset + len)` meets the range `[start, start + size)`: (index in
/// the range, index in the access, bytes), or `None`.
fn overlap(start: u64, size: u64, offset: u64, len: u64) -> Option<(usize, usize, usize)> {
    let lo = start.max(offset);
    let hi = (start + size).min(offset + len);
    if lo >= hi {
        return None;
    }
    let at = usize::try_from(lo - start).ok()?;
    let from = usize::try_from(lo - offset).ok()?;
    let n = usize::try_from(hi - lo).ok()?;
    Some((at, from, n))
}

#[cfg(test)]
mod tests {
    use super::overlap;

    #[test]
    fn overlaps_are_clipped_to_both_sides() {
        assert_eq!(overlap(0, 8, 0, 8), Some((0, 0, 8)));
        assert_eq!(overlap(8, 8, 4, 8), Some((0, 4, 4)));
        assert_eq!(overlap(8, 8, 12, 100), Some((4, 0, 4)));
        assert_eq!(overlap(8, 8, 0, 8), None);
        assert_eq!(overlap(8, 8, 16, 4), None);
    }
}
