//! Without privileges, everything still works: a child that drops to `nobody` (when
//! the test runs as root) starts its own Xvfb and a display server on it with MIT-SHM,
//! and draws over every transport, frames included; the X server has the pixels.
//! The server's time-critical threads ask for `SCHED_FIFO` themselves: granted where
//! the process may have it, refused (and said once, with its cost) where it may not.

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
        opts.realtime = true;
        opts
    });
    let x = server.x().expect("an X screen");
    assert!(x.has_shm(), "MIT-SHM without privileges");
    let may = ictus_rt::thread::rt_privileges();
    check_scheduling(&server, may);
    eprintln!("realtime granted: {may}");
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

/// Every time-critical thread asked for `SCHED_FIFO`, and has it exactly when the
/// process may have it; a refusal says why and leaves the timesharing class.
fn check_scheduling(server: &ictus_display_server::Running, may: bool) {
    use ictus_display_server::sched::{PRESENT_PRIORITY, TRANSPORT_PRIORITY};
    use ictus_rt::thread::Policy;
    let s = server.scheduling();
    let mut names: Vec<&str> = s.iter().map(|t| t.thread).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["ictus-display-port", "ictus-display-present", "ictus-display-shm", "ictus-display-sock"],
        "{s:?}"
    );
    for t in s {
        let priority = if t.thread == "ictus-display-present" { PRESENT_PRIORITY } else { TRANSPORT_PRIORITY };
        assert_eq!(t.asked, Some(Policy::Fifo { priority }), "{t:?}");
        if may {
            assert!(t.granted(), "{t:?}");
            assert_eq!(t.policy, Policy::Fifo { priority }, "{t:?}");
        } else {
            assert!(!t.granted(), "{t:?}");
            assert!(matches!(t.policy, Policy::Other { .. }), "{t:?}");
            assert!(t.refused.as_deref().is_some_and(|r| r.contains("SCHED_FIFO")), "{t:?}");
        }
    }
}

#[test]
fn the_server_and_its_clients_need_no_privileges() {
    let dir = ictus_testkit::TempDir::new("display-unprivileged-log");
    let log = dir.join("stderr");
    let mut child = Proc::spawn_logged("an unprivileged server", &mut CHILD.command("child_unprivileged", "run"), &log);
    child.wait_success();
    let said = child.log();
    // Refused (as nobody without an RLIMIT_RTPRIO): said once, with its cost, for
    // four threads; granted: not said at all.
    let warned = said.matches(ictus_display_server::sched::COST).count();
    let expected = if said.contains("realtime granted: false") {
        1
    } else {
        assert!(said.contains("realtime granted: true"), "the child did not get that far:\n{said}");
        0
    };
    assert_eq!(warned, expected, "{said}");
}

/// As root (this machine's test runs), the same threads get the class they ask for.
#[test]
fn the_time_critical_threads_ask_for_a_real_time_class() {
    let may = ictus_rt::thread::rt_privileges();
    let server =
        server_with("realtime", |socket| Options { realtime: true, ..Options::headless(64, 48, Some(socket)) });
    check_scheduling(&server, may);
    let mut d = connect(&server, Transport::Shm);
    let w = d.create_window(None, Rect::new(0, 0, 8, 8), 0).expect("window");
    d.fill_rect(w, Rect::new(0, 0, 8, 8), 0x123456).expect("fill");
    d.sync_shown().expect("sync");
    drop(d);
    server.stop();
}
