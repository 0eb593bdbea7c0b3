//! The applications of `demo --jobs`: one thread per (job, GPU of the job's trays), each with
//! its own driver client subscribed to its job's channel, as each process of a job opens the
//! channel its prolog made. A GPU of a tray shared by two jobs runs one application per job.
//!
//! The phases, all applications together (a barrier between each):
//! 1. create a buffer, fill one slot per importer of the job, export;
//! 2. import every other export of the job, check the slot the exporter filled for this
//!    importer and write an answer into it (the all-to-all of the default mode, per job);
//! 3. cross-job, on the application's own channel: import every export of every other job;
//! 4. cross-job, holding the other job's channel: the first application of each GPU opens, for
//!    every job whose trays do not include its own, that job's channel on its node (planted by
//!    the demo: the channel a process outside the job would have to get hold of) and imports
//!    every export of that job;
//! 5. the exporter checks every answer; then everything is released.
//!
//! Every cross-job attempt must fail as the driver fails a refused import: INVALID_OBJECT (the
//! daemons refused it) or INSUFFICIENT_PERMISSIONS (the driver's own channel check, for memory
//! of this node or a descriptor cached on another channel). Phases 3 and 4 are apart so that a
//! descriptor a phase-3 attempt holds for a moment cannot answer a phase-4 one: each phase-4
//! refusal is the daemons' job check.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use anyhow::bail;
use openimex_client::{Context, CuError, FabricHandleBytes, pattern};

use super::layout::Layout;

/// One application: a job's process on one GPU.
#[derive(Debug, Clone)]
pub(super) struct App {
    pub(super) job: usize,
    pub(super) tray: usize,
    /// The GPU on its tray.
    pub(super) gpu: u32,
    /// Its index among its job's applications (its slot in their buffers).
    pub(super) rank: usize,
    /// The first application of its GPU (the one that makes the phase-4 attempts).
    pub(super) first_of_gpu: bool,
}

/// Every application of the layout, job by job, tray by tray.
pub(super) fn apps(layout: &Layout, gpus_per_tray: u32) -> Vec<App> {
    let mut apps = Vec::new();
    for (j, job) in layout.jobs.iter().enumerate() {
        let mut rank = 0;
        for tray in job.trays.clone() {
            for gpu in 0..gpus_per_tray {
                apps.push(App {
                    job: j,
                    tray,
                    gpu,
                    rank,
                    first_of_gpu: (0..j).all(|i| !layout.has(i, tray)),
                });
                rank += 1;
            }
        }
    }
    apps
}

/// What one application did.
#[derive(Default)]
pub(super) struct Report {
    pub(super) latencies_us: Vec<u64>,
    pub(super) errors: Vec<String>,
}

/// How cross-job attempts ended.
#[derive(Default)]
pub(super) struct Cross {
    /// Refused by the daemons (INVALID_OBJECT), by the driver (INSUFFICIENT_PERMISSIONS).
    pub(super) by_daemons: AtomicUsize,
    pub(super) by_driver: AtomicUsize,
    /// Served: isolation broken (not an application error: the count fails the demo).
    pub(super) served: AtomicUsize,
    /// The first one served.
    pub(super) first_served: Mutex<Option<String>>,
    /// The first refusal of each kind (own channel, held channel), as the application saw it.
    pub(super) first: Mutex<[Option<String>; 2]>,
}

/// Shared between the application threads and the main thread.
pub(super) struct Shared {
    pub(super) apps: Vec<App>,
    pub(super) layout: Layout,
    pub(super) node_dirs: Vec<PathBuf>,
    pub(super) buffer: u64,
    pub(super) slot: u64,
    handles: Mutex<Vec<Option<FabricHandleBytes>>>,
    /// Every application exported (the main thread waits on it too, to start the clock).
    pub(super) exported: Barrier,
    barrier: Barrier,
    /// Imports inside the jobs attempted, cross-job imports attempted (progress).
    pub(super) imports_done: AtomicUsize,
    pub(super) cross_done: AtomicUsize,
    /// When the last application finished phase 2, 3 and 4.
    pub(super) phase_end: Mutex<[Option<Instant>; 3]>,
    pub(super) cross: Cross,
    pub(super) bytes_verified: AtomicU64,
}

impl Shared {
    pub(super) fn new(
        layout: Layout,
        gpus_per_tray: u32,
        node_dirs: Vec<PathBuf>,
        buffer: u64,
        slot: u64,
    ) -> Self {
        let apps = apps(&layout, gpus_per_tray);
        let n = apps.len();
        Self {
            apps,
            layout,
            node_dirs,
            buffer,
            slot,
            handles: Mutex::new(vec![None; n]),
            exported: Barrier::new(n + 1),
            barrier: Barrier::new(n),
            imports_done: AtomicUsize::new(0),
            cross_done: AtomicUsize::new(0),
            phase_end: Mutex::new([None; 3]),
            cross: Cross::default(),
            bytes_verified: AtomicU64::new(0),
        }
    }

    fn ended(&self, phase: usize) {
        let mut ends = self.phase_end.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        ends[phase] = Some(ends[phase].map_or(now, |t| t.max(now)));
    }

    /// Counts how a cross-job attempt of `kind` (0: own channel, 1: held channel) ended; an
    /// error that is no refusal is the application's error.
    fn cross_outcome(
        &self,
        ctx: &Context,
        kind: usize,
        outcome: Result<openimex_client::Imported, CuError>,
        what: &str,
    ) -> Option<String> {
        self.cross_done.fetch_add(1, Ordering::Relaxed);
        let refused = match outcome {
            Ok(imported) => {
                self.cross.served.fetch_add(1, Ordering::Relaxed);
                let _ = ctx.release(imported);
                let mut first = (self.cross.first_served.lock()).unwrap_or_else(|e| e.into_inner());
                first.get_or_insert_with(|| what.to_string());
                return None;
            }
            Err(e @ CuError::InvalidHandle(_)) => {
                self.cross.by_daemons.fetch_add(1, Ordering::Relaxed);
                e
            }
            Err(e @ CuError::NotPermitted(_)) => {
                self.cross.by_driver.fetch_add(1, Ordering::Relaxed);
                e
            }
            Err(e) => return Some(format!("{what}: failed, but not as a refusal: {e}")),
        };
        let mut first = self.cross.first.lock().unwrap_or_else(|e| e.into_inner());
        first[kind].get_or_insert_with(|| format!("{what}: {refused}"));
        None
    }
}

fn seed(exporter: usize, importer: usize, phase: u64) -> u64 {
    ((exporter as u64) << 32) ^ ((importer as u64) << 8) ^ phase
}

/// Application `me`. Follows the phases through the shared barrier.
pub(super) fn run(me: usize, shared: &Shared) -> Report {
    let mut report = Report::default();
    let app = &shared.apps[me];
    let layout = &shared.layout;
    let name = |a: &App| format!("{} tray {} GPU {}", layout.jobs[a.job].name, a.tray, a.gpu);
    let label = name(app);
    let fail = |report: &mut Report, what: String| report.errors.push(format!("{label}: {what}"));
    let slot = shared.slot;
    let slot_range = |rank: usize| {
        let start = rank as u64 * slot;
        start as usize..(start + slot) as usize
    };
    let node_dir = &shared.node_dirs[app.tray];
    let channel =
        |job: usize| openimex_client::node_dir::channel_path(node_dir, layout.jobs[job].channel);
    let peers: Vec<usize> = (0..shared.apps.len())
        .filter(|i| *i != me && shared.apps[*i].job == app.job)
        .collect();

    // Phase 1: create, fill each importer's slot, export.
    let ctx = Context::open_with_channel(node_dir, Some(&channel(app.job)));
    let mut own = None;
    match &ctx {
        Ok(ctx) => match ctx
            .mem_create(app.gpu, shared.buffer)
            .and_then(|a| ctx.map(&a).map(|m| (a, m)))
        {
            Ok((alloc, mut map)) => {
                for i in &peers {
                    let rank = shared.apps[*i].rank;
                    pattern::fill(&mut map.as_mut_slice()[slot_range(rank)], seed(me, *i, 1));
                }
                match ctx.export(&alloc) {
                    Ok(h) => shared.handles.lock().unwrap_or_else(|e| e.into_inner())[me] = Some(h),
                    Err(e) => fail(&mut report, format!("export: {e}")),
                }
                own = Some((alloc, map));
            }
            Err(e) => fail(&mut report, format!("create: {e}")),
        },
        Err(e) => fail(
            &mut report,
            format!("open the driver on channel of its job: {e}"),
        ),
    }
    shared.exported.wait();
    let handles = shared
        .handles
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();

    // Phase 2: import every other export of the job, check my slot, write my answer into it.
    let mut imports = Vec::new();
    if let Ok(ctx) = &ctx {
        for i in &peers {
            let from = name(&shared.apps[*i]);
            let Some(h) = &handles[*i] else {
                fail(&mut report, format!("no handle from {from}"));
                shared.imports_done.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let t = Instant::now();
            let imported = ctx.import(h);
            shared.imports_done.fetch_add(1, Ordering::Relaxed);
            let imported = match imported {
                Ok(x) => x,
                Err(e) => {
                    fail(&mut report, format!("import from {from}: {e}"));
                    continue;
                }
            };
            report
                .latencies_us
                .push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
            match ctx.map_on(&imported, app.gpu) {
                Ok(mut map) => {
                    let mine = &mut map.as_mut_slice()[slot_range(app.rank)];
                    match pattern::verify(mine, seed(*i, me, 1)) {
                        Ok(()) => {
                            shared.bytes_verified.fetch_add(slot, Ordering::Relaxed);
                        }
                        Err(off) => fail(
                            &mut report,
                            format!("{from}'s buffer, my slot: mismatch at byte {off}"),
                        ),
                    }
                    pattern::fill(mine, seed(*i, me, 2));
                    imports.push((imported, Some(map)));
                }
                Err(e) => {
                    fail(&mut report, format!("map {from}'s buffer: {e}"));
                    imports.push((imported, None));
                }
            }
        }
    }
    shared.ended(0);
    shared.barrier.wait();

    // Phase 3: every export of the other jobs, on my own channel.
    if let Ok(ctx) = &ctx {
        let others = (0..shared.apps.len()).filter(|i| shared.apps[*i].job != app.job);
        for i in others {
            let what = format!("{label} importing {}'s export", name(&shared.apps[i]));
            let Some(h) = &handles[i] else {
                shared.cross_done.fetch_add(1, Ordering::Relaxed);
                fail(
                    &mut report,
                    format!("no handle from {}", name(&shared.apps[i])),
                );
                continue;
            };
            if let Some(e) = shared.cross_outcome(ctx, 0, ctx.import(h), &what) {
                fail(&mut report, e);
            }
        }
    }
    shared.ended(1);
    shared.barrier.wait();

    // Phase 4: holding another job's channel on a tray outside that job.
    if app.first_of_gpu {
        let foreign = (0..layout.jobs.len()).filter(|j| !layout.has(*j, app.tray));
        for j in foreign {
            let exporters: Vec<usize> = (0..shared.apps.len())
                .filter(|i| shared.apps[*i].job == j)
                .collect();
            let held = match Context::open_with_channel(node_dir, Some(&channel(j))) {
                Ok(c) => c,
                Err(e) => {
                    shared
                        .cross_done
                        .fetch_add(exporters.len(), Ordering::Relaxed);
                    fail(
                        &mut report,
                        format!(
                            "open channel {} of {}: {e}",
                            layout.jobs[j].channel, layout.jobs[j].name
                        ),
                    );
                    continue;
                }
            };
            for i in exporters {
                let what = format!(
                    "tray {} GPU {} holding channel {} importing {}'s export",
                    app.tray,
                    app.gpu,
                    layout.jobs[j].channel,
                    name(&shared.apps[i])
                );
                let Some(h) = &handles[i] else {
                    shared.cross_done.fetch_add(1, Ordering::Relaxed);
                    continue;
                };
                if let Some(e) = shared.cross_outcome(&held, 1, held.import(h), &what) {
                    fail(&mut report, e);
                }
            }
        }
    }
    shared.ended(2);
    shared.barrier.wait();

    // Phase 5: the exporter checks what every importer of its job wrote into its slot.
    if let Some((_, map)) = &own {
        for i in &peers {
            let rank = shared.apps[*i].rank;
            match pattern::verify(&map.as_slice()[slot_range(rank)], seed(me, *i, 2)) {
                Ok(()) => {
                    shared.bytes_verified.fetch_add(slot, Ordering::Relaxed);
                }
                Err(off) => fail(
                    &mut report,
                    format!(
                        "slot written by {}: mismatch at byte {off}",
                        name(&shared.apps[*i])
                    ),
                ),
            }
        }
    }
    shared.barrier.wait();

    // Release everything (unimports go through both daemons).
    if let Ok(ctx) = &ctx {
        super::super::all_to_all::release_held(ctx, imports, own, |e| fail(&mut report, e));
    }
    report
}

/// Channels created for phase 4 on trays outside their job, for [`remove_planted`].
pub(super) struct Channels {
    pub(super) planted: Vec<PathBuf>,
}

/// Checks and prepares the channel files the applications open, once every job is READY:
/// - each job's channel on each of its members must be there (the daemon creates it when it
///   defines the job);
/// - channel j on every tray outside job j, the file a process outside the job would have to
///   get hold of for phase 4, is created where missing (on a real node, root's mknod, or a
///   site that made every channel on every node): the daemons must refuse its imports all
///   the same.
pub(super) fn prepare_channels(layout: &Layout, node_dirs: &[PathBuf]) -> anyhow::Result<Channels> {
    use anyhow::Context as _;
    let mut channels = Channels {
        planted: Vec::new(),
    };
    for (j, job) in layout.jobs.iter().enumerate() {
        for (tray, dir) in node_dirs.iter().enumerate() {
            let path = openimex_client::node_dir::channel_path(dir, job.channel);
            if path.exists() {
                continue;
            }
            if layout.has(j, tray) {
                bail!(
                    "node {tray}: {} READY but its channel {} is missing",
                    job.name,
                    path.display()
                );
            }
            let made = openimex_driver::channels::create_channel_file(
                &path,
                openimex_driver::channels::DEFAULT_CHANNEL_MODE,
                None,
                None,
            )
            .with_context(|| format!("cannot create {}", path.display()))?;
            if made {
                channels.planted.push(path);
            }
        }
    }
    Ok(channels)
}

/// Removes the channels [`prepare_channels`] planted.
pub(super) fn remove_planted(planted: &[PathBuf]) {
    for path in planted {
        if let Err(e) = std::fs::remove_file(path) {
            eprintln!("warning: cannot remove {}: {e}", path.display());
        }
    }
}
