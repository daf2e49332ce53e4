//! samekey's metrics in Prometheus' text format: a few charges against a flaky gateway (the test kit's
//! `Remote`: a 503 that is retried, a lost reply that a lookup settles, a declined card), then what a
//! `/metrics` endpoint would serve.
//!
//! ```text
//! cargo run --example metrics --features metrics
//! ```
//!
//! The exporter here renders on demand (`PrometheusHandle::render`), which is what a service's own
//! `/metrics` route returns (`axum::routing::get(move || async move { handle.render() })`); the
//! exporter's `http-listener` feature serves it on a port of its own instead.

use metrics_exporter_prometheus::PrometheusBuilder;
use samekey::testing::{Fault, Remote, RemoteError, Schedule};
use samekey::{idempotent, Classify, ErrorClass, Runtime};

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, thiserror::Error)]
enum PayError {
    #[error("gateway unavailable (503)")]
    Unavailable,
    #[error("connection reset")]
    Reset,
    #[error("card declined")]
    Declined,
    #[error("{0}")]
    Samekey(String),
}

impl Classify for PayError {
    fn classify(&self) -> ErrorClass {
        match self {
            PayError::Unavailable => ErrorClass::Retryable,
            PayError::Reset => ErrorClass::Unknown,
            PayError::Declined => ErrorClass::Rejected,
            PayError::Samekey(_) => ErrorClass::Permanent,
        }
    }
}

impl From<samekey::Error> for PayError {
    fn from(e: samekey::Error) -> PayError {
        PayError::Samekey(e.to_string())
    }
}

/// What the test kit's gateway answers, as this service's errors.
impl From<RemoteError> for PayError {
    fn from(e: RemoteError) -> PayError {
        match e {
            RemoteError::TimedOut => PayError::Reset,
            RemoteError::Unavailable | RemoteError::RateLimited { .. } => PayError::Unavailable,
            RemoteError::Rejected | RemoteError::Declined => PayError::Declined,
        }
    }
}

/// The orders, and what the gateway (the test kit's `Remote`) does with their first request: order
/// `n` gets a 503 then a success when `n % 5 == 1`, a charge whose reply is lost (a lookup settles it)
/// when `n % 5 == 2`, a declined card on every request when `n % 5 == 3`, and a success otherwise.
const ORDERS: u64 = 20;

fn gateway() -> Remote<u64, PayError> {
    let first_pass = (0..ORDERS).flat_map(|order| match order % 5 {
        1 => vec![Fault::Unavailable, Fault::Ok],
        2 => vec![Fault::LoseReply],
        3 => vec![Fault::Decline],
        _ => vec![Fault::Ok],
    });
    // The second pass sends only the declined orders again (the rest are replays).
    let second_pass = (0..ORDERS).filter(|o| o % 5 == 3).map(|_| Fault::Decline);
    Remote::new(Schedule::of(first_pass.chain(second_pass)))
}

struct Payments {
    rt: Runtime,
    gateway: Remote<u64, PayError>,
}

impl Payments {
    #[idempotent(key = "order", scope = "payments.charge", runtime = &self.rt, timeout = "1s",
                 backoff = "10ms..100ms", budget = "gateway", lookup = |c| self.gateway.status(c))]
    async fn charge(&self, order: u64) -> Result<u64, PayError> {
        self.gateway.call(order.to_string(), || order * 100).await
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    let payments = Payments {
        rt: Runtime::builder().node("metrics-demo").build()?,
        gateway: gateway(),
    };
    for order in 0..ORDERS {
        let _ = payments.charge(order).await;
    }
    // The same orders again (a client that retried): answered from the store.
    for order in 0..ORDERS {
        let _ = payments.charge(order).await;
    }
    print!("{}", handle.render());
    Ok(())
}
