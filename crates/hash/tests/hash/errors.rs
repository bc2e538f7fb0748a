//! Bad input yields typed errors that name what was wrong, never a panic.

use router_hash::{ChainHasher, ChatInput, ChatTemplate, Error, ModelTokenizer};
use serde_json::{Map, json};

#[test]
fn zero_block_size_is_refused() {
    assert!(matches!(ChainHasher::new(0), Err(Error::ZeroBlockSize)));
}

#[test]
fn missing_tokenizer_file_names_the_path() {
    let err = ModelTokenizer::from_dir("/nonexistent/model").unwrap_err();
    match &err {
        Error::Io { path, .. } => assert!(path.ends_with("tokenizer.json")),
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        err.to_string()
            .contains("/nonexistent/model/tokenizer.json")
    );
}

#[test]
fn malformed_tokenizer_and_config_are_typed() {
    let err = ModelTokenizer::from_bytes(b"{\"not\": \"a tokenizer\"}", None).unwrap_err();
    assert!(matches!(err, Error::MalformedTokenizer { .. }), "{err:?}");
    let good =
        std::fs::read(super::repo_root().join("assets/tokenizers/gpt2/tokenizer.json")).unwrap();
    let err = ModelTokenizer::from_bytes(&good, Some(b"[1, 2")).unwrap_err();
    assert!(matches!(err, Error::MalformedConfig { .. }), "{err:?}");
    let err = ModelTokenizer::from_bytes(&good, Some(b"{\"chat_template\": 5}")).unwrap_err();
    assert!(err.to_string().contains("chat_template"), "{err}");
}

#[test]
fn template_errors_are_typed() {
    let err = ChatTemplate::new("{% if %}", Map::new()).unwrap_err();
    assert!(matches!(err, Error::TemplateSyntax(_)), "{err:?}");
    let t = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok",
        Map::new(),
    )
    .unwrap();
    let err = t
        .render(&ChatInput::new(vec![
            json!({"role": "assistant", "content": "x"}),
        ]))
        .unwrap_err();
    assert!(matches!(err, Error::TemplateRender(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("first message must be from the user"),
        "{err}"
    );
}

#[test]
fn malformed_messages_are_typed() {
    let t = ChatTemplate::new("{{ messages|length }}", Map::new()).unwrap();
    let err = t
        .render(&ChatInput::new(vec![json!("just a string")]))
        .unwrap_err();
    assert!(
        matches!(err, Error::MalformedMessage { index: 0, .. }),
        "{err:?}"
    );
    let err = t
        .render(&ChatInput::new(vec![
            json!({"role": "user", "content": "x"}),
            json!({"content": "y"}),
        ]))
        .unwrap_err();
    assert!(
        matches!(err, Error::MalformedMessage { index: 1, .. }),
        "{err:?}"
    );
}

#[test]
fn gpt2_has_no_chat_template() {
    let tok = ModelTokenizer::from_dir(super::repo_root().join("assets/tokenizers/gpt2")).unwrap();
    assert!(!tok.has_chat_template());
    let err = tok.render_chat(&ChatInput::new(vec![
        json!({"role": "user", "content": "x"}),
    ]));
    assert!(matches!(err, Err(Error::NoChatTemplate)));
}

#[test]
fn out_of_vocabulary_ids_are_typed() {
    let tok = ModelTokenizer::from_dir(super::repo_root().join("assets/tokenizers/gpt2")).unwrap();
    assert_eq!(tok.vocab_size(), 50257);
    assert!(tok.check_ids(&[0, 50256]).is_ok());
    match tok.check_ids(&[1, 2, 50257]) {
        Err(Error::TokenOutOfVocab {
            id: 50257,
            position: 2,
            vocab_size: 50257,
        }) => {}
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        tok.decode(&[u32::MAX], false),
        Err(Error::TokenOutOfVocab { .. })
    ));
    assert_eq!(
        tok.decode(&tok.encode("hello world", false).unwrap(), false)
            .unwrap(),
        "hello world"
    );
}

#[test]
fn template_errors_name_the_message_and_the_template_line() {
    let tok = ModelTokenizer::from_dir(super::repo_root().join("assets/tokenizers/qwen3")).unwrap();
    // A tool call without `arguments` in the fourth message: Qwen3's
    // template cannot serialise it.
    let messages = vec![
        json!({"role": "system", "content": "s"}),
        json!({"role": "user", "content": "weather?"}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather"}}]}),
        json!({"role": "user", "content": "and then?"}),
    ];
    let err = tok.render_chat(&ChatInput::new(messages)).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::TemplateRender(_)), "{err:?}");
    assert!(text.contains("at message 3 (assistant)"), "{text}");
    assert!(
        text.contains("arguments"),
        "the template line names the field: {text}"
    );
    assert!(text.contains("not JSON serializable"), "{text}");
    // A failure that only the whole conversation has names its last
    // message.
    let t = ChatTemplate::new(
        "{% if messages|length > 2 %}{{ raise_exception('too long') }}{% endif %}ok",
        Map::new(),
    )
    .unwrap();
    let three = vec![json!({"role": "user", "content": "a"}); 3];
    let text = t.render(&ChatInput::new(three)).unwrap_err().to_string();
    assert!(
        text.contains("at message 2 (user)") && text.contains("too long"),
        "{text}"
    );
}
