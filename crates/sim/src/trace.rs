//! Request traces: the Mooncake format and a synthetic generator.

use serde_json::Value;

/// Tokens per trace block in the Mooncake format.
pub const MOONCAKE_BLOCK_TOKENS: u64 = 512;

/// One request of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// Arrival time in milliseconds from the trace's start.
    pub arrival_ms: f64,
    /// Prompt length in tokens.
    pub input_tokens: u64,
    /// Tokens to generate.
    pub output_tokens: u64,
    /// Prefix-chained block ids: equal ids mean equal prefixes.
    pub blocks: Vec<u64>,
    /// The conversation the request belongs to, when the trace says
    /// (Mooncake traces do not: a shared first block is a shared system
    /// prompt, not one conversation, so no session is inferred from it).
    pub session: Option<u64>,
}

/// A trace line that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("trace line {line}: {message}")]
pub struct TraceError {
    /// 1-based line number.
    pub line: usize,
    /// What was wrong.
    pub message: String,
}

fn field_u64(v: &Value, name: &str) -> Result<u64, String> {
    match v.get(name) {
        None => Err(format!("missing field `{name}`")),
        Some(x) => x
            .as_u64()
            .ok_or_else(|| format!("`{name}` must be a non-negative integer, got {x}")),
    }
}

/// Parses a Mooncake trace (JSON lines of `timestamp` ms, `input_length`,
/// `output_length`, `hash_ids`). Blank lines are skipped; anything else
/// that is wrong (bad JSON, missing or non-numeric fields, timestamps going
/// backwards, an empty `hash_ids`) is an error naming the line.
pub fn parse_mooncake(text: &str) -> Result<Vec<Request>, TraceError> {
    let mut out = Vec::new();
    let mut last_ts = 0.0f64;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let err = |message: String| TraceError {
            line: line_no,
            message,
        };
        let v: Value = serde_json::from_str(line).map_err(|e| err(format!("not JSON: {e}")))?;
        let ts = match v.get("timestamp") {
            None => return Err(err("missing field `timestamp`".into())),
            Some(t) => t
                .as_f64()
                .filter(|t| t.is_finite() && *t >= 0.0)
                .ok_or_else(|| {
                    err(format!(
                        "`timestamp` must be a non-negative number, got {t}"
                    ))
                })?,
        };
        if ts < last_ts {
            return Err(err(format!(
                "timestamp {ts} is earlier than the previous line's {last_ts}"
            )));
        }
        last_ts = ts;
        let input = field_u64(&v, "input_length").map_err(err)?;
        let output = field_u64(&v, "output_length").map_err(err)?;
        let ids = match v.get("hash_ids") {
            Some(Value::Array(a)) => a,
            Some(x) => return Err(err(format!("`hash_ids` must be an array, got {x}"))),
            None => return Err(err("missing field `hash_ids`".into())),
        };
        let mut blocks = Vec::with_capacity(ids.len());
        for id in ids {
            blocks.push(
                id.as_u64()
                    .ok_or_else(|| err(format!("`hash_ids` holds a non-numeric id {id}")))?,
            );
        }
        if blocks.is_empty() {
            return Err(err("`hash_ids` is empty".into()));
        }
        out.push(Request {
            arrival_ms: ts,
            input_tokens: input,
            output_tokens: output.max(1),
            session: None,
            blocks,
        });
    }
    Ok(out)
}

/// The shape of a synthetic workload.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SyntheticParams {
    /// Requests to generate.
    pub requests: usize,
    /// Mean arrival rate, requests per second.
    pub rate_per_s: f64,
    /// Distinct system prompts, shared across sessions.
    pub system_prompts: usize,
    /// Blocks per system prompt.
    pub system_blocks: usize,
    /// Tool-description blocks appended to some system prompts.
    pub tool_blocks: usize,
    /// Distinct RAG documents.
    pub documents: usize,
    /// Blocks per document.
    pub document_blocks: usize,
    /// Share of requests that carry a document.
    pub rag_share: f64,
    /// Mean turns per conversation.
    pub turns: usize,
    /// New blocks each turn adds (the user message and the previous answer).
    pub turn_blocks: usize,
    /// Tokens per block.
    pub block_tokens: u64,
    /// Mean output tokens.
    pub output_tokens: u64,
}

impl Default for SyntheticParams {
    fn default() -> Self {
        SyntheticParams {
            requests: 2000,
            rate_per_s: 4.0,
            system_prompts: 8,
            system_blocks: 4,
            tool_blocks: 4,
            documents: 64,
            document_blocks: 8,
            rag_share: 0.3,
            turns: 4,
            turn_blocks: 2,
            block_tokens: MOONCAKE_BLOCK_TOKENS,
            output_tokens: 200,
        }
    }
}

/// A deterministic generator (SplitMix64).
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed ^ 0x05EE_D0FC_AC4E)
    }

    pub(crate) fn next(&mut self) -> u64 {
        // SplitMix64.
        self.0 = self.0.wrapping_add(router_core::GOLDEN_GAMMA);
        router_core::mix64(self.0)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub(crate) fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Generates a trace of multi-turn conversations on shared system prompts
/// (some with tool descriptions) and RAG documents. Block ids are
/// prefix-chained: a block's id is a hash of its parent's id and its
/// content, as in the Mooncake format.
pub fn synthetic(p: &SyntheticParams, seed: u64) -> Vec<Request> {
    let mut rng = Rng::new(seed);
    let chain = |parent: u64, content: u64| -> u64 {
        let mut r = Rng::new(parent.rotate_left(17) ^ content);
        r.next() >> 1
    };
    struct Session {
        id: u64,
        blocks: Vec<u64>,
        turns_left: usize,
    }
    let mut open: Vec<Session> = Vec::new();
    let mut out = Vec::with_capacity(p.requests);
    let mut t = 0.0;
    let mut next_session = 1u64;
    while out.len() < p.requests {
        t += -(1.0 - rng.unit()).ln() / p.rate_per_s.max(1e-9) * 1000.0;
        // Continue an open conversation half the time, else start one.
        let idx = if !open.is_empty() && rng.below(2) == 0 {
            rng.below(open.len() as u64) as usize
        } else {
            let sys = rng.below(p.system_prompts.max(1) as u64);
            let mut blocks = Vec::new();
            let mut parent = 0;
            for b in 0..p.system_blocks {
                parent = chain(parent, 1 << 40 | sys << 16 | b as u64);
                blocks.push(parent);
            }
            if sys % 2 == 0 {
                for b in 0..p.tool_blocks {
                    parent = chain(parent, 2 << 40 | sys << 16 | b as u64);
                    blocks.push(parent);
                }
            }
            if rng.unit() < p.rag_share {
                let doc = rng.below(p.documents.max(1) as u64);
                for b in 0..p.document_blocks {
                    parent = chain(parent, 3 << 40 | doc << 16 | b as u64);
                    blocks.push(parent);
                }
            }
            open.push(Session {
                id: next_session,
                blocks,
                turns_left: 1 + rng.below(2 * p.turns.max(1) as u64) as usize,
            });
            next_session += 1;
            open.len() - 1
        };
        let s = &mut open[idx];
        for _ in 0..p.turn_blocks {
            let parent = *s.blocks.last().unwrap_or(&0);
            let id = chain(parent, 4 << 40 | rng.next() >> 24);
            s.blocks.push(id);
        }
        let input = s.blocks.len() as u64 * p.block_tokens - rng.below(p.block_tokens / 2);
        out.push(Request {
            arrival_ms: t,
            input_tokens: input,
            output_tokens: 1 + rng.below(2 * p.output_tokens.max(1)),
            blocks: s.blocks.clone(),
            session: Some(s.id),
        });
        s.turns_left -= 1;
        if s.turns_left == 0 {
            open.swap_remove(idx);
        }
    }
    out
}
