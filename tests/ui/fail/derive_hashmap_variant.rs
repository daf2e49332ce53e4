// Group 4: `#[derive(KeyPart)]` on an enum whose variant holds a `HashSet`: the error points at it.
use samekey::KeyPart;
use std::collections::HashSet;

#[derive(KeyPart)]
enum Selection {
    All,
    Some(HashSet<u64>),
}

fn main() {
    let _ = (Selection::All, Selection::Some(HashSet::new()));
}
