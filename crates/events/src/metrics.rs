//! What an engine reports about itself on `GET /metrics` (Prometheus text
//! exposition): its KV capacity and usage and its queue, under vLLM's and
//! SGLang's names.
//!
//! vLLM (v1):
//!
//! ```text
//! vllm:cache_config_info{block_size="16",num_gpu_blocks="2048",...} 1.0
//! vllm:kv_cache_usage_perc{engine="0",model_name="..."} 0.42
//! vllm:num_requests_running{engine="0",model_name="..."} 3.0
//! vllm:num_requests_waiting{engine="0",model_name="..."} 1.0
//! ```
//!
//! SGLang: `sglang:token_usage` (a fraction), `sglang:num_running_reqs`,
//! `sglang:num_queue_reqs`, `sglang:max_total_num_tokens` (its capacity in
//! tokens). Older vLLM names (`vllm:gpu_cache_usage_perc`) are read too.
//!
//! With data parallelism an endpoint reports one series per engine: the
//! counts are summed, the usage averaged, and `num_gpu_blocks` summed over
//! the engines' `cache_config_info` series.
//!
//! The parser is total: any text gives a report or a [`MetricsError`]
//! naming the line, never a panic; unknown metrics and comments are
//! skipped; a known metric whose value is not a finite, non-negative
//! number is an error (a report built on it would be wrong, not partial).

/// The figures an engine's `/metrics` gave (`None`: not reported).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct EngineMetrics {
    /// Fraction of KV blocks held by running requests, `0..=1`.
    pub kv_usage: Option<f64>,
    /// Requests running (scheduled).
    pub running: Option<u64>,
    /// Requests waiting to be scheduled.
    pub waiting: Option<u64>,
    /// GPU KV blocks (vLLM's `num_gpu_blocks`).
    pub gpu_blocks: Option<u64>,
    /// Tokens per block (vLLM's `block_size`).
    pub block_size: Option<u64>,
    /// The KV capacity in tokens (SGLang's `max_total_num_tokens`).
    pub capacity_tokens: Option<u64>,
}

impl EngineMetrics {
    /// GPU KV blocks of `block_size` tokens: vLLM's own count, else
    /// SGLang's token capacity divided by `block_size`.
    pub fn capacity_blocks(&self, block_size: u64) -> Option<u64> {
        self.gpu_blocks
            .or_else(|| Some(self.capacity_tokens? / block_size.max(1)))
            .filter(|&b| b > 0)
    }
}

/// Why an engine's metrics text was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    /// A known metric's line could not be read.
    #[error("engine metrics line {line}: {what}")]
    Line {
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        what: &'static str,
    },
    /// The answer was longer than a reader takes.
    #[error("engine metrics longer than {limit} bytes")]
    TooLarge {
        /// The limit, bytes.
        limit: usize,
    },
}

#[derive(Clone, Copy)]
enum Field {
    Usage,
    Running,
    Waiting,
    CacheInfo,
    CapacityTokens,
}

fn field(name: &str) -> Option<Field> {
    Some(match name {
        "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" | "sglang:token_usage" => {
            Field::Usage
        }
        "vllm:num_requests_running" | "sglang:num_running_reqs" => Field::Running,
        "vllm:num_requests_waiting" | "sglang:num_queue_reqs" => Field::Waiting,
        "vllm:cache_config_info" => Field::CacheInfo,
        "sglang:max_total_num_tokens" => Field::CapacityTokens,
        _ => return None,
    })
}

/// Reads a metric line `name{labels} value [timestamp]` into its name,
/// its label text (between the braces) and its value text.
fn split(line: &str) -> Option<(&str, &str, &str)> {
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..name_end];
    let rest = &line[name_end..];
    let (labels, rest) = match rest.strip_prefix('{') {
        Some(r) => {
            let close = closing_brace(r)?;
            (&r[..close], &r[close + 1..])
        }
        None => ("", rest),
    };
    let value = rest.split_ascii_whitespace().next()?;
    Some((name, labels, value))
}

/// The position of the `}` closing a label set, skipping quoted values.
fn closing_brace(s: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match (quoted, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (true, false, '"') => quoted = false,
            (false, _, '"') => quoted = true,
            (false, _, '}') => return Some(i),
            _ => {}
        }
    }
    None
}

/// The value of label `key` in a label set, as written (no unescaping: the
/// labels read here are numbers).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while !rest.is_empty() {
        let eq = rest.find('=')?;
        let k = rest[..eq].trim().trim_start_matches(',').trim();
        let after = rest[eq + 1..].trim_start().strip_prefix('"')?;
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end?;
        if k == key {
            return Some(&after[..end]);
        }
        rest = &after[end + 1..];
    }
    None
}

fn number(text: &str) -> Option<f64> {
    let v: f64 = text.parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some(v)
}

fn count(v: f64) -> u64 {
    // A gauge of requests is a whole number; saturate rather than wrap.
    v.round().min(u64::MAX as f64) as u64
}

/// Adds `v` to a sum that may not have started yet.
fn add(sum: &mut Option<u64>, v: u64) {
    *sum = Some(sum.unwrap_or(0).saturating_add(v));
}

/// Reads an engine's `/metrics` text.
pub fn parse_engine_metrics(text: &str) -> Result<EngineMetrics, MetricsError> {
    let mut out = EngineMetrics::default();
    let (mut usage_sum, mut usage_n) = (0.0, 0u32);
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
        let Some(f) = field(&line[..name_end]) else {
            continue;
        };
        let bad = |what| MetricsError::Line { line: i + 1, what };
        let (_, labels, value) = split(line).ok_or(bad("no value after the name"))?;
        let v = number(value).ok_or(bad("the value is not a non-negative number"))?;
        match f {
            Field::Usage => {
                if v > 1.0 {
                    return Err(bad("a usage fraction above 1"));
                }
                usage_sum += v;
                usage_n += 1;
            }
            Field::Running => add(&mut out.running, count(v)),
            Field::Waiting => add(&mut out.waiting, count(v)),
            Field::CapacityTokens => add(&mut out.capacity_tokens, count(v)),
            Field::CacheInfo => {
                let int = |key| -> Result<Option<u64>, MetricsError> {
                    match label(labels, key) {
                        None | Some("None") => Ok(None),
                        Some(s) => s
                            .parse::<u64>()
                            .map(Some)
                            .map_err(|_| bad("a cache_config_info label is not a whole number")),
                    }
                };
                if let Some(b) = int("num_gpu_blocks")? {
                    add(&mut out.gpu_blocks, b);
                }
                if let Some(b) = int("block_size")? {
                    out.block_size = Some(b);
                }
            }
        }
    }
    if usage_n > 0 {
        out.kv_usage = Some(usage_sum / f64::from(usage_n));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_read_past_quoted_braces_and_commas() {
        let l = r#"a="x,}y",num_gpu_blocks="12",b="\"q\"""#;
        assert_eq!(label(l, "num_gpu_blocks"), Some("12"));
        assert_eq!(label(l, "a"), Some("x,}y"));
        assert_eq!(label(l, "b"), Some(r#"\"q\""#));
        assert_eq!(label(l, "c"), None);
    }
}
