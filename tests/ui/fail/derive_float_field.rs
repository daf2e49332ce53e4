// Group 4: `#[derive(KeyPart)]` on a struct with an `f64` field: the error points at the field's type.
use samekey::KeyPart;

#[derive(KeyPart)]
struct Order {
    id: u64,
    price: f64,
}

fn main() {
    let _ = Order { id: 1, price: 0.5 };
}
