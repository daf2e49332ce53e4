//! A NATS server restart (`scripts/services restart-nats`) while a consumer works a message and a
//! producer publishes: nothing lost, nothing worked twice. A test binary of its own, so that the
//! restart never lands in another test's middle (cargo runs test binaries one after another). Needs
//! `SAMEKEY_NATS_URL` and `SAMEKEY_SERVICES_DIR` (the servers are the test's to restart), else a
//! `skipped:` line.
#![cfg(feature = "nats")]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use samekey::{Classify, ErrorClass, Runtime, TraceId};
use samekey_messaging::nats::async_nats::{self, jetstream};
use samekey_messaging::nats::{create_stream, JetStreamConsumer, JetStreamPublisher};
use samekey_messaging::{Confirms, Envelope, Inbox};
use tokio::sync::{mpsc, oneshot, watch};

#[derive(Debug, thiserror::Error)]
enum ShipError {
    #[error(transparent)]
    Samekey(#[from] samekey::Error),
}

impl Classify for ShipError {
    fn classify(&self) -> ErrorClass {
        match self {
            ShipError::Samekey(e) => e.classify(),
        }
    }
}

/// Runs `scripts/services restart-nats` (a stop and a start on the same port and store).
fn restart_nats() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/services");
    let out = std::process::Command::new("bash")
        .args([script, "restart-nats"])
        .output()
        .expect("scripts/services runs");
    assert!(
        out.status.success(),
        "restart-nats failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_loses_nothing_and_works_nothing_twice() {
    let Ok(url) = std::env::var("SAMEKEY_NATS_URL") else {
        samekey::conformance::skipped(
            "set SAMEKEY_NATS_URL (eval \"$(scripts/services start)\") for the NATS restart test",
        );
        return;
    };
    if std::env::var_os("SAMEKEY_SERVICES_DIR").is_none() {
        samekey::conformance::skipped(
            "set SAMEKEY_SERVICES_DIR (eval \"$(scripts/services start)\") for the NATS restart test",
        );
        return;
    }
    let x = format!("{:016x}", TraceId::new().as_u128() as u64);
    let (stream, subject) = (format!("SKR_{x}"), format!("skr.{x}.orders"));
    let client = async_nats::connect(url.as_str()).await.unwrap();
    let js = jetstream::new(client);
    create_stream(&js, &stream, &[&subject], Duration::from_secs(120))
        .await
        .unwrap();
    // Retries that outlast a restart: not connected is `Unavailable`, and published again.
    let publisher = JetStreamPublisher::new(js.clone()).confirms(Confirms {
        timeout: Duration::from_secs(5),
        republishes: 12,
        backoff: Duration::from_millis(100),
    });

    let rt = Runtime::builder().node("shipping-1").build().unwrap();
    let mut consumer = JetStreamConsumer::builder(js.clone(), &stream, "shipping")
        .ack_wait(Duration::from_secs(2))
        .heartbeat(Duration::from_millis(500))
        .batch(1)
        .create(Inbox::new("shipping.on_paid").runtime(&rt))
        .await
        .unwrap();

    // The handler: counts its runs per order, says which order it started, and holds "o-4" until
    // the server has restarted (its ack goes to the restarted server).
    let runs: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
    let (started_tx, mut started) = mpsc::unbounded_channel::<String>();
    let (restarted_tx, restarted) = watch::channel(false);
    let ship = {
        let runs = runs.clone();
        move |order: String| {
            let runs = runs.clone();
            let started_tx = started_tx.clone();
            let mut restarted = restarted.clone();
            async move {
                *runs.lock().unwrap().entry(order.clone()).or_default() += 1;
                let _ = started_tx.send(order.clone());
                if order == "o-4" {
                    let _ = restarted.wait_for(|done| *done).await;
                }
                Ok::<_, ShipError>(format!("shipped {order}"))
            }
        }
    };
    let pull = consumer.consumer().clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let worker = tokio::spawn(async move {
        consumer
            .run(ship, async move {
                let _ = stopped.await;
            })
            .await
            .map(|()| consumer)
    });

    for n in 0..10 {
        publisher
            .publish_envelope(&subject, &Envelope::new(format!("o-{n}")))
            .await
            .unwrap();
    }
    // Until "o-4" is being worked.
    tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(order) = started.recv().await {
            if order == "o-4" {
                return;
            }
        }
        panic!("the handler's channel closed");
    })
    .await
    .expect("o-4 is worked within 20 s");

    tokio::task::spawn_blocking(restart_nats).await.unwrap();
    restarted_tx.send(true).unwrap();
    for n in 10..20 {
        publisher
            .publish_envelope(&subject, &Envelope::new(format!("o-{n}")))
            .await
            .unwrap_or_else(|e| panic!("o-{n} is published after the restart: {e}"));
    }

    // Every order worked, and none left unacknowledged (a lost ack comes again, and is answered
    // from the receipt).
    let expected: Vec<String> = (0..20).map(|n| format!("o-{n}")).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let worked: Vec<String> = runs.lock().unwrap().keys().cloned().collect();
        let all = {
            let mut expected = expected.clone();
            expected.sort();
            worked == expected
        };
        let info = pull.get_info().await;
        let settled =
            matches!(&info, Ok(info) if info.num_pending == 0 && info.num_ack_pending == 0);
        if all && settled {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "after 30 s: worked {worked:?}, consumer {:?}",
            info
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = stop.send(());
    let consumer = tokio::time::timeout(Duration::from_secs(10), worker)
        .await
        .expect("the consumer stops")
        .unwrap()
        .expect("the consumer ran to its shutdown");
    let twice: Vec<_> = runs
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, n)| **n != 1)
        .map(|(order, n)| (order.clone(), *n))
        .collect();
    assert!(twice.is_empty(), "worked more than once: {twice:?}");
    assert_eq!(runs.lock().unwrap().len(), 20, "nothing lost");
    drop(consumer);
    let _ = js.delete_stream(&stream).await;
}
