//! The start-up of `docs/reference/driver-interface.md` §1.6 (steps 1–5) and the fabric probe per
//! GPU: what the daemon does before its first event, and what `openimex driver-check` runs.

use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use openimex_core::NodeId;
use openimex_rmabi::class::client::{
    NV01_DEVICE_0, NV20_SUBDEVICE_0, NV0080_ALLOC_PARAMETERS, NV2080_ALLOC_PARAMETERS,
};
use openimex_rmabi::class::nv00f1::{NV_IMEX_SESSION, NV00F1_ALLOCATION_PARAMETERS};
use openimex_rmabi::ctrl::nv0000::{
    NV0000_CTRL_CMD_GPU_ATTACH_IDS, NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2,
    NV0000_CTRL_CMD_GPU_GET_PROBED_IDS, NV0000_CTRL_GPU_ATTACH_IDS_PARAMS,
    NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, parse_probed_ids,
};
use openimex_rmabi::ctrl::nv2080::{FabricProbeInfo, NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO};
use openimex_rmabi::escape::{
    NV_ESC_ALLOC_OS_EVENT, NV_ESC_ATTACH_GPUS_TO_FD, attach_gpus_to_fd_arg,
    nv_ioctl_alloc_os_event_t,
};
use openimex_rmabi::status::NV_ERR_IN_USE;
use openimex_rmabi::{AbiError, NvHandle, layout_for};
use zerocopy::{FromZeros, IntoBytes};

use super::files::{self, FileError};
use super::rm::{self, RmCall, RmClient, RmError};
use super::transport::{Ctl, OpenError};
use super::{Gpu, Nvidia, error};
use crate::{DriverError, GpuFabric};

/// What the operator installs when there is no driver.
pub(super) const INSTALL: &str = "install the NVIDIA GPU driver (550.40.07 or later) and load its \
    kernel module (`modprobe nvidia`), or point OPENIMEX_DRIVER_ROOT at the driver root \
    (a simulated tray's node directory, `openimex-lab gpu --node-dir`), or run the control plane \
    alone with OPENIMEX_DRIVER=nogpu";

/// Why the backend could not start, step by step.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `/dev/nvidiactl` could not be opened.
    #[error("{0}; {INSTALL}")]
    Ctl(#[from] OpenError),
    /// The driver's version is not one whose layouts this build knows.
    #[error("{path}: {source}")]
    Version {
        /// The control device.
        path: PathBuf,
        /// The version error (lists the supported ones).
        source: AbiError,
    },
    /// A capability or procfs file is missing or unreadable.
    #[error(transparent)]
    File(#[from] FileError),
    /// An RM call failed.
    #[error("{step}: {source}")]
    Rm {
        /// Which step of the start.
        step: &'static str,
        /// Why.
        source: RmError,
    },
}

impl StartError {
    /// As the driver interface's error: an unusable backend, or the driver lost mid-call.
    pub fn into_driver_error(self) -> DriverError {
        if let Self::Rm {
            source: RmError::Transport(t @ super::transport::TransportError::Lost { .. }),
            ..
        } = &self
        {
            return DriverError::Lost(t.to_string());
        }
        DriverError::Unavailable {
            backend: "nvidia",
            reason: self.to_string(),
            fix: "see the message; `openimex driver-check` shows what the daemon finds on this host",
        }
    }
}

fn step(step: &'static str) -> impl FnOnce(RmError) -> StartError {
    move |source| StartError::Rm { step, source }
}

/// Steps 1–4 of §1.6: the control device and its version, the root client, the GPUs'
/// Devices and Subdevices, the capability, the OS event.
pub(super) fn open(root: &Path) -> Result<Nvidia, StartError> {
    let ctl = Ctl::open(&files::ctl_path(root))?;
    let version = rm::query_version(&ctl).map_err(step("the version check"))?;
    let layout = layout_for(&version).map_err(|source| StartError::Version {
        path: ctl.path().to_path_buf(),
        source,
    })?;
    let rm = RmClient::new(ctl, layout).map_err(step("allocating the root client"))?;
    // The RM lets a client allocate a GPU's Device only while its process holds that GPU's
    // device file open (`osIsGpuAccessible`), as every CUDA or NVML client does.
    let gpu_files = files::open_gpu_files(root)?;
    let (gpus, start_probes) = attach_gpus(&rm, layout).map_err(step("attaching the GPUs"))?;
    let minor = files::imex_cap_minor(root)?;
    let (_, cap) = files::open_imex_cap(root, minor)?;
    let mut event = rm.ctl().open_event()?;
    let mut arg = nv_ioctl_alloc_os_event_t {
        hClient: rm.handle(),
        hDevice: 0,
        fd: event.number as u32,
        Status: 0,
    };
    rm.ctl()
        .ioctl_on(
            Some(event.to_register()),
            NV_ESC_ALLOC_OS_EVENT,
            arg.as_mut_bytes(),
            &mut [],
            &[event.to_register()],
        )
        .map_err(|e| step("allocating the OS event")(e.into()))?;
    if rm::is_error(arg.Status) {
        return Err(StartError::Rm {
            step: "allocating the OS event",
            source: RmError::Status {
                call: "NV_ESC_ALLOC_OS_EVENT".into(),
                status: arg.Status,
            },
        });
    }
    event.registered();
    Ok(Nvidia {
        rm,
        root: root.to_path_buf(),
        layout,
        version,
        gpus,
        start_probes: Mutex::new(start_probes),
        _gpu_files: gpu_files,
        event,
        cap,
        session: Mutex::new(None),
        imports: Mutex::default(),
        dups: Mutex::default(),
    })
}

/// The probed GPUs, attached (NV0000 ATTACH_IDS, and to the control file with
/// NV_ESC_ATTACH_GPUS_TO_FD so they stay initialised while it is open), each with a Device
/// and a Subdevice of this client, which IMPORT_MEM needs as parents (§1.6 step 2); and each
/// GPU's fabric probe, read on its new Subdevice in the same batch (`None` if one failed: a
/// probe is not part of the start, and is read again when asked).
fn attach_gpus(
    rm: &RmClient,
    layout: openimex_rmabi::Layout,
) -> Result<(Vec<Gpu>, Option<Vec<GpuFabric>>), RmError> {
    let client = rm.handle();
    let abi = |source| RmError::Abi {
        call: "GET_PROBED_IDS".into(),
        source,
    };
    let mut probed = vec![0u8; layout.probed_ids_params_size()];
    rm.control(client, NV0000_CTRL_CMD_GPU_GET_PROBED_IDS, &mut probed)?;
    let ids = parse_probed_ids(layout, &probed).map_err(abi)?;
    if ids.is_empty() {
        return Ok((Vec::new(), Some(Vec::new())));
    }
    // Two batches whatever the number of GPUs, in the order the calls would go one by one:
    // the attach and every GPU's instances (all made from the probed IDs), then every Device
    // and Subdevice (made from the instances; the handles are this client's choice, so no
    // allocation waits for another's answer) and every GPU's probe on its new Subdevice.
    let infos = attach(rm, &ids)?;
    let gpus: Vec<Gpu> = (ids.into_iter().zip(&infos).enumerate())
        .map(|(index, (gpu_id, info))| Gpu {
            index: index as u32,
            gpu_id,
            device_instance: info.deviceInstance,
            device: rm.new_handle(),
            subdevice: rm.new_handle(),
        })
        .collect();
    let mut devs: Vec<NV0080_ALLOC_PARAMETERS> = (infos.iter())
        .map(|info| NV0080_ALLOC_PARAMETERS {
            deviceId: info.deviceInstance,
            ..Default::default()
        })
        .collect();
    let mut subs: Vec<NV2080_ALLOC_PARAMETERS> = (infos.iter())
        .map(|info| NV2080_ALLOC_PARAMETERS {
            subDeviceId: info.subDeviceInstance,
        })
        .collect();
    let mut probes = probe_params(layout, &gpus);
    let mut calls = Vec::with_capacity(3 * gpus.len());
    for ((gpu, dev), sub) in gpus.iter().zip(&mut devs).zip(&mut subs) {
        calls.push(RmCall::Alloc {
            parent: client,
            handle: gpu.device,
            class: NV01_DEVICE_0,
            params: dev.as_mut_bytes(),
        });
        calls.push(RmCall::Alloc {
            parent: gpu.device,
            handle: gpu.subdevice,
            class: NV20_SUBDEVICE_0,
            params: sub.as_mut_bytes(),
        });
    }
    calls.extend(probe_calls(&gpus, &mut probes));
    let mut outcomes = rm.calls_each(&mut calls)?.into_iter();
    drop(calls);
    // The allocations first: the first of them that failed is the start's error.
    let allocs = outcomes.by_ref().take(2 * gpus.len());
    if let Some(e) = allocs.filter_map(Result::err).next() {
        return Err(e);
    }
    let start_probes = (outcomes.all(|probed| probed.is_ok()))
        .then(|| probes_read(layout, &gpus, &probes).ok())
        .flatten();
    Ok((gpus, start_probes))
}

/// NV0000 ATTACH_IDS of `ids`, NV_ESC_ATTACH_GPUS_TO_FD of the same, and each GPU's
/// instances (GET_ID_INFO_V2), as one batch.
fn attach(
    rm: &RmClient,
    ids: &[u32],
) -> Result<Vec<NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS>, RmError> {
    let client = rm.handle();
    let mut attach =
        NV0000_CTRL_GPU_ATTACH_IDS_PARAMS::new(ids).map_err(|source| RmError::Abi {
            call: "ATTACH_IDS".into(),
            source,
        })?;
    let mut to_fd = attach_gpus_to_fd_arg(ids);
    let mut infos: Vec<NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS> = (ids.iter())
        .map(|&gpu_id| NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS {
            gpuId: gpu_id,
            ..Default::default()
        })
        .collect();
    let mut calls = vec![
        RmCall::Control {
            object: client,
            cmd: NV0000_CTRL_CMD_GPU_ATTACH_IDS,
            params: attach.as_mut_bytes(),
        },
        RmCall::Escape {
            nr: NV_ESC_ATTACH_GPUS_TO_FD,
            arg: &mut to_fd,
        },
    ];
    calls.extend(infos.iter_mut().map(|info| RmCall::Control {
        object: client,
        cmd: NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2,
        params: info.as_mut_bytes(),
    }));
    rm.calls(&mut calls)?;
    drop(calls);
    Ok(infos)
}

/// A fabric probe's parameter block for each of `gpus`.
fn probe_params(layout: openimex_rmabi::Layout, gpus: &[Gpu]) -> Vec<Vec<u8>> {
    (gpus.iter())
        .map(|_| FabricProbeInfo::default().encode(layout))
        .collect()
}

/// NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO on each GPU's Subdevice, into `params`.
fn probe_calls<'a>(gpus: &'a [Gpu], params: &'a mut [Vec<u8>]) -> impl Iterator<Item = RmCall<'a>> {
    gpus.iter()
        .zip(params)
        .map(|(gpu, params)| RmCall::Control {
            object: gpu.subdevice,
            cmd: NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO,
            params,
        })
}

/// The probes [`probe_calls`] read, as the daemon keeps them.
fn probes_read(
    layout: openimex_rmabi::Layout,
    gpus: &[Gpu],
    params: &[Vec<u8>],
) -> Result<Vec<GpuFabric>, RmError> {
    (gpus.iter().zip(params))
        .map(|(gpu, params)| Ok(gpu_fabric(gpu.index, &decode_probe(layout, params)?)))
        .collect()
}

/// Step 5: NV_IMEX_SESSION {capDescriptor, flags 0, pOsEvent, nodeId} under the client.
/// NV_ERR_IN_USE is another daemon holding the node's one session.
pub(super) fn open_session(nv: &Nvidia, node: NodeId) -> Result<NvHandle, DriverError> {
    let handle = nv.rm.new_handle();
    let mut params = NV00F1_ALLOCATION_PARAMETERS::new_zeroed();
    params.capDescriptor = nv.cap.as_raw_fd() as u64;
    params.flags = 0;
    params.pOsEvent = nv.event.number as u64;
    params.nodeId = node.0;
    match nv.rm.alloc(
        nv.rm.handle(),
        handle,
        NV_IMEX_SESSION,
        params.as_mut_bytes(),
        // The kernel resolves `capDescriptor` in this process's table; `pOsEvent` names the
        // OS event registered with NV_ESC_ALLOC_OS_EVENT.
        &[nv.cap.as_fd()],
    ) {
        Ok(_) => Ok(handle),
        Err(RmError::Status {
            status: NV_ERR_IN_USE,
            ..
        }) => Err(DriverError::SessionBusy),
        Err(e) => Err(error("open session", e)),
    }
}

/// NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO on each GPU's Subdevice, as one batch.
pub(super) fn probe_all(nv: &Nvidia) -> Result<Vec<GpuFabric>, DriverError> {
    let mut params = probe_params(nv.layout, &nv.gpus);
    let mut calls: Vec<RmCall<'_>> = probe_calls(&nv.gpus, &mut params).collect();
    nv.rm
        .calls(&mut calls)
        .map_err(|e| error("fabric probe", e))?;
    drop(calls);
    probes_read(nv.layout, &nv.gpus, &params).map_err(|e| error("fabric probe", e))
}

/// A probe's answer, in this driver's layout.
fn decode_probe(layout: openimex_rmabi::Layout, params: &[u8]) -> Result<FabricProbeInfo, RmError> {
    FabricProbeInfo::decode(layout, params).map_err(|source| RmError::Abi {
        call: "GET_GPU_FABRIC_PROBE_INFO".into(),
        source,
    })
}

/// The probe as the daemon keeps it: NVML's state word, the cluster UUID in hex (empty and 0
/// before the probe completes, when the response fields mean nothing).
fn gpu_fabric(index: u32, p: &FabricProbeInfo) -> GpuFabric {
    use openimex_rmabi::ctrl::nv2080::*;
    let state = match p.state {
        NV2080_CTRL_GPU_FABRIC_PROBE_STATE_UNSUPPORTED => "NOT_SUPPORTED",
        NV2080_CTRL_GPU_FABRIC_PROBE_STATE_NOT_STARTED => "NOT_STARTED",
        NV2080_CTRL_GPU_FABRIC_PROBE_STATE_IN_PROGRESS => "IN_PROGRESS",
        NV2080_CTRL_GPU_FABRIC_PROBE_STATE_COMPLETE => "COMPLETED",
        _ => "UNKNOWN",
    };
    let complete = p.state == NV2080_CTRL_GPU_FABRIC_PROBE_STATE_COMPLETE;
    let summary = match p.health_summary {
        1 => "HEALTHY",
        2 => "UNHEALTHY",
        3 => "LIMITED_CAPACITY",
        _ => "",
    };
    GpuFabric {
        gpu: index,
        state: state.to_string(),
        cluster_uuid: if complete {
            p.cluster_uuid.iter().map(|b| format!("{b:02x}")).collect()
        } else {
            String::new()
        },
        partition_id: if complete { p.partition_id } else { 0 },
        clique_id: if complete { p.clique_id } else { 0 },
        bw_mode: 0,
        bw_mode_epoch: 0,
        health_mask: if complete { p.health_mask } else { 0 },
        health_summary: if complete {
            summary.to_string()
        } else {
            String::new()
        },
    }
}
