//! Safe handles over librados and libradosstriper: a cluster connection ([`Rados`]),
//! a pool's striper ([`Striper`]) with ranged reads and writes of striped objects, and
//! asynchronous ranged reads ([`PendingRead`]) whose buffer lives until the library is
//! done with it.

use std::ffi::{c_char, CString};
use std::io::Read;
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};

use crate::ffi::{Handle, Lib};
use crate::{check_name, Error};

/// Returns `Err` for a negative return value of `op` on `name`.
fn rc(ret: i32, op: &'static str, name: &str) -> Result<i32, Error> {
    if ret < 0 {
        Err(Error::Rados { op, name: name.to_string(), errno: -ret })
    } else {
        Ok(ret)
    }
}

struct ClusterInner {
    lib: Lib,
    handle: Handle,
}

// SAFETY: a `rados_t` is used from any thread once connected (librados.h: only an io
// context's settings are not thread-safe, and they are set once, at creation); the
// function pointers and libraries are plain data.
unsafe impl Send for ClusterInner {}
// SAFETY: as above.
unsafe impl Sync for ClusterInner {}

impl Drop for ClusterInner {
    fn drop(&mut self) {
        // SAFETY: `handle` came from rados_create and every io context on it is gone
        // (each holds an `Arc` of this), as rados_shutdown requires.
        unsafe { (self.lib.shutdown)(self.handle) }
    }
}

/// A connection to a Ceph cluster.
#[derive(Clone)]
pub struct Rados {
    inner: Arc<ClusterInner>,
}

impl std::fmt::Debug for Rados {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Rados")
    }
}

fn cstring(what: &str, s: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error::BadName(format!("{what} {s:?} holds a NUL byte")))
}

impl Rados {
    /// Connects as `client.admin` with the configuration file `conf`, giving up after
    /// `timeout_s` seconds if no monitor answers (instead of librados's 300 s).
    pub fn connect(conf: &Path, timeout_s: u32) -> Result<Rados, Error> {
        let lib = Lib::load().map_err(Error::Load)?;
        let path = cstring("configuration path", &conf.to_string_lossy())?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: rados_create writes a handle to the pointer it is given; a NULL id
        // means client.admin (librados.h).
        rc(unsafe { (lib.create)(&mut handle, std::ptr::null()) }, "rados_create", "")?;
        let inner = Arc::new(ClusterInner { lib, handle });
        let lib = &inner.lib;
        // SAFETY: `handle` is a fresh, unconnected handle; the strings are NUL-terminated
        // and outlive the calls.
        let ret = unsafe { (lib.conf_read_file)(inner.handle, path.as_ptr()) };
        rc(ret, "rados_conf_read_file", &conf.to_string_lossy())?;
        let timeout = cstring("timeout", &timeout_s.max(1).to_string())?;
        for key in ["client_mount_timeout", "rados_mon_op_timeout", "rados_osd_op_timeout"] {
            let k = cstring("option", key)?;
            // SAFETY: as above.
            rc(unsafe { (lib.conf_set)(inner.handle, k.as_ptr(), timeout.as_ptr()) }, "rados_conf_set", key)?;
        }
        // SAFETY: a configured handle, connected once.
        rc(unsafe { (lib.connect)(inner.handle) }, "rados_connect", &conf.to_string_lossy())?;
        Ok(Rados { inner })
    }

    /// A striper over pool `pool`; objects it creates get `layout`.
    pub fn striper(&self, pool: &str, layout: Layout) -> Result<Striper, Error> {
        layout.check()?;
        let lib = &self.inner.lib;
        let p = cstring("pool", pool)?;
        let mut ioctx: Handle = std::ptr::null_mut();
        // SAFETY: a connected handle; rados_ioctx_create writes the context.
        rc(unsafe { (lib.ioctx_create)(self.inner.handle, p.as_ptr(), &mut ioctx) }, "rados_ioctx_create", pool)?;
        let mut striper: Handle = std::ptr::null_mut();
        // SAFETY: a valid io context; rados_striper_create writes the striper.
        if let Err(e) = rc(unsafe { (lib.striper_create)(ioctx, &mut striper) }, "rados_striper_create", pool) {
            // SAFETY: the context made above, used by nothing else.
            unsafe { (lib.ioctx_destroy)(ioctx) };
            return Err(e);
        }
        let inner = Arc::new(StriperInner { cluster: self.inner.clone(), ioctx, striper });
        // The layout is set once, before the striper is shared (the setters are not
        // thread-safe); it applies to objects this striper creates.
        // SAFETY: a valid striper, not yet shared.
        unsafe {
            rc((lib.striper_set_stripe_unit)(striper, layout.stripe_unit), "set_stripe_unit", pool)?;
            rc((lib.striper_set_stripe_count)(striper, layout.stripe_count), "set_stripe_count", pool)?;
            rc((lib.striper_set_object_size)(striper, layout.object_size), "set_object_size", pool)?;
        }
        let pool = Arc::new(Pool::start(&inner, READER_THREADS)?);
        Ok(Striper { inner, pool })
    }
}

/// How a new striped object is cut (libradosstriper's layout, as CephFS's): stripe
/// units of `stripe_unit` bytes go round `stripe_count` RADOS objects, each of at most
/// `object_size` bytes, then the next set of objects. Readers read the layout stored
/// with the object, so this matters only when writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Bytes per stripe unit.
    pub stripe_unit: u32,
    /// Objects a stripe goes round.
    pub stripe_count: u32,
    /// Bytes per RADOS object (a multiple of `stripe_unit`).
    pub object_size: u32,
}

impl Default for Layout {
    /// 1 MiB units over 4 objects of 4 MiB: a 4 MiB read touches 4 objects (so up to 4
    /// OSDs at once), and objects stay well under RADOS's comfortable size.
    fn default() -> Layout {
        Layout { stripe_unit: 1 << 20, stripe_count: 4, object_size: 4 << 20 }
    }
}

impl Layout {
    fn check(&self) -> Result<(), Error> {
        let ok = self.stripe_unit >= 4096
            && self.stripe_unit % 4096 == 0
            && (1..=64).contains(&self.stripe_count)
            && self.object_size >= self.stripe_unit
            && self.object_size % self.stripe_unit == 0;
        if ok {
            Ok(())
        } else {
            Err(Error::Layout(*self))
        }
    }
}

struct StriperInner {
    cluster: Arc<ClusterInner>,
    ioctx: Handle,
    striper: Handle,
}

// SAFETY: the striper's and io context's settings are set before it is shared (in
// `Rados::striper`); their I/O calls are thread-safe (librados.h, io context).
unsafe impl Send for StriperInner {}
// SAFETY: as above.
unsafe impl Sync for StriperInner {}

impl Drop for StriperInner {
    fn drop(&mut self) {
        let lib = &self.cluster.lib;
        // SAFETY: no read is running (every reader thread holds an `Arc` of this, and
        // they are joined when the striper's last clone goes); the striper goes before the
        // io context it uses.
        unsafe {
            (lib.striper_destroy)(self.striper);
            (lib.ioctx_destroy)(self.ioctx);
        }
    }
}

/// Striped objects of one pool. Cheap to clone; usable from many threads.
#[derive(Clone)]
pub struct Striper {
    // Declared first so it drops first: the last clone joins the reader threads before
    // the striper itself is destroyed, on the dropping thread.
    pool: Arc<Pool>,
    inner: Arc<StriperInner>,
}

/// Reader threads per striper: reads in flight beyond this wait their turn.
pub const READER_THREADS: usize = 8;

impl std::fmt::Debug for Striper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Striper")
    }
}

/// Size of a write or read call: large enough to fill every object of a stripe, small
/// enough to keep one call's buffer modest.
const IO_CHUNK: usize = 4 << 20;

impl StriperInner {
    fn lib(&self) -> &Lib {
        &self.cluster.lib
    }

    /// The size of object `name`, or `Error::NotFound`.
    fn stat(&self, name: &str) -> Result<u64, Error> {
        check_name(name)?;
        let n = cstring("name", name)?;
        let mut size = 0u64;
        let mut mtime: libc::time_t = 0;
        // SAFETY: a valid striper and NUL-terminated name; the out-pointers are live.
        let ret = unsafe { (self.lib().striper_stat)(self.striper, n.as_ptr(), &mut size, &mut mtime) };
        if ret == -libc::ENOENT {
            return Err(Error::NotFound(name.to_string()));
        }
        rc(ret, "rados_striper_stat", name)?;
        Ok(size)
    }

    /// Writes `data` at `offset` of object `name` (made if absent).
    fn write_at(&self, name: &str, offset: u64, data: &[u8]) -> Result<(), Error> {
        check_name(name)?;
        let n = cstring("name", name)?;
        for (i, piece) in data.chunks(IO_CHUNK).enumerate() {
            let at = offset + (i * IO_CHUNK) as u64;
            // SAFETY: `piece` is live and `len` bytes long for the call.
            let ret = unsafe {
                (self.lib().striper_write)(self.striper, n.as_ptr(), piece.as_ptr().cast::<c_char>(), piece.len(), at)
            };
            rc(ret, "rados_striper_write", name)?;
        }
        Ok(())
    }

    /// Reads up to `buf.len()` bytes at `offset` of `name`; returns how many (fewer at
    /// the end of the object).
    fn read_at(&self, name: &str, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        check_name(name)?;
        let n = cstring("name", name)?;
        let mut done = 0usize;
        while done < buf.len() {
            let want = (buf.len() - done).min(IO_CHUNK);
            // SAFETY: `buf[done..done + want]` is live and writable for the call, which
            // writes at most `want` bytes (librados.h).
            let ret = unsafe {
                (self.lib().striper_read)(
                    self.striper,
                    n.as_ptr(),
                    buf[done..].as_mut_ptr().cast::<c_char>(),
                    want,
                    offset + done as u64,
                )
            };
            if ret == -libc::ENOENT {
                return Err(Error::NotFound(name.to_string()));
            }
            let got = rc(ret, "rados_striper_read", name)? as usize;
            done += got.min(want);
            if got < want {
                break;
            }
        }
        Ok(done)
    }

    /// Removes object `name`.
    fn remove(&self, name: &str) -> Result<(), Error> {
        check_name(name)?;
        let n = cstring("name", name)?;
        // SAFETY: a valid striper and NUL-terminated name.
        let ret = unsafe { (self.lib().striper_remove)(self.striper, n.as_ptr()) };
        if ret == -libc::ENOENT {
            return Err(Error::NotFound(name.to_string()));
        }
        rc(ret, "rados_striper_remove", name).map(drop)
    }
}

impl Striper {
    /// The size of object `name`, or `Error::NotFound`.
    pub fn stat(&self, name: &str) -> Result<u64, Error> {
        self.inner.stat(name)
    }

    /// Writes `data` at `offset` of object `name` (made if absent).
    pub fn write_at(&self, name: &str, offset: u64, data: &[u8]) -> Result<(), Error> {
        self.inner.write_at(name, offset, data)
    }

    /// Reads up to `buf.len()` bytes at `offset` of `name`; returns how many (fewer at
    /// the end of the object).
    pub fn read_at(&self, name: &str, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        self.inner.read_at(name, offset, buf)
    }

    /// Removes object `name`.
    pub fn remove(&self, name: &str) -> Result<(), Error> {
        self.inner.remove(name)
    }

    /// Starts reading `len` bytes at `offset` of `name` on the striper's reader
    /// threads; the bytes arrive in the returned [`PendingRead`].
    ///
    /// Not libradosstriper's `rados_striper_aio_read`: in Ceph 16.2 its completion
    /// fires before the bytes are in the caller's buffer (this crate's cluster test saw
    /// zeros and half-filled buffers), so reads in flight are synchronous reads on a
    /// small pool of threads, each with a buffer of its own.
    pub fn read_async(&self, name: &str, offset: u64, len: usize) -> Result<PendingRead, Error> {
        check_name(name)?;
        let (tx, rx) = mpsc::channel();
        let job = Job { name: name.to_string(), offset, len, reply: tx };
        let tx = self.pool.tx.lock().map_err(|_| Error::Pool)?;
        tx.as_ref().ok_or(Error::Pool)?.send(job).map_err(|_| Error::Pool)?;
        Ok(PendingRead { rx, result: None, name: name.to_string(), offset })
    }

    /// Uploads `len` bytes from `src` as object `name`, replacing nothing: an existing
    /// object is refused (`Error::Exists`). On failure the partial object is removed.
    pub fn put(&self, name: &str, src: &mut dyn Read, len: u64) -> Result<(), Error> {
        match self.stat(name) {
            Ok(_) => return Err(Error::Exists(name.to_string())),
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        let result = (|| {
            let mut buf = vec![0u8; IO_CHUNK];
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(IO_CHUNK as u64) as usize;
                src.read_exact(&mut buf[..n]).map_err(|e| Error::Source(e.to_string()))?;
                self.write_at(name, done, &buf[..n])?;
                done += n as u64;
            }
            if len == 0 {
                self.write_at(name, 0, &[])?;
            }
            let size = self.stat(name)?;
            if size != len {
                return Err(Error::Short { name: name.to_string(), expected: len, got: size });
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = self.remove(name);
        }
        result
    }

    /// Uploads the file at `path` as object `name` (the `ictus mars put` of a cluster).
    pub fn put_file(&self, name: &str, path: &Path) -> Result<u64, Error> {
        let mut f = std::fs::File::open(path).map_err(|e| Error::Source(format!("{}: {e}", path.display())))?;
        let len = f.metadata().map_err(|e| Error::Source(format!("{}: {e}", path.display())))?.len();
        self.put(name, &mut f, len)?;
        Ok(len)
    }
}

/// A ranged read in flight on the striper's reader threads. Dropping it waits for the
/// read to finish, so a dropped read never holds the object's lock after its owner is
/// gone (a remove right after would find it busy).
#[derive(Debug)]
pub struct PendingRead {
    rx: mpsc::Receiver<Result<Vec<u8>, Error>>,
    result: Option<Result<Vec<u8>, Error>>,
    name: String,
    offset: u64,
}

impl PendingRead {
    /// Whether the read has completed (then [`PendingRead::wait`] does not block).
    pub fn is_complete(&mut self) -> bool {
        if self.result.is_none() {
            match self.rx.try_recv() {
                Ok(r) => self.result = Some(r),
                Err(mpsc::TryRecvError::Empty) => return false,
                Err(mpsc::TryRecvError::Disconnected) => self.result = Some(Err(Error::Pool)),
            }
        }
        true
    }

    /// The offset this read started at.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Waits for the read; returns the bytes read (fewer than asked at the object's end).
    pub fn wait(mut self) -> Result<Vec<u8>, Error> {
        if !self.is_complete() {
            self.result = Some(self.rx.recv().unwrap_or(Err(Error::Pool)));
        }
        self.result.take().unwrap_or(Err(Error::Pool))
    }

    /// The object read.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        if self.result.is_none() {
            let _ = self.rx.recv();
        }
    }
}

/// A read for the pool.
struct Job {
    name: String,
    offset: u64,
    len: usize,
    reply: mpsc::Sender<Result<Vec<u8>, Error>>,
}

/// Reader threads of one striper, joined when its last clone goes.
struct Pool {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Pool {
    fn start(inner: &Arc<StriperInner>, threads: usize) -> Result<Pool, Error> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let pool = Pool { tx: Mutex::new(Some(tx)), threads: Mutex::new(Vec::new()) };
        for i in 0..threads {
            let rx = rx.clone();
            let inner = inner.clone();
            let t = std::thread::Builder::new()
                .name(format!("rados-read-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    let Ok(job) = job else { return };
                    let mut buf = vec![0u8; job.len];
                    let r = inner.read_at(&job.name, job.offset, &mut buf).map(|n| {
                        buf.truncate(n);
                        buf
                    });
                    let _ = job.reply.send(r);
                })
                .map_err(|e| Error::Source(format!("reader thread: {e}")))?;
            pool.threads.lock().map_err(|_| Error::Pool)?.push(t);
        }
        Ok(pool)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Closing the channel ends each thread after its current read.
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Ok(mut threads) = self.threads.lock() {
            for t in threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}
