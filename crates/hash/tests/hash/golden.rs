//! The hash algorithm against fixed vectors from an independent Python
//! implementation of the documented byte layout (scripts/gen_hash_golden.py).

use router_core::{BlockHash, BlockHasher, Namespace};
use router_hash::{ChainHasher, ExtraKey};
use serde_json::Value;

fn namespace(v: &Value) -> Namespace {
    let field = |k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let mut ns = Namespace::default();
    ns.model = field("model");
    ns.lora_name = field("lora_name");
    ns.cache_salt = field("cache_salt");
    ns
}

fn hex(h: BlockHash) -> String {
    format!("{:016x}", h.0)
}

#[test]
fn literal_vectors_are_frozen() {
    // Copied from hash_golden.json so a change to the algorithm shows here too.
    let hasher = ChainHasher::new(4).unwrap();
    let ns = Namespace::default();
    assert_eq!(hex(hasher.root(&ns)), "cbc759719f829765");
    let chain = hasher.chain(&ns, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(
        chain.iter().map(|h| hex(*h)).collect::<Vec<_>>(),
        ["32141fe53ec2df85", "892c4fe016d175ab"]
    );
}

#[test]
fn every_golden_case_matches() {
    let text = std::fs::read_to_string(super::data("hash_golden.json")).unwrap();
    let golden: Value = serde_json::from_str(&text).unwrap();
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 8, "golden file lost cases");
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let ns = namespace(&case["namespace"]);
        let bs = case["block_size"].as_u64().unwrap() as usize;
        let tokens: Vec<u32> = serde_json::from_value(case["tokens"].clone()).unwrap();
        let extras: Vec<ExtraKey> = case["extras"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                ExtraKey::new(
                    e["start"].as_u64().unwrap() as usize,
                    e["end"].as_u64().unwrap() as usize,
                    e["key"].as_u64().unwrap(),
                )
            })
            .collect();
        let want: Vec<String> = serde_json::from_value(case["hashes"].clone()).unwrap();
        let hasher = ChainHasher::new(bs).unwrap();
        assert_eq!(
            hex(hasher.root(&ns)),
            case["root"].as_str().unwrap(),
            "{name}: root"
        );
        let got: Vec<String> = hasher
            .chain_with_extras(&ns, &tokens, &extras)
            .into_iter()
            .map(hex)
            .collect();
        assert_eq!(got, want, "{name}: chain");
        assert_eq!(got.len(), tokens.len() / bs, "{name}: only full blocks");
        if extras.is_empty() {
            // The trait's provided chain and the one-block entry point agree.
            let mut via_trait = Vec::new();
            hasher.extend_chain(hasher.root(&ns), &tokens, bs, &mut via_trait);
            assert_eq!(
                via_trait.into_iter().map(hex).collect::<Vec<_>>(),
                want,
                "{name}: trait"
            );
        }
    }
}

#[test]
fn image_keys_join_only_the_blocks_they_overlap() {
    let hasher = ChainHasher::new(4).unwrap();
    let ns = Namespace::model("vl");
    let tokens: Vec<u32> = (0..16).collect();
    let plain = hasher.chain(&ns, &tokens);
    let with_image = hasher.chain_with_extras(&ns, &tokens, &[ExtraKey::new(5, 7, 99)]);
    assert_eq!(plain[0], with_image[0], "block 0 is before the image");
    for i in 1..4 {
        assert_ne!(
            plain[i], with_image[i],
            "block {i} is at or after the image"
        );
    }
    let other_image = hasher.chain_with_extras(&ns, &tokens, &[ExtraKey::new(5, 7, 100)]);
    assert_ne!(
        with_image[1], other_image[1],
        "different images, different cache"
    );
}
