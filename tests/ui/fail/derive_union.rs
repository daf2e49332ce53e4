// `#[derive(KeyPart)]` does not support unions.
use samekey::KeyPart;

#[derive(KeyPart)]
union Bits {
    int: u32,
    float: f32,
}

fn main() {}
