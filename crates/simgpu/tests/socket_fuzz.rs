//! Hostile input on the driver's socket (issue 10, item 5): random bytes, frames with random
//! bodies, valid requests with bytes flipped, frames whose length lies (truncated, oversized,
//! beyond the protocol's limit), and well-formed requests with random field values, with
//! descriptors attached to any byte, each on a connection of its own that then closes. The driver must answer only with well-formed
//! response frames, close the connection once the client is gone (no hang), never crash, and
//! afterwards serve a well-behaved client with nothing left over from the hostile ones (no
//! allocation, no session, no descriptor).
//!
//! The case budget is fixed ([`CASES`]); `PROPTEST_CASES` overrides it for a longer run.

use std::cell::Cell;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use openimex_harness::ScratchDir;
mod common;

use common::config;
use openimex_simgpu::server::Server;
use openimex_simgpu::testing::case_budget;
use openimex_simproto::node_dir::channel_path;
use openimex_simproto::proto::{self, MAX_MESSAGE, PAGE_SIZE, Request, Response};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Cases per run in CI.
const CASES: u32 = 2_000;

/// A generous bound on the driver closing a connection its client has closed.
const HANG: Duration = Duration::from_secs(20);

/// Well-formed requests with any field values (wrong tokens, handles, sizes, GPUs, counts).
fn requests() -> impl Strategy<Value = Request> {
    let hex = proptest::collection::vec(any::<u8>(), 0..80)
        .prop_map(|b| b.iter().map(|x| format!("{x:02x}")).collect::<String>());
    prop_oneof![
        any::<u32>().prop_map(|pid| Request::Hello { pid }),
        Just(Request::SubscribeChannel),
        (any::<u32>(), any::<u64>()).prop_map(|(gpu, size)| Request::Create { gpu, size }),
        (0u32..4, 1u64..(8 * PAGE_SIZE)).prop_map(|(gpu, size)| Request::Create { gpu, size }),
        any::<u64>().prop_map(|mem| Request::Export { mem }),
        (hex.clone(), any::<u64>(), prop_oneof![Just(0u64), 0u64..50]).prop_map(
            |(handle, import_id, wait_ms)| Request::Import {
                handle,
                import_id,
                wait_ms,
            }
        ),
        (any::<u64>(), 0u64..50)
            .prop_map(|(import, timeout_ms)| Request::WaitImport { import, timeout_ms }),
        any::<u64>().prop_map(|handle| Request::Release { handle }),
        Just(Request::Stats),
        any::<u16>().prop_map(|node_id| Request::OpenSession { node_id }),
        (any::<u64>(), any::<usize>(), 0u64..50).prop_map(|(token, max, wait_ms)| {
            Request::GetEvents {
                token,
                max,
                wait_ms,
            }
        }),
        (any::<u64>(), hex, any::<u16>(), any::<u32>()).prop_map(
            |(token, export_uuid, index, channel)| Request::DescribeExport {
                token,
                export_uuid,
                index,
                channel
            }
        ),
        (any::<u64>(), any::<u64>())
            .prop_map(|(token, export_ref)| Request::ReleaseExportRef { token, export_ref }),
        (
            any::<u64>(),
            proptest::collection::vec(any::<u64>(), 0..300)
        )
            .prop_map(|(token, unimport_event_ids)| Request::FinishUnimport {
                token,
                unimport_event_ids
            }),
        (any::<u64>(), any::<u16>())
            .prop_map(|(token, node)| Request::DisableImporters { token, node }),
    ]
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = u32::try_from(body.len())
        .unwrap_or(u32::MAX)
        .to_be_bytes()
        .to_vec();
    f.extend_from_slice(body);
    f
}

fn json(r: &Request) -> Vec<u8> {
    serde_json::to_vec(r).expect("a request serialises")
}

/// What one hostile client writes before it closes its side.
fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..512);
    let random = bytes();
    let random_body = bytes().prop_map(|b| frame(&b));
    let well_formed = proptest::collection::vec(requests(), 1..4)
        .prop_map(|rs| rs.iter().flat_map(|r| frame(&json(r))).collect());
    let flipped = (
        requests(),
        proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
    )
        .prop_map(|(r, flips)| {
            let mut body = json(&r);
            for (at, x) in flips {
                let i = at.index(body.len());
                body[i] ^= x;
            }
            frame(&body)
        });
    // The length says one thing, the bytes another: short (the client closes mid-frame),
    // long (the rest is read as the next frame), or over the protocol's limit.
    let lying = (
        requests(),
        prop_oneof![
            0u32..64,
            any::<u32>(),
            Just(u32::try_from(MAX_MESSAGE + 1).unwrap_or(u32::MAX)),
            Just(u32::MAX)
        ],
        bytes(),
    )
        .prop_map(|(r, len, tail)| {
            let mut f = len.to_be_bytes().to_vec();
            f.extend(json(&r));
            f.extend(tail);
            f
        });
    prop_oneof![random, random_body, well_formed, flipped, lying]
}

/// Checks that `out` is a sequence of whole response frames.
fn responses_are_well_formed(mut out: &[u8]) -> Result<usize, TestCaseError> {
    let mut n = 0;
    while !out.is_empty() {
        prop_assert!(out.len() >= 4, "a cut frame header: {out:?}");
        let len = u32::from_be_bytes([out[0], out[1], out[2], out[3]]) as usize;
        prop_assert!(out.len() >= 4 + len, "a cut frame of {len} bytes");
        let parsed = serde_json::from_slice::<Response>(&out[4..4 + len]);
        prop_assert!(parsed.is_ok(), "not a response: {parsed:?}");
        out = &out[4 + len..];
        n += 1;
    }
    Ok(n)
}

/// One hostile client: connects, writes (the first `split` bytes in one message carrying
/// `fds`, the rest after), closes its side, reads until the driver closes.
fn hostile(
    socket: &std::path::Path,
    bytes: &[u8],
    split: usize,
    fds: &[RawFd],
) -> Result<usize, TestCaseError> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let s = UnixStream::connect(socket)
        .map_err(|e| TestCaseError::fail(format!("the driver stopped accepting: {e}")))?;
    s.set_read_timeout(Some(HANG)).map_err(fail)?;
    // The driver may close first (e.g. after an oversized header): a failed write is fine.
    let (head, tail) = bytes.split_at(split.min(bytes.len()));
    if !head.is_empty() {
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
        let iov = [std::io::IoSlice::new(head)];
        let sent = sendmsg::<()>(s.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None).unwrap_or(0);
        let _ = (&s).write_all(&head[sent.min(head.len())..]);
    }
    let _ = (&s).write_all(tail);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let started = Instant::now();
    let mut out = Vec::new();
    match (&s).read_to_end(&mut out) {
        Ok(_) => {}
        // Closed with unread input of ours: a reset, not a hang.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => {
            return Err(TestCaseError::fail(format!(
                "no close after {:?}: {e}",
                started.elapsed()
            )));
        }
    }
    responses_are_well_formed(&out)
}

/// Descriptors open in this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// How many open descriptors point at what (for a failure message).
fn fd_kinds() -> std::collections::BTreeMap<String, usize> {
    let mut kinds = std::collections::BTreeMap::new();
    for e in std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
    {
        let target = std::fs::read_link(e.path()).map_or("?".into(), |t| {
            let t = t.display().to_string();
            t.split(':').next().unwrap_or_default().to_owned()
        });
        *kinds.entry(target).or_insert(0) += 1;
    }
    kinds
}

fn fail(e: impl std::fmt::Display) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

#[test]
fn hostile_messages_never_stop_the_driver_serving() {
    let dir = ScratchDir::new("simgpu-fuzz").expect("scratch dir");
    let config = config(dir.path(), 0);
    let server = Server::bind(&config).expect("bind").spawn().expect("spawn");
    let socket = server.socket_path().to_path_buf();

    let cases = case_budget(CASES);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    // Descriptors ride along: a channel's, one that is no channel, several, on any byte.
    let channel = File::open(channel_path(&config.node_dir, 0)).expect("channel file");
    let null = File::open("/dev/null").expect("/dev/null");
    let pool = [channel.as_raw_fd(), null.as_raw_fd()];
    let fds_before = open_fds();
    let answered = Cell::new(0usize);
    let strategy = (
        hostile_bytes(),
        any::<prop::sample::Index>(),
        proptest::collection::vec(0usize..2, 0..8),
    );
    let result = runner.run(&strategy, |(bytes, split, picks)| {
        let fds: Vec<RawFd> = picks.iter().map(|&i| pool[i]).collect();
        let n = hostile(&socket, &bytes, split.index(bytes.len() + 1), &fds)?;
        answered.set(answered.get() + n);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(answered.get() > 0, "the driver answered nothing");

    // Every hostile client is gone and took what it made with it.
    let deadline = Instant::now() + HANG;
    while server.stats().clients > 0 {
        assert!(Instant::now() < deadline, "{:?}", server.stats());
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = server.stats();
    assert_eq!(
        (s.allocations, s.exports, s.hbm_used, s.session),
        (0, 0, 0, false),
        "{s:?}"
    );
    // No descriptor passed in (or its connection) is kept (the driver runs in this process).
    let deadline = Instant::now() + HANG;
    while open_fds() > fds_before {
        assert!(
            Instant::now() < deadline,
            "{} descriptors open, {fds_before} before: {:?}",
            open_fds(),
            fd_kinds()
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    // A well-behaved client is served as before.
    let conn = UnixStream::connect(&socket).expect("connect");
    conn.set_read_timeout(Some(HANG)).expect("timeout");
    let ch = File::open(channel_path(&config.node_dir, 0)).expect("channel file");
    let r = proto::call(&conn, &Request::SubscribeChannel, &[ch.as_raw_fd()]).expect("call");
    assert_eq!(r, Response::Subscribed { channel: 0 });
    let r = proto::call(
        &conn,
        &Request::Create {
            gpu: 0,
            size: PAGE_SIZE,
        },
        &[],
    )
    .expect("call");
    let Response::Created { mem, .. } = r else {
        panic!("create answered {r:?}");
    };
    let r = proto::call(&conn, &Request::Export { mem }, &[]).expect("call");
    assert!(matches!(r, Response::Exported { .. }), "{r:?}");
    assert_eq!(server.stats().exports, 1);
    drop(conn);
    server.stop();
}
