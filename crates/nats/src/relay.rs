//! Engine batches into the JetStream stream.
//!
//! Each followed pod gets a [`RelaySink`]; all of them feed one bounded
//! queue and one publishing task, which publishes in order, waits for
//! JetStream's acknowledgements, and publishes again whatever was not
//! acknowledged (NATS restarting): the message ids make the repeats
//! harmless. A full queue drops the batch and counts it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream;
use bytes::Bytes;
use parking_lot::Mutex;
use router_core::PodId;
use router_events::{BatchSink, ClearReason, DecodeError, EventBatch};
use tokio::sync::mpsc;

use crate::log::LogShared;
use crate::{Counters, bump};

/// The header carrying the engine's sequence number.
pub(crate) const SEQ: &str = "Cr-Seq";
/// The header of a clear marker, with its reason.
pub(crate) const CLEAR: &str = "Cr-Clear";
const QUEUE: usize = 65_536;
const BATCH: usize = 256;

pub(crate) struct Outgoing {
    subject: String,
    headers: HeaderMap,
    payload: Bytes,
}

/// The publishing task's handle.
pub(crate) struct Publisher {
    tx: mpsc::Sender<Outgoing>,
    counters: Arc<Counters>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Publisher {
    pub(crate) fn start(js: jetstream::Context, counters: Arc<Counters>) -> Publisher {
        let (tx, rx) = mpsc::channel(QUEUE);
        let task = tokio::spawn(publish(js, rx, counters.clone()));
        Publisher { tx, counters, task }
    }

    pub(crate) fn sink(&self, name: &str, subject: String, log: Arc<LogShared>) -> RelaySink {
        RelaySink {
            name: name.to_owned(),
            log,
            subject,
            tx: self.tx.clone(),
            counters: self.counters.clone(),
            last: Mutex::new(None),
        }
    }
}

async fn publish(
    js: jetstream::Context,
    mut rx: mpsc::Receiver<Outgoing>,
    counters: Arc<Counters>,
) {
    let mut batch: Vec<Outgoing> = Vec::with_capacity(BATCH);
    loop {
        if rx.recv_many(&mut batch, BATCH).await == 0 {
            return;
        }
        // Publish the batch, then wait for every acknowledgement; on any
        // failure publish again from the first unacknowledged message (the
        // ones after it may have landed: JetStream drops their repeats).
        let mut from = 0;
        let mut backoff = Duration::from_millis(20);
        while from < batch.len() {
            let mut acks = Vec::with_capacity(batch.len() - from);
            let mut failed = false;
            for m in &batch[from..] {
                match js
                    .publish_with_headers(m.subject.clone(), m.headers.clone(), m.payload.clone())
                    .await
                {
                    Ok(ack) => acks.push(ack),
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            let mut done = 0;
            for ack in acks {
                match ack.await {
                    Ok(_) => done += 1,
                    Err(_) => {
                        failed = true;
                        break;
                    }
                }
            }
            counters.relayed.fetch_add(done as u64, Ordering::Relaxed);
            from += done;
            if failed {
                bump(&counters.relay_retries);
                if counters.relay_retries.load(Ordering::Relaxed) % 50 == 1 {
                    tracing::warn!(
                        retries = counters.relay_retries.load(Ordering::Relaxed),
                        "publishing to JetStream failed; retrying"
                    );
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
        batch.clear();
    }
}

/// Relays one pod's batches.
pub(crate) struct RelaySink {
    name: String,
    log: Arc<LogShared>,
    subject: String,
    tx: mpsc::Sender<Outgoing>,
    counters: Arc<Counters>,
    /// The last batch relayed: (sequence number, payload hash), naming a
    /// clear marker the same way on every replica.
    last: Mutex<Option<(u64, u64)>>,
}

impl RelaySink {
    fn send(&self, m: Outgoing) {
        if self.tx.try_send(m).is_err() {
            bump(&self.counters.relay_dropped);
            tracing::warn!(subject = %self.subject, "relay queue full: a batch dropped");
        }
    }
}

impl BatchSink for RelaySink {
    fn batch(
        &self,
        _: PodId,
        seq: u64,
        payload: &[u8],
        decoded: Result<&EventBatch, &DecodeError>,
    ) {
        let hash = xxhash_rust::xxh3::xxh3_64(payload);
        *self.last.lock() = Some((seq, hash));
        let mut headers = HeaderMap::new();
        // The same batch relayed by every replica has the same id; a
        // restarted engine's batch with the same number does not.
        headers.insert(
            "Nats-Msg-Id",
            format!("{}:{seq}:{hash:016x}", self.subject).as_str(),
        );
        headers.insert(SEQ, seq.to_string().as_str());
        self.send(Outgoing {
            subject: self.subject.clone(),
            headers,
            payload: Bytes::copy_from_slice(payload),
        });
        // Applied at once here; the log's copy is then stale.
        self.log.local_batch(&self.name, seq, decoded);
    }

    fn clear(&self, _: PodId, why: ClearReason) {
        let Some((seq, hash)) = *self.last.lock() else {
            // Nothing relayed since the last clear: nothing to clear.
            return;
        };
        let reason = match why {
            ClearReason::Restart => "restart",
            ClearReason::Gap => "gap",
            _ => "unverified",
        };
        let marker = format!("{}:clear:{seq}:{hash:016x}", self.subject);
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", marker.as_str());
        headers.insert(CLEAR, reason);
        *self.last.lock() = None;
        self.send(Outgoing {
            subject: self.subject.clone(),
            headers,
            payload: Bytes::new(),
        });
        self.log.local_clear(&self.name, marker, why);
    }
}
