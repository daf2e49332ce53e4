//! The world of one run: nodes of one service on one shared store, the gateways and the stock
//! service they call, the compensation worker, and what every component recorded.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use samekey::at_most_once::AtMostOnce;
use samekey::compensation::{CompensationEntry, CompensationOperation};
use samekey::store::LocalCache;
use samekey::{CallId, Compensator, Runtime, TraceId};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

use crate::clock::{NodeClock, TrueClock};
use crate::coverage::{Coverage, Fault, Surface};
use crate::gateway::{Effect, Gateway, Stock};
use crate::history::History;
use crate::messaging::{consume, Messaging, OrderEvent, OrderEventV2};
use crate::payments::{Op, PayError, Payments, SCOPE_PAY, SCOPE_PAY_HOLD, SCOPE_PAY_RERUN};
use crate::rng::Draws;
use crate::store::{Life, NodeStore, SharedStore};

/// The compensation worker's rounds (the delays after each round of an undecided entry). The
/// gateways that a reversal's operation calls never receive late requests from its callers (see
/// [`crate::gateway`]), and refuse an unknown callId older than
/// [`REFUSE_AFTER`](crate::gateway::REFUSE_AFTER).
pub const ROUNDS: [Duration; 5] = [
    Duration::from_secs(40),
    Duration::from_secs(80),
    Duration::from_secs(160),
    Duration::from_secs(320),
    Duration::from_secs(600),
];

/// The nodes' lease (for functions without a `timeout`).
pub const LEASE: Duration = Duration::from_secs(10);

/// What every component shares: the draws, the history, the true clock, the store, and the records
/// the invariants are checked against.
pub struct Shared {
    /// Every choice.
    pub draws: Draws,
    /// What happened.
    pub history: History,
    /// The true time.
    pub truth: Arc<TrueClock>,
    /// The one store of the service.
    pub store: Arc<SharedStore>,
    /// The store of the payments API, a service of its own (behind the Idempotency-Key layer).
    pub api_store: Arc<SharedStore>,
    coverage: Mutex<Coverage>,
    effects: Mutex<Vec<Effect>>,
    releases: Mutex<Vec<(String, String)>>,
    escalated: Mutex<BTreeSet<(Place, String)>>,
    subjects: Mutex<BTreeMap<String, String>>,
    stale_writes: Mutex<Vec<String>>,
    callbacks_applied: Mutex<Vec<(String, String)>>,
    ops: Mutex<HashMap<String, Op>>,
    world: OnceLock<Weak<World>>,
}

impl Shared {
    /// Counts a fault drawn at a surface.
    pub fn cover(&self, fault: Fault, surface: Surface) {
        self.coverage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .add(fault, surface);
    }

    /// The counts so far.
    pub fn coverage(&self) -> Coverage {
        self.coverage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records a gateway's effect and gives it its number (from 1).
    pub fn effect(&self, mut effect: Effect) -> u64 {
        let mut effects = self.effects.lock().unwrap_or_else(|p| p.into_inner());
        effect.no = effects.len() as u64 + 1;
        let no = effect.no;
        effects.push(effect);
        no
    }

    /// Every effect, in order.
    pub fn effects(&self) -> Vec<Effect> {
        self.effects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records a reversal's effect: the stock of `order` released under `call_id`.
    pub fn release(&self, order: &str, call_id: &str) {
        self.releases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((order.to_owned(), call_id.to_owned()));
    }

    /// Every release, in order: (order, the reversal's callId).
    pub fn releases(&self) -> Vec<(String, String)> {
        self.releases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records that the escalation hook of the worker of `place` was called for `call_id`.
    pub fn escalate(&self, place: Place, call_id: &str) {
        self.escalated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((place, call_id.to_owned()));
        let short = self.history.id(call_id);
        let subject = self.subject_of(call_id);
        self.history.log(
            "worker",
            subject.as_deref(),
            format!("escalates {short} ({place:?}) to MANUAL"),
        );
    }

    /// The callIds the escalation hook was called for, by store.
    pub fn escalated(&self) -> BTreeSet<(Place, String)> {
        self.escalated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// How a handler that charged answers, drawn: as it should (`None`), or — while the fault window
    /// is open, one time in seven or so — with one of `answers` (each half the time), counted at
    /// `surface`.
    pub fn answer_after_effect(&self, answers: [Fault; 2], surface: Surface) -> Option<Fault> {
        let answer = if self.draws.fault(15) {
            let drawn = if self.draws.chance(50) {
                answers[0]
            } else {
                answers[1]
            };
            self.draws.keep(Some(drawn), surface)
        } else {
            None
        };
        if let Some(answer) = answer {
            self.cover(answer, surface);
        }
        answer
    }

    /// Records a write the store accepted from an owner that no longer held the key.
    pub fn stale_write(&self, what: String) {
        self.history
            .log("store", None, format!("ACCEPTS A STALE WRITE: {what}"));
        self.stale_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what);
    }

    /// Every stale write the store accepted.
    pub fn stale_writes(&self) -> Vec<String> {
        self.stale_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Notes that `call_id` is about `subject` (an order, a shop's events).
    pub fn about(&self, call_id: &str, subject: &str) {
        self.subjects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(call_id.to_owned())
            .or_insert_with(|| subject.to_owned());
    }

    /// What `call_id` is about, if known.
    pub fn subject_of(&self, call_id: &str) -> Option<String> {
        self.subjects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(call_id)
            .cloned()
    }

    /// Every callId's subject.
    pub fn subjects(&self) -> BTreeMap<String, String> {
        self.subjects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Records a callback that a node applied (`Applied`, not `AlreadyApplied`).
    pub fn callback_applied(&self, call_id: &str, order: &str) {
        self.callbacks_applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((call_id.to_owned(), order.to_owned()));
    }

    /// Every callback applied.
    pub fn callbacks_applied(&self) -> Vec<(String, String)> {
        self.callbacks_applied
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Notes which function an order goes through.
    pub fn set_op(&self, order: &str, op: Op) {
        self.ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(order.to_owned(), op);
    }

    /// The surface a charge for `order` comes from: a nested call for checkouts.
    pub fn surface_of(&self, order: &str) -> Surface {
        match self
            .ops
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(order)
        {
            Some(Op::Checkout) => Surface::Nested,
            Some(Op::Api) => Surface::Http,
            Some(Op::Grpc) => Surface::Grpc,
            _ => Surface::Call,
        }
    }

    /// The world, while it exists.
    pub fn world(&self) -> Option<Arc<World>> {
        self.world.get().and_then(Weak::upgrade)
    }
}

/// Which store a record is in: the service's, or its payments API's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Place {
    /// The service's store (its calls, the compensation worker, the consumers' inboxes).
    Service,
    /// The payments API's store (the Idempotency-Key layer's records).
    Api,
}

/// One node of the service: its incarnations, one at a time. The last node keeps finished receipts
/// in a `LocalCache` in front of its connection to the store.
pub struct Node {
    index: usize,
    skew_ms: i64,
    hosts_worker: bool,
    incarnations: AtomicU64,
    current: Mutex<Option<Incarnation>>,
    inflight: Arc<Mutex<BTreeMap<u64, String>>>,
    next_request: AtomicU64,
}

struct Incarnation {
    life: Arc<Life>,
    payments: Arc<Payments>,
    tasks: JoinSet<()>,
}

/// What a request to a node came to.
#[derive(Debug)]
pub enum Served<T> {
    /// The node answered.
    Answered(T),
    /// The node was down: nothing was sent (connection refused).
    Refused,
    /// The connection broke before an answer: the node crashed, or the handler panicked.
    Lost,
}

impl Node {
    /// The node's name.
    pub fn name(&self) -> String {
        format!("node{}", self.index)
    }

    /// Whether it is up.
    pub fn is_up(&self) -> bool {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        current.as_ref().is_some_and(|i| !i.life.is_dead())
    }

    /// Runs `f` on the node's service, as a request handled by a task of the node (a crash aborts it
    /// at whatever `.await` it is). The work goes on if the caller stops waiting.
    pub async fn serve<T, F, Fut>(&self, what: &str, f: F) -> Served<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Payments>) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        self.serve_as(what, false, f).await
    }

    /// [`Node::serve`], as a server that cancels a request's work when its client hangs up (hyper
    /// drops the handler's future): dropping the returned future before it answers drops the work at
    /// whatever `.await` it is, on a node that lives on.
    pub async fn serve_until_hang_up<T, F, Fut>(&self, what: &str, f: F) -> Served<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Payments>) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        self.serve_as(what, true, f).await
    }

    async fn serve_as<T, F, Fut>(&self, what: &str, hang_up_cancels: bool, f: F) -> Served<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Payments>) -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let _hang_up = {
            let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
            let Some(inc) = current.as_mut().filter(|i| !i.life.is_dead()) else {
                return Served::Refused;
            };
            let id = self.next_request.fetch_add(1, Ordering::Relaxed);
            let inflight = Arc::clone(&self.inflight);
            inflight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, what.to_owned());
            let done = InFlight { id, inflight };
            let work = f(Arc::clone(&inc.payments));
            let task = inc.tasks.spawn(inc.life.freezes(async move {
                let out = work.await;
                drop(done);
                let _ = tx.send(out);
            }));
            HangUp(hang_up_cancels.then(|| (task, Arc::clone(&inc.life))))
        };
        match rx.await {
            Ok(out) => Served::Answered(out),
            Err(_) => Served::Lost,
        }
    }

    /// What its live incarnation is still working on.
    pub fn inflight(&self) -> Vec<String> {
        self.inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

/// Cancels a request's work when its client stops waiting (dropped before the answer came), for a
/// server that cancels on hang-up; a finished task is not affected. A paused node hears of the
/// hang-up when it resumes, and the work that became ready meanwhile races it.
struct HangUp(Option<(tokio::task::AbortHandle, Arc<Life>)>);

impl Drop for HangUp {
    fn drop(&mut self) {
        let Some((task, life)) = self.0.take() else {
            return;
        };
        match life.paused_until() {
            Some(until) if until > tokio::time::Instant::now() => {
                tokio::spawn(async move {
                    tokio::time::sleep_until(until).await;
                    task.abort();
                });
            }
            _ => task.abort(),
        }
    }
}

/// Unregisters a request when its task ends or is dropped (aborted by a crash).
struct InFlight {
    id: u64,
    inflight: Arc<Mutex<BTreeMap<u64, String>>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

/// The world of one run.
pub struct World {
    /// What every component shares.
    pub shared: Arc<Shared>,
    /// The service's nodes.
    pub nodes: Vec<Node>,
    /// The gateway that executes every request that arrives (`pay`, `pay_hold`, `checkout`).
    pub gw_every: Arc<Gateway>,
    /// The gateway that deduplicates by callId (`pay_rerun`).
    pub gw_dedup: Arc<Gateway>,
    /// The stock service reversals release stock through.
    pub stock: Stock,
    /// The outbox, the broker and the consumers' downstream service.
    pub messaging: Arc<Messaging>,
}

/// The reversal's own operation: releasing an order's stock at most once.
static RELEASE: AtMostOnce = AtMostOnce::new("sim.stock.release").prefix("rel");

impl World {
    /// A world of `nodes` nodes, their clocks skewed by draws, its fault window closing at the
    /// draws' end.
    pub fn new(draws: Draws, nodes: usize) -> Arc<World> {
        let truth = Arc::new(TrueClock::new());
        let shared = Arc::new(Shared {
            store: Arc::new(SharedStore::new(Arc::clone(&truth))),
            api_store: Arc::new(SharedStore::new(Arc::clone(&truth))),
            draws,
            history: History::new(),
            truth,
            coverage: Mutex::new(Coverage::default()),
            effects: Mutex::new(Vec::new()),
            releases: Mutex::new(Vec::new()),
            escalated: Mutex::new(BTreeSet::new()),
            subjects: Mutex::new(BTreeMap::new()),
            stale_writes: Mutex::new(Vec::new()),
            callbacks_applied: Mutex::new(Vec::new()),
            ops: Mutex::new(HashMap::new()),
            world: OnceLock::new(),
        });
        let nodes = (0..nodes)
            .map(|index| {
                let skew_ms = if shared.draws.chance(50)
                    && shared
                        .draws
                        .keep(Some(Fault::ClockSkew), Surface::Node)
                        .is_some()
                {
                    shared.cover(Fault::ClockSkew, Surface::Node);
                    shared.draws.between(0, 10_000) as i64 - 5_000
                } else {
                    0
                };
                Node {
                    index,
                    skew_ms,
                    hosts_worker: index == 0,
                    incarnations: AtomicU64::new(0),
                    current: Mutex::new(None),
                    inflight: Arc::new(Mutex::new(BTreeMap::new())),
                    next_request: AtomicU64::new(0),
                }
            })
            .collect();
        let world = Arc::new(World {
            gw_every: Arc::new(Gateway::new("gw-every", false, Arc::clone(&shared))),
            gw_dedup: Arc::new(Gateway::new("gw-dedup", true, Arc::clone(&shared))),
            stock: Stock::new(Arc::clone(&shared)),
            messaging: Arc::new(Messaging::new(Arc::clone(&shared))),
            nodes,
            shared,
        });
        let _ = world.shared.world.set(Arc::downgrade(&world));
        for node in 0..world.nodes.len() {
            world.start(node);
        }
        world
    }

    /// A runtime for a node incarnation (or the auditor): its connection to the store, its clock.
    fn runtime(
        &self,
        store: &Arc<SharedStore>,
        name: &str,
        life: &Arc<Life>,
        skew_ms: i64,
    ) -> Runtime {
        let store = NodeStore::new(
            Arc::clone(store),
            Arc::clone(life),
            Arc::clone(&self.shared),
        );
        // The last node keeps finished receipts in process, in front of its connection, as a
        // service that replays a lot does: its duplicates are answered without the store.
        let builder = Runtime::builder();
        let builder = if name.starts_with(&format!("node{}#", self.nodes.len() - 1)) {
            builder.store(LocalCache::new(store, 1_000))
        } else {
            builder.store(store)
        };
        let built = builder
            .node(name.replace('#', "i"))
            .clock(NodeClock {
                truth: Arc::clone(&self.shared.truth),
                skew_ms,
            })
            .lease(LEASE)
            .busy_wait(Duration::from_secs(5))
            .jitter_seed(self.shared.draws.below(u64::MAX))
            .build();
        match built {
            Ok(rt) => rt,
            Err(e) => unreachable!("node names are valid labels: {e}"),
        }
    }

    /// Starts a new incarnation of `node` (at the start, and after a crash).
    pub fn start(self: &Arc<Self>, node: usize) {
        let n = &self.nodes[node];
        let incarnation = n.incarnations.fetch_add(1, Ordering::Relaxed);
        let name = format!("node{node}#{incarnation}");
        let life = Arc::new(Life::new(name.clone()));
        let rt = self.runtime(&self.shared.store, &name, &life, n.skew_ms);
        let api_rt = self.runtime(&self.shared.api_store, &name, &life, n.skew_ms);
        let payments = Arc::new_cyclic(|me| Payments {
            rt: rt.clone(),
            api: crate::api::api(me.clone(), &api_rt),
            grpc: crate::grpc::service(me.clone(), &api_rt),
            client: crate::api::client(self, &life),
            life: Arc::clone(&life),
            world: Arc::clone(self),
        });
        let mut tasks = JoinSet::new();
        if n.hosts_worker {
            let worker = self.compensator(&rt, &life);
            tasks.spawn(life.freezes(async move {
                worker
                    .run(Duration::from_secs(5), std::future::pending())
                    .await;
            }));
        }
        // Consumers of both queues on every node; a restarted node may come back with a newer
        // consumer, whose payload type has one more optional field.
        let newer = incarnation > 0
            && self.shared.draws.fault(30)
            && self
                .shared
                .draws
                .keep(Some(Fault::Redeployed), Surface::Inbox)
                .is_some();
        if newer {
            self.shared.cover(Fault::Redeployed, Surface::Inbox);
            self.shared
                .history
                .log(name.clone(), None, "redeployed with the newer consumer");
        }
        for queue in self.messaging.scopes() {
            let (messaging, payments) = (Arc::clone(&self.messaging), Arc::clone(&payments));
            if newer {
                tasks.spawn(life.freezes(consume::<OrderEventV2>(messaging, payments, queue)));
            } else {
                tasks.spawn(life.freezes(consume::<OrderEvent>(messaging, payments, queue)));
            }
        }
        if node == 1 % self.nodes.len() {
            let (messaging, relay_life) = (Arc::clone(&self.messaging), Arc::clone(&life));
            tasks.spawn(life.freezes(async move {
                loop {
                    messaging.relay_once(&relay_life).await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }));
        }
        *n.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Incarnation {
            life,
            payments,
            tasks,
        });
        if incarnation > 0 {
            self.shared.history.log(name, None, "restarted");
        }
    }

    /// Kills `node`: its tasks are dropped at whatever `.await` they are, and nothing a dropped
    /// future tries to send afterwards (a drop guard's write) arrives.
    pub fn crash(&self, node: usize) {
        let mut current = self.nodes[node]
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(inc) = current.as_mut() {
            if !inc.life.is_dead() {
                inc.life.kill();
                inc.tasks.abort_all();
                self.shared
                    .history
                    .log(inc.life.name.clone(), None, "CRASHES");
            }
        }
    }

    /// Pauses `node` for `pause`.
    pub fn pause(&self, node: usize, pause: Duration) {
        let current = self.nodes[node]
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(inc) = current.as_ref() {
            inc.life.pause_until(tokio::time::Instant::now() + pause);
            self.shared.history.log(
                inc.life.name.clone(),
                None,
                format!("PAUSES for {} ms", pause.as_millis()),
            );
        }
    }

    /// The compensation worker of a node (or the auditor), with the operations of every scope:
    /// lookups at the gateways, the reversal (releasing the order's stock), the re-run under the
    /// call's callId, and the escalation hook.
    pub fn compensator(self: &Arc<Self>, rt: &Runtime, life: &Arc<Life>) -> Compensator {
        let lookup = |gateway: Arc<Gateway>| {
            let life = Arc::clone(life);
            move |call: CallId| {
                let gateway = Arc::clone(&gateway);
                let life = Arc::clone(&life);
                async move { gateway.status(&life, &call).await }
            }
        };
        let reverse = {
            let world = Arc::clone(self);
            let life = Arc::clone(life);
            let rt = rt.clone();
            move |entry: CompensationEntry| {
                let world = Arc::clone(&world);
                let life = Arc::clone(&life);
                let rt = rt.clone();
                async move { world.reverse(&rt, &life, entry).await }
            }
        };
        let rerun = {
            let world = Arc::clone(self);
            let life = Arc::clone(life);
            move |entry: CompensationEntry| {
                let world = Arc::clone(&world);
                let life = Arc::clone(&life);
                async move {
                    let order = order_of(&entry)?;
                    world
                        .gw_dedup
                        .charge(&life, &entry.call_id, TraceId::from_u128(1), &order)
                        .await
                }
            }
        };
        let shared = Arc::clone(&self.shared);
        Compensator::new(rt)
            .rounds(ROUNDS)
            .operation(
                SCOPE_PAY,
                CompensationOperation::new(lookup(Arc::clone(&self.gw_every)))
                    .reversal(reverse.clone()),
            )
            .operation(
                SCOPE_PAY_HOLD,
                CompensationOperation::new(lookup(Arc::clone(&self.gw_every))).reversal(reverse),
            )
            .operation(
                SCOPE_PAY_RERUN,
                CompensationOperation::new(lookup(Arc::clone(&self.gw_dedup))).rerun(rerun),
            )
            .on_escalate(move |entry| shared.escalate(Place::Service, entry.call_id.as_str()))
    }

    /// The reversal: releases the order's stock through its own at-most-once operation.
    async fn reverse(
        &self,
        rt: &Runtime,
        life: &Arc<Life>,
        entry: CompensationEntry,
    ) -> Result<(), PayError> {
        let order = order_of(&entry)?;
        let short = self.shared.history.id(entry.call_id.as_str());
        self.shared
            .history
            .log("worker", Some(&order), format!("reverses {short}"));
        let stock = &self.stock;
        RELEASE
            .key(&order)
            .runtime(rt)
            .run(|| async {
                let call = samekey::current();
                stock.release(life, &order, call.call_id()).await
            })
            .await
    }
}

/// The order a compensation entry's call was for, from its inputs.
fn order_of(entry: &CompensationEntry) -> Result<String, PayError> {
    match entry.inputs::<(String, u64)>() {
        Some(Ok((order, _amount))) => Ok(order),
        _ => Err(PayError::Refused("the entry keeps no inputs".into())),
    }
}

impl World {
    /// A runtime for the final pass on `store`, on a healthy connection of its own.
    pub fn auditor(&self, store: &Arc<SharedStore>, life: &Arc<Life>) -> Runtime {
        self.runtime(store, "auditor", life, 0)
    }

    /// Ends every incarnation (their tasks are dropped), breaking the world's reference cycles.
    pub fn shutdown(&self) {
        for node in &self.nodes {
            let taken = node
                .current
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(inc) = taken {
                inc.life.kill();
                drop(inc);
            }
        }
    }
}
