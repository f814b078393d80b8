//! Connecting to a service port that cannot answer: a port whose server is gone is
//! [`ConnectError::ServerDied`], one that never answers is [`ConnectError::TimedOut`]
//! (the classification every client shares, `ictus_idl::CallFailure`).

use std::time::Duration;

use ictus_ipc::{RightKind, Space};
use ictus_tactus::{ConnectError, ConnectOptions, Tactus};

#[test]
fn a_dead_service_port_is_a_server_that_died() {
    let space = Space::new();
    let port = space.allocate_port_with_send().unwrap();
    // The receive right goes: what is left is a send right to a dead port.
    space.mod_refs(port, RightKind::Receive, -1).unwrap();
    let opts = ConnectOptions { timeout: Duration::from_secs(5), ..ConnectOptions::default() };
    let Err(e) = Tactus::connect_to(&space, port, &opts) else { panic!("connected with no server") };
    assert!(matches!(e, ConnectError::ServerDied), "{e:?}");
}

#[test]
fn a_port_nobody_serves_is_a_server_that_did_not_answer() {
    let space = Space::new();
    // The request waits in a queue nobody reads.
    let port = space.allocate_port_with_send().unwrap();
    let opts = ConnectOptions { timeout: Duration::from_millis(200), ..ConnectOptions::default() };
    let Err(e) = Tactus::connect_to(&space, port, &opts) else { panic!("connected with no server") };
    assert!(matches!(e, ConnectError::TimedOut(t) if t == opts.timeout), "{e:?}");
}
