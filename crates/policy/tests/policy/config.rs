//! Profiles from TOML: equal to code, errors with the file's line, custom
//! plugins by name.

use std::sync::Arc;

use router_index::{Index, IndexConfig};
use router_policy::builtin::{
    BreakerConfig, CacheAwareCost, CircuitBreaker, HealthFilter, LoadScorer, MaxScore,
    PrefixMatchPrepare, RoleFilter,
};
use router_policy::keys::{CHAIN, PROMPT_TOKENS};
use router_policy::{
    Built, DEFAULT_PROFILE_TOML, Error, Profile, Registry, Role, default_profile, scorer_fn,
};

fn registry() -> (Registry, Arc<Index>) {
    let index = Index::<4>::new(IndexConfig::default());
    (Registry::with_builtins().with_index(index.clone()), index)
}

#[test]
fn the_default_profile_from_toml_equals_the_one_from_code() {
    let (reg, index) = registry();
    let from_file = reg.load(DEFAULT_PROFILE_TOML).unwrap();
    let from_code = default_profile(index, 16);
    assert_eq!(
        format!("{:?}", from_file["cache-aware"]),
        format!("{from_code:?}")
    );
}

#[test]
fn the_bundled_profiles_from_toml_equal_the_ones_from_code() {
    let (reg, index) = registry();
    let text = router_policy::default_profiles_toml(16, r#"{ type = "health" }"#);
    assert!(
        text.starts_with(DEFAULT_PROFILE_TOML),
        "DEFAULT_PROFILE_TOML is the first of them"
    );
    let from_file = reg.load(&text).unwrap();
    assert_eq!(
        format!("{:?}", from_file["cache-aware"]),
        format!("{:?}", default_profile(index.clone(), 16))
    );
    for name in router_policy::peers::NAMES {
        let from_code = router_policy::peers::profile(name, index.clone(), 16).unwrap();
        assert_eq!(
            format!("{:?}", from_file[name]),
            format!("{from_code:?}"),
            "{name}"
        );
    }
}

#[test]
fn a_richer_profile_from_toml_equals_code() {
    let (reg, index) = registry();
    let text = r#"
[profiles.p]
inputs = ["chain", "prompt_tokens"]
prepare = [{ type = "prefix-match" }]
filters = [
  { type = "health" },
  { type = "role", role = "prefill" },
  { type = "circuit-breaker", failures = 3, cooldown_ms = 500 },
]
scorers = [
  { type = "cache-aware-cost", weight = 2.0, overlap_weight = 1.5, block_size = 32 },
  { type = "load", weight = 0.5 },
]
picker = { type = "max-score" }
"#;
    let loaded = reg.load(text).unwrap();
    let code = Profile::builder("p")
        .input(CHAIN.id())
        .input(PROMPT_TOKENS.id())
        .prepare(PrefixMatchPrepare::new(index))
        .filter(HealthFilter)
        .filter(RoleFilter::new(Role::Prefill))
        .filter(CircuitBreaker::new({
            let mut c = BreakerConfig::default();
            c.failures = 3;
            c.cooldown_ms = 500;
            c
        }))
        .scorer(CacheAwareCost::new(1.5, 32), 2.0)
        .scorer(LoadScorer, 0.5)
        .picker(MaxScore::default())
        .build()
        .unwrap();
    assert_eq!(format!("{:?}", loaded["p"]), format!("{code:?}"));
}

fn line_of(err: Error) -> (usize, String) {
    match err {
        Error::Config { line, message } => (line, message),
        other => panic!("not a config error: {other:?}"),
    }
}

#[test]
fn bad_configs_are_refused_with_their_line() {
    let (reg, _) = registry();
    let cases: &[(&str, usize, &str)] = &[
        (
            "[profiles.p]\npicker = { type = \"max-score\" }\nfilters = [{ type = \"healthy\" }]\n",
            3,
            "unknown plugin type `healthy`",
        ),
        (
            "[profiles.p]\n\npicker = { type = \"max-score\", colour = 1 }\n",
            3,
            "unknown parameter `colour`",
        ),
        (
            "[profiles.p]\npicker = { type = \"max-score\" }\nfilters = [{ type = \"circuit-breaker\", failures = \"three\" }]\n",
            3,
            "invalid type",
        ),
        (
            "[profiles.p]\npicker = { type = \"max-score\" }\nfilters = [{ type = \"role\", role = \"cook\" }]\n",
            3,
            "unknown variant",
        ),
        (
            "[profiles.p]\ninputs = [\"prompt_tokens\", \"cache_hits\"]\npicker = { type = \"max-score\" }\nscorers = [{ type = \"predicted-ttft\", tier_top_k = 5 }]\n",
            4,
            "`tier_top_k` must be at most 4",
        ),
        (
            "[profiles.p]\ninputs = [\"prompt_tokens\", \"cache_hits\"]\npicker = { type = \"max-score\" }\nscorers = [{ type = \"predicted-ttft\", token_us = -1.0 }]\n",
            4,
            "must be finite and >= 0",
        ),
        (
            "[profiles.p]\ninputs = [\"chain\"]\nprepare = [{ type = \"speculative\", ttl_ms = 0 }]\npicker = { type = \"max-score\" }\n",
            3,
            "must be positive",
        ),
        (
            "[profiles.p]\ninputs = [\"chain\"]\npicker = { type = \"smg-cache-aware\", cache_threshold = 1.5 }\n",
            3,
            "`cache_threshold` must be in 0..=1",
        ),
        (
            "[profiles.p]\npicker = { type = \"max-score\" }\nsorcerers = []\n",
            3,
            "unknown field `sorcerers`",
        ),
        (
            "[profiles.p]\npicker = { type = \"health\" }\n",
            2,
            "is a filter, listed under picker",
        ),
        (
            "[profiles.p]\npicker = { type = \"max-score\" }\nscorers = [{ type = \"prefix-cache\" }]\n",
            2,
            "needs `cache_hits`",
        ),
        (
            "[profiles.p]\ninputs = [\"chian\"]\npicker = { type = \"max-score\" }\n",
            2,
            "unknown input key `chian`",
        ),
        (
            "[profiles.p]\npicker = { type = \"max-score\" }\nscorers = [{ type = \"load\", weight = -1.0 }]\n",
            2,
            "invalid weight",
        ),
        ("[profiles.p\n", 1, ""),
        (
            "[profiles.p]\nfilters = [{ type = \"health\", weight = 2.0 }]\npicker = { type = \"max-score\" }\n",
            2,
            "only scorers take a `weight`",
        ),
    ];
    for (text, line, needle) in cases {
        let (got_line, msg) = line_of(reg.load(text).map(|_| ()).unwrap_err());
        assert_eq!(got_line, *line, "line for {text:?}: {msg}");
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
    }
    // No picker at all.
    let (_, msg) = line_of(
        reg.load("[profiles.p]\nfilters = [{ type = \"health\" }]\n")
            .unwrap_err(),
    );
    assert!(msg.contains("no picker"), "{msg}");
}

#[test]
fn plugins_needing_an_index_say_so_without_one() {
    let reg = Registry::with_builtins();
    let (_, msg) = line_of(reg.load(DEFAULT_PROFILE_TOML).unwrap_err());
    assert!(msg.contains("needs an index"), "{msg}");
}

#[test]
fn custom_plugins_register_by_name_and_one_type_can_appear_twice() {
    let (mut reg, _) = registry();
    reg.register("prefer-even", |p, _| {
        p.none()?;
        Ok(Built::Scorer(Box::new(scorer_fn(
            "prefer-even",
            |_, pod| {
                if pod.id.slot() % 2 == 0 { 1.0 } else { 0.0 }
            },
        ))))
    });
    let text = r#"
[profiles.custom]
filters = [{ type = "role", role = "decode" }, { type = "role", name = "also-both", role = "both" }]
scorers = [{ type = "prefer-even" }]
picker = { type = "max-score" }
"#;
    let profiles = reg.load(text).unwrap();
    let mut pods = super::pods(4);
    let d = profiles["custom"]
        .decide(&mut router_policy::Context::new(), &mut pods)
        .unwrap();
    assert_eq!(d.pod.slot() % 2, 0);
    // Two of a type without distinct names is a duplicate.
    let dup = "[profiles.d]\nfilters = [{ type = \"health\" }, { type = \"health\" }]\npicker = { type = \"random\" }\n";
    let (_, msg) = line_of(reg.load(dup).unwrap_err());
    assert!(msg.contains("two plugins are named `health`"), "{msg}");
}

#[test]
fn profiles_embedded_in_a_larger_document_keep_its_line_numbers() {
    let (reg, _) = registry();
    let doc = "[gateway]\nmodel = \"m\"\n\n[profiles.a]\npicker = { type = \"round-robin\" }\n";
    let profiles = reg.load_embedded(doc).unwrap();
    assert_eq!(profiles.keys().collect::<Vec<_>>(), ["a"]);
    // The strict loader refuses the gateway's table; the embedded one does not.
    assert!(reg.load(doc).is_err());
    assert!(reg.load_embedded("[gateway]\n").unwrap().is_empty());
    let bad = "[gateway]\nx = 1\n[profiles.a]\npicker = { type = \"max-scor\" }\n";
    let (line, message) = line_of(reg.load_embedded(bad).unwrap_err());
    assert_eq!(line, 4, "{message}");
}
