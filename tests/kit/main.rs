//! The test kit (`samekey::testing`) — one test binary.
//!
//! * [`assertions`]: each assertion of the kit passes on a function that is safe to retry and fails,
//!   saying why, on one that is not (was `tests/kit.rs`).
//! * [`properties`]: under generated fault schedules, nothing takes effect twice and nothing is lost
//!   (was `tests/kit_properties.rs`; `cargo test --release --test kit properties::`).

mod assertions;
mod properties;
