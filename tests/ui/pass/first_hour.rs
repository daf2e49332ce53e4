// What a new user writes, compiled with every warning an error: a one-line body, a `lookup` closure
// over a gateway whose status method takes `&str`, an error type holding `io::Error` (no serde), an
// `Option` key part.
#![deny(warnings)]
use samekey::{idempotent, Classify, ErrorClass, RemoteStatus};

#[derive(Debug, thiserror::Error)]
enum PayError {
    #[error("card declined")]
    Declined,
    #[error("network: {0}")]
    Network(#[from] std::io::Error),
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for PayError {
    fn classify(&self) -> ErrorClass {
        match self {
            PayError::Declined => ErrorClass::Rejected,
            PayError::Network(e) => e.classify(),
            PayError::Samekey(e) => e.classify(),
        }
    }
}

enum GatewayStatus {
    Charged(u64),
    Declined,
    Pending,
    NotFound,
}

struct Gateway;

impl Gateway {
    async fn status(&self, _call_id: &str) -> Result<GatewayStatus, std::io::Error> {
        Ok(GatewayStatus::NotFound)
    }
}

struct Payments {
    gateway: Gateway,
}

impl Payments {
    #[idempotent(key = "order_id", timeout = "3s", lookup = |call| async move {
        Ok::<_, std::io::Error>(match self.gateway.status(call).await? {
            GatewayStatus::Charged(cents) => RemoteStatus::Succeeded(cents),
            GatewayStatus::Declined => RemoteStatus::Failed(PayError::Declined),
            GatewayStatus::Pending => RemoteStatus::Processing,
            GatewayStatus::NotFound => RemoteStatus::NotReceived,
        })
    })]
    async fn charge(&self, order_id: &str, cents: u64) -> Result<u64, PayError> { Ok(cents) }

    #[idempotent(key = "request_id", on_missing_key = "run")]
    async fn refund(&self, request_id: Option<String>, cents: u64) -> Result<u64, PayError> { Ok(cents) }
}

fn main() {
    let _ = Payments { gateway: Gateway };
    let _ = (GatewayStatus::Charged(1), GatewayStatus::Declined, GatewayStatus::Pending);
}
