// Group 5: `on_unknown` together with `lookup`: the lookup decides.
#[path = "../common/mod.rs"]
mod common;
use common::PayError;
use samekey::idempotent;

async fn status(
    _: &samekey::CallId,
) -> Result<samekey::RemoteStatus<u64, PayError>, std::io::Error> {
    Ok(samekey::RemoteStatus::NotReceived)
}

#[idempotent(key = "order_id", lookup = status, on_unknown = "rerun")]
async fn charge(order_id: u64) -> Result<u64, PayError> {
    Ok(order_id)
}

fn main() {}
