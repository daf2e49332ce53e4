//! samekey's metrics in Prometheus' text format: a few charges against a flaky gateway (a 503 that is
//! retried, a lost reply that a lookup settles, a declined card), then what a `/metrics` endpoint would
//! serve.
//!
//! ```text
//! cargo run --example metrics --features metrics
//! ```
//!
//! The exporter here renders on demand (`PrometheusHandle::render`), which is what a service's own
//! `/metrics` route returns (`axum::routing::get(move || async move { handle.render() })`); the
//! exporter's `http-listener` feature serves it on a port of its own instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use metrics_exporter_prometheus::PrometheusBuilder;
use samekey::{idempotent, CallId, Classify, ErrorClass, RemoteStatus, Runtime};

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

/// A gateway that fails the first request of some orders, and keeps its receipts by request id.
#[derive(Default)]
struct Gateway {
    receipts: Mutex<HashMap<String, u64>>,
    seen: Mutex<HashMap<u64, u32>>,
}

impl Gateway {
    async fn charge(&self, request_id: &CallId, order: u64) -> Result<u64, PayError> {
        let nth = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            let n = seen.entry(order).or_default();
            *n += 1;
            *n
        };
        match (order % 5, nth) {
            (1, 1) => Err(PayError::Unavailable),
            (2, 1) => {
                // Charged, but the reply is lost.
                self.receipts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(request_id.to_string(), order * 100);
                Err(PayError::Reset)
            }
            (3, _) => Err(PayError::Declined),
            _ => {
                self.receipts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(request_id.to_string(), order * 100);
                Ok(order * 100)
            }
        }
    }

    async fn status(&self, request_id: &CallId) -> Result<RemoteStatus<u64, PayError>, String> {
        let receipts = self.receipts.lock().unwrap_or_else(|p| p.into_inner());
        Ok(match receipts.get(request_id.as_str()) {
            Some(amount) => RemoteStatus::Succeeded(*amount),
            None => RemoteStatus::NotReceived,
        })
    }
}

struct Payments {
    rt: Runtime,
    gateway: Arc<Gateway>,
}

impl Payments {
    #[idempotent(key = "order", scope = "payments.charge", runtime = &self.rt, timeout = "1s",
                 backoff = "10ms..100ms", budget = "gateway", lookup = |c| self.gateway.status(c))]
    async fn charge(&self, order: u64) -> Result<u64, PayError> {
        let cx = samekey::current();
        self.gateway.charge(cx.call_id(), order).await
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    let payments = Payments {
        rt: Runtime::builder().node("metrics-demo").build()?,
        gateway: Arc::default(),
    };
    for order in 0..20 {
        let _ = payments.charge(order).await;
    }
    // The same orders again (a client that retried): answered from the store.
    for order in 0..20 {
        let _ = payments.charge(order).await;
    }
    print!("{}", handle.render());
    Ok(())
}
