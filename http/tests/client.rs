//! The reqwest middleware and the classification against a real server on loopback: the same callId,
//! traceId and Idempotency-Key on every attempt with the attempt number beside them, and the two sides
//! together deduplicating a call whose reply came too late.
#![cfg(feature = "reqwest")]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::Router;
use reqwest_middleware::ClientWithMiddleware;
use samekey::{idempotent, Runtime};
use samekey_http::{send, CallContextLayer, CallHeaders, IdempotencyLayer, RemoteError};

#[derive(Default)]
struct Seen {
    requests: Mutex<Vec<[Option<String>; 4]>>,
    charges: AtomicU32,
}

async fn listen(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

fn client() -> ClientWithMiddleware {
    reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(CallHeaders::new())
        .build()
}

struct Caller {
    rt: Runtime,
    client: ClientWithMiddleware,
    base: String,
}

impl Caller {
    #[idempotent(key = "order", runtime = &self.rt, retries = 3, backoff = "10ms..50ms")]
    async fn charge(&self, order: &str) -> Result<String, RemoteError> {
        let request = self
            .client
            .post(format!("{}/charges", self.base))
            .body(order.to_owned());
        Ok(send(request).await?.text().await.unwrap_or_default())
    }

    #[idempotent(key = "order", runtime = &self.rt, retries = 3, backoff = "10ms..50ms",
                 timeout = "300ms", on_unknown = "rerun")]
    async fn charge_with_timeout(&self, order: &str) -> Result<String, RemoteError> {
        let request = self
            .client
            .post(format!("{}/charges", self.base))
            .body(order.to_owned());
        Ok(send(request).await?.text().await.unwrap_or_default())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_carries_the_same_identity_and_its_number() {
    let seen = Arc::new(Seen::default());
    let app = Router::new().route(
        "/charges",
        post({
            let seen = seen.clone();
            move |headers: HeaderMap| async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let row = [
                    header("x-call-id"),
                    header("x-trace-id"),
                    header("idempotency-key"),
                    header("x-attempt"),
                ];
                let mut requests = seen.requests.lock().unwrap();
                requests.push(row);
                match requests.len() {
                    // Busy, come back at once; then a 503 that asks for no wait.
                    1 => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "0")]).into_response(),
                    2 => (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "0")]).into_response(),
                    _ => (StatusCode::CREATED, "charged").into_response(),
                }
            }
        }),
    );
    let caller = Caller {
        rt: Runtime::builder().node("orders-1").build().unwrap(),
        client: client(),
        base: listen(app).await,
    };
    let (out, report) = samekey::observed(caller.charge("o-1")).await;
    assert_eq!(out.unwrap(), "charged");
    let call_id = report.unwrap().call_id().to_string();
    let requests = seen.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 3);
    for (n, [id, trace, key, attempt]) in requests.iter().enumerate() {
        assert_eq!(id.as_deref(), Some(call_id.as_str()));
        assert_eq!(trace, &requests[0][1], "one traceId");
        assert!(trace.is_some());
        assert_eq!(key.as_deref(), Some(format!("\"{call_id}\"").as_str()));
        assert_eq!(attempt.as_deref(), Some((n + 1).to_string().as_str()));
    }
    // Outside a call, nothing is added.
    let plain = client()
        .post(format!("{}/charges", caller.base))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 201);
    assert_eq!(seen.requests.lock().unwrap()[3], [None, None, None, None]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_too_late_is_neither_charged_twice_nor_lost() {
    let seen = Arc::new(Seen::default());
    let app = Router::new()
        .route(
            "/charges",
            post({
                let seen = seen.clone();
                move |order: String| async move {
                    // The first charge answers after the client's timeout.
                    if seen.charges.fetch_add(1, Ordering::SeqCst) == 0 {
                        tokio::time::sleep(Duration::from_millis(600)).await;
                    }
                    (StatusCode::CREATED, format!("charged {order}"))
                }
            }),
        )
        .layer(IdempotencyLayer::new().retry_after(Duration::from_secs(1)))
        .layer(CallContextLayer::new());
    let caller = Caller {
        rt: Runtime::builder().node("orders-1").build().unwrap(),
        client: client(),
        base: listen(app).await,
    };
    // Attempt 1 times out (unknown); the re-run under the same callId meets the first still running
    // (409, come back in 1 s), then gets its stored response.
    let out = caller.charge_with_timeout("o-7").await.unwrap();
    assert_eq!(out, "charged o-7");
    assert_eq!(seen.charges.load(Ordering::SeqCst), 1, "charged once");
}
