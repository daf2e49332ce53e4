//! Stores that wrap a store: [`StoreWrapper`], the forwarding base, and the [`Store`] of `Arc<S>` and
//! `Box<S>` built on it.
//!
//! What they guarantee is the [store module](super)'s *Stores that compose*.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::{Claim, Claimed, Completion, ReceiptPage, ReceiptQuery, Store, StoreClock};
use crate::call_id::CallId;
use crate::compensation::CompensationEntry;
use crate::error::StoreError;
use crate::journal::Event;
use crate::key::Key;
use crate::receipt::{Fence, Receipt, Transition};

/// The future of a store operation, as `#[async_trait]` makes it of an `async fn` of [`Store`]: boxed,
/// `Send`, borrowing for `'a`.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// The asynchronous methods of [`Store`], in its order, one line each — `name<lifetimes>(arguments)
/// -> output` — handed to `$then`, which writes them out: as the [`StoreWrapper`] defaults
/// (`forwarded_by_default`) and as the [`Store`] of every wrapper (`to_the_wrapper`). One table, so
/// that the two cannot differ.
macro_rules! store_operations {
    ($then:ident) => {
        $then! {
            // # Receipts
            claim(claim: Claim) -> Claimed;
            take_over<'k>(key: &'k Key, expected: Fence, lease_ms: u64, now_ms: u64) -> Claimed;
            reopen<'k>(key: &'k Key, expected: Fence, lease_ms: u64, now_ms: u64) -> Claimed;
            extend_lease<'k>(key: &'k Key, fence: Fence, lease_ms: u64, now_ms: u64) -> ();
            complete<'k>(key: &'k Key, fence: Fence, completion: Completion, now_ms: u64) -> Transition;
            mark_unknown<'k>(key: &'k Key, fence: Fence, now_ms: u64) -> Transition;
            release<'k>(key: &'k Key, fence: Fence) -> ();
            forget<'k>(key: &'k Key, fence: Fence) -> ();
            get<'k>(key: &'k Key, now_ms: u64) -> Option<Receipt>;
            get_by_call_id<'c>(call_id: &'c CallId) -> Option<Receipt>;
            get_by_call_ids<'c>(call_ids: &'c [CallId]) -> Vec<Receipt>;
            wait_settled<'k>(key: &'k Key, timeout: Duration, now_ms: u64) -> Option<Receipt>;
            // # The compensation queue
            enqueue_compensation(entry: CompensationEntry) -> ();
            take_due_compensations(now_ms: u64, limit: usize, lease_ms: u64) -> Vec<CompensationEntry>;
            reschedule_compensation<'c>(
                call_id: &'c CallId, fence: Fence, round: u32, delay_ms: u64, now_ms: u64
            ) -> ();
            finish_compensation<'c>(call_id: &'c CallId, fence: Option<Fence>) -> ();
            escalate_compensation<'c>(call_id: &'c CallId, fence: Fence, now_ms: u64) -> ();
            list_compensations() -> Vec<CompensationEntry>;
            // # The journal
            append_journal<'k, 'e>(key: &'k Key, events: &'e [Event], keep_ms: u64, now_ms: u64) -> ();
            journal<'k>(key: &'k Key, now_ms: u64) -> Vec<Event>;
            journal_of_call<'c>(call_id: &'c CallId, now_ms: u64) -> Vec<Event>;
            journaled_keys(after: Option<[u8; 32]>, limit: usize) -> Vec<Key>;
            // # Listings
            list_receipts<'q>(query: &'q ReceiptQuery, now_ms: u64) -> ReceiptPage;
            list_orphans(now_ms: u64, limit: usize) -> Vec<Receipt>;
            count_expired(now_ms: u64) -> usize;
            purge_expired(now_ms: u64) -> usize;
            // # The store itself
            now_ms(caller_now_ms: u64) -> u64;
        }
    };
}

/// Each operation as a [`StoreWrapper`] method that hands the wrapped store's future to
/// [`around`](StoreWrapper::around), in the signature `#[async_trait]` gives the [`Store`] method
/// (with `this: &Self` for `&self`), so that a wrapper writes it as an `async fn` and the default
/// boxes nothing.
macro_rules! forwarded_by_default {
    ($(
        $name:ident $(<$($lt:lifetime),+>)? ($($arg:ident: $ty:ty),* $(,)?) -> $out:ty;
    )*) => {$(
        #[doc = concat!("[`Store::", stringify!($name), "`], forwarded.")]
        fn $name<'s, $($($lt,)+)? 'f>(this: &'s Self, $($arg: $ty),*) -> StoreFuture<'f, $out>
        where
            's: 'f,
            $($($lt: 'f,)+)?
            Self: 'f,
        {
            this.around(stringify!($name), this.wrapped().$name($($arg),*))
        }
    )*};
}

/// Each operation as the [`Store`] method of a wrapper: the [`StoreWrapper`] method of the same name,
/// its future handed on as it is.
macro_rules! to_the_wrapper {
    ($(
        $name:ident $(<$($lt:lifetime),+>)? ($($arg:ident: $ty:ty),* $(,)?) -> $out:ty;
    )*) => {$(
        fn $name<'s, $($($lt,)+)? 'f>(&'s self, $($arg: $ty),*) -> StoreFuture<'f, $out>
        where
            's: 'f,
            $($($lt: 'f,)+)?
            Self: 'f,
        {
            StoreWrapper::$name(self, $($arg),*)
        }
    )*};
}

/// A store that wraps another and changes only some of its methods: a cache in front, metrics, fault
/// injection. Implement it instead of [`Store`] (every `StoreWrapper` is a [`Store`]) and write only
/// the methods that differ; every other one forwards to [`wrapped`](StoreWrapper::wrapped), as the
/// [store module](super#stores-that-compose) says.
///
/// Write the methods you change as the [`Store`] methods they are, `async fn` under
/// [`#[async_trait]`](super::async_trait), with one difference: they take `this: &Self` where
/// [`Store`]'s take `&self` (as `Arc::get_mut` takes `this`), so that they never stand beside the
/// [`Store`] methods of the same name in a method call — `store.claim(…)` is always [`Store`]'s,
/// on a wrapper, on the store it wraps, and in the wrapper's own code.
///
/// A wrapper counting the claims that reach its store, shared through an `Arc` with the code that
/// reads the count:
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
///
/// use samekey_runtime::at_most_once::AtMostOnce;
/// use samekey_runtime::store::{async_trait, Claim, Claimed, StoreWrapper};
/// use samekey_runtime::{Error, MemoryStore, Runtime, Store, store::StoreError};
///
/// struct Counted<S> {
///     store: S,
///     claims: AtomicU64,
/// }
///
/// #[async_trait]
/// impl<S: Store> StoreWrapper for Counted<S> {
///     type Inner = S;
///
///     fn wrapped(&self) -> &S {
///         &self.store
///     }
///
///     // The one method it changes: the other 27 forward to `store`.
///     async fn claim(this: &Self, claim: Claim) -> Result<Claimed, StoreError> {
///         this.claims.fetch_add(1, Ordering::Relaxed);
///         this.store.claim(claim).await
///     }
/// }
///
/// static CHARGE: AtMostOnce = AtMostOnce::new("orders.charge");
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = Arc::new(Counted {
///     store: MemoryStore::new(),
///     claims: AtomicU64::new(0),
/// });
/// let rt = Runtime::builder().store(Arc::clone(&store)).build()?;
/// for _ in 0..2 {
///     let charged = CHARGE.key(&"order-1").runtime(&rt).run(|| async { Ok::<_, Error>(500) });
///     assert_eq!(charged.await?, 500);
/// }
/// // The call and its replay: one claim each, counted by the store the runtime used.
/// assert_eq!(store.claims.load(Ordering::Relaxed), 2);
/// // What the wrapper does not change is the wrapped store's.
/// assert_eq!(rt.store().kind(), "memory");
/// # Ok(()) }
/// ```
///
/// A wrapper that acts on every operation alike (a timer, a fault injector) writes
/// [`around`](StoreWrapper::around) instead of each method.
pub trait StoreWrapper: Send + Sync + 'static {
    /// The wrapped store.
    type Inner: Store + ?Sized;

    /// The wrapped store, which every method the wrapper does not write forwards to.
    fn wrapped(&self) -> &Self::Inner;

    /// Runs around every operation this trait forwards: `op` is the name of the [`Store`] method
    /// (`"claim"`, `"get"`, …), `call` the wrapped store's future for it. The default runs `call` as
    /// it is. A method the wrapper writes itself does not pass through here unless it calls `around`.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    ///
    /// use samekey_runtime::store::{StoreFuture, StoreWrapper};
    /// use samekey_runtime::{MemoryStore, Store};
    ///
    /// /// Counts the operations that fail.
    /// struct Failures {
    ///     store: MemoryStore,
    ///     failed: AtomicU64,
    /// }
    ///
    /// impl StoreWrapper for Failures {
    ///     type Inner = MemoryStore;
    ///
    ///     fn wrapped(&self) -> &MemoryStore {
    ///         &self.store
    ///     }
    ///
    ///     fn around<'a, T: Send + 'a>(
    ///         &'a self,
    ///         op: &'static str,
    ///         call: StoreFuture<'a, T>,
    ///     ) -> StoreFuture<'a, T> {
    ///         Box::pin(async move {
    ///             let answer = call.await;
    ///             if answer.is_err() {
    ///                 self.failed.fetch_add(1, Ordering::Relaxed);
    ///                 eprintln!("{op} failed");
    ///             }
    ///             answer
    ///         })
    ///     }
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let store = Failures {
    ///     store: MemoryStore::new(),
    ///     failed: AtomicU64::new(0),
    /// };
    /// let key = samekey_runtime::Key::build("orders.charge", &"order-1");
    /// let nothing = store.take_over(&key, samekey_runtime::receipt::Fence(1), 1_000, 0).await;
    /// assert!(nothing.is_err(), "no record to take over");
    /// assert_eq!(store.failed.load(Ordering::Relaxed), 1);
    /// # }
    /// ```
    fn around<'a, T: Send + 'a>(
        &'a self,
        op: &'static str,
        call: StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        let _ = op;
        call
    }

    // Every operation of `Store`, in its order, forwarding through `around`: written out by
    // `forwarded_by_default` from the table in `store_operations`.
    store_operations!(forwarded_by_default);

    /// [`Store::kind`], forwarded: a wrapper reports the kind of the store it wraps.
    fn kind(this: &Self) -> &'static str {
        this.wrapped().kind()
    }

    /// [`Store::clock`], forwarded.
    fn clock(this: &Self) -> StoreClock {
        this.wrapped().clock()
    }
}

/// A shared store is the store it shares.
impl<S: Store + ?Sized> StoreWrapper for Arc<S> {
    type Inner = S;

    fn wrapped(&self) -> &S {
        self
    }
}

/// A boxed store (`Box<dyn Store>`: a backend picked at run time) is the store in the box.
impl<S: Store + ?Sized> StoreWrapper for Box<S> {
    type Inner = S;

    fn wrapped(&self) -> &S {
        self
    }
}

/// Every wrapper is a store: each method is the wrapper's (written or forwarded), its future handed on
/// as it is.
impl<W: StoreWrapper> Store for W {
    store_operations!(to_the_wrapper);

    fn kind(&self) -> &'static str {
        StoreWrapper::kind(self)
    }

    fn clock(&self) -> StoreClock {
        StoreWrapper::clock(self)
    }
}

#[cfg(test)]
mod tests {
    use std::any::Any;

    use super::*;
    use crate::at_most_once::AtMostOnce;
    use crate::receipt::ReceiptState;
    use crate::store::{LocalCache, MemoryStore};
    use crate::{Error, Runtime};

    static CHARGE: AtMostOnce = AtMostOnce::new("forward.charge");

    async fn charge(rt: &Runtime, order: u64) -> Result<u64, Error> {
        CHARGE
            .key(&order)
            .runtime(rt)
            .run(|| async move { Ok::<_, Error>(order * 100) })
            .await
    }

    /// The runtime and the code that inspects the store share one `Arc<MemoryStore>`: what the
    /// runtime wrote is what that code reads, and the runtime's store is the in-memory one itself.
    #[tokio::test]
    async fn a_runtime_shares_its_store_with_the_code_that_inspects_it() {
        let store = Arc::new(MemoryStore::new());
        let rt = Runtime::builder()
            .store(Arc::clone(&store))
            .build()
            .unwrap();
        assert_eq!(charge(&rt, 7).await, Ok(700));
        assert_eq!(charge(&rt, 7).await, Ok(700), "a replay");
        assert_eq!(store.len(), 1);
        let key = Key::build(CHARGE.scope(), &7u64);
        let record = store.get(&key, rt.now_ms()).await.unwrap();
        assert_eq!(record.map(|r| r.state), Some(ReceiptState::Success));
        let seen = rt.store() as &dyn Any;
        assert!(seen.downcast_ref::<MemoryStore>().is_some(), "not an Arc");
        assert!(rt.memory().is_some(), "the in-memory store's direct calls");
    }

    /// An `Arc<dyn Store>` handed over by value is that store, as through `shared_store`.
    #[tokio::test]
    async fn a_shared_dyn_store_is_taken_as_it_is() {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let rt = Runtime::builder()
            .store(Arc::clone(&store))
            .build()
            .unwrap();
        assert_eq!(charge(&rt, 8).await, Ok(800));
        assert!(std::ptr::addr_eq(rt.store(), &*store), "the same store");
        assert!(rt.memory().is_some());
    }

    /// A backend picked at run time, as a `Box<dyn Store>`: the runtime works through it, and its
    /// kind and clock are the boxed store's.
    #[tokio::test]
    async fn a_runtime_over_a_boxed_store() {
        for cached in [false, true] {
            let store: Box<dyn Store> = if cached {
                Box::new(LocalCache::new(MemoryStore::new(), 100))
            } else {
                Box::new(MemoryStore::new())
            };
            assert_eq!(store.kind(), "memory");
            assert_eq!(store.clock(), StoreClock::Caller);
            let rt = Runtime::builder().store(store).build().unwrap();
            assert_eq!(charge(&rt, 9).await, Ok(900));
            assert_eq!(charge(&rt, 9).await, Ok(900), "a replay");
            let key = Key::build(CHARGE.scope(), &9u64);
            let record = rt.store().get(&key, rt.now_ms()).await.unwrap();
            assert_eq!(record.map(|r| r.state), Some(ReceiptState::Success));
        }
    }
}
