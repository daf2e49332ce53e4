//! RabbitMQ, for real (SAMEKEY_AMQP_URL): a redelivery after the consumer's connection died between
//! the receipt and the ack is answered from the receipt; a requeued message is worked once and its
//! deliveries journaled; a poison message is dead-lettered after max_deliveries on a classic queue
//! (counted from the journal) and on a quorum queue (x-delivery-count); a permanent failure and an
//! unreadable body are dead-lettered at once, the reason in the dead letter; the two messages of one
//! `#[idempotent]` call, published twice by its retry, are each worked once; a publish whose confirm
//! was lost is republished under the same id and worked once; Python's pika publishing one message
//! id three times has it worked once; a broker restart mid-stream loses nothing and works nothing
//! twice.

#![cfg(feature = "rabbitmq")]

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use samekey::journal::EventKind;
use samekey::{idempotent, Classify, ErrorClass, Runtime};
use samekey_messaging::amqp::lapin::options::{
    BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use samekey_messaging::amqp::lapin::types::{AMQPValue, FieldTable};
use samekey_messaging::amqp::lapin::{Channel, Connection, ConnectionProperties};
use samekey_messaging::amqp::{
    declare_queue, AmqpConsumer, AmqpError, AmqpPublisher, Endpoint, QueueType, Settled, Settlement,
};
use samekey_messaging::{
    Confirms, Disposition, Envelope, Inbox, Message, Publish, PublishError,
    HEADER_DEAD_LETTER_REASON,
};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, RwLock};

/// How long any one awaited event may take before the test fails.
const WITHIN: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
enum WorkError {
    #[error("not yet")]
    NotYet,
    #[error("never")]
    Never,
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
    #[error(transparent)]
    Amqp(#[from] AmqpError),
}

impl Classify for WorkError {
    fn classify(&self) -> ErrorClass {
        match self {
            WorkError::NotYet => ErrorClass::Retryable,
            WorkError::Never => ErrorClass::Permanent,
            WorkError::Samekey(e) => e.classify(),
            WorkError::Amqp(e) => e.classify(),
        }
    }
}

/// The broker's URL, or a visible `skipped:` line.
fn amqp_url() -> Option<String> {
    match std::env::var("SAMEKEY_AMQP_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            samekey::conformance::skipped(
                "set SAMEKEY_AMQP_URL (eval \"$(scripts/services start)\")",
            );
            None
        }
    }
}

/// The restart test stops the broker: the others hold this shared while they run.
fn broker_lock() -> &'static RwLock<()> {
    static LOCK: OnceLock<RwLock<()>> = OnceLock::new();
    LOCK.get_or_init(|| RwLock::new(()))
}

/// A name no other test or run uses.
fn unique(what: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(N.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("samekey-test.{what}.{:016x}", hasher.finish())
}

/// The test's own connection to the broker, to declare and inspect queues.
struct Broker {
    _connection: Connection,
    channel: Channel,
    queues: Vec<String>,
}

impl Broker {
    async fn open(url: &str) -> Broker {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .expect("the test connects to RabbitMQ");
        let channel = connection.create_channel().await.expect("a channel");
        Broker {
            _connection: connection,
            channel,
            queues: Vec::new(),
        }
    }

    /// Declares a durable queue of `kind` (deleted at the end of the test).
    async fn queue(&mut self, what: &str, kind: QueueType) -> String {
        let name = unique(what);
        declare_queue(&self.channel, &name, kind)
            .await
            .expect("the queue is declared");
        self.queues.push(name.clone());
        name
    }

    /// The count of messages ready in `queue`.
    async fn ready(&self, queue: &str) -> u32 {
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("the queue exists")
            .message_count()
    }

    /// Waits until `queue` holds `n` ready messages (the broker requeues a closed channel's
    /// unacknowledged deliveries on its own time).
    async fn ready_eventually(&self, queue: &str, n: u32) {
        let deadline = tokio::time::Instant::now() + WITHIN;
        loop {
            let ready = self.ready(queue).await;
            if ready == n {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{queue} holds {ready} ready messages, not {n}, after {WITHIN:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Takes every message of `queue` (acknowledged): body, message id, text headers.
    async fn drain(&self, queue: &str) -> Vec<(Vec<u8>, Option<String>, HashMap<String, String>)> {
        let mut taken = Vec::new();
        while let Some(message) = self
            .channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic.get")
        {
            let headers = message
                .delivery
                .properties
                .headers()
                .as_ref()
                .map(|table| {
                    table
                        .inner()
                        .iter()
                        .filter_map(|(name, value)| match value {
                            AMQPValue::LongString(s) => Some((
                                name.to_string(),
                                String::from_utf8_lossy(s.as_bytes()).into_owned(),
                            )),
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            let id = message
                .delivery
                .properties
                .message_id()
                .as_ref()
                .map(|id| id.to_string());
            taken.push((message.delivery.data.clone(), id, headers));
        }
        taken
    }

    async fn delete_queues(self) {
        for queue in &self.queues {
            let _ = self
                .channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }
}

/// A consumer running in its own task, reporting what it settled.
struct Running {
    settled: mpsc::UnboundedReceiver<Settled>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), AmqpError>>,
}

fn start<T, R, F, Fut>(consumer: AmqpConsumer, inbox: Arc<Inbox>, handler: F) -> Running
where
    T: Serialize + DeserializeOwned + Send + 'static,
    R: Serialize + DeserializeOwned + Send + 'static,
    F: Fn(T) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<R, WorkError>> + Send + 'static,
{
    let (tx, settled) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let consumer = consumer
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
        .on_settled(move |s| {
            let _ = tx.send(s.clone());
        });
    let task = tokio::spawn(async move {
        consumer
            .run(&inbox, handler, async {
                let _ = stopped.await;
            })
            .await
    });
    Running {
        settled,
        stop: Some(stop),
        task,
    }
}

impl Running {
    /// The next `n` settled deliveries.
    async fn next(&mut self, n: usize) -> Vec<Settled> {
        let mut got = Vec::with_capacity(n);
        while got.len() < n {
            match tokio::time::timeout(WITHIN, self.settled.recv()).await {
                Ok(Some(settled)) => got.push(settled),
                Ok(None) => panic!(
                    "the consumer ended after {} of {n} deliveries: {got:#?}",
                    got.len()
                ),
                Err(_) => panic!(
                    "only {} of {n} deliveries settled within {WITHIN:?}: {got:#?}",
                    got.len()
                ),
            }
        }
        got
    }

    /// Stops the consumer (gracefully) and checks that it ended well.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let ended = tokio::time::timeout(WITHIN, self.task)
            .await
            .expect("the consumer stops when told");
        ended
            .expect("the consumer's task")
            .expect("the consumer ends without error");
    }
}

/// The `Delivered` events the inbox journaled under `key`: (delivery, redelivered, disposition, detail).
async fn delivered(rt: &Runtime, key: &samekey::Key) -> Vec<(Option<u64>, bool, String, String)> {
    rt.store()
        .journal(key, rt.now_ms())
        .await
        .expect("the journal reads")
        .into_iter()
        .filter_map(|event| match event.what {
            EventKind::Delivered {
                delivery,
                redelivered,
                disposition,
                detail,
            } => Some((delivery, redelivered, disposition, detail)),
            _ => None,
        })
        .collect()
}

/// A consumer of `queue` over `endpoint`, its dead letters in `dead_letters`.
fn consumer(endpoint: impl Into<Endpoint>, queue: &str, dead_letters: &str) -> AmqpConsumer {
    AmqpConsumer::new(endpoint, queue)
        .dead_letters(dead_letters)
        .prefetch(4)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: String,
}

fn order(id: &str) -> Order {
    Order { id: id.to_owned() }
}

/// A TCP proxy between the consumer and the broker that can cut every connection through it, to
/// kill a consumer's connection at a chosen point.
struct Proxy {
    url: String,
    links: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(url: &str) -> Proxy {
        // amqp://user:pass@host:port/vhost
        let (head, rest) = url.split_once('@').expect("the URL has user@host");
        let (upstream, vhost) = rest.split_once('/').unwrap_or((rest, ""));
        let upstream = upstream.to_owned();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the proxy listens");
        let local = listener.local_addr().expect("the proxy's address");
        let links: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let links = links.clone();
            async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    let upstream = upstream.clone();
                    let link = tokio::spawn(async move {
                        if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                        }
                    });
                    links.lock().unwrap().push(link);
                }
            }
        });
        Proxy {
            url: format!("{head}@{local}/{vhost}"),
            links,
            accept,
        }
    }

    /// Cuts every connection through the proxy, and returns once both ends are closed.
    async fn cut(&self) {
        let links: Vec<_> = self.links.lock().unwrap().drain(..).collect();
        for link in links {
            link.abort();
            let _ = link.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_after_the_consumer_died_before_its_ack_is_answered_from_the_receipt() {
    let Some(url) = amqp_url() else { return };
    let _shared = broker_lock().read().await;
    let mut broker = Broker::open(&url).await;
    let queue = broker.queue("crash", QueueType::Classic).await;
    let dead = broker.queue("crash.dead", QueueType::Classic).await;
    let proxy = Arc::new(Proxy::start(&url).await);

    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let inbox = Arc::new(Inbox::new("shipping.on_paid").runtime(&rt));
    let shipped = Arc::new(AtomicU32::new(0));
    let mut running = start(consumer(&proxy.url, &queue, &dead), inbox.clone(), {
        let (shipped, proxy) = (shipped.clone(), proxy.clone());
        move |order: Order| {
            let (shipped, proxy) = (shipped.clone(), proxy.clone());
            async move {
                // The side effect, then the consumer's connection dies before its ack.
                if shipped.fetch_add(1, Ordering::SeqCst) == 0 {
                    proxy.cut().await;
                }
                Ok::<_, WorkError>(format!("shipped {}", order.id))
            }
        }
    });

    let publisher = AmqpPublisher::new(url.as_str());
    let message = Envelope::new(order("o-1"));
    publisher.publish_envelope(&queue, &message).await.unwrap();

    // The first delivery's ack went nowhere; the broker delivers it again on the consumer's next
    // connection, and the inbox answers from the receipt.
    let mut settled = running.next(1).await;
    while !settled.last().is_some_and(|s| s.redelivered) {
        settled.extend(running.next(1).await);
    }
    let again = settled.last().unwrap();
    assert_eq!(again.disposition, Disposition::Ack);
    assert_eq!(again.settlement, Settlement::Acked);
    assert_eq!(
        again.message_id.as_deref(),
        Some(message.message_id().as_str())
    );
    assert_eq!(shipped.load(Ordering::SeqCst), 1, "shipped once");
    running.stop().await;

    assert_eq!(broker.ready(&queue).await, 0, "the redelivery was acked");
    let journal = delivered(&rt, &inbox.key_of(&message)).await;
    assert_eq!(
        journal,
        [(None, true, "ack".to_owned(), String::new())],
        "the redelivery is journaled"
    );
    broker.delete_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requeued_message_is_worked_once_and_its_deliveries_journaled() {
    let Some(url) = amqp_url() else { return };
    let _shared = broker_lock().read().await;
    let mut broker = Broker::open(&url).await;
    let queue = broker.queue("requeue", QueueType::Classic).await;
    let dead = broker.queue("requeue.dead", QueueType::Classic).await;

    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let inbox = Arc::new(Inbox::new("shipping.on_paid").runtime(&rt));
    let tries = Arc::new(AtomicU32::new(0));
    let shipped = Arc::new(AtomicU32::new(0));
    let mut running = start(consumer(&url, &queue, &dead), inbox.clone(), {
        let (tries, shipped) = (tries.clone(), shipped.clone());
        move |_: Order| {
            let (tries, shipped) = (tries.clone(), shipped.clone());
            async move {
                if tries.fetch_add(1, Ordering::SeqCst) == 0 {
                    return Err(WorkError::NotYet);
                }
                shipped.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        }
    });

    let message = Envelope::new(order("o-2"));
    AmqpPublisher::new(url.as_str())
        .publish_envelope(&queue, &message)
        .await
        .unwrap();
    let settled = running.next(2).await;
    assert_eq!(settled[0].settlement, Settlement::Requeued);
    assert!(!settled[0].redelivered);
    assert_eq!(settled[1].settlement, Settlement::Acked);
    assert!(
        settled[1].redelivered,
        "the broker says it delivered it before"
    );
    assert_eq!(tries.load(Ordering::SeqCst), 2);
    assert_eq!(shipped.load(Ordering::SeqCst), 1, "worked once");
    running.stop().await;

    let journal = delivered(&rt, &inbox.key_of(&message)).await;
    assert_eq!(
        journal,
        [
            (None, false, "requeue".to_owned(), "not yet".to_owned()),
            (None, true, "ack".to_owned(), String::new()),
        ]
    );
    assert_eq!(broker.ready(&queue).await, 0);
    broker.delete_queues().await;
}

/// A handler that fails `Retryable` every time dead-letters its message after max_deliveries.
async fn poison(kind: QueueType) {
    let Some(url) = amqp_url() else { return };
    let _shared = broker_lock().read().await;
    let mut broker = Broker::open(&url).await;
    let queue = broker.queue("poison", kind).await;
    let dead = broker.queue("poison.dead", QueueType::Classic).await;

    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let inbox = Arc::new(
        Inbox::new("shipping.on_paid")
            .runtime(&rt)
            .max_deliveries(3),
    );
    let tries = Arc::new(AtomicU32::new(0));
    let mut running = start(
        consumer(&url, &queue, &dead).declare(kind),
        inbox.clone(),
        {
            let tries = tries.clone();
            move |_: Order| {
                tries.fetch_add(1, Ordering::SeqCst);
                async { Err::<(), _>(WorkError::NotYet) }
            }
        },
    );

    let message = Envelope::new(order("o-3"));
    AmqpPublisher::new(url.as_str())
        .publish_envelope(&queue, &message)
        .await
        .unwrap();
    let settled = running.next(3).await;
    let settlements: Vec<_> = settled.iter().map(|s| s.settlement.clone()).collect();
    assert_eq!(
        settlements,
        [
            Settlement::Requeued,
            Settlement::Requeued,
            Settlement::DeadLettered {
                queue: dead.clone()
            }
        ]
    );
    let counts: Vec<_> = settled.iter().map(|s| s.delivery).collect();
    match kind {
        QueueType::Quorum => assert_eq!(counts, [Some(1), Some(2), Some(3)], "x-delivery-count"),
        QueueType::Classic => assert_eq!(counts, [None, None, None], "a classic queue counts none"),
    }
    assert_eq!(
        tries.load(Ordering::SeqCst),
        3,
        "tried max_deliveries times"
    );
    running.stop().await;

    assert_eq!(broker.ready(&queue).await, 0, "the original was acked");
    let letters = broker.drain(&dead).await;
    assert_eq!(letters.len(), 1, "one dead letter");
    let (body, id, headers) = &letters[0];
    assert_eq!(body, &message.to_message(&queue).unwrap().body, "its body");
    assert_eq!(id.as_deref(), Some(message.message_id().as_str()), "its id");
    assert_eq!(headers.get("x-call-id"), Some(&message.call_id.to_string()));
    let reason = &headers[HEADER_DEAD_LETTER_REASON];
    assert!(reason.contains("given up after 3 deliveries"), "{reason}");

    let journal = delivered(&rt, &inbox.key_of(&message)).await;
    let dispositions: Vec<_> = journal.iter().map(|e| (e.0, e.1, e.2.as_str())).collect();
    match kind {
        QueueType::Quorum => assert_eq!(
            dispositions,
            [
                (Some(1), false, "requeue"),
                (Some(2), true, "requeue"),
                (Some(3), true, "dead-letter")
            ]
        ),
        QueueType::Classic => assert_eq!(
            dispositions,
            [
                (None, false, "requeue"),
                (None, true, "requeue"),
                (None, true, "dead-letter")
            ]
        ),
    }
    broker.delete_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_dead_lettered_after_max_deliveries_on_a_classic_queue() {
    poison(QueueType::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_dead_lettered_after_max_deliveries_on_a_quorum_queue() {
    poison(QueueType::Quorum).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_and_an_unreadable_body_are_dead_lettered_at_once() {
    let Some(url) = amqp_url() else { return };
    let _shared = broker_lock().read().await;
    let mut broker = Broker::open(&url).await;
    let queue = broker.queue("permanent", QueueType::Classic).await;
    let dead = broker.queue("permanent.dead", QueueType::Classic).await;

    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let inbox = Arc::new(Inbox::new("shipping.on_paid").runtime(&rt));
    let tries = Arc::new(AtomicU32::new(0));
    let mut running = start(consumer(&url, &queue, &dead), inbox, {
        let tries = tries.clone();
        move |_: Order| {
            tries.fetch_add(1, Ordering::SeqCst);
            async { Err::<(), _>(WorkError::Never) }
        }
    });

    let publisher = AmqpPublisher::new(url.as_str());
    let message = Envelope::new(order("o-4"));
    publisher.publish_envelope(&queue, &message).await.unwrap();
    let garbage = Message {
        id: unique("garbage"),
        destination: queue.clone(),
        headers: Vec::new(),
        body: b"not json".to_vec(),
    };
    publisher.publish(&garbage).await.unwrap();

    let settled = running.next(2).await;
    for s in &settled {
        assert!(!s.redelivered, "dead-lettered on its first delivery");
        assert_eq!(
            s.settlement,
            Settlement::DeadLettered {
                queue: dead.clone()
            }
        );
    }
    assert_eq!(
        tries.load(Ordering::SeqCst),
        1,
        "the unreadable one ran nothing"
    );
    running.stop().await;

    assert_eq!(broker.ready(&queue).await, 0);
    let letters = broker.drain(&dead).await;
    let reasons: HashMap<_, _> = letters
        .iter()
        .map(|(_, id, headers)| {
            (
                id.clone().unwrap(),
                headers[HEADER_DEAD_LETTER_REASON].clone(),
            )
        })
        .collect();
    assert!(
        reasons[&message.message_id()].contains("failed for good"),
        "{reasons:?}"
    );
    assert!(
        reasons[&garbage.id].contains("neither a samekey envelope"),
        "{reasons:?}"
    );
    broker.delete_queues().await;
}

/// The orders service: one `#[idempotent]` call publishes two messages, and its first attempt fails
/// after publishing them, so its retry publishes both again.
struct Invoices {
    rt: Runtime,
    publisher: AmqpPublisher,
    queue: String,
    attempts: AtomicU32,
}

impl Invoices {
    #[idempotent(key = "order", runtime = &self.rt, backoff = "1ms..2ms")]
    async fn invoice(&self, order: &str) -> Result<Vec<String>, WorkError> {
        let mut ids = Vec::new();
        for line in ["line-1", "line-2"] {
            let message = Envelope::new(Order {
                id: format!("{order}/{line}"),
            });
            ids.push(
                self.publisher
                    .publish_envelope(&self.queue, &message)
                    .await?,
            );
        }
        if self.attempts.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(WorkError::NotYet);
        }
        Ok(ids)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_messages_of_one_idempotent_call_are_each_worked_once() {
    let Some(url) = amqp_url() else { return };
    let _shared = broker_lock().read().await;
    let mut broker = Broker::open(&url).await;
    let queue = broker.queue("invoices", QueueType::Classic).await;
    let dead = broker.queue("invoices.dead", QueueType::Classic).await;

    let invoices = Invoices {
        rt: Runtime::builder().node("orders-1").build().unwrap(),
        publisher: AmqpPublisher::new(url.as_str()),
        queue: queue.clone(),
        attempts: AtomicU32::new(0),
    };
    let ids = invoices.invoice("o-5").await.unwrap();
    assert_eq!(
        invoices.attempts.load(Ordering::SeqCst),
        2,
        "published twice"
    );
    assert_ne!(ids[0], ids[1], "two messages, two identities");
    assert_eq!(broker.ready(&queue).await, 4, "the broker holds each twice");

    let rt = Runtime::builder().node("billing-1").build().unwrap();
    let inbox = Arc::new(Inbox::new("billing.on_invoice").runtime(&rt));
    let worked: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut running = start(consumer(&url, &queue, &dead), inbox, {
        let worked = worked.clone();
        move |line: Order| {
            worked.lock().unwrap().push(line.id);
            async { Ok::<_, WorkError>(()) }
        }
    });
    let settled = running.next(4).await;
    running.stop().await;
    assert!(settled.iter().all(|s| s.settlement == Settlement::Acked));
    let mut settled_ids: Vec<_> = settled
        .iter()
        .filter_map(|s| s.message_id.clone())
        .collect();
    settled_ids.sort();
    let mut expected = [
        ids[0].clone(),
        ids[0].clone(),
        ids[1].clone(),
        ids[1].clone(),
    ];
    expected.sort();
    assert_eq!(
        settled_ids, expected,
        "every attempt published the same ids"
    );
    let mut worked = worked.lock().unwrap().clone();
    worked.sort();
    assert_eq!(worked, ["o-5/line-1", "o-5/line-2"], "each worked once");
    broker.delete_queues().await;
}

/// A publisher whose `lose`-th publish (from 0) reaches the broker but loses its confirm.
struct LosesConfirm<'a> {
    inner: &'a AmqpPublisher,
    lose: u32,
    calls: AtomicU32,
    ids: Mutex<Vec<String>>,
}

impl Publish for LosesConfirm<'_> {
    async fn publish(&self, message: &Message) -> Result<(), PublishError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        self.ids.lock().unwrap().push(message.id.clone());
        self.inner.publish(message).await?;
        if n == self.lose {
            return Err(PublishError::Unconfirmed {
                id: message.id.clone(),
                reason: "the confirm was lost (injected)".to_owned(),
            });
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_whose_confirm_is_lost_is_republished_under_the_same_id_and_worked_once() {
    let Some(url) = amqp_url() else { return };
    let _shared = broker_lock().read().await;
    let mut broker = Broker::open(&url).await;
    let queue = broker.queue("lost-confirm", QueueType::Classic).await;
    let dead = broker.queue("lost-confirm.dead", QueueType::Classic).await;

    let publisher = AmqpPublisher::new(url.as_str());
    let faulty = LosesConfirm {
        inner: &publisher,
        lose: 0,
        calls: AtomicU32::new(0),
        ids: Mutex::new(Vec::new()),
    };
    let message = Envelope::new(order("o-6")).to_message(&queue).unwrap();
    let confirms = Confirms {
        backoff: Duration::from_millis(10),
        ..Confirms::default()
    };
    confirms
        .publish(&message, || faulty.publish(&message))
        .await
        .expect("the republish is confirmed");
    assert_eq!(
        *faulty.ids.lock().unwrap(),
        [message.id.clone(), message.id.clone()],
        "republished under the same id"
    );

    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let inbox = Arc::new(Inbox::new("shipping.on_paid").runtime(&rt));
    let shipped = Arc::new(AtomicU32::new(0));
    let mut running = start(consumer(&url, &queue, &dead), inbox, {
        let shipped = shipped.clone();
        move |_: Order| {
            shipped.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, WorkError>(()) }
        }
    });
    let settled = running.next(2).await;
    running.stop().await;
    assert!(settled.iter().all(|s| s.settlement == Settlement::Acked
        && s.message_id.as_deref() == Some(message.id.as_str())));
    assert_eq!(shipped.load(Ordering::SeqCst), 1, "worked once");
    assert_eq!(broker.ready(&queue).await, 0);
    broker.delete_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_publish_is_refused() {
    let Some(url) = amqp_url() else { return };
    let _shared = broker_lock().read().await;
    let publisher = AmqpPublisher::new(url.as_str());
    let nowhere = unique("nowhere");
    match publisher
        .publish_envelope(&nowhere, &Envelope::new(order("o-7")))
        .await
    {
        Err(AmqpError::Publish(PublishError::Refused { reason, .. })) => {
            assert!(reason.contains("NO_ROUTE"), "{reason}")
        }
        other => panic!("an unroutable message is refused, not {other:?}"),
    }
}

#[tokio::test]
async fn a_publish_without_a_broker_is_unavailable() {
    // A port nothing listens on: nothing can have been sent.
    let publisher = AmqpPublisher::new("amqp://guest:guest@127.0.0.1:1/%2f")
        .connect_timeout(Duration::from_secs(2));
    let message = Envelope::new(order("o-8")).to_message("anywhere").unwrap();
    match publisher.publish(&message).await {
        Err(e @ PublishError::Unavailable(_)) => {
            assert_eq!(e.classify(), ErrorClass::Retryable)
        }
        other => panic!("no broker is Unavailable, not {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_finishes_the_delivery_being_worked_and_gives_back_the_prefetched() {
    let Some(url) = amqp_url() else { return };
    let _shared = broker_lock().read().await;
    let mut broker = Broker::open(&url).await;
    let queue = broker.queue("shutdown", QueueType::Classic).await;
    let dead = broker.queue("shutdown.dead", QueueType::Classic).await;

    // Over connections the test opened: the consumer's and the publisher's channels are on them.
    let publisher = AmqpPublisher::new(
        Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap(),
    );
    let messages: Vec<_> = (0..3)
        .map(|n| Envelope::new(order(&format!("s-{n}"))))
        .collect();
    for message in &messages {
        publisher.publish_envelope(&queue, message).await.unwrap();
    }

    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let inbox = Arc::new(Inbox::new("shipping.on_paid").runtime(&rt));
    let (in_work, mut working) = mpsc::unbounded_channel::<()>();
    let release = Arc::new(tokio::sync::Notify::new());
    let worked = Arc::new(AtomicU32::new(0));
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let mut running = start(consumer(connection, &queue, &dead), inbox, {
        let (release, worked) = (release.clone(), worked.clone());
        move |_: Order| {
            let (release, worked, in_work) = (release.clone(), worked.clone(), in_work.clone());
            async move {
                let wait = release.notified();
                let _ = in_work.send(());
                wait.await;
                worked.fetch_add(1, Ordering::SeqCst);
                Ok::<_, WorkError>(())
            }
        }
    });
    tokio::time::timeout(WITHIN, working.recv())
        .await
        .expect("the first message is being worked");
    // Shut down mid-work: the delivery is finished and acked, the consumer ends.
    let stop = running.stop.take().unwrap();
    let _ = stop.send(());
    release.notify_one();
    let settled = running.next(1).await;
    assert_eq!(settled[0].settlement, Settlement::Acked);
    assert_eq!(
        settled[0].message_id.as_deref(),
        Some(messages[0].message_id().as_str())
    );
    running.stop().await;
    assert_eq!(
        worked.load(Ordering::SeqCst),
        1,
        "one worked, none started after"
    );
    broker.ready_eventually(&queue, 2).await;
    broker.delete_queues().await;
}

/// The Python peer: publishes `body` three times under `id`, then once under `other`.
const PIKA: &str = r#"
import sys, pika
url, queue, body, id, other = sys.argv[1:6]
connection = pika.BlockingConnection(pika.URLParameters(url))
channel = connection.channel()
channel.confirm_delivery()
for message_id in [id, id, id, other]:
    channel.basic_publish(exchange="", routing_key=queue, body=body.encode(),
        properties=pika.BasicProperties(message_id=message_id, delivery_mode=2,
                                        content_type="application/json"),
        mandatory=True)
connection.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_producers_copies_are_worked_once() {
    let Some(url) = amqp_url() else { return };
    let has_pika = std::process::Command::new("python3")
        .args(["-c", "import pika"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !has_pika {
        samekey::conformance::skipped("pika for the foreign-producer test (pip install pika)");
        return;
    }
    let _shared = broker_lock().read().await;
    let mut broker = Broker::open(&url).await;
    let queue = broker.queue("pika", QueueType::Classic).await;
    let dead = broker.queue("pika.dead", QueueType::Classic).await;

    let id = unique("pika-id");
    let other = unique("pika-other");
    let body = r#"{"id":"p-1"}"#;
    let published = tokio::task::spawn_blocking({
        let (url, queue, id, other) = (url.clone(), queue.clone(), id.clone(), other.clone());
        move || {
            std::process::Command::new("python3")
                .args(["-c", PIKA, &url, &queue, body, &id, &other])
                .output()
        }
    })
    .await
    .unwrap()
    .expect("python3 runs");
    assert!(
        published.status.success(),
        "pika published: {}",
        String::from_utf8_lossy(&published.stderr)
    );

    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let inbox = Arc::new(Inbox::new("shipping.on_paid").runtime(&rt));
    let worked: Arc<Mutex<Vec<Order>>> = Arc::default();
    let mut running = start(consumer(&url, &queue, &dead), inbox, {
        let worked = worked.clone();
        move |order: Order| {
            worked.lock().unwrap().push(order);
            async { Ok::<_, WorkError>(()) }
        }
    });
    let settled = running.next(4).await;
    running.stop().await;
    assert!(
        settled.iter().all(|s| s.settlement == Settlement::Acked),
        "{settled:#?}"
    );
    let ids: Vec<_> = settled
        .iter()
        .filter_map(|s| s.message_id.clone())
        .collect();
    assert_eq!(ids, [id.clone(), id.clone(), id, other]);
    assert_eq!(
        *worked.lock().unwrap(),
        [order("p-1"), order("p-1")],
        "once per message id: the copies dropped, the other id worked"
    );
    assert_eq!(broker.ready(&queue).await, 0, "all four acked");
    broker.delete_queues().await;
}

/// Publishes `message` until the broker confirms it, always under its id (a broker restarting).
async fn publish_until_confirmed(publisher: &AmqpPublisher, queue: &str, message: &Envelope<u32>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match publisher.publish_envelope(queue, message).await {
            Ok(_) => return,
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("message {} never confirmed: {e}", message.payload),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_mid_stream_loses_nothing_and_works_nothing_twice() {
    let Some(url) = amqp_url() else { return };
    if std::env::var_os("SAMEKEY_SERVICES_DIR").is_none() {
        samekey::conformance::skipped(
            "set SAMEKEY_SERVICES_DIR for the RabbitMQ restart test (eval \"$(scripts/services start)\")",
        );
        return;
    }
    let _alone = broker_lock().write().await;
    let mut broker = Broker::open(&url).await;
    let queue = broker.queue("restart", QueueType::Classic).await;
    let dead = broker.queue("restart.dead", QueueType::Classic).await;

    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let inbox = Arc::new(Inbox::new("shipping.on_paid").runtime(&rt));
    let worked: Arc<Mutex<HashMap<u32, u32>>> = Arc::default();
    let (in_work, mut working) = mpsc::unbounded_channel::<()>();
    let restarted = Arc::new(tokio::sync::Notify::new());
    let handler = {
        let (worked, restarted) = (worked.clone(), restarted.clone());
        move |n: u32| {
            let (worked, restarted, in_work) = (worked.clone(), restarted.clone(), in_work.clone());
            async move {
                *worked.lock().unwrap().entry(n).or_default() += 1;
                if n == 5 {
                    // Message 5 is worked while the broker restarts: its ack has no channel left.
                    let wait = restarted.notified();
                    let _ = in_work.send(());
                    wait.await;
                }
                Ok::<_, WorkError>(())
            }
        }
    };
    let mut running = start(
        consumer(&url, &queue, &dead),
        inbox.clone(),
        handler.clone(),
    );

    let publisher = AmqpPublisher::new(url.as_str()).confirms(Confirms {
        timeout: Duration::from_secs(2),
        republishes: 1,
        backoff: Duration::from_millis(50),
    });
    let messages: Vec<_> = (0..20u32).map(Envelope::new).collect();
    for message in &messages[..10] {
        publish_until_confirmed(&publisher, &queue, message).await;
    }
    tokio::time::timeout(WITHIN, working.recv())
        .await
        .expect("message 5 is being worked");

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services");
    let restart = tokio::task::spawn_blocking(move || {
        std::process::Command::new("bash")
            .args([script, "restart-rabbitmq"])
            .output()
    })
    .await
    .unwrap()
    .expect("scripts/services runs");
    assert!(
        restart.status.success(),
        "the broker restarted: {}",
        String::from_utf8_lossy(&restart.stderr)
    );
    restarted.notify_one();

    // The publisher connects again; the consumer too, and goes on.
    for message in &messages[10..] {
        publish_until_confirmed(&publisher, &queue, message).await;
    }
    let deadline = tokio::time::Instant::now() + WITHIN;
    let mut settled = Vec::new();
    while worked.lock().unwrap().len() < messages.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {:?} worked within {WITHIN:?}",
            worked.lock().unwrap()
        );
        if let Ok(Some(s)) =
            tokio::time::timeout(Duration::from_millis(500), running.settled.recv()).await
        {
            settled.push(s);
        }
    }
    running.stop().await;
    let five = messages[5].message_id();
    let of_five: Vec<_> = settled
        .iter()
        .filter(|s| s.message_id.as_deref() == Some(five.as_str()))
        .map(|s| (s.redelivered, s.settlement.clone()))
        .collect();
    assert!(
        matches!(of_five.first(), Some((false, Settlement::Lost { .. }))),
        "message 5's ack was lost in the restart: {of_five:?}"
    );
    assert_eq!(
        of_five.get(1),
        Some(&(true, Settlement::Acked)),
        "message 5's redelivery was answered from its receipt"
    );

    // What is left are copies (the ack lost in the restart, a publish whose confirm the restart
    // lost): a consumer answers each from its receipt.
    let broker = Broker {
        queues: broker.queues,
        ..Broker::open(&url).await
    };
    let left = broker.ready(&queue).await as usize;
    if left > 0 {
        let mut again = start(consumer(&url, &queue, &dead), inbox, handler);
        let settled = again.next(left).await;
        again.stop().await;
        assert!(
            settled.iter().all(|s| s.settlement == Settlement::Acked),
            "{settled:#?}"
        );
    }
    assert_eq!(broker.ready(&queue).await, 0, "nothing left");
    let worked = worked.lock().unwrap().clone();
    assert_eq!(worked.len(), 20, "nothing lost: {worked:?}");
    assert!(
        worked.values().all(|&n| n == 1),
        "nothing worked twice: {worked:?}"
    );
    broker.delete_queues().await;
}
