//! Arrays of atomic words that readers use without a lock.
//!
//! A shard's slot table and its slab of bitmaps are each one [`Lines`]:
//! cache-line-aligned groups of eight `AtomicU64`, published through one
//! tagged word (the array's address, with log2 of its line count in the
//! low six bits that the 64-byte alignment leaves free), so a reader gets
//! address and length from a single load and can never pair a new length
//! with an old array.
//!
//! Rules (the seqlock in `shard.rs` relies on them):
//! - only the shard's writer, holding the shard lock, replaces an array; a
//!   replaced array is retired, not freed: it is freed once no reader that
//!   could have loaded it is still pinned (crossbeam-epoch; under loom the
//!   writer keeps it until the shard drops, so models never free early);
//! - readers load the tag inside a pinned epoch ([`crate::sync::Guard`]),
//!   so an array they loaded outlives their reads;
//! - the writer reads through [`Lines::locked`], whose borrow of the
//!   writer's state keeps it from using an array after replacing it.
//!
//! The crate's only unsafe code is here; the loom models run readers
//! against writers that replace these arrays.
#![allow(unsafe_code)] // raw tagged pointers: see the SAFETY comments.

use crate::sync::{AtomicU64, AtomicUsize, Guard, Ordering};

/// Words per line.
pub(crate) const WORDS: usize = 8;

/// One cache line of atomic words.
#[repr(C, align(64))]
#[derive(Debug)]
pub(crate) struct Line(pub(crate) [AtomicU64; WORDS]);

impl Line {
    #[cfg(router_loom)]
    fn zeroed() -> Line {
        Line(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

const LOG_MASK: usize = 63;

/// Arrays retired by a writer under loom, kept until the shard drops.
#[derive(Debug, Default)]
pub(crate) struct Bin {
    #[cfg(router_loom)]
    kept: Vec<usize>,
}

impl Drop for Bin {
    fn drop(&mut self) {
        #[cfg(router_loom)]
        for &tag in &self.kept {
            free(tag);
        }
    }
}

/// A published array of lines (or none), owned through its tag.
#[derive(Debug, Default)]
pub(crate) struct Lines {
    tag: AtomicUsize,
}

/// A new zeroed array of `lines` lines (a power of two), as a tag.
fn alloc(lines: usize) -> usize {
    debug_assert!(lines.is_power_of_two());
    let b = zeroed_lines(lines);
    let ptr = Box::into_raw(b) as *mut Line as usize;
    debug_assert_eq!(ptr & LOG_MASK, 0, "lines are 64-byte aligned");
    ptr | lines.trailing_zeros() as usize
}

/// `n` zeroed lines from the allocator's zeroed memory (for a large array,
/// pages the kernel zeroes on first touch, as `vec![0; n]` gets).
#[cfg(not(router_loom))]
fn zeroed_lines(n: usize) -> Box<[Line]> {
    let layout = std::alloc::Layout::array::<Line>(n).expect("a shard's array fits in memory");
    // SAFETY: `n > 0` lines have a non-zero size; all-zero bytes are valid
    // `AtomicU64`s, so the memory is `n` initialised lines, owned by the
    // box (same layout as `Box<[Line]>` allocates and frees).
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout) as *mut Line;
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, n))
    }
}

/// Under loom the atomics must be made by loom.
#[cfg(router_loom)]
fn zeroed_lines(n: usize) -> Box<[Line]> {
    (0..n).map(|_| Line::zeroed()).collect()
}

/// The array a non-zero tag names.
///
/// # Safety
/// The array must be live for `'a`: published and not retired, or retired
/// while a guard that was pinned before the retirement is still held.
unsafe fn view<'a>(tag: usize) -> &'a [Line] {
    let ptr = (tag & !LOG_MASK) as *const Line;
    let len = 1usize << (tag & LOG_MASK);
    // SAFETY: `alloc` made `len` initialised lines at `ptr`, and the
    // caller guarantees they are not freed yet. Only shared references are
    // ever made, and every word is an atomic, so concurrent writers are
    // fine.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

fn free(tag: usize) {
    if tag == 0 {
        return;
    }
    let ptr = (tag & !LOG_MASK) as *mut Line;
    let len = 1usize << (tag & LOG_MASK);
    // SAFETY: the tag came from `alloc` with this length, and callers free
    // a tag once: on drop of its owner, or once retired and unreachable.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) });
}

impl Lines {
    /// The array for a reader (empty if none).
    #[inline]
    pub(crate) fn load<'g>(&self, _guard: &'g Guard) -> &'g [Line] {
        match self.tag.load(Ordering::Acquire) {
            0 => &[],
            // SAFETY: the tag was published when loaded, and `_guard` was
            // pinned before this load, so a retirement after it waits for
            // the guard's release (`retire` defers the free past every
            // guard pinned at the time).
            tag => unsafe { view(tag) },
        }
    }

    /// The array for the writer, who holds the shard lock: `bin` is the
    /// writer's state behind that lock, and borrowing it keeps the slice
    /// from outliving a later [`Lines::replace`].
    #[inline]
    pub(crate) fn locked<'a>(&'a self, _bin: &'a Bin) -> &'a [Line] {
        match self.tag.load(Ordering::Relaxed) {
            0 => &[],
            // SAFETY: only the lock holder replaces the array, and the
            // borrow of its `Bin` ends before it can call `replace`.
            tag => unsafe { view(tag) },
        }
    }

    /// A new zeroed array of `lines` lines, filled by `fill` before any
    /// reader can see it, then published in place of the old one, which is
    /// retired.
    pub(crate) fn replace(&self, bin: &mut Bin, lines: usize, fill: impl FnOnce(&[Line], &[Line])) {
        let new = alloc(lines);
        // SAFETY: `new` was just allocated and is not yet published.
        let fresh = unsafe { view(new) };
        fill(self.locked(bin), fresh);
        // A load and a `Release` store, not a swap: only the lock holder
        // writes the tag, and a locked swap would wait for every store that
        // filled the new array to reach memory.
        let old = self.tag.load(Ordering::Relaxed);
        self.tag.store(new, Ordering::Release);
        retire(bin, old);
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        // Dropping is exclusive (`&mut self`): no reader is left.
        free(self.tag.load(Ordering::Relaxed));
    }
}

#[cfg(not(router_loom))]
fn retire(_bin: &mut Bin, old: usize) {
    if old == 0 {
        return;
    }
    /// The tag, sent to whichever thread runs the deferred free.
    struct Retired(usize);
    let retired = Retired(old);
    let guard = crossbeam_epoch::pin();
    // SAFETY: the array is unpublished (swapped out above), so only readers
    // pinned before the swap can hold it, and the free runs after all of
    // them unpin. Nothing else frees the tag.
    unsafe {
        guard.defer_unchecked(move || {
            let Retired(tag) = retired;
            free(tag);
        });
    }
    // Retirements are rare (a shard's array doubles) and large: hand this
    // one to the global queue now, so it is freed at the next collection
    // rather than waiting in this thread's bag for 63 more.
    guard.flush();
}

#[cfg(router_loom)]
fn retire(bin: &mut Bin, old: usize) {
    if old != 0 {
        bin.kept.push(old);
    }
}

/// Asks the CPU to bring the line at `p` into cache: a hint that reads
/// nothing the program can see, so it is sound whatever `p` points at.
/// A no-op off x86-64 and under loom.
#[inline(always)]
pub(crate) fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(router_loom)))]
    // SAFETY: a prefetch never faults and has no effect on memory; SSE is
    // part of the x86-64 baseline.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
    #[cfg(not(all(target_arch = "x86_64", not(router_loom))))]
    let _ = p;
}

impl Lines {
    /// Prefetches the line `at(lines)` names in the array published now,
    /// given its length in lines, for a read that will follow: one load
    /// of the tag, and no access to the array itself.
    #[inline]
    pub(crate) fn prefetch_line(&self, at: impl FnOnce(usize) -> usize) {
        // Under loom, an extra load of the tag would change the models'
        // interleavings for nothing.
        #[cfg(router_loom)]
        let tag = {
            let _ = at;
            0
        };
        #[cfg(not(router_loom))]
        let tag = self.tag.load(Ordering::Relaxed);
        if tag != 0 {
            let len = 1usize << (tag & LOG_MASK);
            let base = (tag & !LOG_MASK) as *const Line;
            prefetch(base.wrapping_add(at(len) & (len - 1)));
        }
    }
}

/// Word `i` of an array (a slice of lines seen as a slice of words), or
/// `None` past its end.
#[inline]
pub(crate) fn word(lines: &[Line], i: usize) -> Option<&AtomicU64> {
    lines.get(i / WORDS).map(|l| &l.0[i % WORDS])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_array_keeps_what_fill_copied() {
        let lines = Lines::default();
        let mut bin = Bin::default();
        assert!(lines.locked(&bin).is_empty());
        lines.replace(&mut bin, 2, |old, new| {
            assert!(old.is_empty());
            word(new, 9).unwrap().store(42, Ordering::Relaxed);
        });
        lines.replace(&mut bin, 4, |old, new| {
            assert_eq!(old.len(), 2);
            for i in 0..old.len() * WORDS {
                let v = word(old, i).unwrap().load(Ordering::Relaxed);
                word(new, i).unwrap().store(v, Ordering::Relaxed);
            }
        });
        let guard = crate::sync::pin();
        let seen = lines.load(&guard);
        assert_eq!(seen.len(), 4);
        assert_eq!(word(seen, 9).unwrap().load(Ordering::Relaxed), 42);
        assert!(word(seen, 4 * WORDS).is_none());
    }
}
