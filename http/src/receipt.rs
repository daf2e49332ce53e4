//! Receipt endpoints: what a service answers about a callId (`GET …/receipts/{callId}`), for its
//! callers' `lookup`.

use serde::{Deserialize, Serialize};

/// A receipt as a service's receipt endpoint answers it (`GET …/receipts/{callId}`): what became of
/// the call with that callId on its side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ReceiptAnswer<T> {
    /// It took effect, with this value.
    Succeeded {
        /// The call's result.
        value: T,
    },
    /// It failed for good.
    Failed {
        /// Why.
        error: String,
    },
    /// It is still running.
    Processing,
    /// Nothing of it arrived.
    NotReceived,
}

#[cfg(feature = "axum")]
mod endpoint {
    use axum::extract::{Path, State};
    use axum::http::{header, StatusCode};
    use axum::response::{IntoResponse, Response};
    use samekey_runtime::{CallId, ReceiptState, Runtime};

    use super::ReceiptAnswer;

    /// An axum router serving `GET /receipts/{call_id}` from `runtime`'s receipts (feature `axum`):
    /// the answer a caller's `lookup_receipt` (feature `reqwest`) reads. A call recorded `SUCCESS`
    /// answers its stored value, `FAILED` its failure, one still running or `UNKNOWN` `processing`, and
    /// a callId the store does not know a 404 (not received). A request the
    /// [`IdempotencyLayer`](crate::IdempotencyLayer) served under the caller's `X-Call-Id` answers its
    /// stored response: the body of a 2xx as the value, another status as the failure. Nest it where your
    /// callers expect it: `Router::new().merge(samekey_http::receipts(&rt))`.
    pub fn receipts(runtime: &Runtime) -> axum::Router {
        axum::Router::new()
            .route("/receipts/{call_id}", axum::routing::get(answer))
            .with_state(runtime.clone())
    }

    async fn answer(State(runtime): State<Runtime>, Path(call_id): Path<String>) -> Response {
        let Ok(call_id) = call_id.parse::<CallId>() else {
            return (StatusCode::BAD_REQUEST, "not a callId").into_response();
        };
        let receipt = match runtime.receipt(&call_id).await {
            Ok(Some(receipt)) => receipt,
            Ok(None) => return StatusCode::NOT_FOUND.into_response(),
            Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
        };
        let stored = receipt.outcome.as_deref().unwrap_or_default();
        // A response the Idempotency-Key layer stored: its body is the call's value (2xx) or failure.
        if let Ok(response) = serde_json::from_slice::<crate::StoredResponse>(stored) {
            return answer_response(&response);
        }
        let answer = match receipt.state {
            ReceiptState::Success => match serde_json::from_slice(stored) {
                Ok(value) => ReceiptAnswer::Succeeded { value },
                Err(_) => ReceiptAnswer::Processing,
            },
            ReceiptState::Failed => ReceiptAnswer::Failed {
                error: failure_text(stored),
            },
            _ => ReceiptAnswer::<serde_json::Value>::Processing,
        };
        let body = serde_json::to_vec(&answer).unwrap_or_default();
        ([(header::CONTENT_TYPE, "application/json")], body).into_response()
    }

    /// The answer about a call whose receipt holds a stored response.
    fn answer_response(response: &crate::StoredResponse) -> Response {
        use base64::Engine as _;
        let body = base64::engine::general_purpose::STANDARD
            .decode(&response.body)
            .unwrap_or_default();
        let answer = if (200..300).contains(&response.status) {
            match serde_json::from_slice::<serde_json::Value>(&body) {
                Ok(value) => ReceiptAnswer::Succeeded { value },
                Err(_) => ReceiptAnswer::Succeeded {
                    value: serde_json::Value::String(String::from_utf8_lossy(&body).into_owned()),
                },
            }
        } else {
            ReceiptAnswer::Failed {
                error: format!(
                    "answered {}: {}",
                    response.status,
                    String::from_utf8_lossy(&body)
                ),
            }
        };
        let body = serde_json::to_vec(&answer).unwrap_or_default();
        ([(header::CONTENT_TYPE, "application/json")], body).into_response()
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
}

#[cfg(feature = "axum")]
pub use endpoint::receipts;
