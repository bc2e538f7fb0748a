//! Engines' `/metrics` text: vLLM's and SGLang's names, data-parallel
//! endpoints, and bad input.

use proptest::prelude::*;
use router_events::{EngineMetrics, MetricsError, parse_engine_metrics};

/// The shape of a vLLM v1 server's `/metrics` (abridged: the series a
/// router reads, among others it must skip).
const VLLM: &str = r#"# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-0.6B"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.4375
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 9216.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",cpu_offload_gb="0",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="2048",prefix_caching_hash_algo="sha256"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-0.6B"} 0.0
"#;

#[test]
fn a_vllm_servers_metrics_give_its_capacity_usage_and_queue() {
    let m = parse_engine_metrics(VLLM).unwrap();
    assert_eq!(m.running, Some(3));
    assert_eq!(m.waiting, Some(2));
    assert_eq!(m.kv_usage, Some(0.4375));
    assert_eq!(m.gpu_blocks, Some(2048));
    assert_eq!(m.block_size, Some(16));
    assert_eq!(m.capacity_blocks(16), Some(2048));
}

#[test]
fn data_parallel_engines_are_summed_and_their_usage_averaged() {
    let text = r#"vllm:num_requests_running{engine="0"} 3
vllm:num_requests_running{engine="1"} 5
vllm:num_requests_waiting{engine="0"} 0
vllm:num_requests_waiting{engine="1"} 4
vllm:kv_cache_usage_perc{engine="0"} 0.25
vllm:kv_cache_usage_perc{engine="1"} 0.75
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="1000"} 1.0
"#;
    let m = parse_engine_metrics(text).unwrap();
    assert_eq!((m.running, m.waiting), (Some(8), Some(4)));
    assert_eq!(m.kv_usage, Some(0.5));
    assert_eq!(m.gpu_blocks, Some(2000));
}

#[test]
fn sglangs_names_are_read_and_its_token_capacity_becomes_blocks() {
    let text = r#"# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.5
sglang:num_running_reqs{model_name="m"} 7
sglang:num_queue_reqs{model_name="m"} 1
sglang:max_total_num_tokens{model_name="m"} 65536
"#;
    let m = parse_engine_metrics(text).unwrap();
    assert_eq!(
        (m.running, m.waiting, m.kv_usage),
        (Some(7), Some(1), Some(0.5))
    );
    assert_eq!(m.gpu_blocks, None);
    assert_eq!(m.capacity_blocks(16), Some(4096));
}

#[test]
fn an_engine_that_reports_nothing_known_gives_an_empty_report() {
    let m = parse_engine_metrics("# nothing\nother_metric 3\n\n").unwrap();
    assert_eq!(m, EngineMetrics::default());
    assert_eq!(m.capacity_blocks(16), None);
}

#[test]
fn a_known_metric_with_a_bad_value_names_its_line() {
    for (text, line) in [
        ("x 1\nvllm:num_requests_running{engine=\"0\"} NaN\n", 2),
        ("vllm:kv_cache_usage_perc 1.5\n", 1),
        ("vllm:num_requests_waiting -1\n", 1),
        ("vllm:num_requests_waiting{engine=\"0\"\n", 1),
        ("\n\nvllm:cache_config_info{num_gpu_blocks=\"lots\"} 1\n", 3),
    ] {
        match parse_engine_metrics(text) {
            Err(MetricsError::Line { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
            other => panic!("{text:?} gave {other:?}"),
        }
    }
}

proptest! {
    /// What an engine would print parses back to what it reported, among
    /// unrelated series and comments.
    #[test]
    fn rendered_reports_parse_back(
        engines in prop::collection::vec((0u64..1000, 0u64..1000, 0u32..=1000, 1u64..100_000), 1..4),
        block in 1u64..64,
        noise in "[a-z_]{1,12}",
    ) {
        let mut text = String::new();
        for (i, (run, wait, usage, blocks)) in engines.iter().enumerate() {
            text += &format!("# HELP {noise} help text\n{noise}{{engine=\"{i}\"}} 17\n");
            text += &format!("vllm:num_requests_running{{engine=\"{i}\",model_name=\"m\"}} {run}.0\n");
            text += &format!("vllm:num_requests_waiting{{engine=\"{i}\",model_name=\"m\"}} {wait}\n");
            text += &format!("vllm:kv_cache_usage_perc{{engine=\"{i}\"}} {}\n", f64::from(*usage) / 1000.0);
            text += &format!("vllm:cache_config_info{{block_size=\"{block}\",engine=\"{i}\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{blocks}\"}} 1.0\n");
        }
        let m = parse_engine_metrics(&text).unwrap();
        prop_assert_eq!(m.running, Some(engines.iter().map(|e| e.0).sum()));
        prop_assert_eq!(m.waiting, Some(engines.iter().map(|e| e.1).sum()));
        prop_assert_eq!(m.gpu_blocks, Some(engines.iter().map(|e| e.3).sum()));
        prop_assert_eq!(m.block_size, Some(block));
        let mean = engines.iter().map(|e| f64::from(e.2) / 1000.0).sum::<f64>() / engines.len() as f64;
        prop_assert!((m.kv_usage.unwrap() - mean).abs() < 1e-9);
    }

    /// Any text gives a report or an error, never a panic.
    #[test]
    fn any_text_is_a_report_or_an_error(text in "(vllm:[a-z_]{0,24}|sglang:[a-z_]{0,20}|[{}=\",0-9. \n#a-z\\\\-]){0,60}") {
        let _ = parse_engine_metrics(&text);
    }
}
