// Methods: `&self` with the default runtime, `&mut self` with `runtime = &self.rt`, `lookup` as a
// closure that captures `self` and as a path, `self` and its fields as key parts.
#![deny(warnings)]
use samekey::{idempotent, CallId, Classify, ErrorClass, RemoteStatus, Runtime};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
enum PayError {
    #[error("timed out")]
    Timeout,
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for PayError {
    fn classify(&self) -> ErrorClass {
        match self {
            PayError::Timeout => ErrorClass::Unknown,
            PayError::Samekey(e) => e.classify(),
        }
    }
}

#[derive(Clone, samekey::KeyPart)]
struct Tenant {
    id: u64,
}

struct Gateway;

impl Gateway {
    async fn status(&self, _call: &CallId) -> Result<RemoteStatus<u64, PayError>, std::io::Error> {
        Ok(RemoteStatus::NotReceived)
    }
}

struct Service {
    rt: Runtime,
    tenant: Tenant,
    gateway: Gateway,
    sent: u64,
}

impl Service {
    #[idempotent(key = "self.tenant + order", timeout = "3s", lookup = |call| self.gateway.status(call))]
    async fn charge(&self, order: u64) -> Result<u64, PayError> {
        let _ = samekey::current();
        Ok(order + self.tenant.id)
    }

    #[idempotent(key = self.tenant.id + order, runtime = &self.rt, on_unknown = "rerun")]
    async fn charge_mut(&mut self, order: u64) -> Result<u64, PayError> {
        self.sent += 1;
        if self.sent > 3 {
            return Err(PayError::Timeout);
        }
        Ok(self.sent + order)
    }

    async fn remote_status(call: &CallId) -> Result<RemoteStatus<u64, PayError>, String> {
        let _ = call;
        Ok(RemoteStatus::Processing)
    }

    #[idempotent(key = "order", timeout = "1s", lookup = Self::remote_status, runtime = &self.rt)]
    async fn refund(&self, order: u64) -> Result<u64, PayError> {
        Ok(order)
    }
}

fn main() {}
