//! Generated stubs: every argument kind, errors both ways, malformed requests.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use ictus_idl::ictus_ipc::{
    Disposition, Message, Name, OolBuffer, OolRegion, ReceiveOptions, Received, RightKind, SendOptions, Space,
};
use ictus_idl::{
    interface, ClientError, Context, Dispatched, ReceiveRight, RemoteError, SendOnceRight, SendRight, Server, Status,
};

#[derive(Debug, PartialEq, Eq)]
pub enum KvError {
    Missing,
    Full,
}

impl RemoteError for KvError {
    fn code(&self) -> u32 {
        match self {
            KvError::Missing => 1,
            KvError::Full => 2,
        }
    }
    fn from_code(code: u32) -> Option<Self> {
        match code {
            1 => Some(KvError::Missing),
            2 => Some(KvError::Full),
            _ => None,
        }
    }
}

/// A test interface with every kind of argument.
#[interface(id = 5000)]
pub trait Kitchen {
    #[id(0)]
    fn null(&self) -> Result<(), Status>;
    #[id(1)]
    fn scalars(&self, a: u8, b: i16, c: u32, d: i64, e: f64, f: bool) -> Result<(u64, bool), Status>;
    #[id(2)]
    fn text(&self, s: String, bytes: Vec<u8>, list: Vec<String>) -> Result<String, Status>;
    #[id(3)]
    fn put(&self, key: String, value: u64) -> Result<(), KvError>;
    #[id(4)]
    fn get(&self, key: String) -> Result<u64, KvError>;
    #[id(5)]
    fn ool(&self, region: OolRegion) -> Result<OolBuffer, Status>;
    #[id(6)]
    fn rights(&self, send: SendRight, once: SendOnceRight, recv: ReceiveRight) -> Result<SendRight, Status>;
    #[id(7)]
    fn whoami(&self, cx: &Context) -> Result<u32, Status>;
    #[id(8)]
    #[oneway]
    fn note(&self, line: String);
    #[id(9)]
    fn opt(&self, v: Option<u32>) -> Result<Option<String>, Status>;
}

#[derive(Default)]
struct Impl {
    kv: Mutex<Vec<(String, u64)>>,
    notes: Mutex<Vec<String>>,
    space: Mutex<Option<Space>>,
}

impl Kitchen for Impl {
    fn null(&self) -> Result<(), Status> {
        Ok(())
    }
    fn scalars(&self, a: u8, b: i16, c: u32, d: i64, e: f64, f: bool) -> Result<(u64, bool), Status> {
        Ok((u64::from(a) + b as u64 + u64::from(c) + d as u64 + e as u64, !f))
    }
    fn text(&self, s: String, bytes: Vec<u8>, list: Vec<String>) -> Result<String, Status> {
        Ok(format!("{s}:{}:{}", bytes.len(), list.join(",")))
    }
    fn put(&self, key: String, value: u64) -> Result<(), KvError> {
        let mut kv = self.kv.lock().unwrap();
        if kv.len() >= 2 {
            return Err(KvError::Full);
        }
        kv.push((key, value));
        Ok(())
    }
    fn get(&self, key: String) -> Result<u64, KvError> {
        self.kv.lock().unwrap().iter().find(|(k, _)| *k == key).map(|(_, v)| *v).ok_or(KvError::Missing)
    }
    fn ool(&self, region: OolRegion) -> Result<OolBuffer, Status> {
        let mut out = OolBuffer::new(region.len()).map_err(|_| Status(99))?;
        for (o, i) in out.iter_mut().zip(region.iter()) {
            *o = i.wrapping_add(1);
        }
        Ok(out)
    }
    fn rights(&self, send: SendRight, once: SendOnceRight, recv: ReceiveRight) -> Result<SendRight, Status> {
        let space = self.space.lock().unwrap().clone().unwrap();
        // Use the send-once right to announce, drop the send right, hand back a send
        // right made from the received receive right.
        space.send(once.name, &mut Message::new(77, vec![]), SendOptions::default()).map_err(|_| Status(1))?;
        space.deallocate(send.name).map_err(|_| Status(2))?;
        Ok(SendRight::make(recv.name))
    }
    fn whoami(&self, cx: &Context) -> Result<u32, Status> {
        Ok(cx.sender.pid)
    }
    fn note(&self, line: String) {
        self.notes.lock().unwrap().push(line);
    }
    fn opt(&self, v: Option<u32>) -> Result<Option<String>, Status> {
        Ok(v.map(|n| n.to_string()))
    }
}

struct Fixture {
    client_space: Space,
    client: KitchenClient,
    server: Server,
    server_space: Space,
    port: Name,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn start(threads: usize) -> Fixture {
    let server_space = Space::new();
    let port = server_space.allocate_port().unwrap();
    let imp = Impl::default();
    *imp.space.lock().unwrap() = Some(server_space.clone());
    let server = Server::new(&server_space, port).with(KitchenServer(imp));
    let s = server.clone();
    let thread = Some(std::thread::spawn(move || s.run_pool(threads).unwrap()));
    let client_space = Space::new();
    let (send, _) = client_space.extract_right(&server_space, port, Disposition::MakeSend).unwrap();
    let client = KitchenClient::new(&client_space, send).with_timeout(Duration::from_secs(20));
    Fixture { client_space, client, server, server_space, port, thread }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.server_space.destroy(self.port);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

#[test]
fn scalars_strings_bytes_options() {
    let f = start(1);
    f.client.null().unwrap();
    assert_eq!(f.client.scalars(1, 2, 3, 4, 5.5, true).unwrap(), (15, false));
    let s = f.client.text("hi", &[1, 2, 3], vec!["a".into(), "b".into()]).unwrap();
    assert_eq!(s, "hi:3:a,b");
    assert_eq!(f.client.opt(Some(7)).unwrap(), Some("7".to_string()));
    assert_eq!(f.client.opt(None).unwrap(), None);
    assert_eq!(f.client.whoami().unwrap(), std::process::id());
}

#[test]
fn server_errors_travel_back_typed() {
    let f = start(1);
    assert!(matches!(f.client.get("x"), Err(ClientError::Remote(KvError::Missing))));
    f.client.put("x", 5).unwrap();
    f.client.put("y", 6).unwrap();
    assert!(matches!(f.client.put("z", 7), Err(ClientError::Remote(KvError::Full))));
    assert_eq!(f.client.get("x").unwrap(), 5);
}

#[test]
fn out_of_line_both_ways() {
    let f = start(1);
    let mut buf = OolBuffer::new(3 * 4096 + 5).unwrap();
    buf.fill(41);
    let region = f.client.ool(buf).unwrap();
    assert_eq!(region.len(), 3 * 4096 + 5);
    assert!(region.iter().all(|&b| b == 42));
}

#[test]
fn port_rights_of_each_kind() {
    let f = start(1);
    let c = &f.client_space;
    let mine = c.allocate_port_with_send().unwrap();
    let announce = c.allocate_port().unwrap();
    let given = c.allocate_port().unwrap();
    let back =
        f.client.rights(SendRight::copy(mine), SendOnceRight::make(announce), ReceiveRight { name: given }).unwrap();
    let mut r = Received::new();
    c.receive(announce, &mut r, ReceiveOptions { timeout: Some(Duration::from_secs(20)), ..Default::default() })
        .unwrap();
    assert_eq!(r.id, 77);
    // The receive right moved away, and what came back reaches it.
    assert!(c.right_kinds(given).is_err());
    assert_eq!(c.right_kinds(back.name).unwrap(), vec![RightKind::Send]);
    // A wrong disposition for the argument's kind is refused before sending.
    let e = f.client.rights(
        SendRight::copy(mine),
        SendOnceRight { name: announce, disposition: Disposition::CopySend },
        ReceiveRight { name: mine },
    );
    assert!(matches!(e, Err(ClientError::Encode(_))));
}

#[test]
fn one_way_and_thread_pool() {
    let f = start(3);
    for i in 0..20 {
        f.client.note(&format!("line {i}")).unwrap();
    }
    // Routines from several client threads through the pool.
    std::thread::scope(|s| {
        for t in 0..4 {
            let c = f.client.clone();
            s.spawn(move || {
                for i in 0..25u32 {
                    assert_eq!(c.opt(Some(t * 100 + i)).unwrap(), Some((t * 100 + i).to_string()));
                }
            });
        }
    });
    // One-way requests are handled before the replies to requests sent after them are
    // all in; wait for the count rather than for time.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while f.server.stats().handled.load(Ordering::Relaxed) < 120 && std::time::Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert_eq!(f.server.stats().handled.load(Ordering::Relaxed), 120);
}

#[test]
fn malformed_requests_get_error_replies_and_are_counted() {
    let f = start(1);
    let c = &f.client_space;
    let port = f.client.port();
    let mut reply = Received::new();
    let opts = ReceiveOptions { timeout: Some(Duration::from_secs(20)), ..Default::default() };
    let code = |r: &Received| u32::from_le_bytes(r.data()[..4].try_into().unwrap());
    // Unknown id.
    c.call(port, &mut Message::new(5099, vec![]), &mut reply, SendOptions::default(), opts).unwrap();
    assert_eq!((reply.id, code(&reply)), (5199, ictus_idl::ictus_ipc::ReturnCode::MigBadId.code()));
    // Short data for `get` (a string length with no bytes).
    c.call(port, &mut Message::new(5004, 10u32.to_le_bytes().to_vec()), &mut reply, SendOptions::default(), opts)
        .unwrap();
    assert_eq!(code(&reply), ictus_idl::ictus_ipc::ReturnCode::MigBadArguments.code());
    // Trailing bytes after a valid request.
    c.call(port, &mut Message::new(5000, vec![1]), &mut reply, SendOptions::default(), opts).unwrap();
    assert_eq!(code(&reply), ictus_idl::ictus_ipc::ReturnCode::MigBadArguments.code());
    // Missing rights for `rights`.
    c.call(port, &mut Message::new(5006, vec![]), &mut reply, SendOptions::default(), opts).unwrap();
    assert_eq!(code(&reply), ictus_idl::ictus_ipc::ReturnCode::MigBadArguments.code());
    // A routine sent without a reply right, and a bad one-way: dropped.
    c.send(port, &mut Message::new(5000, vec![]), SendOptions::default()).unwrap();
    c.send(port, &mut Message::new(5008, vec![0xff]), SendOptions::default()).unwrap();
    // Invalid UTF-8, with an extra right that must be released by the server.
    let extra = c.allocate_port().unwrap();
    let mut m = Message::new(5004, [3u32.to_le_bytes().to_vec(), vec![0xff, 0xfe, 0xfd]].concat());
    m.ports.push(ictus_idl::ictus_ipc::PortArg::new(extra, Disposition::MakeSend));
    c.call(port, &mut m, &mut reply, SendOptions::default(), opts).unwrap();
    assert_eq!(code(&reply), ictus_idl::ictus_ipc::ReturnCode::MigBadArguments.code());
    // The server released the extra right: the port now has no senders anywhere.
    c.request_notification(
        extra,
        ictus_idl::ictus_ipc::NotifyKind::NoSenders,
        Some(ictus_idl::ictus_ipc::PortArg::new(extra, Disposition::MakeSendOnce)),
    )
    .unwrap();
    let mut n = Received::new();
    c.receive(extra, &mut n, opts).unwrap();
    assert_eq!(n.id, ictus_idl::ictus_ipc::NotifyId::NoSenders.id());
    // Still serving.
    f.client.null().unwrap();
    assert!(f.server.stats().refused.load(Ordering::Relaxed) >= 6);
    // A client-side check: a generated call refused by the server is a typed error.
    assert!(matches!(f.server.handle(&mut Received::new()), Dispatched::NotMine));
}

#[test]
fn refusals_release_only_what_the_request_brought() {
    use ictus_idl::ictus_ipc::{NotifyId, NotifyKind, PortArg, ReturnCode};
    let f = start(1);
    let c = &f.client_space;
    let port = f.client.port();
    let mut reply = Received::new();
    let opts = ReceiveOptions { timeout: Some(Duration::from_secs(20)), ..Default::default() };
    let code = |r: &Received| u32::from_le_bytes(r.data()[..4].try_into().unwrap());
    // Refused requests carrying a copy of our send right to the server's own port: in
    // the server's space it coalesces with the receive right, which must survive.
    for (id, data, expected) in [(5099, vec![], ReturnCode::MigBadId), (5004, vec![0xff], ReturnCode::MigBadArguments)]
    {
        let mut m = Message::new(id, data);
        m.ports.push(PortArg::new(port, Disposition::CopySend));
        c.call(port, &mut m, &mut reply, SendOptions::default(), opts).unwrap();
        assert_eq!(code(&reply), expected.code());
        assert_eq!(f.server_space.right_kinds(f.port).unwrap(), vec![RightKind::Receive]);
    }
    // An id whose reply id overflows gets an answer, not a panic.
    c.call(port, &mut Message::new(i32::MAX, vec![]), &mut reply, SendOptions::default(), opts).unwrap();
    assert_eq!((reply.id, code(&reply)), (i32::MIN + 99, ReturnCode::MigBadId.code()));
    // A send (not send-once) reply right is answered, then released.
    let back = c.allocate_port().unwrap();
    let mut m = Message::new(5000, vec![]);
    m.reply = Some(PortArg::new(back, Disposition::MakeSend));
    c.send(port, &mut m, SendOptions::default()).unwrap();
    c.receive(back, &mut reply, opts).unwrap();
    assert_eq!((reply.id, code(&reply)), (5100, 0));
    c.request_notification(back, NotifyKind::NoSenders, Some(PortArg::new(back, Disposition::MakeSendOnce))).unwrap();
    c.receive(back, &mut reply, opts).unwrap();
    assert_eq!(reply.id, NotifyId::NoSenders.id());
    // Still serving, holding nothing but its port.
    f.client.null().unwrap();
    assert_eq!(f.server_space.names().len(), 1);
}

#[test]
fn dead_server_is_a_clean_error() {
    let mut f = start(1);
    f.server_space.destroy(f.port).unwrap();
    f.thread.take().unwrap().join().unwrap();
    let e = f.client.null().unwrap_err();
    assert!(matches!(e, ClientError::Call(_)), "{e}");
}

#[test]
fn a_routine_without_a_reply_right_is_refused_and_does_not_run() {
    let f = start(1);
    // `put("k", 1)` encoded by hand, sent one way: nobody could hear its answer.
    let mut data = 1u32.to_le_bytes().to_vec();
    data.extend_from_slice(b"k");
    data.extend_from_slice(&1u64.to_le_bytes());
    f.client_space.send(f.client.port(), &mut Message::new(5003, data), SendOptions::default()).unwrap();
    // This is the client's first call, so its request travels on the port's main
    // connection, behind the `put` (later calls use a call channel): when `get`
    // answers, the `put` before it has been refused.
    assert!(matches!(f.client.get("k"), Err(ClientError::Remote(KvError::Missing))));
    assert_eq!(f.server.stats().refused.load(Ordering::Relaxed), 1);
}
