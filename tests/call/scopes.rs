//! Different operations never share a key by default, and one operation keeps its key: a trait's
//! default method, a generic `impl` and same-named methods of two `impl` blocks are told apart (the
//! second operation under one default scope is refused before anything runs), `#[samekey::scoped]`
//! gives each `impl` block's methods a scope of their own, and the stored key is built from the scope
//! as written (no type names, which change with the compiler).

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};

use samekey::{idempotent, scoped, Error, Key, Runtime};
use support::TestError;

fn is_clash(out: &Result<String, TestError>) -> bool {
    matches!(out, Err(TestError::Samekey(Error::ScopeClash { .. })))
}

mod trait_default {
    use super::*;

    pub static RUNS: AtomicU32 = AtomicU32::new(0);

    pub trait Gateway {
        fn name(&self) -> &'static str;

        /// One annotated item, one operation per implementor.
        #[idempotent(key = "order")]
        async fn charge(&self, order: u64) -> Result<String, TestError> {
            RUNS.fetch_add(1, Ordering::SeqCst);
            Ok(format!("{}-{order}", self.name()))
        }
    }

    pub struct Stripe;
    pub struct Paypal;

    impl Gateway for Stripe {
        fn name(&self) -> &'static str {
            "stripe"
        }
    }

    impl Gateway for Paypal {
        fn name(&self) -> &'static str {
            "paypal"
        }
    }
}

// A trait's default method annotated once: Paypal's call must not get Stripe's receipt.
#[tokio::test]
async fn a_trait_default_method_is_one_operation_per_implementor() {
    use trait_default::{Gateway, Paypal, Stripe, RUNS};
    assert_eq!(Stripe.charge(9).await, Ok("stripe-9".into()));
    assert_eq!(Stripe.charge(9).await, Ok("stripe-9".into()), "replayed");
    let out = Paypal.charge(9).await;
    assert!(is_clash(&out), "{out:?}");
    let Err(TestError::Samekey(e)) = out else {
        unreachable!()
    };
    assert!(
        e.to_string().contains("trait_default::Stripe::charge")
            && e.to_string().contains("trait_default::Paypal::charge"),
        "{e}"
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 1, "Paypal's body never ran");
}

mod generic_impl {
    use super::*;
    use std::marker::PhantomData;

    pub trait Plan {
        const NAME: &'static str;
    }
    pub struct Basic;
    pub struct Premium;
    impl Plan for Basic {
        const NAME: &'static str = "basic";
    }
    impl Plan for Premium {
        const NAME: &'static str = "premium";
    }

    pub struct Subscriptions<P>(pub PhantomData<P>);

    impl<P: Plan> Subscriptions<P> {
        #[idempotent(key = "user")]
        pub async fn subscribe(&self, user: u64) -> Result<String, TestError> {
            Ok(format!("{}-{user}", P::NAME))
        }
    }
}

// A generic `impl`: `Subscriptions<Premium>` must not replay `Subscriptions<Basic>`.
#[tokio::test]
async fn a_generic_impl_is_one_operation_per_type() {
    use generic_impl::{Basic, Premium, Subscriptions};
    use std::marker::PhantomData;
    let basic = Subscriptions::<Basic>(PhantomData);
    let premium = Subscriptions::<Premium>(PhantomData);
    assert_eq!(basic.subscribe(1).await, Ok("basic-1".into()));
    assert!(is_clash(&premium.subscribe(1).await));
    assert_eq!(basic.subscribe(2).await, Ok("basic-2".into()));
}

mod two_impls {
    use super::*;

    pub struct Orders;
    pub struct Refunds;

    impl Orders {
        #[idempotent(key = "id")]
        pub async fn create(id: u64) -> Result<String, TestError> {
            Ok(format!("order-{id}"))
        }
    }

    impl Refunds {
        #[idempotent(key = "id")]
        pub async fn create(id: u64) -> Result<String, TestError> {
            Ok(format!("refund-{id}"))
        }
    }
}

// Same-named associated functions of two `impl` blocks in one module share the default scope: the
// second one is refused instead of replaying the first one's outcome.
#[tokio::test]
async fn same_named_methods_of_two_impls_are_refused() {
    use two_impls::{Orders, Refunds};
    assert_eq!(Orders::create(5).await, Ok("order-5".into()));
    let out = Refunds::create(5).await;
    assert!(is_clash(&out), "{out:?}");
    assert_eq!(Orders::create(6).await, Ok("order-6".into()));
}

mod scoped_impls {
    use super::*;

    pub struct Stripe {
        pub rt: Runtime,
    }
    pub struct Paypal {
        pub rt: Runtime,
    }

    #[scoped]
    impl Stripe {
        #[idempotent(key = "order", runtime = &self.rt)]
        pub async fn charge(&self, order: u64) -> Result<String, TestError> {
            Ok(format!("stripe-{order}"))
        }
    }

    #[scoped]
    impl Paypal {
        #[idempotent(key = "order", runtime = &self.rt)]
        pub async fn charge(&self, order: u64) -> Result<String, TestError> {
            Ok(format!("paypal-{order}"))
        }
    }
}

// `#[scoped]` names the self type in the default scope: two operations, two keys, on one store; and
// the stored key is the one built from that scope as written, whatever the compiler's type names.
#[tokio::test]
async fn scoped_impls_have_keys_of_their_own() {
    use scoped_impls::{Paypal, Stripe};
    let rt = Runtime::new();
    let stripe = Stripe { rt: rt.clone() };
    let paypal = Paypal { rt: rt.clone() };
    assert_eq!(stripe.charge(9).await, Ok("stripe-9".into()));
    assert_eq!(paypal.charge(9).await, Ok("paypal-9".into()));
    assert_eq!(paypal.charge(9).await, Ok("paypal-9".into()));
    for scope in [
        "call::scopes::scoped_impls::Stripe::charge",
        "call::scopes::scoped_impls::Paypal::charge",
    ] {
        let key = Key::build(scope, &9u64);
        let record = rt.store().get(&key, rt.now_ms()).await.unwrap();
        assert!(record.is_some(), "no record under {scope}");
    }
}

mod adapted {
    use super::*;

    pub static RUNS: AtomicU32 = AtomicU32::new(0);

    /// `S` only adapts an argument: `&str` and `String` are the same business value.
    #[idempotent(key = "name")]
    pub async fn register<S: AsRef<str> + Clone + samekey::KeyPart>(
        name: S,
        note: impl Into<String> + Clone,
    ) -> Result<String, TestError> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        let note: String = note.into();
        Ok(format!("{}:{note}", name.as_ref()))
    }
}

// Type parameters that only adapt an argument need no `scope`, and do not split the operation.
#[tokio::test]
async fn type_parameters_that_adapt_an_argument_are_one_operation() {
    use adapted::{register, RUNS};
    assert_eq!(register("ann", "first").await, Ok("ann:first".into()));
    assert_eq!(
        register(String::from("ann"), String::from("again")).await,
        Ok("ann:first".into()),
        "replayed"
    );
    assert_eq!(RUNS.load(Ordering::SeqCst), 1);
}
