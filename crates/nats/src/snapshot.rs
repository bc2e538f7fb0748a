//! Index snapshots: what a replica knows of every pod, with the stream
//! position it covers, versioned and checksummed.
//!
//! Layout (little-endian):
//!
//! ```text
//! magic "CRSNAP" | version u16 | stream_seq u64 | pods u32
//! per pod: name_len u16 | name | expected u64 (u64::MAX: none) | last_ts f64
//!          | blocks u32 | blocks x (engine u64 | router u64 | tiers u8)
//! xxh3-64 of everything before, u64
//! ```
//!
//! Decoding is total: a short, overlong, mis-versioned or mis-summed input
//! is a [`SnapshotError`], and nothing is allocated for a count the input
//! cannot hold.

use router_core::BlockHash;
use router_events::KnownBlock;

const MAGIC: &[u8; 6] = b"CRSNAP";
/// The layout version written.
pub const VERSION: u16 = 1;
const BLOCK_BYTES: usize = 17;

/// One pod's part of a snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct PodSnapshot {
    /// The pod's name (stable across replicas, unlike its id).
    pub name: String,
    /// The next engine sequence number expected (`None`: none applied).
    pub expected: Option<u64>,
    /// The timestamp of the last batch applied.
    pub last_ts: f64,
    /// Every block known, with its tiers.
    pub blocks: Vec<KnownBlock>,
}

/// What a replica knew at one position of the event stream.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Snapshot {
    /// The last stream sequence number applied.
    pub stream_seq: u64,
    /// The pods.
    pub pods: Vec<PodSnapshot>,
}

/// Why a snapshot was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Not a snapshot at all.
    #[error("not a cache-router snapshot (bad magic)")]
    Magic,
    /// Written by another layout version.
    #[error("snapshot layout version {0}, this build reads {VERSION}")]
    Version(u16),
    /// The checksum does not match: the bytes were damaged.
    #[error("snapshot checksum mismatch: stored {stored:#018x}, computed {computed:#018x}")]
    Checksum {
        /// The checksum in the snapshot.
        stored: u64,
        /// The checksum of its bytes.
        computed: u64,
    },
    /// Ends early or has bytes left over.
    #[error("snapshot truncated or malformed at byte {0}")]
    Truncated(usize),
    /// A pod name that is not UTF-8.
    #[error("snapshot pod name is not UTF-8 at byte {0}")]
    Name(usize),
}

impl Snapshot {
    /// The blocks in all pods.
    pub fn blocks(&self) -> usize {
        self.pods.iter().map(|p| p.blocks.len()).sum()
    }

    /// The encoded snapshot.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.blocks() * BLOCK_BYTES + self.pods.len() * 64);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.stream_seq.to_le_bytes());
        out.extend_from_slice(&(self.pods.len() as u32).to_le_bytes());
        for p in &self.pods {
            let name = &p.name.as_bytes()[..p.name.len().min(u16::MAX as usize)];
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name);
            out.extend_from_slice(&p.expected.unwrap_or(u64::MAX).to_le_bytes());
            out.extend_from_slice(&p.last_ts.to_bits().to_le_bytes());
            out.extend_from_slice(&(p.blocks.len() as u32).to_le_bytes());
            for b in &p.blocks {
                out.extend_from_slice(&b.engine.to_le_bytes());
                out.extend_from_slice(&b.router.0.to_le_bytes());
                out.push(b.tiers);
            }
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes and checks a snapshot.
    pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(SnapshotError::Magic);
        }
        let mut r = Reader { bytes, at: 6 };
        let version = r.u16()?;
        if version != VERSION {
            return Err(SnapshotError::Version(version));
        }
        if bytes.len() < 8 + r.at {
            return Err(SnapshotError::Truncated(bytes.len()));
        }
        let body = &bytes[..bytes.len() - 8];
        let stored = u64::from_le_bytes(bytes[bytes.len() - 8..].try_into().expect("8 bytes"));
        let computed = xxhash_rust::xxh3::xxh3_64(body);
        if stored != computed {
            return Err(SnapshotError::Checksum { stored, computed });
        }
        let mut r = Reader {
            bytes: body,
            at: r.at,
        };
        let stream_seq = r.u64()?;
        let pods = r.u32()? as usize;
        // Each pod takes at least 22 bytes.
        if pods > r.left() / 22 {
            return Err(SnapshotError::Truncated(r.at));
        }
        let mut out = Snapshot {
            stream_seq,
            pods: Vec::with_capacity(pods),
        };
        for _ in 0..pods {
            let len = r.u16()? as usize;
            let at = r.at;
            let name = std::str::from_utf8(r.take(len)?)
                .map_err(|_| SnapshotError::Name(at))?
                .to_owned();
            let expected = Some(r.u64()?).filter(|&e| e != u64::MAX);
            let last_ts = f64::from_bits(r.u64()?);
            let n = r.u32()? as usize;
            if n > r.left() / BLOCK_BYTES {
                return Err(SnapshotError::Truncated(r.at));
            }
            let mut blocks = Vec::with_capacity(n);
            for _ in 0..n {
                blocks.push(KnownBlock {
                    engine: r.u64()?,
                    router: BlockHash(r.u64()?),
                    tiers: r.u8()?,
                });
            }
            out.pods.push(PodSnapshot {
                name,
                expected,
                last_ts,
                blocks,
            });
        }
        if r.left() != 0 {
            return Err(SnapshotError::Truncated(r.at));
        }
        Ok(out)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        if n > self.left() {
            return Err(SnapshotError::Truncated(self.at));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, SnapshotError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, SnapshotError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sample() -> Snapshot {
        Snapshot {
            stream_seq: 42,
            pods: vec![
                PodSnapshot {
                    name: "pod-a".into(),
                    expected: Some(7),
                    last_ts: 1.5,
                    blocks: vec![
                        KnownBlock {
                            engine: 1,
                            router: BlockHash(11),
                            tiers: 1,
                        },
                        KnownBlock {
                            engine: 2,
                            router: BlockHash(12),
                            tiers: 3,
                        },
                    ],
                },
                PodSnapshot {
                    name: "b".into(),
                    expected: None,
                    last_ts: 0.0,
                    blocks: vec![],
                },
            ],
        }
    }

    #[test]
    fn round_trips_and_refuses_damage() {
        let s = sample();
        let bytes = s.encode();
        assert_eq!(Snapshot::decode(&bytes).unwrap(), s);
        let mut bad = bytes.clone();
        bad[20] ^= 1;
        assert!(matches!(
            Snapshot::decode(&bad),
            Err(SnapshotError::Checksum { .. })
        ));
        let mut v2 = bytes.clone();
        v2[6] = 2;
        assert_eq!(Snapshot::decode(&v2), Err(SnapshotError::Version(2)));
        assert_eq!(Snapshot::decode(b"nope"), Err(SnapshotError::Magic));
        for cut in 0..bytes.len() {
            assert!(Snapshot::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }

    proptest! {
        #[test]
        fn any_bytes_decode_to_an_error_or_a_snapshot(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut with_magic = MAGIC.to_vec();
            with_magic.extend_from_slice(&bytes);
            let _ = Snapshot::decode(&bytes);
            let _ = Snapshot::decode(&with_magic);
        }

        #[test]
        fn encoded_snapshots_round_trip(
            seq in any::<u64>(),
            pods in proptest::collection::vec(
                ("[a-z0-9-]{0,12}", proptest::option::of(0..u64::MAX), proptest::collection::vec((any::<u64>(), any::<u64>(), 1u8..16), 0..20)),
                0..5,
            ),
        ) {
            let s = Snapshot {
                stream_seq: seq,
                pods: pods.into_iter().map(|(name, expected, blocks)| PodSnapshot {
                    name,
                    expected,
                    last_ts: 3.25,
                    blocks: blocks.into_iter().map(|(e, r, t)| KnownBlock { engine: e, router: BlockHash(r), tiers: t }).collect(),
                }).collect(),
            };
            prop_assert_eq!(Snapshot::decode(&s.encode()).unwrap(), s);
        }
    }
}
