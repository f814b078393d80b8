use super::*;
use proptest::prelude::*;

const S: u64 = 1_000_000_000;
const MB: u64 = 1_000_000;

fn director(store: u64) -> Director {
    Director::new(Config { heartbeat_timeout_ns: 3 * S, store_capacity: store, cache_bound_pct: None })
}

fn clips(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn placement_prefers_the_cache_then_the_least_loaded() {
    let mut d = director(100 * MB);
    d.register(NodeId(1), 10 * MB, clips(&[]), 0);
    d.register(NodeId(2), 10 * MB, clips(&["film"]), 0);
    d.register(NodeId(3), 20 * MB, clips(&[]), 0);
    // The node with the clip cached, though others are emptier.
    let p = d.place("film", 1_000, 2 * MB, 0, 0).unwrap();
    assert_eq!((p.node, p.from_store), (NodeId(2), false));
    // Another clip: least loaded after placing, as a fraction: node 3 (2/20) over 1 (2/10).
    let p = d.place("news", 1_000, 2 * MB, 0, 0).unwrap();
    assert_eq!((p.node, p.from_store), (NodeId(3), true));
    assert_eq!(d.store_load(), 2 * MB);
    // Node 3 now fetches "news": the next stream of it goes there without the store.
    let p = d.place("news", 1_000, 2 * MB, 0, 0).unwrap();
    assert_eq!((p.node, p.from_store), (NodeId(3), false));
    assert_eq!(d.store_load(), 2 * MB);
    // Equal fractions: the lowest id.
    let mut d = director(100 * MB);
    d.register(NodeId(7), 10 * MB, clips(&[]), 0);
    d.register(NodeId(5), 10 * MB, clips(&[]), 0);
    assert_eq!(d.place("x", 1, MB, 0, 0).unwrap().node, NodeId(5));
}

#[test]
fn admission_says_which_limit_refused() {
    let mut d = director(3 * MB);
    assert_eq!(d.place("a", 10, MB, 0, 0), Err(Refused::NoNodes));
    d.register(NodeId(1), 4 * MB, clips(&["cached"]), 0);
    d.register(NodeId(2), 4 * MB, clips(&[]), 0);
    assert_eq!(d.place("a", 10, 0, 0, 0), Err(Refused::Bad("a rate of 0")));
    assert_eq!(d.place("a", 10, MB, 11, 0), Err(Refused::Bad("an offset past the clip's end")));
    d.place("a", 10, 3 * MB, 0, 0).unwrap();
    // The store is full: an uncached clip is refused even though node 1 has room...
    assert_eq!(d.place("b", 10, MB, 0, 0), Err(Refused::StoreFull { rate: MB, free: 0 }));
    // ...but a clip node 1 has cached is not.
    assert_eq!(d.place("cached", 10, MB, 0, 0).unwrap().node, NodeId(1));
    assert!(
        matches!(d.place("cached", 10, 5 * MB, 0, 0), Err(Refused::NodesFull { most_free, .. }) if most_free == 4 * MB)
    );
    // Closing frees both the node and the store.
    let all: Vec<StreamId> = (1..=2).map(StreamId).collect();
    for s in all {
        assert!(d.close(s));
    }
    assert!(!d.close(StreamId(99)));
    assert_eq!(d.store_load(), 0);
    assert!(d.nodes().values().all(|n| n.load == 0 && n.streams.is_empty()));
}

#[test]
fn a_dead_node_has_its_streams_moved_at_their_positions() {
    let mut d = director(100 * MB);
    d.register(NodeId(1), 10 * MB, clips(&[]), 0);
    d.register(NodeId(2), 10 * MB, clips(&[]), 0);
    let a = d.place("film", 100 * MB, 2 * MB, 5_000, 0).unwrap();
    assert_eq!(a.node, NodeId(1));
    let b = d.place("film", 100 * MB, 2 * MB, 0, S).unwrap();
    // Node 2 is emptier, but node 1 fetches "film" already.
    assert_eq!(b.node, NodeId(1));
    // Node 2 keeps reporting; node 1 goes silent after 1 s.
    d.heartbeat(NodeId(1), clips(&[]), S);
    for t in 2..=4 {
        d.heartbeat(NodeId(2), clips(&[]), t * S);
        assert!(d.tick(t * S).is_empty(), "not yet dead at {t} s");
    }
    d.heartbeat(NodeId(2), clips(&[]), 5 * S);
    let moved = d.tick(5 * S);
    assert_eq!(moved.len(), 2);
    let m = &moved[0];
    assert_eq!((m.stream, m.from), (a.stream, NodeId(1)));
    // 5 s at 2 MB/s from byte 5000.
    let p = m.to.as_ref().unwrap();
    assert_eq!((p.node, p.offset, p.from_store), (NodeId(2), 5_000 + 10 * MB, true));
    // 4 s at 2 MB/s from byte 0, and node 2 now has the clip coming.
    let p = moved[1].to.as_ref().unwrap();
    assert_eq!((p.node, p.offset, p.from_store), (NodeId(2), 8 * MB, false));
    assert_eq!(d.stream(a.stream, 6 * S), Some((NodeId(2), 5_000 + 12 * MB)));
    assert!(!d.nodes().contains_key(&NodeId(1)));
    assert!(!d.heartbeat(NodeId(1), clips(&[]), 6 * S), "a dead node must register again");
    // Positions stop at the clip's end.
    assert_eq!(d.stream(a.stream, 1_000 * S), Some((NodeId(2), 100 * MB)));
}

#[test]
fn streams_with_no_room_left_are_dropped_and_said_so() {
    let mut d = director(100 * MB);
    d.register(NodeId(1), 10 * MB, clips(&[]), 0);
    d.register(NodeId(2), 3 * MB, clips(&[]), 0);
    let placed: Vec<Placement> = ["a", "b", "c"].iter().map(|c| d.place(c, 10 * MB, 2 * MB, 0, 0).unwrap()).collect();
    assert!(placed.iter().all(|p| p.node == NodeId(1)), "{placed:?}");
    // Node 1 dies: node 2 has room for one of its three streams.
    let moved = d.node_lost(NodeId(1), S);
    assert_eq!(moved.len(), 3);
    assert_eq!(moved[0].to.as_ref().map(|p| p.node), Ok(NodeId(2)));
    assert!(moved[1..]
        .iter()
        .all(|m| matches!(m.to, Err(Refused::NodesFull { rate, most_free }) if rate == 2 * MB && most_free == MB)));
    assert_eq!(d.stream_count(), 1);
    assert!(d.node_lost(NodeId(9), S).is_empty());
    // A node registering again under its id starts empty: its stream moves away.
    d.register(NodeId(1), 10 * MB, clips(&[]), 2 * S);
    d.register(NodeId(2), 10 * MB, clips(&[]), 2 * S);
    assert_eq!(d.stream(placed[0].stream, 2 * S), Some((NodeId(1), 4 * MB)));
    assert_eq!(d.nodes()[&NodeId(1)].load, 2 * MB);
    assert_eq!(d.nodes()[&NodeId(2)].load, 0);
}

/// Bounded-load placement: one popular clip spreads once its node is busier than
/// the cluster by the bound, and the cache is still used below it.
#[test]
fn a_cached_node_is_preferred_only_within_the_bound() {
    let mut d =
        Director::new(Config { heartbeat_timeout_ns: 3 * S, store_capacity: 1 << 40, cache_bound_pct: Some(125) });
    for id in 1..=4 {
        d.register(NodeId(id), 100 * MB, clips(&[]), 0);
    }
    // Unbounded, every stream of "film" would go to node 1 (the unbounded test above).
    let nodes: Vec<u32> = (0..8).map(|_| d.place("film", 10 * MB, MB, 0, 0).unwrap().node.0).collect();
    // 1 on node 1; the 2nd would make node 1 2/100 against 1.25 × 2/400: past the bound.
    assert_eq!(nodes, vec![1, 2, 3, 4, 1, 2, 3, 4]);
    // Below the bound the cache wins over the least loaded: node 1 has "a" cached;
    // 10 streams of "b" spread 5/5; then "a" goes to node 1 while its load after placing
    // is within 1.25 × the cluster's (6, 7, 8 of 100 against 6.9, 7.5, 8.1), and the
    // 4th (9 against 8.75) to node 2.
    let mut d =
        Director::new(Config { heartbeat_timeout_ns: 3 * S, store_capacity: 1 << 40, cache_bound_pct: Some(125) });
    d.register(NodeId(1), 100 * MB, clips(&["a"]), 0);
    d.register(NodeId(2), 100 * MB, clips(&[]), 0);
    let b: Vec<u32> = (0..10).map(|_| d.place("b", 10 * MB, MB, 0, 0).unwrap().node.0).collect();
    assert_eq!(b, vec![1, 2, 1, 2, 1, 2, 1, 2, 1, 2]);
    let a: Vec<Placement> = (0..4).map(|_| d.place("a", 10 * MB, MB, 0, 0).unwrap()).collect();
    assert_eq!(a.iter().map(|p| p.node.0).collect::<Vec<_>>(), vec![1, 1, 1, 2]);
    assert_eq!(a.iter().map(|p| p.from_store).collect::<Vec<_>>(), vec![false, false, false, true]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// With a cache bound, any run of placements and closes: a node chosen for its
    /// cache is within the bound; otherwise no eligible node within the bound had the
    /// clip cached, and none is less loaded after placing; no node gets a stream that
    /// puts it past the bound while a node with room would stay within it.
    #[test]
    fn bounded_placement(
        caps in proptest::collection::vec(1u64..20, 1..6),
        ops in proptest::collection::vec((0u8..4, 1u64..4, any::<bool>()), 1..80),
        pct in 100u32..200,
    ) {
        let mut d = Director::new(Config { heartbeat_timeout_ns: u64::MAX, store_capacity: 1 << 40, cache_bound_pct: Some(pct) });
        for (i, c) in caps.iter().enumerate() {
            d.register(NodeId(i as u32), c * MB, clips(&[]), 0);
        }
        let mut open = Vec::new();
        for (clip, rate, close) in ops {
            if close && !open.is_empty() {
                let s = open.remove(0);
                prop_assert!(d.close(s));
                continue;
            }
            let name = clip_name(clip);
            let rate = rate * MB / 2;
            let snap = d.clone();
            let (all_l, all_c) = snap.nodes().values().fold((rate as u128, 0u128), |(l, c), n| (l + n.load as u128, c + n.capacity as u128));
            let within = |n: &NodeState| (n.load as u128 + rate as u128) * all_c * 100 <= u128::from(pct) * all_l * n.capacity as u128;
            let fits = |n: &NodeState| n.capacity - n.load >= rate;
            let frac = |n: &NodeState| (n.load + rate) as f64 / n.capacity as f64;
            match d.place(&name, CLIP_LEN, rate, 0, 0) {
                Ok(p) => {
                    open.push(p.stream);
                    let chosen = &snap.nodes()[&p.node];
                    prop_assert!(fits(chosen));
                    let pref = |n: &NodeState| n.cached.contains(&name) && within(n);
                    if pref(chosen) {
                        for (id, n) in snap.nodes() {
                            if *id != p.node && fits(n) && pref(n) {
                                prop_assert!(frac(n) >= frac(chosen) - 1e-12);
                            }
                        }
                    } else {
                        prop_assert!(!snap.nodes().values().any(|n| fits(n) && pref(n)), "a cached node within the bound was passed over");
                        for (id, n) in snap.nodes() {
                            if *id != p.node && fits(n) {
                                prop_assert!(frac(n) >= frac(chosen) - 1e-12, "{:?} less loaded than {:?}", id, p.node);
                            }
                        }
                    }
                }
                Err(Refused::NodesFull { .. }) => prop_assert!(snap.nodes().values().all(|n| !fits(n))),
                Err(e) => prop_assert!(false, "refused: {:?}", e),
            }
        }
    }
}

/// One step of a run.
#[derive(Clone, Debug)]
enum Op {
    Register { node: u32, capacity: u64, cached: Vec<u8> },
    Heartbeat { node: u32, cached: Vec<u8> },
    Place { clip: u8, rate: u64, offset_pct: u8 },
    Close { nth: usize },
    Lost { node: u32 },
    Wait { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => (0u32..6, 1u64..50, proptest::collection::vec(0u8..5, 0..3))
            .prop_map(|(node, c, cached)| Op::Register { node, capacity: c * MB, cached }),
        4 => (0u32..6, proptest::collection::vec(0u8..5, 0..3)).prop_map(|(node, cached)| Op::Heartbeat { node, cached }),
        6 => (0u8..5, 1u64..20, 0u8..=100).prop_map(|(clip, r, offset_pct)| Op::Place { clip, rate: r * MB / 2, offset_pct }),
        2 => (0usize..50).prop_map(|nth| Op::Close { nth }),
        1 => (0u32..6).prop_map(|node| Op::Lost { node }),
        4 => (1u64..2_000).prop_map(|ms| Op::Wait { ms }),
    ]
}

fn clip_name(c: u8) -> String {
    format!("clip{c}")
}

const CLIP_LEN: u64 = 500 * MB;

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Any run of registrations, heartbeats, placements, closes, losses and waits on a
    /// virtual clock, with a tick after every step: loads add up and stay within every
    /// node's and the store's capacity; every stream is on a live node; a refusal is
    /// justified; a placement prefers the cache, then the least loaded; a silent node is
    /// dead within the timeout plus one step, and its streams resume where they were.
    #[test]
    fn director_invariants(ops in proptest::collection::vec(op(), 1..120), store_mb in 1u64..80) {
        let timeout = 3 * S;
        let mut d = Director::new(Config { heartbeat_timeout_ns: timeout, store_capacity: store_mb * MB, cache_bound_pct: None });
        let mut now = 0u64;
        let mut open: Vec<StreamId> = Vec::new();
        for op in ops {
            // Positions of every stream just before this step, to check where moved
            // streams resume.
            let before: BTreeMap<StreamId, (NodeId, u64)> = match &op {
                Op::Wait { ms } => {
                    let t = now + ms * 1_000_000;
                    open.iter().filter_map(|s| d.stream(*s, t).map(|p| (*s, p))).collect()
                }
                _ => open.iter().filter_map(|s| d.stream(*s, now).map(|p| (*s, p))).collect(),
            };
            let check_moves = |d: &Director, moved: &[Moved], before: &BTreeMap<StreamId, (NodeId, u64)>, now: u64| -> Result<(), TestCaseError> {
                for m in moved {
                    let (from, pos) = before[&m.stream];
                    prop_assert_eq!(from, m.from);
                    match &m.to {
                        Ok(p) => {
                            prop_assert_eq!(p.offset, pos, "resumes where its schedule was");
                            prop_assert!(p.node != m.from);
                            prop_assert_eq!(d.stream(m.stream, now), Some((p.node, pos)));
                        }
                        Err(_) => prop_assert_eq!(d.stream(m.stream, now), None),
                    }
                }
                Ok(())
            };
            let mut moved = Vec::new();
            match op {
                Op::Register { node, capacity, cached } => {
                    let prev = d.nodes().get(&NodeId(node)).map(|n| n.streams.clone()).unwrap_or_default();
                    d.register(NodeId(node), capacity, cached.into_iter().map(clip_name), now);
                    // Its old streams went elsewhere or were dropped.
                    for s in prev {
                        prop_assert!(d.stream(s, now).map_or(true, |(n, _)| n != NodeId(node)));
                    }
                }
                Op::Heartbeat { node, cached } => {
                    let known = d.nodes().contains_key(&NodeId(node));
                    prop_assert_eq!(d.heartbeat(NodeId(node), cached.into_iter().map(clip_name), now), known);
                }
                Op::Place { clip, rate, offset_pct } => {
                    let name = clip_name(clip);
                    let snapshot = d.clone();
                    let offset = CLIP_LEN / 100 * u64::from(offset_pct);
                    match d.place(&name, CLIP_LEN, rate, offset, now) {
                        Ok(p) => {
                            prop_assert_eq!(p.offset, offset);
                            open.push(p.stream);
                            let fits = |n: &NodeState| n.capacity - n.load >= rate;
                            let chosen = &snapshot.nodes()[&p.node];
                            prop_assert!(fits(chosen));
                            prop_assert_eq!(p.from_store, !chosen.cached.contains(&name));
                            // A cached node with room would have been chosen.
                            if p.from_store {
                                prop_assert!(!snapshot.nodes().values().any(|n| fits(n) && n.cached.contains(&name)));
                            }
                            // No eligible node of the same kind is less loaded after placing.
                            let frac = |n: &NodeState| (n.load + rate) as f64 / n.capacity as f64;
                            for (id, n) in snapshot.nodes() {
                                let same = n.cached.contains(&name) != p.from_store;
                                if *id != p.node && same && fits(n) {
                                    prop_assert!(frac(n) >= frac(chosen) - 1e-12, "{:?} less loaded than {:?}", id, p.node);
                                }
                            }
                        }
                        Err(Refused::NoNodes) => prop_assert!(snapshot.nodes().is_empty()),
                        Err(Refused::NodesFull { .. }) => {
                            prop_assert!(snapshot.nodes().values().all(|n| n.capacity - n.load < rate));
                        }
                        Err(Refused::StoreFull { free, .. }) => {
                            prop_assert!(free < rate);
                            prop_assert!(snapshot.nodes().values().all(|n| n.capacity - n.load < rate || !n.cached.contains(&name)));
                        }
                        Err(Refused::Bad(w)) => prop_assert!(false, "refused a good request: {}", w),
                    }
                }
                Op::Close { nth } => {
                    if !open.is_empty() {
                        let s = open.remove(nth % open.len());
                        let was = d.stream(s, now).is_some();
                        prop_assert_eq!(d.close(s), was);
                    }
                }
                Op::Lost { node } => moved = d.node_lost(NodeId(node), now),
                Op::Wait { ms } => now += ms * 1_000_000,
            }
            check_moves(&d, &moved, &before, now)?;
            let before: BTreeMap<StreamId, (NodeId, u64)> =
                open.iter().filter_map(|s| d.stream(*s, now).map(|p| (*s, p))).collect();
            let moved = d.tick(now);
            check_moves(&d, &moved, &before, now)?;
            open.retain(|s| d.stream(*s, now).is_some());
            // Loads add up and stay within capacities.
            let mut store = 0u64;
            let mut per_node: BTreeMap<NodeId, u64> = BTreeMap::new();
            for s in &open {
                let (n, _) = d.stream(*s, now).unwrap();
                prop_assert!(d.nodes().contains_key(&n), "stream on a dead node");
                let st = &d.streams[s];
                *per_node.entry(n).or_default() += st.rate;
                if st.from_store {
                    store += st.rate;
                }
            }
            prop_assert_eq!(open.len(), d.stream_count());
            prop_assert_eq!(store, d.store_load());
            prop_assert!(store <= d.config().store_capacity);
            for (id, n) in d.nodes() {
                prop_assert_eq!(n.load, per_node.get(id).copied().unwrap_or(0));
                prop_assert!(n.load <= n.capacity);
                // Nobody silent past the timeout survives a tick.
                prop_assert!(now - n.last_seen_ns <= timeout);
            }
        }
    }
}
