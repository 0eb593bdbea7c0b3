//! The driver protocol's framing allocates nothing per message: a thread encodes into and
//! reads into buffers it keeps, so a call costs only what its message's own fields need
//! (the import path crosses this framing several times on each node, issue: no per-import
//! allocations on hot paths).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use openimex_simproto::proto::{recv, recv_within, send};
use serde::{Deserialize, Serialize};

/// Counts this thread's allocations (other test threads run in parallel).
struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only a
// const-initialised thread-local, which never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// A message with no heap fields: whatever a round trip allocates is the framing's.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Tick {
    seq: u64,
    wait_ms: u32,
    done: bool,
}

#[test]
fn a_message_round_trip_allocates_nothing_once_the_thread_is_warm() {
    let (a, b) = UnixStream::pair().expect("socket pair");
    let round_trip = |seq| {
        let tick = Tick {
            seq,
            wait_ms: 7,
            done: seq % 2 == 0,
        };
        send(&a, &tick, &[]).expect("send");
        let (got, fds) = recv::<Tick>(&b).expect("recv");
        assert_eq!(got, tick);
        assert!(fds.is_empty());
        send(&b, &got, &[]).expect("answer");
        let (back, _) = recv_within::<Tick>(&a, None).expect("answer back");
        assert_eq!(back, tick);
    };
    // The first call makes the thread's buffers.
    round_trip(0);
    let before = allocs();
    for seq in 1..=200 {
        round_trip(seq);
    }
    assert_eq!(
        allocs() - before,
        0,
        "200 round trips of a message with no heap fields allocated"
    );
}

#[test]
fn descriptors_still_arrive_and_a_large_message_crosses_and_small_ones_stay_free() {
    let (a, b) = UnixStream::pair().expect("socket pair");
    // A descriptor rides on the reused control-message space.
    let (x, _y) = UnixStream::pair().expect("second pair");
    send(
        &a,
        &Tick {
            seq: 1,
            wait_ms: 0,
            done: true,
        },
        &[x.as_raw_fd()],
    )
    .expect("send");
    let (_, fds) = recv::<Tick>(&b).expect("recv");
    assert_eq!(fds.len(), 1, "the descriptor came with the message");
    // A message far above the kept size crosses intact (read on another thread, as the
    // socket buffer is smaller than the message).
    let big = vec![7u64; 100_000];
    let reader = std::thread::spawn(move || recv::<Vec<u64>>(&b).map(|(v, _)| v));
    send(&a, &big, &[]).expect("send big");
    let got = reader.join().expect("reader").expect("recv big");
    assert_eq!(got, big);
    // And small messages after it still cost nothing.
    let (c, d) = UnixStream::pair().expect("third pair");
    send(
        &c,
        &Tick {
            seq: 2,
            wait_ms: 0,
            done: false,
        },
        &[],
    )
    .expect("warm");
    recv::<Tick>(&d).expect("warm");
    let before = allocs();
    send(
        &c,
        &Tick {
            seq: 3,
            wait_ms: 0,
            done: false,
        },
        &[],
    )
    .expect("send");
    recv::<Tick>(&d).expect("recv");
    assert_eq!(allocs() - before, 0);
}
