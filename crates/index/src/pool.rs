//! Storage that never moves: elements are addressed by a `u32` id and live
//! in chunks of doubling size, each allocated once and kept until the pool
//! drops. Readers that hold no lock can therefore keep a reference to any
//! element while a writer grows the pool: growth adds a chunk, it never
//! reallocates one. (This is what lets the shard table serve seqlock readers
//! in safe Rust without a reclamation scheme.)

use std::sync::OnceLock;

/// Enough chunks for `base << 40` elements.
const CHUNKS: usize = 40;

pub(crate) struct Pool<T> {
    chunks: Box<[OnceLock<Box<[T]>>]>,
    base_shift: u32,
}

impl<T> std::fmt::Debug for Pool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field(
                "chunks",
                &self.chunks.iter().filter(|c| c.get().is_some()).count(),
            )
            .finish()
    }
}

impl<T> Pool<T> {
    /// A pool whose first chunk holds `1 << base_shift` elements.
    pub(crate) fn new(base_shift: u32) -> Self {
        Pool {
            chunks: (0..CHUNKS).map(|_| OnceLock::new()).collect(),
            base_shift,
        }
    }

    /// Creates the first `n` chunks now. loom cannot see the `OnceLock`'s
    /// own synchronisation, so its models allocate up front and model the
    /// seqlock protocol alone.
    #[cfg(router_loom)]
    pub(crate) fn with_chunks(base_shift: u32, n: usize, make: impl Fn() -> T) -> Self {
        let pool = Self::new(base_shift);
        for c in 0..n.min(CHUNKS) {
            let first = ((1u64 << c) - 1) << base_shift;
            pool.ensure(first as u32, &make);
        }
        pool
    }

    /// Chunk `c` holds ids `base * (2^c - 1) .. base * (2^(c+1) - 1)`.
    #[inline]
    fn locate(&self, id: u32) -> (usize, usize) {
        let x = (id as u64 >> self.base_shift) + 1;
        let c = 63 - x.leading_zeros() as usize;
        let start = ((1u64 << c) - 1) << self.base_shift;
        (c, (id as u64 - start) as usize)
    }

    /// The element, if its chunk exists.
    #[inline]
    pub(crate) fn get(&self, id: u32) -> Option<&T> {
        let (c, o) = self.locate(id);
        self.chunks.get(c)?.get()?.get(o)
    }

    /// Makes sure the chunk holding `id` exists, creating its elements with
    /// `make`. Returns false only past the pool's last chunk.
    pub(crate) fn ensure(&self, id: u32, make: impl Fn() -> T) -> bool {
        let (c, _) = self.locate(id);
        match self.chunks.get(c) {
            Some(chunk) => {
                chunk.get_or_init(|| {
                    (0..1usize << (c as u32 + self.base_shift))
                        .map(|_| make())
                        .collect()
                });
                true
            }
            None => false,
        }
    }

    /// Bytes held by the allocated chunks.
    pub(crate) fn bytes(&self) -> usize {
        self.chunks
            .iter()
            .filter_map(|c| c.get())
            .map(|c| std::mem::size_of_val::<[T]>(c))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_map_to_distinct_elements_across_chunks() {
        let p: Pool<std::cell::Cell<u32>> = Pool::new(2);
        for id in 0..200u32 {
            assert!(p.ensure(id, || std::cell::Cell::new(u32::MAX)));
            p.get(id).unwrap().set(id);
        }
        for id in 0..200u32 {
            assert_eq!(p.get(id).unwrap().get(), id);
        }
        assert!(p.get(5000).is_none());
        // 4 + 8 + 16 + 32 + 64 + 128 elements cover ids 0..252.
        assert_eq!(p.bytes(), 252 * 4);
    }
}
