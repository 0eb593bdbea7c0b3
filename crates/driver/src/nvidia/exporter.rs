//! The exporting node's side (`docs/reference/driver-interface.md` §1.6 "Daemon A"): dup the
//! export by UUID on the importer's channel, IMPORT_MEM its memory into this client, DESCRIBE
//! it in chunks of 512 PFNs, keep both dups for as long as the remote import lives (§4: they
//! keep the memory alive after the exporter frees it), free them on unimport or peer loss.
//! Multicast (§1.6 "Multicast" 4): the same dup reaches the prime object for
//! ATTACH_REMOTE_GPU, or SET_FAILURE.

use openimex_core::NodeId;
use openimex_rmabi::NvHandle;
use openimex_rmabi::class::nv00e0::{NV_MEMORY_EXPORT, NV00E0_ALLOCATION_PARAMETERS};
use openimex_rmabi::ctrl::nv00e0::{NV00E0_CTRL_CMD_IMPORT_MEM, NV00E0_CTRL_IMPORT_MEM_PARAMS};
use openimex_rmabi::ctrl::nv00f8::{Describe, NV00F8_CTRL_CMD_DESCRIBE};
use openimex_rmabi::ctrl::nv00fd::{
    AttachRemoteGpu, NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU, NV00FD_CTRL_CMD_SET_FAILURE,
    NV00FD_CTRL_SET_FAILURE_PARAMS,
};
use zerocopy::{FromZeros, IntoBytes};

use smallvec::SmallVec;

use super::rm::{RmCall, RmError};
use super::{Dup, Nvidia, error, lock, nv_status};
use crate::multicast::RemoteGpuAttach;
use crate::{DriverError, Pages, Status};

fn abi(call: &'static str) -> impl FnOnce(openimex_rmabi::AbiError) -> RmError {
    move |source| RmError::Abi {
        call: call.into(),
        source,
    }
}

thread_local! {
    /// DESCRIBE's parameter block, kept by the thread that describes.
    static DESCRIBE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Nvidia {
    /// RM_ALLOC NV_MEMORY_EXPORT with DUP_BY_UUID on `channel`, then IMPORT_MEM of the
    /// object attached at `index`: the two dups, the memory's under the parent the RM chose.
    fn dup_export(&self, uuid: [u8; 16], index: u16, channel: u32) -> Result<Dup, RmError> {
        self.dup_export_and(uuid, index, channel, None)
            .map(|(dup, _)| dup)
    }

    /// [`Nvidia::dup_export`], and `then` (a control on the memory dup: its command and
    /// parameters) after it, as one batch: the handles are this client's choice, so neither
    /// the IMPORT_MEM nor `then` waits for the answer before it. The first failure of the dup
    /// in order is the error (an empty slot is IMPORT_MEM's, as one by one), and whatever was
    /// made is freed; `then`'s outcome comes beside the dups.
    fn dup_export_and(
        &self,
        uuid: [u8; 16],
        index: u16,
        channel: u32,
        then: Option<(u32, &mut [u8])>,
    ) -> Result<(Dup, Result<(), RmError>), RmError> {
        let client = self.rm.handle();
        let (export, memory) = (self.rm.new_handle(), self.rm.new_handle());
        let mut params = NV00E0_ALLOCATION_PARAMETERS::dup_by_uuid(uuid, channel);
        let mut import = NV00E0_CTRL_IMPORT_MEM_PARAMS::new_zeroed();
        import.index = index;
        import.numHandles = 1;
        import.handles[0] = memory;
        let forget = |e: RmError| {
            self.rm.recycle(export);
            self.rm.recycle(memory);
            e
        };
        let mut calls: SmallVec<[RmCall<'_>; 3]> = SmallVec::new();
        calls.push(RmCall::Alloc {
            parent: client,
            handle: export,
            class: NV_MEMORY_EXPORT,
            params: params.as_mut_bytes(),
        });
        calls.push(RmCall::Control {
            object: export,
            cmd: NV00E0_CTRL_CMD_IMPORT_MEM,
            params: import.as_mut_bytes(),
        });
        if let Some((cmd, params)) = then {
            calls.push(RmCall::Control {
                object: memory,
                cmd,
                params,
            });
        }
        let mut outcomes = self.rm.calls_each(&mut calls).map_err(forget)?.into_iter();
        drop(calls);
        // One outcome per call, in order.
        let mut next = || outcomes.next().unwrap_or_else(|| Err(lost_answer()));
        next().map_err(forget)?;
        let parent = import.memInfos[0].hParent;
        if let Err(e) = next().and_then(|()| empty_slot(index, parent)) {
            let _ = self.rm.free(client, export);
            return Err(forget(e));
        }
        let dup = Dup {
            export,
            memory,
            memory_parent: parent,
        };
        Ok((dup, next()))
    }

    fn free_dup(&self, dup: Dup) -> Result<(), RmError> {
        let memory = self.rm.free(dup.memory_parent, dup.memory);
        let export = self.rm.free(self.rm.handle(), dup.export);
        if memory.is_ok() {
            self.rm.recycle(dup.memory);
        }
        if export.is_ok() {
            self.rm.recycle(dup.export);
        }
        memory.and(export)
    }

    /// The dups of [`Nvidia::dup_export`] and the first DESCRIBE of the memory (offset 0),
    /// as one batch ([`Nvidia::dup_export_and`]); the dups are freed if the DESCRIBE fails.
    fn dup_and_describe(
        &self,
        uuid: [u8; 16],
        index: u16,
        channel: u32,
    ) -> Result<(Dup, Describe), RmError> {
        DESCRIBE.with_borrow_mut(|describe| {
            describe_request(describe, self.layout.describe_params_size(), 0);
            let (dup, described) = self.dup_export_and(
                uuid,
                index,
                channel,
                Some((NV00F8_CTRL_CMD_DESCRIBE, describe)),
            )?;
            match described
                .and_then(|()| Describe::decode(self.layout, describe).map_err(abi("DESCRIBE")))
            {
                Ok(first) => Ok((dup, first)),
                Err(e) => {
                    let _ = self.free_dup(dup);
                    Err(e)
                }
            }
        })
    }

    /// The pages of `memory`, from its first DESCRIBE (`d`, offset 0) and more at offsets
    /// 512, 1024, … until every PFN is read.
    fn describe_from(&self, memory: NvHandle, mut d: Describe) -> Result<Pages, RmError> {
        let mut pfns: Vec<u64> = Vec::new();
        loop {
            if d.pfns.is_empty() && (pfns.len() as u64) < d.total_pfns {
                return Err(RmError::Status {
                    call: format!(
                        "DESCRIBE at offset {} of {} returned no PFN",
                        pfns.len(),
                        d.total_pfns
                    ),
                    status: openimex_rmabi::status::NV_ERR_INVALID_STATE,
                });
            }
            pfns.extend(d.pfns.iter().map(|&p| u64::from(p)));
            if pfns.len() as u64 >= d.total_pfns {
                return Ok(Pages {
                    size: d.attrs.size,
                    page_size: d.attrs.page_size,
                    pfns,
                    clique_id: d.attrs.clique_id,
                    bw_mode: d.attrs.bw_mode,
                    bw_mode_epoch: d.attrs.bw_mode_epoch,
                    kind: d.attrs.kind,
                    phys_addr_space: d.phys_attrs.addressSpace,
                    compression_coverage: d.phys_attrs.compressionCoverage,
                    mem_flags: d.mem_flags,
                });
            }
            d = DESCRIBE.with_borrow_mut(|params| {
                let offset = pfns.len() as u64;
                describe_request(params, self.layout.describe_params_size(), offset);
                self.rm.control(memory, NV00F8_CTRL_CMD_DESCRIBE, params)?;
                Describe::decode(self.layout, params).map_err(abi("DESCRIBE"))
            })?;
        }
    }
}

/// DESCRIBE's request in `params`: all zero but `offset` (the block's first field).
fn describe_request(params: &mut Vec<u8>, size: usize, offset: u64) {
    params.clear();
    params.resize(size, 0);
    params[..8].copy_from_slice(&offset.to_ne_bytes());
}

/// An empty slot at `index` imports nothing and says NV_OK with a zero entry
/// (`memoryexportCtrlImportMem`): there is no memory to describe.
fn empty_slot(index: u16, parent: NvHandle) -> Result<(), RmError> {
    if parent == 0 {
        return Err(RmError::Status {
            call: format!("IMPORT_MEM: nothing attached at index {index}"),
            status: openimex_rmabi::status::NV_ERR_OBJECT_NOT_FOUND,
        });
    }
    Ok(())
}

/// The outcome of a call a batch did not answer (never: it answers one per call, in order).
fn lost_answer() -> RmError {
    RmError::Status {
        call: "a batch's answers".into(),
        status: openimex_rmabi::status::NV_ERR_INVALID_STATE,
    }
}

/// [`crate::Driver::describe_export`]: the dups, then the pages; the reference is the
/// memory dup's handle.
pub(super) fn describe(
    nv: &Nvidia,
    uuid: [u8; 16],
    index: u16,
    channel: u32,
) -> Result<(u64, Pages), DriverError> {
    nv.session()?;
    let (dup, first) = nv
        .dup_and_describe(uuid, index, channel)
        .map_err(|e| error("describe", e))?;
    match nv.describe_from(dup.memory, first) {
        Ok(pages) => {
            lock(&nv.dups)?.insert(u64::from(dup.memory), dup);
            Ok((u64::from(dup.memory), pages))
        }
        Err(e) => {
            let _ = nv.free_dup(dup);
            Err(error("describe", e))
        }
    }
}

/// [`crate::Driver::release_export_ref`]: RM_FREE of both dups.
pub(super) fn release(nv: &Nvidia, export_ref: u64) -> Result<(), DriverError> {
    let Some(dup) = lock(&nv.dups)?.remove(&export_ref) else {
        return Err(DriverError::Refused {
            call: "release export reference",
            status: Status::InvalidArgument,
            detail: format!("no export reference {export_ref:#x} is held"),
        });
    };
    nv.free_dup(dup)
        .map_err(|e| error("release export reference", e))
}

/// [`crate::Driver::attach_remote_gpu`]: ATTACH_REMOTE_GPU on the prime reached through the
/// dup of its export; the dups go once the GPU is attached (the prime keeps the team).
pub(super) fn attach_remote_gpu(
    nv: &Nvidia,
    from: NodeId,
    a: &RemoteGpuAttach,
) -> Result<(), DriverError> {
    nv.session()?;
    let dup = nv
        .dup_export(a.export_uuid, a.index, a.channel)
        .map_err(|e| error("attach remote GPU", e))?;
    let attach = AttachRemoteGpu {
        probe_handle: a.gpu_probe_handle,
        key: a.key,
        bw_mode_epoch: a.bw_mode_epoch,
        page_size: a.page_size,
        clique_id: a.clique_id,
        node_id: from.0,
        bw_mode: a.bw_mode,
    };
    let result = attach
        .encode(nv.layout)
        .map_err(abi("ATTACH_REMOTE_GPU"))
        .and_then(|mut params| {
            nv.rm
                .control(dup.memory, NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU, &mut params)
        });
    let _ = nv.free_dup(dup);
    result.map(drop).map_err(|e| error("attach remote GPU", e))
}

/// [`crate::Driver::set_multicast_failure`]: SET_FAILURE with the status on the prime.
pub(super) fn set_failure(
    nv: &Nvidia,
    uuid: [u8; 16],
    index: u16,
    channel: u32,
    status: Status,
) -> Result<(), DriverError> {
    nv.session()?;
    let dup = nv
        .dup_export(uuid, index, channel)
        .map_err(|e| error("set multicast failure", e))?;
    let mut params = NV00FD_CTRL_SET_FAILURE_PARAMS {
        status: nv_status(status),
    };
    let result = nv
        .rm
        .control_typed(dup.memory, NV00FD_CTRL_CMD_SET_FAILURE, &mut params);
    let _ = nv.free_dup(dup);
    result
        .map(drop)
        .map_err(|e| error("set multicast failure", e))
}
