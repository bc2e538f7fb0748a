//! Server-sent events: the engine's streamed response, decoded as bytes
//! arrive, in pieces cut anywhere.
//!
//! Lines end with `\n` (a `\r` before it is dropped); an event is its
//! `data:` lines joined with `\n`, ended by a blank line; comments (`:`)
//! and other fields (`event:`, `id:`, `retry:`) are ignored, as an OpenAI
//! stream carries none that matter. A line or an event longer than its
//! limit is an error rather than unbounded buffering.

/// Why a stream could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SseError {
    /// A line was not UTF-8.
    #[error("a server-sent event line is not UTF-8")]
    NotUtf8,
    /// A line grew past the limit without ending.
    #[error("a server-sent event line is longer than {0} bytes")]
    LineTooLong(usize),
    /// An event's data lines grew past the limit without a blank line.
    #[error("a server-sent event is longer than {0} bytes")]
    EventTooLong(usize),
}

/// An incremental decoder.
#[derive(Debug)]
pub struct SseDecoder {
    line: Vec<u8>,
    data: Option<String>,
    max_line: usize,
    max_event: usize,
}

impl Default for SseDecoder {
    /// Lines and events of up to 16 MiB.
    fn default() -> Self {
        SseDecoder::new(16 << 20)
    }
}

impl SseDecoder {
    /// A decoder refusing lines and events over `max_line` bytes.
    pub fn new(max_line: usize) -> Self {
        SseDecoder {
            line: Vec::new(),
            data: None,
            max_line,
            max_event: max_line,
        }
    }

    /// Refuses events whose data exceeds `max_event` bytes.
    pub fn max_event(mut self, max_event: usize) -> Self {
        self.max_event = max_event;
        self
    }

    /// Feeds `bytes`, pushing the data of every event they complete.
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<String>) -> Result<(), SseError> {
        while let Some(nl) = bytes.iter().position(|&b| b == b'\n') {
            self.line.extend_from_slice(&bytes[..nl]);
            bytes = &bytes[nl + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.end_line(&line, out)?;
        }
        self.line.extend_from_slice(bytes);
        if self.line.len() > self.max_line {
            return Err(SseError::LineTooLong(self.max_line));
        }
        Ok(())
    }

    fn end_line(&mut self, line: &[u8], out: &mut Vec<String>) -> Result<(), SseError> {
        if line.is_empty() {
            if let Some(d) = self.data.take() {
                out.push(d);
            }
            return Ok(());
        }
        let line = std::str::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            let had = self.data.as_ref().map_or(0, |d| d.len() + 1);
            if had + value.len() > self.max_event {
                self.data = None;
                return Err(SseError::EventTooLong(self.max_event));
            }
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            }
        }
        Ok(())
    }
}

/// Encodes one event carrying `data`, a `data:` line per line of it (an
/// engine's text passed through may span lines).
pub fn event(data: &str) -> String {
    let mut out = String::with_capacity(data.len() + 8);
    for line in data.split('\n') {
        out.push_str("data: ");
        out.push_str(line.strip_suffix('\r').unwrap_or(line));
        out.push('\n');
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_of_several_lines_decode_to_what_was_encoded() {
        for data in ["{\"a\":1}", "{\n  \"a\": 1\n}", "", "x\ny"] {
            let mut d = SseDecoder::default();
            let mut out = Vec::new();
            d.feed(event(data).as_bytes(), &mut out).unwrap();
            assert_eq!(out, vec![data.to_owned()]);
        }
    }
}
