//! Heap allocations counted: the allocator the lab binary installs ([`Counting`]), and the
//! count its daemons report in their metrics (`openimex_heap_allocations_total`; the
//! production binary counts nothing). Allocations per import are a figure of the bench
//! (`import_allocs`): the import path is meant to allocate as little as its messages need, and
//! a count read from outside keeps that honest.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// Allocations (and reallocations) made through [`Counting`] since the process started.
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// The system allocator, counting each allocation and reallocation: one relaxed increment,
/// next to the allocator's own tens of nanoseconds.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; counting is an atomic
// increment, which neither allocates nor touches the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations so far, or `None` when [`Counting`] is not this process's allocator (nothing
/// was counted: every process allocates before it could ask).
pub(crate) fn allocations() -> Option<u64> {
    match ALLOCATIONS.load(Ordering::Relaxed) {
        0 => None,
        n => Some(n),
    }
}
