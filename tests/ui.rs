//! The compile-time contract of `#[idempotent]` and `#[derive(KeyPart)]`: every rejected form in
//! `tests/ui/fail` with the message a user reads (`.stderr`, regenerate with `TRYBUILD=overwrite`
//! and read the diff), and in `tests/ui/pass` the forms that must keep compiling.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
