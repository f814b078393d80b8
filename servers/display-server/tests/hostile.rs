//! Hostile clients harm only themselves: garbage over each transport, a scribbled
//! ring, someone else's window, limits, a client that never reads; and a client
//! killed with `kill -9` has its windows and buffers reclaimed. Children are this test
//! binary re-executed.

mod common;

use std::process::Stdio;
use std::time::Instant;

use common::*;
use ictus_display::proto::error;
use ictus_display::{ConnectOptions, Display, Message, Rect, Transport};
use ictus_ipc::Space;
use ictus_testkit::{expect_line, Proc, Role};

fn errors(d: &mut Display) -> Vec<(u16, u32)> {
    d.sync().expect("sync");
    d.pending_events()
        .expect("events")
        .filter_map(|m| if let Message::Error { code, window, .. } = m { Some((code, window)) } else { None })
        .collect()
}

#[test]
fn garbage_over_any_transport_cuts_off_only_its_sender() {
    let server = headless("garbage");
    let mut good = connect(&server, Transport::Shm);
    let gw = good.create_window(None, Rect::new(0, 0, 50, 50), 0x111111).expect("window");
    good.sync().expect("sync");
    for t in Transport::ALL {
        let mut bad = connect(&server, t);
        bad.create_window(None, Rect::new(0, 0, 40, 40), 0).expect("window");
        bad.sync().expect("sync");
        let before = server.stats();
        // A header that claims an unknown opcode, then nonsense.
        bad.send_raw(&[99, 0, 0, 0, 12, 0, 0, 0, 1, 2, 3, 4]).expect("sent");
        wait_until("the bad client is cut off", || server.stats().cut_off > before.cut_off);
        wait_until("its window is gone", || server.stats().windows == 1);
        assert!(bad.sync().is_err(), "{t:?}: a cut-off client cannot sync");
        // The good client never noticed.
        good.xor_rect(gw, Rect::new(0, 0, 10, 10), 0xffffff).expect("draw");
        good.sync().expect("the good client goes on");
    }
}

#[test]
fn a_scribbled_ring_cuts_off_only_its_client() {
    let server = headless("scribble");
    let mut good = connect(&server, Transport::Socket);
    good.create_window(None, Rect::new(0, 0, 50, 50), 0).expect("window");
    good.sync().expect("sync");
    let mut bad = connect(&server, Transport::Shm);
    bad.create_window(None, Rect::new(0, 0, 40, 40), 0).expect("window");
    bad.sync().expect("sync");
    // A wild request head (offset 64 of the channel), then a record to look at it.
    let ch = bad.shm_channel().expect("shm");
    ch.scribble(64, u64::MAX / 3);
    let _ = ch.send(1, &[0; 8]);
    wait_until("the scribbler is cut off", || server.stats().windows == 1);
    good.sync().expect("the good client goes on");
}

#[test]
fn a_client_reaches_only_its_own_windows_and_within_limits() {
    let server = headless("own");
    let mut a = connect(&server, Transport::Port);
    let mut b = connect(&server, Transport::Shm);
    let wa = a.create_window(None, Rect::new(0, 0, 20, 20), 0x123456).expect("window");
    a.sync().expect("sync");
    // B names A's window number: it is not B's.
    b.fill_rect(wa, Rect::new(0, 0, 20, 20), 0xffffff).expect("queued");
    assert_eq!(errors(&mut b), vec![(error::BAD_WINDOW, wa.0)]);
    let (w, _, px) = server.snapshot();
    assert_eq!(px[5 * w + 5], 0x123456, "A's window is untouched");
    // Too many pixels for one client.
    let big = Rect::new(0, 0, 8192, 8192);
    let w1 = b.create_window(None, big, 0).expect("queued");
    assert_eq!(errors(&mut b), vec![(error::LIMIT, w1.0)]);
    // An attachment that was never sent.
    let bytes = {
        let mut v = Vec::new();
        ictus_display::Request::PresentFrame {
            window: wa.0,
            rect: Rect::new(0, 0, 4, 4),
            stride: 16,
            source: ictus_display::Source::Attachment(77),
            tag: 1,
            due_ns: 0,
        }
        .encode(&mut v);
        v
    };
    a.send_raw(&bytes).expect("sent");
    assert_eq!(errors(&mut a), vec![(error::BAD_ATTACHMENT, wa.0)]);
}

#[test]
fn a_client_that_never_reads_is_cut_off_alone() {
    let server = headless("noread");
    let mut good = connect(&server, Transport::Port);
    good.create_window(None, Rect::new(0, 0, 10, 10), 0).expect("window");
    good.sync().expect("sync");
    let mut bad = connect(&server, Transport::Socket);
    // Thousands of errors it never reads: its outbox fills, then it is dropped.
    let start = server.stats().cut_off;
    let end = Instant::now() + WATCHDOG;
    while server.stats().cut_off == start && Instant::now() < end {
        if bad.fill_rect(ictus_display::Window(4242), Rect::new(0, 0, 1, 1), 0).is_err() || bad.flush().is_err() {
            break;
        }
    }
    wait_until("the flooder is cut off", || server.stats().cut_off > start);
    good.sync().expect("the good client goes on");
}

/// The role children of this test binary run in.
const CHILD: Role = Role { env: "ICTUS_DISPLAY_TEST_CHILD" };

/// The child: connect through the bootstrap right, make a window, hold a frame
/// buffer, say "ready", then wait to be killed.
#[test]
fn child_client() {
    let Some(t) = CHILD.current() else { return };
    let t: Transport = t.parse().expect("transport");
    let space = Space::new();
    let service = space.take_bootstrap().expect("bootstrap").expect("a bootstrap right");
    let mut d = Display::connect_to(&space, service, &ConnectOptions::new(t)).expect("connect");
    let w = d.create_window(None, Rect::new(0, 0, 100, 100), 0xff).expect("window");
    let mut f = d.frame(100, 100).expect("frame");
    f.fill(0x00ff00);
    f.present(w, 0, 0, u64::MAX / 2, 1).expect("a frame due in the far future");
    d.sync().expect("sync");
    println!("ready");
    std::thread::sleep(WATCHDOG * 2);
}

#[test]
fn a_client_killed_with_sigkill_has_its_windows_and_buffers_reclaimed() {
    // It counts the process's window mappings: alone in a process of its own.
    if !CHILD.alone("a_client_killed_with_sigkill_has_its_windows_and_buffers_reclaimed") {
        return;
    }
    let server = headless("kill9");
    let baseline = ictus_shm::mappings_named("ictus-display-window");
    for t in Transport::ALL {
        let mut cmd = CHILD.command("child_client", t.name());
        cmd.stdout(Stdio::piped());
        server.space().give_bootstrap(&mut cmd, server.service_port()).expect("bootstrap");
        let mut child = Proc::spawn(&format!("a {} client", t.name()), &mut cmd);
        // "ready" may follow libtest's own words on its line.
        expect_line(&child.tagged_lines("ready"), "");
        wait_until("the child's window", || server.stats().windows == 1);
        assert!(ictus_shm::mappings_named("ictus-display-window") > baseline);
        child.kill9();
        wait_until(&format!("{t:?}: the window reclaimed"), || server.stats().windows == 0);
        wait_until(&format!("{t:?}: its memory unmapped"), || {
            ictus_shm::mappings_named("ictus-display-window") == baseline
        });
    }
}
