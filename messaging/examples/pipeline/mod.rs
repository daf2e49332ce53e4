//! The order pipeline's scenario, shared by the example and its test: the parent (the order service and
//! the fault injector) and its children (shipping consumers, the relay), each a process of its own
//! started from the same executable with `SAMEKEY_PIPELINE_ROLE` set.

mod broker;

use std::fmt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use samekey::sqlx::{self, PgPool};
use samekey::store::PgStore;
use samekey::{idempotent, Classify, ErrorClass, Runtime};
use samekey_messaging::outbox::PgOutbox;
use samekey_messaging::Envelope;
use serde::{Deserialize, Serialize};

pub use broker::Broker;

/// The variable that makes a process a child of the pipeline, and which one.
const ROLE_VAR: &str = "SAMEKEY_PIPELINE_ROLE";
/// The run the child belongs to (its tables' rows, its queue).
const RUN_VAR: &str = "SAMEKEY_PIPELINE_RUN";
/// The broker the run uses: `rabbitmq` or `nats`.
const BROKER_VAR: &str = "SAMEKEY_PIPELINE_BROKER";
/// For a relay: abort the process right after its n-th publish, before marking it sent.
const CRASH_VAR: &str = "SAMEKEY_PIPELINE_CRASH_AFTER_PUBLISH";
/// For a relay: lose the confirmation of every n-th publish (the broker has the message).
const LOSE_VAR: &str = "SAMEKEY_PIPELINE_LOSE_CONFIRM_EVERY";

/// A child process's part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A shipping consumer: the inbox over the broker's queue.
    Consumer,
    /// The outbox's relay: staged messages to the broker.
    Relay,
}

impl Role {
    /// The role this process was started for, if it is a child.
    pub fn from_env() -> Option<Role> {
        match std::env::var(ROLE_VAR).ok()?.as_str() {
            "consumer" => Some(Role::Consumer),
            "relay" => Some(Role::Relay),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Role::Consumer => "consumer",
            Role::Relay => "relay",
        }
    }
}

/// The scenario's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Orders placed.
    pub orders: u64,
    /// The broker: RabbitMQ, or NATS JetStream with `--nats`.
    pub broker: Broker,
    /// Consumers SIGKILLed during the run (each started again).
    pub consumer_kills: u32,
    /// Relays killed between a publish and its mark (each started again).
    pub relay_kills: u32,
    /// Every n-th publish loses its confirmation.
    pub lose_confirm_every: u64,
    /// Restart the broker once mid-run (only where `scripts/services` runs it).
    pub restart_broker: bool,
}

impl Settings {
    /// From the command line: `--nats`, `--orders N`.
    pub fn from_args(args: impl Iterator<Item = String>) -> Result<Settings, String> {
        let mut settings = Settings {
            orders: 60,
            broker: Broker::RabbitMq,
            consumer_kills: 3,
            relay_kills: 2,
            lose_confirm_every: 7,
            restart_broker: true,
        };
        let mut args = args.peekable();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--nats" => settings.broker = Broker::Nats,
                "--orders" => {
                    settings.orders = args
                        .next()
                        .and_then(|n| n.parse().ok())
                        .ok_or("--orders takes a number")?
                }
                other => return Err(format!("unknown argument `{other}` (--nats, --orders N)")),
            }
        }
        Ok(settings)
    }
}

/// Where the servers are.
#[derive(Debug, Clone)]
pub struct Servers {
    pg_url: String,
    broker_url: String,
    /// `scripts/services` runs the broker: it may be restarted.
    services: bool,
}

impl Servers {
    /// What to do when the variables are not set.
    pub const MISSING: &'static str = "skipped: set SAMEKEY_PG_URL and SAMEKEY_AMQP_URL (or \
         SAMEKEY_NATS_URL with --nats): eval \"$(scripts/services start)\"";

    /// From `SAMEKEY_PG_URL` and the broker's URL variable.
    pub fn from_env(broker: Broker) -> Option<Servers> {
        Some(Servers {
            pg_url: std::env::var("SAMEKEY_PG_URL").ok()?,
            broker_url: std::env::var(broker.url_var()).ok()?,
            services: std::env::var_os("SAMEKEY_SERVICES_DIR").is_some(),
        })
    }
}

#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum PipelineError {
    #[error("database: {0}")]
    Database(String),
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for PipelineError {
    fn classify(&self) -> ErrorClass {
        match self {
            // The transaction may or may not have committed.
            PipelineError::Database(_) => ErrorClass::Unknown,
            PipelineError::Samekey(e) => e.classify(),
        }
    }
}

fn db(e: impl fmt::Display) -> PipelineError {
    PipelineError::Database(e.to_string())
}

/// The message the order service stages, and the shipping consumer works.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Charged {
    pub run: i64,
    pub order_id: i64,
    pub amount_cents: i64,
}

/// The order service: the charge, its "charged" message and its receipt in one transaction.
struct Orders {
    rt: Runtime,
    pool: PgPool,
    outbox: PgOutbox,
    destination: String,
}

impl Orders {
    #[idempotent(key = "run + order_id", scope = "example.pipeline.charge", runtime = &self.rt,
                 on_unknown = "rerun", retries = 5, backoff = "50ms..1s")]
    async fn charge(&self, run: i64, order_id: i64) -> Result<i64, PipelineError> {
        let amount_cents = 1_000 + order_id * 25;
        let mut tx = self.pool.begin().await.map_err(db)?;
        sqlx::query(
            "INSERT INTO pipeline_orders (run, order_id, amount_cents) VALUES ($1, $2, $3)",
        )
        .bind(run)
        .bind(order_id)
        .bind(amount_cents)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        let charged = Envelope::new(Charged {
            run,
            order_id,
            amount_cents,
        });
        self.outbox
            .stage_envelope(
                &mut tx,
                &self.destination,
                &format!("{run}/{order_id}"),
                &charged,
            )
            .await
            .map_err(db)?;
        PgStore::complete_in(&mut tx, &samekey::current(), &amount_cents)
            .await
            .map_err(|e| PipelineError::Samekey(samekey::Error::Store(e)))?;
        tx.commit().await.map_err(db)?;
        Ok(amount_cents)
    }
}

/// The tables of the example (rows of every run, told apart by `run`), made under a lock: two runs
/// starting at once (the test runs both brokers' scenarios side by side) would race in PostgreSQL's
/// `CREATE TABLE IF NOT EXISTS`.
async fn create_tables(pool: &PgPool) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('samekey.example.pipeline'))")
        .execute(&mut *tx)
        .await?;
    for ddl in [
        "CREATE TABLE IF NOT EXISTS pipeline_orders (run BIGINT, order_id BIGINT, amount_cents BIGINT)",
        // No unique index on purpose: the inbox alone keeps an order from shipping twice.
        "CREATE TABLE IF NOT EXISTS pipeline_shipments (run BIGINT, order_id BIGINT, consumer TEXT, call_id TEXT)",
        "CREATE TABLE IF NOT EXISTS pipeline_deliveries (run BIGINT, message_id TEXT, redelivered BOOLEAN, disposition TEXT)",
        "CREATE TABLE IF NOT EXISTS pipeline_publishes (run BIGINT, message_id TEXT, confirmed BOOLEAN)",
    ] {
        sqlx::query(ddl).execute(&mut *tx).await?;
    }
    tx.commit().await
}

/// What the run did, and what it must show.
#[derive(Debug, Default)]
pub struct Table {
    pub broker: &'static str,
    pub orders: i64,
    pub published: i64,
    pub confirms_lost: i64,
    pub deliveries: i64,
    pub redeliveries: i64,
    pub shipments: i64,
    pub shipped_twice: i64,
    pub never_shipped: i64,
    pub consumers_killed: u32,
    pub relays_killed: u32,
    pub broker_restarts: u32,
    pub seconds: f64,
}

impl Table {
    /// `Err` unless every order shipped exactly once.
    pub fn check(&self) -> Result<(), String> {
        if self.shipped_twice != 0 || self.never_shipped != 0 || self.shipments != self.orders {
            return Err(format!(
                "{} orders shipped twice, {} never shipped",
                self.shipped_twice, self.never_shipped
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "order pipeline over {} ({:.1} s)",
            self.broker, self.seconds
        )?;
        writeln!(
            f,
            "faults: {} consumers SIGKILLed, {} relays killed between publish and mark, \
             {} confirmations lost, {} broker restarts",
            self.consumers_killed, self.relays_killed, self.confirms_lost, self.broker_restarts
        )?;
        writeln!(f, "| orders | published | deliveries | redeliveries | shipments | shipped twice | never shipped |")?;
        writeln!(f, "|---|---|---|---|---|---|---|")?;
        write!(
            f,
            "| {} | {} | {} | {} | {} | **{}** | **{}** |",
            self.orders,
            self.published,
            self.deliveries,
            self.redeliveries,
            self.shipments,
            self.shipped_twice,
            self.never_shipped
        )
    }
}

/// A child process and how to start another like it.
struct Worker {
    role: Role,
    child: Child,
}

fn spawn(
    command: &dyn Fn() -> Command,
    role: Role,
    run: i64,
    broker: Broker,
    extra: &[(&str, String)],
) -> std::io::Result<Worker> {
    let mut cmd = command();
    cmd.env(ROLE_VAR, role.name())
        .env(RUN_VAR, run.to_string())
        .env(BROKER_VAR, broker.name())
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    for (name, value) in extra {
        cmd.env(name, value);
    }
    Ok(Worker {
        role,
        child: cmd.spawn()?,
    })
}

/// Runs the scenario: `command` makes a `Command` that starts this same program (a child reads its
/// role from the environment).
pub async fn run(
    settings: &Settings,
    servers: &Servers,
    command: impl Fn() -> Command,
) -> Result<Table, Box<dyn std::error::Error>> {
    let started = Instant::now();
    let store = PgStore::connect(&servers.pg_url).await?;
    let pool = store.pool().clone();
    create_tables(&pool).await?;
    let outbox = PgOutbox::from_pool(pool.clone());
    outbox.migrate().await?;
    let run = i64::try_from(samekey::TraceId::new().as_u128() >> 80)?;
    let destination = settings.broker.declare(&servers.broker_url, run).await?;
    let orders = Arc::new(Orders {
        rt: Runtime::builder()
            .node("orders-1")
            .store(store.clone())
            .build()?,
        pool: pool.clone(),
        outbox,
        destination,
    });

    let mut table = Table {
        broker: settings.broker.display(),
        ..Table::default()
    };
    let mut consumers = Vec::new();
    for _ in 0..2 {
        consumers.push(spawn(&command, Role::Consumer, run, settings.broker, &[])?);
    }
    let relay_env = |crash: Option<u64>| {
        let mut env = vec![(LOSE_VAR, settings.lose_confirm_every.to_string())];
        if let Some(n) = crash {
            env.push((CRASH_VAR, n.to_string()));
        }
        env
    };
    // The first relays crash after a few publishes each; the last one runs to the end.
    let mut relay_crashes = settings.relay_kills;
    let mut relay = spawn(
        &command,
        Role::Relay,
        run,
        settings.broker,
        &relay_env((relay_crashes > 0).then_some(5)),
    )?;

    // The orders, placed while the faults happen.
    let placing = {
        let orders = orders.clone();
        let count = settings.orders;
        tokio::spawn(async move {
            for order_id in 1..=count {
                let id = i64::try_from(order_id).unwrap_or(i64::MAX);
                if let Err(e) = orders.charge(run, id).await {
                    eprintln!("order {id}: {e}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    let deadline = started + Duration::from_secs(120);
    let mut next_kill = Instant::now() + Duration::from_millis(700);
    let mut restarted = false;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        // The relay ended: it was killed between a publish and its mark. Another takes over.
        if let Ok(Some(_)) = relay.child.try_wait() {
            table.relays_killed += 1;
            relay_crashes = relay_crashes.saturating_sub(1);
            relay = spawn(
                &command,
                Role::Relay,
                run,
                settings.broker,
                &relay_env((relay_crashes > 0).then_some(7)),
            )?;
        }
        if table.consumers_killed < settings.consumer_kills && Instant::now() >= next_kill {
            let victim = table.consumers_killed as usize % consumers.len();
            consumers[victim].child.kill()?; // SIGKILL: no ack, no cleanup
            consumers[victim].child.wait()?;
            table.consumers_killed += 1;
            consumers[victim] = spawn(&command, Role::Consumer, run, settings.broker, &[])?;
            next_kill = Instant::now() + Duration::from_millis(900);
        }
        if settings.restart_broker && servers.services && !restarted && table.consumers_killed >= 2
        {
            restarted = true;
            settings.broker.restart()?;
            table.broker_restarts += 1;
        }
        let shipped: i64 = sqlx::query_scalar(
            "SELECT COUNT(DISTINCT order_id) FROM pipeline_shipments WHERE run = $1",
        )
        .bind(run)
        .fetch_one(&pool)
        .await?;
        let all_placed = placing.is_finished();
        if all_placed && shipped >= i64::try_from(settings.orders)? {
            break;
        }
        if Instant::now() > deadline {
            eprintln!("the run's deadline passed with {shipped} orders shipped");
            break;
        }
    }
    // Let late redeliveries (a killed consumer's last message) come and be answered.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for mut worker in consumers.into_iter().chain(std::iter::once(relay)) {
        let _ = worker.child.kill();
        let _ = worker.child.wait();
        let _ = worker.role;
    }

    let one = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(run)
                .fetch_one(&pool)
                .await
        }
    };
    table.orders = one("SELECT COUNT(*) FROM pipeline_orders WHERE run = $1").await?;
    table.published = one("SELECT COUNT(*) FROM pipeline_publishes WHERE run = $1").await?;
    table.confirms_lost =
        one("SELECT COUNT(*) FROM pipeline_publishes WHERE run = $1 AND NOT confirmed").await?;
    table.deliveries = one("SELECT COUNT(*) FROM pipeline_deliveries WHERE run = $1").await?;
    table.redeliveries =
        one("SELECT COUNT(*) FROM pipeline_deliveries WHERE run = $1 AND redelivered").await?;
    table.shipments = one("SELECT COUNT(*) FROM pipeline_shipments WHERE run = $1").await?;
    table.shipped_twice = one(
        "SELECT COUNT(*) FROM (SELECT order_id FROM pipeline_shipments WHERE run = $1 \
         GROUP BY order_id HAVING COUNT(*) > 1) t",
    )
    .await?;
    table.never_shipped = one(
        "SELECT COUNT(*) FROM pipeline_orders o WHERE run = $1 AND NOT EXISTS \
         (SELECT 1 FROM pipeline_shipments s WHERE s.run = o.run AND s.order_id = o.order_id)",
    )
    .await?;
    table.seconds = started.elapsed().as_secs_f64();
    Ok(table)
}

/// A child's main.
pub async fn child(role: Role) -> Result<(), Box<dyn std::error::Error>> {
    let run: i64 = std::env::var(RUN_VAR)?.parse()?;
    let broker = Broker::from_name(&std::env::var(BROKER_VAR)?)?;
    let servers = Servers::from_env(broker).ok_or(Servers::MISSING)?;
    let store = PgStore::connect(&servers.pg_url).await?;
    match role {
        Role::Consumer => {
            let node = format!("shipping-{}", std::process::id());
            // A short lease: a killed consumer's claim is taken over within a second.
            let rt = Runtime::builder()
                .node(node.clone())
                .store(store.clone())
                .lease(Duration::from_secs(1))
                .build()?;
            broker::consume(&servers.broker_url, run, &rt, store.pool().clone(), node).await
        }
        Role::Relay => {
            let crash_after = std::env::var(CRASH_VAR).ok().and_then(|n| n.parse().ok());
            let lose_every = std::env::var(LOSE_VAR)
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            broker::relay(
                &servers.broker_url,
                run,
                store.pool().clone(),
                crash_after,
                lose_every,
            )
            .await
        }
    }
}

/// The shipping consumer's handler: the shipment row and the inbox's receipt commit together, so a
/// consumer killed before `COMMIT` leaves neither, and the message's take-over ships it.
async fn ship(pool: &PgPool, consumer: &str, charged: Charged) -> Result<i64, PipelineError> {
    let mut tx = pool.begin().await.map_err(db)?;
    sqlx::query(
        "INSERT INTO pipeline_shipments (run, order_id, consumer, call_id) VALUES ($1, $2, $3, $4)",
    )
    .bind(charged.run)
    .bind(charged.order_id)
    .bind(consumer)
    .bind(samekey::current().call_id().to_string())
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    // Some parcels take a while to label: a kill lands mid-work.
    if charged.order_id.rem_euclid(4) == 0 {
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    PgStore::complete_in(&mut tx, &samekey::current(), &charged.order_id)
        .await
        .map_err(|e| PipelineError::Samekey(samekey::Error::Store(e)))?;
    tx.commit().await.map_err(db)?;
    Ok(charged.order_id)
}
