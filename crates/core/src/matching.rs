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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    pods: Vec<PodMatch>,
    chain_len: usize,
    probes: u32,
}

impl PrefixMatch {
    /// An empty result for a chain of `chain_len` blocks.
    pub fn new(chain_len: usize) -> Self {
        PrefixMatch {
            pods: Vec::new(),
            chain_len,
            probes: 0,
        }
    }

    /// Clears the result for a new query of `chain_len` blocks, keeping capacity.
    #[inline]
    pub fn reset(&mut self, chain_len: usize) {
        self.pods.clear();
        self.chain_len = chain_len;
        self.probes = 0;
    }

    /// Adds a pod's match. Matches of zero blocks are dropped.
    #[inline]
    pub fn push(&mut self, m: PodMatch) {
        if m.blocks > 0 {
            self.pods.push(m);
        }
    }

    /// Adds many pods' matches at once (zero-block matches are dropped).
    /// Indexes that produce pods already ranked append with this and skip
    /// [`PrefixMatch::rank`].
    #[inline]
    pub fn extend<I: IntoIterator<Item = PodMatch>>(&mut self, matches: I) {
        self.pods
            .extend(matches.into_iter().filter(|m| m.blocks > 0));
    }

    /// Sorts pods longest match first, ties by slot.
    pub fn rank(&mut self) {
        self.pods
            .sort_unstable_by(|a, b| b.blocks.cmp(&a.blocks).then(a.pod.cmp(&b.pod)));
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
        self.pods
            .iter()
            .find(|m| m.pod == pod)
            .map_or(0, |m| m.blocks)
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
