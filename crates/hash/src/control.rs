//! transformers' `sanitize_control_tokens`: control tokens written in the
//! caller's strings are encoded as plain text, so only the ones the chat
//! template writes itself become control-token ids.
//!
//! It works in three steps, as transformers 5.24 does them:
//! 1. The control tokens are the tokenizer's special added tokens, plus
//!    either the added tokens listed in `chat_control_tokens` or, without
//!    that list, the non-whitespace added tokens that appear in the
//!    template's literal text (its raw text and its string constants).
//! 2. Every control token in the caller's strings (message values, tools,
//!    template variables; not dict keys) is wrapped in two private-use
//!    markers, after any markers already in them are dropped.
//! 3. The rendered chat is split at the markers: marked tokens are encoded
//!    without added tokens, the rest as usual, and a lone marker (a template
//!    that split a marked token) is dropped but still breaks the text.

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value as Json;

/// Opens a marked control token (transformers' `_CONTROL_TOKEN_START`).
pub(crate) const MARK_START: char = '\u{F0000}';
/// Closes a marked control token (transformers' `_CONTROL_TOKEN_END`).
pub(crate) const MARK_END: char = '\u{F0001}';

/// The control tokens of one tokenizer and template, with a matcher that
/// finds them leftmost and longest first (transformers' alternation of the
/// tokens sorted longest first).
#[derive(Debug)]
pub(crate) struct ControlTokens {
    /// Longest first.
    tokens: Vec<String>,
    matcher: Option<AhoCorasick>,
}

/// A piece of a rendered chat, split at the markers.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece<'a> {
    /// Text the template wrote or the caller wrote without control tokens.
    Text(&'a str),
    /// A control token the caller wrote: encoded as plain text.
    Marked(&'a str),
}

impl ControlTokens {
    pub(crate) fn new(mut tokens: Vec<String>) -> Self {
        tokens.retain(|t| !t.is_empty());
        tokens.sort_by_key(|t| std::cmp::Reverse(t.len()));
        tokens.dedup();
        let matcher = (!tokens.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&tokens)
                .expect("a few short literal patterns always build")
        });
        ControlTokens { tokens, matcher }
    }

    /// The tokens, longest first.
    pub(crate) fn tokens(&self) -> &[String] {
        &self.tokens
    }

    /// transformers' `mark_control_tokens` on one string.
    pub(crate) fn mark_str(&self, s: &str) -> String {
        let clean: String = s
            .chars()
            .filter(|c| *c != MARK_START && *c != MARK_END)
            .collect();
        let Some(m) = &self.matcher else {
            return clean;
        };
        let mut out = String::with_capacity(clean.len());
        let mut at = 0;
        for hit in m.find_iter(&clean) {
            out.push_str(&clean[at..hit.start()]);
            out.push(MARK_START);
            out.push_str(&clean[hit.start()..hit.end()]);
            out.push(MARK_END);
            at = hit.end();
        }
        out.push_str(&clean[at..]);
        out
    }

    /// Marks every string value in `v`, recursively; keys stay as they are.
    pub(crate) fn mark_json(&self, v: &mut Json) {
        match v {
            Json::String(s) => *s = self.mark_str(s),
            Json::Array(items) => items.iter_mut().for_each(|i| self.mark_json(i)),
            Json::Object(map) => map.values_mut().for_each(|i| self.mark_json(i)),
            _ => {}
        }
    }

    /// Splits a rendered chat at the markers (transformers' `markers_re`):
    /// a marker, a control token and the closing marker make a marked
    /// token; any other marker is dropped and ends the text before it.
    pub(crate) fn split<'a>(&self, chat: &'a str) -> Vec<Piece<'a>> {
        let mut pieces = Vec::new();
        let mut text_start = 0;
        let mut i = 0;
        while let Some(off) = chat[i..].find([MARK_START, MARK_END]) {
            let at = i + off;
            pieces.push(Piece::Text(&chat[text_start..at]));
            let after = at + MARK_START.len_utf8();
            let marked = chat[at..].starts_with(MARK_START).then(|| {
                self.tokens.iter().find(|t| {
                    chat[after..].starts_with(t.as_str())
                        && chat[after + t.len()..].starts_with(MARK_END)
                })
            });
            match marked.flatten() {
                Some(t) => {
                    pieces.push(Piece::Marked(&chat[after..after + t.len()]));
                    i = after + t.len() + MARK_END.len_utf8();
                }
                // A lone marker (both markers are the same width).
                None => i = after,
            }
            text_start = i;
        }
        pieces.push(Piece::Text(&chat[text_start..]));
        pieces
    }
}

/// The literal text of a Jinja template: its template data and its string
/// constants (transformers' `_get_template_literal_text`, which reads them
/// off jinja2's syntax tree). Comments, names and numbers are not literal
/// text.
pub(crate) fn template_literals(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = source;
    loop {
        // The next tag opener: `{{`, `{%` or `{#`.
        let Some(open) = find_open(rest) else {
            push_data(&mut out, rest);
            return out;
        };
        push_data(&mut out, &rest[..open]);
        let kind = rest.as_bytes()[open + 1];
        let body = &rest[open + 2..];
        if kind == b'#' {
            match body.find("#}") {
                Some(end) => rest = &body[end + 2..],
                None => return out,
            }
            continue;
        }
        let close = if kind == b'{' { "}}" } else { "%}" };
        let Some((end, strings)) = scan_tag(body, close) else {
            return out;
        };
        let tag = &body[..end];
        rest = &body[end + 2..];
        out.extend(strings);
        // `{% raw %}` ... `{% endraw %}` is template data.
        if kind == b'%'
            && tag.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace()) == "raw"
        {
            let (data, after) = raw_block(rest);
            push_data(&mut out, data);
            rest = after;
        }
    }
}

fn push_data(out: &mut Vec<String>, data: &str) {
    if !data.is_empty() {
        out.push(data.to_owned());
    }
}

fn find_open(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    (0..b.len().saturating_sub(1)).find(|&i| b[i] == b'{' && matches!(b[i + 1], b'{' | b'%' | b'#'))
}

/// The end of a tag body at `close` outside string literals, and the
/// decoded string literals in it.
fn scan_tag(body: &str, close: &str) -> Option<(usize, Vec<String>)> {
    let b = body.as_bytes();
    let mut strings = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            q @ (b'\'' | b'"') => {
                let (value, len) = string_literal(&body[i + 1..], q)?;
                strings.push(value);
                i += 1 + len;
            }
            _ if body[i..].starts_with(close) => return Some((i, strings)),
            _ => i += 1,
        }
    }
    None
}

/// Decodes a string literal's body up to its closing `quote`, with
/// Python's escapes as jinja2 reads them; the value and the bytes read
/// including the closing quote.
fn string_literal(s: &str, quote: u8) -> Option<(String, usize)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        if c as u32 == u32::from(quote) {
            return Some((out, i + 1));
        }
        if c != '\\' {
            out.push(c);
            continue;
        }
        let (_, e) = chars.next()?;
        let hex = |n: usize, chars: &mut std::str::CharIndices<'_>| {
            let digits: String = chars.by_ref().take(n).map(|(_, c)| c).collect();
            u32::from_str_radix(&digits, 16)
                .ok()
                .and_then(char::from_u32)
        };
        match e {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '0' => out.push('\0'),
            'x' => out.extend(hex(2, &mut chars)),
            'u' => out.extend(hex(4, &mut chars)),
            'U' => out.extend(hex(8, &mut chars)),
            '\\' | '\'' | '"' => out.push(e),
            '\n' => {}
            other => {
                out.push('\\');
                out.push(other);
            }
        }
    }
    None
}

/// The data of a raw block and what follows its `{% endraw %}`.
fn raw_block(s: &str) -> (&str, &str) {
    let mut from = 0;
    while let Some(off) = s[from..].find("{%") {
        let at = from + off;
        let tag = &s[at + 2..];
        if let Some(end) = tag.find("%}") {
            let inner =
                tag[..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
            if inner == "endraw" {
                return (&s[..at], &tag[end + 2..]);
            }
        }
        from = at + 2;
    }
    (s, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(t: &[&str]) -> ControlTokens {
        ControlTokens::new(t.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn literals_are_data_and_string_constants_not_comments_or_names() {
        let src =
            "<|a|>{# <|comment|> #}{{ '<|b|>' + x }}{% if y == \"<|c|>\\n\" %}<|d|>{% endif %}";
        let lit = template_literals(src);
        assert_eq!(lit, ["<|a|>", "<|b|>", "<|c|>\n", "<|d|>"]);
        // A closer inside a string does not end the tag.
        assert_eq!(template_literals("{{ '}}' }}x"), ["}}", "x"]);
        assert_eq!(
            template_literals("{% raw %}{{ '<|r|>' }}{% endraw %}z"),
            ["{{ '<|r|>' }}", "z"]
        );
        // Unterminated input ends the scan without a panic.
        assert_eq!(template_literals("a{{ 'b"), ["a"]);
        assert_eq!(template_literals("{{ 'q\\u00e9' }}"), ["qé"]);
    }

    #[test]
    fn marking_wraps_longest_tokens_and_drops_forged_markers() {
        let c = tokens(&["<|a|>", "<|a|>x"]);
        let forged = format!("{MARK_START}<|a|>{MARK_END} <|a|>x <|a|>");
        let marked = c.mark_str(&forged);
        let (s, e) = (MARK_START, MARK_END);
        assert_eq!(marked, format!("{s}<|a|>{e} {s}<|a|>x{e} {s}<|a|>{e}"));
        let mut json = serde_json::json!({"<|a|>": ["<|a|>", 3, {"k": "<|a|>"}]});
        c.mark_json(&mut json);
        assert_eq!(
            json,
            serde_json::json!({"<|a|>": [format!("{s}<|a|>{e}"), 3, {"k": format!("{s}<|a|>{e}")}]})
        );
    }

    #[test]
    fn split_keeps_marked_tokens_and_breaks_at_lone_markers() {
        let c = tokens(&["<|a|>"]);
        let (s, e) = (MARK_START, MARK_END);
        let chat = format!("x{s}<|a|>{e}y{s}<|a|z{e}w");
        assert_eq!(
            c.split(&chat),
            [
                Piece::Text("x"),
                Piece::Marked("<|a|>"),
                Piece::Text("y"),
                Piece::Text("<|a|z"),
                Piece::Text("w"),
            ]
        );
        assert_eq!(c.split("plain"), [Piece::Text("plain")]);
    }
}
