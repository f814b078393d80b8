//! The delivery thread: the time-critical part of Tactus.
//!
//! It sleeps until the next item's hand-over time (its due time less its device's
//! lead) with `FUTEX_WAIT_BITSET` on an absolute `CLOCK_MONOTONIC` deadline, so the
//! loop thread can wake it early when an earlier item arrives; it judges each due item
//! ([`ictus_tactus::policy::judge`]), takes it out of its queue under the state's
//! priority-inheriting lock and hands it to its device *outside* the lock; it never
//! makes a server call and never waits for a client or a device: a display without a
//! free frame buffer, a full MIDI queue, an audio sink past its buffer all count as
//! what they are (dropped, trimmed) at once. Held pool buffers and reports go back to
//! the loop thread through the state and one eventfd write.

use std::num::NonZeroU32;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ictus_display::Message as DisplayMessage;
use ictus_rt::sync::PiMutex;
use ictus_rt::thread::{configure_current_thread, ThreadRequest};
use ictus_rt::Time;
use ictus_tactus::media::stretch::{stretch_s16, stretched_len};
use ictus_tactus::policy::{judge, Verdict};
use ictus_tactus::proto::{delivered, Delivered};
use ictus_tactus::timemap::{Due, Motion};

use crate::core::{Core, Item, Key};
use crate::device::{lock, Device};

/// What the loop thread and the delivery thread share.
#[derive(Debug)]
pub struct Shared {
    /// The state.
    pub core: PiMutex<Core>,
    /// Bumped by the loop whenever the delivery thread should look again (a futex word).
    pub bell: AtomicU32,
    /// Written by the delivery thread when it has buffers to release or reports to send.
    pub wake_loop: OwnedFd,
}

impl Shared {
    /// Wake the delivery thread.
    pub fn ring(&self) {
        self.bell.fetch_add(1, Ordering::Release);
        let _ = rustix::thread::futex::wake(&self.bell, rustix::thread::futex::Flags::PRIVATE, 1);
    }
}

/// `CLOCK_MONOTONIC` now, in ns.
pub fn now() -> u64 {
    ictus_rt::clock::now().as_nanos()
}

/// One item on its way to its device.
struct Work {
    key: Key,
    item: Item,
    due: u64,
    /// Its due time on the presentation clock.
    clock: u64,
    verdict: Verdict,
    dev: Device,
    /// The presentation's clock is this stream's audio sink.
    master: bool,
    /// The presentation runs at rate 1.
    /// The presentation's rate where the item is due (audio is stretched by it).
    rate: f64,
}

/// The longest the thread sleeps without looking (it is woken for anything new).
const IDLE: Duration = Duration::from_millis(100);
/// While frames await the display's report, look this often.
const REPORT_POLL: Duration = Duration::from_millis(10);

/// Run the delivery thread until the state says stop.
pub fn run(shared: Arc<Shared>, thread: ThreadRequest, grace: Duration) {
    let granted = configure_current_thread(&thread);
    if thread.policy.is_some_and(|p| p.is_realtime()) && !granted.policy.is_realtime() {
        eprintln!(
            "ictus tactus: the delivery thread runs {} instead of real-time: items are handed to devices \
             as late as the timesharing scheduler wakes it (milliseconds on a busy machine); devices that \
             take items early (audio, MIDI, the display) hide part of that",
            granted.describe()
        );
    }
    let mut keys: Vec<Key> = Vec::new();
    let mut work: Vec<Work> = Vec::new();
    let mut videos: Vec<(Key, Device)> = Vec::new();
    let mut scratch: Vec<u8> = Vec::new();
    let mut stretched: Vec<u8> = Vec::new();
    loop {
        let seen = shared.bell.load(Ordering::Acquire);
        let mut next: Option<u64> = None;
        {
            let mut core = shared.core.lock();
            if core.stop {
                return;
            }
            let t = now();
            keys.clear();
            keys.extend(core.streams.keys().copied());
            videos.clear();
            for &key in &keys {
                while let Some((due, due_mono)) = core.head_due(&key) {
                    match due {
                        Due::NotYet => break,
                        Due::Never => {
                            let s = core.streams.get_mut(&key).expect("a stream of the key list");
                            let item = s.queue.pop_front().expect("a head");
                            s.counts.flushed += 1;
                            core.finished(key, item, 0, t, 0, delivered::FLUSHED, None);
                        }
                        Due::At(clock) => {
                            let s = core.streams.get(&key).expect("a stream of the key list");
                            let v = judge(s.policy, t, due_mono, s.dev.lead(), grace);
                            if let Verdict::Wait(at) = v {
                                next = Some(next.map_or(at, |n: u64| n.min(at)));
                                break;
                            }
                            let pres = core.pres.get(&(key.0, s.pres));
                            let master = match (&s.dev, pres.and_then(|p| p.master.as_ref())) {
                                (Device::Audio { sink, .. }, Some(m)) => Arc::ptr_eq(sink, m),
                                _ => false,
                            };
                            let rate = pres.map_or(1.0, |p| p.map.rate_at(clock).get());
                            let dev = s.dev.clone();
                            let s = core.streams.get_mut(&key).expect("a stream of the key list");
                            let item = s.queue.pop_front().expect("a head");
                            s.counts.count(v, grace);
                            work.push(Work { key, item, due: due_mono, clock, verdict: v, dev, master, rate });
                        }
                    }
                }
                // Underruns: look at the stream where its presentation stands now.
                let Some(s) = core.streams.get(&key) else { continue };
                if let Some(p) = core.pres.get(&(key.0, s.pres)) {
                    let c = p.clock_at(t);
                    let running = p.map.motion_at(c) == Motion::Running;
                    let pos = p.map.logical_at(c).1;
                    let s = core.streams.get_mut(&key).expect("present");
                    if running {
                        s.buf.check(pos);
                    }
                    if let Device::Video { dev, .. } = &s.dev {
                        videos.push((key, Device::Video { dev: dev.clone(), lead: Default::default() }));
                    }
                }
            }
        }
        // Hand over, outside the lock.
        let mut done = Vec::with_capacity(work.len());
        for w in work.drain(..) {
            let r = hand_over(&w, &mut scratch, &mut stretched);
            done.push((w, r));
        }
        // Frames the display has reported on.
        let mut device_reports = Vec::new();
        let mut lost = Vec::new();
        let mut awaiting = false;
        for (key, d) in &videos {
            if let Device::Video { dev, .. } = d {
                let mut v = lock(dev);
                while v.lost.is_none() {
                    match v.display.next_event(Duration::ZERO) {
                        Ok(Some(DisplayMessage::Frame { tag, shown_ns, dropped, .. })) => {
                            if let Some((k, mut d)) = v.pending.remove(&tag) {
                                d.presented = shown_ns;
                                d.flags |= delivered::BY_DEVICE | if dropped { delivered::DEVICE_DROPPED } else { 0 };
                                device_reports.push((k, d));
                            }
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(e) if gone(&e) => v.lost = Some(e.to_string()),
                        Err(_) => break,
                    }
                }
                if v.lost.is_some() {
                    // The display will never report these: they end here, not shown.
                    for (_, (k, mut d)) in v.pending.drain() {
                        d.flags |= delivered::DEVICE_DROPPED;
                        device_reports.push((k, d));
                    }
                    if !v.lost_told {
                        v.lost_told = true;
                        lost.push((*key, v.lost.clone().unwrap_or_default()));
                    }
                }
                awaiting |= !v.pending.is_empty();
            }
        }
        let notify = {
            let mut core = shared.core.lock();
            for (w, (handed, presented, flags, report_now)) in done {
                if flags & delivered::DROPPED != 0 {
                    if let (Verdict::Deliver { late_ns }, Some(s)) = (w.verdict, core.streams.get_mut(&w.key)) {
                        // Judged deliverable, but the device could not take it.
                        if u128::from(late_ns) <= grace.as_nanos() {
                            s.counts.on_time -= 1;
                        } else {
                            s.counts.late -= 1;
                        }
                        s.counts.dropped += 1;
                    }
                }
                let end = w.item.h.logical.saturating_add(w.item.h.duration.min(i64::MAX as u64) as i64);
                let delivered_end = (flags & delivered::DROPPED == 0).then_some(end);
                if report_now {
                    core.finished(w.key, w.item, w.due, handed, presented, flags, delivered_end);
                } else {
                    // The device reports later; account now, report then.
                    let report = core.streams.get(&w.key).is_some_and(|s| s.report);
                    if let Some(s) = core.streams.get_mut(&w.key) {
                        s.report = false;
                    }
                    core.finished(w.key, w.item, w.due, handed, presented, flags, delivered_end);
                    if let Some(s) = core.streams.get_mut(&w.key) {
                        s.report = report;
                    }
                }
            }
            for (k, d) in device_reports {
                core.device_report(k, d);
            }
            for (k, why) in &lost {
                core.device_lost(*k, why);
            }
            !core.releases.is_empty() || !core.outbox.is_empty()
        };
        if notify {
            let _ = rustix::io::write(shared.wake_loop.as_fd(), &1u64.to_ne_bytes());
        }
        // Sleep until the next hand-over, or until woken.
        let t = now();
        let mut until = next.unwrap_or(t + IDLE.as_nanos() as u64).min(t + IDLE.as_nanos() as u64);
        if awaiting {
            until = until.min(t + REPORT_POLL.as_nanos() as u64);
        }
        if until > t {
            sleep_until(&shared.bell, seen, until);
        }
    }
}

/// Sleep until `deadline` (`CLOCK_MONOTONIC` ns) unless the bell moves from `seen`.
fn sleep_until(bell: &AtomicU32, seen: u32, deadline: u64) {
    use rustix::thread::futex;
    let ts = Time::from_nanos(deadline).to_timespec();
    let timeout =
        rustix::time::Timespec { tv_sec: ts.secs().min(i64::MAX as u64) as i64, tv_nsec: i64::from(ts.nanos()) };
    // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC deadline: no drift from a
    // late start, and a bell rung after `seen` was read ends it at once.
    let _ = futex::wait_bitset(bell, futex::Flags::PRIVATE, seen, Some(&timeout), NonZeroU32::MAX);
}

/// Whether a display error means the connection is finished.
fn gone(e: &ictus_display::DisplayError) -> bool {
    matches!(e, ictus_display::DisplayError::Closed(_) | ictus_display::DisplayError::Malformed(_))
}

/// Hand one item to its device. Returns (handed, presented, flags, report now).
fn hand_over(w: &Work, scratch: &mut Vec<u8>, stretched: &mut Vec<u8>) -> (u64, u64, u32, bool) {
    let late = matches!(w.verdict, Verdict::Deliver { late_ns } if late_ns > 0) as u32 * delivered::LATE;
    if let Verdict::Drop { .. } = w.verdict {
        return (now(), 0, delivered::DROPPED, true);
    }
    match &w.dev {
        Device::Null => {
            let t = now();
            (t, t, late, true)
        }
        Device::Midi { out, .. } => {
            let bytes = w.item.data.to_vec();
            match ictus_midi::Message::from_bytes(&bytes, Time::from_nanos(w.due)) {
                Ok(m) => match out.put(m, Time::from_nanos(w.due)) {
                    Ok(_) => (now(), w.due, late, true),
                    Err(_) => (now(), 0, delivered::DROPPED, true),
                },
                Err(_) => (now(), 0, delivered::DROPPED, true),
            }
        }
        Device::Audio { sink, .. } => {
            let frame = if w.master {
                (w.clock as f64 * f64::from(sink.rate()) / 1e9).round() as u64
            } else {
                sink.tracker().frame_at(w.due).round().max(0.0) as u64
            };
            scratch.resize(w.item.data.len(), 0);
            w.item.data.copy_to(scratch);
            if w.rate != 1.0 {
                // At rate r the block's logical span lasts 1/r as long: n/r frames.
                // Only what the sink's ring can hold (the rest would be trimmed): a
                // large block at 1/16 must not make a 16-fold allocation here.
                let ch = usize::from(sink.channels());
                let fits = (sink.capacity() as f64 * w.rate).ceil() as usize;
                let n = (scratch.len() / (2 * ch.max(1))).min(fits);
                stretch_s16(&scratch[..n * 2 * ch], ch, stretched_len(n, w.rate), stretched);
                std::mem::swap(scratch, stretched);
            }
            let (placed, trimmed) = sink.place(frame, scratch);
            let t = now();
            if placed == 0 {
                (t, 0, delivered::DROPPED, true)
            } else {
                let f = if trimmed > 0 { delivered::LATE } else { late };
                (t, sink.true_mono_of(frame + trimmed), f, true)
            }
        }
        Device::Video { dev, .. } => {
            let mut v = lock(dev);
            if v.lost.is_some() {
                return (now(), 0, delivered::DROPPED, true);
            }
            let (w_px, h_px, window) = (v.width, v.height, v.window);
            let tag = v.next_tag;
            v.next_tag = v.next_tag.wrapping_add(1).max(1);
            // Handed: stamped as the frame goes to the display, not after the flush
            // returns; a display that shows a due frame at once may report it before
            // this thread runs again, and "presented" must never precede "handed".
            let mut t = 0;
            let r = match v.display.frame(w_px, h_px) {
                Ok(mut f) => {
                    w.item.data.copy_to(f.pixels());
                    t = now();
                    f.present(window, 0, 0, w.due, tag)
                }
                Err(e) => Err(e),
            };
            let r = r.and_then(|()| v.display.flush());
            if t == 0 {
                t = now();
            }
            match r {
                Ok(()) => {
                    let d = Delivered {
                        stream: w.key.1,
                        flags: late,
                        seq: w.item.h.seq,
                        logical: w.item.h.logical,
                        due: w.due,
                        received: w.item.received,
                        handed: t,
                        presented: 0,
                        sent: w.item.h.sent,
                    };
                    v.pending.insert(tag, (w.key, d));
                    (t, 0, late, false)
                }
                Err(e) => {
                    // The display gone (or talking nonsense): the connection is not
                    // used again and the report poll tells the client. Anything else
                    // (no buffer free in time, a frame too large) costs this frame.
                    if gone(&e) {
                        v.lost.get_or_insert_with(|| e.to_string());
                    }
                    (t, 0, delivered::DROPPED, true)
                }
            }
        }
    }
}
