//! The Tactus server with real clients: items delivered at their time and counted,
//! video through a (headless) display server, the time map's changes, garbage, and a
//! client killed mid-stream while another goes on. Nothing here asserts a duration:
//! every wait is for an event, within the test kit's watchdog.

use std::time::{Duration, Instant};

use ictus_ipc::Space;
use ictus_server::Registrar;
use ictus_tactus::proto::{delivered, Delivered, Report, StreamKind};
use ictus_tactus::{monotonic_ns, ConnectOptions, LatePolicy, StreamSpec, Tactus, Transport};
use ictus_testkit::{wait_until, NameServer, Proc, Role, WATCHDOG};

const ROLE: Role = Role { env: "ICTUS_TACTUS_TEST_ROLE" };
const MS: i64 = 1_000_000;

struct Rig {
    ns: NameServer,
    _display: Option<(Registrar, ictus_display_server::Running)>,
    tactus_names: Option<Registrar>,
    tactus: Option<ictus_tactus_server::Running>,
}

impl Rig {
    fn start(display: bool) -> Rig {
        let ns = NameServer::start();
        let display = display.then(|| {
            let space = Space::task();
            let opts = ictus_display_server::Options::headless(640, 480, None);
            let running = ictus_display_server::spawn(&space, opts).expect("display server");
            let names = Registrar::start(
                "display",
                Some(&ns.socket()),
                running.space(),
                &[("display", running.service_port())],
            )
            .expect("register the display");
            ns.wait_for("display");
            (names, running)
        });
        let space = Space::task();
        let mut opts = ictus_tactus_server::Options::timesharing();
        opts.devices.name_server = Some(ns.socket());
        let tactus = ictus_tactus_server::spawn(&space, opts).expect("tactus");
        let names =
            Registrar::start("tactus", Some(&ns.socket()), tactus.space(), &[("tactus", tactus.service_port())])
                .expect("register tactus");
        ns.wait_for("tactus");
        Rig { ns, _display: display, tactus_names: Some(names), tactus: Some(tactus) }
    }

    fn client(&self) -> Tactus {
        let o =
            ConnectOptions { name_server: Some(self.ns.socket()), ..ConnectOptions::default() }.with_pool(4, 1 << 20);
        Tactus::connect(&o).expect("connect to tactus")
    }

    fn tactus(&self) -> &ictus_tactus_server::Running {
        self.tactus.as_ref().expect("running")
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(n) = self.tactus_names.take() {
            n.stop();
        }
        if let Some(t) = self.tactus.take() {
            t.stop().expect("tactus stops cleanly");
        }
    }
}

/// Collect delivery reports until `n` have come (within the watchdog), failing on an
/// error report.
fn deliveries(t: &mut Tactus, n: usize) -> Vec<Delivered> {
    let deadline = Instant::now() + WATCHDOG;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < deadline, "watchdog: {} of {n} delivery reports", got.len());
        match t.next_report(Duration::from_millis(100)).expect("reports") {
            Some(Report::Delivered(d)) => got.push(d),
            Some(Report::Error(e)) => panic!("error report: {e:?}"),
            _ => {}
        }
    }
    got
}

#[test]
fn items_are_delivered_never_early_and_each_counted_once() {
    if ROLE.current().is_some() {
        return;
    }
    let rig = Rig::start(false);
    let mut t = rig.client();
    let p = t.open_presentation().unwrap();
    let s = t.open_stream(p, &StreamSpec::data("null").reported()).unwrap();
    for i in 0..20 {
        t.send(s, i * 10 * MS, 10 * MS as u64, &[i as u8; 3]).unwrap();
    }
    t.start(p, 0, None).unwrap();
    let mut got = deliveries(&mut t, 20);
    got.sort_by_key(|d| d.seq);
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d.seq, i as u64 + 1);
        assert_eq!(d.logical, i as i64 * 10 * MS);
        assert!(d.presented >= d.due, "item {i} presented {} ns before its time", d.due - d.presented);
        assert!(d.due > 0 && d.received > 0 && d.handed >= d.received);
        assert_eq!(d.flags & (delivered::DROPPED | delivered::FLUSHED), 0);
    }
    // Due times follow the logical times exactly (the map is linear at rate 1).
    assert_eq!(got[19].due - got[0].due, 190 * MS as u64);
    let st = t.status(WATCHDOG).unwrap().expect("a status report");
    let ss = st.streams.iter().find(|x| x.id == s.0).unwrap();
    assert_eq!(ss.on_time + ss.late, 20);
    assert_eq!((ss.dropped, ss.flushed, ss.refused, ss.items), (0, 0, 0, 0));
}

#[test]
fn frames_reach_the_display_at_their_time_and_the_screen_reports_them() {
    if ROLE.current().is_some() {
        return;
    }
    let rig = Rig::start(true);
    let mut t = rig.client();
    let p = t.open_presentation().unwrap();
    let (w, h) = (64u16, 48u16);
    let v = t.open_stream(p, &StreamSpec::video(w, h).policy(LatePolicy::Show).reported()).unwrap();
    let frame =
        |k: u32| -> Vec<u8> { (0..w as u32 * h as u32).flat_map(|_| (0x10_0000 * (k + 1)).to_le_bytes()).collect() };
    for k in 0..10u32 {
        t.send(v, i64::from(k) * 40 * MS, 40 * MS as u64, &frame(k)).unwrap();
    }
    t.start(p, 0, None).unwrap();
    let got = deliveries(&mut t, 10);
    for d in &got {
        assert_ne!(d.flags & delivered::BY_DEVICE, 0, "{d:?}");
        assert_eq!(d.flags & delivered::DEVICE_DROPPED, 0, "{d:?}");
        assert!(d.presented > 0 && d.handed <= d.presented, "{d:?}");
    }
}

#[test]
fn large_frames_travel_in_pool_buffers_and_come_back() {
    if ROLE.current().is_some() {
        return;
    }
    let rig = Rig::start(false);
    let mut t = rig.client();
    let p = t.open_presentation().unwrap();
    // 256×256 frames (256 KiB) to the null device: pool buffers, 4 of them, 40 frames.
    let v = t
        .open_stream(
            p,
            &StreamSpec { kind: StreamKind::Video { width: 256, height: 256 }, ..StreamSpec::video(1, 1) }
                .device("null")
                .reported(),
        )
        .unwrap();
    t.start(p, 0, None).unwrap();
    let base = 100 * MS;
    for k in 0..40i64 {
        // Each send waits for a buffer the server has given back.
        t.send_with(v, 256 * 256 * 4, base + k * 5 * MS, 5 * MS as u64, |b| {
            b.fill(k as u8);
            Ok(())
        })
        .unwrap();
    }
    let got = deliveries(&mut t, 40);
    // Every frame is accounted for exactly once, and each went as an attachment and
    // its item record.
    let mut seqs: Vec<u64> = got.iter().map(|d| d.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=40).collect::<Vec<u64>>());
    assert!(t.shm_stats().unwrap().sent >= 80);
}

#[test]
fn pause_holds_seek_flushes_and_resume_goes_on() {
    if ROLE.current().is_some() {
        return;
    }
    let rig = Rig::start(false);
    let mut t = rig.client();
    let p = t.open_presentation().unwrap();
    let s = t.open_stream(p, &StreamSpec::data("null").reported()).unwrap();
    // Items every 50 ms for 2 s; the first at 0.
    for i in 0..40 {
        t.send(s, i * 50 * MS, 50 * MS as u64, b"x").unwrap();
    }
    t.start(p, 0, None).unwrap();
    deliveries(&mut t, 2);
    t.pause(p).unwrap();
    // Once paused, the position stands still: two status reports agree.
    let a = wait_paused(&mut t, p.0);
    std::thread::sleep(Duration::from_millis(50));
    let b = t.status(WATCHDOG).unwrap().unwrap().presentations[0].position;
    assert_eq!(a, b);
    // Seek to 10 s: the old epoch's items after the seek point are flushed.
    let e = t.seek(p, 10_000 * MS).unwrap();
    assert_eq!(e, 1);
    for i in 0..5 {
        t.send(s, 10_000 * MS + i * 20 * MS, 20 * MS as u64, b"y").unwrap();
    }
    t.resume(p).unwrap();
    let deadline = Instant::now() + WATCHDOG;
    let (mut flushed, mut new) = (0, 0);
    while new < 5 {
        assert!(Instant::now() < deadline, "watchdog: {new} new items");
        if let Some(Report::Delivered(d)) = t.next_report(Duration::from_millis(100)).unwrap() {
            if d.flags & delivered::FLUSHED != 0 {
                flushed += 1;
            } else if d.logical >= 10_000 * MS {
                new += 1;
            }
        }
    }
    let st = t.status(WATCHDOG).unwrap().unwrap();
    let ss = &st.streams[0];
    assert_eq!(ss.flushed, flushed);
    assert_eq!(ss.on_time + ss.late + ss.flushed, 45, "{ss:?}");
    assert!(st.presentations[0].position >= 10_000 * MS);
    assert_eq!(st.presentations[0].epoch, 1);
}

fn wait_paused(t: &mut Tactus, p: u32) -> i64 {
    let deadline = Instant::now() + WATCHDOG;
    loop {
        assert!(Instant::now() < deadline, "watchdog: never paused");
        let st = t.status(WATCHDOG).unwrap().unwrap();
        let ps = st.presentations.iter().find(|x| x.id == p).unwrap();
        if ps.motion == 2 {
            return ps.position;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn garbage_gets_error_reports_and_the_client_goes_on() {
    if ROLE.current().is_some() {
        return;
    }
    let rig = Rig::start(false);
    let mut t = rig.client();
    let p = t.open_presentation().unwrap();
    // A device that does not exist, a stream of an unknown presentation, an item of an
    // unknown stream, a wrong-sized frame.
    let _ = t.open_stream(p, &StreamSpec::data("nowhere")).unwrap();
    let v = t.open_stream(p, &StreamSpec::video(8, 8).device("null")).unwrap();
    t.send(v, 0, 0, &[0; 7]).unwrap();
    let mut errors = 0;
    let deadline = Instant::now() + WATCHDOG;
    while errors < 2 {
        assert!(Instant::now() < deadline, "watchdog: {errors} error reports");
        if let Some(Report::Error(_)) = t.next_report(Duration::from_millis(100)).unwrap() {
            errors += 1;
        }
    }
    // The client still works.
    let s = t.open_stream(p, &StreamSpec::data("null").reported()).unwrap();
    t.send(s, 0, 0, b"ok").unwrap();
    t.start(p, 0, None).unwrap();
    deliveries(&mut t, 1);
    assert!(rig.tactus().counters().refused >= 2);
}

#[test]
fn the_socket_transport_carries_the_same_records() {
    if ROLE.current().is_some() {
        return;
    }
    let ns = NameServer::start();
    let space = Space::task();
    let dir = ictus_testkit::TempDir::new("tactus-sock");
    let mut opts = ictus_tactus_server::Options::timesharing();
    opts.socket = Some(dir.join("tactus.sock"));
    let tactus = ictus_tactus_server::spawn(&space, opts).expect("tactus");
    let names =
        Registrar::start("tactus", Some(&ns.socket()), tactus.space(), &[("tactus", tactus.service_port())]).unwrap();
    ns.wait_for("tactus");
    let o =
        ConnectOptions { name_server: Some(ns.socket()), transport: Transport::Socket, ..ConnectOptions::default() };
    let mut t = Tactus::connect(&o).unwrap();
    let p = t.open_presentation().unwrap();
    let s = t.open_stream(p, &StreamSpec::data("null").reported()).unwrap();
    for i in 0..5 {
        t.send(s, i * MS, 0, &[1; 40_000]).unwrap();
    }
    t.start(p, 0, None).unwrap();
    assert_eq!(deliveries(&mut t, 5).len(), 5);
    drop(t);
    wait_until("the socket client to be gone", || tactus.clients() == 0);
    names.stop();
    tactus.stop().unwrap();
}

/// A client in a child process: opens a stream with items far ahead (some in pool
/// buffers), says so, then waits to be killed.
#[test]
fn child_client_role() {
    let Some(role) = ROLE.current() else { return };
    assert_eq!(role, "queue-and-wait");
    let ns = std::env::var("ICTUS_TACTUS_TEST_NS").expect("name server");
    let o = ConnectOptions { name_server: Some(ns.into()), ..ConnectOptions::default() }.with_pool(4, 1 << 20);
    let mut t = Tactus::connect(&o).unwrap();
    let p = t.open_presentation().unwrap();
    let s = t.open_stream(p, &StreamSpec::video(256, 256).device("null")).unwrap();
    let m = t.open_stream(p, &StreamSpec::data("null")).unwrap();
    for k in 0..4 {
        t.send(s, 3_600_000 * MS + k * MS, MS as u64, &vec![7u8; 256 * 256 * 4]).unwrap();
    }
    for k in 0..100 {
        t.send(m, 3_600_000 * MS + k * MS, 0, &[1; 100]).unwrap();
    }
    t.start(p, 0, None).unwrap();
    let _ = t.status(WATCHDOG).unwrap();
    println!("QUEUED");
    std::thread::sleep(WATCHDOG * 2);
}

#[test]
fn a_client_killed_mid_stream_leaves_nothing_and_others_go_on() {
    // It counts the process's descriptors: alone in a process of its own.
    if !ROLE.alone("a_client_killed_mid_stream_leaves_nothing_and_others_go_on") {
        return;
    }
    let rig = Rig::start(false);
    // The channels' link watcher keeps one epoll for good: started before the count.
    ictus_shm::start_watcher().expect("the link watcher");
    let fds_before = ictus_shm::open_fds();
    let maps_before = ictus_shm::mappings_named("ictus-shm-channel");
    // Our own stream, running throughout.
    let mut t = rig.client();
    let p = t.open_presentation().unwrap();
    let s = t.open_stream(p, &StreamSpec::data("null").reported()).unwrap();
    let t0 = 200 * MS;
    for i in 0..10 {
        t.send(s, t0 + i * 20 * MS, 20 * MS as u64, b"a").unwrap();
    }
    t.start(p, 0, None).unwrap();
    // The child queues a lot, far ahead, and is killed.
    let mut cmd = ROLE.command("child_client_role", "queue-and-wait");
    cmd.env("ICTUS_TACTUS_TEST_NS", rig.ns.socket()).stdout(std::process::Stdio::piped());
    let mut child = Proc::spawn("client child", &mut cmd);
    child.wait_line("QUEUED");
    wait_until("the child's streams to be open", || rig.tactus().streams() == 3);
    child.kill9();
    wait_until("the child's streams to go", || rig.tactus().streams() == 1);
    wait_until("the child to be gone", || rig.tactus().clients() == 1);
    // Ours goes on: more items, delivered.
    for i in 10..20 {
        t.send(s, t0 + i * 20 * MS, 20 * MS as u64, b"b").unwrap();
    }
    let got = deliveries(&mut t, 20);
    assert_eq!(got.iter().filter(|d| d.flags & delivered::FLUSHED == 0).count(), 20);
    drop(t);
    wait_until("our client to be gone too", || rig.tactus().clients() == 0);
    // Nothing of either channel is left in this process (the server's side).
    wait_until("descriptors back to where they were", || ictus_shm::open_fds() <= fds_before);
    wait_until("channel mappings unmapped", || ictus_shm::mappings_named("ictus-shm-channel") <= maps_before);
    let _ = monotonic_ns();
}

#[test]
fn the_toolkit_demo_plays_picture_and_notes_through_tactus() {
    use ictus_midi::device::{cable::CableIn, Device as _};
    use ictus_tactus::toolkit::demo::{Ball, Melody};
    use ictus_tactus::toolkit::{Lead, Runner, Scheduler};
    if ROLE.current().is_some() {
        return;
    }
    let rig = Rig::start(true);
    let name = ictus_testkit::unique("tactus-demo");
    let mut cable = CableIn::open(&name).expect("a cable");
    let mut t = rig.client();
    let p = t.open_presentation().unwrap();
    let v = t.open_stream(p, &StreamSpec::video(80, 60).policy(LatePolicy::Show)).unwrap();
    let m = t.open_stream(p, &StreamSpec::midi(&format!("cable:{name}"))).unwrap();
    let beat = Duration::from_millis(200);
    let mut s = Scheduler::new();
    s.add(Ball { stream: v, w: 80, h: 60, frame: Duration::from_millis(50), beat }, 0);
    s.add(Melody { stream: m, beat, played: 0 }, 0);
    let mut r =
        Runner::new(p, Lead::new(Duration::from_millis(100), Duration::from_millis(30), Duration::from_secs(2)));
    let stats = r.run(&mut t, &mut s, 0, 1_000 * MS).unwrap();
    // 0..=1 s: 21 frames and 6 beats of two messages each (the last note-off at 1.1 s
    // is past the end and not sent).
    assert_eq!(stats.sent, 21 + 11, "{stats:?}");
    let mut bytes = Vec::new();
    let deadline = Instant::now() + WATCHDOG;
    while bytes.iter().filter(|&&b| b & 0xf0 == 0x90).count() < 6 {
        assert!(Instant::now() < deadline, "watchdog: MIDI bytes so far {bytes:?}");
        let mut buf = [0u8; 64];
        if let Ok(n) = cable.read(&mut buf, Some(Duration::from_millis(100))) {
            bytes.extend_from_slice(&buf[..n]);
        }
    }
    let st = t.status(WATCHDOG).unwrap().unwrap();
    let video = st.streams.iter().find(|x| x.id == v.0).unwrap();
    assert_eq!(video.on_time + video.late + video.dropped, 21, "{video:?}");
}

/// A display server in a child process, registered with the parent's name server;
/// it waits to be killed.
#[test]
fn child_display_role() {
    let Some(role) = ROLE.current() else { return };
    assert_eq!(role, "display");
    let ns = std::env::var("ICTUS_TACTUS_TEST_NS").expect("name server");
    let space = Space::task();
    let running =
        ictus_display_server::spawn(&space, ictus_display_server::Options::headless(320, 240, None)).expect("display");
    let _names = Registrar::start(
        "display",
        Some(std::path::Path::new(&ns)),
        running.space(),
        &[("display", running.service_port())],
    )
    .expect("register the display");
    println!("DISPLAYING");
    std::thread::sleep(WATCHDOG * 2);
}

#[test]
fn a_display_killed_mid_stream_is_reported_and_other_streams_go_on() {
    // It counts the process's descriptors: alone in a process of its own.
    if !ROLE.alone("a_display_killed_mid_stream_is_reported_and_other_streams_go_on") {
        return;
    }
    let rig = Rig::start(false);
    let mut cmd = ROLE.command("child_display_role", "display");
    cmd.env("ICTUS_TACTUS_TEST_NS", rig.ns.socket()).stdout(std::process::Stdio::piped());
    let mut display = Proc::spawn("display child", &mut cmd);
    display.wait_line("DISPLAYING");
    rig.ns.wait_for("display");
    ictus_shm::start_watcher().expect("the link watcher");
    let fds_before = ictus_shm::open_fds();
    let mut t = rig.client();
    let p = t.open_presentation().unwrap();
    let (w, h) = (64u16, 48u16);
    let v = t.open_stream(p, &StreamSpec::video(w, h).policy(LatePolicy::Show).reported()).unwrap();
    let d = t.open_stream(p, &StreamSpec::data("null").reported()).unwrap();
    let frame = vec![0x40u8; usize::from(w) * usize::from(h) * 4];
    // Frames and items every 20 ms for 2 s; more are sent after the kill.
    for i in 0..100 {
        t.send(v, 100 * MS + i * 20 * MS, 20 * MS as u64, &frame).unwrap();
        t.send(d, 100 * MS + i * 20 * MS, 20 * MS as u64, b"d").unwrap();
    }
    t.start(p, 0, None).unwrap();
    // The display shows frames (its own reports come back) before it dies.
    let deadline = Instant::now() + WATCHDOG;
    let mut shown = 0;
    while shown < 3 {
        assert!(Instant::now() < deadline, "watchdog: no frame shown");
        if let Some(Report::Delivered(x)) = t.next_report(Duration::from_millis(100)).unwrap() {
            if x.stream == v.0 && x.flags & delivered::BY_DEVICE != 0 {
                shown += 1;
            }
        }
    }
    display.kill9();
    // The client is told, on the video stream, that its device is lost.
    let deadline = Instant::now() + WATCHDOG;
    let mut data_after = 0;
    let mut told = None;
    while told.is_none() {
        assert!(Instant::now() < deadline, "watchdog: never told the display was lost");
        match t.next_report(Duration::from_millis(100)).unwrap() {
            Some(Report::Error(e)) => told = Some(e),
            Some(Report::Delivered(x)) if x.stream == d.0 => data_after += 1,
            _ => {}
        }
    }
    let e = told.unwrap();
    assert_eq!(e.id, v.0, "{e:?}");
    assert!(e.text.contains("lost"), "{e:?}");
    // The other stream goes on: every one of its items is delivered, none dropped.
    for i in 100..110 {
        t.send(d, 100 * MS + i * 20 * MS, 20 * MS as u64, b"e").unwrap();
        t.send(v, 100 * MS + i * 20 * MS, 20 * MS as u64, &frame).unwrap();
    }
    let deadline = Instant::now() + WATCHDOG;
    loop {
        assert!(Instant::now() < deadline, "watchdog: the data stream stalled");
        let st = t.status(WATCHDOG).unwrap().expect("status");
        let ds = st.streams.iter().find(|x| x.id == d.0).unwrap();
        let vs = st.streams.iter().find(|x| x.id == v.0).unwrap();
        if ds.on_time + ds.late == 110 && vs.items == 0 {
            assert_eq!(ds.dropped, 0, "{ds:?}");
            // Every frame is accounted for: shown (on time or late) or dropped.
            assert_eq!(vs.on_time + vs.late + vs.dropped, 110, "{vs:?}");
            assert!(vs.dropped >= 1, "frames after the kill are dropped: {vs:?}");
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = data_after;
    // Closing the stream and the client leaves nothing: the dead display's connection
    // is closed with the stream.
    drop(t);
    wait_until("the client to be gone", || rig.tactus().clients() == 0 && rig.tactus().streams() == 0);
    wait_until("descriptors back to where they were", || ictus_shm::open_fds() <= fds_before);
}

/// The unprivileged path: as `nobody` (when the test runs as root), the server asks
/// for real-time threads, is refused, says so once, and delivers anyway.
#[test]
fn child_unprivileged_role() {
    let Some(role) = ROLE.current() else { return };
    assert_eq!(role, "unprivileged");
    if rustix::process::geteuid().is_root() {
        // Per thread (the kernel's setresuid): this thread and every thread it starts
        // from here on run as nobody; nothing has been started yet.
        let nobody = 65534;
        rustix::thread::set_thread_groups(&[]).expect("drop groups");
        rustix::thread::set_thread_res_gid(
            rustix::process::Gid::from_raw(nobody),
            rustix::process::Gid::from_raw(nobody),
            rustix::process::Gid::from_raw(nobody),
        )
        .expect("setresgid");
        rustix::thread::set_thread_res_uid(
            rustix::process::Uid::from_raw(nobody),
            rustix::process::Uid::from_raw(nobody),
            rustix::process::Uid::from_raw(nobody),
        )
        .expect("setresuid");
    }
    assert!(!ictus_rt::thread::probe(ictus_rt::thread::Policy::Fifo { priority: 70 }), "real time is refused here");
    let ns = NameServer::start();
    let space = Space::task();
    let mut opts = ictus_tactus_server::Options::default();
    opts.devices.name_server = Some(ns.socket());
    let tactus = ictus_tactus_server::spawn(&space, opts).expect("tactus without privileges");
    let names = Registrar::start("tactus", Some(&ns.socket()), tactus.space(), &[("tactus", tactus.service_port())])
        .expect("register tactus");
    ns.wait_for("tactus");
    let mut t = Tactus::connect(&ConnectOptions { name_server: Some(ns.socket()), ..ConnectOptions::default() })
        .expect("connect");
    let p = t.open_presentation().unwrap();
    let s = t.open_stream(p, &StreamSpec::data("null").reported()).unwrap();
    for i in 0..10 {
        t.send(s, 50 * MS + i * 10 * MS, 10 * MS as u64, b"x").unwrap();
    }
    t.start(p, 0, None).unwrap();
    let got = deliveries(&mut t, 10);
    assert!(got.iter().all(|d| d.presented >= d.due && d.flags & delivered::DROPPED == 0), "{got:?}");
    drop(t);
    names.stop();
    tactus.stop().expect("stops cleanly");
    println!("DELIVERED {}", got.len());
}

#[test]
fn without_privileges_it_runs_anyway_and_says_once_what_that_costs() {
    if ROLE.current().is_some() {
        return;
    }
    let mut cmd = ROLE.command("child_unprivileged_role", "unprivileged");
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let out = cmd.output().expect("the unprivileged child");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("DELIVERED 10"), "{stdout}\n{stderr}");
    // Said once, not per item.
    assert_eq!(stderr.matches("timesharing scheduler").count(), 1, "{stderr}");
}
