//! `ictus tactus serve` and `ictus play` as processes: a clip made by
//! `ictus tactus make-clip` played through a headless display server, a WebM made by
//! GStreamer, and bad files (truncated, garbage, missing) each ending with a clear
//! error and never a hang. No test asserts a duration; every process has a watchdog.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ictus_ipc::Space;
use ictus_testkit::{ictus_name_server, lookup_when_registered, Proc, TempDir, WATCHDOG};

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
    let out = play(&s, &clip, &["--start", "1", "--seconds", "0.8", "--rate", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("sent video 8 "), "{text}");
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

    // A compressed clip (VP8 and Vorbis in WebM, made by GStreamer), whole and cut short.
    let webm = dir.join("clip.webm");
    let made = Command::new("gst-launch-1.0")
        .args(["-q", "webmmux", "name=m", "!", "filesink"])
        .arg(format!("location={}", webm.display()))
        .args([
            "videotestsrc",
            "num-buffers=30",
            "!",
            "video/x-raw,width=160,height=120,framerate=30/1",
            "!",
            "vp8enc",
            "deadline=1",
            "!",
            "m.",
        ])
        .args(["audiotestsrc", "num-buffers=47", "!", "audio/x-raw,rate=48000,channels=2", "!", "vorbisenc", "!", "m."])
        .output()
        .expect("gst-launch-1.0 (scripts/setup.sh installs gstreamer1.0-tools)");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let out = play(&s, &webm, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("sent video 30"), "{}", String::from_utf8_lossy(&out.stdout));
    let bytes = std::fs::read(&webm).unwrap();
    let cutm = dir.join("cut.webm");
    std::fs::write(&cutm, &bytes[..bytes.len() / 3]).unwrap();
    // Cut short: it plays what it can or says what is wrong; it never hangs.
    let _ = play(&s, &cutm, &[]);
}
