//! The director's state and decisions. See the crate's documentation.

use std::collections::{BTreeMap, BTreeSet};

/// A stream node, as the director names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u32);

/// A stream the director placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u64);

/// Tunables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// A node not heard from for this long is dead (ns).
    pub heartbeat_timeout_ns: u64,
    /// What the shared store can serve to nodes without the clip cached (bytes/s).
    pub store_capacity: u64,
    /// A node with the clip cached is preferred only while its load after placing, as
    /// a fraction of its capacity, is at most this percentage of the cluster's (all
    /// live nodes' load after placing over their capacity): bounded-load placement
    /// (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads",
    /// 2018). `None`: the cache always first (a popular clip fills one node before
    /// another gets a stream of it).
    pub cache_bound_pct: Option<u32>,
}

/// The cache bound the director's command uses: a node with the clip cached takes its
/// streams until it is 25 % busier than the cluster's average.
pub const CACHE_BOUND_PCT: u32 = 125;

/// A node as the director sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    /// Bytes/s it can send (its admission limit).
    pub capacity: u64,
    /// Bytes/s of the streams placed on it.
    pub load: u64,
    /// Clips whose stripes it reported cached, and clips it was given streams of
    /// since (it is fetching them now).
    pub cached: BTreeSet<String>,
    /// When it was last heard from (ns).
    pub last_seen_ns: u64,
    /// Its streams.
    pub streams: BTreeSet<StreamId>,
}

/// A placed stream.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stream {
    clip: String,
    clip_len: u64,
    rate: u64,
    node: NodeId,
    /// Whether its bytes come from the shared store (its node did not have the clip).
    from_store: bool,
    /// Byte `start` was due at `t0_ns`; `rate` bytes/s since.
    start: u64,
    t0_ns: u64,
}

impl Stream {
    fn position(&self, now_ns: u64) -> u64 {
        let dt = now_ns.saturating_sub(self.t0_ns) as u128;
        let p = self.start as u128 + dt * self.rate as u128 / 1_000_000_000;
        p.min(self.clip_len as u128) as u64
    }
}

/// Where a stream goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Its id.
    pub stream: StreamId,
    /// The node to send the client to.
    pub node: NodeId,
    /// The byte the client starts (or resumes) at.
    pub offset: u64,
    /// Whether the node reads it from the shared store (not cached there).
    pub from_store: bool,
}

/// Why a stream was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No node is alive.
    #[error("no stream node is alive")]
    NoNodes,
    /// No live node has room for the rate.
    #[error("no node has room for {rate} bytes/s (most free: {most_free} bytes/s)")]
    NodesFull {
        /// The stream's rate.
        rate: u64,
        /// The largest free capacity of a live node.
        most_free: u64,
    },
    /// Only nodes without the clip cached have room, and the store does not.
    #[error("the shared store has no room for {rate} bytes/s more ({free} bytes/s free) and no node with room has the clip cached")]
    StoreFull {
        /// The stream's rate.
        rate: u64,
        /// The store's free rate.
        free: u64,
    },
    /// A rate of zero, or an offset past the clip's end.
    #[error("bad request: {0}")]
    Bad(&'static str),
}

/// A stream moved (or dropped) because its node died.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved {
    /// The stream.
    pub stream: StreamId,
    /// The dead node.
    pub from: NodeId,
    /// Its new place, resuming at the position reached; or why none was found (the
    /// stream is then closed).
    pub to: Result<Placement, Refused>,
}

/// The director.
#[derive(Clone, Debug)]
pub struct Director {
    config: Config,
    nodes: BTreeMap<NodeId, NodeState>,
    streams: BTreeMap<StreamId, Stream>,
    store_load: u64,
    next_stream: u64,
}

impl Director {
    /// A director with no nodes.
    pub fn new(config: Config) -> Director {
        Director { config, nodes: BTreeMap::new(), streams: BTreeMap::new(), store_load: 0, next_stream: 1 }
    }

    /// The live nodes.
    pub fn nodes(&self) -> &BTreeMap<NodeId, NodeState> {
        &self.nodes
    }

    /// Bytes/s the shared store serves to the streams placed.
    pub fn store_load(&self) -> u64 {
        self.store_load
    }

    /// The configuration.
    pub fn config(&self) -> Config {
        self.config
    }

    /// Streams placed.
    pub fn stream_count(&self) -> usize {
        self.streams.len()
    }

    /// A stream's node and position at `now_ns`.
    pub fn stream(&self, id: StreamId, now_ns: u64) -> Option<(NodeId, u64)> {
        self.streams.get(&id).map(|s| (s.node, s.position(now_ns)))
    }

    /// A node registers (or registers again after a restart: as a new node, its old
    /// streams already moved) with its sending capacity and the clips it has cached.
    pub fn register(&mut self, node: NodeId, capacity: u64, cached: impl IntoIterator<Item = String>, now_ns: u64) {
        let moved = if self.nodes.contains_key(&node) { self.node_lost(node, now_ns) } else { Vec::new() };
        debug_assert!(moved.iter().all(|m| m.to.as_ref().map_or(true, |p| p.node != node)));
        self.nodes.insert(
            node,
            NodeState {
                capacity,
                load: 0,
                cached: cached.into_iter().collect(),
                last_seen_ns: now_ns,
                streams: BTreeSet::new(),
            },
        );
    }

    /// A node reports in, with the clips it now has cached. Unknown nodes must
    /// register first (`false`).
    pub fn heartbeat(&mut self, node: NodeId, cached: impl IntoIterator<Item = String>, now_ns: u64) -> bool {
        let Some(n) = self.nodes.get_mut(&node) else { return false };
        n.last_seen_ns = n.last_seen_ns.max(now_ns);
        n.cached = cached.into_iter().collect();
        // Clips it is streaming stay counted as cached: it is fetching them.
        for s in &n.streams {
            if let Some(st) = self.streams.get(s) {
                n.cached.insert(st.clip.clone());
            }
        }
        true
    }

    /// Chooses the node for `rate` bytes/s of `clip`, without placing it.
    fn choose(&self, clip: &str, rate: u64) -> Result<(NodeId, bool), Refused> {
        // The cluster's load and capacity after placing, for the cache bound.
        let (all_load, all_cap) =
            self.nodes.values().fold((rate as u128, 0u128), |(l, c), n| (l + n.load as u128, c + n.capacity as u128));
        let within_bound = |n: &NodeState| match self.config.cache_bound_pct {
            None => true,
            // (load + rate) / capacity <= pct/100 × all_load / all_cap, in integers.
            Some(pct) => {
                (n.load as u128 + rate as u128) * all_cap * 100 <= u128::from(pct) * all_load * n.capacity as u128
            }
        };
        let best_pref = |id: NodeId| {
            let b = &self.nodes[&id];
            b.cached.contains(clip) && within_bound(b)
        };
        let live = self.nodes.iter();
        let mut most_free = 0u64;
        let mut best: Option<(NodeId, bool)> = None;
        let mut any = false;
        let mut store_refused = false;
        for (&id, n) in live {
            any = true;
            let free = n.capacity.saturating_sub(n.load);
            most_free = most_free.max(free);
            if free < rate {
                continue;
            }
            let cached = n.cached.contains(clip);
            if !cached && self.store_load.saturating_add(rate) > self.config.store_capacity {
                store_refused = true;
                continue;
            }
            // Preferred for its cache only within the bound; past it, it competes on
            // load like any other node (and still reads nothing from the store).
            let preferred = cached && within_bound(n);
            let better = match best {
                None => true,
                Some((bid, _)) if preferred != best_pref(bid) => preferred,
                Some((bid, _)) => {
                    // Load after placing, as a fraction of capacity, compared exactly:
                    // a/b < c/d  <=>  a*d < c*b.
                    let b = &self.nodes[&bid];
                    let mine = (n.load + rate) as u128 * b.capacity.max(1) as u128;
                    let theirs = (b.load + rate) as u128 * n.capacity.max(1) as u128;
                    mine < theirs || (mine == theirs && id < bid)
                }
            };
            if better {
                best = Some((id, cached));
            }
        }
        match best {
            Some((id, cached)) => Ok((id, !cached)),
            None if !any => Err(Refused::NoNodes),
            None if store_refused => {
                Err(Refused::StoreFull { rate, free: self.config.store_capacity.saturating_sub(self.store_load) })
            }
            None => Err(Refused::NodesFull { rate, most_free }),
        }
    }

    fn insert(&mut self, id: StreamId, s: Stream) {
        let n = self.nodes.get_mut(&s.node).expect("placed on a live node");
        n.load += s.rate;
        n.streams.insert(id);
        // It fetches the clip's stripes now: the next stream of this clip goes there.
        n.cached.insert(s.clip.clone());
        if s.from_store {
            self.store_load += s.rate;
        }
        self.streams.insert(id, s);
    }

    fn remove(&mut self, id: StreamId) -> Option<Stream> {
        let s = self.streams.remove(&id)?;
        if let Some(n) = self.nodes.get_mut(&s.node) {
            n.load -= s.rate;
            n.streams.remove(&id);
        }
        if s.from_store {
            self.store_load -= s.rate;
        }
        Some(s)
    }

    /// Places a stream of `clip` (`clip_len` bytes) at `rate` bytes/s starting at byte
    /// `offset`, due now.
    pub fn place(
        &mut self,
        clip: &str,
        clip_len: u64,
        rate: u64,
        offset: u64,
        now_ns: u64,
    ) -> Result<Placement, Refused> {
        if rate == 0 {
            return Err(Refused::Bad("a rate of 0"));
        }
        if offset > clip_len {
            return Err(Refused::Bad("an offset past the clip's end"));
        }
        let (node, from_store) = self.choose(clip, rate)?;
        let stream = StreamId(self.next_stream);
        self.next_stream += 1;
        let s = Stream { clip: clip.to_string(), clip_len, rate, node, from_store, start: offset, t0_ns: now_ns };
        self.insert(stream, s);
        Ok(Placement { stream, node, offset, from_store })
    }

    /// A stream ended (its client closed, or it reached its end). `false` if unknown.
    pub fn close(&mut self, stream: StreamId) -> bool {
        self.remove(stream).is_some()
    }

    /// Node `node` is gone (its port's dead-name notification, or a missed heartbeat):
    /// its streams are placed again, in stream order, each resuming where its schedule
    /// is at `now_ns`.
    pub fn node_lost(&mut self, node: NodeId, now_ns: u64) -> Vec<Moved> {
        self.lose(&[node], now_ns)
    }

    /// Removes every node of `dead` first (so none of them is given another's streams),
    /// then places their streams again.
    fn lose(&mut self, dead: &[NodeId], now_ns: u64) -> Vec<Moved> {
        let mut taken: Vec<(NodeId, StreamId, Stream)> = Vec::new();
        for node in dead {
            let Some(n) = self.nodes.get(node) else { continue };
            let ids: Vec<StreamId> = n.streams.iter().copied().collect();
            // Take the streams off first so their store share is free again.
            for id in ids {
                if let Some(s) = self.remove(id) {
                    taken.push((*node, id, s));
                }
            }
            self.nodes.remove(node);
        }
        taken.sort_by_key(|(_, id, _)| *id);
        let mut out = Vec::new();
        for (from, id, s) in taken {
            let pos = s.position(now_ns);
            let to = self.choose(&s.clip, s.rate).map(|(to, from_store)| {
                let ns = Stream { node: to, from_store, start: pos, t0_ns: now_ns, ..s };
                self.insert(id, ns);
                Placement { stream: id, node: to, offset: pos, from_store }
            });
            out.push(Moved { stream: id, from, to });
        }
        out
    }

    /// Declares dead every node silent for longer than the heartbeat timeout, and moves
    /// their streams (see [`Director::node_lost`]) to the nodes still alive.
    pub fn tick(&mut self, now_ns: u64) -> Vec<Moved> {
        let timeout = self.config.heartbeat_timeout_ns;
        let dead: Vec<NodeId> = self
            .nodes
            .iter()
            .filter(|(_, n)| now_ns.saturating_sub(n.last_seen_ns) > timeout)
            .map(|(id, _)| *id)
            .collect();
        self.lose(&dead, now_ns)
    }
}

#[cfg(test)]
mod tests;
