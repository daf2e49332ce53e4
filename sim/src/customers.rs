//! The customers: each places one order through one of the service's functions, on a node drawn at
//! random, and tries again as a person would — after an undecided answer, a lost connection, a node
//! that refused; sometimes after a decline — now and then sending a duplicate at once from another
//! tab. What each was told is the record invariants 2 and 3 are checked against.

use std::sync::Arc;
use std::time::Duration;

use samekey::observe::{observed, CallAnswer};
use samekey::ErrorClass;

use crate::coverage::{Fault, Surface};
use crate::payments::{Charged, Op, PayError};
use crate::world::{Served, World};

/// How long a customer waits for one answer before giving up on it.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// How many times a customer tries at most.
pub const TRIES: u32 = 8;

/// What a customer was told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Charged, with this charge number.
    Succeeded(u64),
    /// Failed for good (an answer that stands).
    Failed(String),
    /// Refused, nothing ran (declined, or retries spent on failures that changed nothing).
    NothingRan(String),
    /// Not known yet (`Unknown`), or samekey answered without running (`InProgress`, a store failure…).
    Undecided(String),
    /// The connection broke (the node crashed, or the handler panicked).
    Lost,
    /// The node was down.
    Refused,
    /// No answer within [`PATIENCE`].
    GaveUp,
    /// The customer hung up early (the node cancelled the call's work).
    HungUp,
}

/// One try of one customer.
#[derive(Debug, Clone)]
pub struct Told {
    /// The order.
    pub order: String,
    /// Which function.
    pub op: Op,
    /// On which node.
    pub node: usize,
    /// When it was sent (ms since the start).
    pub sent_ms: u64,
    /// When it was answered.
    pub answered_ms: u64,
    /// Sent once the fault window had closed.
    pub after_faults: bool,
    /// What it was told.
    pub answer: Answer,
    /// The callId the answer came under (for a replay, the first call's).
    pub call_id: Option<String>,
    /// The call's trace.
    pub trace_id: Option<String>,
}

fn answer(out: &Result<Charged, PayError>, refused: bool) -> Answer {
    match out {
        Ok(c) => Answer::Succeeded(c.no),
        Err(e) if refused => Answer::Undecided(e.quiet()),
        Err(e) => match e.quiet_class() {
            ErrorClass::Unknown => Answer::Undecided(e.quiet()),
            ErrorClass::Permanent => Answer::Failed(e.quiet()),
            ErrorClass::Rejected | ErrorClass::Retryable | ErrorClass::RateLimited { .. } => {
                Answer::NothingRan(e.quiet())
            }
        },
    }
}

/// One request to `node`, waited for at most [`PATIENCE`].
async fn one_try(world: &Arc<World>, node: usize, order: &str, op: Op, amount: u64) -> Told {
    let shared = &world.shared;
    let sent_ms = shared.history.now_ms();
    let after_faults = !shared.draws.faulty();
    let owned = order.to_owned();
    // Most wait long; some hang up after a few seconds, and the node cancels the call's work.
    let patience = if shared.draws.fault(15)
        && shared
            .draws
            .keep(Some(Fault::HangUp), Surface::Call)
            .is_some()
    {
        shared.cover(Fault::HangUp, Surface::Call);
        shared.draws.ms(100, 4_000)
    } else {
        PATIENCE
    };
    let served = tokio::time::timeout(
        patience,
        world.nodes[node].serve_until_hang_up(order, move |p| async move {
            let (out, report) = observed(p.call(op, &owned, amount)).await;
            let refused = report.as_ref().map(|r| r.answer()) == Some(CallAnswer::Refused);
            (
                answer(&out, refused),
                report.as_ref().map(|r| r.call_id().to_string()),
                report.as_ref().map(|r| r.trace_id().to_string()),
            )
        }),
    )
    .await;
    let (answer, call_id, trace_id) = match served {
        Err(_) if patience < PATIENCE => (Answer::HungUp, None, None),
        Err(_) => (Answer::GaveUp, None, None),
        Ok(Served::Refused) => (Answer::Refused, None, None),
        Ok(Served::Lost) => (Answer::Lost, None, None),
        Ok(Served::Answered(a)) => a,
    };
    let short = call_id
        .as_deref()
        .map(|c| shared.history.id(c))
        .unwrap_or_else(|| "-".into());
    shared.history.log(
        format!("customer→n{node}"),
        Some(order),
        format!("{op:?} told {answer:?} ({short})"),
    );
    Told {
        order: order.to_owned(),
        op,
        node,
        sent_ms,
        answered_ms: shared.history.now_ms(),
        after_faults,
        answer,
        call_id,
        trace_id,
    }
}

/// One customer: tries until told a final answer (or [`TRIES`] times), and returns what every try
/// was told, duplicates included.
pub async fn customer(
    world: Arc<World>,
    order: String,
    op: Op,
    amount: u64,
    start: Duration,
) -> Vec<Told> {
    let shared = Arc::clone(&world.shared);
    shared.set_op(&order, op);
    tokio::time::sleep(start).await;
    let nodes = world.nodes.len() as u64;
    let mut told = Vec::new();
    let mut duplicates = Vec::new();
    for _ in 0..TRIES {
        let node = shared.draws.below(nodes) as usize;
        if shared.draws.fault(25)
            && shared
                .draws
                .keep(Some(Fault::ConcurrentDuplicate), Surface::Call)
                .is_some()
        {
            shared.cover(Fault::ConcurrentDuplicate, Surface::Call);
            let other = (node + 1 + shared.draws.below(nodes - 1) as usize) % nodes as usize;
            let (world, order) = (Arc::clone(&world), order.clone());
            // A double click (at once), or a second tab a few seconds later.
            let after = if shared.draws.chance(50) {
                Duration::ZERO
            } else {
                shared.draws.ms(500, 8_000)
            };
            duplicates.push(tokio::spawn(async move {
                tokio::time::sleep(after).await;
                one_try(&world, other, &order, op, amount).await
            }));
        }
        // Now and then a retry carries another amount (the basket changed in another tab): the key's
        // `verify` refuses it, and nothing runs.
        let sent = if shared.draws.chance(5) {
            amount + 1
        } else {
            amount
        };
        let this = one_try(&world, node, &order, op, sent).await;
        let again = match &this.answer {
            Answer::Succeeded(_) | Answer::Failed(_) => false,
            Answer::NothingRan(_) => shared.draws.chance(40),
            _ => true,
        };
        told.push(this);
        if !again {
            break;
        }
        // People wait longer after each undecided answer, some long enough to meet the
        // compensation worker's rounds.
        tokio::time::sleep(shared.draws.ms(500, 15_000 * (told.len() as u64))).await;
    }
    for duplicate in duplicates {
        if let Ok(t) = duplicate.await {
            told.push(t);
        }
    }
    told
}

/// One shop: has its order's events staged (retrying as a customer does), and returns what each try
/// was told — the events themselves are checked at the consumers.
pub async fn producer(world: Arc<World>, order: String, start: Duration) -> Vec<Told> {
    let shared = Arc::clone(&world.shared);
    tokio::time::sleep(start).await;
    for attempt in 1..=TRIES {
        let node = shared.draws.below(world.nodes.len() as u64) as usize;
        let owned = order.clone();
        let served = tokio::time::timeout(
            PATIENCE,
            world.nodes[node].serve(&order, move |p| async move {
                p.stage_events(&owned, 100).await.map_err(|e| e.quiet())
            }),
        )
        .await;
        let done = matches!(served, Ok(Served::Answered(Ok(_))));
        shared.history.log(
            format!("shop→n{node}"),
            Some(&order),
            format!("stage events: {served:?}"),
        );
        if done {
            break;
        }
        tokio::time::sleep(shared.draws.ms(500, 15_000 * u64::from(attempt))).await;
    }
    Vec::new()
}
