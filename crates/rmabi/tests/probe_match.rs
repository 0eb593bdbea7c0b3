//! Every Rust struct and constant against the gcc probe output of its family
//! (`tools/expected/<family>.txt`, produced by `tools/check_tags.py --write-expected`).
//!
//! For each family this checks, for every C struct the probe printed: size, alignment,
//! and every member's offset and size; that no member of the C struct is missing on the
//! Rust side; that every struct and every constant the probe printed was checked.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::{align_of, offset_of, size_of, size_of_val};

use openimex_rmabi::class::{client::*, nv00e0::*, nv00f1::*, nv00f8::*, nv00fb::*, nv00fd::*};
use openimex_rmabi::ctrl::{
    nv0000::*, nv00e0::*, nv00f1::*, nv00f8::*, nv00fb::*, nv00fd::*, nv2080::*,
};
use openimex_rmabi::escape::*;
use openimex_rmabi::event::raw::*;
use zerocopy::FromZeros;

#[path = "probe_match/consts.rs"]
mod consts;
use consts::constants;

struct Probe {
    sizes: BTreeMap<String, (usize, usize)>,
    fields: BTreeMap<String, (usize, usize)>,
    consts: BTreeMap<String, String>,
    opts: BTreeMap<String, String>,
}

fn parse(text: &str) -> Probe {
    let mut p = Probe {
        sizes: BTreeMap::new(),
        fields: BTreeMap::new(),
        consts: BTreeMap::new(),
        opts: BTreeMap::new(),
    };
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w[0] {
            "size" => {
                p.sizes
                    .insert(w[1].into(), (w[2].parse().unwrap(), w[3].parse().unwrap()));
            }
            "field" => {
                p.fields
                    .insert(w[1].into(), (w[2].parse().unwrap(), w[3].parse().unwrap()));
            }
            "const" => {
                p.consts.insert(w[1].into(), w[2].into());
            }
            "opt" => {
                p.opts.insert(w[1].into(), w[2].into());
            }
            other => panic!("bad probe line kind {other}"),
        }
    }
    p
}

struct RustLayout {
    size: usize,
    align: usize,
    fields: Vec<(&'static str, usize, usize)>,
}

/// `rust!(Type, ["cName" => rust_field, ...], extra ["cName" => (offset, size)])`
macro_rules! rust {
    ($t:ty, [$($c:literal => $($f:ident).+),* $(,)?] $(, extra [$($ec:literal => ($eo:expr, $es:expr)),* $(,)?])?) => {{
        let v = <$t as FromZeros>::new_zeroed();
        #[allow(unused_mut)]
        let mut fields: Vec<(&'static str, usize, usize)> = Vec::new();
        $( fields.push(($c, offset_of!($t, $($f).+), size_of_val(&v.$($f).+))); )*
        $($( fields.push(($ec, $eo, $es)); )*)?
        RustLayout { size: size_of::<$t>(), align: align_of::<$t>(), fields }
    }};
}

struct Checker {
    family: &'static str,
    probe: Probe,
    seen: BTreeSet<String>,
}

impl Checker {
    fn new(family: &'static str, text: &str) -> Self {
        Self {
            family,
            probe: parse(text),
            seen: BTreeSet::new(),
        }
    }

    fn check(&mut self, c: &str, r: RustLayout) {
        let fam = self.family;
        let &(size, align) = self
            .probe
            .sizes
            .get(c)
            .unwrap_or_else(|| panic!("{fam}: probe has no {c}"));
        assert_eq!(r.size, size, "{fam}: sizeof({c})");
        assert_eq!(r.align, align, "{fam}: alignof({c})");
        let prefix = format!("{c}.");
        let c_fields: BTreeSet<&str> = self
            .probe
            .fields
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix))
            .collect();
        let r_fields: BTreeSet<&str> = r.fields.iter().map(|f| f.0).collect();
        assert_eq!(c_fields, r_fields, "{fam}: members of {c}");
        for (name, off, sz) in r.fields {
            let &(coff, csz) = &self.probe.fields[&format!("{c}.{name}")];
            assert_eq!((off, sz), (coff, csz), "{fam}: {c}.{name} (offset, size)");
        }
        self.seen.insert(c.to_owned());
    }

    fn consts(&self, rust: &[(&str, String)]) {
        let fam = self.family;
        let r: BTreeMap<&str, &String> = rust.iter().map(|(n, v)| (*n, v)).collect();
        let missing: Vec<&String> = self
            .probe
            .consts
            .keys()
            .filter(|k| !r.contains_key(k.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "{fam}: constants not checked: {missing:?}"
        );
        for (name, value) in &self.probe.consts {
            assert_eq!(r[name.as_str()], value, "{fam}: const {name}");
        }
        for (name, value) in &self.probe.opts {
            let rv = r
                .get(name.as_str())
                .unwrap_or_else(|| panic!("{fam}: opt const {name} not checked"));
            assert_eq!(*rv, value, "{fam}: opt const {name}");
        }
    }

    fn done(&self) {
        let all: BTreeSet<String> = self.probe.sizes.keys().cloned().collect();
        assert_eq!(all, self.seen, "{}: structs checked", self.family);
    }
}

/// Structs that are the same in every family.
fn check_common(c: &mut Checker) {
    c.check("NVOS00_PARAMETERS", rust!(NVOS00_PARAMETERS, [
        "hRoot" => hRoot, "hObjectParent" => hObjectParent, "hObjectOld" => hObjectOld, "status" => status]));
    c.check("NVOS21_PARAMETERS", rust!(NVOS21_PARAMETERS, [
        "hRoot" => hRoot, "hObjectParent" => hObjectParent, "hObjectNew" => hObjectNew, "hClass" => hClass,
        "pAllocParms" => pAllocParms, "paramsSize" => paramsSize, "status" => status]));
    c.check("NVOS54_PARAMETERS", rust!(NVOS54_PARAMETERS, [
        "hClient" => hClient, "hObject" => hObject, "cmd" => cmd, "flags" => flags, "params" => params,
        "paramsSize" => paramsSize, "status" => status]));
    c.check("NVOS55_PARAMETERS", rust!(NVOS55_PARAMETERS, [
        "hClient" => hClient, "hParent" => hParent, "hObject" => hObject, "hClientSrc" => hClientSrc,
        "hObjectSrc" => hObjectSrc, "flags" => flags, "status" => status]));
    c.check("NVOS64_PARAMETERS", rust!(NVOS64_PARAMETERS, [
        "hRoot" => hRoot, "hObjectParent" => hObjectParent, "hObjectNew" => hObjectNew, "hClass" => hClass,
        "pAllocParms" => pAllocParms, "pRightsRequested" => pRightsRequested, "paramsSize" => paramsSize,
        "flags" => flags, "status" => status]));
    c.check(
        "nv_ioctl_xfer_t",
        rust!(nv_ioctl_xfer_t, ["cmd" => cmd, "size" => size, "ptr" => ptr]),
    );
    c.check(
        "nv_ioctl_rm_api_version_t",
        rust!(nv_ioctl_rm_api_version_t, [
        "cmd" => cmd, "reply" => reply, "versionString" => versionString]),
    );
    c.check(
        "nv_ioctl_register_fd_t",
        rust!(nv_ioctl_register_fd_t, ["ctl_fd" => ctl_fd]),
    );
    c.check(
        "nv_ioctl_alloc_os_event_t",
        rust!(nv_ioctl_alloc_os_event_t, [
        "hClient" => hClient, "hDevice" => hDevice, "fd" => fd, "Status" => Status]),
    );
    c.check(
        "nv_ioctl_free_os_event_t",
        rust!(nv_ioctl_free_os_event_t, [
        "hClient" => hClient, "hDevice" => hDevice, "fd" => fd, "Status" => Status]),
    );
    c.check("NV0080_ALLOC_PARAMETERS", rust!(NV0080_ALLOC_PARAMETERS, [
        "deviceId" => deviceId, "hClientShare" => hClientShare, "hTargetClient" => hTargetClient,
        "hTargetDevice" => hTargetDevice, "flags" => flags, "vaSpaceSize" => vaSpaceSize,
        "vaStartInternal" => vaStartInternal, "vaLimitInternal" => vaLimitInternal, "vaMode" => vaMode]));
    c.check(
        "NV2080_ALLOC_PARAMETERS",
        rust!(NV2080_ALLOC_PARAMETERS, ["subDeviceId" => subDeviceId]),
    );
    c.check("NV00F1_ALLOCATION_PARAMETERS", rust!(NV00F1_ALLOCATION_PARAMETERS, [
        "capDescriptor" => capDescriptor, "flags" => flags, "pOsEvent" => pOsEvent, "nodeId" => nodeId]));
    c.check(
        "NV_EXPORT_MEM_PACKET",
        rust!(NV_EXPORT_MEM_PACKET, ["uuid" => uuid, "opaque" => opaque]),
    );
    c.check("NV00E0_ALLOCATION_PARAMETERS", rust!(NV00E0_ALLOCATION_PARAMETERS, [
        "imexChannel" => imexChannel, "packet" => packet, "numMaxHandles" => numMaxHandles, "flags" => flags,
        "metadata" => metadata, "deviceInstanceMask" => deviceInstanceMask, "giIdMasks" => giIdMasks,
        "numCurHandles" => numCurHandles]));
    c.check("NV00F8_ALLOCATION_PARAMETERS", rust!(NV00F8_ALLOCATION_PARAMETERS, [
        "alignment" => alignment, "allocSize" => allocSize, "pageSize" => pageSize, "allocFlags" => allocFlags,
        "map" => map, "map.offset" => map.offset, "map.hVidMem" => map.hVidMem, "map.flags" => map.flags]));
    c.check(
        "NV00F9_ALLOCATION_PARAMETERS",
        rust!(NV00F9_ALLOCATION_PARAMETERS, [
        "imexChannel" => imexChannel, "expPacket" => expPacket, "index" => index, "flags" => flags,
        "pOsEvent" => pOsEvent, "id" => id]),
    );
    c.check(
        "NV00FB_ALLOCATION_PARAMETERS",
        rust!(NV00FB_ALLOCATION_PARAMETERS, [
        "exportUuid" => exportUuid, "index" => index, "flags" => flags, "id" => id]),
    );
    c.check(
        "NV00F1_CTRL_FABRIC_MEM_IMPORT_EVENT_DATA",
        rust!(NV00F1_CTRL_FABRIC_MEM_IMPORT_EVENT_DATA, [
        "id" => id, "index" => index, "exportNodeId" => exportNodeId, "exportUuid" => exportUuid]),
    );
    c.check(
        "NV00F1_CTRL_FABRIC_MEM_UNIMPORT_EVENT_DATA",
        rust!(NV00F1_CTRL_FABRIC_MEM_UNIMPORT_EVENT_DATA, [
        "importEventId" => importEventId, "exportNodeId" => exportNodeId]),
    );
    c.check(
        "NV00F1_CTRL_CLIQUE_ID_CHANGE_GPU_EVENT_DATA",
        rust!(NV00F1_CTRL_CLIQUE_ID_CHANGE_GPU_EVENT_DATA, [
        "gpuId" => gpuId, "cliqueId" => cliqueId]),
    );
    c.check(
        "NV00F1_CTRL_FABRIC_UNIMPORT_TOKEN",
        rust!(NV00F1_CTRL_FABRIC_UNIMPORT_TOKEN, [
        "unimportEventId" => unimportEventId]),
    );
    c.check(
        "NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS",
        rust!(NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS, [
        "tokenArray" => tokenArray, "numTokens" => numTokens]),
    );
    c.check(
        "NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS",
        rust!(NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS, ["nodeId" => nodeId]),
    );
    c.check(
        "NV00E0_CTRL_EXPORT_MEM_PARAMS",
        rust!(NV00E0_CTRL_EXPORT_MEM_PARAMS, [
        "index" => index, "hParent" => hParent, "handles" => handles, "numHandles" => numHandles,
        "devDescriptor" => devDescriptor]),
    );
    c.check(
        "NV_IMPORT_MEM_INFO",
        rust!(NV_IMPORT_MEM_INFO, ["hParent" => hParent, "addrSpace" => addrSpace]),
    );
    c.check("NV00E0_CTRL_IMPORT_MEM_PARAMS", rust!(NV00E0_CTRL_IMPORT_MEM_PARAMS, [
        "index" => index, "numHandles" => numHandles, "handles" => handles, "memInfos" => memInfos]));
    c.check(
        "NV00E0_CTRL_GET_INFO_PARAMS",
        rust!(NV00E0_CTRL_GET_INFO_PARAMS, ["info" => info]),
    );
    c.check(
        "NV_PHYSICAL_MEMORY_ATTRS",
        rust!(NV_PHYSICAL_MEMORY_ATTRS, [
        "addressSpace" => addressSpace, "compressionCoverage" => compressionCoverage]),
    );
    c.check("NV00F8_CTRL_GET_INFO_PARAMS", rust!(NV00F8_CTRL_GET_INFO_PARAMS, [
        "size" => size, "pageSize" => pageSize, "allocFlags" => allocFlags, "physAttrs" => physAttrs]));
    c.check(
        "NV00FD_CTRL_SET_FAILURE_PARAMS",
        rust!(NV00FD_CTRL_SET_FAILURE_PARAMS, ["status" => status]),
    );
    c.check(
        "NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS",
        rust!(NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS, ["gpuIds" => gpuIds]),
    );
    c.check(
        "NV0000_CTRL_GPU_ATTACH_IDS_PARAMS",
        rust!(NV0000_CTRL_GPU_ATTACH_IDS_PARAMS, [
        "gpuIds" => gpuIds, "failedId" => failedId]),
    );
    c.check(
        "NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS",
        rust!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, [
        "gpuId" => gpuId, "gpuFlags" => gpuFlags, "deviceInstance" => deviceInstance,
        "subDeviceInstance" => subDeviceInstance, "sliStatus" => sliStatus, "boardId" => boardId,
        "gpuInstance" => gpuInstance, "numaId" => numaId]),
    );
    c.check(
        "NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS",
        rust!(NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS, [
        "gpuId" => gpuId, "flags" => flags, "gpuUuid" => gpuUuid, "uuidStrLen" => uuidStrLen]),
    );
    c.check(
        "NV0000_CTRL_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL_PARAMS",
        rust!(NV0000_CTRL_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL_PARAMS, [
        "devDescriptor" => devDescriptor, "channel" => channel]),
    );
    c.consts(&constants());
}

/// The fabric event and its parameter block, for one family.
macro_rules! check_events {
    ($c:expr, $ev:ty, $params:ty, $attach:ty) => {
        $c.check("NV00F1_CTRL_FABRIC_EVENT", rust!($ev, [
            "type" => type_, "id" => id, "imexChannel" => imexChannel, "data" => data],
            extra [
                "data.import" => (offset_of!($ev, data), size_of::<NV00F1_CTRL_FABRIC_MEM_IMPORT_EVENT_DATA>()),
                "data.unimport" => (offset_of!($ev, data), size_of::<NV00F1_CTRL_FABRIC_MEM_UNIMPORT_EVENT_DATA>()),
                "data.attach" => (offset_of!($ev, data), size_of::<$attach>()),
                "data.cliqueIdChange" => (offset_of!($ev, data), size_of::<NV00F1_CTRL_CLIQUE_ID_CHANGE_GPU_EVENT_DATA>()),
            ]));
        $c.check("NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS", rust!($params, [
            "eventArray" => eventArray, "numEvents" => numEvents, "bMoreEvents" => bMoreEvents]));
    };
}

macro_rules! check_describe_validate {
    ($c:expr, $attrs:ty, [$($af:literal => $ar:ident),*], $describe:ty, $validate:ty) => {
        $c.check("NV_FABRIC_MEMORY_ATTRS", rust!($attrs, [$($af => $ar),*]));
        $c.check("NV00F8_CTRL_DESCRIBE_PARAMS", rust!($describe, [
            "offset" => offset, "totalPfns" => totalPfns, "pfnArray" => pfnArray, "numPfns" => numPfns,
            "attrs" => attrs, "physAttrs" => physAttrs, "memFlags" => memFlags]));
        $c.check("NV00FB_CTRL_VALIDATE_PARAMS", rust!($validate, [
            "attrs" => attrs, "physAttrs" => physAttrs, "offset" => offset, "totalPfns" => totalPfns,
            "pfnArray" => pfnArray, "numPfns" => numPfns, "memFlags" => memFlags, "flags" => flags,
            "bDone" => bDone]));
    };
}

macro_rules! check_nv00fd_alloc {
    ($c:expr, $t:ty) => {
        $c.check("NV00FD_ALLOCATION_PARAMETERS", rust!($t, [
            "expPacket" => expPacket, "index" => index, "alignment" => alignment, "allocSize" => allocSize,
            "pageSize" => pageSize, "allocFlags" => allocFlags, "numGpus" => numGpus, "pOsEvent" => pOsEvent]));
    };
}

#[test]
fn v550_matches_gcc() {
    let mut c = Checker::new("V550", include_str!("../tools/expected/V550.txt"));
    check_common(&mut c);
    c.check("NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA", rust!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V550, [
        "gpuFabricProbeHandle" => gpuFabricProbeHandle, "key" => key, "cliqueId" => cliqueId, "index" => index,
        "exportNodeId" => exportNodeId, "exportUuid" => exportUuid]));
    check_events!(
        c,
        NV00F1_CTRL_FABRIC_EVENT_V550,
        NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V550,
        NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V550
    );
    check_describe_validate!(c, NV_FABRIC_MEMORY_ATTRS_V550,
        ["kind" => kind, "pageSize" => pageSize, "size" => size, "cliqueId" => cliqueId],
        NV00F8_CTRL_DESCRIBE_PARAMS_V550, NV00FB_CTRL_VALIDATE_PARAMS_V550);
    check_nv00fd_alloc!(c, NV00FD_ALLOCATION_PARAMETERS_V550);
    c.check("NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS", rust!(NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V550, [
        "gpuFabricProbeHandle" => gpuFabricProbeHandle, "key" => key, "cliqueId" => cliqueId, "nodeId" => nodeId]));
    c.check("NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS", rust!(NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V550, [
        "state" => state, "status" => status, "clusterUuid" => clusterUuid, "fabricPartitionId" => fabricPartitionId,
        "fabricCaps" => fabricCaps, "fabricCliqueId" => fabricCliqueId, "fabricHealthMask" => fabricHealthMask]));
    c.check(
        "NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS",
        rust!(NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V550, [
        "gpuIds" => gpuIds, "excludedGpuIds" => excludedGpuIds]),
    );
    c.done();
}

fn check_probe_580(c: &mut Checker) {
    c.check("NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS", rust!(NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580, [
        "state" => state, "status" => status, "clusterUuid" => clusterUuid, "fabricPartitionId" => fabricPartitionId,
        "fabricCaps" => fabricCaps, "fabricCliqueId" => fabricCliqueId, "fabricHealthMask" => fabricHealthMask,
        "fabricHealthSummary" => fabricHealthSummary]));
    c.check(
        "NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS",
        rust!(NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580, [
        "gpuIds" => gpuIds, "excludedGpuIds" => excludedGpuIds, "gpuFlags" => gpuFlags]),
    );
}

#[test]
fn v580_matches_gcc() {
    let mut c = Checker::new("V580", include_str!("../tools/expected/V580.txt"));
    check_common(&mut c);
    c.check("NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA", rust!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V580, [
        "gpuFabricProbeHandle" => gpuFabricProbeHandle, "key" => key, "bwModeEpoch" => bwModeEpoch,
        "cliqueId" => cliqueId, "index" => index, "exportNodeId" => exportNodeId, "bwMode" => bwMode,
        "exportUuid" => exportUuid]));
    check_events!(
        c,
        NV00F1_CTRL_FABRIC_EVENT_V580,
        NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V580,
        NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V580
    );
    check_describe_validate!(c, NV_FABRIC_MEMORY_ATTRS_V580,
        ["kind" => kind, "pageSize" => pageSize, "size" => size, "cliqueId" => cliqueId,
         "bwModeEpoch" => bwModeEpoch, "bwMode" => bwMode],
        NV00F8_CTRL_DESCRIBE_PARAMS_V580, NV00FB_CTRL_VALIDATE_PARAMS_V580);
    check_nv00fd_alloc!(c, NV00FD_ALLOCATION_PARAMETERS_V580);
    c.check(
        "NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS",
        rust!(NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V580, [
        "gpuFabricProbeHandle" => gpuFabricProbeHandle, "key" => key, "bwModeEpoch" => bwModeEpoch,
        "cliqueId" => cliqueId, "nodeId" => nodeId, "bwMode" => bwMode]),
    );
    check_probe_580(&mut c);
    c.done();
}

#[test]
fn v590_matches_gcc() {
    let mut c = Checker::new("V590", include_str!("../tools/expected/V590.txt"));
    check_common(&mut c);
    c.check("NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA", rust!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V590, [
        "gpuFabricProbeHandle" => gpuFabricProbeHandle, "key" => key, "bwModeEpoch" => bwModeEpoch,
        "pageSize" => pageSize, "cliqueId" => cliqueId, "index" => index, "exportNodeId" => exportNodeId,
        "bwMode" => bwMode, "exportUuid" => exportUuid]));
    check_events!(
        c,
        NV00F1_CTRL_FABRIC_EVENT_V590,
        NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V590,
        NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V590
    );
    check_describe_validate!(c, NV_FABRIC_MEMORY_ATTRS_V590,
        ["kind" => kind, "pageSize" => pageSize, "size" => size, "cliqueId" => cliqueId,
         "bwModeEpoch" => bwModeEpoch, "bwMode" => bwMode],
        NV00F8_CTRL_DESCRIBE_PARAMS_V590, NV00FB_CTRL_VALIDATE_PARAMS_V590);
    check_nv00fd_alloc!(c, NV00FD_ALLOCATION_PARAMETERS_V590);
    c.check(
        "NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS",
        rust!(NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V590, [
        "gpuFabricProbeHandle" => gpuFabricProbeHandle, "key" => key, "bwModeEpoch" => bwModeEpoch,
        "pageSize" => pageSize, "cliqueId" => cliqueId, "nodeId" => nodeId, "bwMode" => bwMode]),
    );
    check_probe_580(&mut c);
    c.done();
}

#[test]
fn v595_matches_gcc() {
    let mut c = Checker::new("V595", include_str!("../tools/expected/V595.txt"));
    check_common(&mut c);
    c.check("NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA", rust!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V595, [
        "gpuFabricProbeHandle" => gpuFabricProbeHandle, "key" => key, "bwModeEpoch" => bwModeEpoch,
        "pageSize" => pageSize, "cliqueId" => cliqueId, "index" => index, "exportNodeId" => exportNodeId,
        "bwMode" => bwMode, "exportUuid" => exportUuid]));
    check_events!(
        c,
        NV00F1_CTRL_FABRIC_EVENT_V595,
        NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V595,
        NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V595
    );
    check_describe_validate!(c, NV_FABRIC_MEMORY_ATTRS_V595,
        ["kind" => kind, "pageSize" => pageSize, "size" => size, "cliqueId" => cliqueId,
         "bwModeEpoch" => bwModeEpoch, "bwMode" => bwMode],
        NV00F8_CTRL_DESCRIBE_PARAMS_V595, NV00FB_CTRL_VALIDATE_PARAMS_V595);
    check_nv00fd_alloc!(c, NV00FD_ALLOCATION_PARAMETERS_V595);
    c.check(
        "NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS",
        rust!(NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V595, [
        "gpuFabricProbeHandle" => gpuFabricProbeHandle, "key" => key, "bwModeEpoch" => bwModeEpoch,
        "pageSize" => pageSize, "cliqueId" => cliqueId, "nodeId" => nodeId, "bwMode" => bwMode]),
    );
    check_probe_580(&mut c);
    c.done();
}

/// The family modules pick the right struct for each family.
#[test]
fn family_modules_alias_the_right_types() {
    use openimex_rmabi::{v550, v580, v590, v595};
    assert_eq!(size_of::<v550::NV00F1_CTRL_FABRIC_EVENT>(), 64);
    assert_eq!(size_of::<v580::NV00F1_CTRL_FABRIC_EVENT>(), 80);
    assert_eq!(size_of::<v590::NV00F1_CTRL_FABRIC_EVENT>(), 88);
    assert_eq!(size_of::<v595::NV00F1_CTRL_FABRIC_EVENT>(), 88);
    assert_eq!(
        offset_of!(v590::NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA, exportUuid),
        41
    );
    assert_eq!(
        offset_of!(v595::NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA, exportUuid),
        42
    );
    assert_eq!(
        offset_of!(v580::NV00FD_ALLOCATION_PARAMETERS, allocFlags),
        60
    );
    assert_eq!(
        offset_of!(v590::NV00FD_ALLOCATION_PARAMETERS, allocFlags),
        64
    );
    assert_eq!(size_of::<v550::NV00F8_CTRL_DESCRIBE_PARAMS>(), 2120);
    assert_eq!(size_of::<v590::NV00FB_CTRL_VALIDATE_PARAMS>(), 2136);
    assert_eq!(v595::LAYOUT, openimex_rmabi::Layout::V595);
}
