//! The seeded workloads W1 to W4.
//!
//! A chain is a list of block content hashes plus the cumulative sequence
//! hashes over them: `router-index` and the engines' indexes are keyed by
//! the sequence hash (the router hash), the peers' lookups by the content
//! hash. Both are computed once, outside every timing.

use std::collections::{BTreeMap, HashMap};

use router_core::BlockHash;

use crate::subject::Subject;

/// One chain: content hashes and the cumulative hashes over them.
#[derive(Clone, Debug)]
pub struct Chain {
    /// Position-independent content hash of each block.
    pub content: Vec<u64>,
    /// Cumulative (prefix) hash of each block.
    pub seq: Vec<BlockHash>,
    /// The same hashes as plain `u64`s, as an embedder holding raw hashes
    /// passes them to `Index::score_into`.
    pub raw: Vec<u64>,
}

impl Chain {
    /// A chain over these content hashes.
    pub fn new(content: Vec<u64>) -> Self {
        let mut seq = Vec::with_capacity(content.len());
        let mut prev = 0x5EED_u64;
        for &c in &content {
            prev = mix(prev ^ c.rotate_left(23));
            seq.push(BlockHash(prev));
        }
        let raw = seq.iter().map(|h| h.0).collect();
        Chain { content, seq, raw }
    }

    /// The number of blocks.
    pub fn len(&self) -> usize {
        self.content.len()
    }

    /// Whether the chain has no block.
    pub fn is_empty(&self) -> bool {
        self.content.is_empty()
    }
}

/// The workloads' mixer: [`router_core::mix64`], a seeded, stable stream
/// of values.
pub use router_core::mix64 as mix;

/// A tiny deterministic generator.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(mix(seed ^ 0xA5A5_5A5A))
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        mix(self.0) % n.max(1)
    }
}

/// One step of a workload.
#[derive(Clone, Debug)]
pub enum Op {
    /// `pod` stores blocks `from..to` of `chain` (parent: block `from - 1`).
    Store {
        /// Pod index.
        pod: u32,
        /// Chain index.
        chain: u32,
        /// First block.
        from: u32,
        /// One past the last block.
        to: u32,
    },
    /// `pod` evicts these blocks of `chain` (positions).
    Remove {
        /// Pod index.
        pod: u32,
        /// Chain index.
        chain: u32,
        /// Positions in the chain.
        positions: Vec<u32>,
    },
    /// A lookup of `chain`.
    Query {
        /// Chain index.
        chain: u32,
    },
}

/// A workload: chains, pods and a sequence of operations.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Name for the tables.
    pub name: String,
    /// Pods in the fleet.
    pub pods: usize,
    /// Every chain the operations name.
    pub chains: Vec<Chain>,
    /// Stores that build the state before queries run.
    pub setup: Vec<Op>,
    /// The measured phase: queries, possibly interleaved with events.
    pub run: Vec<Op>,
    /// The (block, pod) pairs held once every operation has run, where the
    /// run's events change them (W3's stores and evictions): what an
    /// index's memory at the end is divided by. `None` where the run only
    /// queries.
    pub end_residencies: Option<u64>,
}

/// Stores of a chain in events of `per_event` blocks, as engines emit them.
fn store_ops(pod: u32, chain: u32, len: usize, per_event: usize, ops: &mut Vec<Op>) {
    let mut from = 0;
    while from < len {
        let to = (from + per_event).min(len);
        ops.push(Op::Store {
            pod,
            chain,
            from: from as u32,
            to: to as u32,
        });
        from = to;
    }
}

/// W1, shared prefixes: 16 pods, 4000 chains of 128 blocks built from 8
/// shared 32-block prefixes, each stored whole in one event (as an engine
/// reports a finished prefill); queries are half full hits (a stored
/// chain), half partial (a new chain on a known prefix).
pub fn w1(seed: u64, queries: usize) -> Workload {
    const PODS: usize = 16;
    const CHAINS: usize = 4000;
    const LEN: usize = 128;
    const PREFIX: usize = 32;
    let mut rng = Rng::new(seed);
    let prefixes: Vec<Vec<u64>> = (0..8)
        .map(|p| {
            (0..PREFIX)
                .map(|i| mix(seed ^ (p << 40) ^ i as u64))
                .collect()
        })
        .collect();
    let make = |id: u64, prefix: usize| {
        let mut c = prefixes[prefix].clone();
        c.extend((PREFIX..LEN).map(|i| mix(seed ^ (1 << 62) ^ (id << 16) ^ i as u64)));
        Chain::new(c)
    };
    let mut chains = Vec::with_capacity(CHAINS + queries);
    let mut setup = Vec::new();
    for id in 0..CHAINS {
        chains.push(make(id as u64, id % 8));
        let pod = rng.below(PODS as u64) as u32;
        store_ops(pod, id as u32, LEN, LEN, &mut setup);
    }
    let mut run = Vec::with_capacity(queries);
    for q in 0..queries {
        if q % 2 == 0 {
            run.push(Op::Query {
                chain: rng.below(CHAINS as u64) as u32,
            });
        } else {
            chains.push(make((CHAINS + q) as u64, rng.below(8) as usize));
            run.push(Op::Query {
                chain: (chains.len() - 1) as u32,
            });
        }
    }
    Workload {
        name: "W1 shared prefixes".into(),
        pods: PODS,
        chains,
        setup,
        run,
        end_residencies: None,
    }
}

/// Applies `op`'s event to `s` (a query applies nothing): the blocks it
/// names.
pub fn apply(s: &dyn Subject, w: &Workload, op: &Op) -> u64 {
    match op {
        Op::Store {
            pod,
            chain,
            from,
            to,
        } => {
            s.store(
                *pod,
                &w.chains[*chain as usize],
                *from as usize,
                *to as usize,
            );
            u64::from(to - from)
        }
        Op::Remove {
            pod,
            chain,
            positions,
        } => {
            s.remove(*pod, &w.chains[*chain as usize], positions);
            positions.len() as u64
        }
        Op::Query { .. } => 0,
    }
}

/// W4's writer: `rng`'s next event on W1's state, a whole 128-block chain
/// stored by a random pod or its blocks from 64 on evicted (half each).
/// The same sequence for every index, in `compare` and in `cost`.
pub fn w4_event(w: &Workload, rng: &mut Rng) -> Op {
    let chain = rng.below(4000) as u32;
    let pod = rng.below(w.pods as u64) as u32;
    let len = w.chains[chain as usize].len() as u32;
    if rng.below(2) == 0 {
        Op::Store {
            pod,
            chain,
            from: 0,
            to: len,
        }
    } else {
        Op::Remove {
            pod,
            chain,
            positions: (64..len).collect(),
        }
    }
}

/// W2, many pods and long prompts: 256 pods share each of `chains` chains
/// of `n` blocks and drop off at `k` distinct depths (pods dealt to depths
/// differently on every chain); every query is a whole chain, picked at
/// random, so the state a query meets is rarely in cache.
pub fn w2(seed: u64, n: usize, k: usize, chains: usize, queries: usize) -> Workload {
    const PODS: usize = 256;
    let mut rng = Rng::new(seed ^ n as u64 ^ (k as u64) << 20);
    let all: Vec<Chain> = (0..chains as u64)
        .map(|c| Chain::new((0..n).map(|i| mix(seed ^ (c << 40) ^ i as u64)).collect()))
        .collect();
    let mut setup = Vec::new();
    for c in 0..chains {
        let shift = rng.below(PODS as u64) as usize;
        for pod in 0..PODS {
            // Depths spread evenly over 1..=n, pods dealt round robin from
            // a different pod on each chain.
            let level = (pod + shift) % k;
            let depth = ((level + 1) * n / k).max(1);
            store_ops(pod as u32, c as u32, depth, 64, &mut setup);
        }
    }
    let run = (0..queries)
        .map(|_| Op::Query {
            chain: rng.below(chains as u64) as u32,
        })
        .collect();
    Workload {
        name: format!("W2 N={n} K={k} ({chains} chains)"),
        pods: PODS,
        chains: all,
        setup,
        run,
        end_residencies: None,
    }
}

/// The bundled Mooncake trace that W3 replays.
pub const TRACE_PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../assets/traces/synthetic_trace.jsonl"
);

/// One request of a Mooncake trace.
#[derive(Clone, Debug)]
pub struct TraceRequest {
    /// Prefix-chained block ids (512 tokens each).
    pub hash_ids: Vec<u64>,
}

/// Reads a Mooncake-format JSONL trace (`hash_ids` per line); lines that do
/// not parse are skipped and counted.
pub fn read_trace(text: &str) -> (Vec<TraceRequest>, usize) {
    let mut out = Vec::new();
    let mut bad = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let parsed: Option<Vec<u64>> = serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| serde_json::from_value(v.get("hash_ids")?.clone()).ok());
        match parsed {
            Some(hash_ids) if !hash_ids.is_empty() => out.push(TraceRequest { hash_ids }),
            _ => bad += 1,
        }
    }
    (out, bad)
}

/// W3, trace: requests replayed on `pods` pods with LRU caches of
/// `capacity` blocks. Each request is routed to the pod holding its longest
/// prefix (ties to the least recently chosen pod), queried first, then its
/// blocks are stored and the pod's least recently used blocks evicted,
/// deepest first. Every store and eviction becomes an event.
pub fn w3(requests: &[TraceRequest], pods: usize, capacity: usize) -> Workload {
    // Blocks are identified by their trace id; one chain per request.
    let mut chains = Vec::with_capacity(requests.len());
    let mut run = Vec::new();
    // Per pod: block id -> (LRU stamp, chain, position), and stamps in order.
    let mut held: Vec<HashMap<u64, (u64, u32, u32)>> = vec![HashMap::new(); pods];
    let mut lru: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); pods];
    let mut last_chosen = vec![0u64; pods];
    for (r, req) in requests.iter().enumerate() {
        let chain_id = r as u32;
        chains.push(Chain::new(
            req.hash_ids.iter().map(|&h| mix(h ^ 0x7ACE)).collect(),
        ));
        run.push(Op::Query { chain: chain_id });
        let depth = |p: usize| {
            req.hash_ids
                .iter()
                .take_while(|h| held[p].contains_key(h))
                .count()
        };
        let pod = (0..pods)
            .max_by_key(|&p| (depth(p), std::cmp::Reverse(last_chosen[p])))
            .unwrap_or(0);
        last_chosen[pod] = r as u64 + 1;
        let have = depth(pod);
        let n = req.hash_ids.len();
        for (i, h) in req.hash_ids.iter().enumerate() {
            // Deeper blocks get older stamps: evicted first, as vLLM frees
            // a request's blocks tail first. Stamps are unique.
            let stamp = (r as u64 + 1) * 1_000_000 + (n - i) as u64;
            let entry = held[pod].entry(*h).or_insert((0, chain_id, i as u32));
            if entry.0 != 0 {
                lru[pod].remove(&entry.0);
            }
            entry.0 = stamp;
            lru[pod].insert(stamp, *h);
        }
        if have < n {
            run.push(Op::Store {
                pod: pod as u32,
                chain: chain_id,
                from: have as u32,
                to: n as u32,
            });
        }
        let mut per_chain: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        while held[pod].len() > capacity {
            let Some((_, h)) = lru[pod].pop_first() else {
                break;
            };
            if let Some((_, c, p)) = held[pod].remove(&h) {
                per_chain.entry(c).or_default().push(p);
            }
        }
        for (c, positions) in per_chain {
            run.push(Op::Remove {
                pod: pod as u32,
                chain: c,
                positions,
            });
        }
    }
    Workload {
        name: format!(
            "W3 trace ({} requests, {pods} pods x {capacity} blocks)",
            requests.len()
        ),
        pods,
        chains,
        setup: Vec::new(),
        run,
        end_residencies: Some(held.iter().map(|h| h.len() as u64).sum()),
    }
}
