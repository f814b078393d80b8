//! A whole server on the skeleton, as `doc/interfaces.md` shows it: it watches ports
//! its clients send and forgets each when it dies. `cargo run -p ictus-server --example
//! watch_server` serves until Ctrl-C (a name server must be running).

use ictus_idl::{interface, Context, Dispatched, SendRight, Status};
use ictus_ipc::{Name, Received, Space};
use ictus_server::{serve_until_signalled, DeadNameWatches, Loop, Registrar, Serve, ServeError, ServicePorts};
use std::sync::{Arc, Mutex};

#[interface(id = 7100)]
pub trait Watcher {
    #[id(0)]
    fn watch(&self, cx: &Context, port: SendRight) -> Result<u32, Status>;
}

/// The methods, on state shared with the loop (the lock is only for sharing: both run
/// on the server's one thread).
struct Methods(Arc<Mutex<DeadNameWatches>>, Name);
impl Watcher for Methods {
    fn watch(&self, cx: &Context, port: SendRight) -> Result<u32, Status> {
        let mut w = self.0.lock().unwrap();
        w.watch(cx.space, port.name, self.1).map_err(|_| Status(1))?;
        Ok(w.len() as u32)
    }
}

/// The server: the generated dispatcher and what it keeps.
struct WatchServer {
    space: Space,
    watches: Arc<Mutex<DeadNameWatches>>,
    requests: ictus_idl::Server,
}
impl Serve for WatchServer {
    const NAME: &'static str = "watch-server";
    fn request(&mut self, msg: &mut Received) -> Dispatched {
        self.requests.handle(msg)
    }
    fn dead_name(&mut self, name: Name) {
        if self.watches.lock().unwrap().forget(&self.space, name) {
            let _ = self.space.destroy(name);
        }
    }
}

fn main() -> Result<(), ServeError> {
    let space = Space::task();
    let ports = ServicePorts::<1>::allocate(&space)?;
    let watches = Arc::default();
    let requests = ictus_idl::Server::new(&space, ports.set())
        .with(WatcherServer(Methods(Arc::clone(&watches), ports.notify())))
        // One thread: a client that stops reading loses its reply, not our time.
        .with_reply_timeout(std::time::Duration::ZERO);
    let service = ports.service(0);
    let mut server = Loop::new(&space, ports, WatchServer { space: space.clone(), watches, requests });
    let names = Registrar::start("watch-server", None, &space, &[("watcher", service)])?;
    let result = serve_until_signalled(|stop| server.run(None, stop));
    names.stop(); // unregister before the ports go
    result
}
