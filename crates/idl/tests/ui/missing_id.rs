use ictus_idl::{interface, Status};

#[interface(id = 100)]
pub trait NoId {
    fn ping(&self) -> Result<(), Status>;
}

fn main() {}
