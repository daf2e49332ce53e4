//! Procedural macros of [samekey](https://docs.rs/samekey): `#[idempotent]` and
//! `#[derive(KeyPart)]`. Use them through the `samekey` crate; the generated code refers to the
//! runtime only through `::samekey::__private`.
//!
//! This file only converts tokens and delegates: everything else works on
//! `proc_macro2::TokenStream`, so it is unit-tested from strings.
//!
//! `#[idempotent]` runs in stages (`idempotent` strings them together), each module holding one
//! concern:
//!
//! | stage | module | holds |
//! |---|---|---|
//! | parse | `signature` | the function as written (body kept as tokens), its signature checks, its parameters |
//! | parse | `args` | the arguments, parsed by hand: the form of each value, with its span |
//! | validate | `validate` | every check of the arguments against the function, run together; hands `expand` a `Checked` |
//! | validate | `validate/policy` | retries, backoff, jitter, durations, ttl against the retry span, what a timeout leads to |
//! | validate | `key` | `key` and `verify`: their parts, checked against the parameters |
//! | validate | `key/volatile` | clocks, randomness, per-call ids, counters, floats, hash-ordered collections in a part |
//! | generate | `expand` | the retry loop, from checked input only |
//!
//! Shared by the stages: `diagnostics` (the one error accumulator, did-you-mean), `display` (tokens
//! as a person writes them), `duration` (duration strings). `scoped` is `#[samekey::scoped]`,
//! `derive` is `#[derive(KeyPart)]`.

extern crate proc_macro;

mod args;
mod derive;
mod diagnostics;
mod display;
mod duration;
mod expand;
mod idempotent;
mod key;
mod scoped;
mod signature;
mod validate;

use proc_macro::TokenStream;

/// samekey's `#[idempotent]`: use it as `samekey::idempotent`, whose documentation is its reference.
#[proc_macro_attribute]
pub fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    idempotent::idempotent(args.into(), item.into()).into()
}

/// On an `impl` block: the default scope of each `#[idempotent]` method in it names the block's self
/// type, so that same-named methods of two `impl` blocks in one module do not share keys.
///
/// See the `samekey` crate for the full rule.
#[proc_macro_attribute]
pub fn scoped(args: TokenStream, item: TokenStream) -> TokenStream {
    scoped::scoped(args.into(), item.into()).into()
}

/// Derives `samekey::KeyPart` for a struct or an enum: its fields in declaration order
/// (`#[key_part(skip)]` leaves one out), and for an enum the variant's name
/// (`#[key_part(rename = "Old")]` keeps an old one).
#[proc_macro_derive(KeyPart, attributes(key_part))]
pub fn derive_key_part(item: TokenStream) -> TokenStream {
    derive::key_part(item.into()).into()
}
