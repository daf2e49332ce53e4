//! The OpenTelemetry side of trace context (feature `opentelemetry`): the active span, read through
//! `tracing-opentelemetry`'s layer or OpenTelemetry's own current context, and the parenting of the
//! `samekey` span an integration opens.
//!
//! # Guarantees
//!
//! * A span is the "active OpenTelemetry span" only when its context is valid (non-zero trace-id and
//!   span-id); an invalid one counts as none.
//! * [`active_traceparent`] answers a span of the asked trace only: a call never sends a parent-id
//!   of another trace beside its own traceId.
//! * [`parent_span`] never panics and never fails a request: a span it cannot parent (no layer, or
//!   already started) is left as it is, logged at debug.

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId as OtelTraceId, TraceState,
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::call_id::{TraceId, TraceParent};

/// The OpenTelemetry context of the active span: the current `tracing` span's (through
/// `tracing-opentelemetry`'s layer), else OpenTelemetry's own current context's; `None` when
/// neither holds a valid span.
fn active() -> Option<opentelemetry::Context> {
    let from_tracing = tracing::Span::current().context();
    if from_tracing.span().span_context().is_valid() {
        return Some(from_tracing);
    }
    let current = opentelemetry::Context::current();
    current.span().span_context().is_valid().then_some(current)
}

/// The active OpenTelemetry span as a `traceparent`, when there is one of trace `trace`: its span-id
/// as the parent-id, its flags.
pub(crate) fn active_traceparent(trace: TraceId) -> Option<TraceParent> {
    let cx = active()?;
    let span = cx.span();
    let sc = span.span_context();
    let trace_id = u128::from_be_bytes(sc.trace_id().to_bytes());
    (trace_id == trace.as_u128()).then(|| {
        TraceParent::new(
            trace,
            u64::from_be_bytes(sc.span_id().to_bytes()),
            sc.trace_flags().to_u8(),
        )
    })
}

/// See [`crate::context::parent_span`].
pub(crate) fn parent_span(span: &tracing::Span, inbound: Option<&TraceParent>) {
    let parent = match (active(), inbound) {
        (Some(active), _) => active,
        (None, Some(tp)) => {
            let remote = SpanContext::new(
                OtelTraceId::from(tp.trace_id().as_u128()),
                SpanId::from(tp.parent_id()),
                TraceFlags::new(tp.flags()),
                true,
                TraceState::default(),
            );
            opentelemetry::Context::current().with_remote_span_context(remote)
        }
        (None, None) => return,
    };
    if let Err(e) = span.set_parent(parent) {
        tracing::debug!(error = %e, "samekey: the span could not be given its OpenTelemetry parent");
    }
}
