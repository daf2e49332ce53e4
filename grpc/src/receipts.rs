//! The receipt service: `samekey.v1.Receipts/Get`, what a service answers about a callId, for its
//! callers' `lookup`.

use samekey_runtime::{CallId, ReceiptState, Runtime};
use tonic::{Request, Response, Status};

use crate::idempotency::StoredReply;
use crate::proto::receipt::State;
use crate::proto::receipts_server::{Receipts, ReceiptsServer};
use crate::proto::{GetReceiptRequest, Receipt};

/// The receipt service over a runtime's receipts: add [`receipts`]`(&runtime)` to a tonic server.
///
/// A call the [`IdempotencyLayer`](crate::IdempotencyLayer) served under the caller's `x-call-id`
/// answers its stored reply: `SUCCEEDED` with the reply's message bytes for `OK`, else `FAILED` with
/// its code and message. Any other call recorded `SUCCESS` answers its stored value (the JSON of the
/// `#[idempotent]` function's result), `FAILED` its failure (code 0); one still running or `UNKNOWN`
/// answers `PROCESSING`, and a callId the store does not know `NOT_RECEIVED`. A malformed callId is
/// `INVALID_ARGUMENT`; the store failing, `UNAVAILABLE`.
#[derive(Debug, Clone)]
pub struct ReceiptService {
    runtime: Runtime,
}

/// The tonic server of [`ReceiptService`] on `runtime`.
pub fn receipts(runtime: &Runtime) -> ReceiptsServer<ReceiptService> {
    ReceiptsServer::new(ReceiptService {
        runtime: runtime.clone(),
    })
}

fn answer(state: State) -> Receipt {
    Receipt {
        state: state as i32,
        ..Receipt::default()
    }
}

#[tonic::async_trait]
impl Receipts for ReceiptService {
    async fn get(&self, request: Request<GetReceiptRequest>) -> Result<Response<Receipt>, Status> {
        let call_id: CallId = request
            .get_ref()
            .call_id
            .parse()
            .map_err(|e| Status::invalid_argument(format!("`call_id` is not a callId: {e}")))?;
        let receipt = match self.runtime.receipt(&call_id).await {
            Ok(Some(receipt)) => receipt,
            Ok(None) => return Ok(Response::new(answer(State::NotReceived))),
            Err(e) => {
                return Err(Status::unavailable(format!(
                    "the receipt of call {call_id} cannot be read now: {e}"
                )))
            }
        };
        let stored = receipt.outcome.as_deref().unwrap_or_default();
        let processing = || Ok(Response::new(answer(State::Processing)));
        if !matches!(receipt.state, ReceiptState::Success | ReceiptState::Failed) {
            return processing();
        }
        // A reply the idempotency layer stored.
        if let Ok(reply) = serde_json::from_slice::<StoredReply>(stored) {
            let receipt = match (reply.code(), reply.message()) {
                (tonic::Code::Ok, Some(message)) => Receipt {
                    state: State::Succeeded as i32,
                    value: message,
                    ..Receipt::default()
                },
                (code, _) => Receipt {
                    state: State::Failed as i32,
                    code: code as i32,
                    message: reply.status_message(),
                    ..Receipt::default()
                },
            };
            return Ok(Response::new(receipt));
        }
        Ok(Response::new(match receipt.state {
            ReceiptState::Success => Receipt {
                state: State::Succeeded as i32,
                value: stored.to_vec(),
                ..Receipt::default()
            },
            _ => Receipt {
                state: State::Failed as i32,
                message: failure_text(stored),
                ..Receipt::default()
            },
        }))
    }
}

/// A stored failure as text: its message, when it was stored by message, else its JSON.
fn failure_text(stored: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(stored) {
        Ok(serde_json::Value::Object(fields)) => match fields.get("samekey.failure") {
            Some(serde_json::Value::String(message)) => message.clone(),
            _ => serde_json::Value::Object(fields).to_string(),
        },
        Ok(other) => other.to_string(),
        Err(_) => String::from_utf8_lossy(stored).into_owned(),
    }
}
