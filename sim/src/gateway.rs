//! The remote side: a payment gateway that performs effects and keeps its own records by callId, in
//! two modes — one that deduplicates by callId, one that executes every request that arrives — and
//! the stock service that a reversal releases stock through.
//!
//! # The network between
//!
//! A request leaves its node (waiting while the node is paused, never once it is dead), travels
//! 5–40 ms, and acts on arrival even if its sender has died or given up. Drawn per request while the
//! fault window is open: lost before arrival; acted on with the reply lost; acted on with the reply
//! late (2.5–15 s, past the callers' 2 s timeout) or processed slowly (the record says
//! `Processing` meanwhile); declined; refused for good; 503 before processing; a reply that makes
//! user code panic (the body, `Serialize`) or an error reply after the charge whose `Classify` or
//! `Display` panics. A gateway that executes every request gets no late *requests*: an arrival after
//! the caller asked and heard "not received" is a second charge no library can prevent without
//! deduplication by callId.
//!
//! Both gateways refuse (for good) a callId they do not know that is older than [`REFUSE_AFTER`]:
//! what makes the compensation worker's reversal safe (the docs of `NotReceivedPolicy::Reverse`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::callback::Callback;
use samekey::reconcile::{RemoteOutcome, RemoteRecord};
use samekey::{CallId, RemoteStatus, TraceId};
use tokio::sync::oneshot;

use crate::coverage::{Fault, Surface};
use crate::payments::{Charged, PayError, Trap, TrapOn};
use crate::store::Life;
use crate::world::{Served, Shared, World, LEASE};

/// A callId the gateway never saw, older than this by its clock, is refused.
pub const REFUSE_AFTER: Duration = Duration::from_secs(30);

/// How long a lookup waits for its answer before it counts as failed: longer than a lease, so that a
/// late answer can outlive its asker's lease.
pub const LOOKUP_PATIENCE: Duration = Duration::from_secs(20);

/// One effect the gateway performed.
#[derive(Debug, Clone)]
pub struct Effect {
    /// Which gateway.
    pub gateway: &'static str,
    /// The order charged.
    pub order: String,
    /// The callId the request carried.
    pub call_id: String,
    /// The trace it carried.
    pub trace_id: String,
    /// The charge number.
    pub no: u64,
    /// When (ms since the start).
    pub at_ms: u64,
}

#[derive(Debug, Clone)]
enum Record {
    Processing,
    Charged(u64),
    Declined,
    Refused,
}

/// A payment gateway.
pub struct Gateway {
    name: &'static str,
    dedup: bool,
    shared: Arc<Shared>,
    records: Mutex<HashMap<String, Record>>,
}

impl Gateway {
    /// A gateway that deduplicates by callId (`dedup`), or executes every request that arrives.
    pub fn new(name: &'static str, dedup: bool, shared: Arc<Shared>) -> Gateway {
        Gateway {
            name,
            dedup,
            shared,
            records: Mutex::new(HashMap::new()),
        }
    }

    fn record(&self, call_id: &str) -> Option<Record> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(call_id)
            .cloned()
    }

    /// The gateway's statement, as a reconciliation reads it: a record per callId it decided
    /// (charged: succeeded; declined or refused: failed), in no particular order.
    pub fn statement(&self) -> Vec<RemoteRecord> {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(call_id, record)| {
                let outcome = match record {
                    Record::Processing => return None,
                    Record::Charged(_) => RemoteOutcome::Succeeded,
                    Record::Declined | Record::Refused => RemoteOutcome::Failed,
                };
                Some(RemoteRecord {
                    call_id: call_id.parse().ok(),
                    reference: None,
                    outcome,
                    amount: None,
                })
            })
            .collect()
    }

    fn set(&self, call_id: &str, record: Record) {
        self.records
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(call_id.to_owned(), record);
    }

    fn draw_charge_fault(&self, surface: Surface) -> Option<Fault> {
        let d = &self.shared.draws;
        if !d.fault(35) {
            return None;
        }
        d.keep(
            Some(match d.below(100) {
                0..=11 => Fault::RequestLost,
                12..=29 => Fault::ReplyLost,
                30..=47 => Fault::ReplyLate,
                48..=59 => Fault::Declined,
                60..=63 => Fault::Refused,
                64..=77 => Fault::Unavailable,
                78..=85 => Fault::PanicBody,
                86..=93 => Fault::PanicSerialize,
                94..=96 => Fault::PanicClassify,
                _ => Fault::PanicDisplay,
            }),
            surface,
        )
    }

    /// Sends a charge for `order` under `call_id` from the node `from`, and waits for the reply (for
    /// ever, if it is lost: the caller's timeout ends the wait).
    pub async fn charge(
        self: &Arc<Self>,
        from: &Life,
        call_id: &CallId,
        trace_id: TraceId,
        order: &str,
    ) -> Result<Charged, PayError> {
        from.io().await;
        let shared = &self.shared;
        shared.draws.shuffle().await;
        shared.about(call_id.as_str(), order);
        let surface = shared.surface_of(order);
        let fault = self.draw_charge_fault(surface);
        let short = shared.history.id(call_id.as_str());
        if let Some(fault) = fault {
            shared.cover(fault, surface);
        }
        shared.history.log(
            from.name.clone(),
            Some(order),
            format!(
                "→ {} charge {short}{}",
                self.name,
                fault.map(|f| format!(" [{f:?}]")).unwrap_or_default()
            ),
        );
        match fault {
            Some(Fault::RequestLost) => return std::future::pending().await,
            Some(Fault::Unavailable) => {
                tokio::time::sleep(shared.draws.ms(5, 40)).await;
                from.answered().await;
                return Err(PayError::Unavailable);
            }
            _ => {}
        }
        let (tx, rx) = oneshot::channel();
        let gateway = Arc::clone(self);
        let call = call_id.to_string();
        let trace = trace_id.to_string();
        let order_owned = order.to_owned();
        // A request to the gateway that executes every request arrives as it leaves (a FIFO link):
        // a lookup sent after it can never overtake it. See the module docs.
        let there = shared.draws.ms(5, 40);
        let there = if self.dedup { there } else { Duration::ZERO };
        let back = match fault {
            Some(Fault::ReplyLate) => shared.draws.ms(2_500, 15_000),
            _ => shared.draws.ms(5, 40),
        };
        let slow = fault == Some(Fault::ReplyLate) && shared.draws.chance(50);
        tokio::spawn(async move {
            tokio::time::sleep(there).await;
            let answer = gateway
                .arrive(&call, &trace, &order_owned, fault, slow, back)
                .await;
            if !slow {
                tokio::time::sleep(back).await;
            }
            if fault != Some(Fault::ReplyLost) {
                let _ = tx.send(answer);
            }
        });
        let answer = match rx.await {
            Ok(answer) => answer,
            Err(_) => std::future::pending().await,
        };
        from.answered().await;
        answer
    }

    /// A request arrives: what the gateway does and answers.
    async fn arrive(
        &self,
        call: &str,
        trace: &str,
        order: &str,
        fault: Option<Fault>,
        slow: bool,
        slow_for: Duration,
    ) -> Result<Charged, PayError> {
        let shared = &self.shared;
        let short = shared.history.id(call);
        if self.dedup {
            match self.record(call) {
                Some(Record::Charged(no)) => return Ok(charged(no, None)),
                Some(Record::Declined) => return Err(PayError::Declined),
                Some(Record::Refused) => return Err(PayError::Refused("refused".into())),
                // A duplicate of a request still being processed: come back later.
                Some(Record::Processing) => {
                    return Err(PayError::Later(Some(Duration::from_secs(1))))
                }
                None => {}
            }
        }
        let age = shared
            .truth
            .now_ms()
            .saturating_sub(call.parse::<CallId>().map(|c| c.unix_ms()).unwrap_or(0));
        if self.record(call).is_none() && age > REFUSE_AFTER.as_millis() as u64 {
            shared.history.log(
                self.name,
                Some(order),
                format!("refuses {short}: callId {age} ms old"),
            );
            self.set(call, Record::Refused);
            return Err(PayError::Refused(format!("callId {age} ms old")));
        }
        match fault {
            Some(Fault::Declined) => {
                shared
                    .history
                    .log(self.name, Some(order), format!("declines {short}"));
                self.set(call, Record::Declined);
                return Err(PayError::Declined);
            }
            Some(Fault::Refused) => {
                shared
                    .history
                    .log(self.name, Some(order), format!("refuses {short}"));
                self.set(call, Record::Refused);
                return Err(PayError::Refused("fraud check".into()));
            }
            _ => {}
        }
        if slow {
            self.set(call, Record::Processing);
            tokio::time::sleep(slow_for).await;
        }
        let no = shared.effect(Effect {
            gateway: self.name,
            order: order.to_owned(),
            call_id: call.to_owned(),
            trace_id: trace.to_owned(),
            no: 0,
            at_ms: shared.history.now_ms(),
        });
        self.set(call, Record::Charged(no));
        shared
            .history
            .log(self.name, Some(order), format!("CHARGES {short} as #{no}"));
        if let Some(world) = shared.world() {
            world.send_callbacks(call, order, no);
        }
        match fault {
            Some(Fault::PanicBody) => Ok(charged(no, Some(TrapOn::Body))),
            Some(Fault::PanicSerialize) => Ok(charged(no, Some(TrapOn::Serialize))),
            Some(Fault::PanicClassify) => Err(PayError::Broken(Trap::armed(TrapOn::Classify))),
            Some(Fault::PanicDisplay) => Err(PayError::Broken(Trap::armed(TrapOn::Display))),
            _ => Ok(charged(no, None)),
        }
    }

    /// Asks what became of `call_id` (the receipt lookup), from the node `from`: `Err` when no answer
    /// came within [`LOOKUP_PATIENCE`].
    pub async fn status(
        self: &Arc<Self>,
        from: &Life,
        call_id: &CallId,
    ) -> Result<RemoteStatus<Charged, PayError>, String> {
        let asked = async {
            from.io().await;
            let shared = &self.shared;
            shared.draws.shuffle().await;
            let fault = if shared.draws.fault(12) {
                Some(if shared.draws.chance(40) {
                    Fault::RequestLost
                } else {
                    Fault::ReplyLate
                })
            } else {
                None
            };
            let mut fault = shared.draws.keep(fault, Surface::Lookup);
            if let Some(fault) = fault {
                shared.cover(fault, Surface::Lookup);
            }
            tokio::time::sleep(shared.draws.ms(5, 40)).await;
            if fault == Some(Fault::RequestLost) {
                return std::future::pending().await;
            }
            let answer = match self.record(call_id.as_str()) {
                None => RemoteStatus::NotReceived,
                Some(Record::Processing) => RemoteStatus::Processing,
                Some(Record::Charged(no)) => RemoteStatus::Succeeded(charged(no, None)),
                Some(Record::Declined) => RemoteStatus::Failed(PayError::Declined),
                Some(Record::Refused) => RemoteStatus::Failed(PayError::Refused("refused".into())),
            };
            let said = match &answer {
                RemoteStatus::NotReceived => "not received".to_owned(),
                RemoteStatus::Processing => "processing".to_owned(),
                RemoteStatus::Succeeded(c) => format!("succeeded #{}", c.no),
                RemoteStatus::Failed(e) => format!("failed {}", e.quiet()),
            };
            let back = if fault == Some(Fault::ReplyLate) {
                shared.draws.ms(3_000, 18_000)
            } else {
                shared.draws.ms(5, 40)
            };
            // The asker stalls as "not received" reaches it (a GC pause, a blocked thread), past its
            // lease: what it does next, it does after another node may have taken over.
            if fault.is_none()
                && matches!(answer, RemoteStatus::NotReceived)
                && shared.draws.fault(50)
            {
                fault = shared.draws.keep(Some(Fault::Pause), Surface::Lookup);
            }
            if fault == Some(Fault::Pause) {
                shared.cover(Fault::Pause, Surface::Lookup);
                let stall = LEASE + shared.draws.ms(1_000, 12_000);
                from.pause_until(tokio::time::Instant::now() + back + stall);
                shared.history.log(
                    from.name.clone(),
                    shared.subject_of(call_id.as_str()).as_deref(),
                    format!("PAUSES for {} ms as the answer arrives", stall.as_millis()),
                );
            }
            shared.history.log(
                self.name,
                shared.subject_of(call_id.as_str()).as_deref(),
                format!(
                    "status {}: {said}{}",
                    shared.history.id(call_id.as_str()),
                    if fault == Some(Fault::ReplyLate) {
                        " (late)"
                    } else {
                        ""
                    }
                ),
            );
            tokio::time::sleep(back).await;
            from.answered().await;
            answer
        };
        tokio::time::timeout(LOOKUP_PATIENCE, asked)
            .await
            .map_err(|_| "the status request timed out".to_owned())
    }
}

fn charged(no: u64, trap: Option<TrapOn>) -> Charged {
    Charged {
        no,
        trap: trap.map(Trap::armed).unwrap_or_default(),
    }
}

/// The stock service: stock reserved by the orders and released by the compensation worker's
/// reversal (through an `AtMostOnce` operation of its own), with lost requests and lost replies.
pub struct Stock {
    shared: Arc<Shared>,
}

/// How long the stock client waits for a reply.
pub const STOCK_PATIENCE: Duration = Duration::from_secs(1);

impl Stock {
    /// The stock service.
    pub fn new(shared: Arc<Shared>) -> Stock {
        Stock { shared }
    }

    /// Releases the stock of `order` (a reversal's effect), from `from`: `Err(TimedOut)` when no reply
    /// came within [`STOCK_PATIENCE`] (the release may or may not have happened).
    pub async fn release(
        &self,
        from: &Life,
        order: &str,
        call_id: &CallId,
    ) -> Result<(), PayError> {
        let shared = &self.shared;
        let sent = async {
            from.io().await;
            shared.draws.shuffle().await;
            let fault = if shared.draws.fault(30) {
                Some(if shared.draws.chance(50) {
                    Fault::RequestLost
                } else {
                    Fault::ReplyLost
                })
            } else {
                None
            };
            let fault = shared.draws.keep(fault, Surface::Compensation);
            if let Some(fault) = fault {
                shared.cover(fault, Surface::Compensation);
            }
            tokio::time::sleep(shared.draws.ms(5, 40)).await;
            if fault == Some(Fault::RequestLost) {
                return std::future::pending().await;
            }
            shared.release(order, call_id.as_str());
            shared.history.log(
                "stock",
                Some(order),
                format!(
                    "RELEASES stock under {}",
                    shared.history.id(call_id.as_str())
                ),
            );
            if fault == Some(Fault::ReplyLost) {
                return std::future::pending().await;
            }
            from.answered().await;
        };
        tokio::time::timeout(STOCK_PATIENCE, sent)
            .await
            .map_err(|_| PayError::TimedOut)
    }
}

impl World {
    /// After a charge: with some odds, the gateway also calls back (once, or several times, late), each
    /// delivery to a node drawn at random.
    pub fn send_callbacks(self: &Arc<Self>, call: &str, order: &str, no: u64) {
        let shared = &self.shared;
        if !shared.draws.chance(25) {
            return;
        }
        let times = if shared.draws.fault(50)
            && shared
                .draws
                .keep(Some(Fault::CallbackRepeated), Surface::Callback)
                .is_some()
        {
            shared.cover(Fault::CallbackRepeated, Surface::Callback);
            shared.draws.between(2, 3)
        } else {
            1
        };
        for _ in 0..times {
            let world = Arc::clone(self);
            let after = shared.draws.ms(100, 20_000);
            let node = shared.draws.below(self.nodes.len() as u64) as usize;
            let call = call.to_owned();
            let order = order.to_owned();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let Ok(call_id) = call.parse::<CallId>() else {
                    return;
                };
                let Ok(callback) = Callback::succeeded(&charged(no, None)) else {
                    return;
                };
                let applied = world.nodes[node]
                    .serve(&order, |p: Arc<crate::payments::Payments>| async move {
                        p.rt.apply_callback(&call_id, callback)
                            .await
                            .map_err(|e| e.to_string())
                    })
                    .await;
                let short = world.shared.history.id(&call);
                if matches!(
                    applied,
                    Served::Answered(Ok(samekey::callback::Applied::Applied))
                ) {
                    world.shared.callback_applied(&call, &order);
                }
                world.shared.history.log(
                    format!("node{node}"),
                    Some(&order),
                    format!("callback {short} #{no}: {applied:?}"),
                );
            });
        }
    }
}
