//! The policy file: what a program under `ictus unix run` may see and do.
//!
//! ```text
//! # comments and blank lines are ignored
//! root /srv/jail            # the host directory shown as / (default: /)
//! bind /home/me/src /src    # host directory or file shown at a view path
//! bind /usr /usr ro         # ... read-only
//! ro /etc                   # a view path made read-only
//! hide /home/me/.ssh        # a view path that does not exist for the program
//! network off               # only AF_UNIX sockets (default: on)
//! refuse ptrace EPERM       # a system call refused with this errno, counted
//! refuse getpid             # ... with EPERM
//! ```
//!
//! Parsing is pure: [`Policy::parse`] checks every line and says which one is wrong.
//! Host paths are made canonical by the server when it loads the policy.
//!
//! A policy that contradicts itself is refused, naming both lines, rather than read
//! with the last line winning: the root given twice (`root`, or `bind HOST /`), one
//! view path bound twice, `network on` and `network off`, a call refused with two
//! errnos, a view path both hidden and read-only or bound, a bind said `rw` that an
//! `ro` line makes read-only. Saying the same thing twice is not a contradiction.
//! Control characters (a NUL in a path would be cut short by the kernel) are refused.

use std::path::{Component, Path, PathBuf};

use ictus_unix_emul::sysno;

/// A host directory (or file) shown at a view path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Where the program sees it (absolute, normalised).
    pub view: PathBuf,
    /// What it is on the host (absolute).
    pub host: PathBuf,
    /// Writes refused with `EROFS`.
    pub readonly: bool,
}

/// A parsed policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The view: `/` first, then bind mounts in file order.
    pub mounts: Vec<Mount>,
    /// View paths made read-only.
    pub readonly: Vec<PathBuf>,
    /// View paths that do not exist for the program.
    pub hidden: Vec<PathBuf>,
    /// Sockets other than `AF_UNIX` allowed.
    pub network: bool,
    /// System calls refused, with their errno.
    pub refused: Vec<(u32, i32)>,
}

impl Default for Policy {
    /// The host's own tree, writable as the user may, network on, nothing refused
    /// beyond the table's defaults.
    fn default() -> Policy {
        Policy {
            mounts: vec![Mount { view: "/".into(), host: "/".into(), readonly: false }],
            readonly: Vec::new(),
            hidden: Vec::new(),
            network: true,
            refused: Vec::new(),
        }
    }
}

/// Why a policy file is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy line {line}: {what}")]
pub struct PolicyError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub what: String,
}

/// Normalise an absolute path lexically (`.` and `..` removed, no trailing slash).
/// View paths in a policy name places in the view, so this is their meaning.
pub fn normalize(p: &Path) -> Option<PathBuf> {
    if !p.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

fn errno_named(s: &str) -> Option<i32> {
    use sysno::errno::*;
    Some(match s {
        "EPERM" => EPERM,
        "ENOENT" => ENOENT,
        "EACCES" => EACCES,
        "ENOSYS" => ENOSYS,
        "EINVAL" => EINVAL,
        "EROFS" => EROFS,
        "EIO" => EIO,
        "EAFNOSUPPORT" => EAFNOSUPPORT,
        "EOPNOTSUPP" => EOPNOTSUPP,
        _ => match s.parse::<i32>() {
            Ok(n) if (1..4096).contains(&n) => n,
            _ => return None,
        },
    })
}

impl Policy {
    /// Whether the view confines paths: something hidden, or a tree other than the
    /// host's own (a root or bind mounts). Then `AF_UNIX` datagram sockets are
    /// refused: `sendto`/`sendmsg` would resolve a destination path in the host's
    /// tree, past the view, and the filter cannot read their address. Read-only
    /// paths confine nothing here (a socket on a read-only tree still takes
    /// datagrams).
    pub fn confines_paths(&self) -> bool {
        !self.hidden.is_empty() || self.mounts.len() != 1 || self.mounts[0].host != Path::new("/")
    }

    /// Parse a policy file's text.
    pub fn parse(text: &str) -> Result<Policy, PolicyError> {
        let mut p = Policy::default();
        let mut root_seen = false;
        // Where each setting was said: (what, line), to name both lines of a contradiction.
        let mut said: Vec<(Said, usize)> = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let err = |what: String| PolicyError { line, what };
            if let Some(c) = raw.chars().find(|c| c.is_control() && *c != '\t') {
                return Err(err(format!("control character {c:?}")));
            }
            let content = raw.split('#').next().unwrap_or("");
            let words: Vec<&str> = content.split_whitespace().collect();
            let Some((&verb, rest)) = words.split_first() else { continue };
            let view_path =
                |s: &str| normalize(Path::new(s)).ok_or_else(|| err(format!("{s:?} is not an absolute path")));
            let host_path = |s: &str| {
                if Path::new(s).is_absolute() {
                    Ok(PathBuf::from(s))
                } else {
                    Err(err(format!("{s:?} is not an absolute host path")))
                }
            };
            match (verb, rest) {
                ("root", [host]) => {
                    if root_seen {
                        return Err(err("root given twice".into()));
                    }
                    root_seen = true;
                    p.mounts[0].host = host_path(host)?;
                }
                ("bind", [host, view]) | ("bind", [host, view, _]) => {
                    let readonly = match rest.get(2) {
                        None => false,
                        Some(&"ro") => true,
                        Some(&"rw") => false,
                        Some(o) => return Err(err(format!("bind takes ro or rw, not {o:?}"))),
                    };
                    let view = view_path(view)?;
                    let host = host_path(host)?;
                    if view == Path::new("/") {
                        p.mounts[0] = Mount { view, host, readonly };
                        root_seen = true;
                    } else {
                        p.mounts.retain(|m| m.view != view);
                        p.mounts.push(Mount { view, host, readonly });
                    }
                }
                ("ro", [view]) => p.readonly.push(view_path(view)?),
                ("hide", [view]) => {
                    let v = view_path(view)?;
                    if v == Path::new("/") {
                        return Err(err("hiding / leaves nothing to run".into()));
                    }
                    p.hidden.push(v);
                }
                ("network", ["on"]) => p.network = true,
                ("network", ["off"]) => p.network = false,
                ("refuse", [name]) | ("refuse", [name, _]) => {
                    let nr = sysno::number(name).ok_or_else(|| err(format!("unknown system call {name:?}")))?;
                    let errno = match rest.get(1) {
                        None => sysno::errno::EPERM,
                        Some(e) => errno_named(e).ok_or_else(|| err(format!("unknown errno {e:?}")))?,
                    };
                    p.refused.retain(|r| r.0 != nr);
                    p.refused.push((nr, errno));
                }
                _ => return Err(err(format!("cannot read {:?}", content.trim()))),
            }
            for new in Said::of(verb, rest, &p) {
                if let Some((old, at)) = said.iter().find(|(old, _)| old.contradicts(&new)) {
                    return Err(err(format!("{} contradicts line {at}: {}", new.text(), old.text())));
                }
                said.push((new, line));
            }
        }
        Ok(p)
    }

    /// The errno this policy gives a refused call, if it refuses it.
    pub fn refusal(&self, nr: u32) -> Option<i32> {
        self.refused.iter().find(|r| r.0 == nr).map(|r| r.1)
    }
}

/// One setting a policy line makes, to find contradictions between lines.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Said {
    /// What `/` is (`root`, `bind HOST /`).
    Root(PathBuf),
    /// A view path bound (with `rw` said, if it was).
    Bind { view: PathBuf, host: PathBuf, rw: bool },
    /// A view path made read-only.
    Ro(PathBuf),
    /// A view path hidden.
    Hide(PathBuf),
    /// The network on or off.
    Network(bool),
    /// A call (its name and number) refused with an errno.
    Refuse(String, u32, i32),
}

impl Said {
    /// What a line (already parsed into `p`) says.
    fn of(verb: &str, rest: &[&str], p: &Policy) -> Vec<Said> {
        let view = |s: &str| normalize(Path::new(s)).unwrap_or_default();
        match (verb, rest) {
            ("root", [host]) => vec![Said::Root(PathBuf::from(host))],
            ("bind", [host, v, ..]) if view(v) == Path::new("/") => vec![Said::Root(PathBuf::from(host))],
            ("bind", [host, v, ..]) => {
                vec![Said::Bind { view: view(v), host: PathBuf::from(host), rw: rest.get(2) == Some(&"rw") }]
            }
            ("ro", [v]) => vec![Said::Ro(view(v))],
            ("hide", [v]) => vec![Said::Hide(view(v))],
            ("network", _) => vec![Said::Network(p.network)],
            ("refuse", [name, ..]) => sysno::number(name)
                .and_then(|nr| p.refusal(nr).map(|e| Said::Refuse((*name).to_string(), nr, e)))
                .into_iter()
                .collect(),
            _ => Vec::new(),
        }
    }

    fn contradicts(&self, new: &Said) -> bool {
        use Said::*;
        match (self, new) {
            (Root(_), Root(_)) => true,
            (Bind { view: v, host: h, .. }, Bind { view: w, host: g, .. }) => v == w && h != g,
            (Network(a), Network(b)) => a != b,
            (Refuse(_, n, e), Refuse(_, m, f)) => n == m && e != f,
            (Hide(v), Ro(w)) | (Ro(w), Hide(v)) => v == w,
            (Hide(v), Bind { view: w, .. }) | (Bind { view: w, .. }, Hide(v)) => v == w,
            (Ro(v), Bind { view: w, rw: true, .. }) | (Bind { view: w, rw: true, .. }, Ro(v)) => v == w,
            _ => false,
        }
    }

    fn text(&self) -> String {
        match self {
            Said::Root(h) => format!("/ is {}", h.display()),
            Said::Bind { view, host, rw } => {
                format!("{} is {}{}", view.display(), host.display(), if *rw { " rw" } else { "" })
            }
            Said::Ro(v) => format!("{} is read-only", v.display()),
            Said::Hide(v) => format!("{} is hidden", v.display()),
            Said::Network(on) => format!("network {}", if *on { "on" } else { "off" }),
            Said::Refuse(name, _, e) => format!("{name} is refused with errno {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_hidden_path_or_another_tree_confines_paths() {
        assert!(!Policy::default().confines_paths());
        for (text, confines) in [
            ("ro /etc\nnetwork off\nrefuse ptrace EPERM\n", false),
            ("hide /etc/shadow\n", true),
            ("root /srv/jail\n", true),
            ("bind /tmp /mnt\n", true),
        ] {
            assert_eq!(Policy::parse(text).unwrap().confines_paths(), confines, "{text}");
        }
    }

    #[test]
    fn a_full_policy_parses() {
        let p = Policy::parse(
            "# view\nroot /srv/jail\nbind /home/me/src /src\nbind /usr /usr ro\nro /etc\nhide /src/../secret\nnetwork off\nrefuse ptrace EPERM\nrefuse getpid 13\n",
        )
        .unwrap();
        assert_eq!(p.mounts[0].host, PathBuf::from("/srv/jail"));
        assert_eq!(p.mounts.len(), 3);
        assert!(p.mounts[2].readonly);
        assert_eq!(p.hidden, vec![PathBuf::from("/secret")]);
        assert!(!p.network);
        assert_eq!(p.refusal(sysno::GETPID), Some(13));
        assert_eq!(p.refusal(sysno::PTRACE), Some(1));
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, line) in [
            ("bind rel /x", 1),
            ("\nbind /a b", 2),
            ("hide /", 1),
            ("refuse nosuchcall", 1),
            ("refuse getpid EWHAT", 1),
            ("network maybe", 1),
            ("root /a\nroot /b", 2),
            ("frobnicate", 1),
            ("bind /a /b rx", 1),
        ] {
            assert_eq!(Policy::parse(text).unwrap_err().line, line, "{text:?}");
        }
    }

    /// A policy that says two things of one setting is refused, naming both lines;
    /// saying one thing twice is not a contradiction.
    #[test]
    fn contradictions_are_refused_naming_both_lines() {
        for (text, line, earlier) in [
            ("network on\nnetwork off", 2, 1),
            ("refuse ptrace EPERM\n\nrefuse ptrace EACCES", 3, 1),
            ("refuse ptrace\nrefuse ptrace 13", 2, 1),
            ("bind /a /x\nbind /b /x/", 2, 1),
            ("bind /a /\nbind /b /", 2, 1),
            ("root /a\nbind /b /.", 2, 1),
            ("hide /etc\nro /etc/", 2, 1),
            ("ro /etc\nhide /etc/../etc", 2, 1),
            ("bind /a /x\nhide /x", 2, 1),
            ("hide /x\n# comment\nbind /a /x ro", 3, 1),
            ("bind /a /x rw\nro /x", 2, 1),
            ("ro /x\nbind /a /x rw", 2, 1),
        ] {
            let e = Policy::parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.what.contains(&format!("contradicts line {earlier}")), "{text:?}: {e}");
        }
        for same in [
            "network off\nnetwork off",
            "refuse ptrace EPERM\nrefuse ptrace",
            "bind /a /x\nbind /a /x ro",
            "hide /x\nhide /x",
            "ro /x\nro /x",
            "bind /a /x\nro /x",
            "bind /a /x\nhide /x/secret",
        ] {
            assert!(Policy::parse(same).is_ok(), "{same:?}");
        }
        let e = Policy::parse("ro /a\0b").unwrap_err();
        assert!(e.what.contains("control character"), "{e}");
        assert!(Policy::parse("ro\t/a").is_ok());
    }

    #[test]
    fn normalize_is_lexical() {
        assert_eq!(normalize(Path::new("/a/./b/../c/")), Some(PathBuf::from("/a/c")));
        assert_eq!(normalize(Path::new("/../..")), Some(PathBuf::from("/")));
        assert_eq!(normalize(Path::new("a")), None);
    }
}
