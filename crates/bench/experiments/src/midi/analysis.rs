//! What a window measured, computed from arrival times: the paper's interval error,
//! the delivery latency, lost and stray messages, the worst case and where it fell; and
//! the machine's own counters read beside them (steal time, page faults).

use std::time::Duration;

use ictus_midi::{Kind, Message};
use ictus_rt::Time;

use super::MAX_MESSAGES;

/// The message that stands for number `k` (`k < MAX_MESSAGES`): a note on whose key
/// and velocity spell `k`.
pub fn message_for(k: u64) -> Option<Message> {
    if k >= MAX_MESSAGES {
        return None;
    }
    Message::note_on(0, (k % 128) as u8, (1 + k / 128) as u8, Time::ZERO).ok()
}

/// The number a received message stands for.
pub fn number_of(m: &Message) -> Option<u64> {
    match (m.kind(), m.bytes()) {
        (Kind::NoteOn, &[_, key, vel]) if vel >= 1 => Some(u64::from(key) + 128 * u64::from(vel - 1)),
        _ => None,
    }
}

/// What one window measured, from the arrival times by message number.
#[derive(Clone, Debug, Default)]
pub struct Analysis {
    /// |interval − nominal| for consecutive pairs both received, ns, in order.
    pub errors: Vec<u64>,
    /// For each of `errors`, the number of the pair's first message.
    pub pairs: Vec<u64>,
    /// The intervals themselves, ns, in order (for Figure 1).
    pub intervals: Vec<u64>,
    /// arrival − due, ns, for every message received.
    pub latencies: Vec<u64>,
    /// Messages sent but never received.
    pub lost: u64,
    /// Arrivals that were not one of ours, or came twice.
    pub strays: u64,
}

/// Analyse arrivals `(k, t)` of messages `0..n`, message `k` due at `t0 + k·interval`.
pub fn analyse(arrivals: &[(u64, Time)], n: u64, t0: Time, interval: Duration) -> Analysis {
    let mut at: Vec<Option<Time>> = vec![None; n as usize];
    let mut a = Analysis::default();
    for &(k, t) in arrivals {
        match at.get_mut(k as usize) {
            Some(slot @ None) => *slot = Some(t),
            _ => a.strays += 1,
        }
    }
    let nominal = interval.as_nanos() as i128;
    for (k, t) in at.iter().enumerate() {
        let Some(t) = *t else {
            a.lost += 1;
            continue;
        };
        let due = t0 + interval * k as u32;
        a.latencies.push((t - due).as_nanos() as u64);
        if let Some(Some(next)) = at.get(k + 1) {
            let d = next.as_nanos() as i128 - t.as_nanos() as i128;
            a.intervals.push(d.max(0) as u64);
            a.errors.push((d - nominal).unsigned_abs() as u64);
            a.pairs.push(k as u64);
        }
    }
    a
}

impl Analysis {
    /// The worst interval error and the number of its pair's first message.
    pub fn worst(&self) -> Option<(u64, u64)> {
        self.errors.iter().zip(&self.pairs).map(|(&e, &k)| (e, k)).max_by_key(|&(e, _)| e)
    }

    /// The worst interval error of each segment of `per` messages (a pair belongs to
    /// the segment of its first message), for the segments that have a pair.
    pub fn segment_worsts(&self, per: u64) -> Vec<u64> {
        let mut worst: Vec<Option<u64>> = Vec::new();
        for (&e, &k) in self.errors.iter().zip(&self.pairs) {
            let i = (k / per.max(1)) as usize;
            if worst.len() <= i {
                worst.resize(i + 1, None);
            }
            worst[i] = Some(worst[i].map_or(e, |w| w.max(e)));
        }
        worst.into_iter().flatten().collect()
    }
}

/// The median of nanosecond counts.
pub(super) fn median_ns(values: &[u64]) -> Option<f64> {
    ictus_bench::stats::median(values.iter().map(|&v| v as f64))
}

/// Steal time per CPU from the text of `/proc/stat`: `(cpu, steal)` in clock ticks
/// (`USER_HZ`), the eighth number of each `cpuN` line. Lines that do not parse are
/// left out.
pub fn parse_steal(stat: &str) -> Vec<(usize, u64)> {
    stat.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let cpu = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            let steal = f.nth(7)?.parse().ok()?;
            Some((cpu, steal))
        })
        .collect()
}

/// Minor and major page faults from the text of `/proc/<pid>/task/<tid>/stat`
/// (fields 10 and 12, counted after the command name, which may hold spaces and
/// parentheses).
pub fn parse_task_faults(stat: &str) -> Option<(u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid pgrp session tty_nr tpgid flags minflt(10) cminflt majflt(12).
    Some((f.get(7)?.parse().ok()?, f.get(9)?.parse().ok()?))
}

/// Per-CPU steal ticks now (empty where `/proc/stat` cannot be read).
pub(super) fn read_steal() -> Vec<(usize, u64)> {
    std::fs::read_to_string("/proc/stat").map(|s| parse_steal(&s)).unwrap_or_default()
}

/// Steal between two readings, per CPU, in ms.
pub(super) fn steal_ms(before: &[(usize, u64)], after: &[(usize, u64)]) -> Vec<(usize, u64)> {
    let tick_ms = 1000 / rustix::param::clock_ticks_per_second().max(1);
    after
        .iter()
        .filter_map(|&(cpu, a)| {
            let b = before.iter().find(|&&(c, _)| c == cpu)?.1;
            Some((cpu, a.saturating_sub(b) * tick_ms))
        })
        .collect()
}

pub(super) fn format_steal(ms: &[(usize, u64)]) -> String {
    if ms.is_empty() {
        return "unknown".into();
    }
    ms.iter().map(|(c, v)| format!("cpu{c} {v} ms")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::cyclictest::interval_errors as cyclictest_interval_errors;

    const MS: u64 = 1_000_000;
    const INTERVAL: Duration = super::super::INTERVAL;

    #[test]
    fn numbers_round_trip_through_messages() {
        for k in [0, 1, 127, 128, 5000, MAX_MESSAGES - 1] {
            let m = message_for(k).unwrap();
            assert_eq!(number_of(&m), Some(k));
        }
        assert!(message_for(MAX_MESSAGES).is_none());
        let off = Message::note_off(0, 1, 1, Time::ZERO).unwrap();
        assert_eq!(number_of(&off), None);
    }

    #[test]
    fn analysis_of_arrivals() {
        let t0 = Time::from_millis(1000);
        let t = |ms: u64, extra: u64| Time::from_nanos(ms * MS + extra);
        // 0 on time, 1 late by 2 ms, 2 lost, 3 on time, a duplicate of 3, a stray.
        let arrivals = [(0, t(1000, 0)), (1, t(1012, 0)), (3, t(1030, 500)), (3, t(1031, 0)), (99, t(1, 0))];
        let a = analyse(&arrivals, 4, t0, INTERVAL);
        assert_eq!(a.lost, 1);
        assert_eq!(a.strays, 2);
        // Only the pair (0, 1) is consecutive and present: 12 ms, error 2 ms.
        assert_eq!(a.intervals, vec![12 * MS]);
        assert_eq!(a.errors, vec![2 * MS]);
        assert_eq!(a.latencies, vec![0, 2 * MS, 500]);
        // An early interval is an error too.
        let a = analyse(&[(0, t(1000, 0)), (1, t(1007, 0))], 2, t0, INTERVAL);
        assert_eq!(a.errors, vec![3 * MS]);
    }

    #[test]
    fn worst_and_segments() {
        let t0 = Time::from_millis(1000);
        // Ten messages on time but for 3 (2 ms late) and 7 (5 ms late); 8 lost.
        let late = |k: u64| match k {
            3 => 2 * MS,
            7 => 5 * MS,
            _ => 0,
        };
        let arrivals: Vec<(u64, Time)> =
            (0..10).filter(|&k| k != 8).map(|k| (k, Time::from_nanos(1000 * MS + k * 10 * MS + late(k)))).collect();
        let a = analyse(&arrivals, 10, t0, INTERVAL);
        assert_eq!(a.pairs, vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(a.worst(), Some((5 * MS, 6)));
        // Segments of 4 messages: pairs 0..=3 (worst 2 ms), 4..=6 (worst 5 ms).
        assert_eq!(a.segment_worsts(4), vec![2 * MS, 5 * MS]);
        assert_eq!(a.segment_worsts(100), vec![5 * MS]);
        assert_eq!(Analysis::default().worst(), None);
        assert!(Analysis::default().segment_worsts(4).is_empty());
    }

    #[test]
    fn cyclictest_interval_errors_follow_its_skipping() {
        let t = 10_000_000u64;
        // On time, a little late, on time: the late wake-up makes two intervals wrong.
        assert_eq!(cyclictest_interval_errors(&[10, 510, 20], t), vec![500, 490]);
        // A wake-up 25 ms late: cyclictest skips the two periods already past, so the
        // next one is due three periods after it, 5 ms after the late wake-up.
        assert_eq!(cyclictest_interval_errors(&[25_000_000, 0], t), vec![5_000_000]);
        // Exactly one period late: the next is due at that same instant.
        assert_eq!(cyclictest_interval_errors(&[t, 0], t), vec![t]);
        assert!(cyclictest_interval_errors(&[5], t).is_empty());
        assert!(cyclictest_interval_errors(&[], t).is_empty());
        // The same measure as `analyse` on arrivals: wake-ups at due + latency.
        let lat = [3_000u64, 80_000, 4_000, 9_000];
        let arrivals: Vec<(u64, Time)> =
            lat.iter().enumerate().map(|(k, &l)| (k as u64, Time::from_nanos(t * k as u64 + l))).collect();
        let a = analyse(&arrivals, 4, Time::ZERO, Duration::from_nanos(t));
        assert_eq!(cyclictest_interval_errors(&lat, t), a.errors);
    }

    #[test]
    fn steal_from_proc_stat() {
        let text = "cpu  10 0 20 30 4 0 5 9 0 0\ncpu0 5 0 10 15 2 0 2 4 0 0\ncpu1 5 0 10 15 2 0 3 5 0 0\nintr 1 2 3\ncpu2 1 2\n";
        assert_eq!(parse_steal(text), vec![(0, 4), (1, 5)]);
        assert!(parse_steal("").is_empty());
        let ms = steal_ms(&[(0, 4), (1, 5)], &[(0, 6), (1, 5), (2, 1)]);
        let tick = 1000 / rustix::param::clock_ticks_per_second();
        assert_eq!(ms, vec![(0, 2 * tick), (1, 0)]);
        assert_eq!(format_steal(&[(0, 20), (1, 0)]), "cpu0 20 ms, cpu1 0 ms");
        assert_eq!(format_steal(&[]), "unknown");
        // This machine's own /proc/stat parses (where there is one).
        if let Ok(text) = std::fs::read_to_string("/proc/stat") {
            assert!(!parse_steal(&text).is_empty());
        }
    }

    #[test]
    fn task_faults_parse() {
        let stat = "1234 (mo1 (timer) x) S 1 1234 1234 0 -1 4194368 17 0 3 0 5 6 0 0 -100 0 2 0";
        assert_eq!(parse_task_faults(stat), Some((17, 3)));
        assert_eq!(parse_task_faults("1234 (x) S 1"), None);
        assert_eq!(parse_task_faults("garbage"), None);
        let me = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        assert!(parse_task_faults(&me).is_some());
    }
}
