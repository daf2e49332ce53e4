//! What the seeds exercised: a count per fault × surface, printed as one line per run, so that a
//! surface the simulation never reaches, or a fault it never draws there, is visible.

use std::collections::BTreeMap;
use std::fmt;

/// A fault the simulation draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// A request that never arrives.
    RequestLost,
    /// A request that arrives and acts, whose reply is lost.
    ReplyLost,
    /// A reply that comes late (past the caller's timeout, or past a lease).
    ReplyLate,
    /// A refusal that changed nothing (a declined card).
    Declined,
    /// An answer that stands (a fraud block).
    Refused,
    /// 503 before processing.
    Unavailable,
    /// A store operation that failed before it reached the store.
    StoreFailBefore,
    /// A store operation that applied, its answer lost.
    StoreFailAfter,
    /// A slow store operation.
    StoreSlow,
    /// A node killed (at whatever `.await` its tasks were) and restarted later.
    Crash,
    /// A node paused (a GC pause, a SIGSTOP) and resumed.
    Pause,
    /// A node whose clock is off.
    ClockSkew,
    /// A panic in the body, after its effect.
    PanicBody,
    /// A panic in the value's `Serialize`.
    PanicSerialize,
    /// A panic in the error's `Classify`.
    PanicClassify,
    /// A panic in the error's `Display`.
    PanicDisplay,
    /// A panic in a handler or a reversal.
    PanicHandler,
    /// A callback delivered more than once, or late.
    CallbackRepeated,
    /// A message delivered again (a lost ack).
    Redelivered,
    /// A message delivered twice at once.
    Duplicated,
    /// Messages delivered out of order.
    Reordered,
    /// A body re-serialised by another component (ids dropped from the body).
    BodyRewritten,
    /// Headers rewritten by a middleware (a trace header replaced, ids dropped).
    HeadersRewritten,
    /// A publish whose confirm was lost.
    ConfirmLost,
    /// A message returned as unroutable.
    Returned,
    /// A consumer redeployed with a newer payload type.
    Redeployed,
    /// A duplicate sent while the first call runs.
    ConcurrentDuplicate,
    /// A composition drawn per run: both consumer scopes' handlers call one downstream service that
    /// deduplicates by callId (a notifications API), instead of one each.
    OneDownstream,
    /// A composition drawn per run: a second consumer scope of the same messages.
    SecondScope,
    /// A handler that charged answers `303 See Other` (POST-redirect-GET).
    AnsweredRedirect,
    /// A handler that charged answers `502` (a later step failed upstream).
    Answered5xx,
    /// A client that hangs up mid-call, and the server cancels the call's work.
    HangUp,
    /// A body re-serialised as the bare payload, its ids left in the headers (which must work).
    BareBody,
    /// A gRPC handler that charged passes up a nested call's refusal (`ABORTED`) with `?`.
    NestedRefusal,
    /// A gRPC handler that charged answers a reply larger than the layer stores.
    HugeReply,
}

impl Fault {
    /// Every fault, for `--without` and the coverage line.
    pub const ALL: [Fault; 35] = [
        Fault::RequestLost,
        Fault::ReplyLost,
        Fault::ReplyLate,
        Fault::Declined,
        Fault::Refused,
        Fault::Unavailable,
        Fault::StoreFailBefore,
        Fault::StoreFailAfter,
        Fault::StoreSlow,
        Fault::Crash,
        Fault::Pause,
        Fault::ClockSkew,
        Fault::PanicBody,
        Fault::PanicSerialize,
        Fault::PanicClassify,
        Fault::PanicDisplay,
        Fault::PanicHandler,
        Fault::CallbackRepeated,
        Fault::Redelivered,
        Fault::Duplicated,
        Fault::Reordered,
        Fault::BodyRewritten,
        Fault::HeadersRewritten,
        Fault::ConfirmLost,
        Fault::Returned,
        Fault::Redeployed,
        Fault::ConcurrentDuplicate,
        Fault::OneDownstream,
        Fault::SecondScope,
        Fault::AnsweredRedirect,
        Fault::Answered5xx,
        Fault::HangUp,
        Fault::BareBody,
        Fault::NestedRefusal,
        Fault::HugeReply,
    ];
}

impl std::str::FromStr for Fault {
    type Err = String;

    /// A fault by its name (`PanicSerialize`), any case.
    fn from_str(s: &str) -> Result<Fault, String> {
        Fault::ALL
            .into_iter()
            .find(|f| format!("{f:?}").eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                let names: Vec<String> = Fault::ALL.iter().map(|f| format!("{f:?}")).collect();
                format!("no fault {s:?}; the faults are {}", names.join(", "))
            })
    }
}

/// Where a fault hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Surface {
    /// An `#[idempotent]` call's request to the gateway.
    Call,
    /// A receipt lookup by callId.
    Lookup,
    /// A nested `#[idempotent]` call.
    Nested,
    /// The shared store.
    Store,
    /// A node as a whole.
    Node,
    /// The compensation worker and its reversal.
    Compensation,
    /// The gateway's callbacks.
    Callback,
    /// The producer's publishes.
    Publish,
    /// The broker's deliveries to consumers.
    Broker,
    /// A consumer's inbox and handler.
    Inbox,
    /// The HTTP API behind the Idempotency-Key layer: its handler's upstream call.
    Http,
    /// The network between the HTTP or gRPC client and the API.
    Wire,
    /// The gRPC method behind samekey-grpc's layers: its handler's upstream call and answers.
    Grpc,
    /// A lease renewal while the work it keeps alive runs (one that waits, as on a row lock the
    /// work's own transaction holds).
    Lease,
}

impl Surface {
    /// Every surface.
    pub const ALL: [Surface; 14] = [
        Surface::Call,
        Surface::Lookup,
        Surface::Nested,
        Surface::Store,
        Surface::Node,
        Surface::Compensation,
        Surface::Callback,
        Surface::Publish,
        Surface::Broker,
        Surface::Inbox,
        Surface::Http,
        Surface::Wire,
        Surface::Grpc,
        Surface::Lease,
    ];
}

/// A fault a run goes without: everywhere (`PanicSerialize`), or at one surface
/// (`ReplyLost@Compensation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Without {
    /// The fault.
    pub fault: Fault,
    /// Only there (`None`: everywhere).
    pub at: Option<Surface>,
}

impl Without {
    /// Whether this leaves out `fault` at `surface`.
    pub fn covers(&self, fault: Fault, surface: Surface) -> bool {
        self.fault == fault && self.at.is_none_or(|at| at == surface)
    }
}

impl fmt::Display for Without {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            None => write!(f, "{:?}", self.fault),
            Some(at) => write!(f, "{:?}@{at:?}", self.fault),
        }
    }
}

impl std::str::FromStr for Without {
    type Err = String;

    /// `Fault` or `Fault@Surface`, any case.
    fn from_str(s: &str) -> Result<Without, String> {
        let (fault, at) = match s.split_once('@') {
            None => (s, None),
            Some((fault, at)) => (fault, Some(at)),
        };
        let at = match at {
            None => None,
            Some(at) => Some(
                Surface::ALL
                    .into_iter()
                    .find(|x| format!("{x:?}").eq_ignore_ascii_case(at.trim()))
                    .ok_or_else(|| {
                        format!("no surface {at:?}; the surfaces are {:?}", Surface::ALL)
                    })?,
            ),
        };
        Ok(Without {
            fault: fault.parse()?,
            at,
        })
    }
}

/// The counts of one run, or of many added up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Coverage {
    counts: BTreeMap<(Fault, Surface), u64>,
}

impl Coverage {
    /// Counts one fault drawn at a surface.
    pub fn add(&mut self, fault: Fault, surface: Surface) {
        *self.counts.entry((fault, surface)).or_default() += 1;
    }

    /// Adds another run's counts.
    pub fn merge(&mut self, other: &Coverage) {
        for (k, n) in &other.counts {
            *self.counts.entry(*k).or_default() += n;
        }
    }

    /// How often `fault` was drawn at `surface`.
    pub fn count(&self, fault: Fault, surface: Surface) -> u64 {
        self.counts.get(&(fault, surface)).copied().unwrap_or(0)
    }

    /// How many fault × surface pairs were drawn at least once.
    pub fn pairs(&self) -> usize {
        self.counts.len()
    }
}

impl fmt::Display for Coverage {
    /// `coverage: 23 fault×surface pairs: RequestLost@Call=12 …`, one line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "coverage: {} fault×surface pairs:", self.counts.len())?;
        for ((fault, surface), n) in &self.counts {
            write!(f, " {fault:?}@{surface:?}={n}")?;
        }
        Ok(())
    }
}
