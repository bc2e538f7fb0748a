//! KV-cache groups of hybrid models and the engine's hit rule per group.
//!
//! A hybrid model (sliding window plus full attention, Mamba plus full
//! attention, chunked local attention) caches each attention group apart,
//! and its engine accepts a prefix hit only when every group can serve it.
//! These types say what a group is and how long a hit one group accepts;
//! the index combines them per pod.

use std::fmt;

/// What a KV-cache group's layers need of the cache for a hit that ends at
/// a block boundary `h` (in blocks of the group's own size).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GroupKind {
    /// Every block from the start (`full_attention`, `mla_attention`,
    /// `sink_full_attention`).
    Full,
    /// The `cdiv(window - 1, block_size)` blocks ending at `h` (or all
    /// blocks before `h` when `h` is shorter): `sliding_window`,
    /// `sliding_window_mla`.
    SlidingWindow {
        /// The window, in tokens (at least 2).
        window: u32,
    },
    /// The blocks from the start of `h`'s attention chunk to `h`
    /// (`chunked_local_attention`).
    ChunkedLocal {
        /// The attention chunk, in tokens (a multiple of the block size).
        chunk: u32,
    },
    /// The state block ending at `h` (`mamba`, linear attention).
    Mamba,
}

/// Why a group's description cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GroupError {
    /// A kind this router does not know.
    UnknownKind(String),
    /// A sliding window without its size, or one under 2 tokens.
    BadWindow(Option<u32>),
    /// Chunked local attention without a configured chunk size (vLLM's
    /// events do not carry it), or one that is not a positive multiple of
    /// the block size.
    BadChunk(Option<u32>),
    /// A block size of zero.
    ZeroBlockSize,
}

impl fmt::Display for GroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupError::UnknownKind(k) => write!(f, "unknown KV-cache group kind `{k}`"),
            GroupError::BadWindow(w) => {
                write!(
                    f,
                    "a sliding-window group needs a window of at least 2 tokens, got {w:?}"
                )
            }
            GroupError::BadChunk(c) => write!(
                f,
                "a chunked-local-attention group needs its chunk size (a positive multiple of the block size) \
                 configured, got {c:?}"
            ),
            GroupError::ZeroBlockSize => write!(f, "a KV-cache group with a block size of 0"),
        }
    }
}

impl std::error::Error for GroupError {}

impl GroupKind {
    /// The kind vLLM's `kv_cache_spec_kind` names, with its
    /// `kv_cache_spec_sliding_window` and a configured chunk size (which
    /// vLLM's events do not carry).
    pub fn from_vllm(
        kind: &str,
        window: Option<u32>,
        chunk: Option<u32>,
    ) -> Result<GroupKind, GroupError> {
        match kind {
            "full_attention" | "mla_attention" | "sink_full_attention" => Ok(GroupKind::Full),
            "sliding_window" | "sliding_window_mla" => match window {
                Some(w) if w >= 2 => Ok(GroupKind::SlidingWindow { window: w }),
                w => Err(GroupError::BadWindow(w)),
            },
            "chunked_local_attention" => match chunk {
                Some(c) if c > 0 => Ok(GroupKind::ChunkedLocal { chunk: c }),
                c => Err(GroupError::BadChunk(c)),
            },
            "mamba" => Ok(GroupKind::Mamba),
            other => Err(GroupError::UnknownKind(other.to_owned())),
        }
    }
}

/// Whether a group's blocks were stored or removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupChange {
    /// The group now holds the blocks.
    Stored,
    /// The group dropped the blocks.
    Removed,
}

impl std::str::FromStr for GroupKind {
    type Err = GroupError;

    /// A group as configuration names it: `sliding-window:<tokens>`,
    /// `chunked-local:<tokens>`, `mamba` or `full`.
    fn from_str(s: &str) -> Result<GroupKind, GroupError> {
        let (name, n) = match s.split_once(':') {
            Some((name, n)) => (name, Some(n.parse::<u32>().ok())),
            None => (s, None),
        };
        match (name, n) {
            ("full", None) => Ok(GroupKind::Full),
            ("mamba", None) => Ok(GroupKind::Mamba),
            ("sliding-window", Some(w)) => GroupKind::from_vllm("sliding_window", w, None),
            ("sliding-window", None) => Err(GroupError::BadWindow(None)),
            ("chunked-local", Some(c)) => GroupKind::from_vllm("chunked_local_attention", None, c),
            ("chunked-local", None) => Err(GroupError::BadChunk(None)),
            _ => Err(GroupError::UnknownKind(s.to_owned())),
        }
    }
}

/// One KV-cache group of a pod: its index in the engine, its kind and
/// its block size (tokens per block).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupSpec {
    /// The engine's group index (`group_idx`).
    pub group: u32,
    /// What its layers need for a hit.
    pub kind: GroupKind,
    /// Tokens per block of this group.
    pub block_size: u32,
}

impl GroupSpec {
    /// A checked spec: the block size is not zero, and a chunk is a
    /// multiple of it.
    pub fn new(group: u32, kind: GroupKind, block_size: u32) -> Result<GroupSpec, GroupError> {
        if block_size == 0 {
            return Err(GroupError::ZeroBlockSize);
        }
        if let GroupKind::ChunkedLocal { chunk } = kind {
            if chunk % block_size != 0 {
                return Err(GroupError::BadChunk(Some(chunk)));
            }
        }
        Ok(GroupSpec {
            group,
            kind,
            block_size,
        })
    }

    /// The longest hit of at most `max` blocks this group accepts, where
    /// `held(i)` says whether the group holds block `i` of the chain.
    ///
    /// This is vLLM's `find_longest_cache_hit` for the group's kind, on
    /// block counts (one block size for every group): full attention takes
    /// the held run from the start; a sliding window scans down from `max`
    /// for `cdiv(window - 1, block_size)` held blocks in a row and
    /// otherwise takes the held run from the start; chunked local
    /// attention takes the chunk start of `max` plus the held run from
    /// there; Mamba takes one past the last held block below `max`.
    pub fn longest_hit(&self, max: usize, mut held: impl FnMut(usize) -> bool) -> usize {
        // The fields are public: a spec built without `new` must not panic.
        let bs = (self.block_size as usize).max(1);
        match self.kind {
            GroupKind::Full => (0..max).find(|&i| !held(i)).unwrap_or(max),
            GroupKind::SlidingWindow { window } => {
                let need = (window as usize).saturating_sub(1).div_ceil(bs);
                let mut run = 0;
                for i in (0..max).rev() {
                    if held(i) {
                        run += 1;
                        if run >= need {
                            return i + run;
                        }
                    } else {
                        run = 0;
                    }
                }
                // The held run from block 0 (shorter than the window).
                run
            }
            GroupKind::ChunkedLocal { chunk } => {
                let per_chunk = (chunk as usize / bs).max(1);
                let start = max / per_chunk * per_chunk;
                (start..max).find(|&i| !held(i)).unwrap_or(max)
            }
            GroupKind::Mamba => (0..max).rev().find(|&i| held(i)).map_or(0, |i| i + 1),
        }
    }
}

/// The hit a set of groups accepts together: the longest `h <= max` every
/// group accepts, found as vLLM's coordinator does (each group shortens
/// the candidate in turn until none does). `held(g, i)`: whether group `g`
/// (an index into `groups`) holds block `i`.
pub fn combined_hit(
    groups: &[GroupSpec],
    max: usize,
    mut held: impl FnMut(usize, usize) -> bool,
) -> usize {
    let mut hit = max;
    loop {
        let before = hit;
        for (g, spec) in groups.iter().enumerate() {
            hit = spec.longest_hit(hit, |i| held(g, i));
        }
        if hit >= before {
            return hit;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: GroupKind) -> GroupSpec {
        GroupSpec::new(1, kind, 4).unwrap()
    }

    fn set(blocks: &[usize]) -> impl Fn(usize) -> bool + '_ {
        move |i| blocks.contains(&i)
    }

    #[test]
    fn kinds_from_vllm_names() {
        assert_eq!(
            GroupKind::from_vllm("sliding_window", Some(128), None),
            Ok(GroupKind::SlidingWindow { window: 128 })
        );
        assert_eq!(
            GroupKind::from_vllm("mla_attention", None, None),
            Ok(GroupKind::Full)
        );
        assert_eq!(
            GroupKind::from_vllm("sliding_window", None, None),
            Err(GroupError::BadWindow(None))
        );
        assert_eq!(
            GroupKind::from_vllm("chunked_local_attention", None, None),
            Err(GroupError::BadChunk(None))
        );
        assert!(matches!(
            GroupKind::from_vllm("cross_attention", None, None),
            Err(GroupError::UnknownKind(_))
        ));
        assert_eq!(
            GroupSpec::new(0, GroupKind::ChunkedLocal { chunk: 6 }, 4),
            Err(GroupError::BadChunk(Some(6)))
        );
        assert_eq!(
            "sliding-window:128".parse(),
            Ok(GroupKind::SlidingWindow { window: 128 })
        );
        assert_eq!(
            "chunked-local:8192".parse(),
            Ok(GroupKind::ChunkedLocal { chunk: 8192 })
        );
        assert_eq!("mamba".parse(), Ok(GroupKind::Mamba));
        assert_eq!(
            "sliding-window:x".parse::<GroupKind>(),
            Err(GroupError::BadWindow(None))
        );
        assert!("mamba:3".parse::<GroupKind>().is_err());
        assert_eq!(
            GroupSpec::new(0, GroupKind::Mamba, 0),
            Err(GroupError::ZeroBlockSize)
        );
    }

    /// vLLM's docstring example: block size 4, window 8 (2 blocks needed),
    /// blocks [_, _, 8, 3, _, 9]: the hit ends after block 3.
    #[test]
    fn sliding_window_as_vllm_documents() {
        let sw = spec(GroupKind::SlidingWindow { window: 8 });
        assert_eq!(sw.longest_hit(6, set(&[2, 3, 5])), 4);
        // No two in a row: the run from block 0.
        assert_eq!(sw.longest_hit(6, set(&[0, 3, 5])), 1);
        assert_eq!(sw.longest_hit(6, set(&[3, 5])), 0);
        assert_eq!(sw.longest_hit(0, set(&[0, 1])), 0);
    }

    #[test]
    fn mamba_and_chunked_local() {
        let m = spec(GroupKind::Mamba);
        assert_eq!(m.longest_hit(6, set(&[1, 4])), 5);
        assert_eq!(m.longest_hit(4, set(&[1, 4])), 2);
        assert_eq!(m.longest_hit(6, set(&[])), 0);
        // Chunks of 8 tokens (2 blocks): a max of 5 blocks starts its chunk
        // at block 4, which needs nothing before it.
        let c = spec(GroupKind::ChunkedLocal { chunk: 8 });
        assert_eq!(c.longest_hit(5, set(&[])), 4);
        assert_eq!(c.longest_hit(5, set(&[4])), 5);
        assert_eq!(c.longest_hit(4, set(&[])), 4);
        assert_eq!(c.longest_hit(3, set(&[])), 2);
    }

    #[test]
    fn groups_combine_to_the_longest_hit_all_accept() {
        let groups = [
            GroupSpec::new(0, GroupKind::Full, 4).unwrap(),
            GroupSpec::new(1, GroupKind::SlidingWindow { window: 8 }, 4).unwrap(),
            GroupSpec::new(2, GroupKind::Mamba, 4).unwrap(),
        ];
        // Full holds 0..10; the window holds 6,7 and 2,3; Mamba holds 3.
        let held = |g: usize, i: usize| match g {
            0 => i < 10,
            1 => [2, 3, 6, 7].contains(&i),
            _ => i == 3,
        };
        // The window accepts 8; Mamba at 8 shortens to 4; the window
        // accepts 4 (blocks 2, 3).
        assert_eq!(combined_hit(&groups, 10, held), 4);
    }
}
