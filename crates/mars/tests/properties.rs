//! Property tests of the pure cores: DRR shares, starvation and cost; the stripe map;
//! byte ranges. A fixed seed (proptest's default config reads PROPTEST_RNG_SEED and
//! PROPTEST_CASES to explore further).

use ictus_mars::drr::{ClassId, Drr, Request};
use ictus_mars::label::Geometry;
use ictus_mars::range::{resolve, Ranges};
use proptest::prelude::*;

/// (quantum, request sizes) per class.
fn classes() -> impl Strategy<Value = (u32, Vec<(u32, Vec<u32>)>)> {
    (1u32..=64).prop_flat_map(|max| {
        (Just(max), prop::collection::vec((max..=8 * max, prop::collection::vec(1..=max, 1..40)), 1..6))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Classes backlogged throughout get, over K rounds, K·Q ± the largest request.
    #[test]
    fn backlogged_classes_share_in_proportion_to_quanta((max, cls) in classes(), rounds in 1u64..30) {
        let mut d = Drr::new(max);
        let ids: Vec<ClassId> = cls.iter().enumerate().map(|(i, (q, _))| d.add_class(&format!("c{i}"), *q).unwrap()).collect();
        // Enough requests that every class stays backlogged for `rounds` rounds.
        for (id, (q, sizes)) in ids.iter().zip(&cls) {
            let mut queued = 0u64;
            let mut i = 0;
            while queued < (rounds + 2) * u64::from(*q) + u64::from(max) {
                let s = sizes[i % sizes.len()];
                d.enqueue(*id, Request { position: i as u64 * 7919 % 1000, sectors: s, payload: () }).unwrap();
                queued += u64::from(s);
                i += 1;
            }
        }
        let mut served = vec![0u64; ids.len()];
        while d.rounds() <= rounds {
            let before = d.rounds();
            let Some((c, r)) = d.dispatch() else { break };
            if d.rounds() > rounds && d.rounds() != before { break; }
            served[usize::from(c.0)] += u64::from(r.sectors);
        }
        for ((q, _), got) in cls.iter().zip(&served) {
            let ideal = rounds * u64::from(*q);
            prop_assert!(*got + u64::from(max) >= ideal && *got <= ideal + u64::from(max),
                "quantum {q}, {rounds} rounds: served {got}, ideal {ideal}");
        }
    }

    /// A request enqueued in any state is dispatched before each other class has had
    /// more than two quanta plus a carried deficit (the round in progress and the next;
    /// DRR's bound over K rounds is K·Q + the largest request).
    #[test]
    fn no_class_starves((max, cls) in classes(), victim_size in 1u32..=64, after in 0usize..50) {
        let victim_size = victim_size.min(max);
        let mut d = Drr::new(max);
        let ids: Vec<ClassId> = cls.iter().enumerate().map(|(i, (q, _))| d.add_class(&format!("c{i}"), *q).unwrap()).collect();
        let victim = d.add_class("victim", max).unwrap();
        for (id, (_, sizes)) in ids.iter().zip(&cls) {
            for (i, s) in sizes.iter().cycle().take(400).enumerate() {
                d.enqueue(*id, Request { position: i as u64, sectors: *s, payload: false }).unwrap();
            }
        }
        for _ in 0..after { d.dispatch(); }
        d.enqueue(victim, Request { position: 0, sectors: victim_size, payload: true }).unwrap();
        let mut others = vec![0u64; ids.len()];
        loop {
            let (c, r) = d.dispatch().expect("the victim is still queued");
            if r.payload { break; }
            others[usize::from(c.0)] += u64::from(r.sectors);
        }
        for ((q, _), got) in cls.iter().zip(&others) {
            prop_assert!(*got <= 2 * u64::from(*q) + u64::from(max), "another class got {got} sectors (quantum {q}) before the victim");
        }
    }

    /// Elementary steps stay within a constant per request.
    #[test]
    fn constant_work_per_request((max, cls) in classes(), ops in prop::collection::vec((0usize..6, any::<bool>()), 1..500)) {
        let mut d = Drr::new(max);
        let ids: Vec<ClassId> = cls.iter().enumerate().map(|(i, (q, _))| d.add_class(&format!("c{i}"), *q).unwrap()).collect();
        let mut enqueued = 0u64;
        for (i, (c, dispatch)) in ops.iter().enumerate() {
            if *dispatch {
                d.dispatch();
            } else {
                let k = c % ids.len();
                let sizes = &cls[k].1;
                d.enqueue(ids[k], Request { position: i as u64, sectors: sizes[i % sizes.len()], payload: () }).unwrap();
                enqueued += 1;
            }
        }
        while d.dispatch().is_some() {}
        // One step to enqueue, one to move to a round, and at most one class visit per
        // request moved (every visit of a backlogged class moves one).
        prop_assert!(d.ops() <= 3 * enqueued, "{} steps for {enqueued} requests", d.ops());
    }

    /// The stripe map covers a range exactly, one stripe unit per piece, and no two
    /// volume bytes share a component byte.
    #[test]
    fn the_stripe_map_is_exact_and_injective(units in 1u64..8, n in 1u16..6, per in 1u64..20, off in 0u64..200_000, len in 0u64..200_000) {
        let g = Geometry::new(units * 4096, n, per * units * 4096).unwrap();
        let pieces: Vec<_> = g.map(off, len).collect();
        if off + len > g.capacity() {
            prop_assert!(pieces.is_empty());
        } else {
            prop_assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), len);
            let mut at = 0;
            for p in &pieces {
                prop_assert_eq!(p.at, at);
                prop_assert_eq!(g.locate(off + at), (p.component, p.offset));
                prop_assert!(p.len <= g.interleave);
                at += p.len;
            }
            let mut seen: Vec<(u16, u64)> = (0..len.min(2000)).map(|i| g.locate(off + i)).collect();
            seen.sort_unstable();
            seen.dedup();
            prop_assert_eq!(seen.len() as u64, len.min(2000));
        }
    }

    /// Resolved ranges lie inside the representation and are never empty.
    #[test]
    fn ranges_stay_inside(header in "bytes=[0-9,\\- ]{0,40}", len in 0u64..10_000) {
        if let Ranges::Partial(rs) = resolve(Some(&header), len) {
            prop_assert!(!rs.is_empty());
            for r in rs {
                prop_assert!(r.len >= 1 && r.start + r.len <= len);
            }
        }
    }
}
