//! An order service charging a flaky payment gateway, twice: once through a naive client that makes a
//! new request id for every retry, once through `#[idempotent]` with a receipt lookup. Same orders, same
//! seeded faults (requests lost, replies lost after the charge, slow replies, 5xx, declined cards, rate
//! limits), same double-clicks. The table at the end counts what each did to the customers.
//!
//! ```text
//! cargo run --example order_service            # seed 7
//! cargo run --example order_service -- 42      # another seed
//! cargo run --example order_service --features sqlite -- --store sqlite:/tmp/orders.db
//! cargo run --example order_service --features sqlite -- --store sqlite:/tmp/orders.db --settlement /tmp/settlement.csv
//! ```
//!
//! Time is simulated (tokio's paused clock), so the run is instant and the same seed prints the same
//! table. With `--store`, only the samekey client runs, in real time, on a durable store (fewer orders,
//! no slow replies, a status endpoint that always answers): run it twice and the second run replays
//! every call from the store instead of charging again — a restart that does not double-charge.
//! `--settlement FILE` writes the gateway's settled charges (call_id, status, amount) as a CSV file,
//! for `samekey reconcile` (the README's runbook).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::testing::{FaultMix, Remote, RemoteError, Schedule};
use samekey::{
    compensation::CompensationOperation, idempotent, CallId, Classify, Compensator, ErrorClass,
    RemoteStatus, Runtime,
};
use serde::{Deserialize, Serialize};

const ORDERS: u64 = 300;
/// One order in this many is submitted twice at once (a double click, a retried HTTP request).
const DOUBLE_SUBMIT_EVERY: u64 = 6;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(1);
/// The gateway's status endpoint is down from 60 s to 100 s into the run (simulated time).
const STATUS_OUTAGE: (Duration, Duration) = (Duration::from_secs(60), Duration::from_secs(100));

// ---------------------------------------------------------------------------------------------------
// The payment gateway: samekey's test kit plays it (`samekey::testing::Remote`). It executes charges
// through a seeded fault schedule, keeps them by request id (its receipts), answers status queries,
// and counts the charges per order. It deduplicates by request id, as good gateways do — which only
// helps a client that keeps its request id across retries.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Charge {
    order_id: u64,
    amount_cents: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
enum PayError {
    #[error("card declined")]
    Declined,
    #[error("gateway unavailable (503)")]
    Unavailable,
    #[error("rate limited, retry after {retry_after_ms} ms")]
    RateLimited { retry_after_ms: u64 },
    #[error("connection reset after sending")]
    Reset,
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for PayError {
    fn classify(&self) -> ErrorClass {
        match self {
            // Nothing was charged: the order may be paid again (with another card).
            PayError::Declined => ErrorClass::Rejected,
            PayError::Unavailable => ErrorClass::Retryable,
            PayError::RateLimited { retry_after_ms } => ErrorClass::RateLimited {
                retry_after: Some(Duration::from_millis(*retry_after_ms)),
            },
            PayError::Reset => ErrorClass::Unknown,
            PayError::Samekey(e) => e.classify(),
        }
    }
}

/// What the gateway's faults look like to its client.
impl From<RemoteError> for PayError {
    fn from(e: RemoteError) -> PayError {
        match e {
            RemoteError::TimedOut => PayError::Reset,
            RemoteError::Unavailable => PayError::Unavailable,
            RemoteError::RateLimited { retry_after_ms } => PayError::RateLimited { retry_after_ms },
            RemoteError::Rejected | RemoteError::Declined => PayError::Declined,
        }
    }
}

/// The gateway's weather: 8 % of requests lost, 8 % of replies lost after the charge, 8 % slow (2.5 s,
/// past the client's 1 s timeout), 6 % 503, 5 % rate limited (retry after 300 ms).
const WEATHER: FaultMix = FaultMix {
    lose_request: 8,
    lose_reply: 8,
    slow_requests: 8,
    slow: Duration::from_millis(2_500),
    unavailable: 6,
    rate_limited: 5,
    retry_after: Duration::from_millis(300),
    reject: 0,
    decline: 0,
    crash: 0,
};

#[derive(Clone)]
struct Gateway {
    remote: Remote<Charge, PayError>,
    /// An incident: the status endpoint answers 503 from the first to the second instant (the
    /// calls whose outcome it would have told stay UNKNOWN, for the compensation worker).
    status_outage: Option<(tokio::time::Instant, tokio::time::Instant)>,
}

impl Gateway {
    /// The [`WEATHER`]; 4 % of status queries fail, and the status endpoint is down for a while.
    fn new(seed: u64) -> Gateway {
        let now = tokio::time::Instant::now();
        Gateway {
            remote: Remote::new(Schedule::seeded(seed, WEATHER))
                .deduplicating()
                .failing_lookups((0..10_000).map(|i| lookup_fails(seed, i))),
            status_outage: Some((now + STATUS_OUTAGE.0, now + STATUS_OUTAGE.1)),
        }
    }

    /// A gateway without slow replies and whose status endpoint always answers: what the real-time run
    /// on a durable store uses (a simulated gateway forgets its charges between runs, so nothing may be
    /// left for a second run to look up).
    fn steady(seed: u64) -> Gateway {
        let mix = FaultMix {
            slow_requests: 0,
            ..WEATHER
        };
        Gateway {
            remote: Remote::new(Schedule::seeded(seed, mix)).deduplicating(),
            status_outage: None,
        }
    }

    /// `POST /charges` with an idempotency header: `request_id` is the callId of the `#[idempotent]`
    /// call running it, or the id a client without samekey made up.
    async fn charge(&self, request_id: Option<&str>, charge: Charge) -> Result<Charge, PayError> {
        tokio::time::sleep(Duration::from_millis(40)).await;
        // Every 37th order's card is declined: a 4xx that no retry can fix, and nothing is charged.
        if charge.order_id.is_multiple_of(37) {
            return Err(PayError::Declined);
        }
        let order = charge.order_id.to_string();
        match request_id {
            Some(id) => self.remote.call_as(id, order, || charge).await,
            None => self.remote.call(order, || charge).await,
        }
    }

    /// `GET /charges/{request_id}`: the gateway's receipt.
    async fn status(&self, call: &CallId) -> Result<RemoteStatus<Charge, PayError>, PayError> {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let answer = self.remote.status(call).await;
        let now = tokio::time::Instant::now();
        if let Some((from, to)) = self.status_outage {
            if (from..to).contains(&now) {
                return Err(PayError::Unavailable);
            }
        }
        Ok(answer?)
    }

    /// How many charges each order got.
    fn charges_per_order(&self) -> HashMap<u64, usize> {
        self.remote
            .effects_per_key()
            .into_iter()
            .filter_map(|(order, n)| Some((order.parse().ok()?, n)))
            .collect()
    }
}

/// Whether the `i`th status query fails (4 % of them), drawn from the seed.
fn lookup_fails(seed: u64, i: u64) -> bool {
    let mut z = seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) % 100 < 4
}

// ---------------------------------------------------------------------------------------------------
// The two clients.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, samekey::KeyPart)]
struct Order {
    id: u64,
    #[key_part(skip)]
    amount_cents: u64,
}

/// What callers were told.
#[derive(Default)]
struct Told {
    succeeded: u64,
    declined: u64,
    failed: u64,
    unknown: u64,
    attempts: u64,
}

/// Retries every error, with a new request id for every attempt: the bug this library exists for.
struct NaiveClient {
    gateway: Gateway,
    next_id: Mutex<u64>,
    attempts: Mutex<u64>,
}

impl NaiveClient {
    async fn charge(&self, order: Order) -> Result<Charge, PayError> {
        let mut last = PayError::Unavailable;
        for attempt in 0..4u32 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
            let request_id = {
                let mut n = self.next_id.lock().unwrap_or_else(|p| p.into_inner());
                *n += 1;
                format!("naive-{n}")
            };
            *self.attempts.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            let charge = Charge {
                order_id: order.id,
                amount_cents: order.amount_cents,
            };
            match tokio::time::timeout(
                CLIENT_TIMEOUT,
                self.gateway.charge(Some(&request_id), charge),
            )
            .await
            {
                Ok(Ok(c)) => return Ok(c),
                Ok(Err(PayError::Declined)) => return Err(PayError::Declined),
                Ok(Err(e)) => last = e,
                Err(_) => last = PayError::Reset,
            }
        }
        Err(last)
    }
}

/// The same call through `#[idempotent]`: one key per order, one callId per call sent as the request
/// id on every attempt, and a receipt lookup instead of a guess after a timeout.
struct OrderService {
    gateway: Gateway,
    samekey: Runtime,
}

impl OrderService {
    #[idempotent(key = "order", scope = "orders.charge", prefix = "pay", retries = 3, timeout = "1s", backoff = "100ms..2s",
                 ttl = "7d", verify = "order.amount_cents", runtime = &self.samekey, inputs = "order",
                 lookup = |call: &CallId| self.gateway.status(call))]
    async fn charge(&self, order: Order) -> Result<Charge, PayError> {
        let charge = Charge {
            order_id: order.id,
            amount_cents: order.amount_cents,
        };
        // The gateway is sent this call's callId as its request id, the same on every attempt.
        self.gateway.charge(None, charge).await
    }
}

// ---------------------------------------------------------------------------------------------------
// The workload and the report.

fn orders() -> impl Iterator<Item = (Order, usize)> {
    (1..=ORDERS).map(|id| {
        let order = Order {
            id,
            amount_cents: 1_000 + id * 7,
        };
        let submissions = if id % DOUBLE_SUBMIT_EVERY == 0 { 2 } else { 1 };
        (order, submissions)
    })
}

fn tally(told: &mut Told, out: &Result<Charge, PayError>) {
    match out {
        Ok(_) => told.succeeded += 1,
        Err(PayError::Declined) => told.declined += 1,
        Err(PayError::Samekey(samekey::Error::Unknown { .. })) => told.unknown += 1,
        Err(_) => told.failed += 1,
    }
}

/// Runs every order (double submissions concurrently) and returns what callers were told and, per
/// order, whether any caller was told it failed.
async fn run<F, Fut>(submit: F) -> (Told, HashMap<u64, bool>)
where
    F: Fn(Order) -> Fut,
    Fut: std::future::Future<Output = Result<Charge, PayError>>,
{
    let mut told = Told::default();
    let mut told_failed = HashMap::new();
    for (order, submissions) in orders() {
        let results = futures_join(submissions, || submit(order)).await;
        for out in &results {
            tally(&mut told, out);
            if matches!(out, Err(e) if !matches!(e, PayError::Samekey(samekey::Error::Unknown { .. })))
            {
                told_failed.insert(order.id, true);
            }
        }
    }
    (told, told_failed)
}

/// Runs `n` submissions of one order at the same time.
async fn futures_join<F, Fut>(n: usize, make: F) -> Vec<Fut::Output>
where
    F: Fn() -> Fut,
    Fut: std::future::Future,
{
    if n == 2 {
        let (a, b) = tokio::join!(make(), make());
        vec![a, b]
    } else {
        vec![make().await]
    }
}

struct Column {
    calls: u64,
    attempts: u64,
    lookups: u64,
    replays: u64,
    executed: u64,
    duplicates: u64,
    failed_but_charged: u64,
    told: Told,
    unknown_queued: u64,
    settled_by_worker: u64,
}

fn column(gateway: &Gateway, told: Told, told_failed: &HashMap<u64, bool>) -> Column {
    let charges = gateway.charges_per_order();
    let executed = charges.values().sum::<usize>() as u64;
    let duplicates = charges.values().map(|n| n - 1).sum::<usize>() as u64;
    let failed_but_charged = told_failed
        .keys()
        .filter(|id| charges.contains_key(id))
        .count() as u64;
    Column {
        calls: told.succeeded + told.declined + told.failed + told.unknown,
        attempts: told.attempts,
        lookups: gateway.remote.lookups(),
        replays: 0,
        executed,
        duplicates,
        failed_but_charged,
        told,
        unknown_queued: 0,
        settled_by_worker: 0,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut seed = 7;
    let mut store = None;
    let mut settlement = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--store" {
            store = Some(
                args.next()
                    .ok_or("--store needs a URL, e.g. sqlite:/tmp/orders.db")?,
            );
        } else if arg == "--settlement" {
            settlement = Some(
                args.next()
                    .ok_or("--settlement needs a file, e.g. /tmp/settlement.csv")?,
            );
        } else {
            seed = arg
                .parse::<u64>()
                .map_err(|e| format!("the seed must be a number, got {arg:?}: {e}"))?;
        }
    }
    match store {
        None => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()?;
            runtime.block_on(compare(seed))
        }
        Some(url) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(durable(seed, &url, settlement.as_deref()))
        }
    }
}

/// Orders run on a durable store.
const DURABLE_ORDERS: u64 = 60;

/// The samekey client alone, in real time, on the store at `url`.
async fn durable(
    seed: u64,
    url: &str,
    settlement: Option<&str>,
) -> Result<(), Box<dyn std::error::Error>> {
    let gateway = Gateway::steady(seed);
    let service = OrderService {
        gateway: gateway.clone(),
        samekey: Runtime::builder()
            .node("demo")
            .jitter_seed(seed)
            .shared_store(open_store(url).await?)
            .build()?,
    };
    let started = std::time::Instant::now();
    let mut told = Told::default();
    for (order, _) in orders().take(DURABLE_ORDERS as usize) {
        tally(&mut told, &service.charge(order).await);
    }
    let stats = service.samekey.stats();
    let executed: usize = gateway.charges_per_order().values().sum();
    println!("samekey order_service on {url} — {DURABLE_ORDERS} orders, seed {seed}");
    println!(
        "calls {}, attempts {}, replays {}, lookups {}",
        stats.calls,
        stats.attempts,
        stats.replays,
        gateway.remote.lookups()
    );
    println!("charges executed in this run: {executed}");
    println!(
        "told: succeeded {}, declined {}, failed {}, unknown {}",
        told.succeeded, told.declined, told.failed, told.unknown
    );
    println!("took {:.1} s", started.elapsed().as_secs_f64());
    if stats.replays == stats.calls {
        println!("every call was answered from the store: nothing was charged again");
    }
    if let Some(path) = settlement {
        let mut csv = String::from("call_id,status,amount\n");
        let settled = gateway.remote.settled();
        for (call_id, charge) in &settled {
            csv.push_str(&format!("{call_id},succeeded,{}\n", charge.amount_cents));
        }
        std::fs::write(path, csv)?;
        println!("the gateway's {} settled charges: {path}", settled.len());
    }
    Ok(())
}

/// The order a call charged, from its recorded outcome (a `Charge`); `None` if it charged nothing.
fn order_of(history: &samekey::journal::CallHistory) -> Option<u64> {
    history
        .receipt
        .as_ref()
        .and_then(|r| r.outcome.as_deref())
        .and_then(|bytes| serde_json::from_slice::<Charge>(bytes).ok())
        .map(|c| c.order_id)
}

async fn open_store(url: &str) -> Result<Arc<dyn samekey::Store>, Box<dyn std::error::Error>> {
    #[cfg(feature = "sqlite")]
    if url.starts_with("sqlite:") {
        return Ok(Arc::new(samekey::store::SqliteStore::connect(url).await?));
    }
    #[cfg(feature = "postgres")]
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        return Ok(Arc::new(samekey::store::PgStore::connect(url).await?));
    }
    Err(format!(
        "no store for `{url}`: use sqlite:PATH (with --features sqlite) or postgres://… (with --features postgres)"
    )
    .into())
}

async fn compare(seed: u64) -> Result<(), Box<dyn std::error::Error>> {
    let started = tokio::time::Instant::now();

    let naive_gateway = Gateway::new(seed);
    let naive = NaiveClient {
        gateway: naive_gateway.clone(),
        next_id: Mutex::new(0),
        attempts: Mutex::new(0),
    };
    let (mut told, told_failed) = run(|order| naive.charge(order)).await;
    told.attempts = *naive.attempts.lock().unwrap_or_else(|p| p.into_inner());
    let naive_col = column(&naive_gateway, told, &told_failed);

    let samekey_gateway = Gateway::new(seed);
    let service = OrderService {
        gateway: samekey_gateway.clone(),
        // Simulated time: leases, compensation rounds and the journal's times follow tokio's clock.
        samekey: Runtime::builder()
            .node("demo")
            .jitter_seed(seed)
            .clock(samekey::clock::TokioClock::new())
            .build()?,
    };
    let (mut told, told_failed) = run(|order| service.charge(order)).await;
    let stats = service.samekey.stats();
    told.attempts = stats.attempts;
    // The compensation worker asks the gateway about every call left UNKNOWN, by its callId, and
    // records what happened; a call the gateway never received is sent again under its callId (the
    // gateway deduplicates by it, so a first request that arrives late charges nothing more), with
    // the order the call kept (`inputs = "order"`). A service runs it as a task, every minute.
    let queued = service.samekey.compensations().await?;
    let (asked, resent) = (samekey_gateway.clone(), samekey_gateway.clone());
    let worker = Compensator::new(&service.samekey)
        .operation(
            "orders.charge",
            CompensationOperation::new(move |call: CallId| {
                let gateway = asked.clone();
                async move { gateway.status(&call).await }
            })
            .rerun(move |entry: samekey::compensation::CompensationEntry| {
                let gateway = resent.clone();
                async move {
                    let Some(Ok((order,))) = entry.inputs::<(Order,)>() else {
                        // Nothing to send it again with: it stays undecided, for a person.
                        let call_id = entry.call_id.clone();
                        return Err(PayError::Samekey(samekey::Error::Unknown { call_id }));
                    };
                    let charge = Charge {
                        order_id: order.id,
                        amount_cents: order.amount_cents,
                    };
                    gateway.charge(Some(entry.call_id.as_str()), charge).await
                }
            }),
        )
        .on_escalate(|entry| println!("needs a person: call {} ({})", entry.call_id, entry.reason));
    // Passes until every entry is settled or only a person can help: each round of an undecided
    // entry comes later than the last (1 min, 5 min, 30 min, …), and simulated time skips to it. A
    // sweep first queues any call a crashed owner left PROCESSING (a service's `run` sweeps every
    // 10 min).
    worker.sweep().await?;
    let settled = worker.settle().await?;
    // Counted once the worker is done: its re-sends are charges too (and duplicates, were any).
    let mut samekey_col = column(&samekey_gateway, told, &told_failed);
    samekey_col.replays = stats.replays;
    samekey_col.settled_by_worker = (settled.succeeded + settled.failed + settled.released) as u64;
    // Every entry still queued, pending or with a person (`MANUAL`).
    samekey_col.unknown_queued = service.samekey.compensations().await?.len() as u64;

    println!(
        "samekey order_service — {ORDERS} orders, every {DOUBLE_SUBMIT_EVERY}th submitted twice, seed {seed}"
    );
    println!(
        "faults: 8% requests lost, 8% replies lost after the charge, 8% slow (2.5 s, timeout 1 s),"
    );
    println!(
        "        6% 503, 5% rate limited, every 37th card declined, 4% of receipt lookups fail,"
    );
    println!(
        "        and the receipt endpoint down from {} s to {} s (an incident)\n",
        STATUS_OUTAGE.0.as_secs(),
        STATUS_OUTAGE.1.as_secs()
    );
    println!(
        "{:<34}{:>24}{:>12}",
        "", "naive (new id per retry)", "samekey"
    );
    let rows: [(&str, u64, u64); 13] = [
        ("calls", naive_col.calls, samekey_col.calls),
        ("attempts sent", naive_col.attempts, samekey_col.attempts),
        ("receipt lookups", naive_col.lookups, samekey_col.lookups),
        (
            "replays (answered from store)",
            naive_col.replays,
            samekey_col.replays,
        ),
        ("charges executed", naive_col.executed, samekey_col.executed),
        (
            "duplicate charges",
            naive_col.duplicates,
            samekey_col.duplicates,
        ),
        (
            "told: succeeded",
            naive_col.told.succeeded,
            samekey_col.told.succeeded,
        ),
        (
            "told: declined (4xx)",
            naive_col.told.declined,
            samekey_col.told.declined,
        ),
        (
            "told: failed",
            naive_col.told.failed,
            samekey_col.told.failed,
        ),
        (
            "told: failed, but was charged",
            naive_col.failed_but_charged,
            samekey_col.failed_but_charged,
        ),
        (
            "told: unknown (asked to wait)",
            naive_col.told.unknown,
            samekey_col.told.unknown,
        ),
        (
            "settled by the compensation worker",
            naive_col.settled_by_worker,
            samekey_col.settled_by_worker,
        ),
        (
            "left UNKNOWN in compensation",
            naive_col.unknown_queued,
            samekey_col.unknown_queued,
        ),
    ];
    for (name, naive, samekey) in rows {
        println!("{name:<34}{naive:>24}{samekey:>12}");
    }
    // What the journal says about the first call the worker found charged.
    let mut charged = None;
    for entry in &queued {
        let history = service.samekey.history(&entry.call_id).await?;
        if let Some(order) = order_of(&history) {
            charged = Some((entry, history, order));
            break;
        }
    }
    if let Some((entry, history, order)) = charged {
        println!("\nthe journal of call {} (order {order}):", entry.call_id);
        let start = history.timeline().first().map_or(0, |e| e.at_ms);
        for event in history.timeline() {
            let offset = event.at_ms.saturating_sub(start) as f64 / 1000.0;
            println!("  +{offset:>7.3} s  {}", event.what);
        }
    }
    println!("\nsimulated time: {:.1} s", started.elapsed().as_secs_f64());
    if samekey_col.duplicates != 0 || samekey_col.failed_but_charged != 0 {
        return Err("samekey let a duplicate charge through".into());
    }
    // Every call ends settled, or with a person (its reason printed above): none stays UNKNOWN.
    if samekey_col.unknown_queued != 0 {
        return Err(format!(
            "{} calls left UNKNOWN after the compensation worker",
            samekey_col.unknown_queued
        )
        .into());
    }
    Ok(())
}
