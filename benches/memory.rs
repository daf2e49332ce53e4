//! Memory per retained key in the in-memory store, counted by a global allocator:
//!
//! ```text
//! cargo bench --bench memory
//! ```
//!
//! Makes 100,000 calls with distinct keys through `#[idempotent]` (each leaves a `SUCCESS` receipt that
//! the store keeps for its `ttl`) and reports the live heap bytes per key.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use samekey::{idempotent, Classify, ErrorClass, Runtime};
use serde::{Deserialize, Serialize};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Debug, Serialize, Deserialize)]
struct BenchError;

impl Classify for BenchError {
    fn classify(&self) -> ErrorClass {
        ErrorClass::Permanent
    }
}

impl From<samekey::Error> for BenchError {
    fn from(_: samekey::Error) -> BenchError {
        BenchError
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Charge {
    order_id: u64,
    amount: u64,
}

struct Service {
    samekey: Runtime,
}

impl Service {
    #[idempotent(key = "order_id", runtime = &self.samekey)]
    async fn charge(&self, order_id: u64, amount: u64) -> Result<Charge, BenchError> {
        Ok(Charge { order_id, amount })
    }
}

fn main() {
    const KEYS: u64 = 100_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    let service = Service {
        samekey: Runtime::new(),
    };
    rt.block_on(async {
        // Warm up: first allocations of the runtime, shards and tracing.
        let _ = service.charge(0, 1).await;
        let before = LIVE.load(Ordering::Relaxed);
        for id in 1..=KEYS {
            let _ = service.charge(id, 500).await;
        }
        let after = LIVE.load(Ordering::Relaxed);
        let per_key = (after - before) as f64 / KEYS as f64;
        println!("memory/retained_key: {per_key:.0} bytes per key ({KEYS} keys, SUCCESS receipts with a 31-byte result)");
    });
}
