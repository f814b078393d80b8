//! Timed frames: every frame a client presents is reported exactly once (shown or
//! dropped), over each transport, while other clients' syncs with the screen run
//! present cycles on the transport threads and the presenter shows timed frames; and a
//! report that has arrived is returned by `next_event` even with a zero timeout.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ictus_display::{monotonic_ns, Display, Message, Rect, Transport};
use ictus_display_server::xvfb::Xvfb;
use ictus_display_server::{Options, Screen};

/// Frames each client presents in the stress.
const FRAMES: u32 = 90;
/// Frames a client keeps waiting in the server at most (a shared-memory channel has
/// four pool buffers by default; a queued frame holds one).
const OUTSTANDING: usize = 3;

/// Takes what has arrived, counting frame reports by tag; fails on an error message.
fn take_reports(d: &mut Display, wait: Duration, seen: &mut HashMap<u32, u32>, t: Transport) {
    while let Some(m) = d.next_event(wait).expect("events") {
        match m {
            Message::Frame { tag, .. } => *seen.entry(tag).or_default() += 1,
            Message::Error { code, op, .. } => panic!("{t:?}: error {code} on opcode {op}"),
            _ => {}
        }
        if wait > Duration::ZERO {
            return;
        }
    }
}

#[test]
fn every_paced_frame_is_reported_once_while_others_race_the_presenter() {
    paced_stress(&headless("paced"));
}

#[test]
fn every_paced_frame_is_reported_once_on_an_x_server_too() {
    let xvfb = Xvfb::start(640, 480).unwrap_or_else(|e| panic!("{e}"));
    paced_stress(&server_with("paced-x", |socket| {
        let mut opts = Options::headless(0, 0, Some(socket));
        opts.screen = Screen::X { display: Some(xvfb.display().to_owned()), shm: true };
        opts
    }));
}

/// Each transport in turn presents [`FRAMES`] frames due at assorted times, while a
/// racer per transport syncs with the screen in a loop; every frame must be reported
/// once, and nothing else.
fn paced_stress(server: &Server) {
    let stop = Arc::new(AtomicBool::new(false));
    // Racers: a client per transport drawing and syncing with the screen, so that
    // present cycles run on every transport thread while the presenter shows frames.
    let racers: Vec<_> = Transport::ALL
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let mut d = connect(server, t);
            let stop = stop.clone();
            std::thread::spawn(move || {
                let w = d.create_window(None, Rect::new(100 + 40 * i as i16, 0, 30, 30), 0).expect("window");
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    d.xor_rect(w, Rect::new(0, 0, 30, 30), 0x0f0f0f).expect("draw");
                    d.sync_shown().expect("sync");
                    n += 1;
                }
                n
            })
        })
        .collect();
    for t in Transport::ALL {
        let mut d = connect(server, t);
        let w = d.create_window(None, Rect::new(0, 0, 64, 48), 0).expect("window");
        d.sync_shown().expect("sync");
        let mut seen: HashMap<u32, u32> = HashMap::new();
        for i in 0..FRAMES {
            // Due now, already past, soon, and later than the next one: in the queue
            // out of order, some to be dropped, some sent ahead of their time.
            let now = monotonic_ns();
            let due = match i % 4 {
                0 => 0,
                1 => now.saturating_sub(2_000_000),
                2 => now + 300_000,
                _ => now + 1_500_000,
            };
            let deadline = Instant::now() + WATCHDOG;
            while i as usize - seen.len() >= OUTSTANDING {
                assert!(Instant::now() < deadline, "{t:?}: frames before {i} never reported: {seen:?}");
                take_reports(&mut d, Duration::from_millis(100), &mut seen, t);
            }
            let mut f = d.frame(64, 48).expect("frame");
            f.fill(i * 0x010203);
            f.present(w, 0, 0, due, i).expect("present");
            if i % 3 != 1 {
                d.flush().expect("flush");
            }
            // A look with a zero timeout takes what has arrived.
            take_reports(&mut d, Duration::ZERO, &mut seen, t);
        }
        d.flush().expect("flush");
        let deadline = Instant::now() + WATCHDOG;
        while seen.len() < FRAMES as usize {
            assert!(Instant::now() < deadline, "{t:?}: {} of {FRAMES} frames reported", seen.len());
            take_reports(&mut d, Duration::from_millis(100), &mut seen, t);
        }
        assert!(seen.values().all(|&n| n == 1), "{t:?}: a frame reported twice: {seen:?}");
        d.sync().expect("sync");
        take_reports(&mut d, Duration::ZERO, &mut seen, t);
        assert_eq!(seen.len(), FRAMES as usize, "{t:?}: reports of frames never presented");
    }
    stop.store(true, Ordering::Relaxed);
    for r in racers {
        assert!(r.join().expect("racer") > 0, "a racer synced at least once");
    }
    let st = server.stats();
    assert_eq!(st.frames_shown + st.frames_dropped, 3 * u64::from(FRAMES), "{st:?}");
}

#[test]
fn a_report_that_has_arrived_is_returned_without_waiting() {
    let server = headless("zero-timeout");
    for t in Transport::ALL {
        let mut d = connect(&server, t);
        let w = d.create_window(None, Rect::new(0, 0, 16, 16), 0).expect("window");
        let mut f = d.frame(16, 16).expect("frame");
        f.fill(0xffffff);
        f.present(w, 0, 0, 0, 42).expect("present");
        d.flush().expect("flush");
        // Polled without ever waiting: the report must come out of the transport.
        wait_until(&format!("{t:?}: the report, with zero timeouts"), || {
            matches!(d.next_event(Duration::ZERO).expect("events"), Some(Message::Frame { tag: 42, .. }))
        });
        // And `pending_events` takes what the transport holds, not only what was read.
        let mut f = d.frame(16, 16).expect("frame");
        f.fill(0x808080);
        f.present(w, 0, 0, 0, 43).expect("present");
        d.flush().expect("flush");
        wait_until(&format!("{t:?}: the report, from pending_events"), || {
            d.pending_events().expect("events").any(|m| matches!(m, Message::Frame { tag: 43, .. }))
        });
    }
}
