use ictus_idl::{interface, Status};

#[interface(id = 100)]
pub trait Mutating {
    #[id(1)]
    fn bump(&mut self) -> Result<u32, Status>;
}

fn main() {}
