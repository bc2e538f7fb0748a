//! Trace replay through simulated pods, routed by a real profile over a
//! real index that learns only from the pods' cache events.
//!
//! Each router replica decides through router-exec's [`Executor`], as the
//! HTTP fronts do: [`Executor::lease`] runs the profile and counts the
//! request on its pod (in flight, queued prefill, KV blocks) until the
//! simulated engine finishes it, and the engine's cache hits go back as
//! feedback. The load a router sees is therefore its own accounting, not
//! the engines' true state. What the simulator does not replay is the
//! executor's sending: its retries and timeouts run on tokio's clock,
//! and the simulated pods never fail.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use router_core::{BlockHash, CacheEvent, CacheEventSink, PodDirectory, PodId, PodKey};
use router_exec::{Executor, Feedback, Lease, Workflow};
use router_index::{Index, IndexConfig};
use router_policy::builtin::{Memory, RoutedChains};
use router_policy::keys::{CHAIN, HASH_KEY, NOW_MS, PROMPT_TOKENS, SESSION_ID};
use router_policy::{Context, Fleet, PodState, PodStateSink, Profile, Role};

use crate::cache::{BlockCache, CacheChange};
use crate::model::CostModel;
use crate::report::{Report, RequestRecord};
use crate::trace::{MOONCAKE_BLOCK_TOKENS, Request};

/// The simulated cluster.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ClusterConfig {
    /// Pods.
    pub pods: usize,
    /// GPU cache capacity per pod, in blocks.
    pub gpu_blocks: usize,
    /// CPU cache tier per pod, in blocks (0: none).
    pub cpu_blocks: usize,
    /// Tokens per block.
    pub block_tokens: u64,
    /// How long a cache event takes to reach the index, milliseconds.
    pub event_delay_ms: f64,
    /// Arrival times are divided by this (2 = twice the trace's rate).
    pub speedup: f64,
    /// The engine step model.
    pub model: CostModel,
    /// Replay in request order with no timing: each request is served
    /// instantly, so only cache effects count.
    pub request_order: bool,
    /// Router replicas, each with its own profile (its own speculative
    /// registrations and peer trees) and its own view of load; requests
    /// alternate between them, as behind a round-robin proxy.
    pub routers: usize,
    /// How long one router's load and registrations take to reach the
    /// others, milliseconds (negative: never; they share only the index,
    /// fed by the same events).
    pub share_delay_ms: f64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            pods: 8,
            gpu_blocks: 2048,
            cpu_blocks: 0,
            block_tokens: MOONCAKE_BLOCK_TOKENS,
            event_delay_ms: 5.0,
            speedup: 1.0,
            model: CostModel::default(),
            request_order: false,
            routers: 1,
            share_delay_ms: 2.0,
        }
    }
}

/// Builds a policy's profile over the cluster's index, registering what it
/// routes into the given table.
type BuildProfile =
    Box<dyn Fn(Arc<Index>, &ClusterConfig, Arc<RoutedChains>) -> Profile + Send + Sync>;

/// A routing policy: a name and how to build its profile over the index.
pub struct Policy {
    /// The name in reports.
    pub name: String,
    build: BuildProfile,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy").field("name", &self.name).finish()
    }
}

impl Policy {
    /// A policy named `name` whose profile `build` makes for a cluster.
    pub fn new(
        name: impl Into<String>,
        build: impl Fn(Arc<Index>, &ClusterConfig) -> Profile + Send + Sync + 'static,
    ) -> Self {
        Policy {
            name: name.into(),
            build: Box::new(move |index, cfg, _| build(index, cfg)),
        }
    }

    /// A policy whose profile registers what it routes into the table it is
    /// given (speculative registrations), so that several routers running
    /// it can share them.
    pub fn with_routed(
        name: impl Into<String>,
        build: impl Fn(Arc<Index>, &ClusterConfig, Arc<RoutedChains>) -> Profile + Send + Sync + 'static,
    ) -> Self {
        Policy {
            name: name.into(),
            build: Box::new(build),
        }
    }
}

/// A trace block id as a router block hash (ids are already prefix-chained).
pub fn block_hash(id: u64) -> BlockHash {
    BlockHash(router_core::mix64(id ^ 0xB10C_B10C_B10C_B10C))
}

struct Run {
    req: usize,
    prefill_left: u64,
    decoded: u64,
    computed: Vec<u64>,
    chunk: u64,
}

struct SimPod {
    id: PodId,
    cache: BlockCache,
    waiting: VecDeque<usize>,
    running: Vec<Run>,
    stepping: bool,
    step_started: u64,
    busy_us: u64,
}

type Load = router_policy::PodLoad;

/// One router replica.
struct RouterSide {
    /// Its profile as a workflow of one step.
    workflow: Workflow,
    fleet: Arc<Fleet>,
    /// Decides and keeps the fleet's counters (the production path).
    exec: Executor,
    table: Arc<RoutedChains>,
    /// What it knows of each router's load per pod: `seen[j][p]` (its own
    /// at `j` = itself, as last shared).
    seen: Vec<Vec<Load>>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    // Order within one instant: deliveries, then step ends, then arrivals.
    Deliver(usize),
    /// A shared message reaches another router (index into `shares`).
    Share(usize),
    StepDone(usize),
    Arrival(usize),
}

/// A message between routers.
enum Shared {
    /// Router `from`'s load on pod `pod`, for router `to`.
    Load {
        to: usize,
        from: usize,
        pod: usize,
        load: Load,
    },
    /// Router `to` registers request `req`'s chain on pod `pod`.
    Routed { to: usize, req: usize, pod: usize },
}

/// Runs one policy over a trace and reports what it reached.
pub struct Simulation<'a> {
    cfg: &'a ClusterConfig,
    trace: &'a [Request],
    index: Arc<Index>,
    routers: Vec<RouterSide>,
    shares: Vec<Option<Shared>>,
    pods: Vec<SimPod>,
    records: Vec<RequestRecord>,
    queue: BinaryHeap<Reverse<(u64, u64, Kind)>>,
    seq: u64,
    pending: Vec<Vec<CacheEvent>>,
    decision_ns: Vec<u64>,
    hashes: Vec<Vec<BlockHash>>,
    /// Each request's decision, held while the pod serves it.
    leases: Vec<Option<Lease>>,
    /// Request-order mode's load proxy: the last requests' leases.
    window: VecDeque<usize>,
}

impl std::fmt::Debug for Simulation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulation")
            .field("pods", &self.pods.len())
            .finish_non_exhaustive()
    }
}

impl<'a> Simulation<'a> {
    /// A cluster of idle pods, an empty index and `policy`'s profile.
    pub fn new(trace: &'a [Request], cfg: &'a ClusterConfig, policy: &Policy) -> Self {
        let index = Index::new(IndexConfig::default());
        let pods: Vec<SimPod> = (0..cfg.pods)
            .map(|i| {
                let id = index
                    .join(&PodKey::new(format!("sim://pod-{i}"), 0))
                    .expect("the index holds 256 pods; the simulator caps pods at that");
                SimPod {
                    id,
                    cache: BlockCache::new(cfg.gpu_blocks, cfg.cpu_blocks),
                    waiting: VecDeque::new(),
                    running: Vec::new(),
                    stepping: false,
                    step_started: 0,
                    busy_us: 0,
                }
            })
            .collect();
        let routers = (0..cfg.routers.max(1))
            .map(|_| {
                let fleet = Arc::new(Fleet::new());
                for p in &pods {
                    let mut state = PodState::new(p.id, Role::Both);
                    state.kv_blocks_total = cfg.gpu_blocks as u64;
                    fleet.upsert(state);
                }
                let table = Arc::new(RoutedChains::new(Memory::SPECULATIVE));
                let profile = (policy.build)(index.clone(), cfg, table.clone());
                RouterSide {
                    workflow: Workflow::single(Arc::new(profile)),
                    exec: Executor::for_leases(
                        fleet.clone(),
                        Arc::new(Feedback::new(cfg.block_tokens)),
                    ),
                    fleet,
                    table,
                    seen: vec![vec![Load::default(); cfg.pods]; cfg.routers.max(1)],
                }
            })
            .collect();
        Simulation {
            cfg,
            trace,
            index,
            routers,
            shares: Vec::new(),
            pods,
            records: trace
                .iter()
                .map(|r| {
                    let mut rec = RequestRecord::new(r);
                    rec.arrival_ms =
                        r.arrival_ms / if cfg.speedup > 0.0 { cfg.speedup } else { 1.0 };
                    rec
                })
                .collect(),
            queue: BinaryHeap::new(),
            seq: 0,
            pending: Vec::new(),
            decision_ns: Vec::with_capacity(trace.len()),
            hashes: trace
                .iter()
                .map(|r| r.blocks.iter().map(|b| block_hash(*b)).collect())
                .collect(),
            leases: (0..trace.len()).map(|_| None).collect(),
            window: VecDeque::new(),
        }
    }

    /// The router's index (to inspect after a run).
    pub fn index(&self) -> &Arc<Index> {
        &self.index
    }

    /// Pod `i`'s id and cache (to inspect after a run).
    pub fn pod(&self, i: usize) -> (PodId, &BlockCache) {
        (self.pods[i].id, &self.pods[i].cache)
    }

    /// Router replica `k`'s view of the pods: the load its executor
    /// counts, with what the other replicas shared (to inspect after a
    /// run: every figure but the capacity is back to zero).
    pub fn fleet(&self, k: usize) -> &Fleet {
        &self.routers[k].fleet
    }

    /// Router replica `k`'s comparison of predicted and served cache hits.
    pub fn feedback(&self, k: usize) -> &Feedback {
        self.routers[k].exec.feedback()
    }

    fn push(&mut self, at: u64, kind: Kind) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, kind)));
    }

    /// Replays the whole trace, calling `progress` with requests done so far.
    pub fn run(&mut self, name: &str, mut progress: impl FnMut(usize)) -> Report {
        if self.cfg.request_order {
            for r in 0..self.trace.len() {
                self.request_order_one(r);
                progress(r + 1);
            }
            // The run is over: the requests still held as load end too.
            while let Some(r) = self.window.pop_front() {
                self.end_lease(r, true, 0);
            }
            return Report::build(
                name,
                self.cfg,
                &self.records,
                &self.decision_ns,
                &self.busy(),
            );
        }
        let speed = if self.cfg.speedup > 0.0 {
            self.cfg.speedup
        } else {
            1.0
        };
        for (r, req) in self.trace.iter().enumerate() {
            let at = (req.arrival_ms / speed * 1000.0) as u64;
            self.push(at, Kind::Arrival(r));
        }
        let mut done = 0;
        while let Some(Reverse((t, _, kind))) = self.queue.pop() {
            match kind {
                Kind::Arrival(r) => {
                    let p = self.route(r);
                    self.records[r].pod = p;
                    if self.trace[r].blocks.len() > self.cfg.gpu_blocks {
                        // It could never be admitted: refused at once, as
                        // vLLM refuses a prompt its KV cache cannot hold
                        // (waiting, it would block the pod's queue forever).
                        self.records[r].rejected = true;
                        self.end_lease(r, false, t);
                        continue;
                    }
                    self.pods[p].waiting.push_back(r);
                    if !self.pods[p].stepping {
                        self.start_step(p, t);
                    }
                }
                Kind::StepDone(p) => {
                    done += self.finish_step(p, t);
                    progress(done);
                    self.start_step(p, t);
                }
                Kind::Deliver(i) => {
                    let events = std::mem::take(&mut self.pending[i]);
                    for e in &events {
                        // Events of live pods always apply.
                        let _ = self.index.apply(e);
                        // What each router registered ends with the
                        // engine's eviction (as `Evictions` does for one).
                        for side in &self.routers {
                            side.table.observe(e);
                        }
                    }
                }
                Kind::Share(i) => {
                    if let Some(m) = self.shares[i].take() {
                        self.receive(m, t);
                    }
                }
            }
        }
        Report::build(
            name,
            self.cfg,
            &self.records,
            &self.decision_ns,
            &self.busy(),
        )
    }

    fn busy(&self) -> Vec<u64> {
        self.pods.iter().map(|p| p.busy_us).collect()
    }

    /// The router request `r` goes through (alternating).
    fn router_of(&self, r: usize) -> usize {
        r % self.routers.len()
    }

    /// Sends `m` to arrive after the sharing delay (never when negative).
    fn share(&mut self, m: Shared, now: u64) {
        if self.cfg.share_delay_ms < 0.0 {
            return;
        }
        let delay = (self.cfg.share_delay_ms * 1000.0) as u64;
        if delay == 0 || self.cfg.request_order {
            self.receive(m, now);
            return;
        }
        self.shares.push(Some(m));
        let i = self.shares.len() - 1;
        self.push(now + delay, Kind::Share(i));
    }

    fn receive(&mut self, m: Shared, now: u64) {
        match m {
            Shared::Load {
                to,
                from,
                pod,
                load,
            } => {
                let side = &mut self.routers[to];
                let had = std::mem::replace(&mut side.seen[from][pod], load);
                side.fleet
                    .update(self.pods[pod].id, &mut |s| Load::replace_in(s, had, load));
            }
            Shared::Routed { to, req, pod } => {
                let id = self.pods[pod].id;
                self.routers[to]
                    .table
                    .insert_remote(id, &self.hashes[req], now / 1000);
            }
        }
    }

    fn route(&mut self, r: usize) -> usize {
        let req = &self.trace[r];
        let mut ctx = Context::new();
        ctx.insert(CHAIN, self.hashes[r].clone());
        ctx.insert(PROMPT_TOKENS, req.input_tokens);
        ctx.insert(HASH_KEY, block_hash(req.blocks[0]).0);
        ctx.insert(NOW_MS, self.records[r].arrival_ms as u64);
        if let Some(s) = req.session {
            ctx.insert(SESSION_ID, s.to_string());
        }
        let k = self.router_of(r);
        let side = &self.routers[k];
        let t0 = Instant::now();
        let leased = side.exec.lease(&side.workflow, ctx, req.input_tokens, &[]);
        self.decision_ns.push(t0.elapsed().as_nanos() as u64);
        let now = (self.records[r].arrival_ms * 1000.0) as u64;
        // Every pod is healthy and every profile here ends in a picker, so
        // a decision fails only for a profile that filters out every pod:
        // the request then goes to the first pod, counted by no router.
        let Ok(lease) = leased else {
            return 0;
        };
        let pod = lease.pod();
        self.records[r].predicted_blocks = lease.predicted_cached_blocks() as usize;
        self.leases[r] = Some(lease);
        let p = self.pods.iter().position(|x| x.id == pod).unwrap_or(0);
        self.share_load(k, p, now);
        for to in (0..self.routers.len()).filter(|&to| to != k) {
            self.share(Shared::Routed { to, req: r, pod: p }, now);
        }
        p
    }

    /// Request `r`'s prefill is over: its first token, and the engine's
    /// cache hits as feedback to the router that routed it.
    fn first_token(&mut self, r: usize, cached_tokens: u64, now: u64) {
        let Some(lease) = self.leases[r].as_mut() else {
            return;
        };
        lease.first_token();
        lease.cached_tokens(cached_tokens);
        let pod = lease.pod();
        self.lease_changed(r, pod, now);
    }

    /// Request `r` ended (`ok`: served): its router stops counting it.
    fn end_lease(&mut self, r: usize, ok: bool, now: u64) {
        let Some(lease) = self.leases[r].take() else {
            return;
        };
        let pod = lease.pod();
        lease.finish(ok);
        self.lease_changed(r, pod, now);
    }

    fn lease_changed(&mut self, r: usize, pod: PodId, now: u64) {
        if let Some(p) = self.pods.iter().position(|x| x.id == pod) {
            self.share_load(self.router_of(r), p, now);
        }
    }

    /// Router `k`'s own load on pod `p` (what its executor counts, without
    /// what the others shared), sent to the others when it changed.
    fn share_load(&mut self, k: usize, p: usize, now: u64) {
        let n = self.routers.len();
        if n == 1 {
            return;
        }
        let side = &self.routers[k];
        let Some(state) = side.fleet.get(self.pods[p].id) else {
            return;
        };
        let others = (0..n)
            .filter(|&j| j != k)
            .fold(Load::default(), |a, j| a.plus(side.seen[j][p]));
        let load = Load::of(&state).minus(others);
        if side.seen[k][p] == load {
            return;
        }
        self.routers[k].seen[k][p] = load;
        for to in (0..n).filter(|&to| to != k) {
            self.share(
                Shared::Load {
                    to,
                    from: k,
                    pod: p,
                    load,
                },
                now,
            );
        }
    }

    /// Request-order mode has no time, so no load: without a proxy a
    /// cache-seeking policy sends everything to one pod. Each request's
    /// lease (in flight, its predicted uncached tokens as queued prefill)
    /// is held until as many requests as there are pods have arrived after
    /// it.
    fn request_order_one(&mut self, r: usize) {
        let p = self.route(r);
        self.records[r].pod = p;
        if self.trace[r].blocks.len() > self.cfg.gpu_blocks {
            self.records[r].rejected = true;
            self.end_lease(r, false, 0);
            return;
        }
        let blocks = self.trace[r].blocks.clone();
        let cache = &mut self.pods[p].cache;
        if let Some(adm) = cache.admit(&blocks) {
            self.records[r].hit_blocks = adm.gpu_hits + adm.cpu_hits;
            cache.computed(&adm.computed);
            cache.release(&blocks);
        }
        let input = self.trace[r].input_tokens;
        let cached = (self.records[r].hit_blocks as u64 * self.cfg.block_tokens).min(input);
        if let Some(lease) = self.leases[r].as_mut() {
            lease.cached_tokens(cached);
        }
        self.window.push_back(r);
        if self.window.len() > self.pods.len() {
            if let Some(old) = self.window.pop_front() {
                self.end_lease(old, true, 0);
            }
        }
        // No timing in this mode: served the moment it arrives.
        self.records[r].first_token_ms = Some(0.0);
        self.records[r].done_ms = Some(0.0);
        self.flush_changes(p, 0);
    }

    /// Turns a pod's cache changes into events for the index, delivered
    /// after the configured delay.
    fn flush_changes(&mut self, p: usize, now: u64) {
        let changes = self.pods[p].cache.drain_changes();
        if changes.is_empty() {
            return;
        }
        let events = to_events(self.pods[p].id, &changes);
        let delay = (self.cfg.event_delay_ms * 1000.0) as u64;
        if delay == 0 || self.cfg.request_order {
            for e in &events {
                let _ = self.index.apply(e);
                for side in &self.routers {
                    side.table.observe(e);
                }
            }
        } else {
            self.pending.push(events);
            let i = self.pending.len() - 1;
            self.push(now + delay, Kind::Deliver(i));
        }
    }

    fn start_step(&mut self, p: usize, now: u64) {
        let model = &self.cfg.model;
        let bt = self.cfg.block_tokens;
        let mut cpu_loads = 0usize;
        // Admit waiting requests, oldest first, while the cache can pin them.
        while self.pods[p].running.len() < model.max_batch {
            let Some(&r) = self.pods[p].waiting.front() else {
                break;
            };
            let Some(adm) = self.pods[p].cache.admit(&self.trace[r].blocks) else {
                break;
            };
            self.pods[p].waiting.pop_front();
            let hits = adm.gpu_hits + adm.cpu_hits;
            cpu_loads += adm.cpu_hits;
            self.records[r].hit_blocks = hits;
            let input = self.trace[r].input_tokens;
            let cached_tokens = (hits as u64 * bt).min(input.saturating_sub(1));
            self.pods[p].running.push(Run {
                req: r,
                prefill_left: (input - cached_tokens).max(1),
                decoded: 0,
                computed: adm.computed,
                chunk: 0,
            });
        }
        let pod = &mut self.pods[p];
        if pod.running.is_empty() {
            pod.stepping = false;
            self.flush_changes(p, now);
            return;
        }
        let mut budget = model.token_budget;
        let mut tokens = 0u64;
        let mut attention = 0f64;
        let mut kv_read = 0f64;
        for run in pod.running.iter_mut().filter(|r| r.prefill_left == 0) {
            let ctx = self.trace[run.req].input_tokens + run.decoded;
            kv_read += ctx as f64;
            tokens += 1;
            budget = budget.saturating_sub(1);
        }
        for run in pod.running.iter_mut().filter(|r| r.prefill_left > 0) {
            let chunk = run.prefill_left.min(budget);
            run.chunk = chunk;
            budget -= chunk;
            let done_before = self.trace[run.req].input_tokens - run.prefill_left;
            attention += chunk as f64 * (done_before + chunk) as f64;
            tokens += chunk;
        }
        let step_ms = model.overhead_ms
            + model.per_token_us * tokens as f64 / 1000.0
            + model.attention_ns * attention / 1e6
            + model.kv_read_ns * kv_read / 1e6
            + model.cpu_load_ms * cpu_loads as f64;
        let step_us = (step_ms * 1000.0).max(1.0) as u64;
        pod.stepping = true;
        pod.step_started = now;
        self.push(now + step_us, Kind::StepDone(p));
        self.flush_changes(p, now);
    }

    /// Applies a finished step; returns how many requests completed.
    fn finish_step(&mut self, p: usize, now: u64) -> usize {
        let now_ms = now as f64 / 1000.0;
        let speed = if self.cfg.speedup > 0.0 {
            self.cfg.speedup
        } else {
            1.0
        };
        let pod = &mut self.pods[p];
        pod.busy_us += now - pod.step_started;
        let mut finished = Vec::new();
        let mut prefilled = Vec::new();
        for (i, run) in pod.running.iter_mut().enumerate() {
            if run.prefill_left > 0 {
                if run.chunk == 0 {
                    continue; // no budget this step
                }
                run.prefill_left -= run.chunk;
                run.chunk = 0;
                if run.prefill_left > 0 {
                    continue;
                }
                // Prefill done: first token now; its blocks are announced.
                pod.cache.computed(&run.computed);
                let arrival = self.trace[run.req].arrival_ms / speed;
                self.records[run.req].first_token_ms = Some(now_ms - arrival);
                prefilled.push(run.req);
            }
            run.decoded += 1;
            if run.decoded >= self.trace[run.req].output_tokens {
                let arrival = self.trace[run.req].arrival_ms / speed;
                self.records[run.req].done_ms = Some(now_ms - arrival);
                finished.push(i);
            }
        }
        let mut done = Vec::with_capacity(finished.len());
        for &i in finished.iter().rev() {
            let run = pod.running.swap_remove(i);
            pod.cache.release(&self.trace[run.req].blocks);
            done.push(run.req);
        }
        // What the engine reports back: the cached part of each prompt
        // prefilled (as in its usage), then the end of each request.
        let bt = self.cfg.block_tokens;
        for r in prefilled {
            let input = self.trace[r].input_tokens;
            let cached = (self.records[r].hit_blocks as u64 * bt).min(input.saturating_sub(1));
            self.first_token(r, cached, now);
        }
        for &r in &done {
            self.end_lease(r, true, now);
        }
        done.len()
    }
}

/// Groups cache changes into index events, in order.
fn to_events(pod: PodId, changes: &[CacheChange]) -> Vec<CacheEvent> {
    let mut out: Vec<CacheEvent> = Vec::new();
    for c in changes {
        let h = block_hash(c.block);
        match out.last_mut() {
            Some(CacheEvent::Stored { tier, blocks, .. }) if c.stored && *tier == c.tier => {
                blocks.push(h)
            }
            Some(CacheEvent::Removed { tier, blocks, .. }) if !c.stored && *tier == c.tier => {
                blocks.push(h)
            }
            _ => out.push(if c.stored {
                CacheEvent::Stored {
                    pod,
                    tier: c.tier,
                    blocks: vec![h],
                }
            } else {
                CacheEvent::Removed {
                    pod,
                    tier: c.tier,
                    blocks: vec![h],
                }
            }),
        }
    }
    out
}

/// Hit rates a placement could not beat: one pooled cache with the whole
/// cluster's GPU capacity, and an infinite cache (every block seen before).
/// Returns `(pooled, infinite)` block hit rates, replayed in request order.
pub fn bounds(trace: &[Request], cfg: &ClusterConfig) -> (f64, f64) {
    let mut pooled = BlockCache::new(cfg.gpu_blocks * cfg.pods, cfg.cpu_blocks * cfg.pods);
    let mut seen: HashSet<u64> = HashSet::new();
    let (mut total, mut pooled_hits, mut inf_hits) = (0usize, 0usize, 0usize);
    for req in trace {
        total += req.blocks.len();
        inf_hits += req.blocks.iter().take_while(|b| seen.contains(b)).count();
        seen.extend(req.blocks.iter().copied());
        if let Some(adm) = pooled.admit(&req.blocks) {
            pooled_hits += adm.gpu_hits + adm.cpu_hits;
            pooled.release(&req.blocks);
        }
        pooled.drain_changes();
    }
    let t = total.max(1) as f64;
    (pooled_hits as f64 / t, inf_hits as f64 / t)
}
