//! Fixed-width pod bitmaps.

use std::fmt;

/// One bit per pod slot: `W` words of 64 bits, so `W * 64` pods.
///
/// The default, 4 words, covers 256 pods in 32 bytes. Membership is a bit
/// test, intersection an AND, counting a popcount.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostBitmap<const W: usize = 4>([u64; W]);

impl<const W: usize> Default for HostBitmap<W> {
    fn default() -> Self {
        Self::EMPTY
    }
}

impl<const W: usize> fmt::Debug for HostBitmap<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl<const W: usize> HostBitmap<W> {
    /// The number of pods a bitmap can hold.
    pub const CAPACITY: usize = W * 64;

    /// No pods.
    pub const EMPTY: Self = HostBitmap([0; W]);

    /// The bitmap of these words (bit `i` of word `w` is slot `64 * w + i`).
    pub const fn from_words(words: [u64; W]) -> Self {
        HostBitmap(words)
    }

    /// The words.
    pub const fn words(&self) -> &[u64; W] {
        &self.0
    }

    /// The bitmap with only `slot` set. Slots beyond the capacity give an
    /// empty bitmap.
    pub fn single(slot: usize) -> Self {
        let mut b = Self::EMPTY;
        b.insert(slot);
        b
    }

    /// Sets `slot`; returns whether it was unset. Out-of-range slots are ignored.
    pub fn insert(&mut self, slot: usize) -> bool {
        match self.0.get_mut(slot / 64) {
            Some(w) => {
                let bit = 1u64 << (slot % 64);
                let was = *w & bit != 0;
                *w |= bit;
                !was
            }
            None => false,
        }
    }

    /// Clears `slot`; returns whether it was set.
    pub fn remove(&mut self, slot: usize) -> bool {
        match self.0.get_mut(slot / 64) {
            Some(w) => {
                let bit = 1u64 << (slot % 64);
                let was = *w & bit != 0;
                *w &= !bit;
                was
            }
            None => false,
        }
    }

    /// Whether `slot` is set.
    pub fn contains(&self, slot: usize) -> bool {
        self.0
            .get(slot / 64)
            .is_some_and(|w| w & (1u64 << (slot % 64)) != 0)
    }

    /// Pods in both.
    #[inline(always)]
    pub fn and(&self, other: &Self) -> Self {
        let mut out = *self;
        for (a, b) in out.0.iter_mut().zip(other.0.iter()) {
            *a &= b;
        }
        out
    }

    /// Pods in `self` but not in `other`.
    #[inline(always)]
    pub fn and_not(&self, other: &Self) -> Self {
        let mut out = *self;
        for (a, b) in out.0.iter_mut().zip(other.0.iter()) {
            *a &= !b;
        }
        out
    }

    /// Pods in either.
    #[inline]
    pub fn or(&self, other: &Self) -> Self {
        let mut out = *self;
        for (a, b) in out.0.iter_mut().zip(other.0.iter()) {
            *a |= b;
        }
        out
    }

    /// The number of pods set.
    #[inline]
    pub fn count(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }

    /// The one slot set, if exactly one is.
    ///
    /// ```
    /// use router_index::HostBitmap;
    /// assert_eq!(HostBitmap::<2>::single(70).only(), Some(70));
    /// assert_eq!(HostBitmap::<2>::EMPTY.only(), None);
    /// assert_eq!([3, 70].into_iter().collect::<HostBitmap<2>>().only(), None);
    /// ```
    #[inline]
    pub fn only(&self) -> Option<usize> {
        let mut found = None;
        for (i, &w) in self.0.iter().enumerate() {
            if w != 0 {
                if found.is_some() || w & (w - 1) != 0 {
                    return None;
                }
                found = Some(i * 64 + w.trailing_zeros() as usize);
            }
        }
        found
    }

    /// Whether no pod is set.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    /// The set slots, ascending.
    #[inline]
    pub fn iter(&self) -> Ones<W> {
        Ones {
            words: self.0,
            word: 0,
            cur: self.0.first().copied().unwrap_or(0),
        }
    }
}

/// Iterator over the set slots of a [`HostBitmap`], ascending.
///
/// The word being drained is kept apart from the array, so the inner loop
/// runs in registers.
#[derive(Debug, Clone)]
pub struct Ones<const W: usize> {
    words: [u64; W],
    word: usize,
    cur: u64,
}

impl<const W: usize> Iterator for Ones<W> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        loop {
            if self.cur != 0 {
                let bit = self.cur.trailing_zeros() as usize;
                self.cur &= self.cur - 1;
                return Some(self.word * 64 + bit);
            }
            if self.word + 1 >= W {
                return None;
            }
            self.word += 1;
            self.cur = self.words[self.word];
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let later: usize = self
            .words
            .iter()
            .skip(self.word + 1)
            .map(|w| w.count_ones() as usize)
            .sum();
        let n = later + self.cur.count_ones() as usize;
        (n, Some(n))
    }
}

impl<const W: usize> ExactSizeIterator for Ones<W> {}

impl<const W: usize> FromIterator<usize> for HostBitmap<W> {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut b = Self::EMPTY;
        for s in iter {
            b.insert(s);
        }
        b
    }
}
