use crate::PodId;

/// How many leading blocks of a chain one pod holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PodMatch {
    /// The pod.
    pub pod: PodId,
    /// The number of leading blocks of the queried chain it holds (at least 1).
    pub blocks: u32,
}

/// The answer to "which live pods hold a prefix of this chain, and how long".
///
/// Pods holding nothing of the chain are absent. After [`PrefixMatch::rank`]
/// (which every [`crate::PrefixIndex`] does before returning) pods are sorted
/// by matched blocks, longest first, ties by slot. The value is meant to be
/// reused across queries: [`PrefixMatch::reset`] keeps its allocation.
/// [`PrefixMatch::blocks_for`] finds a pod in O(1).
#[derive(Clone, Debug, Default)]
pub struct PrefixMatch {
    pods: Vec<PodMatch>,
    chain_len: usize,
    probes: u32,
    /// By slot: 1 + the pod's position in `pods`, 0 if absent. Grows to the
    /// largest slot seen; only the entries of `pods` are ever non-zero.
    at_slot: Vec<u32>,
}

/// Equal pods, chain length and probes (the slot table is bookkeeping).
impl PartialEq for PrefixMatch {
    fn eq(&self, other: &Self) -> bool {
        self.pods == other.pods && self.chain_len == other.chain_len && self.probes == other.probes
    }
}

impl Eq for PrefixMatch {}

impl PrefixMatch {
    /// An empty result for a chain of `chain_len` blocks.
    pub fn new(chain_len: usize) -> Self {
        PrefixMatch {
            pods: Vec::new(),
            chain_len,
            probes: 0,
            at_slot: Vec::new(),
        }
    }

    /// Clears the result for a new query of `chain_len` blocks, keeping capacity.
    #[inline]
    pub fn reset(&mut self, chain_len: usize) {
        for m in &self.pods {
            self.at_slot[m.pod.slot() as usize] = 0;
        }
        self.pods.clear();
        self.chain_len = chain_len;
        self.probes = 0;
    }

    /// Adds a pod's match. Matches of zero blocks are dropped.
    #[inline]
    pub fn push(&mut self, m: PodMatch) {
        if m.blocks > 0 {
            let s = m.pod.slot() as usize;
            if s >= self.at_slot.len() {
                self.at_slot.resize(s + 1, 0);
            }
            self.pods.push(m);
            // A pod pushed twice is found at its first entry.
            if self.at_slot[s] == 0 {
                self.at_slot[s] = self.pods.len() as u32;
            }
        }
    }

    /// Adds many pods' matches at once (zero-block matches are dropped).
    /// Indexes that produce pods already ranked append with this and skip
    /// [`PrefixMatch::rank`].
    #[inline]
    pub fn extend<I: IntoIterator<Item = PodMatch>>(&mut self, matches: I) {
        for m in matches {
            self.push(m);
        }
    }

    /// Sorts pods longest match first, ties by slot.
    pub fn rank(&mut self) {
        self.pods
            .sort_unstable_by(|a, b| b.blocks.cmp(&a.blocks).then(a.pod.cmp(&b.pod)));
        // Backwards, so a pod pushed twice is found at its first entry.
        for (i, m) in self.pods.iter().enumerate().rev() {
            self.at_slot[m.pod.slot() as usize] = i as u32 + 1;
        }
    }

    /// Records `n` more index probes spent on this query.
    #[inline]
    pub fn add_probes(&mut self, n: u32) {
        self.probes = self.probes.saturating_add(n);
    }

    /// The pods with their matched blocks, ranked.
    #[inline]
    pub fn pods(&self) -> &[PodMatch] {
        &self.pods
    }

    /// The pod with the longest match, if any pod matched.
    #[inline]
    pub fn best(&self) -> Option<PodMatch> {
        self.pods.first().copied()
    }

    /// The blocks matched by `pod`, 0 when it holds none of the chain.
    #[inline]
    pub fn blocks_for(&self, pod: PodId) -> u32 {
        let at = self.at_slot.get(pod.slot() as usize).copied().unwrap_or(0);
        match at.checked_sub(1).and_then(|i| self.pods.get(i as usize)) {
            // The slot's entry, if it is this pod's epoch.
            Some(m) if m.pod == pod => m.blocks,
            None => 0,
            // Another epoch of the slot is listed first: look further.
            Some(_) => self
                .pods
                .iter()
                .find(|m| m.pod == pod)
                .map_or(0, |m| m.blocks),
        }
    }

    /// The length of the queried chain.
    #[inline]
    pub fn chain_len(&self) -> usize {
        self.chain_len
    }

    /// The index probes the query spent (0 if the index does not count).
    #[inline]
    pub fn probes(&self) -> u32 {
        self.probes
    }

    /// True when no pod holds even the first block.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic stream for the model test below.
    fn next(x: &mut u64) -> u64 {
        *x = x.wrapping_add(crate::GOLDEN_GAMMA);
        crate::mix64(*x)
    }

    #[test]
    fn slot_lookup_agrees_with_a_linear_search_across_reuse() {
        let mut m = PrefixMatch::new(0);
        let mut x = 7;
        for round in 0..2000 {
            m.reset(64);
            let n = next(&mut x) % 40;
            for _ in 0..n {
                // Few slots and two epochs: duplicates and reused slots.
                let pod = PodId::new((next(&mut x) % 48) as u16, (next(&mut x) % 2) as u32);
                m.push(PodMatch {
                    pod,
                    blocks: (next(&mut x) % 5) as u32,
                });
            }
            if round % 2 == 0 {
                m.rank();
            }
            for slot in 0..50u16 {
                for epoch in 0..3 {
                    let pod = PodId::new(slot, epoch);
                    let linear = m
                        .pods()
                        .iter()
                        .find(|p| p.pod == pod)
                        .map_or(0, |p| p.blocks);
                    assert_eq!(m.blocks_for(pod), linear, "round {round}, {pod:?}");
                }
            }
        }
    }
}
