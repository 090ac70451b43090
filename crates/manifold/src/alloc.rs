//! With the `alloc-stats` feature, the process allocator counts live bytes
//! and their high-water mark, so `bench listing` can measure memory through
//! the allocator rather than RSS (which the allocator may not return
//! promptly). Two relaxed atomic updates per allocation. Without the feature
//! (the gateway as shipped) the system allocator is untouched and the
//! figures read zero; [`ENABLED`] says which.
//!
//! mimalloc was tried in its place: less CPU a call in
//! `bench call`, but the restart burst's peak RSS reached the 256 MiB the
//! README promises (242–256 MiB), so the system allocator stays.

#[cfg(feature = "alloc-stats")]
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

#[cfg(feature = "alloc-stats")]
pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Whether the counting allocator is installed in this build.
pub const ENABLED: bool = cfg!(feature = "alloc-stats");

#[cfg(feature = "alloc-stats")]
#[global_allocator]
static GLOBAL: Counting = Counting;

#[cfg(feature = "alloc-stats")]
// SAFETY: every call is forwarded to `System` unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
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
