//! An in-memory model of one node's GPU driver, as `docs/reference/driver-interface.md` §4 and §6
//! describe it: exports with a reference count (the creator plus one per daemon describe), import
//! descriptors keyed by (export, id) and named by their MEM_IMPORT event, the unimport wait
//! table, DISABLE_IMPORTERS, and the teardown of the IMEX session when the daemon dies. The
//! driver outlives the daemon: a restarted daemon opens a new session on the same model.
//!
//! The model records what it was asked to do; the world (`world.rs`) judges the cross-node
//! invariants (a validation names memory that is still alive, a free leaves no live mapping).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use openimex_core::{Event, GpuFabric, ImportError, InstanceId, NodeId, Pages, Status};

/// The export UUID of `exp_id` on `node`: (expId u64, nodeId u16, 6 zero bytes).
pub fn uuid(node: usize, exp_id: u64) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&exp_id.to_le_bytes());
    u[8..10].copy_from_slice(&u16::try_from(node).unwrap().to_le_bytes());
    u
}

/// The (node, expId) a UUID names.
pub fn parse_uuid(u: &[u8; 16]) -> (usize, u64) {
    let exp_id = u64::from_le_bytes(u[..8].try_into().unwrap());
    let node = u16::from_le_bytes(u[8..10].try_into().unwrap());
    (usize::from(node), exp_id)
}

/// The page list of an export: its fabric PFNs encode (node, expId), so a validation can be
/// traced back to the memory it maps.
fn pages_of(node: usize, exp_id: u64, npages: u64) -> Pages {
    let base = ((node as u64 + 1) << 40) | (exp_id << 8);
    Pages {
        size: npages << 21,
        page_size: 1 << 21,
        pfns: (0..npages).map(|k| base | k).collect(),
        clique_id: 7,
        bw_mode: 0,
        bw_mode_epoch: 0,
        kind: 0,
        phys_addr_space: 0,
        compression_coverage: 0,
        mem_flags: 0,
    }
}

/// The (node, expId) a page list maps.
pub fn parse_pages(p: &Pages) -> Option<(usize, u64)> {
    let pfn = *p.pfns.first()?;
    let node = usize::try_from(pfn >> 40).ok()?.checked_sub(1)?;
    Some((node, (pfn >> 8) & 0xFFFF_FFFF))
}

/// An import descriptor's key: (exporting node, expId, import id).
pub type DescKey = (usize, u64, u16);

/// One exported allocation.
#[derive(Debug)]
pub struct Export {
    pub channel: u32,
    /// The creating application still holds it.
    pub creator: bool,
    /// References held by the daemon's describes (its dups), by reference handle.
    pub daemon_refs: BTreeSet<u64>,
    /// The reference count reached zero: memory and FLA are gone.
    pub freed: bool,
    /// Found by UUID (cleared when the count reaches zero or the session is torn down).
    pub in_cache: bool,
    /// A session teardown dropped daemon references on it (a "dangling export"): remote
    /// importers may still map it until they learn the exporter's daemon restarted.
    pub dangled: bool,
    pub npages: u64,
}

impl Export {
    pub fn refcount(&self) -> usize {
        usize::from(self.creator) + self.daemon_refs.len()
    }
}

/// Where an import descriptor stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescState {
    /// MEM_IMPORT posted, not yet validated (NOT_READY).
    Pending,
    /// Validated: maps this export.
    Valid { node: usize, exp_id: u64 },
    /// Validated with IMPORT_FAILED, or failed by session teardown (INVALID_OBJECT).
    Failed,
    /// Its importers were disabled (RC'd): DISABLE_IMPORTERS or session teardown.
    Disabled,
}

/// An import descriptor: shared by the local importers of the same (export, id).
#[derive(Debug)]
pub struct Descriptor {
    pub key: DescKey,
    pub event_id: u64,
    /// The session it was posted under.
    pub epoch: u64,
    pub channel: u32,
    pub state: DescState,
    /// The exporter daemon instance whose answer validated it.
    pub exporter_instance: Option<InstanceId>,
    pub users: u32,
    /// Still found by key for new importers.
    pub in_cache: bool,
}

/// A releaser blocked in unimport.
#[derive(Debug, Clone, Copy)]
pub struct Waiter {
    pub import_event_id: u64,
    pub since: Instant,
}

/// The IMEX session (one slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    pub instance: InstanceId,
    pub epoch: u64,
}

/// Result of an application's import call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportCall {
    /// The allocation succeeded; its descriptor (new or shared).
    Ok { desc: u64, posted: bool },
    /// No daemon session to post the event to: NOT_READY at once (docs/reference/driver-interface.md §1.6
    /// "Import request", §6.5), keeping nothing.
    NoSession,
    /// Shared descriptor with another channel: INSUFFICIENT_PERMISSIONS.
    ChannelMismatch,
}

/// What a session teardown did.
#[derive(Debug, Default)]
pub struct Teardown {
    pub freed: Vec<u64>,
    pub failed_imports: usize,
    pub woken: usize,
    pub disabled: usize,
    pub dangling: bool,
}

/// One node's driver.
#[derive(Debug)]
pub struct Driver {
    pub node: usize,
    pub session: Option<Session>,
    epochs: u64,
    /// `bAllowFabricMemAlloc`: off after a teardown that left dangling exports, until a new
    /// session.
    pub fabric_alloc: bool,
    next_event: u64,
    next_export: u64,
    next_ref: u64,
    next_desc: u64,
    pub exports: BTreeMap<u64, Export>,
    /// Daemon reference handle → the export it holds.
    ref_owner: BTreeMap<u64, u64>,
    pub descs: BTreeMap<u64, Descriptor>,
    cache: BTreeMap<DescKey, u64>,
    by_event: BTreeMap<u64, u64>,
    /// Import events not yet validated nor torn down, with the time they were posted.
    pub pending: BTreeMap<u64, (Instant, usize)>,
    /// Every import event ever posted, with its session epoch.
    import_events: BTreeMap<u64, u64>,
    /// The unimport wait table.
    pub waiters: BTreeMap<u64, Waiter>,
    /// Posted events the daemon has not read yet.
    pub events: VecDeque<Event>,
    /// The node's GPUs on the fabric, as their probes read now (§5).
    pub gpus: Vec<GpuFabric>,
}

impl Driver {
    pub fn new(node: usize) -> Self {
        Self {
            node,
            session: None,
            epochs: 0,
            // Allowed from load until a session ends with dangling exports (§4, §6.1).
            fabric_alloc: true,
            // Event IDs are per driver and never reused across sessions.
            next_event: 1 + (node as u64) * 1_000_000,
            next_export: 1,
            next_ref: 1,
            next_desc: 1,
            exports: BTreeMap::new(),
            ref_owner: BTreeMap::new(),
            descs: BTreeMap::new(),
            cache: BTreeMap::new(),
            by_event: BTreeMap::new(),
            pending: BTreeMap::new(),
            import_events: BTreeMap::new(),
            waiters: BTreeMap::new(),
            events: VecDeque::new(),
            // Two GPUs; neighbours sit in different cliques, so some peers share none.
            gpus: (0..2)
                .map(|gpu| GpuFabric {
                    gpu,
                    state: "COMPLETED".into(),
                    clique_id: 1 + (node as u32 % 2),
                    health_summary: "HEALTHY".into(),
                    ..GpuFabric::default()
                })
                .collect(),
        }
    }

    /// A Fabric Manager probe update moved `gpu` to clique `clique_id`: the probe reads the
    /// new clique from now on, and the daemon's session, if one is open, gets CLIQUE_ID_CHANGE
    /// when `event` (§1.6 "Other events": the event is posted on channel 0 to the daemon).
    pub fn move_gpu(&mut self, gpu: u32, clique_id: u32, event: bool) {
        if let Some(g) = self.gpus.iter_mut().find(|g| g.gpu == gpu) {
            g.clique_id = clique_id;
        }
        if event && self.session.is_some() {
            self.events
                .push_back(Event::CliqueIdChange { gpu, clique_id });
        }
    }

    fn event_id(&mut self) -> u64 {
        self.next_event += 1;
        self.next_event
    }

    // ---- daemon side ---------------------------------------------------------------------

    /// RM_ALLOC NV_IMEX_SESSION: fabric allocation is enabled again.
    pub fn open_session(&mut self, instance: InstanceId) -> Result<(), String> {
        if let Some(s) = self.session {
            return Err(format!(
                "node {}: session opened by {instance} while {} holds it",
                self.node, s.instance
            ));
        }
        self.epochs += 1;
        self.session = Some(Session {
            instance,
            epoch: self.epochs,
        });
        self.fabric_alloc = true;
        Ok(())
    }

    /// The daemon died or exited: §4 "Daemon dies or restarts".
    pub fn teardown(&mut self) -> Teardown {
        let mut t = Teardown::default();
        if self.session.take().is_none() {
            return t;
        }
        // 1. Dangling exports disable fabric allocation until a new session; the daemon's
        //    client is freed, so its dups go.
        t.dangling = !self.ref_owner.is_empty();
        self.fabric_alloc = !t.dangling;
        let refs: Vec<u64> = self.ref_owner.keys().copied().collect();
        for e in self.exports.values_mut() {
            e.dangled |= !e.daemon_refs.is_empty();
        }
        for r in refs {
            if let Some(freed) = self.drop_ref(r) {
                t.freed.push(freed);
            }
        }
        // 2. No further imports of this node's exports.
        for e in self.exports.values_mut() {
            e.in_cache = false;
        }
        // 3. Pending imports report INVALID_STATE.
        t.failed_imports = self.pending.len();
        self.pending.clear();
        // 4. Events flushed, blocked unimports woken.
        self.events.clear();
        t.woken = self.waiters.len();
        self.waiters.clear();
        // 5. Every importing client is disabled.
        for d in self.descs.values_mut() {
            d.in_cache = false;
            match d.state {
                DescState::Pending => d.state = DescState::Failed,
                DescState::Valid { .. } => {
                    d.state = DescState::Disabled;
                    t.disabled += 1;
                }
                DescState::Failed | DescState::Disabled => {}
            }
        }
        self.cache.clear();
        t
    }

    /// DUP_BY_UUID + IMPORT_MEM + DESCRIBE: takes a daemon reference on the export.
    pub fn describe(
        &mut self,
        export_uuid: &[u8; 16],
        index: u16,
        channel: u32,
    ) -> Result<(u64, Pages), ImportError> {
        if self.session.is_none() {
            return Err(ImportError::new(Status::InvalidState, "no IMEX session"));
        }
        let (node, exp_id) = parse_uuid(export_uuid);
        let e = self
            .exports
            .get_mut(&exp_id)
            .filter(|e| node == self.node && index == 0 && e.in_cache)
            .ok_or_else(|| ImportError::new(Status::ObjectNotFound, "no such export"))?;
        if e.channel != channel {
            return Err(ImportError::new(
                Status::InsufficientPermissions,
                "channel mismatch",
            ));
        }
        let r = self.next_ref;
        self.next_ref += 1;
        e.daemon_refs.insert(r);
        let pages = pages_of(node, exp_id, e.npages);
        self.ref_owner.insert(r, exp_id);
        Ok((r, pages))
    }

    /// The daemon frees its dups. Returns the exports freed, or the first unknown reference
    /// (a double release).
    pub fn release_refs(&mut self, refs: &[u64]) -> Result<Vec<u64>, u64> {
        let mut freed = Vec::new();
        for &r in refs {
            if !self.ref_owner.contains_key(&r) {
                return Err(r);
            }
            freed.extend(self.drop_ref(r));
        }
        Ok(freed)
    }

    fn drop_ref(&mut self, r: u64) -> Option<u64> {
        let exp_id = self.ref_owner.remove(&r)?;
        let e = self.exports.get_mut(&exp_id)?;
        e.daemon_refs.remove(&r);
        self.maybe_free(exp_id)
    }

    fn maybe_free(&mut self, exp_id: u64) -> Option<u64> {
        let e = self.exports.get_mut(&exp_id)?;
        if e.freed || e.refcount() > 0 {
            return None;
        }
        e.freed = true;
        e.in_cache = false;
        Some(exp_id)
    }

    /// VALIDATE (or IMPORT_FAILED) for an import event. Returns the descriptor's state before
    /// and its key, `None` when no live descriptor has that event (released meanwhile). Errors
    /// name a contract breach (unknown event, validated twice, wrong session).
    pub fn validate(
        &mut self,
        event_id: u64,
        result: &Result<Pages, Status>,
        exporter_instance: Option<InstanceId>,
    ) -> Result<Option<(DescState, DescKey)>, String> {
        let Some(&epoch) = self.import_events.get(&event_id) else {
            return Err(format!("validate of unknown import event {event_id}"));
        };
        if self.session.map(|s| s.epoch) != Some(epoch) {
            return Err(format!(
                "validate of import event {event_id} from another session"
            ));
        }
        if self.pending.remove(&event_id).is_none() {
            return Err(format!("import event {event_id} validated twice"));
        }
        let Some(d) = self
            .by_event
            .get(&event_id)
            .and_then(|id| self.descs.get_mut(id))
        else {
            return Ok(None);
        };
        let before = d.state;
        if d.state == DescState::Pending {
            d.exporter_instance = exporter_instance;
            d.state = match result {
                Ok(p) => {
                    let (node, exp_id) = parse_pages(p).unwrap_or((usize::MAX, 0));
                    DescState::Valid { node, exp_id }
                }
                Err(_) => {
                    d.in_cache = false;
                    DescState::Failed
                }
            };
            if d.state == DescState::Failed {
                self.cache.remove(&d.key);
            }
        }
        Ok(Some((before, d.key)))
    }

    /// FINISH_MEM_UNIMPORT. Errors name a token that was not waiting.
    pub fn finish(&mut self, ids: &[u64]) -> Result<usize, u64> {
        for id in ids {
            if self.waiters.remove(id).is_none() {
                return Err(*id);
            }
        }
        Ok(ids.len())
    }

    /// DISABLE_IMPORTERS(node).
    pub fn disable_importers(&mut self, node: NodeId) -> usize {
        let mut n = 0;
        for d in self.descs.values_mut() {
            if d.key.0 != node.index() {
                continue;
            }
            d.in_cache = false;
            match d.state {
                DescState::Valid { .. } | DescState::Pending => {
                    d.state = DescState::Disabled;
                    n += 1;
                }
                DescState::Failed | DescState::Disabled => {}
            }
        }
        self.cache.retain(|k, _| k.0 != node.index());
        n
    }

    // ---- application side ----------------------------------------------------------------

    /// cuMemCreate(FABRIC) + export. Needs fabric allocation allowed, and a session: without
    /// one the handle names node 0xFFFF and no other node could import it, so the workload
    /// does not make such exports.
    pub fn create_export(&mut self, channel: u32, npages: u64) -> Option<u64> {
        if self.session.is_none() || !self.fabric_alloc {
            return None;
        }
        let id = self.next_export;
        self.next_export += 1;
        self.exports.insert(
            id,
            Export {
                channel,
                creator: true,
                daemon_refs: BTreeSet::new(),
                freed: false,
                in_cache: true,
                dangled: false,
                npages,
            },
        );
        Some(id)
    }

    /// The creator releases its export. Returns it if that freed the memory.
    pub fn release_export(&mut self, exp_id: u64) -> Option<u64> {
        let e = self.exports.get_mut(&exp_id)?;
        e.creator = false;
        self.maybe_free(exp_id)
    }

    /// NV_MEMORY_FABRIC_IMPORT_V2: find or create the descriptor; the first importer posts
    /// MEM_IMPORT.
    pub fn import(
        &mut self,
        now: Instant,
        node: usize,
        exp_id: u64,
        id: u16,
        channel: u32,
    ) -> ImportCall {
        let Some(session) = self.session else {
            return ImportCall::NoSession;
        };
        let key = (node, exp_id, id);
        if let Some(&desc) = self.cache.get(&key) {
            let d = self.descs.get_mut(&desc).unwrap();
            if d.channel != channel {
                return ImportCall::ChannelMismatch;
            }
            d.users += 1;
            return ImportCall::Ok {
                desc,
                posted: false,
            };
        }
        let event_id = self.event_id();
        let desc = self.next_desc;
        self.next_desc += 1;
        self.descs.insert(
            desc,
            Descriptor {
                key,
                event_id,
                epoch: session.epoch,
                channel,
                state: DescState::Pending,
                exporter_instance: None,
                users: 1,
                in_cache: true,
            },
        );
        self.cache.insert(key, desc);
        self.by_event.insert(event_id, desc);
        self.pending.insert(event_id, (now, node));
        self.import_events.insert(event_id, session.epoch);
        self.events.push_back(Event::Import {
            event_id,
            channel,
            export_uuid: uuid(node, exp_id),
            index: 0,
            export_node: NodeId(u16::try_from(node).unwrap()),
        });
        ImportCall::Ok { desc, posted: true }
    }

    /// An importer frees its object. The last one posts MEM_UNIMPORT (unless the import
    /// failed, or its session is gone) and blocks. Returns the unimport event it waits on.
    pub fn release_import(&mut self, now: Instant, desc: u64) -> Option<u64> {
        let d = self.descs.get_mut(&desc)?;
        d.users -= 1;
        if d.users > 0 {
            return None;
        }
        let d = self.descs.remove(&desc).unwrap();
        if self.cache.get(&d.key) == Some(&desc) {
            self.cache.remove(&d.key);
        }
        self.by_event.remove(&d.event_id);
        let live_session = self.session.is_some_and(|s| s.epoch == d.epoch);
        if d.state == DescState::Failed || !live_session {
            return None;
        }
        let unimport_event_id = self.event_id();
        self.waiters.insert(
            unimport_event_id,
            Waiter {
                import_event_id: d.event_id,
                since: now,
            },
        );
        self.events.push_back(Event::Unimport {
            unimport_event_id,
            import_event_id: d.event_id,
            export_node: NodeId(u16::try_from(d.key.0).unwrap()),
        });
        Some(unimport_event_id)
    }

    /// Import events to `node`'s exports still waiting for their validation.
    pub fn pending_from(&self, node: usize) -> Vec<u64> {
        self.pending
            .iter()
            .filter(|(_, (_, n))| *n == node)
            .map(|(e, _)| *e)
            .collect()
    }

    /// Whether the import of `event_id` is validated and still mapped.
    pub fn is_live(&self, event_id: u64) -> bool {
        self.by_event
            .get(&event_id)
            .and_then(|d| self.descs.get(d))
            .is_some_and(|d| matches!(d.state, DescState::Valid { .. }))
    }

    /// Live mappings here of memory exported by `node`, from an instance other than `current`
    /// (any, with `None`).
    pub fn maps_from(&self, node: usize, current: Option<InstanceId>) -> Vec<u64> {
        self.descs
            .values()
            .filter(|d| {
                matches!(d.state, DescState::Valid { node: n, .. } if n == node)
                    && (current.is_none() || d.exporter_instance != current)
            })
            .map(|d| d.event_id)
            .collect()
    }

    /// Live mappings of (node, exp_id) here.
    pub fn maps(&self, node: usize, exp_id: u64) -> usize {
        self.descs
            .values()
            .filter(|d| d.state == DescState::Valid { node, exp_id })
            .count()
    }

    /// Who holds each unfreed export, for the report.
    pub fn describe_leaks(&self) -> Vec<String> {
        self.exports
            .iter()
            .filter(|(_, e)| !e.freed)
            .map(|(id, e)| {
                format!(
                    "node {} export {id}: creator={} daemon refs={:?}",
                    self.node, e.creator, e.daemon_refs
                )
            })
            .collect()
    }
}
