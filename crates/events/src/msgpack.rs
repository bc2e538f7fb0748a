//! A small, strict MessagePack reader over a byte slice.
//!
//! Event batches come from the network, so every length is checked against
//! the bytes that remain before anything is allocated, nesting is bounded,
//! and every failure is a [`DecodeError`] (never a panic). Only what the
//! engines send is supported: nil, booleans, integers, floats, strings,
//! binary, arrays, maps (extension types are skipped as opaque values).

use crate::DecodeError;

/// Deepest nesting a skipped value may have.
const MAX_DEPTH: usize = 32;

/// A MessagePack value's kind, as read from its marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Nil,
    Bool,
    Int,
    Float,
    Str,
    Bin,
    Array,
    Map,
    Ext,
}

#[derive(Clone, Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn err(&self, what: &'static str) -> DecodeError {
        DecodeError::Malformed {
            offset: self.pos,
            what,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or_else(|| self.err("length overflows"))?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or_else(|| self.err("truncated"))?;
        self.pos = end;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn be<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    /// The kind of the next value, without consuming it.
    pub(crate) fn peek(&self) -> Result<Kind, DecodeError> {
        let m = *self
            .buf
            .get(self.pos)
            .ok_or_else(|| self.err("truncated"))?;
        Ok(match m {
            0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => Kind::Int,
            0x80..=0x8f | 0xde | 0xdf => Kind::Map,
            0x90..=0x9f | 0xdc | 0xdd => Kind::Array,
            0xa0..=0xbf | 0xd9..=0xdb => Kind::Str,
            0xc0 => Kind::Nil,
            0xc2 | 0xc3 => Kind::Bool,
            0xc4..=0xc6 => Kind::Bin,
            0xca | 0xcb => Kind::Float,
            0xc7..=0xc9 | 0xd4..=0xd8 => Kind::Ext,
            _ => return Err(self.err("reserved marker")),
        })
    }

    /// Consumes a nil if one is next.
    pub(crate) fn nil(&mut self) -> Result<bool, DecodeError> {
        if self.peek()? == Kind::Nil {
            self.pos += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// A length prefix, checked against what remains (each element takes
    /// at least `min_elem` bytes).
    fn len(&mut self, n: u64, min_elem: usize) -> Result<usize, DecodeError> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if n.saturating_mul(min_elem as u64) > remaining {
            return Err(self.err("length exceeds the message"));
        }
        Ok(n as usize)
    }

    pub(crate) fn array_len(&mut self) -> Result<usize, DecodeError> {
        let m = self.byte()?;
        let n = match m {
            0x90..=0x9f => (m & 0x0f) as u64,
            0xdc => u16::from_be_bytes(self.be()?) as u64,
            0xdd => u32::from_be_bytes(self.be()?) as u64,
            _ => {
                self.pos -= 1;
                return Err(self.err("expected an array"));
            }
        };
        self.len(n, 1)
    }

    pub(crate) fn map_len(&mut self) -> Result<usize, DecodeError> {
        let m = self.byte()?;
        let n = match m {
            0x80..=0x8f => (m & 0x0f) as u64,
            0xde => u16::from_be_bytes(self.be()?) as u64,
            0xdf => u32::from_be_bytes(self.be()?) as u64,
            _ => {
                self.pos -= 1;
                return Err(self.err("expected a map"));
            }
        };
        self.len(n, 2)
    }

    pub(crate) fn str(&mut self) -> Result<&'a str, DecodeError> {
        let m = self.byte()?;
        let n = match m {
            0xa0..=0xbf => (m & 0x1f) as usize,
            0xd9 => self.byte()? as usize,
            0xda => u16::from_be_bytes(self.be()?) as usize,
            0xdb => u32::from_be_bytes(self.be()?) as usize,
            _ => {
                self.pos -= 1;
                return Err(self.err("expected a string"));
            }
        };
        let s = self.take(n)?;
        std::str::from_utf8(s).map_err(|_| self.err("string is not UTF-8"))
    }

    pub(crate) fn bin(&mut self) -> Result<&'a [u8], DecodeError> {
        let m = self.byte()?;
        let n = match m {
            0xc4 => self.byte()? as usize,
            0xc5 => u16::from_be_bytes(self.be()?) as usize,
            0xc6 => u32::from_be_bytes(self.be()?) as usize,
            _ => {
                self.pos -= 1;
                return Err(self.err("expected binary"));
            }
        };
        self.take(n)
    }

    /// An integer as i128 (covers both u64 and i64).
    pub(crate) fn int(&mut self) -> Result<i128, DecodeError> {
        let m = self.byte()?;
        Ok(match m {
            0x00..=0x7f => m as i128,
            0xe0..=0xff => (m as i8) as i128,
            0xcc => self.byte()? as i128,
            0xcd => u16::from_be_bytes(self.be()?) as i128,
            0xce => u32::from_be_bytes(self.be()?) as i128,
            0xcf => u64::from_be_bytes(self.be()?) as i128,
            0xd0 => i8::from_be_bytes(self.be()?) as i128,
            0xd1 => i16::from_be_bytes(self.be()?) as i128,
            0xd2 => i32::from_be_bytes(self.be()?) as i128,
            0xd3 => i64::from_be_bytes(self.be()?) as i128,
            _ => {
                self.pos -= 1;
                return Err(self.err("expected an integer"));
            }
        })
    }

    pub(crate) fn float(&mut self) -> Result<f64, DecodeError> {
        let m = self.byte()?;
        Ok(match m {
            0xca => f32::from_be_bytes(self.be()?) as f64,
            0xcb => f64::from_be_bytes(self.be()?),
            _ => {
                self.pos -= 1;
                // Integers are accepted where a float is expected.
                return self.int().map(|i| i as f64);
            }
        })
    }

    /// Skips one value of any kind, returning its raw bytes.
    pub(crate) fn skip(&mut self) -> Result<&'a [u8], DecodeError> {
        let start = self.pos;
        self.skip_depth(0)?;
        Ok(&self.buf[start..self.pos])
    }

    fn skip_depth(&mut self, depth: usize) -> Result<(), DecodeError> {
        if depth > MAX_DEPTH {
            return Err(self.err("nested too deeply"));
        }
        match self.peek()? {
            Kind::Nil | Kind::Bool => {
                self.pos += 1;
            }
            Kind::Int => {
                self.int()?;
            }
            Kind::Float => {
                self.float()?;
            }
            Kind::Str => {
                self.str()?;
            }
            Kind::Bin => {
                self.bin()?;
            }
            Kind::Array => {
                for _ in 0..self.array_len()? {
                    self.skip_depth(depth + 1)?;
                }
            }
            Kind::Map => {
                for _ in 0..self.map_len()? {
                    self.skip_depth(depth + 1)?;
                    self.skip_depth(depth + 1)?;
                }
            }
            Kind::Ext => {
                let m = self.byte()?;
                let n = match m {
                    0xd4 => 1,
                    0xd5 => 2,
                    0xd6 => 4,
                    0xd7 => 8,
                    0xd8 => 16,
                    0xc7 => self.byte()? as usize,
                    0xc8 => u16::from_be_bytes(self.be()?) as usize,
                    _ => u32::from_be_bytes(self.be()?) as usize,
                };
                self.take(n + 1)?; // type byte + data
            }
        }
        Ok(())
    }
}
