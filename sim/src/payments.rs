//! The service every node runs: `#[idempotent]` functions that charge through a gateway, as a user
//! writes them — with `lookup`, with `on_unknown = "hold"`, with `on_unknown = "rerun"`, and one that
//! nests another — and the value and error types whose `Serialize`, `Classify` and `Display` can be
//! made to panic.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use samekey::{idempotent, Classify, ErrorClass, Runtime};
use serde::{Deserialize, Serialize, Serializer};

use crate::gateway::Gateway;
use crate::store::Life;
use crate::world::World;

/// How long the API's handlers wait for the gateway.
pub const UPSTREAM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Where an armed [`Trap`] goes off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrapOn {
    /// In the body, once the gateway answered.
    Body,
    /// In the value's `Serialize`.
    Serialize,
    /// In the error's `Classify`.
    Classify,
    /// In the error's `Display`.
    Display,
}

/// A panic waiting in a value or an error, armed by the gateway for one reply: it goes off once.
#[derive(Debug, Clone, Default)]
pub struct Trap(Option<Arc<(TrapOn, AtomicBool)>>);

impl Trap {
    /// A trap that goes off once, at `on`.
    pub fn armed(on: TrapOn) -> Trap {
        Trap(Some(Arc::new((on, AtomicBool::new(true)))))
    }

    /// Panics if armed for `on` (once).
    pub fn spring(&self, on: TrapOn) {
        if let Some(trap) = &self.0 {
            if trap.0 == on && trap.1.swap(false, Ordering::SeqCst) {
                panic!("sim: user code panicked ({on:?})");
            }
        }
    }
}

/// What a charge answers: the gateway's charge number.
#[derive(Debug, Clone, Deserialize)]
pub struct Charged {
    /// The gateway's number of the effect: one per effect, never reused.
    pub no: u64,
    /// A panic waiting in this value (never stored).
    #[serde(skip)]
    pub trap: Trap,
}

impl Serialize for Charged {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.trap.spring(TrapOn::Serialize);
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Charged", 1)?;
        st.serialize_field("no", &self.no)?;
        st.end()
    }
}

/// The charging functions' error.
#[derive(Debug)]
pub enum PayError {
    /// Declined: nothing was charged (`Rejected`).
    Declined,
    /// Refused for good (`Permanent`).
    Refused(String),
    /// 503 before processing (`Retryable`).
    Unavailable,
    /// Asked to come back later (`RateLimited`): a 409 or 429 with `Retry-After`.
    Later(Option<std::time::Duration>),
    /// No answer in time (`Unknown`).
    TimedOut,
    /// The gateway charged and then answered 500 (`Unknown`); its `Classify` or `Display` may panic.
    Broken(Trap),
    /// samekey's own answer.
    Samekey(samekey::Error),
}

impl PayError {
    /// The class, without springing any trap (for the simulation's own bookkeeping).
    pub fn quiet_class(&self) -> ErrorClass {
        match self {
            PayError::Declined => ErrorClass::Rejected,
            PayError::Refused(_) => ErrorClass::Permanent,
            PayError::Unavailable => ErrorClass::Retryable,
            PayError::Later(retry_after) => ErrorClass::RateLimited {
                retry_after: *retry_after,
            },
            PayError::TimedOut | PayError::Broken(_) => ErrorClass::Unknown,
            PayError::Samekey(e) => e.classify(),
        }
    }

    /// A description, without springing any trap.
    pub fn quiet(&self) -> String {
        match self {
            PayError::Broken(_) => "gateway answered 500 after charging".into(),
            PayError::Samekey(e) => format!("samekey: {e}"),
            other => format!("{other:?}"),
        }
    }
}

impl Classify for PayError {
    fn classify(&self) -> ErrorClass {
        if let PayError::Broken(trap) = self {
            trap.spring(TrapOn::Classify);
        }
        self.quiet_class()
    }
}

impl fmt::Display for PayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let PayError::Broken(trap) = self {
            trap.spring(TrapOn::Display);
        }
        f.write_str(&self.quiet())
    }
}

impl std::error::Error for PayError {}

impl From<samekey::Error> for PayError {
    fn from(e: samekey::Error) -> PayError {
        PayError::Samekey(e)
    }
}

/// Which function a customer's order goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `pay`: `timeout` with `lookup`, against the gateway that executes every request.
    Pay,
    /// `pay_hold`: `timeout`, `on_unknown = "hold"`, the same gateway.
    PayHold,
    /// `pay_rerun`: `timeout`, `on_unknown = "rerun"`, against the gateway that deduplicates by callId.
    PayRerun,
    /// `checkout`: no timeout (its lease is renewed), calls `pay` nested.
    Checkout,
    /// `pay_api`: `timeout`, `on_unknown = "rerun"`, through another node's HTTP API (the
    /// Idempotency-Key layer), which charges the gateway that executes every request.
    Api,
    /// `pay_grpc`: the same through another node's gRPC method (samekey-grpc's layers).
    Grpc,
}

impl Op {
    /// Every function, in the order a seed picks from.
    pub const ALL: [Op; 6] = [
        Op::Pay,
        Op::PayHold,
        Op::PayRerun,
        Op::Checkout,
        Op::Api,
        Op::Grpc,
    ];
}

/// The scope of each function, as the compensation worker knows them.
pub const SCOPE_PAY: &str = "sim.pay";
/// See [`SCOPE_PAY`].
pub const SCOPE_PAY_HOLD: &str = "sim.pay_hold";
/// See [`SCOPE_PAY`].
pub const SCOPE_PAY_RERUN: &str = "sim.pay_rerun";
/// See [`SCOPE_PAY`].
pub const SCOPE_CHECKOUT: &str = "sim.checkout";
/// See [`SCOPE_PAY`].
pub const SCOPE_PAY_API: &str = "sim.pay_api";
/// See [`SCOPE_PAY`].
pub const SCOPE_PAY_GRPC: &str = "sim.pay_grpc";

/// One node incarnation's service.
pub struct Payments {
    /// The node's runtime (its store connection, clock and name).
    pub rt: Runtime,
    /// The node's payments API (the handler behind samekey-http's layers, on the API's own store).
    pub api: crate::api::ApiService,
    /// The node's gRPC service (the handler behind samekey-grpc's layers, on the API's own store).
    pub grpc: crate::grpc::GrpcService,
    /// The node's HTTP client (reqwest with samekey-http's middleware, over the simulated network).
    pub client: reqwest_middleware::ClientWithMiddleware,
    /// The node incarnation, for what it sends.
    pub life: Arc<Life>,
    /// The world it calls out into.
    pub world: Arc<World>,
}

impl Payments {
    /// Runs `op` for `order`.
    pub async fn call(&self, op: Op, order: &str, amount: u64) -> Result<Charged, PayError> {
        match op {
            Op::Pay => self.pay(order, amount).await,
            Op::PayHold => self.pay_hold(order, amount).await,
            Op::PayRerun => self.pay_rerun(order, amount).await,
            Op::Checkout => self.checkout(order, amount).await,
            Op::Api => self.pay_api(order, amount).await,
            Op::Grpc => self.pay_grpc(order, amount).await,
        }
    }

    #[idempotent(
        key = "order + \"pay\"",
        scope = "sim.pay",
        runtime = &self.rt,
        timeout = "2s",
        verify = "amount",
        budget = "gateway",
        inputs = "order, amount",
        lookup = |call| self.world.gw_every.status(&self.life, call)
    )]
    async fn pay(&self, order: &str, amount: u64) -> Result<Charged, PayError> {
        let _ = amount;
        self.charge(&self.world.gw_every, order).await
    }

    #[idempotent(
        key = "order + \"pay\"",
        scope = "sim.pay_hold",
        runtime = &self.rt,
        timeout = "2s",
        on_unknown = "hold",
        verify = "amount",
        inputs = "order, amount"
    )]
    async fn pay_hold(&self, order: &str, amount: u64) -> Result<Charged, PayError> {
        let _ = amount;
        self.charge(&self.world.gw_every, order).await
    }

    #[idempotent(
        key = "order + \"pay\"",
        scope = "sim.pay_rerun",
        runtime = &self.rt,
        timeout = "2s",
        on_unknown = "rerun",
        verify = "amount",
        inputs = "order, amount"
    )]
    async fn pay_rerun(&self, order: &str, amount: u64) -> Result<Charged, PayError> {
        let _ = amount;
        self.charge(&self.world.gw_dedup, order).await
    }

    /// What the API's handlers do (HTTP and gRPC alike): charge the gateway under the request's
    /// callId within the handler's own deadline ([`UPSTREAM_TIMEOUT`]), then run the user code a
    /// reply meets — where a panic armed in it goes off (the layer answers for a handler that
    /// panicked).
    pub async fn charge_upstream(
        &self,
        call_id: &samekey::CallId,
        trace: samekey::TraceId,
        order: &str,
    ) -> Result<Charged, PayError> {
        let charged = tokio::time::timeout(
            UPSTREAM_TIMEOUT,
            self.world
                .gw_every
                .charge(&self.life, call_id, trace, order),
        )
        .await
        .unwrap_or(Err(PayError::TimedOut))?;
        charged.trap.spring(TrapOn::Body);
        let _ = serde_json::to_vec(&charged);
        Ok(charged)
    }

    /// What each charging function's body does: sends the charge under the call's callId and trace,
    /// then lets a panic armed in the reply go off (user code failing after the effect).
    async fn charge(&self, gateway: &Arc<Gateway>, order: &str) -> Result<Charged, PayError> {
        let call = samekey::current();
        let charged = gateway
            .charge(&self.life, call.call_id(), call.trace_id(), order)
            .await?;
        charged.trap.spring(TrapOn::Body);
        Ok(charged)
    }

    #[idempotent(key = "order + \"checkout\"", scope = "sim.checkout", runtime = &self.rt)]
    async fn checkout(&self, order: &str, amount: u64) -> Result<Charged, PayError> {
        self.pay(order, amount).await
    }
}
