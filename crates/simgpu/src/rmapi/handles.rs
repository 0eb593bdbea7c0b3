//! RM clients and their object trees, as resserv keeps them (`rs_server.c`, `rs_client.c`):
//! client handles system-wide (the RM picks `0xC1D00000 | index` when asked for 0), object
//! handles per client (the same value in two clients is two objects), every object under a
//! parent of the same client, and the order a subtree is freed in (children before their
//! parent; on a client's free, the high-priority objects first: the IMEX session is
//! `RS_FREE_PRIORITY_HIGH` in `resource_list.h`).

use std::collections::{BTreeMap, HashMap};

use openimex_rmabi::NvHandle;
use openimex_rmabi::ctrl::nv00f8::FabricMemoryAttrs;

use super::FileId;
use crate::rm::ClientId;

/// First client handle the RM generates (`RS_CLIENT_HANDLE_BASE`, `g_resserv_nvoc.h`).
pub(super) const CLIENT_HANDLE_BASE: NvHandle = 0xC1D0_0000;
/// Client handle indices wrap at this (`RS_CLIENT_HANDLE_MAX`).
const CLIENT_HANDLE_MAX: u32 = 0x10_0000;
/// First object handle the RM generates in a client (`RS_UNIQUE_HANDLE_BASE`,
/// `g_rs_client_nvoc.h`).
pub(super) const UNIQUE_HANDLE_BASE: NvHandle = 0xCAF0_0000;
/// Object handles the RM generates per client (`RS_UNIQUE_HANDLE_RANGE`).
const UNIQUE_HANDLE_RANGE: u32 = 0x8_0000;

/// One object of a client (the client itself is not in its table: its handle is the parent
/// of the top-level objects).
#[derive(Debug)]
pub(super) struct Object {
    /// The external class it was allocated as.
    pub(super) class: u32,
    /// Its parent's handle (the client's handle for top-level objects).
    pub(super) parent: NvHandle,
    /// What it is.
    pub(super) kind: Kind,
}

/// What an object is, with what the driver keeps for it.
#[derive(Debug)]
pub(super) enum Kind {
    /// NV01_DEVICE_0 of device instance (GPU index) `instance`.
    Device { instance: u32 },
    /// NV20_SUBDEVICE_0 of GPU `gpu`.
    Subdevice { gpu: u32 },
    /// NV_IMEX_SESSION (the one of the node: [`super::RmApi`] keeps the rest).
    Session,
    /// NV_MEMORY_EXPORT duplicated by UUID: the driver's handle of the dup and the cached
    /// allocation parameters the dup returned.
    Export {
        rm: u64,
        cached: Box<openimex_rmabi::class::nv00e0::NV00E0_ALLOCATION_PARAMETERS>,
    },
    /// IMPORT_MEM's dup of unicast fabric memory (NV_MEMORY_FABRIC).
    FabricMemory { rm: u64 },
    /// IMPORT_MEM's dup of a prime multicast object (NV_MEMORY_MULTICAST_FABRIC).
    Multicast { rm: u64 },
    /// NV_MEMORY_FABRIC_IMPORTED_REF holding the claim of the import descriptor posted as
    /// event `event_id`, and the pages VALIDATE has pushed so far.
    ImportedRef(Box<ImportedRef>),
}

/// One RM client: the file it was allocated on (`pOSInfo`, checked by `rmclientValidate`),
/// the state machine's client it maps to, and its objects.
#[derive(Debug)]
pub(super) struct Client {
    pub(super) file: FileId,
    pub(super) rm: ClientId,
    pub(super) objects: BTreeMap<NvHandle, Object>,
    /// Next index of `clientGenResourceHandle`.
    next_index: u32,
}

impl Client {
    pub(super) fn new(file: FileId, rm: ClientId) -> Self {
        Self {
            file,
            rm,
            objects: BTreeMap::new(),
            next_index: 0,
        }
    }

    /// `clientGenResourceHandle`: the next free handle of the client's generator range.
    pub(super) fn gen_handle(&mut self, h_client: NvHandle) -> Option<NvHandle> {
        for _ in 0..UNIQUE_HANDLE_RANGE {
            let h = UNIQUE_HANDLE_BASE + (self.next_index % UNIQUE_HANDLE_RANGE);
            self.next_index = self.next_index.wrapping_add(1);
            if h != h_client && !self.objects.contains_key(&h) {
                return Some(h);
            }
        }
        None
    }

    /// The objects of the subtree under `root` (`root` last), each after its children.
    pub(super) fn subtree(&self, root: NvHandle) -> Vec<NvHandle> {
        let mut children: HashMap<NvHandle, Vec<NvHandle>> = HashMap::new();
        for (&h, o) in &self.objects {
            children.entry(o.parent).or_default().push(h);
        }
        let mut out = Vec::new();
        // Iterative post-order: a handle is pushed after all of its descendants.
        let mut stack = vec![(root, false)];
        while let Some((h, expanded)) = stack.pop() {
            if expanded {
                out.push(h);
                continue;
            }
            stack.push((h, true));
            for &c in children.get(&h).into_iter().flatten() {
                stack.push((c, false));
            }
        }
        out
    }

    /// Every object of the client in the order the client's free frees them: the
    /// high-priority ones (the IMEX session) first, then the rest children first.
    pub(super) fn free_order(&self, h_client: NvHandle) -> Vec<NvHandle> {
        let mut order: Vec<NvHandle> = self
            .objects
            .iter()
            .filter(|(_, o)| matches!(o.kind, Kind::Session))
            .map(|(&h, _)| h)
            .collect();
        let rest: Vec<NvHandle> = self
            .subtree(h_client)
            .into_iter()
            .filter(|h| *h != h_client && !order.contains(h))
            .collect();
        order.extend(rest);
        order
    }

    /// The first object of kind `f` (for `deviceGetByInstance`, `subdeviceGetByDeviceAndGpu`).
    pub(super) fn find(&self, f: impl Fn(&Object) -> bool) -> Option<NvHandle> {
        self.objects.iter().find(|(_, o)| f(o)).map(|(&h, _)| h)
    }
}

/// The RM's client table: client handles are system-wide.
#[derive(Debug, Default)]
pub(super) struct Clients {
    pub(super) map: HashMap<NvHandle, Client>,
    /// `clientCurrentHandleIndex` of `_serverCreateEntryAndLockForNewClient`.
    next_index: u32,
}

impl Clients {
    /// The client handle for a request of `wanted` (0: the RM picks one), or `None` when
    /// taken (`NV_ERR_INSERT_DUPLICATE_NAME`).
    pub(super) fn assign(&mut self, wanted: NvHandle) -> Option<NvHandle> {
        if wanted != 0 {
            return (!self.map.contains_key(&wanted)).then_some(wanted);
        }
        for _ in 0..CLIENT_HANDLE_MAX {
            let h = CLIENT_HANDLE_BASE | (self.next_index % CLIENT_HANDLE_MAX);
            self.next_index = self.next_index.wrapping_add(1);
            if !self.map.contains_key(&h) {
                return Some(h);
            }
        }
        None
    }
}

/// An NV_MEMORY_FABRIC_IMPORTED_REF object: its claim and what VALIDATE pushed so far
/// (`MemoryFabricImportedRef`: `numUpdatedPfns` and the temporary memory descriptor).
#[derive(Debug)]
pub(super) struct ImportedRef {
    pub(super) event_id: u64,
    /// PFNs pushed so far (`numUpdatedPfns`).
    pub(super) updated: u64,
    pub(super) temp: Option<TempDesc>,
}

/// `_createTempMemDesc`: the attributes of the first chunk and a PTE per page.
#[derive(Debug)]
pub(super) struct TempDesc {
    pub(super) attrs: FabricMemoryAttrs,
    pub(super) contiguous: bool,
    pub(super) pfns: Vec<u32>,
}

impl ImportedRef {
    pub(super) fn new(event_id: u64) -> Self {
        Self {
            event_id,
            updated: 0,
            temp: None,
        }
    }

    /// The import event whose descriptor it claimed.
    pub(super) fn event_id(&self) -> u64 {
        self.event_id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(parent: NvHandle, kind: Kind) -> Object {
        Object {
            class: 0,
            parent,
            kind,
        }
    }

    #[test]
    fn a_subtree_is_freed_children_first_and_the_session_before_everything() {
        let h = 0xC1D0_0000;
        let mut c = Client::new(1, 1);
        c.objects.insert(1, obj(h, Kind::Device { instance: 0 }));
        c.objects.insert(2, obj(1, Kind::Subdevice { gpu: 0 }));
        c.objects.insert(3, obj(h, Kind::Session));
        c.objects.insert(4, obj(2, Kind::Subdevice { gpu: 0 }));
        let sub = c.subtree(1);
        assert_eq!(sub.last(), Some(&1));
        let pos = |x| sub.iter().position(|&y| y == x).unwrap();
        assert!(pos(4) < pos(2) && pos(2) < pos(1));
        let all = c.free_order(h);
        assert_eq!(all[0], 3, "RS_FREE_PRIORITY_HIGH first");
        assert_eq!(all.len(), 4);
        assert!(!all.contains(&h));
    }

    #[test]
    fn generated_handles_follow_the_resserv_bases_and_skip_taken_ones() {
        let mut t = Clients::default();
        let a = t.assign(0).unwrap();
        assert_eq!(a, CLIENT_HANDLE_BASE);
        t.map.insert(a, Client::new(1, 1));
        assert_eq!(t.assign(0), Some(CLIENT_HANDLE_BASE + 1));
        assert_eq!(t.assign(a), None, "a taken handle");
        let c = t.map.get_mut(&a).unwrap();
        c.objects
            .insert(UNIQUE_HANDLE_BASE, obj(a, Kind::Device { instance: 0 }));
        assert_eq!(c.gen_handle(a), Some(UNIQUE_HANDLE_BASE + 1));
    }
}
