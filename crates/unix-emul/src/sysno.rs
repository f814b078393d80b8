//! x86_64 system-call numbers and what the Unix server does with each: the one table
//! that both the seccomp filter (built by the server) and the library's dispatcher
//! read, so that they can never disagree.
//!
//! Pure: no system calls.

#![allow(missing_docs)]

pub const READ: u32 = 0;
pub const WRITE: u32 = 1;
pub const OPEN: u32 = 2;
pub const CLOSE: u32 = 3;
pub const STAT: u32 = 4;
pub const FSTAT: u32 = 5;
pub const LSTAT: u32 = 6;
pub const POLL: u32 = 7;
pub const LSEEK: u32 = 8;
pub const MMAP: u32 = 9;
pub const MPROTECT: u32 = 10;
pub const MUNMAP: u32 = 11;
pub const BRK: u32 = 12;
pub const RT_SIGACTION: u32 = 13;
pub const RT_SIGPROCMASK: u32 = 14;
pub const RT_SIGRETURN: u32 = 15;
pub const IOCTL: u32 = 16;
pub const PREAD64: u32 = 17;
pub const ACCESS: u32 = 21;
pub const PSELECT6: u32 = 270;
pub const SHMGET: u32 = 29;
pub const SHMAT: u32 = 30;
pub const SHMCTL: u32 = 31;
pub const DUP2: u32 = 33;
pub const GETPID: u32 = 39;
pub const SOCKET: u32 = 41;
pub const SOCKETPAIR: u32 = 53;
pub const SENDTO: u32 = 44;
pub const SENDMSG: u32 = 46;
pub const SENDMMSG: u32 = 307;
pub const CONNECT: u32 = 42;
pub const BIND: u32 = 49;
pub const CLONE: u32 = 56;
pub const FORK: u32 = 57;
pub const VFORK: u32 = 58;
pub const EXECVE: u32 = 59;
pub const EXIT: u32 = 60;
pub const KILL: u32 = 62;
pub const SEMGET: u32 = 64;
pub const SEMOP: u32 = 65;
pub const SEMCTL: u32 = 66;
pub const SHMDT: u32 = 67;
pub const MSGGET: u32 = 68;
pub const MSGSND: u32 = 69;
pub const MSGRCV: u32 = 70;
pub const MSGCTL: u32 = 71;
pub const FCNTL: u32 = 72;
pub const TRUNCATE: u32 = 76;
pub const GETDENTS: u32 = 78;
pub const GETDENTS64: u32 = 217;
pub const GETCWD: u32 = 79;
pub const CHDIR: u32 = 80;
pub const FCHDIR: u32 = 81;
pub const UMASK: u32 = 95;
pub const RENAME: u32 = 82;
pub const MKDIR: u32 = 83;
pub const RMDIR: u32 = 84;
pub const CREAT: u32 = 85;
pub const LINK: u32 = 86;
pub const UNLINK: u32 = 87;
pub const SYMLINK: u32 = 88;
pub const READLINK: u32 = 89;
pub const CHMOD: u32 = 90;
pub const FCHMOD: u32 = 91;
pub const CHOWN: u32 = 92;
pub const FCHOWN: u32 = 93;
pub const LCHOWN: u32 = 94;
pub const PTRACE: u32 = 101;
pub const GETUID: u32 = 102;
pub const GETGID: u32 = 104;
pub const GETEUID: u32 = 107;
pub const GETEGID: u32 = 108;
pub const SYSLOG: u32 = 103;
pub const SETUID: u32 = 105;
pub const SETGID: u32 = 106;
pub const GETPPID: u32 = 110;
pub const SETREUID: u32 = 113;
pub const SETREGID: u32 = 114;
pub const SETGROUPS: u32 = 116;
pub const SETRESUID: u32 = 117;
pub const SETRESGID: u32 = 119;
pub const SETFSUID: u32 = 122;
pub const SETFSGID: u32 = 123;
pub const CAPSET: u32 = 126;
pub const RT_SIGSUSPEND: u32 = 130;
pub const UTIME: u32 = 132;
pub const MKNOD: u32 = 133;
pub const USELIB: u32 = 134;
pub const STATFS: u32 = 137;
pub const VHANGUP: u32 = 153;
pub const PIVOT_ROOT: u32 = 155;
pub const SYSCTL: u32 = 156;
pub const CHROOT: u32 = 161;
pub const ACCT: u32 = 163;
pub const SETTIMEOFDAY: u32 = 164;
pub const MOUNT: u32 = 165;
pub const UMOUNT2: u32 = 166;
pub const SWAPON: u32 = 167;
pub const SWAPOFF: u32 = 168;
pub const REBOOT: u32 = 169;
pub const SETHOSTNAME: u32 = 170;
pub const SETDOMAINNAME: u32 = 171;
pub const IOPL: u32 = 172;
pub const IOPERM: u32 = 173;
pub const CREATE_MODULE: u32 = 174;
pub const INIT_MODULE: u32 = 175;
pub const DELETE_MODULE: u32 = 176;
pub const GET_KERNEL_SYMS: u32 = 177;
pub const QUERY_MODULE: u32 = 178;
pub const QUOTACTL: u32 = 179;
pub const NFSSERVCTL: u32 = 180;
pub const SETXATTR: u32 = 188;
pub const LSETXATTR: u32 = 189;
pub const FSETXATTR: u32 = 190;
pub const GETXATTR: u32 = 191;
pub const LGETXATTR: u32 = 192;
pub const FGETXATTR: u32 = 193;
pub const LISTXATTR: u32 = 194;
pub const LLISTXATTR: u32 = 195;
pub const FLISTXATTR: u32 = 196;
pub const REMOVEXATTR: u32 = 197;
pub const LREMOVEXATTR: u32 = 198;
pub const FREMOVEXATTR: u32 = 199;
pub const GETTID: u32 = 186;
pub const TKILL: u32 = 200;
pub const LOOKUP_DCOOKIE: u32 = 212;
pub const SEMTIMEDOP: u32 = 220;
pub const TGKILL: u32 = 234;
pub const UTIMES: u32 = 235;
pub const MQ_OPEN: u32 = 240;
pub const MQ_UNLINK: u32 = 241;
pub const KEXEC_LOAD: u32 = 246;
pub const ADD_KEY: u32 = 248;
pub const REQUEST_KEY: u32 = 249;
pub const KEYCTL: u32 = 250;
pub const INOTIFY_ADD_WATCH: u32 = 254;
pub const OPENAT: u32 = 257;
pub const MKDIRAT: u32 = 258;
pub const MKNODAT: u32 = 259;
pub const FCHOWNAT: u32 = 260;
pub const FUTIMESAT: u32 = 261;
pub const NEWFSTATAT: u32 = 262;
pub const UNLINKAT: u32 = 263;
pub const RENAMEAT: u32 = 264;
pub const LINKAT: u32 = 265;
pub const SYMLINKAT: u32 = 266;
pub const READLINKAT: u32 = 267;
pub const FCHMODAT: u32 = 268;
pub const FACCESSAT: u32 = 269;
pub const PPOLL: u32 = 271;
pub const UNSHARE: u32 = 272;
pub const UTIMENSAT: u32 = 280;
pub const EPOLL_PWAIT: u32 = 281;
pub const DUP3: u32 = 292;
pub const PERF_EVENT_OPEN: u32 = 298;
pub const FANOTIFY_INIT: u32 = 300;
pub const FANOTIFY_MARK: u32 = 301;
pub const PRLIMIT64: u32 = 302;
pub const NAME_TO_HANDLE_AT: u32 = 303;
pub const OPEN_BY_HANDLE_AT: u32 = 304;
pub const SETNS: u32 = 308;
pub const FINIT_MODULE: u32 = 313;
pub const RENAMEAT2: u32 = 316;
pub const SECCOMP: u32 = 317;
pub const KEXEC_FILE_LOAD: u32 = 320;
pub const BPF: u32 = 321;
pub const EXECVEAT: u32 = 322;
pub const STATX: u32 = 332;
pub const IO_PGETEVENTS: u32 = 333;
pub const IO_URING_SETUP: u32 = 425;
pub const IO_URING_ENTER: u32 = 426;
pub const IO_URING_REGISTER: u32 = 427;
pub const OPEN_TREE: u32 = 428;
pub const MOVE_MOUNT: u32 = 429;
pub const FSOPEN: u32 = 430;
pub const FSCONFIG: u32 = 431;
pub const FSMOUNT: u32 = 432;
pub const FSPICK: u32 = 433;
pub const CLONE3: u32 = 435;
pub const CLOSE_RANGE: u32 = 436;
pub const OPENAT2: u32 = 437;
pub const FACCESSAT2: u32 = 439;
pub const EPOLL_PWAIT2: u32 = 441;
pub const MOUNT_SETATTR: u32 = 442;
pub const QUOTACTL_FD: u32 = 443;
pub const FCHMODAT2: u32 = 452;
pub const STATMOUNT: u32 = 457;
pub const LISTMOUNT: u32 = 458;
pub const SETXATTRAT: u32 = 463;
pub const GETXATTRAT: u32 = 464;
pub const LISTXATTRAT: u32 = 465;
pub const REMOVEXATTRAT: u32 = 466;
pub const OPEN_TREE_ATTR: u32 = 467;

/// One past the highest system call number the table knows. Numbers at or above it
/// are trapped and refused with `ENOSYS` (a kernel newer than the table may have calls
/// whose meaning the server cannot judge).
pub const MAX_KNOWN: u32 = 468;

/// errno values the table and the wire use.
pub mod errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const ESRCH: i32 = 3;
    pub const EINTR: i32 = 4;
    pub const EIO: i32 = 5;
    pub const E2BIG: i32 = 7;
    pub const ENOEXEC: i32 = 8;
    pub const EBADF: i32 = 9;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EACCES: i32 = 13;
    pub const EFAULT: i32 = 14;
    pub const EEXIST: i32 = 17;
    pub const ENOTDIR: i32 = 20;
    pub const EISDIR: i32 = 21;
    pub const EINVAL: i32 = 22;
    pub const EMFILE: i32 = 24;
    pub const EROFS: i32 = 30;
    pub const EPIPE: i32 = 32;
    pub const ENAMETOOLONG: i32 = 36;
    pub const ENOSYS: i32 = 38;
    pub const ELOOP: i32 = 40;
    pub const EMSGSIZE: i32 = 90;
    pub const ENODATA: i32 = 61;
    pub const EAFNOSUPPORT: i32 = 97;
    pub const EOPNOTSUPP: i32 = 95;
    pub const ENOTSUP: i32 = 95;
    pub const ENOBUFS: i32 = 105;
}

/// What happens to a system call, decided once here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Done by the host kernel for the program, from anywhere, never trapped: calls on
    /// descriptors and memory the program already holds, time, scheduling. Harmless
    /// under any policy because descriptors are capabilities the server handed out.
    Native,
    /// Native, unless an argument needs the library (see [`ArgCheck`]).
    NativeIf(ArgCheck),
    /// Trapped from the program; the library does it itself (it touches state the
    /// library must keep: the SIGSYS handler, the signal mask, its own descriptors),
    /// and its own call site is allowed by the filter. Harmless under any policy.
    Library,
    /// Served by the Unix server: everything that names a path (the view and its
    /// policy live there), and `execve`. Never allowed to the program or the library.
    Server,
    /// Refused by default with this errno (and counted by the server): calls that
    /// would reach outside the program (mounts, modules, other users' identities,
    /// SysV IPC shared with the host, io_uring which bypasses seccomp, ptrace).
    Refused(i32),
}

/// The argument tests the seccomp filter makes for [`Class::NativeIf`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgCheck {
    /// Argument 0 is a descriptor: the library's reserved ones go to the library.
    Fd0Reserved,
    /// Argument 1 is the new descriptor of `dup2`/`dup3`.
    Fd1Reserved,
    /// `close_range(first, last, flags)`: a range covering a reserved descriptor.
    CloseRange,
    /// `ioctl(fd, req)`: reserved descriptors go to the library; `TIOCSTI` (type
    /// characters into a terminal: the classic sandbox escape) is refused.
    Ioctl,
    /// `socket(domain, type, …)` and `socketpair`: families other than `AF_UNIX`
    /// when the network is off; `AF_UNIX` datagram sockets when the view confines
    /// paths and addressed sends cannot be served (a datagram's destination path is
    /// resolved by the kernel in `sendto`/`sendmsg`, which the filter cannot see
    /// into: see doc/unix.md).
    Socket,
    /// Argument N is a signal mask pointer: non-null goes to the library (SIGSYS must
    /// never be blocked, or the kernel kills the program at its next trapped call).
    SigmaskArg(u8),
    /// `rt_sigprocmask(how, set, …)`: a non-null set that blocks (not `SIG_UNBLOCK`).
    SigprocMask,
    /// `rt_sigaction(sig, act, …)`: any new action (its mask may block SIGSYS), and
    /// anything about SIGSYS itself.
    SigAction,
    /// `prlimit64(pid, …)`: another process's limits go to the library (it lets only
    /// the caller's own through).
    PidZero,
    /// `clone(flags, …)`: a child sharing the memory but not a thread (`CLONE_VM`
    /// without `CLONE_THREAD`, as `vfork`) goes to the library, which must know (the
    /// pid on its state page is not that child's).
    CloneVm,
}

/// The class of `nr`.
pub const fn class(nr: u32) -> Class {
    use errno::*;
    use ArgCheck::*;
    use Class::*;
    match nr {
        CLOSE | FCNTL => NativeIf(Fd0Reserved),
        IOCTL => NativeIf(Ioctl),
        DUP2 | DUP3 => NativeIf(Fd1Reserved),
        CLOSE_RANGE => NativeIf(CloseRange),
        SOCKET | SOCKETPAIR => NativeIf(Socket),
        RT_SIGACTION => NativeIf(SigAction),
        RT_SIGPROCMASK => NativeIf(SigprocMask),
        PPOLL => NativeIf(SigmaskArg(3)),
        EPOLL_PWAIT | EPOLL_PWAIT2 => NativeIf(SigmaskArg(4)),
        PSELECT6 | IO_PGETEVENTS => NativeIf(SigmaskArg(5)),
        PRLIMIT64 => NativeIf(PidZero),
        CLONE => NativeIf(CloneVm),
        // fchdir: the library's cache of failed lookups keys relative paths by the
        // working directory. The getters: answered from the library's state page.
        // vfork and clone3 (whose flags the filter cannot read): the library counts
        // the children that share the memory.
        // umask: the library keeps the process's mask, to send it with creates.
        RT_SIGSUSPEND | FCHDIR | UMASK | GETPID | GETUID | GETEUID | GETGID | GETEGID | VFORK | CLONE3 => Library,
        // Every call that names a path, and exec.
        OPEN | STAT | LSTAT | ACCESS | EXECVE | TRUNCATE | GETCWD | CHDIR | RENAME | MKDIR | RMDIR | CREAT | LINK
        | UNLINK | SYMLINK | READLINK | CHMOD | CHOWN | LCHOWN | UTIME | MKNOD | STATFS | SETXATTR | LSETXATTR
        | GETXATTR | LGETXATTR | LISTXATTR | LLISTXATTR | REMOVEXATTR | LREMOVEXATTR | UTIMES | INOTIFY_ADD_WATCH
        | OPENAT | MKDIRAT | MKNODAT | FCHOWNAT | FUTIMESAT | NEWFSTATAT | UNLINKAT | RENAMEAT | LINKAT | SYMLINKAT
        | READLINKAT | FCHMODAT | FACCESSAT | UTIMENSAT | RENAMEAT2 | EXECVEAT | STATX | OPENAT2 | FACCESSAT2
        | FCHMODAT2 | CONNECT | BIND => Server,
        // Reach outside the program: refused, counted.
        PTRACE | SYSLOG | SETUID | SETGID | SETREUID | SETREGID | SETGROUPS | SETRESUID | SETRESGID | SETFSUID
        | SETFSGID | CAPSET | USELIB | VHANGUP | PIVOT_ROOT | SYSCTL | CHROOT | ACCT | SETTIMEOFDAY | MOUNT
        | UMOUNT2 | SWAPON | SWAPOFF | REBOOT | SETHOSTNAME | SETDOMAINNAME | IOPL | IOPERM | LOOKUP_DCOOKIE
        | KEXEC_LOAD | ADD_KEY | REQUEST_KEY | KEYCTL | UNSHARE | PERF_EVENT_OPEN | FANOTIFY_INIT | FANOTIFY_MARK
        | OPEN_BY_HANDLE_AT | SETNS | INIT_MODULE | DELETE_MODULE | FINIT_MODULE | KEXEC_FILE_LOAD | BPF
        | MOUNT_SETATTR | QUOTACTL | QUOTACTL_FD | OPEN_TREE | MOVE_MOUNT | FSOPEN | FSCONFIG | FSMOUNT | FSPICK
        | STATMOUNT | LISTMOUNT | OPEN_TREE_ATTR => Refused(EPERM),
        CREATE_MODULE | GET_KERNEL_SYMS | QUERY_MODULE | NFSSERVCTL | 181 => Refused(ENOSYS),
        // SysV IPC lives in the host's IPC namespace: keys reach other programs.
        SHMGET | SHMAT | SHMCTL | SHMDT | SEMGET | SEMOP | SEMCTL | SEMTIMEDOP | MSGGET | MSGSND | MSGRCV | MSGCTL => {
            Refused(ENOSYS)
        }
        // io_uring performs opens and more without passing through seccomp.
        IO_URING_SETUP | IO_URING_ENTER | IO_URING_REGISTER => Refused(ENOSYS),
        MQ_OPEN | MQ_UNLINK => Refused(ENOSYS),
        NAME_TO_HANDLE_AT => Refused(EOPNOTSUPP),
        // The *xattrat family (6.13) names paths; not served yet.
        SETXATTRAT | GETXATTRAT | LISTXATTRAT | REMOVEXATTRAT => Refused(ENOSYS),
        // Slots with no system call on x86_64 (tuxcall, security, vserver, …).
        182..=185 | 236 | 335..=423 => Refused(ENOSYS),
        n if n >= MAX_KNOWN => Refused(ENOSYS),
        _ => Native,
    }
}

/// A system call's name, for the server's counts and refusals in the policy file.
pub fn name(nr: u32) -> Option<&'static str> {
    NAMES.iter().find(|(n, _)| *n == nr).map(|(_, s)| *s)
}

/// The number of a system call named in a policy file.
pub fn number(name: &str) -> Option<u32> {
    NAMES.iter().find(|(_, s)| *s == name).map(|(n, _)| *n)
}

const NAMES: &[(u32, &str)] = &[
    (0, "read"),
    (1, "write"),
    (2, "open"),
    (3, "close"),
    (4, "stat"),
    (5, "fstat"),
    (6, "lstat"),
    (7, "poll"),
    (8, "lseek"),
    (9, "mmap"),
    (10, "mprotect"),
    (11, "munmap"),
    (12, "brk"),
    (13, "rt_sigaction"),
    (14, "rt_sigprocmask"),
    (16, "ioctl"),
    (17, "pread64"),
    (18, "pwrite64"),
    (21, "access"),
    (22, "pipe"),
    (29, "shmget"),
    (32, "dup"),
    (33, "dup2"),
    (39, "getpid"),
    (41, "socket"),
    (42, "connect"),
    (43, "accept"),
    (44, "sendto"),
    (45, "recvfrom"),
    (46, "sendmsg"),
    (49, "bind"),
    (50, "listen"),
    (53, "socketpair"),
    (56, "clone"),
    (57, "fork"),
    (58, "vfork"),
    (59, "execve"),
    (60, "exit"),
    (61, "wait4"),
    (62, "kill"),
    (63, "uname"),
    (72, "fcntl"),
    (76, "truncate"),
    (77, "ftruncate"),
    (78, "getdents"),
    (79, "getcwd"),
    (80, "chdir"),
    (81, "fchdir"),
    (82, "rename"),
    (83, "mkdir"),
    (84, "rmdir"),
    (85, "creat"),
    (86, "link"),
    (87, "unlink"),
    (88, "symlink"),
    (89, "readlink"),
    (90, "chmod"),
    (91, "fchmod"),
    (92, "chown"),
    (95, "umask"),
    (101, "ptrace"),
    (102, "getuid"),
    (104, "getgid"),
    (105, "setuid"),
    (106, "setgid"),
    (107, "geteuid"),
    (108, "getegid"),
    (110, "getppid"),
    (112, "setsid"),
    (126, "capset"),
    (133, "mknod"),
    (137, "statfs"),
    (157, "prctl"),
    (158, "arch_prctl"),
    (161, "chroot"),
    (165, "mount"),
    (166, "umount2"),
    (169, "reboot"),
    (170, "sethostname"),
    (186, "gettid"),
    (200, "tkill"),
    (202, "futex"),
    (217, "getdents64"),
    (228, "clock_gettime"),
    (231, "exit_group"),
    (234, "tgkill"),
    (257, "openat"),
    (258, "mkdirat"),
    (262, "newfstatat"),
    (263, "unlinkat"),
    (264, "renameat"),
    (267, "readlinkat"),
    (268, "fchmodat"),
    (269, "faccessat"),
    (272, "unshare"),
    (280, "utimensat"),
    (298, "perf_event_open"),
    (302, "prlimit64"),
    (307, "sendmmsg"),
    (308, "setns"),
    (316, "renameat2"),
    (317, "seccomp"),
    (321, "bpf"),
    (322, "execveat"),
    (332, "statx"),
    (425, "io_uring_setup"),
    (435, "clone3"),
    (436, "close_range"),
    (437, "openat2"),
    (439, "faccessat2"),
    (452, "fchmodat2"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_call_is_served_and_nothing_sensitive_is_native() {
        for nr in [OPEN, OPENAT, OPENAT2, STAT, NEWFSTATAT, STATX, EXECVE, EXECVEAT, FACCESSAT2, FCHMODAT2, CHDIR] {
            assert_eq!(class(nr), Class::Server, "{nr}");
        }
        for nr in [MOUNT, PTRACE, SETUID, IO_URING_SETUP, SHMGET, BPF, UNSHARE, SETNS, CHROOT] {
            assert!(matches!(class(nr), Class::Refused(_)), "{nr}");
        }
        assert_eq!(class(MAX_KNOWN), Class::Refused(errno::ENOSYS));
        assert_eq!(class(u32::MAX), Class::Refused(errno::ENOSYS));
        assert_eq!(class(READ), Class::Native);
        assert_eq!(class(FORK), Class::Native);
        // The library must see the children that share its memory, and answers the
        // getters from its state page.
        assert_eq!(class(CLONE3), Class::Library);
        assert_eq!(class(VFORK), Class::Library);
        assert_eq!(class(UMASK), Class::Library);
        assert_eq!(class(CLONE), Class::NativeIf(ArgCheck::CloneVm));
        for nr in [GETPID, GETUID, GETEUID, GETGID, GETEGID] {
            assert_eq!(class(nr), Class::Library, "{nr}");
        }
    }

    #[test]
    fn names_round_trip() {
        for (nr, n) in NAMES {
            assert_eq!(number(n), Some(*nr));
            assert_eq!(name(*nr), Some(*n));
        }
    }
}
