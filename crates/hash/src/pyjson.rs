//! Python-compatible printing of template values.
//!
//! Chat templates run under Hugging Face `transformers`, where `tojson` is
//! `json.dumps(x, ensure_ascii=False, ...)` and `{{ x }}` is Python's `str`.
//! Both differ from minijinja's defaults (HTML-safe escaping, compact
//! separators, Rust float forms), and any difference changes the prompt's
//! tokens and so its cache. This module reproduces Python's output.

use std::fmt::Write;

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// Options of `json.dumps` that templates pass to `tojson`.
#[derive(Debug, Default)]
pub(crate) struct DumpOptions {
    pub(crate) ensure_ascii: bool,
    pub(crate) indent: Option<String>,
    pub(crate) sort_keys: bool,
    pub(crate) item_sep: Option<String>,
    pub(crate) key_sep: Option<String>,
}

/// `json.dumps(value, **opts)`.
pub(crate) fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    let item_sep = opts
        .item_sep
        .as_deref()
        .unwrap_or(if opts.indent.is_some() { "," } else { ", " });
    let key_sep = opts.key_sep.as_deref().unwrap_or(": ");
    let d = Dumper {
        opts,
        item_sep,
        key_sep,
    };
    d.value(&mut out, value, 0)?;
    Ok(out)
}

struct Dumper<'a> {
    opts: &'a DumpOptions,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl Dumper<'_> {
    fn newline(&self, out: &mut String, level: usize) {
        if let Some(ind) = &self.opts.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn value(&self, out: &mut String, v: &Value, level: usize) -> Result<(), Error> {
        match v.kind() {
            // Python's `json.dumps` refuses jinja2's `Undefined`.
            ValueKind::Undefined => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "Object of type Undefined is not JSON serializable",
                ));
            }
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => number(out, v, true),
            ValueKind::String => self.string(out, v.as_str().unwrap_or_default()),
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if keys.is_empty() {
                    out.push_str("{}");
                    return Ok(());
                }
                if self.opts.sort_keys {
                    keys.sort();
                }
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, level + 1);
                    let item = v.get_item(k)?;
                    match k.kind() {
                        ValueKind::String => self.string(out, k.as_str().unwrap_or_default()),
                        ValueKind::None | ValueKind::Undefined => out.push_str("\"null\""),
                        ValueKind::Bool => {
                            out.push_str(if k.is_true() { "\"true\"" } else { "\"false\"" })
                        }
                        ValueKind::Number => {
                            out.push('"');
                            number(out, k, true);
                            out.push('"');
                        }
                        _ => {
                            return Err(Error::new(
                                ErrorKind::InvalidOperation,
                                format!("keys must be str, int, float, bool or None, not {k}"),
                            ));
                        }
                    }
                    out.push_str(self.key_sep);
                    self.value(out, &item, level + 1)?;
                }
                self.newline(out, level);
                out.push('}');
            }
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                if items.is_empty() {
                    out.push_str("[]");
                    return Ok(());
                }
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, level + 1);
                    self.value(out, item, level + 1)?;
                }
                self.newline(out, level);
                out.push(']');
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("object of kind {} is not JSON serializable", v.kind()),
                ));
            }
        }
        Ok(())
    }

    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c if self.opts.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{:04x}", u);
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Writes a number as Python would: integers as digits, floats in `repr`
/// form. `json` selects `json.dumps` spellings of non-finite floats.
fn number(out: &mut String, v: &Value, json: bool) {
    if v.is_integer() {
        if let Ok(i) = i128::try_from(v.clone()) {
            let _ = write!(out, "{i}");
            return;
        }
    }
    match f64::try_from(v.clone()) {
        Ok(f) => out.push_str(&float_repr(f, json)),
        Err(_) => {
            let _ = write!(out, "{v}");
        }
    }
}

/// Python's `repr(float)`: the shortest round-trip digits, fixed notation for
/// decimal exponents in `-4..16`, otherwise `d.ddde±XX`.
pub(crate) fn float_repr(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.to_owned();
    }
    if f.is_infinite() {
        return match (json, f > 0.0) {
            (true, true) => "Infinity",
            (true, false) => "-Infinity",
            (false, true) => "inf",
            (false, false) => "-inf",
        }
        .to_owned();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_owned();
    }
    // Rust's `{:e}` prints the shortest round-trip digits, as Python's repr does.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let negative = mantissa.starts_with('-');
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let mut out = String::with_capacity(digits.len() + 8);
    if negative {
        out.push('-');
    }
    if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        } else {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
    out
}

/// Python's `str(value)` for the scalar kinds whose spelling differs from
/// minijinja's; `None` for everything minijinja prints the same way.
pub(crate) fn python_str(v: &Value) -> Option<String> {
    match v.kind() {
        ValueKind::None => Some("None".to_owned()),
        ValueKind::Bool => Some(if v.is_true() { "True" } else { "False" }.to_owned()),
        ValueKind::Number if !v.is_integer() => {
            let mut s = String::new();
            number(&mut s, v, false);
            Some(s)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python_repr() {
        let cases = [
            (1e-05, "1e-05"),
            (2.0, "2.0"),
            (0.5, "0.5"),
            (21.5, "21.5"),
            (1e16, "1e+16"),
            (1.5e-7, "1.5e-07"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (0.0001, "0.0001"),
            (-3.25, "-3.25"),
            (1e15, "1000000000000000.0"),
            (0.1 + 0.2, "0.30000000000000004"),
            (-0.0, "-0.0"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f, true), want, "{f:e}");
        }
        assert_eq!(float_repr(f64::NAN, true), "NaN");
        assert_eq!(float_repr(f64::NEG_INFINITY, false), "-inf");
    }

    #[test]
    fn dumps_matches_python_separators_and_escapes() {
        let v = Value::from(minijinja::value::Serde(serde_json::json!({
            "b": [1, 2.0, null, true], "a": "<&'é\"\n\u{1}>", "e": {}, "l": []
        })));
        let s = dumps(&v, &DumpOptions::default()).unwrap();
        assert_eq!(
            s,
            r#"{"b": [1, 2.0, null, true], "a": "<&'é\"\n\u0001>", "e": {}, "l": []}"#
        );
        let opts = DumpOptions {
            indent: Some("  ".into()),
            sort_keys: true,
            ensure_ascii: true,
            ..DumpOptions::default()
        };
        let s = dumps(&v, &opts).unwrap();
        assert_eq!(
            s,
            "{\n  \"a\": \"<&'\\u00e9\\\"\\n\\u0001>\",\n  \"b\": [\n    1,\n    2.0,\n    null,\n    true\n  ],\n  \"e\": {},\n  \"l\": []\n}"
        );
    }
}
