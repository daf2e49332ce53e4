//! An order service whose `#[idempotent]` charge stages a "charged" message in the same PostgreSQL
//! transaction as its receipt (the transactional outbox); a relay publishes the staged messages to
//! RabbitMQ (with `--nats`, to NATS JetStream); a shipping consumer ships once per order — through the
//! faults a real deployment meets:
//!
//! * shipping consumers (processes of their own) SIGKILLed mid-work, and started again;
//! * the relay (a process of its own) killed between a publish and its mark, and started again;
//! * publishes whose confirmations are lost (the broker has the message, the relay does not know);
//! * the broker restarted mid-run (when `scripts/services` runs it: `SAMEKEY_SERVICES_DIR` set).
//!
//! It prints a table — orders, messages published, deliveries, redeliveries, shipments, orders
//! shipped twice (0), orders never shipped (0) — and exits with an error if either is not 0.
//!
//! ```text
//! eval "$(scripts/services start)"
//! cargo run -p samekey-messaging --example order_pipeline --features postgres,rabbitmq,nats
//! cargo run -p samekey-messaging --example order_pipeline --features postgres,rabbitmq,nats -- --nats
//! ```
//!
//! `messaging/tests/order_pipeline.rs` runs the same scenario.

mod pipeline;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A child process: a shipping consumer or a relay, told so by the parent.
    if let Some(role) = pipeline::Role::from_env() {
        return pipeline::child(role).await;
    }
    let settings = pipeline::Settings::from_args(std::env::args().skip(1))?;
    let Some(servers) = pipeline::Servers::from_env(settings.broker) else {
        println!("{}", pipeline::Servers::MISSING);
        return Ok(());
    };
    let exe = std::env::current_exe()?;
    let table = pipeline::run(&settings, &servers, || std::process::Command::new(&exe)).await?;
    println!("{table}");
    table.check()?;
    Ok(())
}
