//! W3C trace context over HTTP, on loopback: an inbound `traceparent` gives the handler's calls their
//! traceId and is passed on — to a second service by the client middleware, with the inbound
//! parent-id when no OpenTelemetry span is active, and on the request the layer passes to the handler
//! — while the response gets no `traceparent`; a malformed one is ignored (not a 400); when it and
//! `X-Trace-Id` disagree, the traceparent wins.
#![cfg(feature = "reqwest")]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use reqwest_middleware::ClientWithMiddleware;
use samekey::{idempotent, Runtime, TraceId, TraceParent};
use samekey_http::{send, CallContextLayer, CallHeaders, RemoteError};
use serde::{Deserialize, Serialize};

const INBOUND: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// What a service saw of a request: its `traceparent` and `X-Trace-Id` headers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Headers {
    traceparent: Option<String>,
    trace_id: Option<String>,
}

impl Headers {
    fn of(headers: &HeaderMap) -> Headers {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        Headers {
            traceparent: header("traceparent"),
            trace_id: header("x-trace-id"),
        }
    }
}

/// What the first service saw and did: the request its handler got, the traceId and traceparent of
/// the handler's call, and what the second service saw of the two requests sent to it (one from
/// inside the call, one from the handler outside any call).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Seen {
    handler: Headers,
    call_trace_id: String,
    call_traceparent: String,
    from_call: Headers,
    from_handler: Headers,
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

struct Orders {
    rt: Runtime,
    client: ClientWithMiddleware,
    payments: String,
}

impl Orders {
    /// The handler's call: its trace, and what the payment service saw of its request.
    #[idempotent(key = "order", runtime = &self.rt, retries = 0)]
    async fn charge(&self, order: &str) -> Result<(String, String, Headers), RemoteError> {
        let cx = samekey::current();
        let request = self
            .client
            .post(format!("{}/charges", self.payments))
            .body(order.to_owned());
        let seen: Headers = send(request).await?.json().await?;
        Ok((
            cx.trace_id().to_string(),
            cx.traceparent().to_string(),
            seen,
        ))
    }
}

async fn create_order(
    State(orders): State<Arc<Orders>>,
    headers: HeaderMap,
    order: String,
) -> Json<Seen> {
    let (call_trace_id, call_traceparent, from_call) = orders.charge(&order).await.unwrap();
    // Outside any call, in the request's scope: the trace only.
    let from_handler: Headers = orders
        .client
        .post(format!("{}/charges", orders.payments))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    Json(Seen {
        handler: Headers::of(&headers),
        call_trace_id,
        call_traceparent,
        from_call,
        from_handler,
    })
}

/// The two services: the payment service answers the trace headers it saw.
async fn services() -> String {
    let payments = Router::new()
        .route(
            "/charges",
            post(|headers: HeaderMap| async move { Json(Headers::of(&headers)) }),
        )
        .layer(CallContextLayer::new());
    let orders = Orders {
        rt: Runtime::builder().node("orders-1").build().unwrap(),
        client: client(),
        payments: listen(payments).await,
    };
    let app = Router::new()
        .route("/orders", post(create_order))
        .with_state(Arc::new(orders))
        .layer(CallContextLayer::new());
    listen(app).await
}

/// Sends an order with these headers; answers the response's `traceparent` and `X-Trace-Id`, and
/// what the services saw.
async fn order(base: &str, headers: &[(&str, &str)]) -> (Headers, Seen) {
    // An order of its own each time: the same one would be replayed, under the first one's trace.
    static ORDERS: AtomicU32 = AtomicU32::new(0);
    let id = format!("o-{}", ORDERS.fetch_add(1, Ordering::Relaxed));
    let mut request = reqwest::Client::new()
        .post(format!("{base}/orders"))
        .body(id);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200, "{headers:?}");
    let echoed = Headers::of(response.headers());
    (echoed, response.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbound_traceparent_is_adopted_and_passed_on() {
    let base = services().await;
    let inbound: TraceParent = INBOUND.parse().unwrap();
    let trace = inbound.trace_id().to_string();
    let (echoed, seen) = order(&base, &[("traceparent", INBOUND)]).await;
    assert_eq!(echoed.trace_id.as_deref(), Some(trace.as_str()), "echoed");
    assert_eq!(echoed.traceparent, None, "no new header on the response");
    assert_eq!(
        seen.handler,
        Headers {
            traceparent: Some(INBOUND.to_owned()),
            trace_id: Some(trace.clone()),
        },
        "the request passed on keeps it, and its X-Trace-Id says the same"
    );
    assert_eq!(
        seen.call_trace_id, trace,
        "the handler's call has its trace-id"
    );
    assert_eq!(seen.call_traceparent, INBOUND);
    for sent in [&seen.from_call, &seen.from_handler] {
        let tp: TraceParent = sent.traceparent.as_deref().unwrap().parse().unwrap();
        assert_eq!(
            tp.trace_id(),
            inbound.trace_id(),
            "one trace across both hops"
        );
        assert_eq!(
            tp.parent_id(),
            inbound.parent_id(),
            "no OpenTelemetry span: the inbound parent-id, forwarded"
        );
        assert_eq!(tp.flags(), inbound.flags());
        assert_eq!(sent.trace_id.as_deref(), Some(trace.as_str()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_traceparent_and_x_trace_id_disagree_the_traceparent_wins() {
    let base = services().await;
    let inbound: TraceParent = INBOUND.parse().unwrap();
    let trace = inbound.trace_id().to_string();
    let other = TraceId::new().to_string();
    let (echoed, seen) = order(&base, &[("traceparent", INBOUND), ("x-trace-id", &other)]).await;
    assert_eq!(echoed.trace_id.as_deref(), Some(trace.as_str()));
    assert_eq!(seen.handler.trace_id.as_deref(), Some(trace.as_str()));
    assert_eq!(seen.call_trace_id, trace);
    assert_eq!(seen.from_call.trace_id.as_deref(), Some(trace.as_str()));
    assert_eq!(seen.from_call.traceparent.as_deref(), Some(INBOUND));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_traceparent_is_ignored() {
    let base = services().await;
    let trace = TraceId::new().to_string();
    let upper = INBOUND.to_uppercase();
    for malformed in [
        upper.as_str(),
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "garbage",
    ] {
        // Beside a valid X-Trace-Id: that one is the trace, and the trace restarts from it.
        let (echoed, seen) =
            order(&base, &[("traceparent", malformed), ("x-trace-id", &trace)]).await;
        assert_eq!(
            echoed.trace_id.as_deref(),
            Some(trace.as_str()),
            "{malformed}"
        );
        assert_eq!(seen.call_trace_id, trace);
        let sent: TraceParent = seen.from_call.traceparent.unwrap().parse().unwrap();
        assert_eq!(sent.trace_id().to_string(), trace);
        assert_ne!(sent.parent_id(), 0);
        assert_eq!(sent.flags(), 0, "samekey recorded nothing: not sampled");
        // Alone: a new trace, still no 400.
        let (echoed, seen) = order(&base, &[("traceparent", malformed)]).await;
        let new_trace = echoed.trace_id.unwrap();
        assert_ne!(new_trace, trace);
        assert_eq!(seen.call_trace_id, new_trace);
    }
}
