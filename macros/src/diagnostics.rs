//! Diagnostics: how every stage reports what it refuses.
//!
//! Guarantees:
//! - **One accumulator.** Every check adds its `syn::Error`s to an [`Errors`]; they are combined
//!   (`syn::Error::combine`) in the order they were found, so the user sees every problem at once,
//!   each at the span it was made with, and they are emitted with `to_compile_error()` by the entry
//!   point of the macro, never as a hand-built `compile_error!`.
//! - **Suggestions are conservative.** [`closest`] proposes a name only when it is close enough to
//!   be a likely typo (Jaro-Winkler ≥ 0.8); otherwise the message lists the valid names instead.

use proc_macro2::Span;
use quote::ToTokens;

/// Collects the errors of one stage (or of all of them), so that all are reported at once.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    /// Adds one error (or several, already combined) after those found so far.
    pub(crate) fn add(&mut self, err: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(err),
            None => self.0 = Some(err),
        }
    }

    /// Adds an error at `span`.
    pub(crate) fn push(&mut self, span: Span, msg: String) {
        self.add(syn::Error::new(span, msg));
    }

    /// Adds an error that underlines all of `tokens` (`-0.1` is two tokens).
    pub(crate) fn push_spanned(&mut self, tokens: impl ToTokens, msg: String) {
        self.add(syn::Error::new_spanned(tokens, msg));
    }

    /// The value of `result`, or `None` after adding its error.
    pub(crate) fn take<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|e| self.add(e)).ok()
    }

    /// Every error added, combined; `None` when there was none.
    pub(crate) fn into_error(self) -> Option<syn::Error> {
        self.0
    }

    /// `Ok(value)` when no error was added, else every error added.
    pub(crate) fn finish<T>(self, value: T) -> syn::Result<T> {
        match self.0 {
            Some(e) => Err(e),
            None => Ok(value),
        }
    }
}

/// The candidate closest to `name`, if one is close enough to be a likely typo.
pub(crate) fn closest<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let lower = name.to_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(&lower, &c.to_lowercase()), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_names() {
        assert_eq!(closest("ordr", ["order", "op"]), Some("order"));
        assert_eq!(closest("amout", ["order", "amount"]), Some("amount"));
        assert_eq!(closest("xyz", ["order", "amount"]), None);
    }
}
