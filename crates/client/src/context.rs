//! [`Context`]: one connection to the node's driver, and the memory objects it hands out.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use memmap2::{MmapMut, MmapOptions};
use openimex_simproto::handle::{HexError, decode_hex_array, encode_hex};
use openimex_simproto::node_dir::{channel_files, socket_path};
use openimex_simproto::proto::{self, DriverStats, GpuInfo, IMPORT_ID_MAX, Request, Response};

use crate::error::CuError;

/// How long [`Context::import`] waits for the IMEX daemons to complete an import.
pub const DEFAULT_IMPORT_TIMEOUT: Duration = Duration::from_secs(30);

/// One wait for an import (the `Import` call's own, then each `WaitImport`) lasts at most
/// this long, so other threads' calls on the same context get their turn between waits.
const WAIT_SLICE: Duration = Duration::from_secs(1);

static NEXT_CONTEXT: AtomicU64 = AtomicU64::new(1);

/// A connection to the node's GPU driver: one RM client, as a CUDA context is.
///
/// Calls are serialized on the connection (a call that blocks in the driver, such as an
/// import wait or an import release, holds up the others), so a `Context` can be shared
/// between threads. Dropping it closes the connection, and the driver then frees everything
/// the context still owned, exactly as at process exit.
#[derive(Debug)]
pub struct Context {
    id: u64,
    sock: Mutex<UnixStream>,
    node_dir: PathBuf,
    fabric_dir: PathBuf,
    node_id: u16,
    gpus: Vec<GpuInfo>,
    channel: Option<u32>,
}

impl Context {
    /// Connects to the driver of the node in `node_dir` and, as libcuda does, subscribes to
    /// the first IMEX channel file (`dev/nvidia-caps-imex-channels/channelN`, lowest N first)
    /// that this process can open for reading and writing. With no such channel the context
    /// still opens; fabric calls then fail with [`CuError::NotPermitted`].
    ///
    /// Access is decided by opening the file, as libcuda does, so file permissions are the
    /// policy; note that root can open every channel file whatever its mode (use
    /// [`Context::open_with_channel`] to pick one). Fails with [`CuError::NoDevice`] if no
    /// driver listens on the node's socket.
    pub fn open(node_dir: &Path) -> Result<Context, CuError> {
        let mut ctx = Self::connect(node_dir)?;
        if let Some(file) = first_accessible_channel(node_dir) {
            ctx.subscribe(&file)?;
        }
        Ok(ctx)
    }

    /// As [`Context::open`], with an explicit channel file (`None`: subscribe to no channel).
    pub fn open_with_channel(node_dir: &Path, channel: Option<&Path>) -> Result<Context, CuError> {
        let mut ctx = Self::connect(node_dir)?;
        if let Some(path) = channel {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .map_err(|e| {
                    CuError::NotPermitted(format!(
                        "cannot open IMEX channel {}: {e}",
                        path.display()
                    ))
                })?;
            ctx.subscribe(&file)?;
        }
        Ok(ctx)
    }

    fn connect(node_dir: &Path) -> Result<Context, CuError> {
        let socket = socket_path(node_dir);
        let sock = UnixStream::connect(&socket).map_err(|e| CuError::NoDevice {
            socket: socket.clone(),
            reason: e.to_string(),
        })?;
        let hello = proto::call(
            &sock,
            &Request::Hello {
                pid: std::process::id(),
            },
            &[],
        )?;
        match hello {
            Response::Hello {
                node_id,
                gpus,
                fabric_dir,
            } => Ok(Context {
                id: NEXT_CONTEXT.fetch_add(1, Ordering::Relaxed),
                sock: Mutex::new(sock),
                node_dir: node_dir.to_path_buf(),
                fabric_dir: PathBuf::from(fabric_dir),
                node_id,
                gpus,
                channel: None,
            }),
            Response::Error { status, detail } => Err(CuError::from_driver(status, &detail, false)),
            other => Err(unexpected("Hello", &other)),
        }
    }

    /// Passes the open channel descriptor to the driver (SUBSCRIBE_TO_IMEX_CHANNEL).
    fn subscribe(&mut self, channel: &File) -> Result<(), CuError> {
        match self.call(&Request::SubscribeChannel, &[channel.as_raw_fd()], false)? {
            Response::Subscribed { channel } => {
                self.channel = Some(channel);
                Ok(())
            }
            other => Err(unexpected("SubscribeChannel", &other)),
        }
    }

    /// The node ID the driver reported when this context opened (0xFFFF: no IMEX daemon
    /// session then). [`Context::stats`] has the current one.
    pub fn node_id(&self) -> u16 {
        self.node_id
    }

    /// The node's GPUs, as the driver reported them when this context opened; their fabric
    /// probe may have moved on since ([`Context::gpu_fabric_info`] reads it now).
    pub fn gpus(&self) -> &[GpuInfo] {
        &self.gpus
    }

    /// The IMEX channel this context is subscribed to, if any.
    pub fn channel(&self) -> Option<u32> {
        self.channel
    }

    /// The node directory this context was opened on.
    pub fn node_dir(&self) -> &Path {
        &self.node_dir
    }

    /// cuMemCreate with the FABRIC handle type: `size` bytes (rounded up to 2 MiB by the
    /// driver; [`Mappable::size`] has the result) of HBM on local GPU `gpu`. Needs a channel.
    pub fn mem_create(&self, gpu: u32, size: u64) -> Result<Allocation, CuError> {
        match self.call(&Request::Create { gpu, size }, &[], false)? {
            Response::Created {
                mem,
                size,
                file,
                offset,
            } => Ok(Allocation {
                gpu,
                mem: self.mem_ref(mem, size, &file, offset),
            }),
            other => Err(unexpected("Create", &other)),
        }
    }

    /// cuMemExportToShareableHandle(FABRIC): the 64-byte handle peers import. Needs a channel;
    /// importers must hold the same one.
    pub fn export(&self, a: &Allocation) -> Result<FabricHandleBytes, CuError> {
        self.check_owner(&a.mem)?;
        match self.call(&Request::Export { mem: a.mem.handle }, &[], true)? {
            Response::Exported { handle } => FabricHandleBytes::from_hex(&handle).map_err(|_| {
                CuError::Unknown(format!(
                    "driver exported a malformed fabric handle {handle:?}"
                ))
            }),
            other => Err(unexpected("Export", &other)),
        }
    }

    /// cuMemImportFromShareableHandle(FABRIC): imports the handle and waits up to
    /// [`DEFAULT_IMPORT_TIMEOUT`] for the IMEX daemons to complete the import.
    pub fn import(&self, h: &FabricHandleBytes) -> Result<Imported, CuError> {
        self.import_with_timeout(h, DEFAULT_IMPORT_TIMEOUT)
    }

    /// As [`Context::import`], waiting at most `timeout`. [`CuError::NotReady`] means the
    /// bound passed; the pending import then stays with the driver until this context closes
    /// (releasing it would block on the daemons that are already late).
    /// An import that fails outright is released before the error is returned.
    ///
    /// The import ID is 0: every import of one handle on a node shares one import descriptor
    /// (one trip through the daemons), as [`Context::import_with_id`] explains.
    pub fn import_with_timeout(
        &self,
        h: &FabricHandleBytes,
        timeout: Duration,
    ) -> Result<Imported, CuError> {
        self.import_with_id(h, 0, timeout)
    }

    /// As [`Context::import_with_timeout`], with the import ID `id` (below 2^48 - 1, which the
    /// driver reserves for multicast). The driver keys import descriptors by (export UUID,
    /// `(id << 16) | index`) and the ID travels in the MEM_IMPORT event to the daemon
    /// (`docs/reference/driver-interface.md` §1.4, §1.6 "Import request"): imports of one handle
    /// with the same ID on a node share a descriptor, imports with different IDs each get
    /// their own (and their own exporter reference). Which IDs libcuda uses is not public;
    /// [`Context::import`] uses 0.
    ///
    /// Errors as the real driver returns them: no channel is [`CuError::NotPermitted`], a
    /// handle exported while its node had no IMEX daemon is [`CuError::NotSupported`], no IMEX
    /// daemon on this node is [`CuError::NotReady`] at once, an import the daemons failed is
    /// [`CuError::InvalidHandle`] (NV_ERR_INVALID_OBJECT), and an ID of 2^48 - 1 or more is
    /// [`CuError::InvalidValue`].
    pub fn import_with_id(
        &self,
        h: &FabricHandleBytes,
        id: u64,
        timeout: Duration,
    ) -> Result<Imported, CuError> {
        if id >= IMPORT_ID_MAX {
            return Err(CuError::InvalidValue(format!(
                "import ID {id} is not below 2^48 - 1 ({IMPORT_ID_MAX}, reserved for multicast)"
            )));
        }
        let deadline = Instant::now() + timeout;
        // The import and the first wait for it are one call (the driver answers when the wait
        // ends), so an import the daemons complete within a slice costs one round trip to the
        // driver; a longer one goes on with `WaitImport`, a slice at a time.
        let mut slice = deadline
            .saturating_duration_since(Instant::now())
            .min(WAIT_SLICE);
        let mut started = Instant::now();
        let req = Request::Import {
            handle: h.to_hex(),
            import_id: id,
            wait_ms: wait_ms(slice),
        };
        let (import, mut outcome) = match self.call(&req, &[], true) {
            Ok(Response::ImportWaited { import, outcome }) => (import, result(*outcome, true)),
            Ok(other) => return Err(unexpected("Import", &other)),
            Err(CuError::NotReady(text)) => {
                return Err(CuError::NotReady(format!(
                    "{text} (is this node's IMEX daemon running?)"
                )));
            }
            Err(e) => return Err(e),
        };
        loop {
            match outcome {
                Ok(Response::ImportReady { size, file, offset }) => {
                    return Ok(Imported {
                        mem: self.mem_ref(import, size, &file, offset),
                    });
                }
                Ok(other) => {
                    self.release_quietly(import);
                    return Err(unexpected("WaitImport", &other));
                }
                Err(CuError::NotReady(text)) => {
                    if Instant::now() >= deadline {
                        return Err(CuError::NotReady(format!(
                            "import not complete after {timeout:?} ({text})"
                        )));
                    }
                    // A driver that answers before the slice is over must not make this spin.
                    if started.elapsed() < slice / 2 {
                        std::thread::sleep(
                            Duration::from_millis(10)
                                .min(deadline.saturating_duration_since(Instant::now())),
                        );
                    }
                }
                Err(e @ CuError::Transport(_)) => return Err(e),
                Err(e) => {
                    self.release_quietly(import);
                    return Err(e);
                }
            }
            slice = deadline
                .saturating_duration_since(Instant::now())
                .min(WAIT_SLICE);
            started = Instant::now();
            let req = Request::WaitImport {
                import,
                timeout_ms: wait_ms(slice),
            };
            outcome = self.call(&req, &[], true);
        }
    }

    /// cuMemMap + cuMemSetAccess on GPU 0: [`Context::map_on`] with GPU 0, the device a
    /// single-GPU application maps for. Memory of this node maps on any of its GPUs, so for an
    /// [`Allocation`] the GPU makes no difference.
    pub fn map(&self, m: &impl Mappable) -> Result<Mapping, CuError> {
        self.map_on(m, 0)
    }

    /// cuMemMap + cuMemSetAccess for GPU `gpu`: maps the memory into this process (a shared
    /// mapping of the HBM file range, so stores are seen by every other mapping of it, on any
    /// node, with no copy). The mapping lasts until the [`Mapping`] is dropped (cuMemUnmap).
    ///
    /// The driver checks the mapping GPU first, as the real one does on the map and not on the
    /// import (`docs/reference/driver-interface.md` §1.6 "Map", §6.8): imported memory maps only on
    /// a GPU whose cliqueId, bwMode and bwModeEpoch equal the owner GPU's. A refusal is
    /// NV_ERR_INVALID_STATE, which the library reports as [`CuError::IllegalState`]
    /// (CUDA_ERROR_ILLEGAL_STATE, 401; which code libcuda returns from cuMemMap there is not
    /// public, see the crate's error table). A GPU not on the node is
    /// [`CuError::InvalidValue`].
    pub fn map_on(&self, m: &impl Mappable, gpu: u32) -> Result<Mapping, CuError> {
        let r = m.mem_ref();
        self.check_owner(r)?;
        match self.call(
            &Request::MapOnGpu {
                handle: r.handle,
                gpu,
            },
            &[],
            false,
        )? {
            Response::Ok => {}
            other => return Err(unexpected("MapOnGpu", &other)),
        }
        let os = |what: &str, e: std::io::Error| {
            CuError::OperatingSystem(format!("{what} {}: {e}", r.file.display()))
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&r.file)
            .map_err(|e| os("open", e))?;
        let file_len = file.metadata().map_err(|e| os("stat", e))?.len();
        let end = r.offset.checked_add(r.size);
        if end.is_none_or(|end| end > file_len) {
            return Err(CuError::OperatingSystem(format!(
                "{} is {file_len} bytes, shorter than the memory at offset {} + {}",
                r.file.display(),
                r.offset,
                r.size
            )));
        }
        let len = usize::try_from(r.size).map_err(|_| {
            CuError::InvalidValue(format!("{} bytes do not fit the address space", r.size))
        })?;
        // SAFETY: memmap2 requires that the file is not truncated and that nothing else
        // modifies the range while it is mapped, or the slices handed out may change under
        // the borrow checker. The file is simulated HBM: the driver sizes it once and never
        // shrinks it (checked above that the range lies inside it). Concurrent stores from
        // other mappings are the point of shared GPU memory; as with CUDA, ordering them is
        // the application's job (see the `Mapping` docs).
        let mmap = unsafe { MmapOptions::new().offset(r.offset).len(len).map_mut(&file) }
            .map_err(|e| os("mmap", e))?;
        Ok(Mapping { mmap })
    }

    /// cuMemRelease of an allocation or an import. Releasing an import blocks until the IMEX
    /// daemon acknowledged the unimport (the driver's unimport handshake).
    ///
    /// Drop mappings first: the driver may free or reuse the memory once it is released (a
    /// difference from CUDA, which keeps it until the last unmap). Dropping an [`Allocation`]
    /// or [`Imported`] without releasing it does nothing; the driver releases it when the
    /// context closes.
    pub fn release(&self, m: impl Mappable) -> Result<(), CuError> {
        let r = m.mem_ref();
        self.check_owner(r)?;
        match self.call(&Request::Release { handle: r.handle }, &[], true)? {
            Response::Ok => Ok(()),
            other => Err(unexpected("Release", &other)),
        }
    }

    /// The driver's counters (live allocations, exports, imports, references, clients …).
    pub fn stats(&self) -> Result<DriverStats, CuError> {
        match self.call(&Request::Stats, &[], false)? {
            Response::Stats(s) => Ok(s),
            other => Err(unexpected("Stats", &other)),
        }
    }

    /// One call on the connection; a driver error becomes its CUDA error.
    pub(crate) fn call(
        &self,
        req: &Request,
        fds: &[std::os::fd::RawFd],
        handle_arg: bool,
    ) -> Result<Response, CuError> {
        let sock = self.sock.lock().unwrap_or_else(PoisonError::into_inner);
        result(proto::call(&sock, req, fds)?, handle_arg)
    }

    fn release_quietly(&self, handle: u64) {
        let _ = self.call(&Request::Release { handle }, &[], true);
    }

    fn mem_ref(&self, handle: u64, size: u64, file: &str, offset: u64) -> MemRef {
        // A relative path names a file of the fabric directory.
        let file = self.fabric_dir.join(file);
        MemRef {
            ctx: self.id,
            handle,
            size,
            file,
            offset,
        }
    }

    /// The fabric directory (where the HBM files and multicast tables are).
    pub(crate) fn fabric_dir(&self) -> &Path {
        &self.fabric_dir
    }

    /// [`CuError::InvalidHandle`] unless this context owns `m`.
    pub(crate) fn check_mappable(&self, m: &impl Mappable) -> Result<(), CuError> {
        self.check_owner(m.mem_ref())
    }

    fn check_owner(&self, r: &MemRef) -> Result<(), CuError> {
        if r.ctx == self.id {
            Ok(())
        } else {
            Err(CuError::InvalidHandle(format!(
                "memory handle {} belongs to another context",
                r.handle
            )))
        }
    }
}

pub(crate) fn unexpected(req: &str, resp: &Response) -> CuError {
    CuError::Unknown(format!("driver answered {resp:?} to {req}"))
}

/// A driver answer as a result: its `Error` as the library's error (`handle_arg`: the call
/// took a handle, so an invalid object is an invalid handle).
fn result(resp: Response, handle_arg: bool) -> Result<Response, CuError> {
    match resp {
        Response::Error { status, detail } => {
            Err(CuError::from_driver(status, &detail, handle_arg))
        }
        resp => Ok(resp),
    }
}

/// A wait's bound in the driver's milliseconds: at least 1, as 0 asks an `Import` not to wait.
fn wait_ms(slice: Duration) -> u64 {
    u64::try_from(slice.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The first `channelN` (lowest N) under the node's channel directory that opens read-write.
fn first_accessible_channel(node_dir: &Path) -> Option<File> {
    channel_files(node_dir)
        .ok()?
        .into_iter()
        .find_map(|(_, p)| OpenOptions::new().read(true).write(true).open(p).ok())
}

mod sealed {
    use std::path::PathBuf;

    /// Where a memory object lives, and which context owns its handle.
    #[derive(Debug)]
    pub struct MemRef {
        pub(crate) ctx: u64,
        pub(crate) handle: u64,
        pub(crate) size: u64,
        pub(crate) file: PathBuf,
        pub(crate) offset: u64,
    }

    pub trait Sealed {
        fn mem_ref(&self) -> &MemRef;
    }
}

use sealed::MemRef;

/// A memory object of a [`Context`]: an [`Allocation`] or an [`Imported`] memory. It can be
/// mapped ([`Context::map`]) and released ([`Context::release`]).
pub trait Mappable: sealed::Sealed {
    /// Bytes (a multiple of 2 MiB).
    fn size(&self) -> u64 {
        self.mem_ref().size
    }

    /// The driver's handle of the object (for logs).
    fn handle(&self) -> u64 {
        self.mem_ref().handle
    }
}

/// Local fabric memory from [`Context::mem_create`].
#[derive(Debug)]
pub struct Allocation {
    gpu: u32,
    mem: MemRef,
}

impl Allocation {
    /// The GPU whose HBM holds it.
    pub fn gpu(&self) -> u32 {
        self.gpu
    }
}

impl sealed::Sealed for Allocation {
    fn mem_ref(&self) -> &MemRef {
        &self.mem
    }
}

impl Mappable for Allocation {}

/// Memory of another node (or this one), imported from a fabric handle by [`Context::import`].
#[derive(Debug)]
pub struct Imported {
    mem: MemRef,
}

impl sealed::Sealed for Imported {
    fn mem_ref(&self) -> &MemRef {
        &self.mem
    }
}

impl Mappable for Imported {}

/// A mapping of fabric memory into this process; unmapped on drop.
///
/// The bytes are shared with every other mapping of the same memory, in this process or any
/// other, on any simulated node: a store is visible to them at once. As with GPU memory under
/// CUDA, nothing orders those accesses: a program that reads while a peer writes must
/// synchronize with it out of band (a message, a barrier, a file), or it may read a mix.
/// If the node's driver restarts while memory is mapped, it resets its HBM files and an access
/// through the mapping faults (SIGBUS), as a GPU access after a driver reload would.
#[derive(Debug)]
pub struct Mapping {
    mmap: MmapMut,
}

impl Mapping {
    /// The mapped bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.mmap
    }

    /// The mapped bytes, for writing.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.mmap
    }
}

impl Deref for Mapping {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.mmap
    }
}

impl DerefMut for Mapping {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.mmap
    }
}

/// A 64-byte fabric handle (CUmemFabricHandle): opaque bytes an application ships to its
/// peers out of band. Text form: 128 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct FabricHandleBytes(pub [u8; 64]);

impl FabricHandleBytes {
    /// 128 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        encode_hex(&self.0)
    }

    /// Parses 128 hex digits (either case; surrounding white space ignored); anything else is
    /// [`CuError::InvalidValue`]. Whether the bytes name an export is the driver's call.
    pub fn from_hex(s: &str) -> Result<Self, CuError> {
        decode_hex_array(s).map(Self).map_err(|e: HexError| {
            CuError::InvalidValue(format!(
                "a fabric handle is 128 hex digits, not {:?} ({e})",
                truncate(s.trim(), 40)
            ))
        })
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8; 64] {
        &self.0
    }
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

impl fmt::Display for FabricHandleBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for FabricHandleBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FabricHandleBytes({})", self.to_hex())
    }
}

impl FromStr for FabricHandleBytes {
    type Err = CuError;

    fn from_str(s: &str) -> Result<Self, CuError> {
        Self::from_hex(s)
    }
}

impl From<[u8; 64]> for FabricHandleBytes {
    fn from(b: [u8; 64]) -> Self {
        Self(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openimex_simproto::handle::{ExportUuid, FabricHandle};
    use openimex_simproto::node_dir::channels_dir;

    #[test]
    fn handle_hex_round_trips_and_matches_the_driver_encoding() {
        let h = FabricHandle {
            export_uuid: ExportUuid::new(5, 2),
            index: 0,
            size: 2 << 20,
            cluster_uuid: [0xab; 16],
        };
        let bytes = FabricHandleBytes(h.to_bytes());
        assert_eq!(bytes.to_hex(), h.to_hex());
        assert_eq!(
            FabricHandleBytes::from_hex(&bytes.to_hex()).ok(),
            Some(bytes)
        );
        assert_eq!(
            format!(" {bytes}\n").parse::<FabricHandleBytes>().ok(),
            Some(bytes)
        );
        assert_eq!(
            FabricHandleBytes::from_hex(&bytes.to_hex().to_uppercase()).ok(),
            Some(bytes)
        );
        for bad in [
            "",
            "00",
            &"g".repeat(128),
            &"0".repeat(127),
            &"0".repeat(130),
            &"é".repeat(64),
        ] {
            let e = FabricHandleBytes::from_hex(bad).err();
            assert_eq!(e.as_ref().map(CuError::code), Some(1), "{bad:?}");
        }
    }

    #[test]
    fn channels_are_chosen_lowest_number_first() {
        let dir = std::env::temp_dir().join(format!("openimex-client-ch-{}", std::process::id()));
        let ch = channels_dir(&dir);
        std::fs::create_dir_all(&ch).unwrap();
        assert!(first_accessible_channel(&dir).is_none());
        for name in ["channel10", "channel2", "channelx", "other3"] {
            std::fs::write(ch.join(name), b"").unwrap();
        }
        let f = first_accessible_channel(&dir).unwrap();
        let link = std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
        assert!(link.ends_with("channel2"), "{}", link.display());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
