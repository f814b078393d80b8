use std::time::Duration;

use ictus_ipc::aio::{self, AsyncCaller, AsyncReceiver};
use ictus_ipc::{Message, Received, Space};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The server's space and its service port, as in a server process.
    let server_space = Space::new();
    let service = server_space.allocate_port()?;
    let requests = AsyncReceiver::new(&server_space, service)?;
    // The clients' space gets a send right (from the name server, in real life).
    let space = Space::new();
    let dest = space.insert_send_fd(server_space.send_right_fd(service)?)?;

    // The server: one task, answering each call through its reply right.
    let server = tokio::spawn(async move {
        let mut req = Received::new();
        for _ in 0..10 {
            requests.receive(&mut req).await?;
            let reply_to = req.reply.take().ok_or("a call brings a reply right")?;
            let mut answer = Message::new(req.id, req.data().to_ascii_uppercase());
            aio::send(&server_space, reply_to.name, &mut answer, Some(Duration::from_secs(1))).await?;
        }
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    });
    // Ten clients, each a task with a caller of its own, on the same thread.
    let mut clients = Vec::new();
    for i in 0..10 {
        let mut caller = AsyncCaller::new(&space, dest)?;
        clients.push(tokio::spawn(async move {
            let mut reply = Received::new();
            let mut msg = Message::new(i, format!("client {i}").into_bytes());
            caller.call(&mut msg, &mut reply, Some(Duration::from_secs(30))).await?;
            assert_eq!(reply.data(), format!("CLIENT {i}").as_bytes());
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for c in clients {
        c.await?.map_err(|e| e.to_string())?;
    }
    server.await?.map_err(|e| e.to_string())?;
    println!("10 calls served on one thread");
    Ok(())
}
