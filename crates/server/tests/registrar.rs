//! The registrar on threads of one process: names registered at start, registered
//! again after the name server is replaced, unregistered at stop; a start without a
//! name server is a clear error. Waits are for events, bounded by the watchdog.

use ictus_ipc::Space;
use ictus_server::{RegisterError, Registrar};
use ictus_testkit::{wait_until, NameServer, TempDir};

#[test]
fn names_come_back_when_the_name_server_is_replaced() {
    let ns = NameServer::start();
    let space = Space::new();
    let (a, b) = (space.allocate_port().unwrap(), space.allocate_port().unwrap());
    let registrar = Registrar::start("test-server", Some(&ns.socket()), &space, &[("a", a), ("b", b)]).unwrap();
    assert!(ns.has("a") && ns.has("b"));
    // The name server goes away, and another takes its socket.
    ns.stop();
    let again = ictus_name_server::server::spawn(Space::new(), Some(&ns.socket())).unwrap();
    let client_space = Space::new();
    let client = ictus_name_server::Client::connect_socket(&client_space, &ns.socket()).unwrap();
    wait_until("both names to be registered again", || client.list().is_ok_and(|l| l == ["a", "b"]));
    // The rights registered are the server's own ports.
    let right = client.lookup("a").unwrap();
    client_space.send(right, &mut ictus_ipc::Message::new(7, b"x".to_vec()), Default::default()).unwrap();
    let mut r = ictus_ipc::Received::new();
    let opts = ictus_ipc::ReceiveOptions { timeout: Some(ictus_testkit::WATCHDOG), ..Default::default() };
    space.receive(a, &mut r, opts).unwrap();
    assert_eq!(r.id, 7);
    // Stopping says goodbye.
    registrar.stop();
    assert_eq!(client.list().unwrap(), Vec::<String>::new());
    again.stop().unwrap();
}

#[test]
fn without_a_name_server_the_start_is_a_clear_error() {
    let dir = TempDir::new("registrar");
    let space = Space::new();
    let port = space.allocate_port().unwrap();
    let err = Registrar::start("test-server", Some(&dir.join("nobody.sock")), &space, &[("x", port)]).unwrap_err();
    assert!(matches!(err, RegisterError::Connect { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("\"x\"") && text.contains("start `ictus name-server` first"), "{text}");
}
