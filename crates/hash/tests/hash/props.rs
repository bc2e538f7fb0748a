//! Properties of the chain, for arbitrary tokens, block sizes and namespaces.

use proptest::prelude::*;
use router_core::Namespace;
use router_hash::{ChainHasher, ExtraKey};

fn tokens() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..200_000, 0..200)
}

fn namespace() -> impl Strategy<Value = Namespace> {
    let field = || prop::option::of("[a-z0-9/-]{0,8}");
    (field(), field(), field()).prop_map(|(m, l, s)| {
        let mut ns = Namespace::default();
        ns.model = m;
        ns.lora_name = l;
        ns.cache_salt = s;
        ns
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn chain_of_a_prefix_is_a_prefix_of_the_chain(
        toks in tokens(), cut in 0usize..200, bs in 1usize..20, ns in namespace()
    ) {
        let h = ChainHasher::new(bs).unwrap();
        let full = h.chain(&ns, &toks);
        let cut = cut.min(toks.len());
        let part = h.chain(&ns, &toks[..cut]);
        prop_assert_eq!(full.len(), toks.len() / bs);
        prop_assert_eq!(part.len(), cut / bs);
        prop_assert_eq!(&full[..part.len()], &part[..]);
    }

    #[test]
    fn changing_a_token_changes_its_block_and_every_later_one_only(
        toks in prop::collection::vec(0u32..200_000, 1..200),
        at in 0usize..200, delta in 1u32..1000, bs in 1usize..20, ns in namespace()
    ) {
        let h = ChainHasher::new(bs).unwrap();
        let at = at % toks.len();
        let mut changed = toks.clone();
        changed[at] = changed[at].wrapping_add(delta);
        let a = h.chain(&ns, &toks);
        let b = h.chain(&ns, &changed);
        let block = at / bs;
        for i in 0..a.len() {
            if i < block {
                prop_assert_eq!(a[i], b[i], "earlier block {} changed", i);
            } else {
                prop_assert_ne!(a[i], b[i], "block {} kept its hash", i);
            }
        }
    }

    #[test]
    fn different_namespaces_never_share_a_hash(
        toks in prop::collection::vec(0u32..200_000, 4..100),
        a in namespace(), b in namespace(), bs in 1usize..8
    ) {
        prop_assume!(a != b);
        let h = ChainHasher::new(bs).unwrap();
        let ca = h.chain(&a, &toks);
        let cb = h.chain(&b, &toks);
        for x in &ca {
            prop_assert!(!cb.contains(x));
        }
    }

    #[test]
    fn incremental_extension_equals_hashing_from_scratch(
        toks in tokens(), cuts in prop::collection::vec(0usize..200, 0..6),
        bs in 1usize..20, ns in namespace(),
        img in prop::option::of((0usize..200, 1usize..40, any::<u64>()))
    ) {
        let h = ChainHasher::new(bs).unwrap();
        let extras: Vec<ExtraKey> = img
            .map(|(s, len, k)| ExtraKey::new(s, s + len, k))
            .into_iter()
            .collect();
        let scratch = h.chain_with_extras(&ns, &toks, &extras);
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(toks.len())).collect();
        cuts.push(toks.len());
        cuts.sort_unstable();
        let mut chain = h.start(&ns);
        let mut from = 0;
        for (i, &c) in cuts.iter().enumerate() {
            // Extra keys may arrive with the first piece or any later one,
            // as long as they come before the blocks they cover complete.
            let give = if i == 0 { &extras[..] } else { &[][..] };
            chain.push_with_extras(&toks[from..c], give);
            from = c;
            prop_assert_eq!(chain.hashes(), &scratch[..c / bs]);
        }
        prop_assert_eq!(chain.token_count(), toks.len());
        prop_assert_eq!(chain.pending_tokens(), &toks[toks.len() / bs * bs..]);
    }
}
