// `#[derive(KeyPart)]` on named, tuple and unit structs, on enums (with a renamed variant and a
// skipped field), on generic types, and the derived types used as key parts.
#![deny(warnings)]
use samekey::{idempotent, Classify, ErrorClass, KeyPart};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(KeyPart, Clone)]
struct OrderId(u64);

#[derive(KeyPart)]
struct Marker;

#[derive(KeyPart, Clone)]
struct Order {
    id: OrderId,
    lines: BTreeMap<String, u32>,
    #[key_part(skip)]
    #[allow(dead_code)]
    price: f64,
}

#[derive(KeyPart, Clone, Copy)]
enum Op {
    Charge,
    #[key_part(rename = "Refund")]
    Reimburse { partial: bool },
    Split(u8, #[key_part(skip)] f32),
}

#[derive(KeyPart)]
struct Wrapper<'a, T: Clone, const N: usize>
where
    T: Send,
{
    items: &'a [T; N],
}

#[derive(KeyPart)]
enum Never {}

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
#[error(transparent)]
struct PayError(#[from] samekey::Error);

impl Classify for PayError {
    fn classify(&self) -> ErrorClass {
        self.0.classify()
    }
}

#[idempotent(key = order.id + op + order)]
async fn charge(order: &Order, op: Op) -> Result<(), PayError> {
    let _ = (order, op);
    Ok(())
}

fn main() {
    let _ = (Marker, OrderId(1));
    let _ = Op::Reimburse { partial: true };
    let _ = Op::Split(1, 0.5);
    let _ = samekey::key::key_bytes(&Wrapper { items: &[1u8; 2] });
    let _: Option<&Never> = None;
    let _ = Op::Charge;
}
