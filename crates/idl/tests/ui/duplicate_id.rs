use ictus_idl::{interface, Status};

#[interface(id = 100)]
pub trait Twice {
    #[id(1)]
    fn a(&self) -> Result<(), Status>;
    #[id(1)]
    fn b(&self) -> Result<(), Status>;
}

fn main() {}
