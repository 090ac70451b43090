//! The bench's allocator is mimalloc, as the gateway's is (its `main.rs`
//! says why), so in-process figures are taken with the same allocator.
//!
//! With the `alloc-stats` feature, the allocator also counts live bytes and
//! their high-water mark, so `manifold-bench listing` can measure memory
//! through the allocator rather than RSS (which the allocator may not return
//! promptly). Two relaxed atomic updates per allocation. Without the feature
//! nothing is counted and the figures read zero; [`ENABLED`] says which.

#[cfg(feature = "alloc-stats")]
use mimalloc::MiMalloc as Inner;
#[cfg(feature = "alloc-stats")]
use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

#[cfg(feature = "alloc-stats")]
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Whether the counting allocator is installed in this build.
pub const ENABLED: bool = cfg!(feature = "alloc-stats");

#[cfg(not(feature = "alloc-stats"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(feature = "alloc-stats")]
#[global_allocator]
static GLOBAL: Counting = Counting;

#[cfg(feature = "alloc-stats")]
// SAFETY: every call is forwarded to mimalloc unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { Inner.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { Inner.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { Inner.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { Inner.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        new
    }
}

#[cfg(feature = "alloc-stats")]
fn grew(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

/// Bytes allocated and not yet freed.
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// The high-water mark since the last [`reset_peak`].
pub fn peak_bytes() -> usize {
    PEAK.load(Ordering::Relaxed)
}

pub fn reset_peak() {
    PEAK.store(live_bytes(), Ordering::Relaxed);
}
