//! The test kit's servers: started, registered, reachable, stopped; and the clock and
//! MIDI servers registered again by themselves when their name server is replaced.

use ictus_ipc::Space;
use ictus_testkit::{ClockServer, MidiServer, NameServer};

#[test]
fn servers_start_register_and_come_back_after_a_new_name_server() {
    let ns = NameServer::start();
    let clock = ClockServer::start(&ns);
    let midi = MidiServer::start(&ns);
    assert!(ns.has("clock") && ns.has(midi.name()));
    // The clock answers through the name server.
    let space = Space::new();
    let c = ictus_clock_server::Client::connect_socket(&space, &ns.socket()).unwrap();
    c.read().unwrap();
    // A new name server on the same socket: both names come back without help.
    ns.stop();
    ns.restart();
    ns.wait_for("clock");
    ns.wait_for(midi.name());
    // The old clock client still works (the clock server never went away).
    c.read().unwrap();
    let input = ictus_midi_server::Input::connect_named(&space, Some(&ns.socket()), midi.name(), true, false).unwrap();
    assert!(input.device().unwrap().contains(midi.cable()));
    drop(input);
    // Stopping unregisters.
    clock.stop();
    midi.stop();
    assert!(!ns.has("clock"));
    assert_eq!(ns.client(&Space::new()).list().unwrap(), Vec::<String>::new());
}
