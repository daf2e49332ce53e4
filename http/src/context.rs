//! The call context layer: `X-Call-Id`, `X-Trace-Id` and W3C `traceparent` in, into samekey's context
//! for the handler, and the first two back out on the response.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use samekey_runtime::{context::InboundCall, CallId, TraceId, TraceParent};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument as _;

use crate::headers::{TRACEPARENT, X_CALL_ID, X_CALL_ID_SOURCE, X_TRACE_ID};
use crate::problem::Problem;

/// Where a request's callId came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallIdSource {
    /// The caller sent it (`X-Call-Id`).
    Caller,
    /// The caller sent none; this gateway made one (`X-Call-Id-Source: gateway`).
    Gateway,
    /// The caller sent none, and this service does not fill it: the handler's first `#[idempotent]`
    /// call makes its own.
    None,
}

impl CallIdSource {
    /// Its name in a tracing span's `call_id_source` field: `caller`, `gateway` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            CallIdSource::Caller => "caller",
            CallIdSource::Gateway => "gateway",
            CallIdSource::None => "none",
        }
    }
}

/// The ids of a request, in its extensions for the handler (`Extension<RequestIds>` in axum).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestIds {
    /// The callId the request carried (or the gateway filled).
    pub call_id: Option<CallId>,
    /// The traceId it carried (a valid `traceparent`'s trace-id, else `X-Trace-Id`), or a new one.
    pub trace_id: TraceId,
    /// Where the callId came from.
    pub source: CallIdSource,
    /// The W3C `traceparent` it carried, when it was valid.
    pub traceparent: Option<TraceParent>,
}

/// Adopts `X-Call-Id` and `X-Trace-Id` into samekey's context for the handler: the first
/// `#[idempotent]` call the handler makes keeps the inbound callId (as every attempt of the caller's
/// logical call carried it), and every call in it the traceId. A malformed id is a 400 with an RFC 9457
/// problem body (nothing runs). Both ids are echoed on the response.
///
/// A W3C `traceparent` ([W3C Trace Context](https://www.w3.org/TR/trace-context/#traceparent-header))
/// gives the traceId too, for services that run OpenTelemetry: a valid one's trace-id is the traceId,
/// and **wins over `X-Trace-Id`** when both arrive and disagree (the traceparent is what the
/// OpenTelemetry side of the caller records; the request passed on carries `X-Trace-Id` rewritten to
/// it). The handler's calls pass it on ([`InboundCall::traceparent`]; the
/// [`CallHeaders`](crate::CallHeaders) client sends it), and the request passed on keeps the header as
/// it came. A malformed `traceparent` is ignored, logged at debug — W3C Trace Context §3.2: a receiver
/// that cannot parse it restarts the trace — whereas a malformed `X-Trace-Id` stays a 400. The response
/// gets no `traceparent` (W3C defines none on responses).
///
/// In gateway mode ([`CallContextLayer::gateway`]) a request without a callId gets one, made here and
/// marked `X-Call-Id-Source: gateway` on the request passed on and on the response, instead of one
/// invented silently further down. A callId that arrived is passed through untouched.
///
/// The rest of the request (the inner services and the handler) runs in a tracing span named
/// `samekey` with the fields `call_id` (when there is one), `trace_id` and `call_id_source`
/// (`caller`, `gateway` or `none`, see [`CallIdSource`]), so that every event the handler logs
/// carries the ids. Under tower-http's `TraceLayer` it is a child of the request's span. With feature
/// `opentelemetry` it is made a child of the active OpenTelemetry span, else of the remote span the
/// inbound `traceparent` names ([`parent_span`](samekey_runtime::context::parent_span)).
///
/// Compose it outside the [`IdempotencyLayer`](crate::IdempotencyLayer), so that the Idempotency-Key
/// layer's call adopts the request's callId, and inside tower-http's request-id and trace layers (it
/// reads and writes only its own headers).
#[derive(Debug, Clone)]
pub struct CallContextLayer {
    gateway: Option<(String, String)>,
}

impl Default for CallContextLayer {
    fn default() -> Self {
        CallContextLayer::new()
    }
}

impl CallContextLayer {
    /// A service's layer: adopts the ids a request carries, fills nothing.
    pub fn new() -> CallContextLayer {
        CallContextLayer { gateway: None }
    }

    /// A gateway's layer: a request without `X-Call-Id` gets a callId made here (prefix `prefix`,
    /// node `node`, e.g. `("gw", "edge-1")`), marked as gateway-made. Panics on an invalid prefix or
    /// node (letters, digits, `_`, `.`, `-`): a configuration error, found at startup.
    pub fn gateway(prefix: &str, node: &str) -> CallContextLayer {
        if let Err(e) = CallId::new(prefix, node) {
            panic!("CallContextLayer::gateway: {e}");
        }
        CallContextLayer {
            gateway: Some((prefix.to_owned(), node.to_owned())),
        }
    }
}

impl<S> Layer<S> for CallContextLayer {
    type Service = CallContext<S>;

    fn layer(&self, inner: S) -> CallContext<S> {
        CallContext {
            inner,
            gateway: self.gateway.clone(),
        }
    }
}

/// The service of [`CallContextLayer`].
#[derive(Debug, Clone)]
pub struct CallContext<S> {
    inner: S,
    gateway: Option<(String, String)>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Reads an id header: absent, or parsed, or the 400 that refuses it.
fn read<T: std::str::FromStr>(
    headers: &HeaderMap,
    name: &http::HeaderName,
) -> Result<Option<T>, Problem>
where
    T::Err: std::fmt::Display,
{
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let invalid = |why: String| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid-call-context",
            "Invalid call context header",
            format!("the `{name}` header is not valid: {why}"),
        )
    };
    let text = value
        .to_str()
        .map_err(|_| invalid("it is not visible ASCII".into()))?;
    text.trim()
        .parse()
        .map(Some)
        .map_err(|e: T::Err| invalid(e.to_string()))
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for CallContext<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: From<Bytes> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let ids = (|| {
            let call_id: Option<CallId> = read(request.headers(), &X_CALL_ID)?;
            let trace_id: Option<TraceId> = read(request.headers(), &X_TRACE_ID)?;
            Ok::<_, Problem>((call_id, trace_id))
        })();
        let (call_id, trace_id) = match ids {
            Ok(ids) => ids,
            Err(problem) => {
                return Box::pin(std::future::ready(Ok(problem.response())));
            }
        };
        let traceparent = read_traceparent(request.headers());
        let trace_id = match traceparent {
            Some(tp) => tp.trace_id(),
            None => trace_id.unwrap_or_default(),
        };
        let (call_id, source) = match (call_id, &self.gateway) {
            (Some(id), _) => (Some(id), CallIdSource::Caller),
            (None, Some((prefix, node))) => match CallId::new(prefix, node) {
                Ok(id) => (Some(id), CallIdSource::Gateway),
                Err(_) => (None, CallIdSource::None),
            },
            (None, None) => (None, CallIdSource::None),
        };
        let ids = RequestIds {
            call_id,
            trace_id,
            source,
            traceparent,
        };
        ids.stamp(request.headers_mut());
        let mut inbound = InboundCall::new().trace_id(trace_id);
        if let Some(tp) = traceparent {
            inbound = inbound.traceparent(tp);
        }
        if let Some(id) = ids.call_id.clone() {
            inbound = inbound.call_id(id);
        }
        request.extensions_mut().insert(ids.clone());
        let span = tracing::info_span!(
            "samekey",
            call_id = ids.call_id.as_deref(),
            trace_id = %ids.trace_id,
            call_id_source = ids.source.as_str(),
        );
        samekey_runtime::context::parent_span(&span, traceparent.as_ref());
        let handled = span.in_scope(|| self.inner.call(request));
        Box::pin(async move {
            let mut response = inbound.scope(handled).instrument(span).await?;
            ids.stamp(response.headers_mut());
            Ok(response)
        })
    }
}

/// A request's `traceparent`, if it has one that parses ([`TraceParent::from_header_values`]).
fn read_traceparent(headers: &HeaderMap) -> Option<TraceParent> {
    TraceParent::from_header_values(headers.get_all(&TRACEPARENT).iter().map(|v| v.as_bytes()))
}

impl RequestIds {
    /// Writes the ids on a request passed on, or echoes them on its response.
    fn stamp(&self, headers: &mut HeaderMap) {
        if let Some(value) = self
            .call_id
            .as_ref()
            .and_then(|id| HeaderValue::from_str(id).ok())
        {
            headers.insert(X_CALL_ID, value);
        }
        if self.source == CallIdSource::Gateway {
            headers.insert(X_CALL_ID_SOURCE, HeaderValue::from_static("gateway"));
        }
        if let Ok(value) = HeaderValue::from_str(&self.trace_id.to_string()) {
            headers.insert(X_TRACE_ID, value);
        }
    }
}
