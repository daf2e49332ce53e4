//! Every attempt, lookup, replay and state change is a `tracing` event with `call_id`, `key` and
//! `attempt` fields.
//!
//! A test binary of its own: its subscriber is set for its thread only (`with_default`), and while no
//! other subscriber is installed `tracing` caches each callsite's interest as the first thread to reach
//! it found it, so a test on another thread reaching `claimed` or `replay` first would turn that event
//! off here. (The other observability tests are in `observe`.)

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use samekey::{idempotent, Runtime};
use support::{Fault, Remote, TestError};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct Service {
    rt: Runtime,
    remote: Remote,
}

impl Service {
    #[idempotent(key = "order", runtime = &self.rt, timeout = "1s", lookup = |c| self.remote.status(c))]
    async fn charge(&self, order: &str) -> Result<u64, TestError> {
        self.remote.call(order, || 500).await
    }
}

#[test]
fn events_carry_call_id_key_and_attempt() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer({
            let captured = captured.clone();
            move || captured.clone()
        })
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let service = Service {
        rt: Runtime::new(),
        remote: Remote::default(),
    };
    service.remote.script([Fault::LoseReply]);
    tracing::subscriber::with_default(subscriber, || {
        runtime.block_on(async {
            assert_eq!(service.charge("o-1").await, Ok(500));
            assert_eq!(service.charge("o-1").await, Ok(500));
        })
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    for message in [
        "claimed",
        "attempt",
        "asking the receipt",
        "lookup: succeeded",
        "recorded",
        "replay",
    ] {
        let line = lines
            .iter()
            .find(|l| l.contains(message))
            .unwrap_or_else(|| panic!("no `{message}` event in:\n{text}"));
        for field in ["call_id=", "key=", "attempt="] {
            assert!(
                line.contains(field),
                "`{message}` event lacks {field}: {line}"
            );
        }
    }
}
