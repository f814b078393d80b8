//! The `shm` experiment's transports, each a client here and a server in a child
//! process: ours ([`ShmTransport`], `ictus-shm` channels), iceoryx2's
//! publish-subscribe ping-pong ([`IceoryxTransport`]), and port send/receive pipelined
//! in bursts ([`PortBurst`]).

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::process::Child;
use std::time::{Duration, Instant};

use ictus_bench::child::{fd_arg, num_arg, reap, role_status, spawn_child};
use ictus_bench::{Role, Transport};
use ictus_ipc::{Disposition, Message, Name, PortArg, ReceiveOptions, Received, SendOptions, Space};
use ictus_shm::{Client, ClientOptions, Geometry, Next, Server, ServerConfig, WaitConfig};

use super::{elapsed_ns, other, ACK, ACK_LEN, BURST, ECHO, SERVER_SPIN, SMALL};

// ----- our transport ---------------------------------------------------------------------

/// A channel to an `shm-echo` server in its own process.
#[derive(Debug)]
pub struct ShmTransport {
    name: &'static str,
    /// Taken in `drop`, so the server sees its last channel close before it is reaped.
    client: Option<Client>,
    child: Child,
    space: Space,
    service: Name,
    opts: ClientOptions,
    buf: Vec<u8>,
}

impl ShmTransport {
    /// Spawns a server polling for `server_spin` before it sleeps, and connects with
    /// the client waiting the same way; `slots` pool buffers of `slot_size` bytes.
    pub fn spawn(name: &'static str, spin: Duration, slots: u32, slot_size: u32) -> io::Result<ShmTransport> {
        let space = Space::new();
        let setup = space.allocate_port().map_err(other)?;
        let fd = space.send_right_fd(setup).map_err(other)?;
        let args = [fd.as_raw_fd().to_string(), spin.as_micros().to_string()];
        let child = spawn_child(&SHM_ROLE, &args, &[fd.as_fd()])?;
        drop(fd);
        let mut hello = Received::new();
        let ropts = ReceiveOptions { timeout: Some(Duration::from_secs(30)), populate_ool: false };
        space.receive(setup, &mut hello, ropts).map_err(other)?;
        let service = hello.ports.first().map(|r| r.name).ok_or_else(|| other("shm server sent no port"))?;
        let _ = space.destroy(setup);
        let geometry = Geometry::new(64 << 10, 64 << 10, slots, slot_size).map_err(other)?;
        let wait = WaitConfig { spin, liveness: Duration::from_millis(20) };
        let opts = ClientOptions { geometry, wait, timeout: Duration::from_secs(30) };
        let client = Client::connect(&space, service, opts).map_err(other)?;
        Ok(ShmTransport { name, client: Some(client), child, space, service, opts, buf: vec![0; 64 << 10] })
    }

    /// Another channel to the same server.
    pub fn another_channel(&self) -> io::Result<Client> {
        Client::connect(&self.space, self.service, self.opts).map_err(other)
    }

    fn client(&mut self) -> io::Result<&mut Client> {
        self.client.as_mut().ok_or_else(|| other("closed"))
    }

    fn round_trip(&mut self, tag: u32, size: usize) -> io::Result<()> {
        let timeout = Some(Duration::from_secs(30));
        let Some(client) = self.client.as_mut() else { return Err(other("closed")) };
        client.send_wait(tag, &self.buf[..size], timeout).map_err(other)?;
        let r = client.recv(timeout).map_err(other)?;
        r.payload().copy_to(&mut self.buf[..SMALL]);
        Ok(())
    }

    /// Round trips of `size`-byte frames through pool loans (filled before timing).
    pub fn loan_round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        let mut out = Vec::with_capacity(iters);
        for i in 0..iters {
            let client = self.client()?;
            let mut loan = loop {
                match client.loan_pool(size) {
                    Ok(l) => break l,
                    Err(ictus_shm::SendError::Full) => std::hint::spin_loop(),
                    Err(e) => return Err(other(e)),
                }
            };
            loan.fill(i as u8 | 1);
            let t0 = Instant::now();
            loan.commit(ACK).map_err(other)?;
            drop(client.recv(Some(Duration::from_secs(30))).map_err(other)?);
            out.push(elapsed_ns(t0));
        }
        Ok(out)
    }

    /// Bursts of `BURST` pipelined `size`-byte requests answered with 8 bytes;
    /// returns messages per second.
    pub fn burst_rate(&mut self, size: usize, bursts: usize) -> io::Result<f64> {
        let t0 = Instant::now();
        let timeout = Some(Duration::from_secs(30));
        let Some(client) = self.client.as_mut() else { return Err(other("closed")) };
        for _ in 0..bursts {
            for _ in 0..BURST {
                client.send_wait(ACK, &self.buf[..size], timeout).map_err(other)?;
            }
            for _ in 0..BURST {
                drop(client.recv(timeout).map_err(other)?);
            }
        }
        Ok((bursts * BURST) as f64 / t0.elapsed().as_secs_f64())
    }
}

impl Transport for ShmTransport {
    fn name(&self) -> &str {
        self.name
    }

    fn description(&self) -> &str {
        "ictus-shm channel (request and reply rings)"
    }

    fn round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        let mut out = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t0 = Instant::now();
            self.round_trip(ECHO, size)?;
            out.push(elapsed_ns(t0));
        }
        Ok(out)
    }

    fn server_pid(&self) -> Option<u32> {
        Some(self.child.id())
    }
}

impl Drop for ShmTransport {
    fn drop(&mut self) {
        // Closing the client ends the server: it exits when its last channel closes.
        drop(self.client.take());
        reap(&mut self.child, Duration::from_secs(5));
    }
}

/// The ictus-shm server's role.
pub static SHM_ROLE: Role = Role { name: "shm-echo", run: shm_server };

/// Child role `shm-echo <setup-fd> <spin-µs>`: an ictus-shm server. `ECHO` records come
/// back as they are; `ACK` records (and pool frames, touched page by page) get 8
/// bytes; `SINK` records nothing. Exits when its last client has gone.
pub fn shm_server(args: &[String]) -> i32 {
    let run = || -> io::Result<()> {
        let fd = fd_arg(args.first().map_or("", String::as_str))?;
        let spin = Duration::from_micros(num_arg(args, 1, "spin")? as u64);
        let space = Space::new();
        let setup = space.insert_send_fd(fd).map_err(other)?;
        let wait = WaitConfig { spin, liveness: Duration::from_millis(20) };
        let mut server = Server::new(&space, ServerConfig { wait, ..ServerConfig::default() }).map_err(other)?;
        let mut m = Message::new(1, Vec::new());
        m.ports.push(PortArg::new(server.service(), Disposition::MakeSend));
        space.send(setup, &mut m, SendOptions::default()).map_err(other)?;
        let _ = space.deallocate(setup);
        let (mut opened, mut closed) = (0u64, 0u64);
        let started = Instant::now();
        let mut scratch = [0u8; 64 << 10];
        let ack = [0u8; ACK_LEN];
        let mut sink = 0u64;
        loop {
            server.wait(Some(Duration::from_millis(100))).map_err(other)?;
            while let Some(next) = server.try_next() {
                match next {
                    Next::Event(ictus_shm::Event::Opened { .. }) => opened += 1,
                    Next::Event(ictus_shm::Event::Closed { .. }) => closed += 1,
                    Next::Record(mut r) => {
                        let p = r.payload();
                        if r.is_pool() {
                            sink = sink.wrapping_add(p.touch_pages());
                            let _ = r.reply(0, &ack);
                        } else if r.tag() == ECHO {
                            let n = p.copy_to(&mut scratch);
                            let _ = r.reply(0, &scratch[..n]);
                        } else if r.tag() == ACK {
                            sink = sink.wrapping_add(p.touch_pages());
                            let _ = r.reply(0, &ack);
                        }
                    }
                }
            }
            if opened > 0 && opened == closed {
                break;
            }
            if opened == 0 && started.elapsed() > Duration::from_secs(60) {
                return Err(other("no client came"));
            }
        }
        std::hint::black_box(sink);
        Ok(())
    };
    role_status("shm-echo", run())
}

// ----- iceoryx2 ---------------------------------------------------------------------------

type IceService = iceoryx2::service::ipc::Service;
/// The payload that tells the iceoryx2 echo to exit cleanly (its node then removes
/// its own files).
const ICE_STOP: [u8; SMALL] = [0xee; SMALL];
type Payload64 = [u8; SMALL];
type IcePublisher = iceoryx2::port::publisher::Publisher<IceService, Payload64, ()>;
type IceSubscriber = iceoryx2::port::subscriber::Subscriber<IceService, Payload64, ()>;

/// iceoryx2 publish-subscribe ping-pong with an `iceoryx2-echo` child.
pub struct IceoryxTransport {
    _node: iceoryx2::node::Node<IceService>,
    publisher: IcePublisher,
    subscriber: IceSubscriber,
    child: Child,
}

impl std::fmt::Debug for IceoryxTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IceoryxTransport").field("child", &self.child.id()).finish()
    }
}

fn ice_names(tag: &str) -> (String, String) {
    (format!("ictus-bench/{tag}/ping"), format!("ictus-bench/{tag}/pong"))
}

fn ice_ports(
    node: &iceoryx2::node::Node<IceService>,
    publish: &str,
    subscribe: &str,
) -> io::Result<(IcePublisher, IceSubscriber)> {
    use iceoryx2::prelude::*;
    let service = |name: &str| -> io::Result<_> {
        let name: ServiceName = name.try_into().map_err(|e| other(format!("{e:?}")))?;
        node.service_builder(&name)
            .publish_subscribe::<Payload64>()
            .max_publishers(1)
            .max_subscribers(1)
            .history_size(0)
            .subscriber_max_buffer_size(1)
            .open_or_create()
            .map_err(|e| other(format!("{e:?}")))
    };
    let publisher = service(publish)?.publisher_builder().create().map_err(|e| other(format!("{e:?}")))?;
    let subscriber = service(subscribe)?.subscriber_builder().create().map_err(|e| other(format!("{e:?}")))?;
    Ok((publisher, subscriber))
}

fn ice_send(p: &IcePublisher, v: &Payload64) -> io::Result<()> {
    let s = p.loan_uninit().map_err(|e| other(format!("{e:?}")))?;
    s.write_payload(*v).send().map_err(|e| other(format!("{e:?}")))?;
    Ok(())
}

impl IceoryxTransport {
    /// Spawns the echo child and waits until a ping comes back.
    pub fn spawn() -> io::Result<IceoryxTransport> {
        use iceoryx2::prelude::*;
        let tag = format!("{}-{}", std::process::id(), Instant::now().elapsed().as_nanos());
        let (ping, pong) = ice_names(&tag);
        set_log_level(LogLevel::Error);
        let node = NodeBuilder::new().create::<ipc::Service>().map_err(|e| other(format!("{e:?}")))?;
        let (publisher, subscriber) = ice_ports(&node, &ping, &pong)?;
        let child = spawn_child(&ICEORYX2_ROLE, &[tag], &[])?;
        let mut t = IceoryxTransport { _node: node, publisher, subscriber, child };
        // The echo's subscriber may not exist yet: ping until a pong comes back.
        let start = Instant::now();
        'outer: loop {
            ice_send(&t.publisher, &[1; SMALL])?;
            let sent = Instant::now();
            while sent.elapsed() < Duration::from_millis(5) {
                if t.subscriber.receive().map_err(|e| other(format!("{e:?}")))?.is_some() {
                    break 'outer;
                }
            }
            if start.elapsed() > Duration::from_secs(20) {
                return Err(other("iceoryx2 echo did not answer"));
            }
            if let Ok(Some(s)) = t.child.try_wait() {
                return Err(other(format!("iceoryx2 echo exited: {s}")));
            }
        }
        // Drain stragglers.
        std::thread::sleep(Duration::from_millis(10));
        while t.subscriber.receive().map_err(|e| other(format!("{e:?}")))?.is_some() {}
        Ok(t)
    }
}

impl Transport for IceoryxTransport {
    fn name(&self) -> &str {
        "iceoryx2"
    }

    fn description(&self) -> &str {
        "iceoryx2 0.10 publish-subscribe ping-pong, busy-polling"
    }

    fn round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        if size != SMALL {
            return Err(other("iceoryx2 peer is built for 64-byte payloads"));
        }
        let mut out = Vec::with_capacity(iters);
        let msg = [7u8; SMALL];
        for _ in 0..iters {
            let t0 = Instant::now();
            ice_send(&self.publisher, &msg)?;
            loop {
                if let Some(s) = self.subscriber.receive().map_err(|e| other(format!("{e:?}")))? {
                    std::hint::black_box(s.payload()[0]);
                    break;
                }
                if t0.elapsed() > Duration::from_secs(10) {
                    return Err(other("iceoryx2 echo stopped answering"));
                }
                std::hint::spin_loop();
            }
            out.push(elapsed_ns(t0));
        }
        Ok(out)
    }

    fn server_pid(&self) -> Option<u32> {
        Some(self.child.id())
    }
}

impl Drop for IceoryxTransport {
    fn drop(&mut self) {
        let _ = ice_send(&self.publisher, &ICE_STOP);
        reap(&mut self.child, Duration::from_secs(5));
    }
}

/// The iceoryx2 echo's role.
pub static ICEORYX2_ROLE: Role = Role { name: "iceoryx2-echo", run: iceoryx2_server };

/// Child role `iceoryx2-echo <tag>`: answers every ping with a pong of the same
/// payload, busy-polling while traffic flows and napping after 2 ms without any.
pub fn iceoryx2_server(args: &[String]) -> i32 {
    let run = || -> io::Result<()> {
        use iceoryx2::prelude::*;
        let tag = args.first().ok_or_else(|| other("missing tag"))?;
        let (ping, pong) = ice_names(tag);
        set_log_level(LogLevel::Error);
        let node = NodeBuilder::new().create::<ipc::Service>().map_err(|e| other(format!("{e:?}")))?;
        let (publisher, subscriber) = ice_ports(&node, &pong, &ping)?;
        let parent = rustix::process::getppid();
        let mut idle = Instant::now();
        loop {
            if let Some(s) = subscriber.receive().map_err(|e| other(format!("{e:?}")))? {
                let v: Payload64 = *s.payload();
                drop(s);
                if v == ICE_STOP {
                    return Ok(());
                }
                ice_send(&publisher, &v)?;
                idle = Instant::now();
            } else if idle.elapsed() > SERVER_SPIN {
                std::thread::sleep(Duration::from_micros(200));
                if rustix::process::getppid() != parent {
                    return Ok(());
                }
            } else {
                std::hint::spin_loop();
            }
        }
    };
    role_status("iceoryx2-echo", run())
}

#[derive(Debug)]
pub struct PortBurst {
    space: Space,
    service: Name,
    reply_port: Name,
    received: Received,
    child: Child,
}

const PORT_REQUEST: i32 = 2;

impl PortBurst {
    /// Spawns a `port-burst` server and hands it a send right to our reply port.
    pub fn spawn() -> io::Result<PortBurst> {
        let space = Space::new();
        let setup = space.allocate_port().map_err(other)?;
        let fd = space.send_right_fd(setup).map_err(other)?;
        let child = spawn_child(&PORT_BURST_ROLE, &[fd.as_raw_fd().to_string()], &[fd.as_fd()])?;
        drop(fd);
        let mut received = Received::new();
        let ropts = ReceiveOptions { timeout: Some(Duration::from_secs(30)), populate_ool: false };
        space.receive(setup, &mut received, ropts).map_err(other)?;
        let service = received.ports.first().map(|r| r.name).ok_or_else(|| other("no service port"))?;
        let _ = space.destroy(setup);
        let reply_port = space.allocate_port().map_err(other)?;
        let mut m = Message::new(1, Vec::new());
        m.ports.push(PortArg::new(reply_port, Disposition::MakeSend));
        space.send(service, &mut m, SendOptions::default()).map_err(other)?;
        Ok(PortBurst { space, service, reply_port, received, child })
    }

    /// Bursts of `BURST` pipelined requests; messages per second.
    pub fn burst_rate(&mut self, bursts: usize) -> io::Result<f64> {
        let t0 = Instant::now();
        let mut msg = Message::new(PORT_REQUEST, vec![0xa5; SMALL]);
        let ropts = ReceiveOptions { timeout: Some(Duration::from_secs(30)), populate_ool: false };
        for _ in 0..bursts {
            for _ in 0..BURST {
                self.space.send(self.service, &mut msg, SendOptions::default()).map_err(other)?;
            }
            for _ in 0..BURST {
                self.space.receive(self.reply_port, &mut self.received, ropts).map_err(other)?;
            }
        }
        Ok((bursts * BURST) as f64 / t0.elapsed().as_secs_f64())
    }
}

impl Drop for PortBurst {
    fn drop(&mut self) {
        let _ = self.space.destroy(self.reply_port);
        let _ = self.space.deallocate(self.service);
        reap(&mut self.child, Duration::from_secs(5));
    }
}

/// The port-burst server's role.
pub static PORT_BURST_ROLE: Role = Role { name: "port-burst", run: port_burst_server };

/// Child role `port-burst <setup-fd>`: answers every request on its port with 8 bytes
/// to the reply port it was given; exits when that port dies.
pub fn port_burst_server(args: &[String]) -> i32 {
    let run = || -> io::Result<()> {
        let fd = fd_arg(args.first().map_or("", String::as_str))?;
        let space = Space::new();
        let setup = space.insert_send_fd(fd).map_err(other)?;
        let service = space.allocate_port().map_err(other)?;
        let mut m = Message::new(1, Vec::new());
        m.ports.push(PortArg::new(service, Disposition::MakeSend));
        space.send(setup, &mut m, SendOptions::default()).map_err(other)?;
        let _ = space.deallocate(setup);
        let mut r = Received::new();
        let ropts = ReceiveOptions { timeout: Some(Duration::from_secs(60)), populate_ool: false };
        space.receive(service, &mut r, ropts).map_err(other)?;
        let reply = r.ports.first().map(|p| p.name).ok_or_else(|| other("no reply port"))?;
        let mut ack = Message::new(PORT_REQUEST + 100, vec![0; ACK_LEN]);
        loop {
            match space.receive(service, &mut r, ropts) {
                Ok(()) if r.id == PORT_REQUEST => {
                    if space.send(reply, &mut ack, SendOptions::default()).is_err() {
                        return Ok(());
                    }
                }
                Ok(()) => {}
                Err(ictus_ipc::ReceiveError::Malformed { .. }) => {}
                Err(_) => return Ok(()),
            }
        }
    };
    role_status("port-burst", run())
}
