//! Standard MIDI Files that are not what their header says (issue 23, item 5): every
//! prefix of the demo file, of real-looking multi-track files made here, and of real
//! files from Debian's `openttd-openmsx` (GPL-2 music for OpenTTD, read where the package
//! installed them, never copied into this repository) is refused with an error naming a
//! byte offset, or, leniently, plays the events before the cut and says what is wrong.
//! Every kind of inconsistency is made once by hand and recognised.

use std::path::{Path, PathBuf};

use ictus_midi::smf::{demo_bytes, ProblemKind, Score, SmfError, Strictness};

/// Where `openttd-openmsx` puts its MIDI files (`scripts/setup.sh` installs it).
const OPENMSX: &str = "/usr/share/games/openttd/baseset/openmsx";

/// The `(tick, bytes)` of each track's events, track by track.
fn per_track(score: &Score) -> Vec<Vec<(u64, &[u8])>> {
    let mut tracks = vec![Vec::new(); score.tracks];
    for e in &score.events {
        tracks[e.track].push((e.tick, e.message.bytes()));
    }
    tracks
}

/// The byte offset an error names ("byte N"), checking that it says it once, on one line.
fn offset_named(e: &SmfError) -> u64 {
    let text = e.to_string();
    assert!(!text.contains('\n'), "more than one line: {text}");
    assert!(!text.to_lowercase().contains("invalid midi"), "says a thing twice: {text}");
    let i = text.find("byte ").unwrap_or_else(|| panic!("no byte offset in {text:?}"));
    text[i + 5..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// Every proper prefix of `file` (a valid file whose last chunk is a track): refused
/// strictly, naming an offset within the prefix; leniently, no panic, and what plays is,
/// track by track, a prefix of what the whole file plays.
fn every_prefix(name: &str, file: &[u8]) {
    prefixes(name, file, 0..file.len());
}

/// [`every_prefix`] for the prefixes of the lengths `cuts`.
fn prefixes(name: &str, file: &[u8], cuts: impl IntoIterator<Item = usize>) {
    let whole = Score::parse(file).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(whole.problems.is_empty());
    let full = per_track(&whole);
    for n in cuts {
        let cut = &file[..n];
        let e = match Score::parse(cut) {
            Ok(_) => panic!("{name}: the {n}-byte prefix was accepted"),
            Err(e) => e,
        };
        if n == 0 {
            assert!(e.to_string().contains("empty"), "{e}");
            continue;
        }
        let at = offset_named(&e);
        assert!(at <= n as u64, "{name}: prefix of {n} bytes, error at byte {at}: {e}");
        match Score::parse_with(cut, Strictness::Lenient) {
            Ok(score) => {
                assert!(!score.problems.is_empty(), "{name}: {n} bytes played leniently without a warning");
                assert!(score.problems.iter().all(|p| p.offset <= n as u64), "{name}: {:?}", score.problems);
                assert!(e.lenient_would_play(), "{name}: {n} bytes: {e}");
                for (t, events) in per_track(&score).iter().enumerate() {
                    assert!(full[t].starts_with(events), "{name}: {n} bytes: track {t} is not a prefix");
                }
            }
            Err(le) => assert!(!e.lenient_would_play(), "{name}: {n} bytes: {e}, leniently {le}"),
        }
    }
}

#[test]
fn every_prefix_of_the_demo_file_is_refused_or_played_leniently() {
    every_prefix("demo", &demo_bytes());
}

/// A format 1 file as sequencers write them: a tempo track, then one track per channel
/// with controllers, program, notes with running status, pitch bends, a sysex and
/// meta events.
fn sequencer_file(tracks: u8, notes: u32, timing: midly::Timing) -> Vec<u8> {
    use midly::num::{u14, u24, u28, u4, u7};
    use midly::{Format, Header, MetaMessage, MidiMessage, PitchBend, Smf, TrackEvent, TrackEventKind};
    let ev = |delta: u32, kind: TrackEventKind<'static>| TrackEvent { delta: u28::new(delta), kind };
    let mut smf = Smf::new(Header::new(Format::Parallel, timing));
    smf.tracks.push(vec![
        ev(0, TrackEventKind::Meta(MetaMessage::TrackName(b"tempo"))),
        ev(0, TrackEventKind::Meta(MetaMessage::Tempo(u24::new(600_000)))),
        ev(0, TrackEventKind::Meta(MetaMessage::TimeSignature(4, 2, 24, 8))),
        ev(960, TrackEventKind::Meta(MetaMessage::Tempo(u24::new(450_000)))),
        ev(0, TrackEventKind::Meta(MetaMessage::EndOfTrack)),
    ]);
    for ch in 0..tracks {
        let midi = |delta: u32, message: MidiMessage| ev(delta, TrackEventKind::Midi { channel: u4::new(ch), message });
        let mut t = vec![
            ev(0, TrackEventKind::Meta(MetaMessage::TrackName(b"part"))),
            midi(0, MidiMessage::Controller { controller: u7::new(7), value: u7::new(100) }),
            midi(0, MidiMessage::ProgramChange { program: u7::new(ch) }),
        ];
        if ch == 0 {
            t.push(ev(0, TrackEventKind::SysEx(&[0x41, 0x10, 0x42, 0x12, 0x40, 0x00, 0x7F, 0x00, 0x41, 0xF7])));
        }
        for i in 0..notes {
            let key = u7::new((40 + ch as u32 * 5 + i * 7 % 24) as u8);
            t.push(midi(if i == 0 { 0 } else { 60 }, MidiMessage::NoteOn { key, vel: u7::new(70 + (i % 50) as u8) }));
            if i % 4 == 0 {
                t.push(midi(10, MidiMessage::PitchBend { bend: PitchBend(u14::new(0x2000 + i as u16 * 17 % 0x1000)) }));
            }
            t.push(midi(50, MidiMessage::NoteOn { key, vel: u7::new(0) }));
        }
        t.push(ev(0, TrackEventKind::Meta(MetaMessage::EndOfTrack)));
        smf.tracks.push(t);
    }
    let mut out = Vec::new();
    smf.write_std(&mut out).unwrap();
    out
}

#[test]
fn every_prefix_of_real_looking_multi_track_files() {
    use midly::num::u15;
    use midly::{Fps, Timing};
    every_prefix("4 tracks, 480 tpq", &sequencer_file(4, 40, Timing::Metrical(u15::new(480))));
    every_prefix("9 tracks, 96 tpq", &sequencer_file(9, 12, Timing::Metrical(u15::new(96))));
    every_prefix("2 tracks, 25 fps", &sequencer_file(2, 30, Timing::Timecode(Fps::Fps25, 40)));
}

/// The smallest file of Debian's openttd-openmsx, every prefix; the next two, every
/// prefix within 40 bytes of a chunk's start or end (its header, its length, the first
/// events, the End of Track) and every 11th elsewhere; every file whole. (Every prefix of
/// all three takes a minute in a debug build on a loaded machine.)
#[test]
fn every_prefix_of_real_files_from_debian() {
    let dir = Path::new(OPENMSX);
    let Ok(entries) = std::fs::read_dir(dir) else {
        eprintln!("skipped: {OPENMSX} is missing (scripts/setup.sh installs openttd-openmsx)");
        return;
    };
    let mut files: Vec<(u64, PathBuf)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "mid"))
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.len(), p)))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{OPENMSX} has {} MIDI files", files.len());
    for (i, (_, path)) in files.iter().enumerate() {
        let bytes = std::fs::read(path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy();
        if i == 0 {
            every_prefix(&name, &bytes);
        } else if i < 3 {
            let bounds: Vec<usize> = chunks(&bytes).iter().flat_map(|&(at, len)| [at, at + 8 + len]).collect();
            let near = |n: usize| bounds.iter().any(|&b| n.abs_diff(b) <= 40);
            prefixes(&name, &bytes, (0..bytes.len()).filter(|&n| near(n) || n % 11 == 0));
        } else {
            let s = Score::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(s.tracks > 1 && !s.events.is_empty(), "{name}");
        }
    }
}

/// The demo's chunks: `(offset of the chunk, its data length)`, header first.
fn chunks(file: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos + 8 <= file.len() {
        let len = u32::from_be_bytes(file[pos + 4..pos + 8].try_into().unwrap()) as usize;
        out.push((pos, len));
        pos += 8 + len;
    }
    out
}

/// A file that is not what its header says: its name, its bytes, what is wrong, where.
struct Damaged {
    name: &'static str,
    bytes: Vec<u8>,
    is: fn(&ProblemKind) -> bool,
    at: usize,
}

/// The demo file, damaged in every way a file can be, one way each.
fn damaged_demos() -> Vec<Damaged> {
    let demo = demo_bytes();
    let c = chunks(&demo);
    let (t1_at, t1_len) = c[2];
    let t1_end = t1_at + 8 + t1_len;
    let with_len = |mut f: Vec<u8>, len: usize| {
        f[t1_at + 4..t1_at + 8].copy_from_slice(&(len as u32).to_be_bytes());
        f
    };
    let edit = |f: fn(&mut Vec<u8>)| {
        let mut d = demo.clone();
        f(&mut d);
        d
    };
    let first_status = t1_at + 8 + 1;
    assert_eq!(demo[first_status], 0xF0, "the demo's track 1 starts with its sysex");
    let mut after_eot = demo.clone();
    after_eot.extend_from_slice(&[0, 0x90, 60, 100]);
    let mut bad_event = demo.clone();
    bad_event[first_status] = 0x05;
    vec![
        Damaged {
            name: "extra-track",
            bytes: edit(|f| f[11] = 1),
            is: |k| matches!(k, ProblemKind::ExtraTracks { declared: 1, found: 2 }),
            at: t1_at,
        },
        Damaged {
            name: "format0-two-tracks",
            bytes: edit(|f| f[9] = 0),
            is: |k| matches!(k, ProblemKind::Format0Tracks { declared: 2 }),
            at: 10,
        },
        Damaged {
            name: "second-header",
            bytes: [&demo[..], &demo[..14]].concat(),
            is: |k| matches!(k, ProblemKind::SecondHeader),
            at: demo.len(),
        },
        Damaged {
            name: "trailing-bytes",
            bytes: [&demo[..], &[0, 0, 0]].concat(),
            is: |k| matches!(k, ProblemKind::TrailingBytes { len: 3 }),
            at: demo.len(),
        },
        // Track 1's last event (00 FF 2F 00) gone, its length fixed.
        Damaged {
            name: "no-end-of-track",
            bytes: with_len(demo[..t1_end - 4].to_vec(), t1_len - 4),
            is: |k| matches!(k, ProblemKind::NoEndOfTrack { track: 1 }),
            at: t1_end - 4,
        },
        // A delta time with no event after it.
        Damaged {
            name: "cut-inside-an-event",
            bytes: with_len(demo[..t1_end - 3].to_vec(), t1_len - 3),
            is: |k| matches!(k, ProblemKind::BadEvent { track: 1 }),
            at: t1_end - 4,
        },
        Damaged {
            name: "after-end-of-track",
            bytes: with_len(after_eot, t1_len + 4),
            is: |k| matches!(k, ProblemKind::AfterEndOfTrack { track: 1 }),
            at: t1_end,
        },
        // A data byte where track 1's first event needs a status.
        Damaged {
            name: "bad-event",
            bytes: bad_event,
            is: |k| matches!(k, ProblemKind::BadEvent { track: 1 }),
            at: first_status - 1,
        },
        Damaged {
            name: "chunk-longer-than-file",
            bytes: with_len(demo.clone(), t1_len + 100),
            is: |k| matches!(k, ProblemKind::ChunkCut { track: Some(1), .. }),
            at: demo.len(),
        },
        Damaged {
            name: "missing-track",
            bytes: demo[..t1_at].to_vec(),
            is: |k| matches!(k, ProblemKind::MissingTracks { declared: 2, found: 1 }),
            at: t1_at,
        },
        // The example: the header alone, which promises two tracks.
        Damaged {
            name: "header-only",
            bytes: demo[..14].to_vec(),
            is: |k| matches!(k, ProblemKind::MissingTracks { declared: 2, found: 0 }),
            at: 14,
        },
        Damaged {
            name: "cut-in-a-chunk-header",
            bytes: demo[..t1_at + 5].to_vec(),
            is: |k| matches!(k, ProblemKind::ChunkHeaderCut { .. }),
            at: t1_at + 5,
        },
    ]
}

#[test]
fn every_kind_of_inconsistency_is_named_with_its_offset() {
    for d in damaged_demos() {
        let p = match Score::parse(&d.bytes) {
            Err(SmfError::Damaged(p)) => p,
            other => panic!("{}: expected a damaged-file error, got {other:?}", d.name),
        };
        assert!((d.is)(&p.kind), "{}: {p:?}", d.name);
        assert_eq!(p.offset, d.at as u64, "{}: {p}", d.name);
        assert_eq!(offset_named(&SmfError::Damaged(p.clone())), d.at as u64);
        let lenient = Score::parse_with(&d.bytes, Strictness::Lenient).expect("leniently it plays");
        assert!(lenient.problems.contains(&p), "{}: {:?}", d.name, lenient.problems);
        if matches!(p.kind, ProblemKind::ChunkCut { .. } | ProblemKind::MissingTracks { .. }) {
            assert!(p.to_string().starts_with("cut short at byte"), "{p}");
        }
    }
}

/// Writes the damaged files and real-looking files into the `midi_smf` fuzz target's
/// seed corpus: `cargo test -p ictus-midi --test smf_damaged -- --ignored write_smf_seed_corpus`.
#[test]
#[ignore = "writes the fuzz seed corpus"]
fn write_smf_seed_corpus() {
    use midly::num::u15;
    use midly::{Fps, Timing};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/midi_smf");
    for d in damaged_demos() {
        std::fs::write(dir.join(format!("seed-damaged-{}.mid", d.name)), &d.bytes).unwrap();
    }
    let seq = sequencer_file(9, 12, Timing::Metrical(u15::new(96)));
    std::fs::write(dir.join("seed-sequencer-9-tracks.mid"), &seq).unwrap();
    std::fs::write(dir.join("seed-sequencer-9-tracks-cut.mid"), &seq[..seq.len() * 2 / 3]).unwrap();
    std::fs::write(dir.join("seed-sequencer-smpte-25.mid"), sequencer_file(2, 8, Timing::Timecode(Fps::Fps25, 40)))
        .unwrap();
}

#[test]
fn what_no_reading_can_play_is_refused_leniently_too() {
    let demo = demo_bytes();
    for (bytes, says) in [
        (&b""[..], "empty"),
        (&b"MTh"[..], "cut short at byte 3"),
        (&demo[..13], "cut short at byte 13"),
        (&b"RIFF...."[..], "RIFF"),
        (&b"hello world, not a file"[..], "does not start with MThd"),
    ] {
        for strictness in [Strictness::Strict, Strictness::Lenient] {
            let e = Score::parse_with(bytes, strictness).unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
            assert!(!e.lenient_would_play());
        }
    }
    // A header chunk shorter than 6 bytes, a division of zero, a bad SMPTE rate.
    let mut f = demo.clone();
    f[7] = 5;
    assert!(Score::parse_with(&f, Strictness::Lenient).unwrap_err().to_string().contains("at byte 4"));
    let mut f = demo.clone();
    f[12] = 0;
    f[13] = 0;
    assert!(matches!(Score::parse_with(&f, Strictness::Lenient), Err(SmfError::Timing(_))));
    let mut f = demo.clone();
    f[12] = 0xE0; // -32 frames a second
    assert!(Score::parse_with(&f, Strictness::Lenient).unwrap_err().to_string().contains("32 SMPTE frames"));
}

#[test]
fn a_file_error_names_the_file_once() {
    let dir = std::env::temp_dir().join(format!("ictus-smf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("cut.mid");
    std::fs::write(&f, &demo_bytes()[..100]).unwrap();
    let e = Score::load(&f).unwrap_err();
    let text = e.to_string();
    assert_eq!(text.matches("cut.mid").count(), 1, "{text}");
    assert!(text.contains("cut short at byte 100"), "{text}");
    assert!(e.lenient_would_play());
    let s = Score::load_with(&f, Strictness::Lenient).unwrap();
    assert!(!s.events.is_empty() && !s.problems.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}
