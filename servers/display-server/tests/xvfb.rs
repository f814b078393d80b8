//! Under a private Xvfb: the scene reaches the X server, read back with `GetImage`,
//! through MIT-SHM and through plain `PutImage`; frames go straight from a client's
//! pool buffer to the X server.

mod common;

use common::*;
use ictus_display::{Message, Rect, Transport};
use ictus_display_server::xvfb::Xvfb;
use ictus_display_server::{Options, Screen};

fn on_x(xvfb: &Xvfb, shm: bool, tag: &str) -> Server {
    server_with(tag, |socket| {
        let mut opts = Options::headless(0, 0, Some(socket));
        opts.screen = Screen::X { display: Some(xvfb.display().to_owned()), shm };
        opts
    })
}

#[test]
fn windows_read_back_from_the_x_server_match_what_the_server_holds() {
    let xvfb = match Xvfb::start(640, 480) {
        Ok(x) => x,
        Err(e) => panic!("{e}"),
    };
    for (shm, t) in [(true, Transport::Shm), (false, Transport::Socket), (true, Transport::Port)] {
        let server = on_x(&xvfb, shm, &format!("x-{shm}-{}", t.name()));
        assert_eq!(server.x().expect("an X screen").has_shm(), shm);
        let mut d = connect(&server, t);
        let w = draw_scene(&mut d);
        d.sync_shown().expect("sync");
        let wins = server.windows();
        let top = wins.iter().find(|i| i.id == w.0).expect("the window");
        let x = server.x().expect("x");
        let got = x.get_image(top.xid.expect("an X window"), top.width, top.height).expect("GetImage");
        // What the server holds for that window, composed with its sub-window.
        let (sw, _, screen) = server.snapshot();
        let mut want = Vec::new();
        for y in 0..top.height as usize {
            let row = (20 + y) * sw + 10;
            want.extend_from_slice(&screen[row..row + top.width as usize]);
        }
        let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "shm {shm} {t:?}: {differ} pixels differ");
        // Now a frame of its own: straight from the buffer to the X server.
        let mut f = d.frame(64, 48).expect("frame");
        f.fill(0x00_12_34_56);
        f.present(w, 0, 0, 0, 99).expect("present");
        d.sync_shown().expect("sync");
        let mut shown = None;
        while let Some(m) = d.next_event(WATCHDOG).expect("event") {
            if let Message::Frame { tag: 99, shown_ns, dropped: false, .. } = m {
                shown = Some(shown_ns);
                break;
            }
        }
        assert!(shown.is_some(), "frame reported");
        let got = x.get_image(top.xid.expect("x"), 64, 48).expect("GetImage");
        assert!(got.iter().all(|&p| p == 0x12_3456), "shm {shm} {t:?}: the frame is on the X screen");
        // Drawing after a frame draws over it (the frame is copied in first).
        d.fill_rect(w, Rect::new(0, 0, 8, 8), 0xabcdef).expect("fill");
        d.sync_shown().expect("sync");
        let got = x.get_image(top.xid.expect("x"), 64, 48).expect("GetImage");
        assert_eq!(got[0], 0xabcdef);
        assert_eq!(got[10 * 64 + 10], 0x12_3456);
        drop(d);
        server.stop();
    }
}

/// A client that waits for each frame (present due now, then a sync with the screen)
/// gets the frame's buffer back as soon as the X server has it, and so writes every
/// frame into one buffer, as an X client reuses its one MIT-SHM segment; the server
/// keeps seeing the buffer: each frame reaches the X screen whole, and drawing after
/// the last one draws over it.
#[test]
fn a_client_that_waits_for_each_frame_writes_them_all_into_one_buffer() {
    let xvfb = Xvfb::start(640, 480).unwrap_or_else(|e| panic!("{e}"));
    let server = on_x(&xvfb, true, "one-buffer");
    let mut d = connect(&server, Transport::Shm);
    let w = d.create_window(None, Rect::new(0, 0, 64, 48), 0).expect("window");
    d.sync_shown().expect("sync");
    let xid = server.windows().iter().find(|i| i.id == w.0).and_then(|i| i.xid).expect("an X window");
    let x = server.x().expect("x");
    let mut buffers = Vec::new();
    for i in 0..8u32 {
        let color = (0x10_20_30 * (i + 1)) & 0xff_ffff;
        let mut f = d.frame(64, 48).expect("frame");
        buffers.push(f.pixels().as_ptr() as usize);
        f.fill(color);
        f.present(w, 0, 0, 0, i).expect("present");
        d.sync_shown().expect("sync");
        let got = x.get_image(xid, 64, 48).expect("GetImage");
        assert!(got.iter().all(|&p| p == color), "frame {i} is on the X screen, whole");
    }
    buffers.dedup();
    assert_eq!(buffers.len(), 1, "every frame in the buffer the previous one was in");
    // The last frame's buffer is the client's again, and still what the window shows:
    // drawing over it copies it in first.
    let last = (0x10_20_30 * 8) & 0xff_ffff;
    d.fill_rect(w, Rect::new(0, 0, 8, 8), 0xabcdef).expect("fill");
    d.sync_shown().expect("sync");
    let got = x.get_image(xid, 64, 48).expect("GetImage");
    assert_eq!(got[0], 0xabcdef);
    assert_eq!(got[10 * 64 + 10], last);
    // A smaller frame written into that same buffer: the old frame's pixels are gone
    // from it, and are not copied in from it (they would be this frame's bytes at the
    // old geometry); the X server keeps showing the old frame around the new one, also
    // after drawing elsewhere in the window.
    let mut f = d.frame(64, 48).expect("frame");
    f.fill(0x00ff00);
    f.present(w, 0, 0, 0, 50).expect("present");
    d.sync_shown().expect("sync");
    let mut f = d.frame(32, 24).expect("frame");
    f.fill(0x0000ff);
    f.present(w, 0, 0, 0, 51).expect("present");
    d.sync_shown().expect("sync");
    d.fill_rect(w, Rect::new(40, 40, 4, 4), 0xabcdef).expect("fill");
    d.sync_shown().expect("sync");
    let got = x.get_image(xid, 64, 48).expect("GetImage");
    assert_eq!(got[10 * 64 + 10], 0x0000ff, "the small frame");
    assert_eq!(got[41 * 64 + 41], 0xabcdef, "the drawing");
    // (50, 5): at the old geometry, bytes the small frame overwrote in the buffer.
    assert_eq!(got[5 * 64 + 50], 0x00ff00, "the frame before it, around it");
    // A frame due later (the client does not wait for it) keeps its buffer until
    // another replaces it: the next frame goes into a second buffer.
    let mut f = d.frame(64, 48).expect("frame");
    let first = f.pixels().as_ptr() as usize;
    f.fill(0x0000ff);
    f.present(w, 0, 0, ictus_display::monotonic_ns() + 1_000_000, 100).expect("present");
    d.flush().expect("flush");
    while !matches!(d.next_event(WATCHDOG).expect("event"), Some(Message::Frame { tag: 100, .. }) | None) {}
    let mut f = d.frame(64, 48).expect("frame");
    assert_ne!(f.pixels().as_ptr() as usize, first, "the shown frame's buffer is still held");
    drop(f);
    drop(d);
    server.stop();
}

/// A sync's answer carries the server's stamps, on the clients' clock and in order:
/// the server began the batch after the client sent it, sent its present to the X
/// server, and had it acknowledged before the client got the answer; the frame's own
/// report says it was shown no later than that acknowledgement. A plain sync waits for
/// no present and says so (0, 0). Over every transport.
#[test]
fn a_sync_with_the_screen_carries_the_servers_stamps_in_order() {
    let xvfb = Xvfb::start(640, 480).unwrap_or_else(|e| panic!("{e}"));
    let server = on_x(&xvfb, true, "stamps");
    for t in [Transport::Socket, Transport::Port, Transport::Shm] {
        let mut d = connect(&server, t);
        let w = d.create_window(None, Rect::new(0, 0, 64, 48), 0).expect("window");
        d.sync_shown().expect("sync");
        for i in 0..4u32 {
            let before = ictus_display::monotonic_ns();
            let mut f = d.frame(64, 48).expect("frame");
            f.fill(0x10_20_30 * (i + 1));
            f.present(w, 0, 0, 0, i).expect("present");
            let s = d.sync_shown().expect("sync");
            let after = ictus_display::monotonic_ns();
            assert!(
                before <= s.begun_ns && s.begun_ns <= s.sent_ns && s.sent_ns <= s.acked_ns && s.acked_ns <= after,
                "{t:?}: {before} <= begun {} <= sent {} <= acked {} <= {after}",
                s.begun_ns,
                s.sent_ns,
                s.acked_ns
            );
            let shown = loop {
                match d.next_event(WATCHDOG).expect("event") {
                    Some(Message::Frame { tag, shown_ns, dropped: false, .. }) if tag == i => break shown_ns,
                    Some(_) => {}
                    None => panic!("{t:?}: frame {i} never reported"),
                }
            };
            assert!(shown <= s.acked_ns, "{t:?}: shown at {shown}, after the acknowledgement {}", s.acked_ns);
        }
        let before = ictus_display::monotonic_ns();
        d.fill_rect(w, Rect::new(0, 0, 8, 8), 0xabcdef).expect("fill");
        let s = d.sync().expect("sync");
        assert_eq!((s.sent_ns, s.acked_ns), (0, 0), "{t:?}: a plain sync waits for no present");
        assert!(before <= s.begun_ns && s.begun_ns <= ictus_display::monotonic_ns(), "{t:?}: begun {}", s.begun_ns);
        drop(d);
    }
    server.stop();
}
