//! The README's async Rust example is `examples/readme.rs`, word for word, and it runs.

mod readme {
    include!("../examples/readme.rs");

    pub fn run() -> Result<(), Box<dyn std::error::Error>> {
        main()
    }
}

/// The fenced `lang` block that follows the heading `heading` in the README.
fn readme_block(heading: &str, lang: &str) -> String {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).expect("README.md");
    let at = text.find(heading).unwrap_or_else(|| panic!("the README has no {heading:?}"));
    let fence = format!("```{lang}\n");
    let start = text[at..].find(&fence).expect("a fenced block") + at + fence.len();
    let len = text[start..].find("```\n").expect("the block's end");
    text[start..start + len].to_owned()
}

#[test]
fn the_readme_example_is_the_example_file() {
    let example = include_str!("../examples/readme.rs");
    assert!(
        readme_block("## From async Rust", "rust") == example,
        "README.md's async example and crates/ipc/examples/readme.rs differ: change both"
    );
}

#[test]
fn the_readme_example_runs() {
    readme::run().expect("the README's async example");
}
