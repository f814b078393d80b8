use ictus_idl::{interface, Status};

pub struct Opaque;

#[interface(id = 100)]
pub trait Leaky {
    #[id(1)]
    fn take(&self, o: Opaque) -> Result<(), Status>;
}

fn main() {}
