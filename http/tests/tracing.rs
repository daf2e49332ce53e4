//! The call context in tracing: behind tower-http's `TraceLayer`, the request runs in a `samekey` span
//! carrying its callId, traceId and where the callId came from, a child of the request's span — and
//! the handler's events (past the Idempotency-Key layer's spawn) are inside it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::routing::post;
use axum::Router;
use samekey_http::{CallContextLayer, IdempotencyLayer};
use tower_http::trace::TraceLayer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

/// A span as it was opened: its name, its fields, its parent's name.
#[derive(Debug, Clone)]
struct Opened {
    id: u64,
    name: &'static str,
    fields: BTreeMap<String, String>,
    parent: Option<&'static str>,
}

/// An event: its message, and the ids of the spans it happened in (innermost first).
#[derive(Debug, Clone)]
struct Logged {
    message: String,
    scope: Vec<u64>,
}

/// What the subscriber saw: the spans opened, the events logged.
#[derive(Clone, Default)]
struct Capture {
    spans: Arc<Mutex<Vec<Opened>>>,
    events: Arc<Mutex<Vec<Logged>>>,
}

#[derive(Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        let parent = ctx
            .span(id)
            .and_then(|span| span.parent())
            .map(|parent| parent.name());
        self.spans.lock().unwrap().push(Opened {
            id: id.into_u64(),
            name: attrs.metadata().name(),
            fields: fields.0,
            parent,
        });
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let scope = ctx
            .event_scope(event)
            .map(|scope| scope.map(|span| span.id().into_u64()).collect())
            .unwrap_or_default();
        let message = fields.0.remove("message").unwrap_or_default();
        self.events.lock().unwrap().push(Logged { message, scope });
    }
}

async fn charge() -> &'static str {
    tracing::info!("charging");
    "charged"
}

#[tokio::test]
async fn requests_run_in_a_span_with_their_ids() {
    let capture = Capture::default();
    let _default = tracing::subscriber::set_default(Registry::default().with(capture.clone()));
    let rt = samekey::Runtime::builder().node("api-1").build().unwrap();
    let app = Router::new()
        .route("/charges", post(charge))
        .layer(IdempotencyLayer::new().runtime(&rt))
        .layer(CallContextLayer::gateway("gw", "edge-1"))
        .layer(TraceLayer::new_for_http());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::new();

    let call_id = samekey::CallId::new("ord", "client-1").unwrap().to_string();
    let trace_id = samekey::TraceId::new().to_string();
    let sent = client
        .post(format!("{base}/charges"))
        .header("idempotency-key", "\"k-1\"")
        .header("x-call-id", &call_id)
        .header("x-trace-id", &trace_id)
        .send()
        .await
        .unwrap();
    assert_eq!(sent.text().await.unwrap(), "charged");
    // Without a callId, the gateway fills one: the span says so.
    let filled = client
        .post(format!("{base}/charges"))
        .header("idempotency-key", "\"k-2\"")
        .send()
        .await
        .unwrap();
    let filled_id = filled.headers()["x-call-id"].to_str().unwrap().to_owned();
    let filled_trace = filled.headers()["x-trace-id"].to_str().unwrap().to_owned();
    assert_eq!(filled.text().await.unwrap(), "charged");

    let spans: Vec<Opened> = capture
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|span| span.name == "samekey")
        .cloned()
        .collect();
    assert_eq!(spans.len(), 2, "{spans:?}");
    let expected = [
        (&call_id, &trace_id, "caller"),
        (&filled_id, &filled_trace, "gateway"),
    ];
    for (span, (call_id, trace_id, source)) in spans.iter().zip(expected) {
        let field = |name: &str| span.fields.get(name).map(String::as_str);
        assert_eq!(field("call_id"), Some(call_id.as_str()), "{span:?}");
        assert_eq!(field("trace_id"), Some(trace_id.as_str()), "{span:?}");
        assert_eq!(field("call_id_source"), Some(source), "{span:?}");
        assert_eq!(
            span.parent,
            Some("request"),
            "inside tower-http's request span"
        );
    }
    let events = capture.events.lock().unwrap().clone();
    let charging: Vec<_> = events
        .iter()
        .filter(|event| event.message == "charging")
        .collect();
    assert_eq!(charging.len(), 2, "{events:?}");
    for (event, span) in charging.iter().zip(&spans) {
        assert!(
            event.scope.contains(&span.id),
            "the handler's event is in its request's samekey span: {event:?}"
        );
    }
}
