//! The toolkit's example: a ball that bounces on every beat (video, to the display
//! server) and a melody with a note on every beat (MIDI, to a device), written as two
//! active objects. The toolkit runs them ahead of time by a lead it adapts to what
//! Tactus reports; Tactus presents both on time, so the ball hits the floor with the
//! note.
//!
//! ```sh
//! ictus name-server & ictus display serve & ictus tactus serve &
//! ictus midi monitor --device cable:demo &           # to see the notes arrive
//! cargo run -p ictus-tactus --example midi_animation -- cable:demo 10
//! ```

use std::time::Duration;

use ictus_tactus::toolkit::demo::{Ball, Melody};
use ictus_tactus::toolkit::{Lead, Runner, Scheduler};
use ictus_tactus::{ConnectOptions, LatePolicy, StreamSpec, Tactus};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let midi = args.next().unwrap_or_else(|| "cable:demo".into());
    let seconds: f64 = args.next().map_or(Ok(10.0), |s| s.parse())?;
    let video = std::env::var("TACTUS_VIDEO_DEVICE").unwrap_or_else(|_| "display".into());
    let mut t = Tactus::connect(&ConnectOptions::default())?;
    let p = t.open_presentation()?;
    let (w, h) = (320u16, 240u16);
    let v = t.open_stream(
        p,
        &StreamSpec::video(w, h).device(&video).policy(LatePolicy::DropAfter(Duration::from_millis(20))),
    )?;
    let m = t.open_stream(p, &StreamSpec::midi(&midi))?;
    let beat = Duration::from_millis(500);
    let mut s = Scheduler::new();
    s.add(Ball { stream: v, w, h, frame: Duration::from_millis(40), beat }, 0);
    s.add(Melody { stream: m, beat, played: 0 }, 0);
    let lead = Lead::new(Duration::from_millis(100), Duration::from_millis(30), Duration::from_secs(2));
    let mut runner = Runner::new(p, lead);
    let stats = runner.run(&mut t, &mut s, 0, (seconds * 1e9) as i64)?;
    println!(
        "sent {} items from {} runs; lead now {:?} (at most {:?}); trouble reported: {}",
        stats.sent, stats.runs, stats.lead, stats.max_lead, stats.trouble
    );
    Ok(())
}
