//! VALIDATE's rules (`memoryfabricimportedrefCtrlValidate`, `docs/reference/driver-interface.md`
//! §1.4, §4 "Failed import"), and escapes of arbitrary bytes, which are answered, never a
//! panic.

use openimex_rmabi::NvHandle;
use openimex_rmabi::class::NV_MEMORY_FABRIC_IMPORTED_REF;
use openimex_rmabi::class::nv00fb::NV00FB_ALLOCATION_PARAMETERS;
use openimex_rmabi::ctrl::nv00f8::FabricMemoryAttrs;
use openimex_rmabi::ctrl::nv00fb::{NV00FB_CTRL_CMD_VALIDATE, Validate};
use openimex_rmabi::escape::{
    NV_ESC_ALLOC_OS_EVENT, NV_ESC_ATTACH_GPUS_TO_FD, NV_ESC_CHECK_VERSION_STR,
    NV_ESC_FREE_OS_EVENT, NV_ESC_REGISTER_FD, NV_ESC_RM_ALLOC, NV_ESC_RM_CONTROL, NV_ESC_RM_FREE,
};
use openimex_rmabi::status::*;
use openimex_simproto::handle::FabricHandle;
use openimex_simproto::proto::{NvStatus, PAGE_SIZE};
use zerocopy::IntoBytes;

use super::sequence::{Daemon, get_events, start};
use super::*;
use crate::rm::{ClientId, ImportState};

/// A pending import of 4 pages from A on B, and B's daemon's reference object for it.
fn pending(domain: &Domain) -> (Node, Daemon, ClientId, u64, NvHandle, Node) {
    let mut a = domain.node(0, "595.45.04");
    let mut b = domain.node(1, "595.45.04");
    let _da = start(&mut a, file(1), 0);
    let db = start(&mut b, file(1), 1);
    let exporter = a.app(0);
    let created = a.rm.create(exporter, 0, 4 * PAGE_SIZE).unwrap();
    let handle = a.rm.export(exporter, created.mem).unwrap();
    let uuid = FabricHandle::from_hex(&handle).unwrap().export_uuid;
    let importer = b.app(0);
    let import = b.rm.import(importer, &handle, 2).unwrap();
    assert_eq!(get_events(&mut b, &db).0.len(), 1);
    let r = NV00FB_ALLOCATION_PARAMETERS {
        exportUuid: uuid.0,
        id: 2,
        ..Default::default()
    };
    let (s, h_ref, _) = b.alloc(
        db.f,
        db.h,
        db.h,
        0,
        NV_MEMORY_FABRIC_IMPORTED_REF,
        r.as_bytes(),
        Vec::new(),
    );
    assert_eq!(s, NV_OK);
    (b, db, importer, import, h_ref, a)
}

fn chunk(offset: u64, total: u64, pfns: Vec<u32>, page_size: u64, size: u64) -> Validate {
    Validate {
        attrs: FabricMemoryAttrs {
            page_size,
            size,
            ..Default::default()
        },
        offset,
        total_pfns: total,
        pfns,
        ..Default::default()
    }
}

#[test]
fn validate_checks_its_ranges_and_attributes_in_the_kernels_order() {
    let domain = Domain::new("validate-rules");
    let (mut b, db, importer, import, h_ref, _a) = pending(&domain);
    let layout = b.api.config().layout;
    let call = |b: &mut Node, v: &Validate| {
        b.control(
            db.f,
            db.h,
            h_ref,
            NV00FB_CTRL_CMD_VALIDATE,
            &v.encode(layout).unwrap(),
        )
        .0
    };
    let size = 4 * PAGE_SIZE;
    // totalPfns 0: NV_ERR_INVALID_ARGUMENT.
    assert_eq!(
        call(&mut b, &chunk(0, 0, vec![], PAGE_SIZE, size)),
        NV_ERR_INVALID_ARGUMENT
    );
    // offset + numPfns past totalPfns: NV_ERR_OUT_OF_RANGE.
    assert_eq!(
        call(&mut b, &chunk(3, 4, vec![1, 2], PAGE_SIZE, size)),
        NV_ERR_OUT_OF_RANGE
    );
    // A page size other than 2M, 512M, 256G: NV_ERR_INVALID_ARGUMENT.
    assert_eq!(
        call(&mut b, &chunk(0, 4, vec![1], 4096, size)),
        NV_ERR_INVALID_ARGUMENT
    );
    // A size that is not a multiple of the page size: NV_ERR_INVALID_ARGUMENT.
    assert_eq!(
        call(&mut b, &chunk(0, 4, vec![1], PAGE_SIZE, size + 1)),
        NV_ERR_INVALID_ARGUMENT
    );
    // Two good chunks: bDone on the second; the import is ready.
    let pfn = |k: u32| ((crate::fla::GpuAddr { node: 0, gpu: 0 }.base() >> 21) as u32) + k;
    assert_eq!(
        call(&mut b, &chunk(0, 4, vec![pfn(0), pfn(1)], PAGE_SIZE, size)),
        NV_OK
    );
    assert_eq!(b.rm.wait_import(importer, import), Ok(ImportState::Pending));
    assert_eq!(
        call(&mut b, &chunk(2, 4, vec![pfn(2), pfn(3)], PAGE_SIZE, size)),
        NV_OK
    );
    assert!(matches!(
        b.rm.wait_import(importer, import),
        Ok(ImportState::Ready(_))
    ));
    // Every PFN is in: another chunk is NV_ERR_INVALID_ARGUMENT.
    assert_eq!(
        call(&mut b, &chunk(0, 4, vec![pfn(0)], PAGE_SIZE, size)),
        NV_ERR_INVALID_ARGUMENT
    );
}

#[test]
fn import_failed_fails_every_waiter_without_an_unimport() {
    // IMPORT_FAILED installs a NULL memdesc: every use of the import is
    // NV_ERR_INVALID_OBJECT (§4 "Failed import"), and its release posts no MEM_UNIMPORT
    // (`_importDescriptorPutAndLockReleaseWrite`).
    let domain = Domain::new("validate-failed");
    let (mut b, db, importer, import, h_ref, _a) = pending(&domain);
    let layout = b.api.config().layout;
    let (s, _) = b.control(
        db.f,
        db.h,
        h_ref,
        NV00FB_CTRL_CMD_VALIDATE,
        &Validate::import_failed().encode(layout).unwrap(),
    );
    assert_eq!(s, NV_OK);
    assert_eq!(
        b.rm.wait_import(importer, import),
        Err(NvStatus::InvalidObject)
    );
    b.rm.release(importer, import).unwrap();
    assert_eq!(get_events(&mut b, &db).0, []);
}

#[test]
fn arbitrary_bytes_are_answered_never_a_panic() {
    // Every escape, argument sizes around the valid ones, arbitrary contents and parameter
    // blocks: the answer is an errno or an RM status.
    let domain = Domain::new("garbage");
    let mut n = domain.node(0, "595.45.04");
    let d = start(&mut n, file(1), 0);
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let escapes = [
        NV_ESC_RM_ALLOC,
        NV_ESC_RM_FREE,
        NV_ESC_RM_CONTROL,
        NV_ESC_ALLOC_OS_EVENT,
        NV_ESC_FREE_OS_EVENT,
        NV_ESC_CHECK_VERSION_STR,
        NV_ESC_ATTACH_GPUS_TO_FD,
        NV_ESC_REGISTER_FD,
        0,
        0xFF,
    ];
    let sizes = [0, 4, 8, 16, 28, 32, 47, 48, 72, 200];
    let controls = [
        0xF1_0001u32,
        0xF1_0002,
        0xE0_0102,
        0xF8_0102,
        0xFB_0101,
        0xFD_0106,
        0x214,
    ];
    for i in 0..4000 {
        let nr = escapes[(next() % escapes.len() as u64) as usize];
        let len = sizes[(next() % sizes.len() as u64) as usize];
        let mut arg: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        // Half the time, aim the call at the daemon's real client and objects.
        if i % 2 == 0 && arg.len() >= 12 {
            arg[..4].copy_from_slice(&d.h.to_ne_bytes());
            let obj = [d.h, d.session, 0x1000, 0x2001][(next() % 4) as usize];
            arg[4..8].copy_from_slice(&obj.to_ne_bytes());
            let cmd = controls[(next() % controls.len() as u64) as usize];
            arg[8..12].copy_from_slice(&cmd.to_ne_bytes());
        }
        let plen = [0usize, 2, 32, 244, 1540, 2136, 11272][(next() % 7) as usize];
        if nr == NV_ESC_RM_CONTROL && arg.len() == 32 {
            arg[24..28].copy_from_slice(&(plen as u32).to_ne_bytes());
        }
        let params: Vec<u8> = (0..plen).map(|_| next() as u8).collect();
        let s = n.escape(d.f, nr, arg.clone(), params.clone(), Vec::new());
        assert_eq!(s.reply.arg.len(), arg.len());
        assert_eq!(s.reply.params.len(), params.len());
        assert!(
            s.reply.errno == 0 || s.reply.errno == nix::libc::EINVAL,
            "{}",
            s.trace
        );
    }
}
