//! A known scene drawn over each transport, into a headless screen saved as PNG:
//! the three pictures are the same pixel for pixel, and the same as the scene drawn
//! straight with the server's own drawing code.

mod common;

use common::*;
use ictus_display::{Message, RasterOp, Rect, Segment, Transport};
use ictus_display_server::raster::Surface;

/// The scene, drawn with the drawing code alone (no protocol, no transport).
fn expected() -> Vec<u32> {
    let (sw, sh) = (320usize, 200usize);
    let mut win = vec![0x102030u32; 200 * 120];
    {
        let mut s = Surface { px: &mut win, w: 200, h: 120 };
        s.fill(Rect::new(5, 5, 60, 40), RasterOp::Copy, 0xff0000);
        s.fill(Rect::new(30, 20, 60, 40), RasterOp::Xor, 0x00ffff);
        s.segment(Segment { x1: 0, y1: 119, x2: 199, y2: 0 }, RasterOp::Copy, 0xffff00);
        s.text(8, 100, 0xffffff, Some(0x000080), b"ictus display");
        s.copy_area(Rect::new(0, 0, 100, 50), 100, 60);
        let img: Vec<u8> = (0..16 * 8).flat_map(|i| (0x010101 * (i as u32 % 200)).to_le_bytes()).collect();
        s.put_image(Rect::new(150, 5, 16, 8), 64, &img);
        let frame: Vec<u8> =
            (0..32 * 24).flat_map(|i| (0x00a0_0000 | (i as u32 * 97) & 0xffff).to_le_bytes()).collect();
        s.put_image(Rect::new(10, 60, 32, 24), 128, &frame);
    }
    let mut sub = vec![0x00ff00u32; 40 * 30];
    Surface { px: &mut sub, w: 40, h: 30 }.text(2, 2, 0, None, b"sub");
    let mut screen = vec![0u32; sw * sh];
    let bytes = |v: &[u32]| v.iter().flat_map(|p| p.to_le_bytes()).collect::<Vec<u8>>();
    let mut s = Surface { px: &mut screen, w: sw, h: sh };
    s.put_image(Rect::new(10, 20, 200, 120), 800, &bytes(&win));
    s.put_image(Rect::new(130, 50, 40, 30), 160, &bytes(&sub));
    screen
}

#[test]
fn the_same_scene_over_every_transport_is_the_same_png() {
    let want = expected();
    for t in Transport::ALL {
        let server = headless(&format!("scene-{}", t.name()));
        let mut d = connect(&server, t);
        let w = draw_scene(&mut d);
        let info = d.sync_shown().expect("sync");
        assert!(info.requests >= 10, "{t:?}: {info:?}");
        // The frame is reported shown.
        let mut shown = false;
        for _ in 0..100 {
            match d.next_event(WATCHDOG).expect("event") {
                Some(Message::Frame { window, tag: 7, dropped: false, .. }) if window == w.0 => {
                    shown = true;
                    break;
                }
                Some(Message::Error { .. }) => panic!("{t:?}: an error"),
                _ => {}
            }
        }
        assert!(shown, "{t:?}: no frame message");
        let png = std::env::temp_dir().join(format!("ictus-display-scene-{}-{}.png", std::process::id(), t.name()));
        server.save_png(&png).expect("save");
        let (pw, ph, got) = ictus_display_server::read_png(&png).expect("read");
        let _ = std::fs::remove_file(&png);
        assert_eq!((pw, ph), (320, 200));
        let differ = got.iter().zip(&want).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "{t:?}: {differ} pixels differ from the scene");
        // Not a picture of nothing: the red fill, the xor over it, the frame.
        assert_eq!(got[(20 + 10) * 320 + 10 + 10], 0xff0000);
        assert_eq!(got[(20 + 30) * 320 + 10 + 40], 0xff0000 ^ 0x00ffff);
        drop(d);
        server.stop();
    }
}
