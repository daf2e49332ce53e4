//! What a runtime keeps per dependency ([`Dependencies`]): a retry [budget](super#retry-budgets) and a
//! [concurrency limit](super#concurrency-limits), for the runtime's own calls and for each name a
//! function gives (`#[idempotent(budget = "payments")]`), and the lookup budget all calls share.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::budget::{Budget, RetryBudget, DEFAULT_LOOKUP_BUDGET};
use super::concurrency::{ConcurrencyLimit, Limiter};

/// The name of the runtime's own dependency, in metrics and errors.
pub(crate) const RUNTIME: &str = "runtime";

/// One dependency's brakes.
#[derive(Debug)]
pub(crate) struct Dependency {
    /// Its name (`runtime` for the runtime's own).
    pub(crate) name: String,
    pub(crate) retries: Budget,
    pub(crate) limiter: Limiter,
}

/// The policies a [`RuntimeBuilder`](crate::runtime::RuntimeBuilder) sets.
#[derive(Debug, Clone, Default)]
pub(crate) struct Policies {
    pub(crate) retries: RetryBudget,
    pub(crate) lookups: Option<RetryBudget>,
    pub(crate) concurrency: ConcurrencyLimit,
    pub(crate) named_retries: HashMap<String, RetryBudget>,
    pub(crate) named_concurrency: HashMap<String, ConcurrencyLimit>,
}

/// A runtime's dependencies, made on first use.
#[derive(Debug)]
pub(crate) struct Dependencies {
    runtime: Arc<Dependency>,
    lookups: Budget,
    policies: Policies,
    named: RwLock<HashMap<String, Arc<Dependency>>>,
}

impl Dependencies {
    pub(crate) fn new(policies: Policies) -> Dependencies {
        Dependencies {
            runtime: Arc::new(Dependency {
                name: RUNTIME.to_owned(),
                retries: Budget::new(policies.retries),
                limiter: Limiter::new(policies.concurrency),
            }),
            lookups: Budget::new(policies.lookups.unwrap_or(DEFAULT_LOOKUP_BUDGET)),
            policies,
            named: RwLock::default(),
        }
    }

    /// Whether the dependency `name` (or the runtime's own) has a concurrency limit in force; one not
    /// used yet has none.
    pub(crate) fn limited(&self, name: Option<&str>) -> bool {
        match name {
            None => self.runtime.limiter.limit().is_some(),
            Some(name) => self
                .named
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(name)
                .is_some_and(|d| d.limiter.limit().is_some()),
        }
    }

    /// The dependency `name` (made on first use, with its own policies or the runtime's), or the
    /// runtime's own.
    pub(crate) fn get(&self, name: Option<&str>) -> Arc<Dependency> {
        let Some(name) = name else {
            return self.runtime.clone();
        };
        if let Some(dependency) = self
            .named
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return dependency.clone();
        }
        let mut named = self.named.write().unwrap_or_else(|p| p.into_inner());
        named
            .entry(name.to_owned())
            .or_insert_with(|| {
                let p = &self.policies;
                Arc::new(Dependency {
                    name: name.to_owned(),
                    retries: Budget::new(p.named_retries.get(name).copied().unwrap_or(p.retries)),
                    limiter: Limiter::new(
                        p.named_concurrency
                            .get(name)
                            .copied()
                            .unwrap_or(p.concurrency),
                    ),
                })
            })
            .clone()
    }

    /// The lookup budget.
    pub(crate) fn lookups(&self) -> &Budget {
        &self.lookups
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_named_dependency_has_a_window_of_its_own() {
        let mut policies = Policies::default();
        policies.named_retries.insert(
            "search".to_owned(),
            RetryBudget::new(Duration::from_secs(10), 0, 0.0),
        );
        let dependencies = Dependencies::new(policies);
        assert!(
            !dependencies.get(Some("search")).retries.withdraw(0),
            "no floor, no calls"
        );
        let payments = dependencies.get(Some("payments"));
        assert_eq!(
            (0..1_000).filter(|_| payments.retries.withdraw(0)).count(),
            100
        );
        assert!(
            dependencies.get(None).retries.withdraw(0),
            "the runtime's own is untouched"
        );
        assert!(Arc::ptr_eq(&payments, &dependencies.get(Some("payments"))));
    }

    #[tokio::test]
    async fn a_named_dependency_has_a_limit_of_its_own() {
        let mut policies = Policies::default();
        policies
            .named_concurrency
            .insert("search".to_owned(), ConcurrencyLimit::off());
        let dependencies = Dependencies::new(policies);
        let payments = dependencies.get(Some("payments"));
        payments.limiter.enter().await.expect("open");
        assert_eq!(payments.limiter.rate_limited(0), Some(1));
        assert_eq!(dependencies.get(None).limiter.limit(), None);
        assert_eq!(
            dependencies.get(Some("search")).limiter.rate_limited(0),
            None
        );
    }
}
