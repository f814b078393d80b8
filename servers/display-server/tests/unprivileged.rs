//! Without privileges, everything still works: a child that drops to `nobody` (when
//! the test runs as root) starts its own Xvfb and a display server on it with MIT-SHM,
//! and draws over every transport, frames included; the X server has the pixels.

mod common;

use common::*;
use ictus_display::{Rect, Transport};
use ictus_display_server::xvfb::Xvfb;
use ictus_display_server::{Options, Screen};
use ictus_testkit::{Proc, Role};

const CHILD: Role = Role { env: "ICTUS_DISPLAY_TEST_UNPRIVILEGED" };

/// The child: drop to nobody, then serve and draw.
#[test]
fn child_unprivileged() {
    let Some(_) = CHILD.current() else { return };
    if rustix::process::geteuid().is_root() {
        // SAFETY: plain system calls at the start of a single-purpose child process;
        // glibc applies them to every thread.
        let ok = unsafe { libc::setresgid(65534, 65534, 65534) == 0 && libc::setresuid(65534, 65534, 65534) == 0 };
        assert!(ok, "dropping privileges");
    }
    assert!(!rustix::process::geteuid().is_root());
    let xvfb = Xvfb::start(320, 240).unwrap_or_else(|e| panic!("{e}"));
    let server = server_with("unprivileged", |socket| {
        let mut opts = Options::headless(0, 0, Some(socket));
        opts.screen = Screen::X { display: Some(xvfb.display().to_owned()), shm: true };
        opts
    });
    let x = server.x().expect("an X screen");
    assert!(x.has_shm(), "MIT-SHM without privileges");
    for (i, t) in Transport::ALL.into_iter().enumerate() {
        let mut d = connect(&server, t);
        let w = d.create_window(None, Rect::new(100 * i as i16, 0, 64, 48), 0).expect("window");
        d.fill_rect(w, Rect::new(0, 0, 32, 48), 0x123456).expect("fill");
        let mut f = d.frame(32, 48).expect("frame");
        f.fill(0x00abcdef);
        f.present(w, 32, 0, 0, 1).expect("present");
        d.sync_shown().expect("sync");
        let info = server.windows().into_iter().find(|i| i.id == w.0).expect("window");
        let px = x.get_image(info.xid.expect("an X window"), 64, 48).expect("GetImage");
        assert_eq!((px[0], px[63]), (0x123456, 0xabcdef), "{t:?}");
    }
    println!("done");
}

#[test]
fn the_server_and_its_clients_need_no_privileges() {
    let mut child = Proc::spawn("an unprivileged server", &mut CHILD.command("child_unprivileged", "run"));
    child.wait_success();
}
