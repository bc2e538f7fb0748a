//! Token ids and rendered chat prompts against the Python reference stack
//! (`transformers` + `tokenizers` + `jinja2`), recorded by
//! scripts/gen_parity_golden.py.

use router_hash::{ChatInput, ModelTokenizer};
use serde_json::Value;

fn golden(model: &str) -> Value {
    let text = std::fs::read_to_string(super::data(&format!("parity_{model}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn tokenizer(model: &str) -> ModelTokenizer {
    ModelTokenizer::from_dir(super::repo_root().join("assets/tokenizers").join(model)).unwrap()
}

fn check_text_cases(model: &str) {
    let tok = tokenizer(model);
    let g = golden(model);
    let cases = g["text_cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "{model}: golden file lost cases");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let add = case["add_special_tokens"].as_bool().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let got = tok.encode(case["text"].as_str().unwrap(), add).unwrap();
        assert_eq!(got, want, "{model}/{name} (add_special_tokens={add})");
    }
}

#[test]
fn qwen3_text_ids_match_python() {
    check_text_cases("qwen3");
}

#[test]
fn gpt2_text_ids_match_python() {
    check_text_cases("gpt2");
}

/// The chat input a golden case describes.
fn case_input(case: &Value) -> ChatInput {
    let messages = case["messages"].as_array().unwrap().clone();
    let mut input = ChatInput::new(messages)
        .with_generation_prompt(case["add_generation_prompt"].as_bool().unwrap());
    if let Some(tools) = case["tools"].as_array() {
        input = input.with_tools(tools.clone());
    }
    for (k, v) in case["kwargs"].as_object().unwrap() {
        input = input.with_kwarg(k.clone(), v.clone());
    }
    if let Some(field) = case["continue_final_message"].as_str() {
        input = input.continue_final(field);
    }
    input
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn qwen3_chat_prompts_and_ids_match_transformers() {
    let tok = tokenizer("qwen3");
    let g = golden("qwen3");
    let cases = g["chat_cases"].as_array().unwrap();
    assert!(cases.len() >= 12, "golden file lost chat cases");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let input = case_input(case);
        let prompt = tok.render_chat(&input).unwrap();
        assert_eq!(prompt, case["prompt"].as_str().unwrap(), "{name}: prompt");
        assert_eq!(
            tok.encode_chat(&input).unwrap(),
            ids(&case["ids"]),
            "{name}: ids"
        );
    }
}

#[test]
fn qwen3_control_tokens_are_the_ones_transformers_finds_in_the_template() {
    let tok = tokenizer("qwen3");
    let mut got = tok.control_tokens().to_vec();
    got.sort();
    let want: Vec<String> =
        serde_json::from_value(golden("qwen3")["control_tokens"].clone()).unwrap();
    assert_eq!(got, want);
    // The thinking and tool tokens are not special: they are control tokens
    // because the template writes them.
    assert!(got.iter().any(|t| t == "<think>") && got.iter().any(|t| t == "<tool_call>"));
}

#[test]
fn qwen3_sanitized_chats_match_transformers() {
    let tok = tokenizer("qwen3");
    let g = golden("qwen3");
    let cases = g["sanitize_cases"].as_array().unwrap();
    assert!(cases.len() >= 6, "golden file lost sanitize cases");
    let mut differ = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let input = case_input(case);
        let plain = tok.encode_chat(&input).unwrap();
        assert_eq!(
            plain,
            ids(&case["unsanitized_ids"]),
            "{name}: unsanitized ids"
        );
        let sanitized = input.sanitized();
        assert_eq!(
            tok.encode_chat(&sanitized).unwrap(),
            ids(&case["ids"]),
            "{name}: ids"
        );
        differ += usize::from(plain != ids(&case["ids"]));
        // Rendering to text cannot honour it, as transformers refuses it.
        assert!(tok.render_chat(&sanitized).is_err(), "{name}");
    }
    assert!(differ >= 5, "the cases must exercise sanitizing");
}

#[test]
fn continue_final_message_is_refused_where_transformers_refuses_it() {
    let tok = tokenizer("qwen3");
    let user = serde_json::json!({"role": "user", "content": "Hi"});
    // An empty conversation: a clear error, not the template's undefined value.
    let e = tok
        .render_chat(&ChatInput::new(vec![]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no messages"), "{e}");
    // With a generation prompt.
    let mut both = ChatInput::new(vec![user.clone()]).continue_final("content");
    both.add_generation_prompt = true;
    let e = tok.render_chat(&both).unwrap_err().to_string();
    assert!(e.contains("not compatible"), "{e}");
    // A field the final message lacks, or the template never reads.
    let e = tok
        .render_chat(&ChatInput::new(vec![user.clone()]).continue_final("reasoning_content"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no \"reasoning_content\""), "{e}");
    let odd = serde_json::json!({"role": "user", "content": "Hi", "mood": "calm"});
    let e = tok
        .render_chat(&ChatInput::new(vec![odd]).continue_final("mood"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not read it"), "{e}");
}

#[test]
fn literal_special_tokens_in_messages_become_control_ids() {
    let tok = tokenizer("qwen3");
    let im_end = tok.encode("<|im_end|>", false).unwrap();
    assert_eq!(im_end, vec![151645], "<|im_end|> is one control token");
    let input = ChatInput::new(vec![
        serde_json::json!({"role": "user", "content": "a <|im_end|> b"}),
    ]);
    let ids = tok.encode_chat(&input).unwrap();
    assert_eq!(ids.iter().filter(|&&t| t == 151645).count(), 2);
}

#[test]
fn content_parts_render_like_plain_text() {
    let tok = tokenizer("qwen3");
    let parts = ChatInput::new(vec![serde_json::json!({
        "role": "user",
        "content": [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    })]);
    let plain = ChatInput::new(vec![
        serde_json::json!({"role": "user", "content": "first\nsecond"}),
    ]);
    assert_eq!(
        tok.render_chat(&parts).unwrap(),
        tok.render_chat(&plain).unwrap()
    );
}
