//! The server's call context layer: `x-call-id` and `x-trace-id` metadata in, into samekey's context
//! for the method, and back out on the reply.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use http::{HeaderMap, HeaderValue, Request, Response};
use samekey_runtime::{context::InboundCall, CallId, TraceId, TraceParent};
use tonic::Status;
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument as _;

use crate::metadata::{TRACEPARENT, X_CALL_ID, X_CALL_ID_SOURCE, X_TRACE_ID};

/// Where a call's callId came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallIdSource {
    /// The caller sent it (`x-call-id`).
    Caller,
    /// The caller sent none; this gateway made one (`x-call-id-source: gateway`).
    Gateway,
    /// The caller sent none, and this service does not fill it.
    None,
}

impl CallIdSource {
    /// Its name in the `samekey` span's `call_id_source` field.
    pub fn as_str(self) -> &'static str {
        match self {
            CallIdSource::Caller => "caller",
            CallIdSource::Gateway => "gateway",
            CallIdSource::None => "none",
        }
    }
}

/// The ids of a call, in its request's extensions (`request.extensions().get::<CallIds>()` in a tonic
/// method).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallIds {
    /// The callId the call carried (or the gateway filled).
    pub call_id: Option<CallId>,
    /// The traceId it carried (a valid `traceparent`'s trace-id, else `x-trace-id`), or a new one.
    pub trace_id: TraceId,
    /// Where the callId came from.
    pub source: CallIdSource,
    /// The W3C `traceparent` it carried, when it was valid.
    pub traceparent: Option<TraceParent>,
}

/// Adopts `x-call-id` and `x-trace-id` metadata into samekey's context for the method: the first
/// `#[idempotent]` call the method makes keeps the inbound callId (as every attempt of the caller's
/// logical call carried it), and every call in it the traceId. A malformed id is refused with
/// `INVALID_ARGUMENT` and a message naming the entry (nothing runs). Both ids are echoed in the reply's
/// metadata.
///
/// In gateway mode ([`CallContextLayer::gateway`]) a call without a callId gets one, made here and
/// marked `x-call-id-source: gateway` on the request passed on and on the reply.
///
/// A W3C `traceparent` entry (as OpenTelemetry's gRPC propagation sends it) gives the call its traceId
/// and wins over `x-trace-id` when both arrive and disagree; the method's calls pass it on
/// ([`CallMetadataLayer`](crate::CallMetadataLayer) sends it). A malformed `traceparent` is ignored,
/// logged at debug (W3C Trace Context §3.2: the trace restarts), while a malformed `x-trace-id` is
/// refused. With samekey-runtime's feature `opentelemetry`, the `samekey` span is a child of the active
/// OpenTelemetry span, else of the remote span the inbound `traceparent` names.
///
/// The method runs in a tracing span named `samekey` with the fields `call_id`, `trace_id` and
/// `call_id_source`. Put it outside the [`IdempotencyLayer`](crate::IdempotencyLayer):
/// `Server::builder().layer(CallContextLayer::new()).layer(IdempotencyLayer::new())`.
#[derive(Debug, Clone, Default)]
pub struct CallContextLayer {
    gateway: Option<(String, String)>,
}

impl CallContextLayer {
    /// A service's layer: adopts the ids a call carries, fills nothing.
    pub fn new() -> CallContextLayer {
        CallContextLayer::default()
    }

    /// A gateway's layer: a call without `x-call-id` gets a callId made here (prefix `prefix`, node
    /// `node`), marked as gateway-made. Panics on an invalid prefix or node (letters, digits, `_`,
    /// `.`, `-`): a configuration error, found at startup.
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

/// Reads an id entry: absent, parsed, or the `INVALID_ARGUMENT` that refuses it.
fn read<T: std::str::FromStr>(headers: &HeaderMap, name: &str) -> Result<Option<T>, Status>
where
    T::Err: std::fmt::Display,
{
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let invalid = |why: String| {
        Status::invalid_argument(format!("the `{name}` metadata is not valid: {why}"))
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
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Response<ResBody>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        let ids = (|| {
            let call_id: Option<CallId> = read(request.headers(), X_CALL_ID)?;
            let trace_id: Option<TraceId> = read(request.headers(), X_TRACE_ID)?;
            Ok::<_, Status>((call_id, trace_id))
        })();
        let (call_id, trace_id) = match ids {
            Ok(ids) => ids,
            Err(status) => return Box::pin(std::future::ready(Ok(status.into_http()))),
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
        let ids = CallIds {
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
    TraceParent::from_header_values(headers.get_all(TRACEPARENT).iter().map(|v| v.as_bytes()))
}

impl CallIds {
    /// Writes the ids on a request passed on, or echoes them on its reply.
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
