use ictus_idl::{interface, Status};

#[interface(id = 100)]
pub trait Confused {
    #[id(1)]
    #[oneway]
    fn fire(&self) -> Result<u32, Status>;
}

fn main() {}
