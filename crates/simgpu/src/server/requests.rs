//! One request of a driver client, answered under the driver's lock: the dispatch of every
//! [`Request`] to the state machine ([`crate::rm`]), the calls that block as the real driver's
//! do (import waits, the unimport handshake, the daemon's event poll), and who may do what
//! (the IMEX session and the fabric controls are root's or the driver's own user's).

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openimex_simproto::node_dir::{channel_files, channels_dir};
use openimex_simproto::proto::{NvStatus, Request, Response};

use super::calls::{deadline, error, may_manage_fabric};
use super::parked::{self, Wait};
use super::{Shared, multicast};
use crate::rm::{ClientId, NO_FLA_RANGE, Released};

/// What becomes of a request.
#[derive(Debug)]
pub(super) enum Answer {
    /// Its response, for the connection's thread to send.
    Now(Response),
    /// It waits, parked ([`super::parked`]): whoever makes it answerable answers it.
    Parked,
}

impl From<Response> for Answer {
    fn from(r: Response) -> Self {
        Answer::Now(r)
    }
}

/// The channel whose file the descriptor is open on: same (device, inode) as one of the node's
/// channel files ([`channel_files`]), as the real driver checks that the descriptor is
/// open on an `nvidia-caps-imex-channels` device and takes its minor.
pub(super) fn resolve_channel(node_dir: &Path, fd: &OwnedFd) -> Option<u32> {
    let st = fs::File::from(fd.try_clone().ok()?).metadata().ok()?;
    let (dev, ino) = (st.dev(), st.ino());
    channel_files(node_dir)
        .ok()?
        .into_iter()
        .find_map(|(n, path)| {
            let m = fs::metadata(path).ok()?;
            (m.dev() == dev && m.ino() == ino).then_some(n)
        })
}

/// How long an OpenSession waits for the teardown of a session whose daemon hung up: its
/// connection's thread does it as soon as it sees the hang-up, so this only bounds a stuck one.
const PREDECESSOR_TEARDOWN: Duration = Duration::from_secs(5);

pub(super) fn handle(
    shared: &Shared,
    client: ClientId,
    stream: &Arc<UnixStream>,
    req: Request,
    fds: &[OwnedFd],
) -> Answer {
    let mut rm = shared.rm();
    // A call that blocks in the real driver: its answer now if it has one, else it is parked
    // (under the lock, so the change that makes it answerable sees it).
    macro_rules! wait {
        ($wait:expr, $until:expr) => {{
            let (wait, until) = ($wait, $until);
            match parked::answer_at_once(&mut rm, client, wait, until, shared.stopping()) {
                Some(resp) => return resp.into(),
                None => {
                    shared.park(&rm, client, wait, until, stream);
                    return Answer::Parked;
                }
            }
        }};
    }
    let result: Result<Response, NvStatus> = match req {
        Request::Hello { pid } => {
            tracing::debug!(client, pid, "hello");
            Ok(Response::Hello {
                node_id: rm.node_id(),
                gpus: rm.gpus(),
                fabric_dir: rm.fabric_dir().to_string_lossy().into_owned(),
            })
        }
        Request::SubscribeChannel => {
            let resolved = fds
                .first()
                .and_then(|fd| resolve_channel(&shared.node_dir, fd));
            match rm.subscribe_descriptor(client, resolved) {
                Ok(channel) => Ok(Response::Subscribed { channel }),
                Err(NvStatus::NotSupported) => {
                    return error(
                        NvStatus::NotSupported,
                        "this driver has no IMEX channels (its IMEX channel count is 0)",
                    )
                    .into();
                }
                Err(NvStatus::InsufficientPermissions) => {
                    let count = rm.config().imex_channel_count;
                    return error(
                        NvStatus::InsufficientPermissions,
                        match resolved {
                            Some(n) => format!(
                                "channel{n} is not an IMEX channel of this driver (it has \
                                 channels 0 to {})",
                                count.saturating_sub(1)
                            ),
                            None => format!(
                                "the attached descriptor is not an IMEX channel of {}",
                                channels_dir(&shared.node_dir).display()
                            ),
                        },
                    )
                    .into();
                }
                Err(s) => Err(s),
            }
        }
        Request::Create { gpu, size } => match rm.create(client, gpu, size) {
            Ok(c) => Ok(Response::Created {
                mem: c.mem,
                size: c.location.size,
                file: c.location.file.to_string_lossy().into_owned(),
                offset: c.location.offset,
            }),
            Err(NvStatus::InvalidState) if rm.allow_fabric_alloc() => {
                let state = rm.probe_info(gpu).map(|p| p.state.nvml_name());
                return error(
                    NvStatus::InvalidState,
                    format!(
                        "{NO_FLA_RANGE} GPU {gpu}'s fabric probe is {}: no Fabric Manager has \
                         answered it; complete the probe (CompleteFabricProbe) or start the \
                         driver without `--probe pending`",
                        state.unwrap_or("unknown")
                    ),
                )
                .into();
            }
            Err(s) => Err(s),
        },
        Request::Export { mem } => rm
            .export(client, mem)
            .map(|handle| Response::Exported { handle }),
        Request::Import {
            handle,
            import_id,
            wait_ms,
        } => match rm.import(client, &handle, import_id) {
            Ok(import) if wait_ms > 0 => wait!(
                Wait::Import {
                    import,
                    with_handle: true
                },
                deadline(wait_ms)
            ),
            Ok(import) => Ok(Response::Imported { import }),
            Err(NvStatus::NotReady) => {
                return error(
                    NvStatus::NotReady,
                    "no IMEX daemon session on this node to post the import to",
                )
                .into();
            }
            Err(NvStatus::NotSupported) => {
                return error(
                    NvStatus::NotSupported,
                    "the handle was exported while its node had no IMEX daemon (export node \
                     ID 0xFFFF): it can only be used on that node",
                )
                .into();
            }
            Err(s) => Err(s),
        },
        Request::WaitImport { import, timeout_ms } => {
            wait!(
                Wait::Import {
                    import,
                    with_handle: false
                },
                deadline(timeout_ms)
            )
        }
        Request::Release { handle } => match rm.release(client, handle) {
            Ok(Released::Done) => Ok(Response::Ok),
            Ok(Released::Unimporting(id)) => wait!(Wait::Unimport { id }, None),
            Err(s) => Err(s),
        },
        Request::Stats => Ok(Response::Stats(rm.stats())),
        Request::OpenSession { node_id } => {
            if !may_manage_fabric(stream) {
                return error(
                    NvStatus::InsufficientPermissions,
                    "opening the IMEX session needs the fabric-imex-mgmt capability: only root \
                     or the user the driver runs as may; run the IMEX daemon as root",
                )
                .into();
            }
            // §1.2: one session system-wide, NV_ERR_IN_USE while a daemon holds it. A dead
            // daemon holds nothing: the kernel closes a dying process's descriptors before
            // anyone can reap it, and the close destroys its session (§4 "Daemon dies or
            // restarts"). Here its connection's thread learns of the hang-up on its own time,
            // so a successor started the moment its predecessor was reaped waits for that
            // teardown instead of being refused (it would exit: another daemon is running).
            let until = Instant::now() + PREDECESSOR_TEARDOWN;
            loop {
                match rm.open_session(client, node_id) {
                    Err(NvStatus::InUse)
                        if Instant::now() < until
                            && rm.session_client().is_some_and(|c| shared.hung_up(c)) =>
                    {
                        rm = shared.wait(rm, Some(until));
                    }
                    opened => break opened.map(|token| Response::Session { token }),
                }
            }
        }
        Request::GetEvents {
            token,
            max,
            wait_ms,
        } => {
            // Asking for no events is answered at once, as a poll whose wait is over.
            let until = match max {
                0 => Some(Instant::now()),
                _ => deadline(wait_ms),
            };
            wait!(Wait::Events { token, max }, until)
        }
        Request::DescribeExport {
            token,
            export_uuid,
            index,
            channel,
        } => rm
            .describe_export(token, &export_uuid, index, channel)
            .map(|(export_ref, pages)| Response::Described { export_ref, pages }),
        Request::ReleaseExportRef { token, export_ref } => rm
            .release_export_ref(token, export_ref)
            .map(|()| Response::Ok),
        Request::Validate {
            token,
            import_event_id,
            result,
        } => rm
            .validate(token, import_event_id, result)
            .map(|()| Response::Ok),
        Request::FinishUnimport {
            token,
            unimport_event_ids,
        } => rm
            .finish_unimport(token, &unimport_event_ids)
            .map(|()| Response::Ok),
        Request::DisableImporters { token, node } => {
            let done = rm.disable_importers(token, node).map(|()| Response::Ok);
            // Killed before the lock is let go, as a session teardown's are (`disconnect`):
            // after it, another connection's thread could answer a revoked client's call with
            // the torn-down state first, and the client exit on that error instead.
            shared.kill_revoked(rm.take_revoked());
            done
        }
        Request::FabricProbeInfo { gpu } => rm.probe_info(gpu).map(Response::FabricProbeInfo),
        Request::MapOnGpu { handle, gpu } => match rm.map_on_gpu(client, handle, gpu) {
            Ok(()) => Ok(Response::Ok),
            Err((status, detail)) => return error(status, detail).into(),
        },
        Request::CompleteFabricProbe { gpu, info } => {
            if !may_manage_fabric(stream) {
                return error(
                    NvStatus::InsufficientPermissions,
                    "completing a GPU's fabric probe is the Fabric Manager's: only root or the \
                     user the driver runs as may; run the Fabric Manager as root",
                )
                .into();
            }
            rm.complete_probe(gpu, info).map(|()| Response::Ok)
        }
        Request::Multicast(req) => {
            return Answer::Now(multicast::handle(shared, client, stream, req, rm));
        }
    };
    Answer::Now(result.unwrap_or_else(|s| error(s, s.to_string())))
}
