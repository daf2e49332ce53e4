//! The store conformance suite on the in-memory store.
//!
//! (Was `tests/memory_conformance.rs`.)

samekey_runtime::store_conformance_tests!(std::sync::Arc::new(samekey_runtime::MemoryStore::new()));
