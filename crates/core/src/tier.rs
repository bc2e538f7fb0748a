use std::fmt;
use std::ops::{Index, IndexMut};

/// Where a cached block lives on a pod, fastest first.
///
/// Engines name their media differently (vLLM: `GPU`, `CPU`, `STORAGE`;
/// SGLang: `GPU`, `CPU_PINNED`, `DISK`, `EXTERNAL`); event decoders map them
/// onto these four.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default)]
#[repr(u8)]
pub enum Tier {
    /// Device (HBM) memory: a hit costs nothing.
    #[default]
    Gpu = 0,
    /// Host memory: a hit costs a PCIe transfer.
    Cpu = 1,
    /// Local disk or SSD.
    Disk = 2,
    /// A remote or shared store (for example LMCache or Mooncake Store).
    Remote = 3,
}

impl Tier {
    /// All tiers, fastest first.
    pub const ALL: [Tier; 4] = [Tier::Gpu, Tier::Cpu, Tier::Disk, Tier::Remote];

    /// A dense index in `0..4`, fastest first.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The tier's conventional upper-case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Tier::Gpu => "GPU",
            Tier::Cpu => "CPU",
            Tier::Disk => "DISK",
            Tier::Remote => "REMOTE",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A count of blocks per tier.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct TierCounts(pub [u32; 4]);

impl TierCounts {
    /// The sum over all tiers.
    pub fn total(&self) -> u32 {
        self.0.iter().sum()
    }
}

impl Index<Tier> for TierCounts {
    type Output = u32;
    fn index(&self, tier: Tier) -> &u32 {
        &self.0[tier.index()]
    }
}

impl IndexMut<Tier> for TierCounts {
    fn index_mut(&mut self, tier: Tier) -> &mut u32 {
        &mut self.0[tier.index()]
    }
}
