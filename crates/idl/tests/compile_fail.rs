//! Misuse the `#[interface]` macro must reject, with a message that says why.

#[test]
fn misuse_is_rejected() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
