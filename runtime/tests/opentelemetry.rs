//! Feature `opentelemetry`: the `samekey` span an integration opens is parented to the active
//! OpenTelemetry span, else to the remote span the inbound `traceparent` names; a call's outbound
//! `traceparent` names the active span of its trace. Spans go through `tracing-opentelemetry`'s layer
//! to an in-memory exporter, whose finished spans say who their parents are.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use samekey_runtime::at_most_once::AtMostOnce;
use samekey_runtime::context::{outbound_traceparent, parent_span, InboundCall};
use samekey_runtime::{Runtime, TraceId, TraceParent};
use tracing_subscriber::layer::SubscriberExt as _;

/// Runs `f` under a subscriber that exports every span to memory, and answers the spans it finished.
fn exported(f: impl FnOnce()) -> Vec<SpanData> {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("samekey-test")));
    tracing::subscriber::with_default(subscriber, f);
    provider.force_flush().unwrap();
    exporter.get_finished_spans().unwrap()
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no span {name} in {spans:?}"))
}

fn trace_of(span: &SpanData) -> u128 {
    u128::from_be_bytes(span.span_context.trace_id().to_bytes())
}

fn id_of(span: &SpanData) -> u64 {
    u64::from_be_bytes(span.span_context.span_id().to_bytes())
}

fn parent_of(span: &SpanData) -> u64 {
    u64::from_be_bytes(span.parent_span_id.to_bytes())
}

static CALL: AtMostOnce = AtMostOnce::new("tests.opentelemetry.call");

const INBOUND: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn without_an_active_span_the_inbound_traceparent_is_the_remote_parent() {
    let inbound: TraceParent = INBOUND.parse().unwrap();
    let spans = exported(|| {
        let span = tracing::info_span!("samekey");
        parent_span(&span, Some(&inbound));
        span.in_scope(|| {
            // Inside the span, a request of this trace names the span as its parent.
            let sent = block_on(
                InboundCall::new()
                    .traceparent(inbound)
                    .scope(async { outbound_traceparent() }),
            )
            .unwrap();
            assert_eq!(sent.trace_id(), inbound.trace_id());
            assert_ne!(
                sent.parent_id(),
                inbound.parent_id(),
                "the samekey span's id"
            );
            assert!(
                sent.sampled(),
                "the span's decision: its parent was sampled"
            );
            // A call's: the same, on every attempt.
            let rt = Runtime::new();
            let from_call = block_on(InboundCall::new().traceparent(inbound).scope(
                CALL.key("o-1").runtime(&rt).run(|| async {
                    Ok::<_, samekey_runtime::Error>(samekey_runtime::current().traceparent())
                }),
            ))
            .unwrap();
            assert_eq!(from_call, sent);
        });
    });
    let samekey = named(&spans, "samekey");
    assert_eq!(trace_of(samekey), inbound.trace_id().as_u128());
    assert_eq!(parent_of(samekey), inbound.parent_id());
    assert!(samekey.parent_span_is_remote);
}

#[test]
fn an_active_span_is_the_parent_and_is_named_by_the_outbound_traceparent() {
    let inbound: TraceParent = INBOUND.parse().unwrap();
    let mut sent = Vec::new();
    let spans = exported(|| {
        let server = tracing::info_span!("server");
        let _entered = server.enter();
        let span = tracing::info_span!("samekey");
        // Of another trace than the active span's: the active span wins.
        parent_span(&span, Some(&inbound));
        span.in_scope(|| {
            let of_its_trace = block_on(
                InboundCall::new()
                    .traceparent(inbound)
                    .scope(async { outbound_traceparent() }),
            );
            sent.push(of_its_trace);
        });
    });
    let server = named(&spans, "server");
    let samekey = named(&spans, "samekey");
    assert_eq!(parent_of(samekey), id_of(server));
    assert_eq!(trace_of(samekey), trace_of(server));
    assert!(!samekey.parent_span_is_remote);
    // The active span is of another trace than the call's: its traceparent is passed on unchanged.
    assert_eq!(sent, [Some(inbound)]);
}

#[test]
fn without_any_parent_nothing_changes() {
    let spans = exported(|| {
        let span = tracing::info_span!("samekey");
        parent_span(&span, None);
        span.in_scope(|| {
            let trace = TraceId::new();
            let sent = block_on(
                InboundCall::new()
                    .trace_id(trace)
                    .scope(async { outbound_traceparent() }),
            )
            .unwrap();
            assert_eq!(sent.trace_id(), trace, "the span is of another trace");
            assert_eq!(sent.flags(), 0);
        });
    });
    let samekey = named(&spans, "samekey");
    assert_eq!(parent_of(samekey), 0, "a root");
}

/// Polls a future that never waits (an `InboundCall` scope around a ready block) on this thread, so
/// that the subscriber set for it is the one that sees it.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}
