// `#[key_part(...)]` on a field only knows `skip`.
use samekey::KeyPart;

#[derive(KeyPart)]
struct Order {
    id: u64,
    #[key_part(ignore)]
    note: String,
}

fn main() {}
