//! The Idempotency-Key layer's cost, side by side in one run: a bare axum handler, then the same
//! behind the layer — a fresh request (claim, run, store the response) and a replay (one read) — on the
//! memory store and, with `SAMEKEY_PG_URL` set and feature `postgres`, on PostgreSQL. Requests go
//! through the router in process (`tower::ServiceExt::oneshot`), each in a task on the server's
//! runtime as a server runs it: no sockets, so what is measured is the layer.
//!
//! ```text
//! cargo bench -p samekey-http --bench layer
//! eval "$(scripts/services start)"
//! cargo bench -p samekey-http --bench layer --features postgres
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use axum::routing::post;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use samekey::{MemoryStore, Runtime, Store};
use samekey_http::IdempotencyLayer;
use tower::ServiceExt;

async fn create() -> &'static str {
    r#"{"id":1,"status":"created"}"#
}

fn request(key: Option<&str>) -> Request<Body> {
    let mut request = Request::post("/orders").header("content-type", "application/json");
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    request
        .body(Body::from(r#"{"item":"book","qty":1}"#))
        .expect("a request")
}

fn stores(tokio: &tokio::runtime::Runtime) -> Vec<(&'static str, Arc<dyn Store>)> {
    // Pushed to by the backends this build has features for.
    #[allow(unused_mut)]
    let mut all: Vec<(&'static str, Arc<dyn Store>)> =
        vec![("memory", Arc::new(MemoryStore::new()))];
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("SAMEKEY_PG_URL") {
        let store = tokio
            .block_on(samekey_runtime::store::PgStore::connect(&url))
            .expect("connect to PostgreSQL");
        all.push(("postgres", Arc::new(store)));
    }
    #[cfg(not(feature = "postgres"))]
    let _ = tokio;
    all
}

fn layer(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let mut group = c.benchmark_group("idempotency_layer");
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(5));
    let bare = Router::new().route("/orders", post(create));
    group.bench_function("bare handler", |b| {
        b.to_async(&tokio).iter(|| async {
            let response = tokio::spawn(bare.clone().oneshot(request(None)))
                .await
                .expect("joined")
                .expect("served");
            assert!(response.status().is_success());
        })
    });
    for (name, store) in stores(&tokio) {
        let rt = Runtime::builder()
            .node("bench")
            .shared_store(store)
            .build()
            .expect("runtime");
        let app = Router::new()
            .route("/orders", post(create))
            .layer(IdempotencyLayer::new().runtime(&rt));
        let next = AtomicU64::new(0);
        let run = format!("{:x}", samekey::TraceId::new().as_u128());
        group.bench_function(format!("fresh/{name}"), |b| {
            b.to_async(&tokio).iter(|| async {
                let key = format!("\"k-{run}-{}\"", next.fetch_add(1, Ordering::Relaxed));
                let response = tokio::spawn(app.clone().oneshot(request(Some(&key))))
                    .await
                    .expect("joined")
                    .expect("served");
                assert!(response.status().is_success());
            })
        });
        let key = format!("\"replayed-{run}\"");
        tokio
            .block_on(app.clone().oneshot(request(Some(&key))))
            .expect("first");
        group.bench_function(format!("replay/{name}"), |b| {
            b.to_async(&tokio).iter(|| async {
                let response = tokio::spawn(app.clone().oneshot(request(Some(&key))))
                    .await
                    .expect("joined")
                    .expect("served");
                assert_eq!(response.headers()["idempotent-replayed"], "true");
            })
        });
    }
    group.finish();
}

criterion_group!(benches, layer);
criterion_main!(benches);
