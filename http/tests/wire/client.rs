//! The reqwest middleware and the classification against a real server on loopback: the same callId,
//! traceId and Idempotency-Key (or the key a user maps) on every attempt with the attempt number
//! beside them; transport failures and statuses classified, and a classification of one's own; the
//! receipt endpoint's answers as a lookup reads them; and the two sides together deduplicating a call
//! whose reply came too late.
#![cfg(feature = "reqwest")]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Path;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{any, post};
use axum::Router;
use reqwest_middleware::ClientWithMiddleware;
use samekey::{idempotent, Classify, ErrorClass, Runtime};
use samekey_http::{
    classify_status, send, send_with, CallContextLayer, CallHeaders, IdempotencyLayer, RemoteError,
};

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

    /// As `charge`, its key's digest recorded: what a mapped Idempotency-Key is made of.
    #[idempotent(key = "order", runtime = &self.rt, retries = 3, backoff = "10ms..50ms")]
    async fn charge_recording_key(
        &self,
        order: &str,
        keys: &Mutex<Vec<String>>,
    ) -> Result<String, RemoteError> {
        keys.lock().unwrap().push(samekey::current().key().to_hex());
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

/// A charges endpoint that records each request's identity headers, answering the first "busy"
/// (429), the second "unavailable" (503), both asking for no wait, and the others "charged".
fn recording_charges(seen: &Arc<Seen>) -> Router {
    let seen = seen.clone();
    Router::new().route(
        "/charges",
        post(move |headers: HeaderMap| async move {
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
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attempt_carries_the_same_identity_and_its_number() {
    let seen = Arc::new(Seen::default());
    let caller = Caller {
        rt: Runtime::builder().node("orders-1").build().unwrap(),
        client: client(),
        base: listen(recording_charges(&seen)).await,
    };
    let (out, report) = samekey::observe::observed(caller.charge("o-1")).await;
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

/// A key the user maps the call to is sent as the `Idempotency-Key` of every attempt, the same one,
/// beside the callId.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapped_key_is_the_same_on_every_attempt() {
    let seen = Arc::new(Seen::default());
    let caller = Caller {
        rt: Runtime::builder().node("orders-1").build().unwrap(),
        client: reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
            .with(CallHeaders::new().key(|cx| format!("pay:{}", cx.key().to_hex())))
            .build(),
        base: listen(recording_charges(&seen)).await,
    };
    let keys = Mutex::new(Vec::new());
    let (out, report) = samekey::observe::observed(caller.charge_recording_key("o-3", &keys)).await;
    assert_eq!(out.unwrap(), "charged");
    let call_id = report.unwrap().call_id().to_string();
    let digests = keys.lock().unwrap().clone();
    assert_eq!(digests.len(), 3, "three attempts");
    let expected = format!("\"pay:{}\"", digests[0]);
    let requests = seen.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 3);
    for [id, _, key, _] in &requests {
        assert_eq!(key.as_deref(), Some(expected.as_str()), "the mapped key");
        assert_eq!(id.as_deref(), Some(call_id.as_str()));
    }
}

/// A client that sends nowhere: a port nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Without a response: a connection refused sent nothing (retryable); a timeout after the request
/// reached the server may have taken effect (unknown).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transport_failures_are_classified_by_whether_the_request_went_out() {
    let refused = send(client().post(format!("http://127.0.0.1:{}/charges", closed_port())))
        .await
        .expect_err("nothing listens");
    assert!(matches!(refused, RemoteError::Transport(_)), "{refused}");
    assert_eq!(refused.classify(), ErrorClass::Retryable, "{refused}");

    let arrived = Arc::new(AtomicU32::new(0));
    let app = Router::new().route(
        "/charges",
        post({
            let arrived = arrived.clone();
            move || async move {
                arrived.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(2)).await;
                "charged, too late"
            }
        }),
    );
    let base = listen(app).await;
    let request = client()
        .post(format!("{base}/charges"))
        .timeout(Duration::from_millis(200));
    let timed_out = send(request).await.expect_err("the client gave up");
    assert!(
        matches!(timed_out, RemoteError::Transport(_)),
        "{timed_out}"
    );
    assert_eq!(arrived.load(Ordering::SeqCst), 1, "the request went out");
    assert_eq!(timed_out.classify(), ErrorClass::Unknown, "{timed_out}");
}

/// A response of status `code`, with `Retry-After: secs` if given.
fn answer(code: u16, retry_after: Option<u64>) -> impl IntoResponse {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST);
    let mut headers = HeaderMap::new();
    if let Some(secs) = retry_after {
        headers.insert("retry-after", secs.into());
    }
    (status, headers, format!("answered {code}"))
}

/// Answers `/status/{code}` with that status, and `/status/{code}/retry-after/{secs}` with a
/// `Retry-After` too, to any method.
async fn statuses() -> String {
    let app = Router::new()
        .route(
            "/status/{code}",
            any(|Path(code): Path<u16>| async move { answer(code, None) }),
        )
        .route(
            "/status/{code}/retry-after/{secs}",
            any(|Path((code, secs)): Path<(u16, u64)>| async move { answer(code, Some(secs)) }),
        );
    listen(app).await
}

/// The class of what `method path` gets from `base`, by `send`.
async fn class_of(base: &str, method: Method, path: &str) -> ErrorClass {
    let error = send(client().request(method, format!("{base}{path}")))
        .await
        .expect_err("not a success");
    match &error {
        RemoteError::Status { class, body, .. } => {
            assert!(body.starts_with("answered "), "the body is kept: {body}");
            *class
        }
        other => panic!("a status, not {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statuses_are_classified_by_method_and_retry_after() {
    let base = statuses().await;
    let limited = |secs: Option<u64>| ErrorClass::RateLimited {
        retry_after: secs.map(Duration::from_secs),
    };
    let cases = [
        (Method::POST, "/status/425", limited(None)),
        (Method::POST, "/status/429/retry-after/2", limited(Some(2))),
        (Method::GET, "/status/503", ErrorClass::Retryable),
        (Method::PUT, "/status/503", ErrorClass::Retryable),
        (Method::POST, "/status/503", ErrorClass::Unknown),
        (Method::POST, "/status/503/retry-after/3", limited(Some(3))),
        (Method::GET, "/status/503/retry-after/3", limited(Some(3))),
        (Method::POST, "/status/409/retry-after/1", limited(Some(1))),
        (Method::POST, "/status/409", ErrorClass::Permanent),
        (Method::POST, "/status/404", ErrorClass::Permanent),
    ];
    for (method, path, expected) in cases {
        assert_eq!(
            class_of(&base, method.clone(), path).await,
            expected,
            "{method} {path}"
        );
    }
    let ok = send(client().get(format!("{base}/status/204")))
        .await
        .unwrap();
    assert_eq!(ok.status(), 204);
}

/// A streamed body (its size has no upper bound): its chunks, one by one.
struct Streamed(std::vec::IntoIter<&'static str>);

impl http_body::Body for Streamed {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        let chunk = self.get_mut().0.next();
        std::task::Poll::Ready(chunk.map(|c| Ok(http_body::Frame::data(bytes::Bytes::from(c)))))
    }
}

/// The Idempotency-Key layer's two 409s: "in progress, come back" (with `Retry-After`) is
/// rate-limited with its wait; "answered with a stream, not stored" (without) is permanent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layers_409s_are_classified_by_their_retry_after() {
    let release = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route(
            "/slow",
            post({
                let (release, started) = (release.clone(), started.clone());
                move || async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    release.notified().await;
                    "done"
                }
            }),
        )
        .route(
            "/stream",
            post(|| async { axum::body::Body::new(Streamed(vec!["a", "b"].into_iter())) }),
        )
        .layer(IdempotencyLayer::new().retry_after(Duration::from_secs(2)));
    let base = listen(app).await;
    let post_with_key = |path: &str| {
        client()
            .post(format!("{base}{path}"))
            .header("idempotency-key", "\"k-1\"")
    };
    let first = tokio::spawn(post_with_key("/slow").send());
    while started.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    match send(post_with_key("/slow")).await {
        Err(RemoteError::Status { status, class, .. }) => {
            assert_eq!(status, 409);
            assert_eq!(
                class,
                ErrorClass::RateLimited {
                    retry_after: Some(Duration::from_secs(2))
                }
            );
        }
        other => panic!("the in-progress 409, not {other:?}"),
    }
    release.notify_one();
    assert_eq!(first.await.unwrap().unwrap().text().await.unwrap(), "done");

    let streamed = send(post_with_key("/stream")).await.unwrap();
    assert_eq!(streamed.text().await.unwrap(), "ab");
    match send(post_with_key("/stream")).await {
        Err(RemoteError::Status { status, class, .. }) => {
            assert_eq!(status, 409);
            assert_eq!(class, ErrorClass::Permanent);
        }
        other => panic!("the stream's 409, not {other:?}"),
    }
}

/// A classification of one's own: a 404 is a success for this caller, a 503 is permanent; the rest
/// falls back on the default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classification_of_ones_own_overrides_the_default() {
    let base = statuses().await;
    let mine =
        |method: &Method, status: StatusCode, headers: &reqwest::header::HeaderMap| match status
            .as_u16()
        {
            404 => None,
            503 => Some(ErrorClass::Permanent),
            _ => classify_status(method, status, headers),
        };
    let gone = send_with(client().delete(format!("{base}/status/404")), mine)
        .await
        .expect("a 404 is a success here");
    assert_eq!(gone.status(), 404);
    assert_eq!(gone.text().await.unwrap(), "answered 404");
    let unavailable = send_with(client().get(format!("{base}/status/503")), mine)
        .await
        .expect_err("a 503");
    assert_eq!(unavailable.classify(), ErrorClass::Permanent);
    let early = send_with(client().post(format!("{base}/status/425")), mine)
        .await
        .expect_err("a 425");
    assert_eq!(
        early.classify(),
        ErrorClass::RateLimited { retry_after: None },
        "the default's answer"
    );
}

/// Calls recorded on the remote side's runtime, for its receipt endpoint to answer about.
#[cfg(feature = "axum")]
struct Remote {
    rt: Runtime,
    started: tokio::sync::Notify,
    release: tokio::sync::Notify,
}

#[cfg(feature = "axum")]
impl Remote {
    #[idempotent(key = "n", runtime = &self.rt)]
    async fn settle(&self, n: u64) -> Result<u64, RemoteError> {
        Ok(n * 100)
    }

    #[idempotent(key = "n", runtime = &self.rt)]
    async fn decline(&self, n: u64) -> Result<u64, RemoteError> {
        Err(RemoteError::Refused(format!("card {n} declined")))
    }

    #[idempotent(key = "n", runtime = &self.rt)]
    async fn hold(&self, n: u64) -> Result<u64, RemoteError> {
        self.started.notify_one();
        self.release.notified().await;
        Ok(n)
    }
}

/// `lookup_receipt` against `receipts(&rt)` served on loopback: a callId the other side never saw is
/// not received (404), a success comes with its value, a failure with its message, a call in flight
/// is processing — and a request its Idempotency-Key layer answered reads as its stored response.
#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_reads_the_receipt_endpoints_answers() {
    use samekey::{context::InboundCall, CallId, RemoteStatus};
    use samekey_http::{lookup_receipt, receipts};

    let remote = Arc::new(Remote {
        rt: Runtime::builder().node("payments-1").build().unwrap(),
        started: tokio::sync::Notify::new(),
        release: tokio::sync::Notify::new(),
    });
    let app = Router::new()
        .route(
            "/charges",
            post(|body: String| async move { format!("{{\"charged\":{body}}}") }),
        )
        .layer(IdempotencyLayer::new().runtime(&remote.rt))
        .layer(CallContextLayer::new())
        .merge(receipts(&remote.rt));
    let base = listen(app).await;
    let http = client();
    let new_id = || CallId::new("pay", "orders-1").unwrap();
    let url = |id: &CallId| format!("{base}/receipts/{id}");

    let never = new_id();
    assert!(matches!(
        lookup_receipt::<u64>(&http, url(&never)).await.unwrap(),
        RemoteStatus::NotReceived
    ));

    let settled = new_id();
    let value = InboundCall::new()
        .call_id(settled.clone())
        .scope(remote.settle(7))
        .await
        .unwrap();
    assert_eq!(value, 700);
    match lookup_receipt::<u64>(&http, url(&settled)).await.unwrap() {
        RemoteStatus::Succeeded(value) => assert_eq!(value, 700),
        other => panic!("succeeded, not {other:?}"),
    }

    let declined = new_id();
    assert!(InboundCall::new()
        .call_id(declined.clone())
        .scope(remote.decline(8))
        .await
        .is_err());
    match lookup_receipt::<u64>(&http, url(&declined)).await.unwrap() {
        RemoteStatus::Failed(RemoteError::Refused(message)) => {
            assert!(message.contains("card 8 declined"), "{message}")
        }
        other => panic!("failed, not {other:?}"),
    }

    let held = new_id();
    let holding = tokio::spawn({
        let (remote, held) = (remote.clone(), held.clone());
        async move { InboundCall::new().call_id(held).scope(remote.hold(9)).await }
    });
    remote.started.notified().await;
    assert!(matches!(
        lookup_receipt::<u64>(&http, url(&held)).await.unwrap(),
        RemoteStatus::Processing
    ));
    remote.release.notify_one();
    assert_eq!(holding.await.unwrap().unwrap(), 9);
    assert!(matches!(
        lookup_receipt::<u64>(&http, url(&held)).await.unwrap(),
        RemoteStatus::Succeeded(9)
    ));

    let posted = new_id();
    let answered = reqwest::Client::new()
        .post(format!("{base}/charges"))
        .header("x-call-id", posted.to_string())
        .header("idempotency-key", "\"charge-10\"")
        .body("10")
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    match lookup_receipt::<serde_json::Value>(&http, url(&posted))
        .await
        .unwrap()
    {
        RemoteStatus::Succeeded(value) => assert_eq!(value, serde_json::json!({ "charged": 10 })),
        other => panic!("succeeded, not {other:?}"),
    }
}
