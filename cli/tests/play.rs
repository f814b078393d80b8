//! `ictus tactus serve` and `ictus play` as processes: a clip made by
//! `ictus tactus make-clip` played through a headless display server, a WebM made by
//! GStreamer, and bad files (truncated, garbage, missing) each ending with a clear
//! error and never a hang. No test asserts a duration; every process has a watchdog.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ictus_ipc::Space;
use ictus_testkit::{ictus_name_server, lookup_when_registered, wait_until, Proc, TempDir, WATCHDOG};

fn ictus() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ictus"))
}

struct Servers {
    _ns: Proc,
    _display: Proc,
    _tactus: Proc,
    socket: std::path::PathBuf,
}

fn servers(dir: &TempDir) -> Servers {
    let socket = dir.join("ns.sock");
    let ns = ictus_name_server(Path::new(env!("CARGO_BIN_EXE_ictus")), &socket);
    let mut d = ictus();
    d.args(["display", "serve", "--headless", "--width", "320", "--height", "240", "--name-server"])
        .arg(&socket)
        .arg("--socket")
        .arg(dir.join("display.sock"));
    let display = Proc::spawn_logged("ictus display serve", &mut d, &dir.join("display.log"));
    let mut t = ictus();
    t.args(["tactus", "serve", "--timesharing", "--name-server"]).arg(&socket);
    let tactus = Proc::spawn_logged("ictus tactus serve", &mut t, &dir.join("tactus.log"));
    let space = Space::new();
    lookup_when_registered(&space, &socket, "display");
    lookup_when_registered(&space, &socket, "tactus");
    Servers { _ns: ns, _display: display, _tactus: tactus, socket }
}

/// Run `ictus play ARGS… --quiet` within the watchdog.
fn play(s: &Servers, path: &Path, extra: &[&str]) -> Output {
    let mut c = ictus();
    c.arg("play").arg(path).arg("--quiet").arg("--name-server").arg(&s.socket).args(extra);
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("ictus play");
    let deadline = Instant::now() + WATCHDOG;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("watchdog: ictus play hung on {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_clip_plays_through_tactus_and_bad_files_get_clear_errors() {
    let dir = TempDir::new("play-cli");
    let clip = dir.join("clip");
    let out =
        ictus().args(["tactus", "make-clip"]).arg(&clip).args(["--seconds", "2", "--size", "64x48"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = servers(&dir);
    let wav = dir.join("out.wav");
    let audio = format!("wav:{}", wav.display());
    let out = play(&s, &clip, &["--audio", &audio, "--seconds", "1.5"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("sent video 1"), "{text}");
    // The sink wrote a WAV file the reader accepts.
    let r = ictus_tactus::media::wav::WavReader::new(std::fs::File::open(&wav).unwrap()).unwrap();
    assert!(r.frames() > 0);

    // From 1 s in, 0.8 s of the clip at twice the speed: the frames at 1.0 … 1.7 s (10 fps).
    let wav2 = dir.join("out2.wav");
    let audio2 = format!("wav:{}", wav2.display());
    let out = play(&s, &clip, &["--start", "1", "--seconds", "0.8", "--rate", "2", "--audio", &audio2]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("sent video 8 "), "{text}");
    // The sound plays at twice the speed too, not muted: the clip's 40-sample clicks
    // (one every 100 ms) come out 20 samples long.
    let runs = click_runs(&wav2);
    assert!(runs.len() >= 2, "clicks heard at rate 2: {runs:?}");
    assert!(runs.iter().all(|&n| n <= 24), "each click half as long at rate 2: {runs:?}");
    assert!(runs.iter().filter(|&&n| n >= 18).count() >= 2, "whole clicks at rate 2: {runs:?}");
    // Starting past the end is refused, saying how long the clip is.
    let out = play(&s, &clip, &["--start", "60"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("long"), "{err}");

    // A video file cut inside a frame: an error naming the frame.
    let y4m = std::fs::read(clip.join("clip.y4m")).unwrap();
    let cut = dir.join("cut.y4m");
    std::fs::write(&cut, &y4m[..y4m.len() / 2 + 7]).unwrap();
    let out = play(&s, &cut, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("truncated"), "{err}");
    // Garbage with a container's name: GStreamer's own word for it.
    let junk = dir.join("junk.mp4");
    std::fs::write(&junk, [0x5au8; 4000]).unwrap();
    let out = play(&s, &junk, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("junk.mp4"), "{err}");
    // A WAV whose data chunk claims more than the file has.
    let w = std::fs::read(clip.join("clip.wav")).unwrap();
    let cutw = dir.join("cut.wav");
    std::fs::write(&cutw, &w[..w.len() - 100]).unwrap();
    let out = play(&s, &cutw, &[]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("truncated"));
    // Nothing there.
    let out = play(&s, &dir.join("nothing.y4m"), &[]);
    assert!(!out.status.success());

    // Compressed clips made by GStreamer, each whole and cut short: H.264 (with
    // B-frames: decoded out of order, presented in order) and AAC in MP4, what users
    // have most; VP8 and Vorbis in WebM; VP8 and MP3 in Matroska. (Not MPEG-4 part 2:
    // Debian's avenc_mpeg4 stamps every frame with an overflowed time, and mp4mux
    // writes a track no demuxer plays; avdec_mpeg4 itself is there.)
    for (name, mux, venc, aenc) in [
        (
            "clip.mp4",
            "mp4mux",
            &["x264enc", "speed-preset=ultrafast", "bframes=2", "b-adapt=false"][..],
            &["avenc_aac"][..],
        ),
        ("clip.webm", "webmmux", &["vp8enc", "deadline=1"][..], &["vorbisenc"][..]),
        ("clip.mkv", "matroskamux", &["vp8enc", "deadline=1"][..], &["lamemp3enc"][..]),
    ] {
        let file = dir.join(name);
        gst_clip(&file, mux, venc, aenc);
        let out = play(&s, &file, &[]);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("sent video 30"), "{name}: {text}");
        assert!(!text.contains(" audio 0 "), "{name}: {text}");
        let bytes = std::fs::read(&file).unwrap();
        let cut = dir.join(format!("cut-{name}"));
        std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
        // Cut short: it plays what it can or says what is wrong, naming the file; it
        // never hangs (the watchdog).
        let out = play(&s, &cut, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            assert!(err.contains(&format!("cut-{name}")), "{name} cut short: {err}");
        }
        // mp4mux writes the index (`moov`) after the media: a third of the file has
        // none, and nothing in it can be played.
        if name.ends_with(".mp4") {
            assert!(!out.status.success(), "{name} cut to a third has no index: {err}");
        }
    }
}

/// Make a 1-s clip with GStreamer: 30 frames of 160×120 and 47 blocks of stereo sound.
fn gst_clip(file: &Path, mux: &str, venc: &[&str], aenc: &[&str]) {
    let made = Command::new("gst-launch-1.0")
        .args(["-q", mux, "name=m", "!", "filesink"])
        .arg(format!("location={}", file.display()))
        .args(["videotestsrc", "num-buffers=30", "!", "video/x-raw,width=160,height=120,framerate=30/1", "!"])
        .args(venc)
        .args(["!", "m."])
        .args(["audiotestsrc", "num-buffers=47", "!", "audio/x-raw,rate=48000,channels=2", "!", "audioconvert", "!"])
        .args(aenc)
        .args(["!", "m."])
        .output()
        .expect("gst-launch-1.0 (scripts/setup.sh installs gstreamer1.0-tools)");
    assert!(made.status.success(), "{}: {}", file.display(), String::from_utf8_lossy(&made.stderr));
}

/// The lengths of the runs of non-zero samples in a mono WAV file.
fn click_runs(wav: &Path) -> Vec<usize> {
    // The server finishes the sink's file when the stream closes, after the player is gone.
    let open = || std::fs::File::open(wav).ok().and_then(|f| ictus_tactus::media::wav::WavReader::new(f).ok());
    wait_until("the sink's WAV file finished", || open().is_some_and(|r| r.frames() > 0));
    let mut r = open().unwrap();
    let (mut bytes, mut block) = (Vec::new(), Vec::new());
    while r.read_s16(4096, &mut block).unwrap() > 0 {
        bytes.extend_from_slice(&block);
    }
    let mut runs = Vec::new();
    let mut n = 0;
    for c in bytes.chunks_exact(2) {
        if i16::from_le_bytes([c[0], c[1]]) != 0 {
            n += 1;
        } else if n > 0 {
            runs.push(n);
            n = 0;
        }
    }
    runs
}

/// The keys, typed into a terminal (a pseudo-terminal the test holds): ↑ doubles the
/// rate, space pauses (the position stands still), ←/→ seek, q quits early.
#[test]
fn keys_in_a_terminal_pause_seek_rate_and_quit() {
    use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    let dir = TempDir::new("play-keys");
    let clip = dir.join("clip");
    let out =
        ictus().args(["tactus", "make-clip"]).arg(&clip).args(["--seconds", "30", "--size", "64x48"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = servers(&dir);
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("a pseudo-terminal");
    grantpt(&master).unwrap();
    unlockpt(&master).unwrap();
    let slave_path = ptsname(&master, Vec::new()).unwrap();
    let slave = std::fs::OpenOptions::new().read(true).write(true).open(slave_path.to_str().unwrap()).unwrap();
    let mut c = ictus();
    c.arg("play").arg(&clip).arg("--name-server").arg(&s.socket);
    c.stdin(Stdio::from(slave)).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = Proc::from_child("ictus play", c.spawn().expect("ictus play"));
    // The status lines, as they come.
    let text = Arc::new(Mutex::new(String::new()));
    let mut err = child.child().stderr.take().unwrap();
    let sink = Arc::clone(&text);
    let reader = std::thread::spawn(move || {
        let mut b = [0u8; 4096];
        while let Ok(n) = err.read(&mut b) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().push_str(&String::from_utf8_lossy(&b[..n]));
        }
    });
    // The last few status lines: (position, rate text).
    let lines = || -> Vec<(f64, String)> {
        let t = text.lock().unwrap().clone();
        t.split('\r')
            .filter_map(|l| {
                let (pos, rest) = l.trim_start().split_once(" / ")?;
                let rate = rest.split_whitespace().nth(2)?.to_owned();
                Some((pos.trim().parse().ok()?, rate))
            })
            .collect()
    };
    let mut term = std::fs::File::from(master);
    let mut key = |k: &[u8]| term.write_all(k).expect("type into the terminal");
    wait_until("playing at ×1", || lines().iter().any(|l| l.1 == "×1"));
    key(b"\x1b[A");
    wait_until("the rate doubled by ↑", || lines().last().is_some_and(|l| l.1 == "×2"));
    key(b"\x1b[B");
    wait_until("the rate halved by ↓", || lines().last().is_some_and(|l| l.1 == "×1"));
    key(b" ");
    // Paused: three status lines in a row at one position (playing, each moves on).
    wait_until("space pauses", || {
        let l = lines();
        l.len() >= 3 && l[l.len() - 3..].iter().all(|x| x.0 == l[l.len() - 1].0)
    });
    // Seeks while paused: only the keys move the position now.
    let at = lines().last().unwrap().0;
    assert!(at < 20.0, "paused at {at} s of 30");
    key(b"\x1b[C");
    wait_until("→ seeks 5 s ahead", || lines().last().is_some_and(|l| (l.0 - (at + 5.0)).abs() < 0.5));
    key(b"\x1b[D");
    wait_until("← seeks 5 s back", || lines().last().is_some_and(|l| (l.0 - at).abs() < 0.5));
    key(b" ");
    wait_until("space resumes", || lines().last().is_some_and(|l| l.0 > at + 0.5));
    key(b"q");
    let status = child.wait();
    reader.join().unwrap();
    assert!(status.success(), "{}", text.lock().unwrap());
    // Quit long before the clip's 30 s.
    let last = lines().last().unwrap().0;
    assert!(last < 29.0, "q quits early, at {last} s");
}

/// The whole chain without privileges, each part its own process run as `nobody` (when
/// the test runs as root): the name server, the display server, `ictus tactus serve`
/// (asking for real time, refused, saying once what that costs) and `ictus play`; the
/// lookups that wait for the servers are made as nobody too (`ictus names`), as a
/// user's shell would.
#[test]
fn the_whole_chain_runs_as_nobody_in_separate_processes() {
    use std::os::unix::process::CommandExt;
    let root = rustix::process::geteuid().is_root();
    let nobody = 65534;
    let as_user = |c: &mut Command| {
        if root {
            // std drops the supplementary groups too when it sets the uid as root.
            c.uid(nobody).gid(nobody);
        }
    };
    let ictus_as = || {
        let mut c = ictus();
        as_user(&mut c);
        c
    };
    let top = TempDir::shared("play-nobody");
    // A directory nobody owns: its sockets, the clip, the sink's WAV file.
    let dir = top.join("run");
    std::fs::create_dir(&dir).unwrap();
    if root {
        std::os::unix::fs::chown(&dir, Some(nobody), Some(nobody)).unwrap();
    }
    let clip = dir.join("clip");
    let out = ictus_as()
        .args(["tactus", "make-clip"])
        .arg(&clip)
        .args(["--seconds", "2", "--size", "64x48"])
        .output()
        .unwrap();
    assert!(out.status.success(), "make-clip as nobody: {}", String::from_utf8_lossy(&out.stderr));

    let socket = dir.join("ns.sock");
    let names = || -> Option<String> {
        let out = ictus_as().arg("names").arg("--socket").arg(&socket).stderr(Stdio::null()).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let mut c = ictus_as();
    c.arg("name-server").arg("--socket").arg(&socket);
    let mut ns = Proc::spawn_logged("ictus name-server", &mut c, &top.join("ns.log"));
    wait_until("nobody's name server answers nobody", || {
        assert!(ns.try_wait().is_none(), "the name server exited: {}", ns.log());
        names().is_some()
    });
    let mut c = ictus_as();
    c.args(["display", "serve", "--headless", "--width", "320", "--height", "240", "--name-server"])
        .arg(&socket)
        .arg("--socket")
        .arg(dir.join("display.sock"));
    let mut display = Proc::spawn_logged("ictus display serve", &mut c, &top.join("display.log"));
    let mut c = ictus_as();
    c.args(["tactus", "serve", "--name-server"]).arg(&socket);
    let mut tactus = Proc::spawn_logged("ictus tactus serve", &mut c, &top.join("tactus.log"));
    wait_until("display and tactus registered, as nobody sees them", || {
        assert!(display.try_wait().is_none(), "the display server exited: {}", display.log());
        assert!(tactus.try_wait().is_none(), "the Tactus server exited: {}", tactus.log());
        names().is_some_and(|n| n.lines().any(|l| l == "display") && n.lines().any(|l| l == "tactus"))
    });
    // Each server really is nobody's process, not root's.
    if root {
        for p in [&ns, &display, &tactus] {
            let status = std::fs::read_to_string(format!("/proc/{}/status", p.pid())).unwrap();
            let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
            assert_eq!(uid.split_whitespace().skip(1).collect::<Vec<_>>(), ["65534"; 4], "{uid}");
        }
    }

    let wav = dir.join("out.wav");
    let mut c = ictus_as();
    c.arg("play")
        .arg(&clip)
        .arg("--quiet")
        .arg("--name-server")
        .arg(&socket)
        .args(["--seconds", "1.5", "--audio"])
        .arg(format!("wav:{}", wav.display()));
    let (out, err) = (top.join("play.out"), top.join("play.err"));
    c.stdin(Stdio::null()).stdout(std::fs::File::create(&out).unwrap()).stderr(std::fs::File::create(&err).unwrap());
    let status = Proc::from_child("ictus play", c.spawn().expect("ictus play as nobody")).wait();
    let (stdout, stderr) = (std::fs::read_to_string(&out).unwrap(), std::fs::read_to_string(&err).unwrap());
    assert!(status.success(), "ictus play as nobody: {stderr}");
    assert!(stdout.contains("sent video 1"), "{stdout}");
    // Nobody's Tactus server wrote nobody's sink file, sound in it.
    let r = || std::fs::File::open(&wav).ok().and_then(|f| ictus_tactus::media::wav::WavReader::new(f).ok());
    wait_until("the sink's WAV file finished", || r().is_some_and(|r| r.frames() > 0));
    if root {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&wav).unwrap().uid(), nobody);
        // Without real-time privileges it ran anyway and said so, once.
        let log = tactus.log();
        assert_eq!(log.matches("instead of real-time").count(), 1, "{log}");
    }
}
