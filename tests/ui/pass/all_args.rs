// Every argument at once (bare key form, verify, window, lookup closure, runtime), and the same
// with the string forms; raw identifiers in the name and the key.
#![deny(warnings)]
use samekey::{idempotent, CallId, Classify, ErrorClass, RemoteStatus, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum SignError {
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for SignError {
    fn classify(&self) -> ErrorClass {
        match self {
            SignError::Samekey(e) => e.classify(),
        }
    }
}

async fn ask(_: &CallId) -> Result<RemoteStatus<u32, SignError>, std::io::Error> {
    Ok(RemoteStatus::NotReceived)
}

#[idempotent(
    key = user + "sign-in",
    scope = "users.sign_in",
    prefix = "sgn",
    retries = 5,
    backoff = "200ms..5s",
    jitter = 0.1,
    timeout = "2s",
    ttl = "7d",
    window = "1d",
    verify = device + points,
    lookup = |call| ask(call),
    runtime = samekey::__private::default_runtime(),
    on_busy = "reject",
    inputs = "user, device",
)]
async fn sign_in(user: u64, device: String, points: u32) -> Result<u32, SignError> {
    Ok(points + device.len() as u32 + user as u32)
}

#[idempotent(key = "r#type + user", verify = "points", retries = 0, jitter = 0, backoff = "1s..1s", on_unknown = "hold", timeout = "1m", ttl = "1h30m")]
async fn r#move(r#type: &str, user: u64, points: u32, rt: &Runtime) -> Result<u32, SignError> {
    let _ = (r#type, user, rt);
    Ok(points)
}

fn main() {}
