//! The layers over real HTTP on loopback (axum serving, reqwest asking): every status of the
//! Idempotency-Key layer, replays with their header, 4xx stored and 5xx not, streamed responses and
//! responses over the limit passed through and refused on retry, a service error under the layer an
//! unknown outcome, keys scoped by method and route, the call context adopted,
//! refused and filled — on the memory store, and on SQLite, PostgreSQL, MySQL and Redis when built
//! with their features (the servers' URLs from `SAMEKEY_PG_URL`, `SAMEKEY_MYSQL_URL` and
//! `SAMEKEY_REDIS_URL`).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use samekey::{
    idempotent, limits::ConcurrencyLimit, Classify, ErrorClass, MemoryStore, Runtime, Store,
};
use samekey_http::{CallContextLayer, IdempotencyLayer};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, Notify};

#[derive(Default)]
struct Counts {
    orders: AtomicU32,
    flaky: AtomicU32,
    slow: AtomicU32,
    release_slow: Notify,
    panicky: AtomicU32,
    refused: AtomicU32,
    streams: AtomicU32,
    big: AtomicU32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    item: String,
    qty: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Created {
    id: u32,
    item: String,
    call_id: Option<String>,
}

async fn create_order(
    State(counts): State<Arc<Counts>>,
    Json(order): Json<Order>,
) -> impl IntoResponse {
    let id = counts.orders.fetch_add(1, Ordering::SeqCst) + 1;
    let call_id = samekey::context::try_current().map(|cx| cx.call_id().to_string());
    let created = Created {
        id,
        item: order.item,
        call_id,
    };
    (
        StatusCode::CREATED,
        [("location", format!("/orders/{id}"))],
        Json(created),
    )
}

async fn flaky(State(counts): State<Arc<Counts>>) -> impl IntoResponse {
    match counts.flaky.fetch_add(1, Ordering::SeqCst) {
        0 => (StatusCode::SERVICE_UNAVAILABLE, "try again").into_response(),
        n => (StatusCode::CREATED, format!("done after {}", n + 1)).into_response(),
    }
}

async fn slow(State(counts): State<Arc<Counts>>) -> &'static str {
    counts.slow.fetch_add(1, Ordering::SeqCst);
    counts.release_slow.notified().await;
    "slow done"
}

/// Dies mid-request the first time (its process would have crashed).
async fn panicky(State(counts): State<Arc<Counts>>) -> &'static str {
    if counts.panicky.fetch_add(1, Ordering::SeqCst) == 0 {
        panic!("the handler died mid-request");
    }
    "done"
}

/// A created order whose answer (4 KiB) is over the layer's limit (1 KiB in these tests).
async fn big(State(counts): State<Arc<Counts>>) -> impl IntoResponse {
    let n = counts.big.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        [("location", format!("/orders/big-{n}"))],
        "x".repeat(4096),
    )
}

/// A 503 over the limit.
async fn big_failing(State(counts): State<Arc<Counts>>) -> impl IntoResponse {
    counts.big.fetch_add(1, Ordering::SeqCst);
    (StatusCode::SERVICE_UNAVAILABLE, "u".repeat(4096))
}

/// A 4xx: stored and replayed like a success.
async fn out_of_stock(State(counts): State<Arc<Counts>>) -> impl IntoResponse {
    let n = counts.refused.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::NOT_FOUND,
        [("x-refusal", n.to_string())],
        format!("out of stock (refusal {n})"),
    )
}

/// A body that is a stream (its size has no upper bound, as `Body::from_stream` and SSE): the chunks
/// a task sends, until it stops.
struct Chunks(mpsc::Receiver<Bytes>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|chunk| Ok(http_body::Frame::data(chunk))))
    }
}

/// A streamed response of `status`: `chunks`, then more (`tick 1`, `tick 2`, …) for as long as the
/// client reads when `endless`.
fn streamed(counts: &Counts, status: StatusCode, chunks: &[&str], endless: bool) -> Response {
    counts.streams.fetch_add(1, Ordering::SeqCst);
    let (tx, rx) = mpsc::channel(1);
    let chunks: Vec<Bytes> = chunks.iter().map(|c| Bytes::from(c.to_string())).collect();
    tokio::spawn(async move {
        for chunk in chunks {
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
        if !endless {
            return;
        }
        for n in 1.. {
            if tx.send(Bytes::from(format!("tick {n}\n"))).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let headers = [("content-type", "text/event-stream")];
    (status, headers, Body::new(Chunks(rx))).into_response()
}

async fn ticks(State(counts): State<Arc<Counts>>) -> Response {
    streamed(&counts, StatusCode::OK, &[], true)
}

async fn export(State(counts): State<Arc<Counts>>) -> Response {
    streamed(
        &counts,
        StatusCode::CREATED,
        &["one\n", "two\n", "three\n"],
        false,
    )
}

async fn export_failing(State(counts): State<Arc<Counts>>) -> Response {
    streamed(
        &counts,
        StatusCode::SERVICE_UNAVAILABLE,
        &["unavailable"],
        false,
    )
}

async fn ids(headers: HeaderMap) -> Json<(Option<String>, Option<String>, Option<String>)> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let adopted = samekey::context::try_current().map(|cx| cx.call_id().to_string());
    Json((header("x-call-id"), header("x-trace-id"), adopted))
}

struct Server {
    base: String,
    counts: Arc<Counts>,
    client: reqwest::Client,
}

async fn serve(store: Arc<dyn Store>, gateway: bool) -> Server {
    serve_with(store, gateway, |layer| layer).await
}

async fn serve_with(
    store: Arc<dyn Store>,
    gateway: bool,
    configure: fn(IdempotencyLayer) -> IdempotencyLayer,
) -> Server {
    let rt = Runtime::builder()
        .node("api-1")
        .shared_store(store)
        .build()
        .unwrap();
    serve_on(&rt, gateway, configure).await
}

async fn serve_on(
    rt: &Runtime,
    gateway: bool,
    configure: fn(IdempotencyLayer) -> IdempotencyLayer,
) -> Server {
    let counts = Arc::new(Counts::default());
    let idempotency = configure(IdempotencyLayer::new())
        .runtime(rt)
        .max_body(1024)
        .principal(|parts| {
            parts
                .headers
                .get("x-tenant")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        });
    let context = if gateway {
        CallContextLayer::gateway("gw", "edge-1")
    } else {
        CallContextLayer::new()
    };
    let app = Router::new()
        .route("/orders", post(create_order).put(create_order))
        .route("/carts", post(create_order))
        .route("/out-of-stock", post(out_of_stock))
        .route("/ticks", post(ticks))
        .route("/export", post(export))
        .route("/export-failing", post(export_failing))
        .route("/flaky", post(flaky))
        .route("/slow", post(slow))
        .route("/big", post(big))
        .route("/big-failing", post(big_failing))
        .route("/panicky", post(panicky))
        .route("/ids", post(ids).get(ids))
        .with_state(counts.clone())
        .layer(idempotency)
        .layer(context);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Server {
        base,
        counts,
        client: reqwest::Client::new(),
    }
}

fn fresh_key() -> String {
    format!("\"k-{:x}\"", samekey::TraceId::new().as_u128())
}

impl Server {
    /// Two requests to `path` under one fresh key, each answered 503 with `body` as it is: not
    /// stored, the key given back, the handler (counted by `runs`) run each time.
    async fn gives_its_key_back(&self, path: &str, body: &str, runs: &AtomicU32) {
        let key = fresh_key();
        for _ in 0..2 {
            let before = runs.load(Ordering::SeqCst);
            let failed = self.post(path, Some(&key)).send().await.unwrap();
            assert_eq!(failed.status(), 503);
            assert!(failed.headers().get("idempotent-replayed").is_none());
            assert_eq!(failed.text().await.unwrap(), body);
            assert_eq!(runs.load(Ordering::SeqCst), before + 1, "{path} ran again");
        }
    }

    fn post(&self, path: &str, key: Option<&str>) -> reqwest::RequestBuilder {
        let request = self.client.post(format!("{}{path}", self.base));
        match key {
            Some(key) => request.header("idempotency-key", key),
            None => request,
        }
    }
}

/// The problem+json body of a refusal.
async fn problem(response: reqwest::Response) -> serde_json::Value {
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["status"], status, "{body}");
    body
}

async fn problem_type(response: reqwest::Response) -> String {
    let body = problem(response).await;
    body["type"].as_str().unwrap_or_default().to_owned()
}

async fn idempotency_statuses(store: Arc<dyn Store>) {
    let server = serve(store, false).await;
    let order = Order {
        item: "book".into(),
        qty: 1,
    };

    // 400: no key on a POST; a key that is not an sf-string.
    let missing = server
        .post("/orders", None)
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 400);
    assert_eq!(
        problem_type(missing).await,
        "urn:samekey:problem:idempotency-key-missing"
    );
    let malformed = server
        .post("/orders", Some("not-quoted"))
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(malformed.status(), 400);
    assert_eq!(
        problem_type(malformed).await,
        "urn:samekey:problem:idempotency-key-invalid"
    );
    assert_eq!(
        server.counts.orders.load(Ordering::SeqCst),
        0,
        "nothing ran"
    );

    // The first request runs; the same request again is replayed, marked, with its headers.
    let key = fresh_key();
    let first = server
        .post("/orders", Some(&key))
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 201);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first_body: Created = first.json().await.unwrap();
    let again = server
        .post("/orders", Some(&key))
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(
        again.headers().get("location").unwrap(),
        &format!("/orders/{}", first_body.id)
    );
    assert_eq!(again.json::<Created>().await.unwrap(), first_body);
    assert_eq!(server.counts.orders.load(Ordering::SeqCst), 1, "ran once");

    // 422: the key again with another body.
    let other = Order {
        item: "pen".into(),
        qty: 2,
    };
    let reused = server
        .post("/orders", Some(&key))
        .json(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(reused.status(), 422);
    assert_eq!(
        problem_type(reused).await,
        "urn:samekey:problem:idempotency-key-reused"
    );

    // Another tenant with the same key is another request.
    let tenant = server
        .post("/orders", Some(&key))
        .header("x-tenant", "acme")
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(tenant.status(), 201);
    assert!(tenant.headers().get("idempotent-replayed").is_none());
    assert_eq!(server.counts.orders.load(Ordering::SeqCst), 2);

    // 413: a body over the limit; nothing runs.
    let large = server
        .post("/orders", Some(&fresh_key()))
        .header("content-type", "application/json")
        .body(format!("{{\"item\":\"{}\",\"qty\":1}}", "x".repeat(2048)))
        .send()
        .await
        .unwrap();
    assert_eq!(large.status(), 413);
    assert_eq!(
        problem_type(large).await,
        "urn:samekey:problem:body-too-large"
    );
    assert_eq!(server.counts.orders.load(Ordering::SeqCst), 2);

    // 5xx is not stored: the key is given back and the retry runs; then it is replayed.
    let key = fresh_key();
    let failed = server.post("/flaky", Some(&key)).send().await.unwrap();
    assert_eq!(failed.status(), 503);
    let retried = server.post("/flaky", Some(&key)).send().await.unwrap();
    assert_eq!(retried.status(), 201);
    assert_eq!(retried.text().await.unwrap(), "done after 2");
    let replayed = server.post("/flaky", Some(&key)).send().await.unwrap();
    assert_eq!(
        replayed.headers().get("idempotent-replayed").unwrap(),
        "true"
    );
    assert_eq!(server.counts.flaky.load(Ordering::SeqCst), 2);

    // A response over the limit goes to its client as it is, not stored: the key is settled with a
    // 409 that says so (as for a stream), and nothing runs twice.
    let key = fresh_key();
    let big = server.post("/big", Some(&key)).send().await.unwrap();
    assert_eq!(big.status(), 201);
    assert!(big.headers().get("idempotent-replayed").is_none());
    assert_eq!(big.headers().get("location").unwrap(), "/orders/big-1");
    assert_eq!(big.text().await.unwrap(), "x".repeat(4096));
    for _ in 0..2 {
        let big_again = server.post("/big", Some(&key)).send().await.unwrap();
        assert_eq!(big_again.status(), 409);
        assert_eq!(
            big_again.headers().get("idempotent-replayed").unwrap(),
            "true"
        );
        assert!(
            big_again.headers().get("retry-after").is_none(),
            "retrying will not help"
        );
        let body = problem(big_again).await;
        assert_eq!(
            body["type"], "urn:samekey:problem:response-not-replayable",
            "{body}"
        );
        assert_eq!(body["first_status"], 201, "{body}");
        assert_eq!(body["max_body"], 1024, "{body}");
    }
    assert_eq!(server.counts.big.load(Ordering::SeqCst), 1, "ran once");
    // A 5xx over the limit goes to its client as well, and gives the key back, as any 5xx.
    server
        .gives_its_key_back("/big-failing", &"u".repeat(4096), &server.counts.big)
        .await;

    // 409 with Retry-After while the first is still running; the first still gets its answer.
    let key = fresh_key();
    let first = tokio::spawn(server.post("/slow", Some(&key)).send());
    while server.counts.slow.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let busy = server.post("/slow", Some(&key)).send().await.unwrap();
    assert_eq!(busy.status(), 409);
    assert_eq!(busy.headers().get("retry-after").unwrap(), "1");
    assert_eq!(
        problem_type(busy).await,
        "urn:samekey:problem:request-in-progress"
    );
    server.counts.release_slow.notify_one();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(server.counts.slow.load(Ordering::SeqCst), 1);

    // GET is not covered: it passes through without a key.
    let get = server
        .client
        .get(format!("{}/ids", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(get.status(), 200);
}

/// A client that gives up mid-request does not stop the handler: its response is stored, and the
/// retry gets it without running the handler again.
async fn a_client_that_disconnects_gets_the_response_on_retry(store: Arc<dyn Store>) {
    let server = serve(store, false).await;
    let key = fresh_key();
    let gone = tokio::time::timeout(
        Duration::from_millis(200),
        server.post("/slow", Some(&key)).send(),
    )
    .await;
    assert!(gone.is_err(), "the client gave up");
    server.counts.release_slow.notify_one();
    let mut retry;
    loop {
        retry = server.post("/slow", Some(&key)).send().await.unwrap();
        if retry.status() != 409 {
            break;
        }
        server.counts.release_slow.notify_one();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(retry.status(), 200);
    assert_eq!(retry.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(retry.text().await.unwrap(), "slow done");
    assert_eq!(server.counts.slow.load(Ordering::SeqCst), 1);
}

/// A streamed response is passed to its client as it comes, not buffered; the key is settled at once
/// with a 409 that says so, which a retry gets at once — even while the first stream still runs — and
/// the handler never runs twice. A streamed 5xx gives the key back, as any 5xx.
async fn a_streamed_response_goes_to_its_client_and_is_refused_on_retry(store: Arc<dyn Store>) {
    let server = serve(store, false).await;
    let not_replayable = |body: &serde_json::Value, first_status: u16| {
        assert_eq!(
            body["type"], "urn:samekey:problem:stream-not-replayable",
            "{body}"
        );
        assert_eq!(body["status"], 409, "{body}");
        assert_eq!(body["first_status"], first_status, "{body}");
        let detail = body["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("answered with a stream"), "{detail}");
    };

    // A stream that never ends: the first client reads it while a retry is refused.
    let key = fresh_key();
    let mut first = server.post("/ticks", Some(&key)).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.chunk().await.unwrap().unwrap(), "tick 1\n");
    let retry = tokio::time::timeout(
        Duration::from_secs(5),
        server.post("/ticks", Some(&key)).send(),
    )
    .await
    .expect("the retry is answered at once, while the stream runs")
    .unwrap();
    assert_eq!(retry.status(), 409);
    assert!(
        retry.headers().get("retry-after").is_none(),
        "retrying will not help"
    );
    assert_eq!(retry.headers().get("idempotent-replayed").unwrap(), "true");
    not_replayable(&problem(retry).await, 200);
    assert_eq!(first.chunk().await.unwrap().unwrap(), "tick 2\n");
    assert_eq!(first.chunk().await.unwrap().unwrap(), "tick 3\n");
    drop(first);
    assert_eq!(server.counts.streams.load(Ordering::SeqCst), 1, "ran once");

    // A stream that ends: the first client gets all of it, unchanged; the retry the 409.
    let key = fresh_key();
    let first = server.post("/export", Some(&key)).send().await.unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(
        first.headers().get("content-type").unwrap(),
        "text/event-stream"
    );
    assert_eq!(first.text().await.unwrap(), "one\ntwo\nthree\n");
    let retry = server.post("/export", Some(&key)).send().await.unwrap();
    assert_eq!(retry.status(), 409);
    not_replayable(&problem(retry).await, 201);
    assert_eq!(server.counts.streams.load(Ordering::SeqCst), 2, "ran once");

    // A streamed 503 is not stored: the retry runs the handler again.
    server
        .gives_its_key_back("/export-failing", "unavailable", &server.counts.streams)
        .await;
}

/// A 4xx is the request's answer too: stored, and replayed with its headers and the replay mark.
async fn a_4xx_is_stored_and_replayed(store: Arc<dyn Store>) {
    let server = serve(store, false).await;
    let key = fresh_key();
    let first = server
        .post("/out-of-stock", Some(&key))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 404);
    assert!(first.headers().get("idempotent-replayed").is_none());
    assert_eq!(first.text().await.unwrap(), "out of stock (refusal 1)");
    for _ in 0..2 {
        let again = server
            .post("/out-of-stock", Some(&key))
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 404);
        assert_eq!(again.headers().get("idempotent-replayed").unwrap(), "true");
        assert_eq!(again.headers().get("x-refusal").unwrap(), "1");
        assert_eq!(again.text().await.unwrap(), "out of stock (refusal 1)");
    }
    assert_eq!(server.counts.refused.load(Ordering::SeqCst), 1, "ran once");
}

/// One key on two routes, and on two methods of one route, is three keys: each handler runs, and
/// each is replayed its own response.
async fn a_key_is_scoped_by_method_and_route(store: Arc<dyn Store>) {
    let server = serve_with(store, false, |layer| {
        layer.methods([Method::POST, Method::PUT])
    })
    .await;
    let key = fresh_key();
    let order = Order {
        item: "book".into(),
        qty: 1,
    };
    let url = |path: &str| format!("{}{path}", server.base);
    let requests = [
        (Method::POST, "/orders"),
        (Method::POST, "/carts"),
        (Method::PUT, "/orders"),
    ];
    let mut ids = Vec::new();
    for (method, path) in &requests {
        let response = server
            .client
            .request(method.clone(), url(path))
            .header("idempotency-key", &key)
            .json(&order)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{method} {path}");
        assert!(
            response.headers().get("idempotent-replayed").is_none(),
            "{method} {path} is a key of its own"
        );
        ids.push(response.json::<Created>().await.unwrap().id);
    }
    assert_eq!(ids, [1, 2, 3]);
    for ((method, path), id) in requests.iter().zip(ids) {
        let again = server
            .client
            .request(method.clone(), url(path))
            .header("idempotency-key", &key)
            .json(&order)
            .send()
            .await
            .unwrap();
        assert_eq!(again.headers().get("idempotent-replayed").unwrap(), "true");
        assert_eq!(
            again.json::<Created>().await.unwrap().id,
            id,
            "{method} {path}"
        );
    }
    assert_eq!(server.counts.orders.load(Ordering::SeqCst), 3);
}

macro_rules! on_stores {
    ($($test:ident),+ $(,)?) => {
        mod memory {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(Arc::new(MemoryStore::new())).await;
                }
            )+
        }
        #[cfg(feature = "sqlite")]
        mod sqlite {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let dir = std::env::temp_dir()
                        .join(format!("samekey-http-{:x}", samekey::TraceId::new().as_u128()));
                    std::fs::create_dir_all(&dir).unwrap();
                    let store = samekey_runtime::store::SqliteStore::open(dir.join("s.db"))
                        .await
                        .unwrap();
                    super::$test(Arc::new(store)).await;
                }
            )+
        }
        #[cfg(feature = "postgres")]
        mod postgres {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Ok(url) = std::env::var("SAMEKEY_PG_URL") else {
                        samekey_runtime::conformance::skipped("set SAMEKEY_PG_URL to run the layer on PostgreSQL");
                        return;
                    };
                    let store = samekey_runtime::store::PgStore::connect(&url).await.unwrap();
                    super::$test(Arc::new(store)).await;
                }
            )+
        }
        #[cfg(feature = "mysql")]
        mod mysql {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Ok(url) = std::env::var("SAMEKEY_MYSQL_URL") else {
                        samekey_runtime::conformance::skipped("set SAMEKEY_MYSQL_URL to run the layer on MySQL");
                        return;
                    };
                    let store = samekey_runtime::store::MySqlStore::connect(&url).await.unwrap();
                    super::$test(Arc::new(store)).await;
                }
            )+
        }
        #[cfg(feature = "redis")]
        mod redis {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    let Ok(url) = std::env::var("SAMEKEY_REDIS_URL") else {
                        samekey_runtime::conformance::skipped("set SAMEKEY_REDIS_URL to run the layer on Redis");
                        return;
                    };
                    let prefix = format!("samekey-http-{:x}", samekey::TraceId::new().as_u128());
                    let store = samekey_runtime::store::RedisStore::connect_with_prefix(&url, &prefix)
                        .await
                        .unwrap();
                    super::$test(Arc::new(store)).await;
                }
            )+
        }
    };
}

on_stores!(
    idempotency_statuses,
    a_client_that_disconnects_gets_the_response_on_retry,
    a_streamed_response_goes_to_its_client_and_is_refused_on_retry,
    a_4xx_is_stored_and_replayed,
    a_key_is_scoped_by_method_and_route,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_call_context_is_adopted_validated_and_echoed() {
    let server = serve(Arc::new(MemoryStore::new()), false).await;
    let call_id = samekey::CallId::new("ord", "client-1").unwrap().to_string();
    let trace_id = samekey::TraceId::new().to_string();
    let response = server
        .post("/ids", Some(&fresh_key()))
        .header("x-call-id", &call_id)
        .header("x-trace-id", &trace_id)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers().get("x-call-id").unwrap(),
        call_id.as_str()
    );
    assert_eq!(
        response.headers().get("x-trace-id").unwrap(),
        trace_id.as_str()
    );
    let (seen_call, seen_trace, adopted) = response
        .json::<(Option<String>, Option<String>, Option<String>)>()
        .await
        .unwrap();
    assert_eq!(seen_call.as_deref(), Some(call_id.as_str()));
    assert_eq!(seen_trace.as_deref(), Some(trace_id.as_str()));
    assert_eq!(
        adopted.as_deref(),
        Some(call_id.as_str()),
        "the layer's call adopted it"
    );

    let bad = server
        .post("/ids", Some(&fresh_key()))
        .header("x-call-id", "not a call id")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert_eq!(
        problem_type(bad).await,
        "urn:samekey:problem:invalid-call-context"
    );
    let bad_trace = server
        .post("/ids", Some(&fresh_key()))
        .header("x-call-id", &call_id)
        .header("x-trace-id", "not-a-trace-id")
        .send()
        .await
        .unwrap();
    assert_eq!(bad_trace.status(), 400);
    let body = problem(bad_trace).await;
    assert_eq!(body["type"], "urn:samekey:problem:invalid-call-context");
    let detail = body["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("x-trace-id"), "{detail}");

    // Without one, a service fills nothing; the echo carries a traceId all the same.
    let none = server
        .client
        .get(format!("{}/ids", server.base))
        .send()
        .await
        .unwrap();
    assert!(none.headers().get("x-call-id").is_none());
    assert!(none.headers().get("x-trace-id").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_fills_a_missing_call_id_and_marks_it() {
    let server = serve(Arc::new(MemoryStore::new()), true).await;
    let response = server
        .client
        .get(format!("{}/ids", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers().get("x-call-id-source").unwrap(),
        "gateway"
    );
    let filled = response
        .headers()
        .get("x-call-id")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        filled.starts_with("gw-") && filled.ends_with("-edge-1"),
        "{filled}"
    );
    let (seen, _, _) = response
        .json::<(Option<String>, Option<String>, Option<String>)>()
        .await
        .unwrap();
    assert_eq!(
        seen.as_deref(),
        Some(filled.as_str()),
        "passed on to the service"
    );

    // A callId that arrived passes through untouched, unmarked.
    let call_id = samekey::CallId::new("ord", "client-1").unwrap().to_string();
    let passed = server
        .client
        .get(format!("{}/ids", server.base))
        .header("x-call-id", &call_id)
        .send()
        .await
        .unwrap();
    assert!(passed.headers().get("x-call-id-source").is_none());
    assert_eq!(passed.headers().get("x-call-id").unwrap(), call_id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_may_wait_for_the_first_with_its_key_instead_of_a_409() {
    let server = serve_with(Arc::new(MemoryStore::new()), false, |l| l.wait_when_busy()).await;
    let key = fresh_key();
    let first = tokio::spawn(server.post("/slow", Some(&key)).send());
    while server.counts.slow.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = tokio::spawn(server.post("/slow", Some(&key)).send());
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.counts.release_slow.notify_one();
    let (first, second) = (
        first.await.unwrap().unwrap(),
        second.await.unwrap().unwrap(),
    );
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    assert_eq!(second.headers().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(server.counts.slow.load(Ordering::SeqCst), 1);
}

/// A handler that dies mid-request leaves its key's outcome unknown: the next request with the key is
/// a 409 (`outcome-unknown`) and nothing runs again — unless the layer may re-run it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_died_is_not_run_again_unless_allowed() {
    let server = serve(Arc::new(MemoryStore::new()), false).await;
    let key = fresh_key();
    let died = server.post("/panicky", Some(&key)).send().await.unwrap();
    assert_eq!(died.status(), 500);
    assert_eq!(
        problem_type(died).await,
        "urn:samekey:problem:handler-panicked"
    );
    // The drop guard marks the call UNKNOWN in the background, a moment later.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let next = server.post("/panicky", Some(&key)).send().await.unwrap();
    assert_eq!(next.status(), 409);
    assert_eq!(
        problem_type(next).await,
        "urn:samekey:problem:outcome-unknown"
    );
    assert_eq!(
        server.counts.panicky.load(Ordering::SeqCst),
        1,
        "not run again"
    );

    let rerun = serve_with(Arc::new(MemoryStore::new()), false, |l| l.rerun_unknown()).await;
    let key = fresh_key();
    let died = rerun.post("/panicky", Some(&key)).send().await.unwrap();
    assert_eq!(died.status(), 500);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let again = rerun.post("/panicky", Some(&key)).send().await.unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.text().await.unwrap(), "done");
    assert_eq!(
        rerun.counts.panicky.load(Ordering::SeqCst),
        2,
        "run again, once"
    );
}

/// A charge that takes effect and then runs past the timeout under the layer (tower's, answered 408
/// by axum's `HandleErrorLayer` above it, as axum's docs set them up): the service's error is an
/// unknown outcome, not "nothing ran" — the retry with the key is a 409 (`outcome-unknown`) and the
/// handler does not run twice; with `rerun_unknown`, it runs again once, under the same callId.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_error_under_the_layer_is_an_unknown_outcome() {
    use axum::error_handling::HandleErrorLayer;
    use tower::ServiceBuilder;

    #[derive(Default)]
    struct Charges {
        runs: AtomicU32,
        call_ids: std::sync::Mutex<Vec<Option<String>>>,
    }

    /// Charges, then (the first time) takes longer than the timeout to answer.
    async fn charge(State(charges): State<Arc<Charges>>) -> (StatusCode, &'static str) {
        let run = charges.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let call_id = samekey::context::try_current().map(|cx| cx.call_id().to_string());
        charges.call_ids.lock().unwrap().push(call_id);
        if run == 1 {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        (StatusCode::CREATED, "charged")
    }

    async fn serve_charges(layer: IdempotencyLayer) -> (String, Arc<Charges>) {
        let charges = Arc::new(Charges::default());
        let app = Router::new()
            .route("/charges", post(charge))
            .with_state(charges.clone())
            .layer(
                ServiceBuilder::new()
                    .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
                        StatusCode::REQUEST_TIMEOUT
                    }))
                    .layer(layer)
                    .layer(tower::timeout::TimeoutLayer::new(Duration::from_millis(50))),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (base, charges)
    }

    let client = reqwest::Client::new();
    let rt = Runtime::builder().node("api-1").build().unwrap();
    let (base, charges) = serve_charges(IdempotencyLayer::new().runtime(&rt)).await;
    let key = fresh_key();
    let post = || {
        client
            .post(format!("{base}/charges"))
            .header("idempotency-key", &key)
            .send()
    };
    let timed_out = post().await.unwrap();
    assert_eq!(timed_out.status(), 408, "the timeout's answer, as it is");
    for _ in 0..2 {
        let retry = post().await.unwrap();
        assert_eq!(retry.status(), 409);
        assert!(retry.headers().get("retry-after").is_some());
        assert_eq!(
            problem_type(retry).await,
            "urn:samekey:problem:outcome-unknown"
        );
    }
    assert_eq!(charges.runs.load(Ordering::SeqCst), 1, "charged once");

    let rt = Runtime::builder().node("api-1").build().unwrap();
    let (base, charges) = serve_charges(IdempotencyLayer::new().runtime(&rt).rerun_unknown()).await;
    let key = fresh_key();
    let post = || {
        client
            .post(format!("{base}/charges"))
            .header("idempotency-key", &key)
            .send()
    };
    assert_eq!(post().await.unwrap().status(), 408);
    let rerun = post().await.unwrap();
    assert_eq!(rerun.status(), 201);
    assert!(rerun.headers().get("idempotent-replayed").is_none());
    let replayed = post().await.unwrap();
    assert_eq!(replayed.status(), 201);
    assert_eq!(
        replayed.headers().get("idempotent-replayed").unwrap(),
        "true"
    );
    assert_eq!(charges.runs.load(Ordering::SeqCst), 2, "run again, once");
    let call_ids = charges.call_ids.lock().unwrap().clone();
    assert!(call_ids[0].is_some());
    assert_eq!(call_ids[0], call_ids[1], "under the same callId");
}

/// tower's `TimeoutLayer` *around* the layer: the client is answered 408 while the handler goes on
/// (the layer spawns it) and takes effect; a retry meanwhile is a 409, and once it finished, the
/// stored 201 is replayed. One charge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_around_the_layer_leaves_the_handler_to_finish_and_be_replayed() {
    use axum::error_handling::HandleErrorLayer;
    use tower::ServiceBuilder;

    async fn charge(State(runs): State<Arc<AtomicU32>>) -> (StatusCode, &'static str) {
        runs.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        (StatusCode::CREATED, "charged")
    }

    let runs = Arc::new(AtomicU32::new(0));
    let rt = Runtime::builder().node("api-1").build().unwrap();
    let app = Router::new()
        .route("/charges", post(charge))
        .with_state(runs.clone())
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
                    StatusCode::REQUEST_TIMEOUT
                }))
                .layer(tower::timeout::TimeoutLayer::new(Duration::from_millis(50)))
                .layer(IdempotencyLayer::new().runtime(&rt)),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let key = fresh_key();
    let post = || {
        client
            .post(format!("{base}/charges"))
            .header("idempotency-key", &key)
            .send()
    };
    assert_eq!(post().await.unwrap().status(), 408, "the client gave up");
    let busy = post().await.unwrap();
    assert_eq!(busy.status(), 409, "the first still runs");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let replayed = post().await.unwrap();
    assert_eq!(replayed.status(), 201);
    assert_eq!(
        replayed.headers().get("idempotent-replayed").unwrap(),
        "true"
    );
    assert_eq!(replayed.text().await.unwrap(), "charged");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "charged once");
}

/// Beside tower-http's request-id and trace layers: each reads and writes its own headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layers_compose_with_tower_http() {
    use std::sync::atomic::AtomicU64;
    use tower_http::request_id::{
        MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
    };
    use tower_http::trace::TraceLayer;

    #[derive(Clone, Default)]
    struct Counter(Arc<AtomicU64>);
    impl MakeRequestId for Counter {
        fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            Some(RequestId::new(axum::http::HeaderValue::from(n)))
        }
    }

    let rt = Runtime::builder().node("api-1").build().unwrap();
    let counts = Arc::new(Counts::default());
    let app = Router::new()
        .route("/orders", post(create_order))
        .with_state(counts.clone())
        .layer(IdempotencyLayer::new().runtime(&rt))
        .layer(CallContextLayer::new())
        .layer(TraceLayer::new_for_http())
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(Counter::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();
    let call_id = samekey::CallId::new("ord", "client-1").unwrap().to_string();
    let key = fresh_key();
    let order = Order {
        item: "book".into(),
        qty: 1,
    };
    for n in 0..2 {
        let response = client
            .post(format!("{base}/orders"))
            .header("idempotency-key", &key)
            .header("x-call-id", &call_id)
            .json(&order)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers()["x-request-id"], n.to_string().as_str());
        assert_eq!(response.headers()["x-call-id"], call_id.as_str());
        let created: Created = response.json().await.unwrap();
        assert_eq!(created.call_id.as_deref(), Some(call_id.as_str()));
    }
    assert_eq!(counts.orders.load(Ordering::SeqCst), 1);
}

#[derive(Debug, thiserror::Error)]
enum Upstream {
    #[error("rate limited")]
    RateLimited,
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for Upstream {
    fn classify(&self) -> ErrorClass {
        match self {
            Upstream::RateLimited => ErrorClass::RateLimited { retry_after: None },
            Upstream::Samekey(e) => e.classify(),
        }
    }
}

struct Neighbour {
    rt: Runtime,
}

impl Neighbour {
    /// A call on the runtime's own dependency that is answered "rate limited".
    #[idempotent(key = "n", runtime = &self.rt, retries = 0)]
    async fn refuse(&self, n: u32) -> Result<(), Upstream> {
        let _ = n;
        Err(Upstream::RateLimited)
    }
}

/// Once the runtime's dependency is rate-limited down to one call at a time, a request with another
/// key that finds no place in time is a 503 (`overloaded`) with `Retry-After`, and its handler does
/// not run; the one in flight still gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overloaded_runtime_is_a_503() {
    let rt = Runtime::builder()
        .node("api-1")
        .concurrency_limit(ConcurrencyLimit::adaptive().max_wait(Duration::from_millis(50)))
        .build()
        .unwrap();
    let neighbour = Neighbour { rt: rt.clone() };
    assert!(neighbour.refuse(1).await.is_err());
    assert_eq!(rt.concurrency_limit(None), Some(1), "one call at a time");
    let server = serve_on(&rt, false, |layer| layer).await;
    let first = tokio::spawn(server.post("/slow", Some(&fresh_key())).send());
    while server.counts.slow.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let order = Order {
        item: "book".into(),
        qty: 1,
    };
    let refused = server
        .post("/orders", Some(&fresh_key()))
        .json(&order)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers().get("retry-after").unwrap(), "1");
    let body = problem(refused).await;
    assert_eq!(body["type"], "urn:samekey:problem:overloaded");
    assert_eq!(server.counts.orders.load(Ordering::SeqCst), 0, "not run");
    server.counts.release_slow.notify_one();
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
}
