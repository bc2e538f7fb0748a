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
/// [`PrefixMatch::blocks_for`] scans the pods, or finds one in O(1) after
/// [`PrefixMatch::index_slots`].
#[derive(Clone, Debug, Default)]
pub struct PrefixMatch {
    pods: Vec<PodMatch>,
    chain_len: usize,
    probes: u32,
    /// By slot: 1 + the pod's position in `pods`, 0 if absent; built by
    /// `index_slots`. Grows to the largest slot seen; only entries of
    /// `pods` are ever non-zero, and only while `table_set`.
    at_slot: Vec<u32>,
    /// `at_slot` has entries for the current pods (reset clears them).
    table_set: bool,
    /// `at_slot` is up to date with `pods` (a push or a rank spoils it).
    indexed: bool,
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
            table_set: false,
            indexed: false,
        }
    }

    /// Clears the result for a new query of `chain_len` blocks, keeping capacity.
    #[inline]
    pub fn reset(&mut self, chain_len: usize) {
        if self.table_set {
            for m in &self.pods {
                if let Some(e) = self.at_slot.get_mut(m.pod.slot() as usize) {
                    *e = 0;
                }
            }
            self.table_set = false;
            self.indexed = false;
        }
        self.pods.clear();
        self.chain_len = chain_len;
        self.probes = 0;
    }

    /// Adds a pod's match. Matches of zero blocks are dropped.
    #[inline]
    pub fn push(&mut self, m: PodMatch) {
        if m.blocks > 0 {
            self.pods.push(m);
            self.indexed = false;
        }
    }

    /// Adds `pods`, each holding `blocks` leading blocks, in the order
    /// given (nothing for `blocks == 0`): the fast path for an index that
    /// finds pods in groups of one depth.
    #[inline]
    pub fn push_group(&mut self, blocks: u32, pods: impl ExactSizeIterator<Item = PodId>) {
        if blocks == 0 || pods.len() == 0 {
            return;
        }
        self.pods.extend(pods.map(|pod| PodMatch { pod, blocks }));
        self.indexed = false;
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
        self.indexed = false;
    }

    /// Shortens matches, for an index that refines another's answer (a
    /// hybrid model's other KV-cache groups): each pod's blocks become
    /// `limit(its match)` where that is less (0 drops the pod), and the
    /// pods are ranked again.
    pub fn limit(&mut self, mut limit: impl FnMut(PodMatch) -> u32) {
        if self.table_set {
            for m in &self.pods {
                if let Some(e) = self.at_slot.get_mut(m.pod.slot() as usize) {
                    *e = 0;
                }
            }
            self.table_set = false;
        }
        self.indexed = false;
        let mut changed = false;
        self.pods.retain_mut(|m| {
            let b = limit(*m).min(m.blocks);
            changed |= b != m.blocks;
            m.blocks = b;
            b > 0
        });
        if changed {
            self.rank();
        }
    }

    /// Builds the slot table that makes [`PrefixMatch::blocks_for`] O(1),
    /// for callers that look up many pods in one result. It costs a write
    /// per matched pod (and one more in the next reset), which queries
    /// that never look a pod up should not pay; it keeps its allocation
    /// across resets.
    pub fn index_slots(&mut self) {
        if self.table_set {
            // Stale entries of moved or earlier pods go first.
            for e in self.at_slot.iter_mut() {
                *e = 0;
            }
        }
        let top = self
            .pods
            .iter()
            .map(|m| m.pod.slot() as usize + 1)
            .max()
            .unwrap_or(0);
        if self.at_slot.len() < top {
            self.at_slot.resize(top, 0);
        }
        // Backwards, so a pod listed twice is found at its first entry.
        for (i, m) in self.pods.iter().enumerate().rev() {
            self.at_slot[m.pod.slot() as usize] = i as u32 + 1;
        }
        self.table_set = true;
        self.indexed = true;
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
        if !self.indexed {
            return self
                .pods
                .iter()
                .find(|m| m.pod == pod)
                .map_or(0, |m| m.blocks);
        }
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
            // Looked up with and without the table, and with a stale one.
            if round % 3 != 0 {
                m.index_slots();
            }
            if round % 7 == 0 {
                // Shortened after a table was built: dropped pods must not
                // linger in the table, and the order stays ranked.
                let before: Vec<PodMatch> = m.pods().to_vec();
                m.limit(|p| p.blocks / 2 + u32::from(p.pod.slot() % 3 == 0) * 9);
                assert!(m.pods().iter().all(|p| p.blocks > 0));
                assert_eq!(
                    m.pods().len(),
                    before
                        .iter()
                        .filter(|p| (p.blocks / 2 + u32::from(p.pod.slot() % 3 == 0) * 9)
                            .min(p.blocks)
                            > 0)
                        .count()
                );
                if before.iter().any(|p| p.pod.slot() % 3 != 0) {
                    assert!(m.pods().windows(2).all(|w| w[0].blocks >= w[1].blocks));
                }
                if round % 2 == 0 {
                    m.index_slots();
                }
            }
            if round % 5 == 0 {
                m.push(PodMatch {
                    pod: PodId::new(49, 2),
                    blocks: 1,
                });
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
