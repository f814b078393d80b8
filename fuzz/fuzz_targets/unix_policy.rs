//! The Unix server's policy file and view: any text parses or is refused with a line
//! number; a parsed view resolves any path without panicking.
#![no_main]
use libfuzzer_sys::fuzz_target;

struct Nothing;
impl ictus_unix_server::view::Lookup for Nothing {
    fn node(&self, _: &std::path::Path) -> ictus_unix_server::view::Node {
        ictus_unix_server::view::Node::Other
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match ictus_unix_server::policy::Policy::parse(text) {
        Ok(p) => {
            let v = ictus_unix_server::view::View::new(&p);
            let _ = v.resolve(std::path::Path::new("/"), data, true, &Nothing);
        }
        Err(e) => assert!(e.line >= 1 && e.line <= text.lines().count().max(1)),
    }
});
