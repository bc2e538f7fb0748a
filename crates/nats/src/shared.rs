//! In-flight load and speculative registrations, shared between replicas.
//!
//! Load: at every change of the fleet (and every `load_every`) a replica
//! compares its own load per pod (the fleet's state minus what it added for
//! others) with what it last published, and publishes on change, or as a
//! heartbeat every lease/3.
//! What others published is added to the fleet's states and taken out again
//! when newer news replaces it or its lease runs out, so a replica that dies
//! leaves no phantom load behind.
//!
//! Registrations: every local registration is published with the pod's
//! name; the others register it for the same pod (by name) with their own
//! clock.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use router_core::{BlockHash, PodId};
use router_policy::builtin::{RoutedChains, wall_ms};
use router_policy::{Fleet, PodStateSink};
use serde::{Deserialize, Serialize};

use crate::{Counters, NatsConfig, PodNames, bump};

/// One pod's load as shared (the wire names: `in_flight`, `prefilling`,
/// `queued`, `kv`).
type Load = router_policy::PodLoad;

#[derive(Serialize, Deserialize)]
struct LoadMessage {
    replica: String,
    pods: HashMap<String, Load>,
}

pub(crate) fn start(
    cfg: NatsConfig,
    client: async_nats::Client,
    names: Arc<PodNames>,
    counters: Arc<Counters>,
    fleet: Arc<Fleet>,
    routed: Arc<RoutedChains>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    if cfg.share_load {
        tasks.push(tokio::spawn(load_loop(
            cfg.clone(),
            client.clone(),
            names.clone(),
            counters.clone(),
            fleet,
        )));
    }
    if cfg.share_routed {
        let (tx, rx) = tokio::sync::mpsc::channel::<(PodId, Vec<BlockHash>)>(4096);
        let dropped = counters.clone();
        routed.set_observer(Some(Arc::new(move |pod, chain| {
            if tx.try_send((pod, chain.to_vec())).is_err() {
                bump(&dropped.routed_dropped);
            }
        })));
        tasks.push(tokio::spawn(routed_out(
            cfg.clone(),
            client.clone(),
            names.clone(),
            rx,
        )));
        tasks.push(tokio::spawn(routed_in(
            cfg, client, names, counters, routed,
        )));
    }
    tasks
}

async fn load_loop(
    cfg: NatsConfig,
    client: async_nats::Client,
    names: Arc<PodNames>,
    counters: Arc<Counters>,
    fleet: Arc<Fleet>,
) {
    let subject = format!("{}.load.{}", cfg.prefix, cfg.replica);
    let mut sub = match client.subscribe(format!("{}.load.*", cfg.prefix)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot subscribe to shared load");
            return;
        }
    };
    // Others' latest news: replica -> (when, per pod name).
    let mut remote: HashMap<String, (Instant, HashMap<String, Load>)> = HashMap::new();
    // What is added to the fleet for others: name -> (pod id, load).
    let mut applied: HashMap<String, (PodId, Load)> = HashMap::new();
    let mut published: HashMap<String, Load> = HashMap::new();
    let mut last_publish = Instant::now() - cfg.lease;
    let heartbeat = cfg.lease / 3;
    let mut tick = tokio::time::interval(cfg.load_every.max(Duration::from_millis(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Woken at every change of the fleet, so a request's load reaches the
    // others within the NATS round trip, not the next tick.
    let changed = Arc::new(tokio::sync::Notify::new());
    let wake = changed.clone();
    fleet.set_watcher(Some(Arc::new(move |_| wake.notify_one())));
    loop {
        tokio::select! {
            () = changed.notified() => {}
            m = sub.next() => {
                let Some(m) = m else { return };
                match serde_json::from_slice::<LoadMessage>(&m.payload) {
                    Ok(msg) if msg.replica != cfg.replica => {
                        bump(&counters.load_received);
                        remote.insert(msg.replica, (Instant::now(), msg.pods));
                    }
                    Ok(_) => {}
                    Err(_) => bump(&counters.log_skipped),
                }
                continue;
            }
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        remote.retain(|_, (at, _)| now.duration_since(*at) < cfg.lease);
        let pods = names.all();
        // Others' load, summed per pod, replaces what was added before.
        let mut own = HashMap::with_capacity(pods.len());
        for (name, id) in &pods {
            let want = remote
                .values()
                .filter_map(|(_, m)| m.get(name))
                .fold(Load::default(), |a, &l| a.plus(l));
            let had = match applied.get(name) {
                Some((pid, l)) if pid == id => *l,
                _ => Load::default(),
            };
            if want != had {
                fleet.update(*id, &mut |s| Load::replace_in(s, had, want));
            }
            applied.insert(name.clone(), (*id, want));
            if let Some(s) = fleet.get(*id) {
                let total = Load::of(&s);
                own.insert(name.clone(), total.minus(want));
            }
        }
        applied.retain(|name, _| own.contains_key(name));
        if own != published || now.duration_since(last_publish) >= heartbeat {
            let msg = LoadMessage {
                replica: cfg.replica.clone(),
                pods: own,
            };
            if let Ok(body) = serde_json::to_vec(&msg)
                && client
                    .publish(subject.clone(), Bytes::from(body))
                    .await
                    .is_ok()
            {
                last_publish = now;
                published = msg.pods;
            }
        }
    }
}

/// `replica`, pod name, chain: `u16 len | replica | u16 len | name | u64 LE...`.
fn encode_routed(replica: &str, name: &str, chain: &[BlockHash]) -> Bytes {
    let mut out = Vec::with_capacity(4 + replica.len() + name.len() + chain.len() * 8);
    for s in [replica, name] {
        let b = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
        out.extend_from_slice(&(b.len() as u16).to_le_bytes());
        out.extend_from_slice(b);
    }
    for h in chain {
        out.extend_from_slice(&h.0.to_le_bytes());
    }
    Bytes::from(out)
}

fn decode_routed(b: &[u8]) -> Option<(&str, &str, Vec<BlockHash>)> {
    let mut at = 0;
    let mut text = || {
        let len = u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?) as usize;
        let s = std::str::from_utf8(b.get(at + 2..at + 2 + len)?).ok()?;
        at += 2 + len;
        Some(s)
    };
    let replica = text()?;
    let name = text()?;
    let rest = &b[at..];
    if rest.len() % 8 != 0 {
        return None;
    }
    let chain = rest
        .chunks_exact(8)
        .map(|c| BlockHash(u64::from_le_bytes(c.try_into().expect("8"))))
        .collect();
    Some((replica, name, chain))
}

async fn routed_out(
    cfg: NatsConfig,
    client: async_nats::Client,
    names: Arc<PodNames>,
    mut rx: tokio::sync::mpsc::Receiver<(PodId, Vec<BlockHash>)>,
) {
    let subject = format!("{}.routed", cfg.prefix);
    while let Some((pod, chain)) = rx.recv().await {
        let Some(name) = names.name_of(pod) else {
            continue;
        };
        let _ = client
            .publish(subject.clone(), encode_routed(&cfg.replica, &name, &chain))
            .await;
    }
}

async fn routed_in(
    cfg: NatsConfig,
    client: async_nats::Client,
    names: Arc<PodNames>,
    counters: Arc<Counters>,
    routed: Arc<RoutedChains>,
) {
    let mut sub = match client.subscribe(format!("{}.routed", cfg.prefix)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot subscribe to shared registrations");
            return;
        }
    };
    while let Some(m) = sub.next().await {
        match decode_routed(&m.payload) {
            Some((replica, _, _)) if replica == cfg.replica => {}
            Some((_, name, chain)) => {
                if let Some(id) = names.id(name) {
                    bump(&counters.routed_received);
                    routed.insert_remote(id, &chain, wall_ms());
                }
            }
            None => bump(&counters.log_skipped),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_round_trip_and_garbage_is_refused() {
        let chain = [BlockHash(1), BlockHash(u64::MAX)];
        let b = encode_routed("r1", "sim-0", &chain);
        let (r, n, c) = decode_routed(&b).unwrap();
        assert_eq!((r, n, c.as_slice()), ("r1", "sim-0", &chain[..]));
        assert!(decode_routed(&b[..b.len() - 1]).is_none());
        assert!(decode_routed(&[5, 0, b'a']).is_none());
        assert!(decode_routed(&[]).is_none());
    }
}
