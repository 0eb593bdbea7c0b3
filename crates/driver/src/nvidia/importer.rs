//! The importing node's side (`docs/reference/driver-interface.md` §1.6 "Daemon B", "Unimport",
//! §4 "Peer node dies"): IMPORTED_REF for the import an event named (NV_WARN_NOTHING_TO_DO:
//! nothing left to do), VALIDATE in chunks of 512 PFNs until `bDone`, or one VALIDATE with
//! IMPORT_FAILED; the ref freed after (no event follows); FINISH_MEM_UNIMPORT in batches of at
//! most 256 tokens; DISABLE_IMPORTERS for a lost node.

use openimex_core::NodeId;
use openimex_rmabi::Layout;
use openimex_rmabi::class::nv00fb::{NV_MEMORY_FABRIC_IMPORTED_REF, NV00FB_ALLOCATION_PARAMETERS};
use openimex_rmabi::ctrl::nv00f1::{
    NV00F1_CTRL_CMD_DISABLE_IMPORTERS, NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT,
    NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS, NV00F1_CTRL_FINISH_MEM_UNIMPORT_ARRAY_SIZE,
    NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS,
};
use openimex_rmabi::ctrl::nv00f8::{FabricMemoryAttrs, NV_PHYSICAL_MEMORY_ATTRS};
use openimex_rmabi::ctrl::nv00fb::{NV00FB_CTRL_CMD_VALIDATE, Validate};
use openimex_rmabi::status::NV_WARN_NOTHING_TO_DO;
use zerocopy::{FromZeros, IntoBytes};

use super::rm::RmError;
use super::{Nvidia, error, lock};
use crate::{DriverError, Pages, Status};

/// PFNs one VALIDATE carries at most (`pfnArray[512]`).
const PFNS_PER_CALL: usize = 512;

fn abi(source: openimex_rmabi::AbiError) -> RmError {
    RmError::Abi {
        call: "VALIDATE".into(),
        source,
    }
}

/// [`crate::Driver::validate_import`].
pub(super) fn validate(
    nv: &Nvidia,
    event_id: u64,
    result: Result<Pages, Status>,
) -> Result<(), DriverError> {
    nv.session()?;
    let Some(key) = lock(&nv.imports)?.remove(&event_id) else {
        // Unimported meanwhile (its unimport event came first), or validated already.
        return Ok(());
    };
    let client = nv.rm.handle();
    let handle = nv.rm.new_handle();
    let mut params = NV00FB_ALLOCATION_PARAMETERS::new_zeroed();
    params.exportUuid = key.uuid;
    params.index = key.index;
    params.flags = 0;
    params.id = key.import_id;
    let status = nv
        .rm
        .alloc(
            client,
            handle,
            NV_MEMORY_FABRIC_IMPORTED_REF,
            params.as_mut_bytes(),
            &[],
        )
        .map_err(|e| error("validate import", e))?;
    if status == NV_WARN_NOTHING_TO_DO {
        // No descriptor waits for it any more (released, installed or claimed): no object.
        nv.rm.recycle(handle);
        return Ok(());
    }
    let mut pushed = push(nv, handle, result);
    if let Err(e) = &pushed
        && !matches!(e, RmError::Transport(_))
    {
        // A VALIDATE the driver refused (or pages that cannot be sent) leaves the import
        // pending and claimed: the importer would wait for ever. IMPORT_FAILED ends it
        // (`memoryfabricimportedrefCtrlValidate` takes the flag after any chunks).
        tracing::warn!("import {event_id}: VALIDATE failed ({e}); failing the import");
        if let Ok(mut params) = Validate::import_failed().encode(nv.layout)
            && nv
                .rm
                .control(handle, NV00FB_CTRL_CMD_VALIDATE, &mut params)
                .is_ok()
        {
            pushed = Ok(());
        }
    }
    let freed = nv.rm.free(client, handle);
    if freed.is_ok() {
        nv.rm.recycle(handle);
    }
    pushed.and(freed).map_err(|e| error("validate import", e))
}

/// VALIDATE the pages in chunks until the driver says done, or IMPORT_FAILED once.
fn push(nv: &Nvidia, handle: u32, result: Result<Pages, Status>) -> Result<(), RmError> {
    let pages = match result {
        Ok(p) => p,
        Err(_) => {
            let mut params = Validate::import_failed().encode(nv.layout).map_err(abi)?;
            nv.rm
                .control(handle, NV00FB_CTRL_CMD_VALIDATE, &mut params)?;
            return Ok(());
        }
    };
    let pfns: Vec<u32> = pages
        .pfns
        .iter()
        .map(|&p| u32::try_from(p))
        .collect::<Result<_, _>>()
        .map_err(|_| RmError::Status {
            call: "VALIDATE: a PFN beyond 32 bits".into(),
            status: openimex_rmabi::status::NV_ERR_INVALID_ARGUMENT,
        })?;
    let attrs = FabricMemoryAttrs {
        kind: pages.kind,
        page_size: pages.page_size,
        size: pages.size,
        clique_id: pages.clique_id,
        bw_mode_epoch: pages.bw_mode_epoch,
        bw_mode: pages.bw_mode,
    };
    let phys_attrs = NV_PHYSICAL_MEMORY_ATTRS {
        addressSpace: pages.phys_addr_space,
        compressionCoverage: pages.compression_coverage,
    };
    let total = pfns.len() as u64;
    let done_at = validate_done_offset(nv.layout);
    let mut rest = pfns;
    let mut offset = 0u64;
    loop {
        // The last (usually the only) chunk takes the PFNs without a copy.
        let tail = rest.split_off(rest.len().min(PFNS_PER_CALL));
        let chunk = std::mem::replace(&mut rest, tail);
        let n = chunk.len() as u64;
        let mut params = Validate {
            offset,
            total_pfns: total,
            pfns: chunk,
            attrs,
            phys_attrs,
            mem_flags: pages.mem_flags,
            ..Validate::default()
        }
        .encode(nv.layout)
        .map_err(abi)?;
        nv.rm
            .control(handle, NV00FB_CTRL_CMD_VALIDATE, &mut params)?;
        let done = params.get(done_at).is_some_and(|&b| b != 0);
        offset += n;
        if done {
            return Ok(());
        }
        if rest.is_empty() {
            return Err(RmError::Status {
                call: format!("VALIDATE: all {total} PFNs sent and the import is not done"),
                status: openimex_rmabi::status::NV_ERR_INVALID_STATE,
            });
        }
    }
}

/// Where VALIDATE's `bDone` is in the parameter block of `layout`.
fn validate_done_offset(layout: Layout) -> usize {
    use openimex_rmabi::ctrl::nv00fb::{
        NV00FB_CTRL_VALIDATE_PARAMS_V550, NV00FB_CTRL_VALIDATE_PARAMS_V580,
        NV00FB_CTRL_VALIDATE_PARAMS_V595,
    };
    match layout {
        Layout::V550 => std::mem::offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V550, bDone),
        Layout::V580 | Layout::V590 => {
            std::mem::offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V580, bDone)
        }
        Layout::V595 => std::mem::offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V595, bDone),
    }
}

/// [`crate::Driver::finish_unimport`]: FINISH_MEM_UNIMPORT, 256 tokens at a time.
pub(super) fn finish(nv: &Nvidia, ids: &[u64]) -> Result<(), DriverError> {
    let session = nv.session()?;
    for batch in ids.chunks(NV00F1_CTRL_FINISH_MEM_UNIMPORT_ARRAY_SIZE) {
        let mut params = NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS::new(batch).map_err(|source| {
            error(
                "finish unimport",
                RmError::Abi {
                    call: "FINISH_MEM_UNIMPORT".into(),
                    source,
                },
            )
        })?;
        nv.rm
            .control_typed(session, NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT, &mut params)
            .map_err(|e| error("finish unimport", e))?;
    }
    Ok(())
}

/// [`crate::Driver::disable_importers`].
pub(super) fn disable(nv: &Nvidia, node: NodeId) -> Result<(), DriverError> {
    let session = nv.session()?;
    let mut params = NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS { nodeId: node.0 };
    nv.rm
        .control_typed(session, NV00F1_CTRL_CMD_DISABLE_IMPORTERS, &mut params)
        .map(drop)
        .map_err(|e| error("disable importers", e))
}
