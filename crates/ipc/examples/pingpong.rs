//! A small ping-pong between two threads over one port, for looking at the system
//! calls a call makes (`strace -f`) and at a quick timing. Not a benchmark: see
//! `ictus bench ipc` for measurements against peers.

use std::time::Instant;

use ictus_ipc::{Message, ReceiveOptions, Received, SendOptions, Space};

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let server = Space::new();
    let port = server.allocate_port().expect("port");
    let client = Space::new();
    let (dest, _) = client.extract_right(&server, port, ictus_ipc::Disposition::MakeSend).expect("send right");
    let s = server.clone();
    std::thread::spawn(move || {
        let mut r = Received::new();
        let mut reply = Message::new(1, vec![0u8; 8]);
        while s.receive(port, &mut r, ReceiveOptions::default()).is_ok() {
            if let Some(to) = r.reply {
                let _ = s.send(to.name, &mut reply, SendOptions::default());
            }
        }
    });
    let mut msg = Message::new(1, vec![0u8; 64]);
    let mut r = Received::new();
    let t0 = Instant::now();
    for _ in 0..n {
        client.call(dest, &mut msg, &mut r, SendOptions::default(), ReceiveOptions::default()).expect("call");
    }
    println!("{n} calls, {:?} each (two threads, one process)", t0.elapsed() / n as u32);
}
