//! Ceph's client libraries, opened at run time: `librados.so.2` (cluster handle, pool
//! context, completions) and `libradosstriper.so.1` (striped objects over that context).
//!
//! Opened with `dlopen` rather than linked, so the workspace builds and its other tests
//! run on a machine without Ceph; there, [`Lib::load`] says which library is missing and
//! which Debian package brings it. Only the dozen functions used are looked up, with the
//! signatures of `<rados/librados.h>` and `<radosstriper/libradosstriper.h>` (Ceph 16).

use std::ffi::{c_char, c_int, c_uint, c_void};

use libloading::Library;

/// `rados_t`, `rados_ioctx_t`, `rados_completion_t`, `rados_striper_t`: opaque pointers.
pub type Handle = *mut c_void;

/// The functions, resolved once; the libraries stay loaded as long as this lives.
pub struct Lib {
    pub create: unsafe extern "C" fn(*mut Handle, *const c_char) -> c_int,
    pub conf_read_file: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    pub conf_set: unsafe extern "C" fn(Handle, *const c_char, *const c_char) -> c_int,
    pub connect: unsafe extern "C" fn(Handle) -> c_int,
    pub shutdown: unsafe extern "C" fn(Handle),
    pub ioctx_create: unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> c_int,
    pub ioctx_destroy: unsafe extern "C" fn(Handle),
    pub striper_create: unsafe extern "C" fn(Handle, *mut Handle) -> c_int,
    pub striper_destroy: unsafe extern "C" fn(Handle),
    pub striper_set_stripe_unit: unsafe extern "C" fn(Handle, c_uint) -> c_int,
    pub striper_set_stripe_count: unsafe extern "C" fn(Handle, c_uint) -> c_int,
    pub striper_set_object_size: unsafe extern "C" fn(Handle, c_uint) -> c_int,
    pub striper_write: unsafe extern "C" fn(Handle, *const c_char, *const c_char, usize, u64) -> c_int,
    pub striper_read: unsafe extern "C" fn(Handle, *const c_char, *mut c_char, usize, u64) -> c_int,
    pub striper_remove: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    pub striper_stat: unsafe extern "C" fn(Handle, *const c_char, *mut u64, *mut libc::time_t) -> c_int,
    _rados: Library,
    _striper: Library,
}

impl std::fmt::Debug for Lib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lib(librados.so.2, libradosstriper.so.1)")
    }
}

/// Looks up `name` in `lib` as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the `extern "C"` function pointer type of the symbol's C declaration.
unsafe fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
    // SAFETY: the caller gives the C declaration's type (libloading::Library::get).
    unsafe { lib.get::<T>(name.as_bytes()).map(|s| *s).map_err(|e| format!("{name}: {e}")) }
}

impl Lib {
    /// Opens both libraries and resolves every function, or says what is missing.
    pub fn load() -> Result<Lib, String> {
        // SAFETY: loading runs the libraries' initialisers; librados and libradosstriper are
        // ordinary shared libraries with no initialiser that depends on the loader's state.
        let rados = unsafe { Library::new("librados.so.2") }
            .map_err(|e| format!("librados.so.2 (Debian package librados2): {e}"))?;
        // SAFETY: as above.
        let striper = unsafe { Library::new("libradosstriper.so.1") }
            .map_err(|e| format!("libradosstriper.so.1 (Debian package libradosstriper1): {e}"))?;
        // SAFETY: each type below is transcribed from the C declaration in librados.h and
        // libradosstriper.h (Ceph 16): handles are `void *`, `time_t` is libc's.
        unsafe {
            Ok(Lib {
                create: sym(&rados, "rados_create")?,
                conf_read_file: sym(&rados, "rados_conf_read_file")?,
                conf_set: sym(&rados, "rados_conf_set")?,
                connect: sym(&rados, "rados_connect")?,
                shutdown: sym(&rados, "rados_shutdown")?,
                ioctx_create: sym(&rados, "rados_ioctx_create")?,
                ioctx_destroy: sym(&rados, "rados_ioctx_destroy")?,
                striper_create: sym(&striper, "rados_striper_create")?,
                striper_destroy: sym(&striper, "rados_striper_destroy")?,
                striper_set_stripe_unit: sym(&striper, "rados_striper_set_object_layout_stripe_unit")?,
                striper_set_stripe_count: sym(&striper, "rados_striper_set_object_layout_stripe_count")?,
                striper_set_object_size: sym(&striper, "rados_striper_set_object_layout_object_size")?,
                striper_write: sym(&striper, "rados_striper_write")?,
                striper_read: sym(&striper, "rados_striper_read")?,
                striper_remove: sym(&striper, "rados_striper_remove")?,
                striper_stat: sym(&striper, "rados_striper_stat")?,
                _rados: rados,
                _striper: striper,
            })
        }
    }
}
