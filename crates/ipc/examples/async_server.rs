//! A server that serves many clients on one thread: a tokio current-thread runtime, the
//! service port's pollable descriptor in the runtime's epoll, no thread per client.
//!
//! 64 client tasks call it concurrently from the same runtime, and a client on another
//! thread calls it with the blocking API; every call is answered.
//!
//! Run with `cargo run -p ictus-ipc --features tokio --example async_server`.
use std::time::Duration;

use ictus_ipc::aio::{AsyncCaller, AsyncReceiver};
use ictus_ipc::{Message, ReceiveOptions, Received, SendOptions, Space};

const CLIENTS: usize = 64;
const CALLS: usize = 100;
const STOP: i32 = 0;
const UPPERCASE: i32 = 1;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The server has a space of its own, as a server process would.
    let server_space = Space::new();
    let service = server_space.allocate_port()?;
    let requests = AsyncReceiver::new(&server_space, service)?;
    // A send right for the clients, as a descriptor: what a client gets from the name
    // server or as its bootstrap right.
    let right = server_space.send_right_fd(service)?;
    let server = tokio::spawn(async move {
        let mut req = Received::new();
        let mut served = 0usize;
        loop {
            requests.receive(&mut req).await?;
            if req.id == STOP {
                return Ok::<usize, Box<dyn std::error::Error + Send + Sync>>(served);
            }
            let Some(reply_to) = req.reply.take() else { continue };
            let mut reply = Message::new(req.id + 100, req.data().to_ascii_uppercase());
            // A client that stopped reading loses its reply, not the server's time.
            if ictus_ipc::aio::send(&server_space, reply_to.name, &mut reply, Some(Duration::from_secs(1)))
                .await
                .is_ok()
            {
                served += 1;
            }
        }
    });

    // The clients' space holds a send right to the service port.
    let space = Space::new();
    let dest = space.insert_send_fd(right)?;
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let space = space.clone();
        clients.push(tokio::spawn(async move {
            let mut caller = AsyncCaller::new(&space, dest)?;
            let mut reply = Received::new();
            for i in 0..CALLS {
                let mut msg = Message::new(UPPERCASE, format!("client {c} call {i}").into_bytes());
                caller.call(&mut msg, &mut reply, Some(Duration::from_secs(30))).await?;
                assert_eq!(reply.data(), format!("CLIENT {c} CALL {i}").as_bytes());
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    // One more client, blocking, on a thread of its own: the same server answers it.
    let blocking_space = space.clone();
    let blocking = std::thread::spawn(move || -> Result<(), ictus_ipc::CallError> {
        let mut reply = Received::new();
        let recv = ReceiveOptions { timeout: Some(Duration::from_secs(30)), ..ReceiveOptions::default() };
        for i in 0..CALLS {
            let mut msg = Message::new(UPPERCASE, format!("blocking call {i}").into_bytes());
            blocking_space.call(dest, &mut msg, &mut reply, SendOptions::default(), recv)?;
        }
        Ok(())
    });

    for c in clients {
        c.await?.map_err(|e| e.to_string())?;
    }
    blocking.join().map_err(|_| "the blocking client panicked")??;
    space.send(dest, &mut Message::new(STOP, Vec::new()), SendOptions::default())?;
    let served = server.await?.map_err(|e| e.to_string())?;
    println!("served {served} calls from {} clients on one thread", CLIENTS + 1);
    assert_eq!(served, (CLIENTS + 1) * CALLS);
    Ok(())
}
