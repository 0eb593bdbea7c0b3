//! NV_ESC_RM_CONTROL: the checks every control goes through, in the order of
//! `_rmapiRmControl` (control.c) and `serverControl` (rs_server.c), and the dispatch to the
//! handler of the object's class.
//!
//! 1. A NULL command (0, or `_CATEGORY` (13:8) and `_INDEX` (7:0) both 0) is NV_OK at once.
//! 2. An unknown client is NV_ERR_INVALID_CLIENT (`serverutilGetClientUnderLock`).
//! 3. `paramsSize` must be 0 exactly when the pointer is NULL (no parameter bytes sent), and
//!    for a command whose class is in the resource table and defines it
//!    (`rmapiutilGetControlInfo`: every command served here) it must equal the struct's size
//!    in the served layout: else NV_ERR_INVALID_ARGUMENT. (The NV_ERR_INVALID_PARAM_STRUCT
//!    of `resControlLookup` in rs_resource.c is only reached by commands the top-level table
//!    does not know, which this driver does not serve.)
//! 4. Fewer parameter bytes than `paramsSize` fault in the copy-in
//!    (`os_memcpy_from_user`: NV_ERR_INVALID_ADDRESS).
//! 5. A disabled client is NV_ERR_INVALID_STATE (`bActive`); a client of another file
//!    NV_ERR_INVALID_CLIENT (`rmclientValidate`); an unknown object NV_ERR_OBJECT_NOT_FOUND
//!    (`clientGetResourceRef`).
//! 6. A command the object's class does not export is NV_ERR_NOT_SUPPORTED
//!    (`resControlLookup`); NV_MEMORY_FABRIC refuses another class's command first
//!    (`memoryfabricControl`: NV_ERR_INVALID_ARGUMENT).
//!
//! The parameters are copied back only on success (`RMCTRL_FLAGS_COPYOUT_ON_ERROR` is set on
//! none of these commands).

use openimex_rmabi::class::NV_MEMORY_FABRIC;
use openimex_rmabi::ctrl::nv0000::{
    NV0000_CTRL_CMD_GPU_ATTACH_IDS, NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS,
    NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2, NV0000_CTRL_CMD_GPU_GET_PROBED_IDS,
    NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID,
};
use openimex_rmabi::ctrl::nv00e0::{NV00E0_CTRL_CMD_GET_INFO, NV00E0_CTRL_CMD_IMPORT_MEM};
use openimex_rmabi::ctrl::nv00f1::{
    NV00F1_CTRL_CMD_DISABLE_IMPORTERS, NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT,
    NV00F1_CTRL_CMD_GET_FABRIC_EVENTS,
};
use openimex_rmabi::ctrl::nv00f8::{NV00F8_CTRL_CMD_DESCRIBE, NV00F8_CTRL_CMD_GET_INFO};
use openimex_rmabi::ctrl::nv00fb::NV00FB_CTRL_CMD_VALIDATE;
use openimex_rmabi::ctrl::nv00fd::{
    NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU, NV00FD_CTRL_CMD_SET_FAILURE,
};
use openimex_rmabi::ctrl::nv2080::NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO;
use openimex_rmabi::escape::NVOS54_PARAMETERS;

use super::handles::Kind;
use super::status::Handled;
use super::status::{
    NV_ERR_INVALID_ADDRESS, NV_ERR_INVALID_ARGUMENT, NV_ERR_INVALID_CLIENT, NV_ERR_INVALID_STATE,
    NV_ERR_NOT_SUPPORTED, NV_ERR_OBJECT_NOT_FOUND, NV_OK,
};
use super::{Caller, Outcome, RmApi, read, write};
use crate::rm::Rm;

/// What a control is addressed to.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// The client itself (`hObject == hClient`: RmClientResource).
    Client,
    Device,
    Subdevice(u32),
    Session,
    Export,
    FabricMemory(u64),
    ImportedRef,
    Multicast(u64),
}

impl RmApi {
    /// NV_ESC_RM_CONTROL. See the module doc.
    pub(super) fn rm_control(
        &mut self,
        rm: &mut Rm,
        caller: &Caller<'_>,
        arg: &mut [u8],
        params: &mut [u8],
    ) -> Outcome {
        let Some(mut p) = read::<NVOS54_PARAMETERS>(arg) else {
            return Outcome::einval();
        };
        let original = params.to_vec();
        let (status, wakes) = self.control(rm, caller, &p, params);
        if status != NV_OK {
            params.copy_from_slice(&original);
        }
        p.status = status;
        write(arg, &p);
        Outcome {
            errno: 0,
            status: Some(status),
            what: Some(p.cmd),
            params_size: p.paramsSize,
            wakes,
        }
    }

    fn control(
        &mut self,
        rm: &mut Rm,
        caller: &Caller<'_>,
        p: &NVOS54_PARAMETERS,
        params: &mut [u8],
    ) -> Handled {
        let cmd = p.cmd;
        if cmd == 0 || cmd & 0x3FFF == 0 {
            return (NV_OK, false);
        }
        let Some(client) = self.clients.map.get(&p.hClient) else {
            return (NV_ERR_INVALID_CLIENT, false);
        };
        let size = p.paramsSize as usize;
        let null = params.is_empty();
        let expected = self.config.layout.control_params_size(cmd);
        if (size != 0 && null) || (size == 0 && !null) || expected.is_some_and(|e| e != size) {
            return (NV_ERR_INVALID_ARGUMENT, false);
        }
        if params.len() < size {
            return (NV_ERR_INVALID_ADDRESS, false);
        }
        if rm.is_disabled(client.rm) {
            return (NV_ERR_INVALID_STATE, false);
        }
        if client.file != caller.file {
            return (NV_ERR_INVALID_CLIENT, false);
        }
        let target = if p.hObject == p.hClient {
            Target::Client
        } else {
            match client.objects.get(&p.hObject).map(|o| &o.kind) {
                None => return (NV_ERR_OBJECT_NOT_FOUND, false),
                Some(Kind::Device { .. }) => Target::Device,
                Some(Kind::Subdevice { gpu }) => Target::Subdevice(*gpu),
                Some(Kind::Session) => Target::Session,
                Some(Kind::Export { .. }) => Target::Export,
                Some(Kind::FabricMemory { rm }) => Target::FabricMemory(*rm),
                Some(Kind::ImportedRef(_)) => Target::ImportedRef,
                Some(Kind::Multicast { rm }) => Target::Multicast(*rm),
            }
        };
        let rm_client = client.rm;
        let block = &mut params[..size];
        let (h_client, h_object) = (p.hClient, p.hObject);
        match (target, cmd) {
            (Target::Client, NV0000_CTRL_CMD_GPU_GET_PROBED_IDS) => self.get_probed_ids(rm, block),
            (Target::Client, NV0000_CTRL_CMD_GPU_ATTACH_IDS) => self.attach_ids(rm, block),
            (Target::Client, NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS) => {
                self.get_attached_ids(rm, block)
            }
            (Target::Client, NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2) => self.get_id_info_v2(rm, block),
            (Target::Client, NV0000_CTRL_CMD_GPU_GET_UUID_FROM_GPU_ID) => {
                self.get_uuid_from_gpu_id(rm, block)
            }
            (Target::Subdevice(gpu), NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO) => {
                self.fabric_probe_info(rm, gpu, block)
            }
            (Target::Session, NV00F1_CTRL_CMD_GET_FABRIC_EVENTS) => {
                self.get_fabric_events(rm, block)
            }
            (Target::Session, NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT) => {
                self.finish_mem_unimport(rm, block)
            }
            (Target::Session, NV00F1_CTRL_CMD_DISABLE_IMPORTERS) => {
                self.disable_importers(rm, block)
            }
            (Target::Export, NV00E0_CTRL_CMD_IMPORT_MEM) => {
                self.import_mem(rm, h_client, h_object, block)
            }
            (Target::Export, NV00E0_CTRL_CMD_GET_INFO) => {
                self.export_get_info(h_client, h_object, block)
            }
            (Target::FabricMemory(_), c) if c >> 16 != NV_MEMORY_FABRIC => {
                (NV_ERR_INVALID_ARGUMENT, false)
            }
            (Target::FabricMemory(mem), NV00F8_CTRL_CMD_DESCRIBE) => {
                self.describe(rm, h_client, caller.admin, mem, rm_client, block)
            }
            (Target::FabricMemory(mem), NV00F8_CTRL_CMD_GET_INFO) => {
                self.fabric_get_info(rm, rm_client, mem, block)
            }
            (Target::ImportedRef, NV00FB_CTRL_CMD_VALIDATE) => {
                self.validate(rm, h_client, h_object, block)
            }
            (Target::Multicast(mc), NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU) => {
                self.attach_remote_gpu(rm, h_client, caller.admin, mc, block)
            }
            (Target::Multicast(mc), NV00FD_CTRL_CMD_SET_FAILURE) => {
                self.set_failure(rm, h_client, caller.admin, mc, block)
            }
            (Target::Device | Target::Client | Target::Subdevice(_), _)
            | (Target::Session | Target::Export | Target::ImportedRef, _)
            | (Target::FabricMemory(_) | Target::Multicast(_), _) => {
                if expected.is_some() {
                    tracing::debug!(
                        cmd,
                        "control {cmd:#x} is not exported by the object's class"
                    );
                } else {
                    tracing::warn!(cmd, "control {cmd:#x} is not simulated");
                }
                (NV_ERR_NOT_SUPPORTED, false)
            }
        }
    }
}
