//! Layouts, codecs and the version table, with the numbers written out for a reviewer.
//!
//! Every size and offset below was printed by gcc 12 (x86_64) compiling the SDK headers of
//! the family's reference tag (`tools/probe.c`); `tests/probe_match.rs` checks all of them
//! mechanically against `tools/expected/`.

use std::mem::{offset_of, size_of};

use openimex_rmabi::class::client::{NV0080_ALLOC_PARAMETERS, NV2080_ALLOC_PARAMETERS};
use openimex_rmabi::class::nv00e0::{NV_EXPORT_MEM_PACKET, NV00E0_ALLOCATION_PARAMETERS};
use openimex_rmabi::class::nv00f1::NV00F1_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::nv00fb::NV00FB_ALLOCATION_PARAMETERS;
use openimex_rmabi::class::nv00fd::{
    NV00FD_ALLOCATION_PARAMETERS_V550, NV00FD_ALLOCATION_PARAMETERS_V590,
};
use openimex_rmabi::ctrl::nv0000::*;
use openimex_rmabi::ctrl::nv00e0::NV00E0_CTRL_IMPORT_MEM_PARAMS;
use openimex_rmabi::ctrl::nv00f1::*;
use openimex_rmabi::ctrl::nv00f8::*;
use openimex_rmabi::ctrl::nv00fb::*;
use openimex_rmabi::ctrl::nv00fd::*;
use openimex_rmabi::ctrl::nv2080::*;
use openimex_rmabi::escape::*;
use openimex_rmabi::event::raw::*;
use openimex_rmabi::event::{
    FabricEvent, fabric_events_params, parse_fabric_events_params, parse_fabric_events_params_each,
};
use openimex_rmabi::{AbiError, Layout, SUPPORTED, layout_for};

// ---------------------------------------------------------------- sizes and offsets

#[test]
fn escape_structs() {
    assert_eq!(size_of::<NVOS00_PARAMETERS>(), 16);
    assert_eq!(size_of::<NVOS21_PARAMETERS>(), 32);
    assert_eq!(size_of::<NVOS54_PARAMETERS>(), 32);
    assert_eq!(offset_of!(NVOS54_PARAMETERS, params), 16);
    assert_eq!(offset_of!(NVOS54_PARAMETERS, paramsSize), 24);
    assert_eq!(offset_of!(NVOS54_PARAMETERS, status), 28);
    assert_eq!(size_of::<NVOS55_PARAMETERS>(), 28);
    assert_eq!(size_of::<NVOS64_PARAMETERS>(), 48);
    assert_eq!(offset_of!(NVOS64_PARAMETERS, pAllocParms), 16);
    assert_eq!(offset_of!(NVOS64_PARAMETERS, pRightsRequested), 24);
    assert_eq!(offset_of!(NVOS64_PARAMETERS, paramsSize), 32);
    assert_eq!(offset_of!(NVOS64_PARAMETERS, flags), 36);
    assert_eq!(offset_of!(NVOS64_PARAMETERS, status), 40);
    assert_eq!(size_of::<nv_ioctl_rm_api_version_t>(), 72);
    assert_eq!(size_of::<nv_ioctl_register_fd_t>(), 4);
    assert_eq!(size_of::<nv_ioctl_alloc_os_event_t>(), 16);
    assert_eq!(size_of::<nv_ioctl_free_os_event_t>(), 16);
    assert_eq!(size_of::<nv_ioctl_xfer_t>(), 16);
}

#[test]
fn class_structs() {
    assert_eq!(size_of::<NV0080_ALLOC_PARAMETERS>(), 56);
    assert_eq!(size_of::<NV2080_ALLOC_PARAMETERS>(), 4);
    assert_eq!(size_of::<NV00F1_ALLOCATION_PARAMETERS>(), 32);
    assert_eq!(offset_of!(NV00F1_ALLOCATION_PARAMETERS, capDescriptor), 0);
    assert_eq!(offset_of!(NV00F1_ALLOCATION_PARAMETERS, flags), 8);
    assert_eq!(offset_of!(NV00F1_ALLOCATION_PARAMETERS, pOsEvent), 16);
    assert_eq!(offset_of!(NV00F1_ALLOCATION_PARAMETERS, nodeId), 24);
    assert_eq!(size_of::<NV_EXPORT_MEM_PACKET>(), 32);
    assert_eq!(size_of::<NV00E0_ALLOCATION_PARAMETERS>(), 244);
    assert_eq!(offset_of!(NV00E0_ALLOCATION_PARAMETERS, packet), 4);
    assert_eq!(offset_of!(NV00E0_ALLOCATION_PARAMETERS, numMaxHandles), 36);
    assert_eq!(offset_of!(NV00E0_ALLOCATION_PARAMETERS, flags), 40);
    assert_eq!(offset_of!(NV00E0_ALLOCATION_PARAMETERS, metadata), 44);
    assert_eq!(offset_of!(NV00E0_ALLOCATION_PARAMETERS, numCurHandles), 240);
    assert_eq!(size_of::<NV00FB_ALLOCATION_PARAMETERS>(), 32);
    assert_eq!(offset_of!(NV00FB_ALLOCATION_PARAMETERS, index), 16);
    assert_eq!(offset_of!(NV00FB_ALLOCATION_PARAMETERS, flags), 20);
    assert_eq!(offset_of!(NV00FB_ALLOCATION_PARAMETERS, id), 24);
    // NV00FD: 80 bytes in both layouts, but pageSize widens and allocFlags/numGpus move.
    assert_eq!(size_of::<NV00FD_ALLOCATION_PARAMETERS_V550>(), 80);
    assert_eq!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V550, pageSize), 56);
    assert_eq!(
        offset_of!(NV00FD_ALLOCATION_PARAMETERS_V550, allocFlags),
        60
    );
    assert_eq!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V550, numGpus), 64);
    assert_eq!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V550, pOsEvent), 72);
    assert_eq!(size_of::<NV00FD_ALLOCATION_PARAMETERS_V590>(), 80);
    assert_eq!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, pageSize), 56);
    assert_eq!(
        offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, allocFlags),
        64
    );
    assert_eq!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, numGpus), 68);
    assert_eq!(offset_of!(NV00FD_ALLOCATION_PARAMETERS_V590, pOsEvent), 72);
}

#[test]
fn fabric_events_per_family() {
    // (family, event, attach data, params, numEvents @, bMoreEvents @)
    let rows = [
        (Layout::V550, 64, 40, 8200, 8192, 8196),
        (Layout::V580, 80, 56, 10248, 10240, 10244),
        (Layout::V590, 88, 64, 11272, 11264, 11268),
        (Layout::V595, 88, 64, 11272, 11264, 11268),
    ];
    for (l, ev, data, params, num, more) in rows {
        assert_eq!(l.fabric_event_size(), ev, "{l}");
        assert_eq!(l.fabric_event_data_size(), data, "{l}");
        assert_eq!(l.fabric_events_params_size(), params, "{l}");
        assert_eq!(get_fabric_events_tail_offsets(l), (num, more), "{l}");
    }
    assert_eq!(size_of::<NV00F1_CTRL_FABRIC_EVENT_V595>(), 88);
    assert_eq!(offset_of!(NV00F1_CTRL_FABRIC_EVENT_V595, type_), 0);
    assert_eq!(offset_of!(NV00F1_CTRL_FABRIC_EVENT_V595, id), 8);
    assert_eq!(offset_of!(NV00F1_CTRL_FABRIC_EVENT_V595, imexChannel), 16);
    assert_eq!(offset_of!(NV00F1_CTRL_FABRIC_EVENT_V595, data), 24);
    assert_eq!(
        size_of::<NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V595>(),
        11272
    );
    assert_eq!(
        offset_of!(NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V595, numEvents),
        11264
    );
    assert_eq!(
        offset_of!(NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V595, bMoreEvents),
        11268
    );
    assert_eq!(size_of::<NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS_V550>(), 8200);

    assert_eq!(size_of::<NV00F1_CTRL_FABRIC_MEM_IMPORT_EVENT_DATA>(), 32);
    assert_eq!(size_of::<NV00F1_CTRL_FABRIC_MEM_UNIMPORT_EVENT_DATA>(), 16);
    assert_eq!(size_of::<NV00F1_CTRL_CLIQUE_ID_CHANGE_GPU_EVENT_DATA>(), 8);
    // attach data, 595: pageSize @24, cliqueId @32, index @36, exportNodeId @38, bwMode u16 @40, uuid @42
    assert_eq!(
        offset_of!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V595, bwModeEpoch),
        16
    );
    assert_eq!(
        offset_of!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V595, pageSize),
        24
    );
    assert_eq!(
        offset_of!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V595, cliqueId),
        32
    );
    assert_eq!(
        offset_of!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V595, bwMode),
        40
    );
    assert_eq!(
        offset_of!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V595, exportUuid),
        42
    );
    assert_eq!(
        offset_of!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V590, exportUuid),
        41
    );
    assert_eq!(
        offset_of!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V580, bwMode),
        32
    );
    assert_eq!(
        offset_of!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V580, exportUuid),
        33
    );
    assert_eq!(
        offset_of!(NV00F1_CTRL_ATTACH_REMOTE_GPU_EVENT_DATA_V550, exportUuid),
        24
    );

    assert_eq!(size_of::<NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS>(), 2056);
    assert_eq!(
        offset_of!(NV00F1_CTRL_FINISH_MEM_UNIMPORT_PARAMS, numTokens),
        2048
    );
    assert_eq!(size_of::<NV00F1_CTRL_DISABLE_IMPORTERS_PARAMS>(), 2);
}

#[test]
fn memory_controls_per_family() {
    assert_eq!(size_of::<NV00E0_CTRL_IMPORT_MEM_PARAMS>(), 1540);
    assert_eq!(offset_of!(NV00E0_CTRL_IMPORT_MEM_PARAMS, memInfos), 516);

    // DESCRIBE, 580 on: numPfns @2064, attrs @2072, physAttrs @2120, memFlags @2128, 2136 B.
    for (l, size, attrs) in [
        (Layout::V550, 2120, 32),
        (Layout::V580, 2136, 48),
        (Layout::V590, 2136, 48),
        (Layout::V595, 2136, 48),
    ] {
        assert_eq!(l.describe_params_size(), size, "{l}");
        assert_eq!(l.validate_params_size(), size, "{l}");
        assert_eq!(l.fabric_memory_attrs_size(), attrs, "{l}");
    }
    assert_eq!(offset_of!(NV00F8_CTRL_DESCRIBE_PARAMS_V595, numPfns), 2064);
    assert_eq!(offset_of!(NV00F8_CTRL_DESCRIBE_PARAMS_V595, attrs), 2072);
    assert_eq!(
        offset_of!(NV00F8_CTRL_DESCRIBE_PARAMS_V595, physAttrs),
        2120
    );
    assert_eq!(offset_of!(NV00F8_CTRL_DESCRIBE_PARAMS_V595, memFlags), 2128);
    assert_eq!(
        offset_of!(NV00F8_CTRL_DESCRIBE_PARAMS_V550, physAttrs),
        2104
    );
    assert_eq!(offset_of!(NV00F8_CTRL_DESCRIBE_PARAMS_V550, memFlags), 2112);
    assert_eq!(offset_of!(NV_FABRIC_MEMORY_ATTRS_V595, bwModeEpoch), 32);
    assert_eq!(offset_of!(NV_FABRIC_MEMORY_ATTRS_V595, bwMode), 40);

    // VALIDATE, 580 on: offset @56, pfnArray @72, numPfns @2120, flags @2128, bDone @2132.
    assert_eq!(size_of::<NV00FB_CTRL_VALIDATE_PARAMS_V595>(), 2136);
    assert_eq!(offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V595, offset), 56);
    assert_eq!(offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V595, pfnArray), 72);
    assert_eq!(offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V595, numPfns), 2120);
    assert_eq!(offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V595, flags), 2128);
    assert_eq!(offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V595, bDone), 2132);
    // VALIDATE, V550: 2120 B, offset @40, pfnArray @56, numPfns @2104, flags @2112, bDone @2116.
    assert_eq!(size_of::<NV00FB_CTRL_VALIDATE_PARAMS_V550>(), 2120);
    assert_eq!(offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V550, offset), 40);
    assert_eq!(offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V550, pfnArray), 56);
    assert_eq!(offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V550, numPfns), 2104);
    assert_eq!(offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V550, flags), 2112);
    assert_eq!(offset_of!(NV00FB_CTRL_VALIDATE_PARAMS_V550, bDone), 2116);

    // ATTACH_REMOTE_GPU: 24, 32, 40, 40.
    assert_eq!(size_of::<NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V550>(), 24);
    assert_eq!(size_of::<NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V580>(), 32);
    assert_eq!(size_of::<NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V590>(), 40);
    assert_eq!(size_of::<NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V595>(), 40);
    assert_eq!(
        offset_of!(NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V595, nodeId),
        36
    );
    assert_eq!(
        offset_of!(NV00FD_CTRL_ATTACH_REMOTE_GPU_PARAMS_V595, bwMode),
        38
    );
    assert_eq!(size_of::<NV00FD_CTRL_SET_FAILURE_PARAMS>(), 4);
}

#[test]
fn gpu_controls_per_family() {
    assert_eq!(
        size_of::<NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V550>(),
        48
    );
    assert_eq!(
        size_of::<NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580>(),
        56
    );
    assert_eq!(
        offset_of!(
            NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580,
            fabricCaps
        ),
        32
    );
    assert_eq!(
        offset_of!(
            NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580,
            fabricCliqueId
        ),
        40
    );
    assert_eq!(
        offset_of!(
            NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580,
            fabricHealthMask
        ),
        44
    );
    assert_eq!(
        offset_of!(
            NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO_PARAMS_V580,
            fabricHealthSummary
        ),
        48
    );
    assert_eq!(size_of::<NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V550>(), 256);
    assert_eq!(size_of::<NV0000_CTRL_GPU_GET_PROBED_IDS_PARAMS_V580>(), 384);
    assert_eq!(size_of::<NV0000_CTRL_GPU_ATTACH_IDS_PARAMS>(), 132);
    assert_eq!(size_of::<NV0000_CTRL_GPU_GET_ATTACHED_IDS_PARAMS>(), 128);
    assert_eq!(size_of::<NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS>(), 32);
    assert_eq!(
        offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, deviceInstance),
        8
    );
    assert_eq!(
        offset_of!(NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS, subDeviceInstance),
        12
    );
    assert_eq!(
        size_of::<NV0000_CTRL_GPU_GET_UUID_FROM_GPU_ID_PARAMS>(),
        268
    );
    assert_eq!(
        size_of::<NV0000_CTRL_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL_PARAMS>(),
        16
    );
}

// ---------------------------------------------------------------- event codecs

const UUID: [u8; 16] = [
    0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x1D, 0x1E, 0x1F,
];

fn sample_events(l: Layout) -> Vec<FabricEvent> {
    let (epoch, bw) = if l.has_bw_mode() { (77, 0xAB) } else { (0, 0) };
    let page = if l.has_attach_page_size() { 1 << 29 } else { 0 };
    vec![
        FabricEvent::Import {
            id: 1,
            channel: 5,
            import_id: 0xABCD_EF01_2345,
            index: 3,
            export_node: 9,
            export_uuid: UUID,
        },
        FabricEvent::Unimport {
            id: 2,
            channel: 5,
            import_event_id: 1,
            export_node: 9,
        },
        FabricEvent::RemoteGpuAttach {
            id: 3,
            channel: 6,
            probe_handle: 0x1122_3344_5566_7788,
            key: 0x99AA_BBCC_DDEE_FF00,
            bw_mode_epoch: epoch,
            page_size: page,
            clique_id: 0x0102_0304,
            index: 0x0506,
            export_node: 0x0708,
            bw_mode: bw,
            export_uuid: UUID,
        },
        FabricEvent::CliqueIdChange {
            id: 4,
            channel: 0,
            gpu_id: 0x4100,
            clique_id: 32766,
        },
    ]
}

#[test]
fn every_event_type_roundtrips_in_every_family() {
    for l in Layout::ALL {
        for ev in sample_events(l) {
            let b = ev.encode(l).unwrap();
            assert_eq!(b.len(), l.fabric_event_size());
            assert_eq!(b[0], ev.type_value());
            assert_eq!(FabricEvent::decode(l, &b).unwrap(), ev, "{l}");
        }
    }
}

#[test]
fn absent_fields_are_dropped() {
    let full = sample_events(Layout::V595)[2];
    let FabricEvent::RemoteGpuAttach {
        bw_mode_epoch,
        page_size,
        bw_mode,
        ..
    } = FabricEvent::decode(Layout::V550, &full.encode(Layout::V550).unwrap()).unwrap()
    else {
        panic!("kind changed");
    };
    assert_eq!((bw_mode_epoch, page_size, bw_mode), (0, 0, 0));
    let FabricEvent::RemoteGpuAttach {
        page_size, bw_mode, ..
    } = FabricEvent::decode(Layout::V580, &full.encode(Layout::V580).unwrap()).unwrap()
    else {
        panic!("kind changed");
    };
    assert_eq!((page_size, bw_mode), (0, 0xAB));
    let wide = FabricEvent::RemoteGpuAttach {
        id: 1,
        channel: 0,
        probe_handle: 0,
        key: 0,
        bw_mode_epoch: 0,
        page_size: 0,
        clique_id: 0,
        index: 0,
        export_node: 0,
        bw_mode: 0x1FF,
        export_uuid: [0; 16],
    };
    assert!(matches!(
        wide.encode(Layout::V590),
        Err(AbiError::ValueOutOfRange {
            value: 0x1FF,
            max: 0xFF,
            ..
        })
    ));
    assert!(wide.encode(Layout::V595).is_ok());
}

fn put<const N: usize>(b: &mut [u8], at: usize, v: [u8; N]) {
    b[at..at + N].copy_from_slice(&v);
}

/// A V595 event written byte by byte at the header offsets, not by the encoder.
#[test]
fn decode_hand_built_v595() {
    let mut b = [0u8; 88];
    b[0] = 2; // type REMOTE_GPU_ATTACH
    put(&mut b, 8, 42u64.to_ne_bytes()); // id
    put(&mut b, 16, 7u32.to_ne_bytes()); // imexChannel
    let d = 24; // data
    put(&mut b, d, 0x1122_3344_5566_7788u64.to_ne_bytes()); // gpuFabricProbeHandle
    put(&mut b, d + 8, 0x99u64.to_ne_bytes()); // key
    put(&mut b, d + 16, 5u64.to_ne_bytes()); // bwModeEpoch
    put(&mut b, d + 24, (1u64 << 29).to_ne_bytes()); // pageSize
    put(&mut b, d + 32, 0xC1u32.to_ne_bytes()); // cliqueId
    put(&mut b, d + 36, 3u16.to_ne_bytes()); // index
    put(&mut b, d + 38, 12u16.to_ne_bytes()); // exportNodeId
    put(&mut b, d + 40, 0x0302u16.to_ne_bytes()); // bwMode (u16 in 595)
    put(&mut b, d + 42, UUID); // exportUuid
    assert_eq!(
        FabricEvent::decode(Layout::V595, &b).unwrap(),
        FabricEvent::RemoteGpuAttach {
            id: 42,
            channel: 7,
            probe_handle: 0x1122_3344_5566_7788,
            key: 0x99,
            bw_mode_epoch: 5,
            page_size: 1 << 29,
            clique_id: 0xC1,
            index: 3,
            export_node: 12,
            bw_mode: 0x0302,
            export_uuid: UUID,
        }
    );
    // The same bytes read as V590 put bwMode at one byte and the UUID one byte earlier.
    let FabricEvent::RemoteGpuAttach {
        bw_mode,
        export_uuid,
        ..
    } = FabricEvent::decode(Layout::V590, &b).unwrap()
    else {
        panic!("kind");
    };
    assert_eq!(bw_mode, 0x02);
    assert_ne!(export_uuid, UUID);

    // An import event, by hand.
    let mut b = [0u8; 88];
    b[0] = 0;
    put(&mut b, 8, 100u64.to_ne_bytes());
    put(&mut b, 16, 1u32.to_ne_bytes());
    put(&mut b, 24, 0xFFFF_FFFF_FFFEu64.to_ne_bytes()); // import.id
    put(&mut b, 32, 2u16.to_ne_bytes()); // import.index
    put(&mut b, 34, 4u16.to_ne_bytes()); // import.exportNodeId
    put(&mut b, 36, UUID); // import.exportUuid
    assert_eq!(
        FabricEvent::decode(Layout::V595, &b).unwrap(),
        FabricEvent::Import {
            id: 100,
            channel: 1,
            import_id: 0xFFFF_FFFF_FFFE,
            index: 2,
            export_node: 4,
            export_uuid: UUID
        }
    );
}

/// A V550 event and a V580 event written by hand.
#[test]
fn decode_hand_built_v550_and_v580() {
    let mut b = [0u8; 64];
    b[0] = 2;
    put(&mut b, 8, 9u64.to_ne_bytes());
    put(&mut b, 16, 3u32.to_ne_bytes());
    put(&mut b, 24, 0xAAu64.to_ne_bytes()); // gpuFabricProbeHandle
    put(&mut b, 32, 0xBBu64.to_ne_bytes()); // key
    put(&mut b, 40, 0xCCu32.to_ne_bytes()); // cliqueId
    put(&mut b, 44, 1u16.to_ne_bytes()); // index
    put(&mut b, 46, 2u16.to_ne_bytes()); // exportNodeId
    put(&mut b, 48, UUID); // exportUuid
    assert_eq!(
        FabricEvent::decode(Layout::V550, &b).unwrap(),
        FabricEvent::RemoteGpuAttach {
            id: 9,
            channel: 3,
            probe_handle: 0xAA,
            key: 0xBB,
            bw_mode_epoch: 0,
            page_size: 0,
            clique_id: 0xCC,
            index: 1,
            export_node: 2,
            bw_mode: 0,
            export_uuid: UUID,
        }
    );

    let mut b = [0u8; 80];
    b[0] = 2;
    put(&mut b, 8, 9u64.to_ne_bytes());
    put(&mut b, 24, 0xAAu64.to_ne_bytes());
    put(&mut b, 32, 0xBBu64.to_ne_bytes());
    put(&mut b, 40, 6u64.to_ne_bytes()); // bwModeEpoch
    put(&mut b, 48, 0xCCu32.to_ne_bytes()); // cliqueId
    put(&mut b, 52, 1u16.to_ne_bytes()); // index
    put(&mut b, 54, 2u16.to_ne_bytes()); // exportNodeId
    b[56] = 4; // bwMode (u8)
    put(&mut b, 57, UUID); // exportUuid at data + 33
    let FabricEvent::RemoteGpuAttach {
        bw_mode_epoch,
        bw_mode,
        export_uuid,
        clique_id,
        ..
    } = FabricEvent::decode(Layout::V580, &b).unwrap()
    else {
        panic!("kind");
    };
    assert_eq!(
        (bw_mode_epoch, bw_mode, export_uuid, clique_id),
        (6, 4, UUID, 0xCC)
    );

    // Unimport and clique change, V550.
    let mut b = [0u8; 64];
    b[0] = 1;
    put(&mut b, 8, 20u64.to_ne_bytes());
    put(&mut b, 24, 19u64.to_ne_bytes()); // importEventId
    put(&mut b, 32, 8u16.to_ne_bytes()); // exportNodeId
    assert_eq!(
        FabricEvent::decode(Layout::V550, &b).unwrap(),
        FabricEvent::Unimport {
            id: 20,
            channel: 0,
            import_event_id: 19,
            export_node: 8
        }
    );
    let mut b = [0u8; 64];
    b[0] = 3;
    put(&mut b, 8, 21u64.to_ne_bytes());
    put(&mut b, 24, 0x4100u32.to_ne_bytes()); // gpuId
    put(&mut b, 28, 5u32.to_ne_bytes()); // cliqueId
    assert_eq!(
        FabricEvent::decode(Layout::V550, &b).unwrap(),
        FabricEvent::CliqueIdChange {
            id: 21,
            channel: 0,
            gpu_id: 0x4100,
            clique_id: 5
        }
    );
}

#[test]
fn unknown_type_and_wrong_size_are_errors() {
    let mut b = vec![0u8; 88];
    b[0] = 9;
    assert_eq!(
        FabricEvent::decode(Layout::V595, &b),
        Err(AbiError::UnknownEventType { type_value: 9 })
    );
    let msg = FabricEvent::decode(Layout::V595, &b)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("unknown fabric event type 9"), "{msg}");
    let err = FabricEvent::decode(Layout::V595, &b[..80]).unwrap_err();
    assert_eq!(
        err,
        AbiError::WrongSize {
            what: "NV00F1_CTRL_FABRIC_EVENT",
            layout: Some(Layout::V595),
            expected: 88,
            actual: 80
        }
    );
}

// ---------------------------------------------------------------- whole parameter blocks

#[test]
fn params_roundtrip_every_family() {
    for l in Layout::ALL {
        let events = sample_events(l);
        let b = fabric_events_params(l, &events, true).unwrap();
        assert_eq!(b.len(), l.fabric_events_params_size());
        assert_eq!(
            parse_fabric_events_params(l, &b).unwrap(),
            (events.clone(), true)
        );
        let b = fabric_events_params(l, &[], false).unwrap();
        assert_eq!(parse_fabric_events_params(l, &b).unwrap(), (vec![], false));
    }
}

#[test]
fn params_built_by_hand_v595() {
    let mut b = vec![0u8; 11272];
    // event 1 (second slot): clique change
    let e = 88;
    b[e] = 3;
    put(&mut b, e + 8, 50u64.to_ne_bytes());
    put(&mut b, e + 24, 7u32.to_ne_bytes());
    put(&mut b, e + 28, 8u32.to_ne_bytes());
    // event 0: unimport
    b[0] = 1;
    put(&mut b, 8, 49u64.to_ne_bytes());
    put(&mut b, 16, 2u32.to_ne_bytes());
    put(&mut b, 24, 48u64.to_ne_bytes());
    put(&mut b, 32, 6u16.to_ne_bytes());
    put(&mut b, 11264, 2u32.to_ne_bytes()); // numEvents
    b[11268] = 1; // bMoreEvents
    let (events, more) = parse_fabric_events_params(Layout::V595, &b).unwrap();
    assert!(more);
    assert_eq!(
        events,
        vec![
            FabricEvent::Unimport {
                id: 49,
                channel: 2,
                import_event_id: 48,
                export_node: 6
            },
            FabricEvent::CliqueIdChange {
                id: 50,
                channel: 0,
                gpu_id: 7,
                clique_id: 8
            },
        ]
    );
}

#[test]
fn params_errors() {
    let l = Layout::V595;
    let too_many = vec![sample_events(l)[0]; 129];
    assert_eq!(
        fabric_events_params(l, &too_many, false),
        Err(AbiError::TooManyEntries {
            what: "NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS.eventArray",
            count: 129,
            max: 128
        })
    );
    assert!(fabric_events_params(l, &too_many[..128], false).is_ok());

    let err = parse_fabric_events_params(l, &[0u8; 8200]).unwrap_err();
    assert_eq!(
        err,
        AbiError::WrongSize {
            what: "NV00F1_CTRL_GET_FABRIC_EVENTS_PARAMS",
            layout: Some(Layout::V595),
            expected: 11272,
            actual: 8200
        }
    );
    let msg = err.to_string();
    assert!(msg.contains("11272") && msg.contains("8200"), "{msg}");

    let mut b = vec![0u8; 11272];
    put(&mut b, 11264, 129u32.to_ne_bytes());
    assert!(matches!(
        parse_fabric_events_params(l, &b),
        Err(AbiError::TooManyEntries {
            count: 129,
            max: 128,
            ..
        })
    ));

    // One bad event: the strict parser fails, the lenient one keeps the others.
    let mut b = fabric_events_params(l, &sample_events(l), false).unwrap();
    b[88] = 0x7F;
    assert_eq!(
        parse_fabric_events_params(l, &b),
        Err(AbiError::UnknownEventType { type_value: 0x7F })
    );
    let (each, _) = parse_fabric_events_params_each(l, &b).unwrap();
    assert_eq!(each.len(), 4);
    assert!(each[0].is_ok() && each[1].is_err() && each[2].is_ok() && each[3].is_ok());
}

// ---------------------------------------------------------------- version table

#[test]
fn known_versions_map_to_their_family() {
    assert_eq!(layout_for("550.40.07").unwrap(), Layout::V550);
    assert_eq!(layout_for("550.163.01").unwrap(), Layout::V550);
    assert_eq!(layout_for("570.133.20").unwrap(), Layout::V550);
    assert_eq!(layout_for("575.64.05").unwrap(), Layout::V550);
    assert_eq!(layout_for("580.65.06").unwrap(), Layout::V580);
    assert_eq!(layout_for("580.142").unwrap(), Layout::V580);
    assert_eq!(layout_for("590.44.01").unwrap(), Layout::V590);
    assert_eq!(layout_for("590.48.01").unwrap(), Layout::V590);
    assert_eq!(layout_for("595.44.02").unwrap(), Layout::V595);
    assert_eq!(layout_for("595.45.04").unwrap(), Layout::V595);
    for l in Layout::ALL {
        assert_eq!(layout_for(l.first_release()).unwrap(), l);
    }
    assert_eq!(Layout::V595.name(), "V595");
    assert_eq!(Layout::V580.first_release(), "580.65.06");
    assert_eq!(Layout::V580.last_release(), "580.142");
}

#[test]
fn unknown_version_lists_supported() {
    for bad in ["999.1", "545.29.06", "535.288.01", "595.45", ""] {
        let err = layout_for(bad).unwrap_err();
        let AbiError::UnsupportedVersion { version, supported } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(version, bad);
        assert!(supported.contains("550.40.07"), "{supported}");
        assert!(supported.contains("595.45.04"), "{supported}");
        let msg = err.to_string();
        assert!(
            msg.contains(bad) && msg.contains("V580: 580.65.06 … 580.142"),
            "{msg}"
        );
    }
}

#[test]
fn supported_table_is_the_checked_tags() {
    assert_eq!(SUPPORTED.len(), 101);
    assert_eq!(SUPPORTED.first(), Some(&("550.40.07", Layout::V550)));
    assert_eq!(SUPPORTED.last(), Some(&("595.45.04", Layout::V595)));
    let count = |l| SUPPORTED.iter().filter(|(_, f)| *f == l).count();
    assert_eq!(
        (
            count(Layout::V550),
            count(Layout::V580),
            count(Layout::V590),
            count(Layout::V595)
        ),
        (75, 21, 2, 3)
    );
    // a few real tags of NVIDIA/open-gpu-kernel-modules, one per family at least
    for tag in [
        "550.40.07",
        "560.35.03",
        "570.86.15",
        "580.65.06",
        "580.95.05",
        "590.44.01",
        "595.45.04",
    ] {
        assert!(SUPPORTED.iter().any(|(t, _)| *t == tag), "{tag}");
    }
    // no release before NV_IMEX_SESSION existed
    assert!(
        SUPPORTED
            .iter()
            .all(|(t, _)| !t.starts_with("545.") && !t.starts_with("535."))
    );
}

#[test]
fn params_size_lookup_matches_structs() {
    use openimex_rmabi::class::{NV_IMEX_SESSION, NV_MEMORY_MULTICAST_FABRIC, NV01_ROOT_CLIENT};
    for l in Layout::ALL {
        assert_eq!(
            l.control_params_size(NV00F1_CTRL_CMD_GET_FABRIC_EVENTS),
            Some(l.fabric_events_params_size())
        );
        assert_eq!(
            l.control_params_size(NV00F1_CTRL_CMD_FINISH_MEM_UNIMPORT),
            Some(2056)
        );
        assert_eq!(
            l.control_params_size(NV00FD_CTRL_CMD_ATTACH_REMOTE_GPU),
            Some(l.attach_remote_gpu_params_size())
        );
        assert_eq!(
            l.control_params_size(NV2080_CTRL_CMD_GET_GPU_FABRIC_PROBE_INFO),
            Some(l.fabric_probe_info_params_size())
        );
        assert_eq!(l.alloc_params_size(NV_IMEX_SESSION), Some(32));
        assert_eq!(l.alloc_params_size(NV_MEMORY_MULTICAST_FABRIC), Some(80));
        assert_eq!(l.alloc_params_size(NV01_ROOT_CLIENT), Some(4));
    }
    assert_eq!(
        Layout::V550.control_params_size(NV0000_CTRL_CMD_GPU_GET_PROBED_IDS),
        Some(256)
    );
    assert_eq!(
        Layout::V580.control_params_size(NV0000_CTRL_CMD_GPU_GET_PROBED_IDS),
        Some(384)
    );
    assert_eq!(Layout::V550.fabric_probe_info_params_size(), 48);
}
