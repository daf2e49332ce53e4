//! The scope-clash check: which operation a default key scope belongs to. A default scope (module
//! path + fn name) is written once per annotated item, but one item can be many operations: a trait's
//! default method runs for every implementor, a method of a generic `impl` for every instantiation,
//! and two `impl` blocks in one module can each have a method of the same name. Those operations must
//! never share keys.
//!
//! # Guarantees
//!
//! * Two different operations never run under one default scope in a process: the second one's first
//!   call answers [`Error::ScopeClash`] before any body runs or any key is claimed.
//! * An operation is told apart by its annotated item and, for methods, the type of `Self`. Neither
//!   goes into a stored key: keys stay the same across builds and compiler versions.
//! * A scope given with `scope = "..."` is the user's word that the calls are one operation: it is not
//!   checked.
//! * After an operation's first call, the check is one atomic load and a string comparison.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::error::Error;

/// What an `#[idempotent]` item records about the operation that first used its scope. Made by the
/// macro in the item's `Spec`.
#[derive(Debug)]
pub struct OperationCell {
    /// The type of `Self` (or `""`) of the first call.
    first: OnceLock<&'static str>,
}

impl OperationCell {
    /// An empty cell, for a `static`.
    #[allow(clippy::new_without_default)]
    pub const fn new() -> OperationCell {
        OperationCell {
            first: OnceLock::new(),
        }
    }
}

/// The first operation seen under a default scope: its item (the address of its `Spec`), the item's
/// name and its `Self` type.
#[derive(Clone, Copy)]
struct First {
    addr: usize,
    name: &'static str,
    self_type: &'static str,
}

fn registry() -> &'static Mutex<HashMap<&'static str, First>> {
    static REGISTRY: OnceLock<Mutex<HashMap<&'static str, First>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Checks that the item at `addr` (named `name`) with `Self` type `self_type` is the only
/// operation under its default `scope`.
pub(crate) fn check(
    cell: &OperationCell,
    addr: usize,
    scope: &'static str,
    name: &'static str,
    self_type: &'static str,
) -> Result<(), Error> {
    if let Some(first) = cell.first.get() {
        return if *first == self_type {
            Ok(())
        } else {
            Err(clash(scope, name, first, name, self_type))
        };
    }
    let mut registry = registry()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let first = *registry.entry(scope).or_insert(First {
        addr,
        name,
        self_type,
    });
    if first.addr != addr || first.self_type != self_type {
        return Err(clash(scope, first.name, first.self_type, name, self_type));
    }
    let _ = cell.first.set(self_type);
    Ok(())
}

fn clash(scope: &str, first_name: &str, first_self: &str, name: &str, self_type: &str) -> Error {
    let describe = |name: &str, self_type: &str| {
        if self_type.is_empty() {
            format!("`{name}`")
        } else {
            format!("`{self_type}::{name}`")
        }
    };
    let (first, second) = (describe(first_name, first_self), describe(name, self_type));
    let second = if first == second {
        format!("{second} of another `impl` block")
    } else {
        second
    };
    Error::ScopeClash {
        scope: scope.to_owned(),
        first,
        second,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_item_one_self_type() {
        static A: OperationCell = OperationCell::new();
        assert_eq!(check(&A, 1, "t::one", "charge", "app::Stripe"), Ok(()));
        assert_eq!(check(&A, 1, "t::one", "charge", "app::Stripe"), Ok(()));
        let e = check(&A, 1, "t::one", "charge", "app::Paypal").unwrap_err();
        assert_eq!(
            e.to_string(),
            "operations `app::Stripe::charge` and `app::Paypal::charge` share the default key scope `t::one`: each would replay the other's outcome; give each its own `#[idempotent(scope = \"...\")]`, or put `#[samekey::scoped]` on their `impl` blocks"
        );
    }

    #[test]
    fn two_items_one_scope() {
        static A: OperationCell = OperationCell::new();
        static B: OperationCell = OperationCell::new();
        assert_eq!(check(&A, 1, "t::two", "charge", ""), Ok(()));
        let e = check(&B, 2, "t::two", "charge", "").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("operations `charge` and `charge` of another `impl` block share"),
            "{e}"
        );
        // The first item goes on working.
        assert_eq!(check(&A, 1, "t::two", "charge", ""), Ok(()));
    }
}
