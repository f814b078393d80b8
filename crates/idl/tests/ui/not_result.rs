use ictus_idl::interface;

#[interface(id = 100)]
pub trait Plain {
    #[id(1)]
    fn count(&self) -> u32;
}

fn main() {}
