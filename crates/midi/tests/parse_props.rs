//! Properties of the MIDI parser and encoder: encode → parse round trips (with and without
//! running status), real-time bytes sprinkled anywhere change nothing else, and arbitrary
//! bytes never panic and are all accounted for.

use ictus_midi::parse::{parse_all, Encoder, Kind, Message, Parser, DEFAULT_MAX_SYSEX};
use ictus_rt::Time;
use proptest::prelude::*;

fn config() -> ProptestConfig {
    let default = ProptestConfig::default();
    let rng_seed = if std::env::var_os("PROPTEST_RNG_SEED").is_some() {
        default.rng_seed
    } else {
        proptest::test_runner::RngSeed::Fixed(0x1c75_0007)
    };
    ProptestConfig { rng_seed, failure_persistence: None, cases: 512, ..default }
}

fn data() -> impl Strategy<Value = u8> {
    0u8..0x80
}

/// Any well-formed message except real-time ones.
fn non_realtime() -> impl Strategy<Value = Message> {
    let t = Time::ZERO;
    prop_oneof![
        (0x80u8..0xF0, data(), data()).prop_map(move |(s, a, b)| {
            let kind = Kind::of_status(s).unwrap();
            let bytes: Vec<u8> = [s, a, b].into_iter().take(1 + kind.data_len().unwrap()).collect();
            Message::from_bytes(&bytes, t).unwrap()
        }),
        (data(), data()).prop_map(move |(a, b)| Message::from_bytes(&[0xF2, a, b], t).unwrap()),
        data().prop_map(move |a| Message::from_bytes(&[0xF1, a], t).unwrap()),
        data().prop_map(move |a| Message::from_bytes(&[0xF3, a], t).unwrap()),
        Just(Message::from_bytes(&[0xF6], t).unwrap()),
        (proptest::collection::vec(data(), 0..40), any::<bool>()).prop_map(move |(body, terminated)| {
            let mut bytes = vec![0xF0];
            bytes.extend(body);
            if terminated {
                bytes.push(0xF7);
            }
            Message::from_bytes(&bytes, t).unwrap()
        }),
    ]
}

fn realtime() -> impl Strategy<Value = Message> {
    prop::sample::select(vec![Kind::Clock, Kind::Start, Kind::Continue, Kind::Stop, Kind::ActiveSensing, Kind::Reset])
        .prop_map(|k| Message::realtime(k, Time::ZERO).unwrap())
}

fn any_message() -> impl Strategy<Value = Message> {
    prop_oneof![4 => non_realtime(), 1 => realtime()]
}

/// A sequence the parser must give back exactly: an unterminated sysex only where the next
/// byte on the wire is a non-real-time status byte (or at the end).
fn sequence() -> impl Strategy<Value = Vec<Message>> {
    proptest::collection::vec(any_message(), 0..30).prop_map(|ms| {
        let mut out: Vec<Message> = Vec::new();
        for (i, m) in ms.iter().enumerate() {
            let unterminated = m.kind() == Kind::SysexUnterminated;
            let next_ok = ms.get(i + 1).is_none_or(|n| !n.kind().is_realtime());
            if unterminated && !next_ok {
                let mut bytes = m.bytes().to_vec();
                bytes.push(0xF7);
                out.push(Message::from_bytes(&bytes, Time::ZERO).unwrap());
            } else {
                out.push(m.clone());
            }
        }
        out
    })
}

fn without_time(ms: &[Message]) -> Vec<(Kind, Vec<u8>)> {
    ms.iter().map(|m| (m.kind(), m.bytes().to_vec())).collect()
}

fn encode(ms: &[Message], enc: &mut Encoder) -> (Vec<u8>, Vec<usize>) {
    let mut out = Vec::new();
    let mut starts = Vec::new();
    for m in ms {
        starts.push(out.len());
        enc.encode(m, &mut out);
    }
    (out, starts)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn encode_then_parse_gives_the_messages_back(ms in sequence(), running in any::<bool>()) {
        let mut enc = if running { Encoder::with_running_status() } else { Encoder::new() };
        let (bytes, starts) = encode(&ms, &mut enc);
        let (back, stats) = parse_all(&bytes, |i| Time::from_nanos(i as u64));
        prop_assert_eq!(without_time(&back), without_time(&ms));
        prop_assert_eq!(stats.dropped(), 0);
        // Each message is stamped with the time of its first byte on the wire.
        for (m, s) in back.iter().zip(&starts) {
            prop_assert_eq!(m.time(), Time::from_nanos(*s as u64));
        }
    }

    #[test]
    fn realtime_bytes_anywhere_change_nothing_else(
        ms in sequence(),
        running in any::<bool>(),
        rts in proptest::collection::vec((any::<prop::sample::Index>(), realtime()), 0..20),
    ) {
        let mut enc = if running { Encoder::with_running_status() } else { Encoder::new() };
        let (mut bytes, _) = encode(&ms, &mut enc);
        // Insert real-time bytes at random places (positions taken in the growing buffer).
        let mut inserted = Vec::new();
        for (at, rt) in &rts {
            let at = at.index(bytes.len() + 1);
            bytes.insert(at, rt.status());
            inserted.push((at, rt.kind()));
        }
        let (back, stats) = parse_all(&bytes, |i| Time::from_nanos(i as u64));
        prop_assert_eq!(stats.dropped(), 0);
        let others: Vec<Message> = back.iter().filter(|m| !m.kind().is_realtime()).cloned().collect();
        let rt_back: Vec<Kind> = back.iter().filter(|m| m.kind().is_realtime()).map(Message::kind).collect();
        let sequence_rt: Vec<Message> = ms.iter().filter(|m| !m.kind().is_realtime()).cloned().collect();
        prop_assert_eq!(without_time(&others), without_time(&sequence_rt));
        // Every inserted real-time byte comes out, at the position it was put in.
        let mut positions: Vec<usize> = Vec::new();
        for (i, &b) in bytes.iter().enumerate() {
            if b >= 0xF8 {
                positions.push(i);
            }
        }
        let rt_msgs: Vec<&Message> = back.iter().filter(|m| m.kind().is_realtime()).collect();
        prop_assert_eq!(rt_msgs.len(), positions.len());
        for (m, p) in rt_msgs.iter().zip(&positions) {
            prop_assert_eq!(m.time(), Time::from_nanos(*p as u64));
            prop_assert_eq!(m.status(), bytes[*p]);
        }
        prop_assert_eq!(rt_back.len(), ms.iter().filter(|m| m.kind().is_realtime()).count() + rts.len());
    }

    #[test]
    fn arbitrary_bytes_are_all_accounted_for(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        max_sysex in prop_oneof![Just(DEFAULT_MAX_SYSEX), 0usize..12],
        chunk in 1usize..8,
    ) {
        let mut p = Parser::with_max_sysex(max_sysex);
        let mut delivered = 0u64;
        let mut count = 0u64;
        for (i, c) in bytes.chunks(chunk).enumerate() {
            let mut out = Vec::new();
            p.feed_slice(c, Time::from_nanos(i as u64), &mut out);
            for m in &out {
                // Every delivered message is well formed and within the bound.
                prop_assert!(m.bytes().len() <= p.max_sysex().max(3));
                let again = Message::from_bytes(m.bytes(), m.time()).unwrap();
                prop_assert_eq!(again.kind(), m.kind());
                delivered += m.bytes().len() as u64;
                count += 1;
            }
            let st = p.stats();
            prop_assert_eq!(st.bytes, delivered - st.running_status + st.dropped() + p.held());
        }
        if let Some(m) = p.finish() {
            prop_assert_eq!(m.kind(), Kind::SysexUnterminated);
            delivered += m.bytes().len() as u64;
            count += 1;
        }
        let st = p.stats();
        prop_assert_eq!(p.held(), 0);
        prop_assert_eq!(st.bytes, bytes.len() as u64);
        prop_assert_eq!(st.messages, count);
        prop_assert_eq!(st.bytes, delivered - st.running_status + st.dropped());
    }
}
