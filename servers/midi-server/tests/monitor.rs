//! The timing monitor on a real cable: it counts, stops on its count, and writes its
//! SVG and JSON. (Its binning and layout are unit-tested; nothing here asserts a
//! duration.)

use std::time::Duration;

use ictus_midi::device::cable::CableOut;
use ictus_midi::device::{Device, DeviceSpec};
use ictus_midi::Kind;
use ictus_midi_server::monitor::{self, MonitorOptions, Source};

#[test]
fn the_monitor_stops_on_its_count_and_writes_its_files() {
    let cable = format!("t-monitor-{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("ictus-midi-monitor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let opts = MonitorOptions {
        source: Source::Device(DeviceSpec::parse(&format!("cable:{cable}")).unwrap()),
        count: Some(10),
        duration: Some(Duration::from_secs(60)),
        rows: 20,
        columns: Some(8),
        kinds: vec![Kind::NoteOn],
        svg: Some(dir.join("m.svg")),
        json: Some(dir.join("m.json")),
        live: false,
    };
    let o = opts.clone();
    let h = std::thread::spawn(move || monitor::run(&o));
    let mut out = CableOut::open(&cable, None).unwrap();
    let mut sent = 0;
    // Keep sending until the monitor has its ten intervals and returns; active sensing
    // and note-offs in between are not counted (only note-ons were asked for).
    while !h.is_finished() {
        let _ = out.write(&[0x90, (sent % 128) as u8, 1, 0xFE, 0x80, 1, 0]);
        sent += 1;
        std::thread::sleep(Duration::from_millis(5));
        assert!(sent < 12_000, "watchdog: the monitor never stopped");
    }
    let r = h.join().unwrap().expect("the monitor ran");
    assert_eq!(r.intervals.len(), 10);
    assert_eq!(r.messages, 11);
    let svg = std::fs::read_to_string(dir.join("m.svg")).unwrap();
    assert!(svg.contains("Worst case"));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("m.json")).unwrap()).unwrap();
    assert_eq!(json["intervals_ns"].as_array().unwrap().len(), 10);
    assert_eq!(json["summary"]["count"], 10);
    let _ = std::fs::remove_dir_all(&dir);
}
