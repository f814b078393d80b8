//! The display server registers with the name server, clients find it there, and its
//! registration comes back by itself after the name server restarts.

mod common;

use common::*;
use ictus_display::{ConnectOptions, Display, Rect, Transport};
use ictus_testkit::NameServer;

fn draw_through_the_name_server(ns: &NameServer, t: Transport) {
    let mut o = ConnectOptions::new(t);
    o.name_server = Some(ns.socket());
    o.timeout = WATCHDOG;
    let mut d = Display::connect(&o).expect("connect through the name server");
    let w = d.create_window(None, Rect::new(0, 0, 8, 8), 0).expect("window");
    d.xor_rect(w, Rect::new(0, 0, 8, 8), 0xffffff).expect("draw");
    assert!(d.sync().expect("sync").requests >= 2);
}

#[test]
fn clients_find_the_server_by_name_before_and_after_a_name_server_restart() {
    let ns = NameServer::start();
    let server = headless("names");
    let names = server.register(ictus_display::SERVICE_NAME, Some(&ns.socket())).expect("register");
    assert!(ns.has(ictus_display::SERVICE_NAME));
    for t in Transport::ALL {
        draw_through_the_name_server(&ns, t);
    }
    ns.stop();
    ns.restart();
    ns.wait_for(ictus_display::SERVICE_NAME);
    for t in Transport::ALL {
        draw_through_the_name_server(&ns, t);
    }
    names.stop();
    assert!(!ns.has(ictus_display::SERVICE_NAME), "unregistered when the registrar stops");
}
