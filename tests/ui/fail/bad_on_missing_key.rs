use samekey::idempotent;

#[idempotent(key = "request_id", on_missing_key = "skip")]
async fn charge(request_id: Option<String>) -> Result<u64, std::io::Error> {
    Ok(1)
}

fn main() {}
