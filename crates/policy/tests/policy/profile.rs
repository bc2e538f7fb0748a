//! Profile validation: each failure yields its error, before any traffic.

use router_policy::builtin::{
    CacheAwareCost, HealthFilter, LoadScorer, MaxScore, PrefixCacheScorer, RoundRobin,
};
use router_policy::keys::{CACHE_HITS, CHAIN, PROMPT_TOKENS};
use router_policy::{Context, Error, Key, Profile, filter_fn, scorer_fn};

use super::pods;

#[test]
fn a_need_without_a_producer_names_plugin_and_key() {
    let err = Profile::builder("p")
        .scorer(PrefixCacheScorer, 1.0)
        .picker(MaxScore::default())
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        Error::MissingProducer {
            profile: "p".into(),
            plugin: "prefix-cache".into(),
            key: "cache_hits",
        }
    );
    assert!(
        err.to_string()
            .contains("`prefix-cache` needs `cache_hits`")
    );
    // Declared as an input, the same need is met.
    assert!(
        Profile::builder("p")
            .input(CACHE_HITS.id())
            .scorer(PrefixCacheScorer, 1.0)
            .picker(MaxScore::default())
            .build()
            .is_ok()
    );
}

#[test]
fn a_key_of_another_type_does_not_satisfy_a_need() {
    const FAKE_HITS: Key<u32> = Key::new("cache_hits");
    let err = Profile::builder("p")
        .input(FAKE_HITS.id())
        .scorer(PrefixCacheScorer, 1.0)
        .picker(MaxScore::default())
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::MissingProducer { .. }), "{err:?}");
}

#[test]
fn no_picker_bad_weights_and_duplicate_names_are_refused() {
    assert_eq!(
        Profile::builder("p")
            .filter(HealthFilter)
            .build()
            .unwrap_err(),
        Error::NoPicker {
            profile: "p".into()
        }
    );
    for w in [-1.0, f64::NAN, f64::INFINITY] {
        let err = Profile::builder("p")
            .scorer(LoadScorer, w)
            .picker(MaxScore::default())
            .build()
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidWeight { ref plugin, .. } if plugin == "load"),
            "{err:?}"
        );
    }
    let err = Profile::builder("p")
        .scorer(LoadScorer, 1.0)
        .scorer(scorer_fn("load", |_, _| 0.5), 1.0)
        .picker(MaxScore::default())
        .build()
        .unwrap_err();
    assert_eq!(
        err,
        Error::DuplicateName {
            profile: "p".into(),
            plugin: "load".into()
        }
    );
}

#[test]
fn filters_that_empty_the_set_name_themselves() {
    let profile = Profile::builder("p")
        .filter(filter_fn("nobody", |_, _| false))
        .picker(RoundRobin::default())
        .build()
        .unwrap();
    let err = profile
        .decide(&mut Context::new(), &mut pods(3))
        .unwrap_err();
    assert_eq!(
        err,
        Error::NoCandidates {
            filter: "nobody".into()
        }
    );
    let err = profile
        .decide(&mut Context::new(), &mut vec![])
        .unwrap_err();
    assert_eq!(
        err,
        Error::NoCandidates {
            filter: "fleet".into()
        }
    );
}

#[test]
fn weights_combine_scorers() {
    // Pod 0 has the cache, pod 1 is idle; the weights decide.
    let mut ps = pods(2);
    ps[0].in_flight = 10;
    let favour = |wc: f64, wl: f64| {
        Profile::builder("p")
            .scorer(
                scorer_fn("cached", |_, p| if p.id.slot() == 0 { 1.0 } else { 0.0 }),
                wc,
            )
            .scorer(LoadScorer, wl)
            .picker(MaxScore::default())
            .build()
            .unwrap()
            .decide(&mut Context::new(), &mut ps.clone())
            .unwrap()
            .pod
            .slot()
    };
    assert_eq!(favour(2.0, 1.0), 0);
    assert_eq!(favour(1.0, 2.0), 1);
}

#[test]
fn the_default_profile_builds_and_needs_its_inputs() {
    let index = router_index::Index::<4>::new(router_index::IndexConfig::default());
    let p = router_policy::default_profile(index, 16);
    assert_eq!(p.name(), "cache-aware");
    // Without its inputs the cost scorer's needs are unmet.
    let err = Profile::builder("p")
        .input(CHAIN.id())
        .input(CACHE_HITS.id())
        .scorer(CacheAwareCost::new(1.0, 16), 1.0)
        .picker(MaxScore::default())
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::MissingProducer { key, .. } if key == PROMPT_TOKENS.name()));
}
