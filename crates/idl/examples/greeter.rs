//! The example of doc/interfaces.md, kept compiling and running.

use ictus_idl::ictus_ipc::{Disposition, Space};
use ictus_idl::{interface, Context, Server, Status};

/// A greeting service.
#[interface(id = 6000)]
pub trait Greeter {
    /// A routine: request, then a reply on a send-once right made for the call.
    #[id(0)]
    fn greet(&self, cx: &Context, name: String) -> Result<String, Status>;
    /// A simple routine: one way, no reply.
    #[id(1)]
    #[oneway]
    fn log(&self, line: String);
}

struct Impl;
impl Greeter for Impl {
    fn greet(&self, cx: &Context, name: String) -> Result<String, Status> {
        if name.is_empty() {
            return Err(Status(1));
        }
        Ok(format!("hello {name}, pid {}", cx.sender.pid))
    }
    fn log(&self, line: String) {
        eprintln!("{line}");
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Server: a port, a pool of 4 threads receiving on it.
    let server_space = Space::task();
    let port = server_space.allocate_port()?;
    let server = Server::new(&server_space, port).with(GreeterServer(Impl));
    std::thread::spawn(move || server.run_pool(4));

    // Client (here in the same process; normally the send right arrives in a message,
    // from the name server or as the bootstrap port).
    let client_space = Space::new();
    let (send, _) = client_space.extract_right(&server_space, port, Disposition::MakeSend)?;
    let greeter = GreeterClient::new(&client_space, send).with_timeout(std::time::Duration::from_secs(5));
    let reply = greeter.greet("ada")?;
    assert!(reply.starts_with("hello ada"));
    println!("{reply}");
    greeter.log("done")?;
    assert!(greeter.greet("").is_err());
    Ok(())
}
