// Two variants that encode under the same name would give two different values the same key: the
// second is refused, at its `rename`.
use samekey::KeyPart;

#[derive(KeyPart)]
enum Plan {
    #[key_part(rename = "Basic")]
    Starter,
    Basic,
    #[key_part(rename = "Gold")]
    Premium,
    #[key_part(rename = "Gold")]
    Platinum,
}

fn main() {}
