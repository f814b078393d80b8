//! Echo servers over the kernel's byte and record channels: an `AF_UNIX
//! SOCK_SEQPACKET` socketpair and two pipes.
//!
//! - **seqpacket**: a record must fit the socket send buffer (~208 KiB by default), so
//!   messages go as records of at most [`CHUNK`] bytes and the receiver reads records
//!   until it has the whole message.
//! - **pipe**: two pipes, written and read in [`CHUNK`]-byte pieces (the default pipe
//!   buffer is 64 KiB, so large messages stream through it either way).
//!
//! Servers exit on end-of-file of their channel, and by `SIGKILL` when the parent dies.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::{Child, ExitStatus};
use std::time::Instant;

use ictus_bench::child::{fd_arg, num_arg, reap_status, spawn_child};
use ictus_bench::{Role, Transport};
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketFlags, SocketType};

use super::{check_sizes, elapsed_ns, invalid, pattern, touch_pages, CHUNK, MAX_MESSAGE, SHUTDOWN_GRACE};

// ---------------------------------------------------------------------------------
// Stream-like channels: seqpacket and pipes.

/// A bidirectional byte channel that moves messages in [`CHUNK`]-sized pieces.
pub trait Channel {
    /// Sends all of `data`.
    fn send_all(&mut self, data: &[u8]) -> io::Result<()>;
    /// Fills `buf`; `UnexpectedEof` if the other end closed.
    fn recv_exact(&mut self, buf: &mut [u8]) -> io::Result<()>;
}

/// One end of an `AF_UNIX SOCK_SEQPACKET` socketpair.
#[derive(Debug)]
pub struct SeqpacketChannel(OwnedFd);

impl Channel for SeqpacketChannel {
    fn send_all(&mut self, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(CHUNK) {
            // NOSIGNAL: a vanished peer is an error to report, not a SIGPIPE.
            let sent = rustix::net::send(&self.0, chunk, SendFlags::NOSIGNAL)?;
            if sent != chunk.len() {
                return Err(io::Error::other("short seqpacket send"));
            }
        }
        Ok(())
    }

    fn recv_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        for chunk in buf.chunks_mut(CHUNK) {
            // The sender cut the message at the same boundaries, so each record is
            // exactly one chunk; anything else is a protocol error (a shorter buffer
            // would silently truncate a record).
            let want = chunk.len();
            let (got, full) = rustix::net::recv(&self.0, chunk, RecvFlags::TRUNC)?;
            if got == 0 && full == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            if full != want {
                return Err(io::Error::other(format!("seqpacket record of {full} bytes, expected {want}")));
            }
        }
        Ok(())
    }
}

/// The read end of one pipe and the write end of another.
#[derive(Debug)]
pub struct PipeChannel {
    rx: File,
    tx: File,
}

impl Channel for PipeChannel {
    fn send_all(&mut self, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(CHUNK) {
            self.tx.write_all(chunk)?;
        }
        Ok(())
    }

    fn recv_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        for chunk in buf.chunks_mut(CHUNK) {
            self.rx.read_exact(chunk)?;
        }
        Ok(())
    }
}

/// Batch header: message size and number of round trips, little-endian u64s.
fn encode_header(size: usize, iters: usize) -> [u8; 16] {
    let mut header = [0u8; 16];
    header[..8].copy_from_slice(&(size as u64).to_le_bytes());
    header[8..].copy_from_slice(&(iters as u64).to_le_bytes());
    header
}

fn decode_header(header: &[u8; 16]) -> io::Result<(usize, usize)> {
    let word = |range: std::ops::Range<usize>| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&header[range]);
        usize::try_from(u64::from_le_bytes(bytes)).map_err(|_| invalid("header value too large"))
    };
    let (size, iters) = (word(0..8)?, word(8..16)?);
    if size == 0 || size > MAX_MESSAGE {
        return Err(invalid(format!("bad message size {size}")));
    }
    Ok((size, iters))
}

/// The echo server loop: for each batch header, receive `size` bytes, touch them and
/// reply with `reply_len` bytes, `iters` times. Returns `Ok` at end-of-file.
fn echo_loop(channel: &mut impl Channel, reply_len: usize) -> io::Result<()> {
    let mut buf = pattern(reply_len);
    loop {
        let mut header = [0u8; 16];
        match channel.recv_exact(&mut header) {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            other => other?,
        }
        let (size, iters) = decode_header(&header)?;
        if buf.len() < size {
            buf.resize(size, 0);
        }
        for _ in 0..iters {
            channel.recv_exact(&mut buf[..size])?;
            touch_pages(&buf[..size]);
            channel.send_all(&buf[..reply_len])?;
        }
    }
}

/// The seqpacket server's role.
pub static SEQPACKET_ROLE: Role = Role { name: "seqpacket-echo", run: seqpacket_server };
/// The pipe server's role.
pub static PIPE_ROLE: Role = Role { name: "pipe-echo", run: pipe_server };

/// Child role `seqpacket-echo <fd> <reply_len>`.
pub fn seqpacket_server(args: &[String]) -> i32 {
    let result = (|| {
        let fd = fd_arg(args.first().map_or("", String::as_str))?;
        let reply_len = num_arg(args, 1, "reply length")?;
        check_sizes(1, reply_len)?;
        echo_loop(&mut SeqpacketChannel(fd), reply_len)
    })();
    super::server_status("seqpacket-echo", result)
}

/// Child role `pipe-echo <read fd> <write fd> <reply_len>`.
pub fn pipe_server(args: &[String]) -> i32 {
    let result = (|| {
        let rx = fd_arg(args.first().map_or("", String::as_str))?;
        let tx = fd_arg(args.get(1).map_or("", String::as_str))?;
        let reply_len = num_arg(args, 2, "reply length")?;
        check_sizes(1, reply_len)?;
        echo_loop(&mut PipeChannel { rx: File::from(rx), tx: File::from(tx) }, reply_len)
    })();
    super::server_status("pipe-echo", result)
}

/// The client end of a ping-pong with an echo server in a child process.
#[derive(Debug)]
pub struct EchoPeer<C: Channel> {
    name: &'static str,
    description: &'static str,
    channel: Option<C>,
    child: Child,
    reply_len: usize,
    request: Vec<u8>,
    reply: Vec<u8>,
}

/// The `AF_UNIX SOCK_SEQPACKET` socketpair peer.
pub type SeqpacketPeer = EchoPeer<SeqpacketChannel>;
/// The two-pipes peer.
pub type PipePeer = EchoPeer<PipeChannel>;

impl EchoPeer<SeqpacketChannel> {
    /// Spawns a seqpacket echo server replying with `reply_len` bytes.
    pub fn spawn_seqpacket(reply_len: usize) -> io::Result<Self> {
        check_sizes(1, reply_len)?;
        let (ours, theirs) =
            rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
        let args = [theirs.as_raw_fd().to_string(), reply_len.to_string()];
        let child = spawn_child(&SEQPACKET_ROLE, &args, &[theirs.as_fd()])?;
        // Our copy of the server's end must go, or the server never sees end-of-file.
        drop(theirs);
        Ok(EchoPeer::new("seqpacket", "AF_UNIX SOCK_SEQPACKET socketpair", SeqpacketChannel(ours), child, reply_len))
    }
}

impl EchoPeer<PipeChannel> {
    /// Spawns a pipe echo server replying with `reply_len` bytes.
    pub fn spawn_pipe(reply_len: usize) -> io::Result<Self> {
        check_sizes(1, reply_len)?;
        let flags = rustix::pipe::PipeFlags::CLOEXEC;
        let (request_rx, request_tx) = rustix::pipe::pipe_with(flags)?;
        let (reply_rx, reply_tx) = rustix::pipe::pipe_with(flags)?;
        let args = [request_rx.as_raw_fd().to_string(), reply_tx.as_raw_fd().to_string(), reply_len.to_string()];
        let child = spawn_child(&PIPE_ROLE, &args, &[request_rx.as_fd(), reply_tx.as_fd()])?;
        drop((request_rx, reply_tx));
        Ok(EchoPeer::new(
            "pipe",
            "pipe pair",
            PipeChannel { rx: File::from(reply_rx), tx: File::from(request_tx) },
            child,
            reply_len,
        ))
    }
}

impl<C: Channel> EchoPeer<C> {
    fn new(name: &'static str, description: &'static str, channel: C, child: Child, reply_len: usize) -> Self {
        EchoPeer {
            name,
            description,
            channel: Some(channel),
            child,
            reply_len,
            request: Vec::new(),
            reply: vec![0; reply_len],
        }
    }

    fn channel(&mut self) -> io::Result<&mut C> {
        self.channel.as_mut().ok_or_else(|| io::Error::other("channel closed"))
    }

    /// One untimed round trip with the given request; returns the reply. With
    /// `reply_len == request.len()` the reply is the request echoed back.
    pub fn exchange(&mut self, request: &[u8]) -> io::Result<Vec<u8>> {
        check_sizes(request.len(), self.reply_len)?;
        let reply_len = self.reply_len;
        let channel = self.channel()?;
        channel.send_all(&encode_header(request.len(), 1))?;
        channel.send_all(request)?;
        let mut reply = vec![0; reply_len];
        channel.recv_exact(&mut reply)?;
        Ok(reply)
    }
}

impl<C: Channel> Transport for EchoPeer<C> {
    fn name(&self) -> &str {
        self.name
    }

    fn description(&self) -> &str {
        self.description
    }

    fn server_pid(&self) -> Option<u32> {
        Some(self.child.id())
    }

    fn round_trips(&mut self, size: usize, iters: usize) -> io::Result<Vec<u64>> {
        check_sizes(size, self.reply_len)?;
        if self.request.len() < size {
            self.request = pattern(size);
        }
        let channel = self.channel.as_mut().ok_or_else(|| io::Error::other("channel closed"))?;
        channel.send_all(&encode_header(size, iters))?;
        let mut samples = Vec::with_capacity(iters);
        for _ in 0..iters {
            let start = Instant::now();
            channel.send_all(&self.request[..size])?;
            channel.recv_exact(&mut self.reply)?;
            samples.push(elapsed_ns(start));
        }
        Ok(samples)
    }
}

impl<C: Channel> EchoPeer<C> {
    /// Stops the server by closing the channel and returns its exit status (success
    /// unless it failed or had to be killed after a second).
    pub fn shutdown(mut self) -> io::Result<ExitStatus> {
        self.stop()
    }

    fn stop(&mut self) -> io::Result<ExitStatus> {
        // Closing our end is the server's signal to exit.
        drop(self.channel.take());
        reap_status(&mut self.child, SHUTDOWN_GRACE)
    }
}

impl<C: Channel> Drop for EchoPeer<C> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_reject_nonsense() {
        assert_eq!(decode_header(&encode_header(4096, 7)).expect("valid"), (4096, 7));
        assert!(decode_header(&encode_header(0, 1)).is_err());
        assert!(decode_header(&encode_header(MAX_MESSAGE + 1, 1)).is_err());
    }

    /// A channel over an in-process socketpair, for testing the echo loop without
    /// spawning a process.
    #[test]
    fn echo_loop_serves_batches_until_eof() {
        let (a, b) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .expect("socketpair");
        let server = std::thread::spawn(move || echo_loop(&mut SeqpacketChannel(b), 200_000));
        let mut client = SeqpacketChannel(a);
        let message = pattern(200_000);
        client.send_all(&encode_header(message.len(), 2)).expect("header");
        for _ in 0..2 {
            client.send_all(&message).expect("send");
            let mut reply = vec![0; 200_000];
            client.recv_exact(&mut reply).expect("reply");
            assert_eq!(reply, message);
        }
        drop(client);
        server.join().expect("no panic").expect("clean exit at EOF");
    }
}
