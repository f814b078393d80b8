//! The skeleton on its own: a small server written on `Serve` and `Loop`, as a new
//! server would be, run on a thread with `Running`. Its requests are answered, a right
//! it watches dying reaches `dead_name` (and other messages on the notify port do not), its own
//! descriptor wakes it, and stopping ends the loop and destroys the ports.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ictus_idl::{interface, Context, Dispatched, SendRight, Status};
use ictus_ipc::{CallError, Message, Name, NotifyId, Received, SendError, SendOptions, Space};
use ictus_server::{DeadNameWatches, Loop, Running, Serve, ServeError, ServicePorts, Wait};
use ictus_testkit::{wait_until, WATCHDOG};

#[interface(id = 7100)]
pub trait Watcher {
    /// Watch `port`: the server tells `dead_name` when it dies.
    #[id(0)]
    fn watch(&self, cx: &Context, port: SendRight) -> Result<u32, Status>;
}

#[derive(Default)]
struct Shared {
    watches: Mutex<DeadNameWatches>,
    dead: AtomicUsize,
    woken: AtomicUsize,
}

struct Methods(Arc<Shared>, Name);

impl Watcher for Methods {
    fn watch(&self, cx: &Context, port: SendRight) -> Result<u32, Status> {
        let mut w = self.0.watches.lock().unwrap();
        w.watch(cx.space, port.name, self.1).map_err(|_| Status(1))?;
        Ok(w.len() as u32)
    }
}

struct WatchServer {
    shared: Arc<Shared>,
    space: Space,
    requests: ictus_idl::Server,
    bell: OwnedFd,
}

impl Serve for WatchServer {
    const NAME: &'static str = "watch-server";

    fn request(&mut self, msg: &mut Received) -> Dispatched {
        self.requests.handle(msg)
    }

    fn dead_name(&mut self, name: Name) {
        if self.shared.watches.lock().unwrap().forget(&self.space, name) {
            let _ = self.space.destroy(name);
            self.shared.dead.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn prepare(&mut self) -> Result<Wait, ServeError> {
        Ok(Wait::Until(None))
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.bell.as_fd()]
    }

    fn ready(&mut self, index: usize) -> Result<(), ServeError> {
        assert_eq!(index, 0);
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.bell, &mut b);
        self.shared.woken.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[test]
fn a_server_on_the_skeleton() {
    let space = Space::new();
    let ports = ServicePorts::<1>::allocate(&space).unwrap();
    let shared = Arc::new(Shared::default());
    let requests =
        ictus_idl::Server::new(&space, ports.set()).with(WatcherServer(Methods(Arc::clone(&shared), ports.notify())));
    let bell = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK)
        .unwrap();
    let ring = bell.try_clone().unwrap();
    let service = ports.service(0);
    let notify = ports.notify();
    let mut server =
        Loop::new(&space, ports, WatchServer { shared: Arc::clone(&shared), space: space.clone(), requests, bell });
    let client = Space::new();
    let right = client.insert_send_fd(space.send_right_fd(service).unwrap()).unwrap();
    let forger = client.insert_send_fd(space.send_right_fd(notify).unwrap()).unwrap();
    let running = Running::spawn("watch-server", move |stop| server.run(None, stop)).unwrap();

    // A request is answered.
    let stubs = WatcherClient::new(&client, right).with_timeout(WATCHDOG);
    let doomed = client.allocate_port().unwrap();
    assert_eq!(stubs.watch(SendRight::make(doomed)).unwrap(), 1);
    // A message on the notify port that is not a dead-name notification is dropped,
    // neither a dead name nor a request. (One from another process would be dropped for
    // its sender; every space here is this process.)
    let body = NotifyId::body(Name::new(1, 1), 0).to_vec();
    client.send(forger, &mut Message::new(NotifyId::DeadName.id() + 1, body), SendOptions::default()).unwrap();
    // The watched port dies: dead_name hears of it once.
    client.mod_refs(doomed, ictus_ipc::RightKind::Receive, -1).unwrap();
    wait_until("the dead name to reach the server", || shared.dead.load(Ordering::SeqCst) == 1);
    // The server's own descriptor wakes it.
    rustix::io::write(&ring, &1u64.to_ne_bytes()).unwrap();
    wait_until("the bell to be heard", || shared.woken.load(Ordering::SeqCst) == 1);
    // Stopping ends the loop and destroys the ports: calls fail at once.
    running.stop().unwrap();
    let after = client.allocate_port().unwrap();
    let r = stubs.watch(SendRight::make(after));
    assert!(
        matches!(
            r,
            Err(ictus_idl::ClientError::Call(CallError::ServerDied | CallError::Send(SendError::InvalidDest(_))))
        ),
        "{r:?}"
    );
    assert_eq!(shared.dead.load(Ordering::SeqCst), 1);
}
