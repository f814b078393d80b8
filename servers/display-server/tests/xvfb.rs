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
