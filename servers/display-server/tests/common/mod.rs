//! Helpers of the display tests: a server on threads of the test, clients over each
//! transport, and a known scene. No test asserts a duration.
#![allow(dead_code)] // each test binary uses its own subset

use std::ops::Deref;

use ictus_display::{ConnectOptions, Display, Rect, Transport, Window};
use ictus_display_server::{Options, Running};
use ictus_ipc::Space;
#[allow(unused_imports)] // each test binary uses its own subset
pub use ictus_testkit::{wait_until, TempDir, WATCHDOG};

/// A display server on threads of the test, with its socket in a private directory
/// of its own; both go on drop.
#[derive(Debug)]
pub struct Server {
    running: Option<Running>,
    _dir: TempDir,
}

impl Server {
    /// Stop the server (every client's windows and buffers go).
    pub fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.stop();
        }
    }
}

impl Deref for Server {
    type Target = Running;
    fn deref(&self) -> &Running {
        self.running.as_ref().expect("running until stopped")
    }
}

/// A server with `opts` (the socket goes in a private directory): `opts(socket)`.
pub fn server_with(tag: &str, opts: impl FnOnce(std::path::PathBuf) -> Options) -> Server {
    let dir = TempDir::new(&format!("display-{tag}"));
    let running = ictus_display_server::spawn(&Space::new(), opts(dir.join("display.sock"))).expect("server");
    Server { running: Some(running), _dir: dir }
}

/// A headless server with every transport.
pub fn headless(tag: &str) -> Server {
    server_with(tag, |socket| Options::headless(320, 200, Some(socket)))
}

/// A client of `server` over `t`, in a space of its own.
pub fn connect(server: &Running, t: Transport) -> Display {
    let space = Space::new();
    let name = space.insert_send_fd(server.service_fd().expect("send right")).expect("insert");
    let mut opts = ConnectOptions::new(t);
    opts.timeout = WATCHDOG;
    Display::connect_to(&space, name, &opts).expect("connect")
}

/// Draw the known scene: every kind of request, a sub-window and a frame.
pub fn draw_scene(d: &mut Display) -> Window {
    let w = d.create_window(None, Rect::new(10, 20, 200, 120), 0x102030).expect("window");
    d.fill_rect(w, Rect::new(5, 5, 60, 40), 0xff0000).expect("fill");
    d.xor_rect(w, Rect::new(30, 20, 60, 40), 0x00ffff).expect("xor");
    d.line(w, 0, 119, 199, 0, 0xffff00).expect("line");
    d.text(w, 8, 100, 0xffffff, Some(0x000080), b"ictus display").expect("text");
    d.copy_area(w, Rect::new(0, 0, 100, 50), 100, 60).expect("copy");
    let img: Vec<u32> = (0..16 * 8).map(|i| 0x010101 * (i as u32 % 200)).collect();
    d.put_image(w, Rect::new(150, 5, 16, 8), &img).expect("image");
    let sub = d.create_window(Some(w), Rect::new(120, 30, 40, 30), 0x00ff00).expect("sub-window");
    d.text(sub, 2, 2, 0, None, b"sub").expect("text");
    let mut f = d.frame(32, 24).expect("frame");
    for (i, px) in f.pixels().chunks_exact_mut(4).enumerate() {
        px.copy_from_slice(&(0x00a0_0000 | (i as u32 * 97) & 0xffff).to_le_bytes());
    }
    f.present(w, 10, 60, 0, 7).expect("present");
    w
}
