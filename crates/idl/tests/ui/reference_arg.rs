use ictus_idl::{interface, Status};

#[interface(id = 100)]
pub trait Borrowing {
    #[id(1)]
    fn look(&self, name: &str) -> Result<(), Status>;
}

fn main() {}
