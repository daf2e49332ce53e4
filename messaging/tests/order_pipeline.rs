//! The `order_pipeline` example's scenario, checked: orders staged in the outbox with their receipts, a
//! relay killed between publish and mark, confirmations lost, consumers SIGKILLed mid-work, the broker
//! restarted — every order shipped exactly once, over RabbitMQ and over NATS JetStream.
//!
//! The children (consumers, relays) are this test binary again, started with `--exact
//! pipeline_child` and their role in the environment: `pipeline_child` does nothing in a normal run.

#[path = "../examples/pipeline/mod.rs"]
mod pipeline;

use std::process::Command;

/// The entry point of the scenario's child processes (a no-op unless the parent started it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipeline_child() {
    if let Some(role) = pipeline::Role::from_env() {
        if let Err(e) = pipeline::child(role).await {
            eprintln!("pipeline child: {e}");
            std::process::exit(1);
        }
    }
}

fn this_test(name: &'static str) -> impl Fn() -> Command {
    move || {
        let mut command = Command::new(std::env::current_exe().expect("the test binary"));
        command.args(["--exact", name, "--nocapture", "--test-threads", "1"]);
        command
    }
}

async fn scenario(broker_flag: &[&str]) {
    let settings = pipeline::Settings::from_args(
        broker_flag
            .iter()
            .map(|s| s.to_string())
            .chain(["--orders".to_owned(), "40".to_owned()]),
    )
    .expect("settings");
    let Some(servers) = pipeline::Servers::from_env(settings.broker) else {
        samekey::conformance::skipped(pipeline::Servers::MISSING.trim_start_matches("skipped: "));
        return;
    };
    let table = pipeline::run(&settings, &servers, this_test("pipeline_child"))
        .await
        .expect("the scenario runs");
    println!("{table}");
    if let Err(e) = table.check() {
        panic!("{e}:\n{table}");
    }
    assert_eq!(table.orders, 40, "{table}");
    assert!(
        table.consumers_killed > 0 && table.relays_killed > 0,
        "{table}"
    );
    assert!(
        table.published > table.orders,
        "the relay's crashes and the lost confirmations published some messages again: {table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_ships_once_over_rabbitmq() {
    scenario(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_order_ships_once_over_nats() {
    scenario(&["--nats"]).await;
}
