//! The HTTP wire, in-process: each node serves a payments API behind samekey-http's
//! `CallContextLayer` and `IdempotencyLayer` (tower, called directly — no socket), whose handler
//! charges the gateway itself, relying on the layer for idempotency; customers call it through an
//! `#[idempotent]` function whose client is reqwest with samekey-http's `CallHeaders` middleware,
//! the request ending in the simulation's network ([`InProcess`]) instead of a socket.
//!
//! The handler answers as real handlers do: `201 Created` with the charge; sometimes `303 See Other`
//! to the charge it created (POST-redirect-GET); sometimes `502 Bad Gateway` after the charge, when
//! a step after it failed upstream. Between client and server the network loses requests and
//! replies, or delivers replies late.

use std::convert::Infallible;
use std::sync::{Arc, Weak};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use samekey::{idempotent, Classify, ErrorClass};
use samekey_http::{classify_status, CallContextLayer, CallHeaders, IdempotencyLayer, RequestIds};
use serde::{Deserialize, Serialize};
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};

use crate::coverage::{Fault, Surface};
use crate::network::carry;
use crate::payments::{Charged, PayError, Payments};
use crate::store::Life;
use crate::world::{Served, World};

/// What the API takes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PayRequest {
    order: String,
    amount: u64,
}

/// What the API answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PayResponse {
    no: u64,
}

fn respond(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

/// A node's payments API: the handler behind the layers, as a tower service.
pub type ApiService = BoxCloneSyncService<Request<Full<Bytes>>, Response<Full<Bytes>>, Infallible>;

/// The API of the node whose service is `payments`: built once per node incarnation, as a server
/// builds its router once (the layer keeps one operation per instance).
pub fn api(payments: Weak<Payments>, rt: &samekey::Runtime) -> ApiService {
    let handler = tower::service_fn(move |req: Request<Full<Bytes>>| {
        let payments = payments.upgrade();
        async move {
            Ok::<_, Infallible>(match payments {
                Some(payments) => payments.api(req).await,
                None => respond(StatusCode::SERVICE_UNAVAILABLE, b"shutting down".to_vec()),
            })
        }
    });
    BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(CallContextLayer::new())
            .layer(IdempotencyLayer::new().runtime(rt))
            .service(handler),
    )
}

impl Payments {
    /// Serves one request of the payments API through the layers.
    pub async fn serve_http(
        self: Arc<Self>,
        request: Request<Full<Bytes>>,
    ) -> Response<Full<Bytes>> {
        let Ok(response) = self.api.clone().oneshot(request).await;
        response
    }

    /// The handler: charges the gateway under the request's callId, then answers.
    async fn api(&self, req: Request<Full<Bytes>>) -> Response<Full<Bytes>> {
        let (response, order) = self.handle(req).await;
        self.world.shared.history.log(
            format!("{}/api", self.life.name),
            order.as_deref(),
            format!("handler answers {}", response.status()),
        );
        response
    }

    async fn handle(&self, req: Request<Full<Bytes>>) -> (Response<Full<Bytes>>, Option<String>) {
        let ids = req.extensions().get::<RequestIds>().cloned();
        let body = match req.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => match e {},
        };
        let Ok(pay) = serde_json::from_slice::<PayRequest>(&body) else {
            return (
                respond(StatusCode::BAD_REQUEST, b"not a payment".to_vec()),
                None,
            );
        };
        let Some(call_id) = ids.as_ref().and_then(|i| i.call_id.clone()) else {
            return (
                respond(StatusCode::BAD_REQUEST, b"no X-Call-Id".to_vec()),
                Some(pay.order),
            );
        };
        let trace = ids.map(|i| i.trace_id).unwrap_or_default();
        // The handler's own deadline on its upstream call, as any handler has.
        let charged = self.charge_upstream(&call_id, trace, &pay.order).await;
        let shared = &self.world.shared;
        let response = match charged {
            Ok(c) => {
                let body = serde_json::to_vec(&PayResponse { no: c.no }).unwrap_or_default();
                let answer = shared.answer_after_effect(
                    [Fault::AnsweredRedirect, Fault::Answered5xx],
                    Surface::Http,
                );
                match answer {
                    Some(Fault::AnsweredRedirect) => {
                        let mut r = respond(StatusCode::SEE_OTHER, body);
                        if let Ok(location) = format!("/payments/{}", c.no).parse() {
                            r.headers_mut().insert(http::header::LOCATION, location);
                        }
                        r
                    }
                    Some(_) => respond(
                        StatusCode::BAD_GATEWAY,
                        b"the receipt service failed after the charge".to_vec(),
                    ),
                    None => respond(StatusCode::CREATED, body),
                }
            }
            Err(PayError::Declined) => respond(StatusCode::PAYMENT_REQUIRED, b"declined".to_vec()),
            Err(PayError::Refused(why)) => {
                respond(StatusCode::UNPROCESSABLE_ENTITY, why.into_bytes())
            }
            Err(PayError::Unavailable) => respond(
                StatusCode::SERVICE_UNAVAILABLE,
                b"gateway unavailable".to_vec(),
            ),
            Err(e) => {
                // The handler logs what went wrong: the error's `Classify` and `Display` run.
                let class = e.classify();
                respond(
                    StatusCode::BAD_GATEWAY,
                    format!("upstream failed ({class:?}): {e}").into_bytes(),
                )
            }
        };
        (response, Some(pay.order))
    }

    /// The client side: pays through the API of another node, under this call's callId (the
    /// middleware sends it as `X-Call-Id` and `Idempotency-Key`, the same on every attempt).
    #[idempotent(
        key = "order + \"pay\"",
        scope = "sim.pay_api",
        runtime = &self.rt,
        timeout = "2s",
        on_unknown = "rerun",
        verify = "amount",
        inputs = "order, amount"
    )]
    pub async fn pay_api(&self, order: &str, amount: u64) -> Result<Charged, PayError> {
        let sent = self
            .client
            .post("http://payments.sim/payments")
            .body(
                serde_json::to_vec(&PayRequest {
                    order: order.to_owned(),
                    amount,
                })
                .unwrap_or_default(),
            )
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            // Nothing was sent to a node that was down; anything else may have been served.
            Err(e) if e.to_string().contains("connection refused") => {
                return Err(PayError::Unavailable)
            }
            Err(_) => return Err(PayError::TimedOut),
        };
        let status = response.status();
        let class = classify_status(&http::Method::POST, status, response.headers());
        let body = response.bytes().await.map_err(|_| PayError::TimedOut)?;
        match class {
            None => serde_json::from_slice::<PayResponse>(&body)
                .map(|p| Charged {
                    no: p.no,
                    trap: Default::default(),
                })
                .map_err(|_| PayError::TimedOut),
            Some(ErrorClass::Permanent) if status == StatusCode::PAYMENT_REQUIRED => {
                Err(PayError::Declined)
            }
            Some(ErrorClass::Permanent) => Err(PayError::Refused(
                String::from_utf8_lossy(&body).into_owned(),
            )),
            Some(ErrorClass::Rejected) => Err(PayError::Declined),
            Some(ErrorClass::Retryable) => Err(PayError::Unavailable),
            Some(ErrorClass::RateLimited { retry_after }) => Err(PayError::Later(retry_after)),
            Some(ErrorClass::Unknown) => Err(PayError::TimedOut),
        }
    }
}

/// The client of node `life`: reqwest with samekey-http's `CallHeaders`, ending in [`InProcess`].
pub fn client(world: &Arc<World>, life: &Arc<Life>) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(CallHeaders::new())
        .with(InProcess {
            world: Arc::clone(world),
            life: Arc::clone(life),
        })
        .build()
}

/// The last middleware: carries the request over the simulation's network to a node's API, and its
/// response back, with the network's faults.
pub struct InProcess {
    world: Arc<World>,
    life: Arc<Life>,
}

#[async_trait::async_trait]
impl Middleware for InProcess {
    async fn handle(
        &self,
        req: reqwest::Request,
        _extensions: &mut http::Extensions,
        _next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let mut builder = Request::builder()
            .method(req.method().clone())
            .uri(req.url().as_str());
        for (name, value) in req.headers() {
            builder = builder.header(name, value);
        }
        let body = req
            .body()
            .and_then(|b| b.as_bytes())
            .map(Bytes::copy_from_slice)
            .unwrap_or_default();
        let Ok(request) = builder.body(Full::new(body)) else {
            return Err(reqwest_middleware::Error::middleware(
                std::io::Error::other("bad request"),
            ));
        };
        let served = carry(
            &self.world,
            &self.life,
            "http",
            move |p: Arc<Payments>| async move {
                let response = p.serve_http(request).await;
                let (parts, body) = response.into_parts();
                let bytes = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                Response::from_parts(parts, bytes)
            },
        )
        .await;
        match served {
            Served::Answered(response) => Ok(reqwest::Response::from(response)),
            Served::Refused => Err(reqwest_middleware::Error::middleware(
                std::io::Error::other("connection refused"),
            )),
            Served::Lost => Err(reqwest_middleware::Error::middleware(
                std::io::Error::other("connection reset"),
            )),
        }
    }
}
