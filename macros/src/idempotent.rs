//! `#[idempotent(...)]`, stage by stage: the function is parsed ([`Func`]), validated
//! ([`validate`]), then expanded ([`expand`]).
//!
//! Guarantees:
//! - **Always the function.** On any error the output is the errors *and* the original function,
//!   so the user sees the problem and nothing else (no cascade of errors about a missing function),
//!   and IDEs keep working.
//! - Nothing is generated from input that was refused: the expansion only ever sees a
//!   [`Checked`](crate::validate::Checked).

use proc_macro2::TokenStream;
use quote::quote;

use crate::signature::Func;
use crate::{expand, validate};

/// The entry point of `#[idempotent]`, on `proc_macro2` tokens.
pub(crate) fn idempotent(args: TokenStream, item: TokenStream) -> TokenStream {
    let func = match syn::parse2::<Func>(item.clone()) {
        Ok(func) => func,
        Err(err) => {
            let err = err.to_compile_error();
            return quote!(#err #item);
        }
    };
    match validate::validate(args, &func) {
        Ok(checked) => expand::generate(&checked),
        Err(err) => {
            // The function as written, so that the rest of the crate compiles; a parameter named
            // only in the (refused) key is not the user's unused variable.
            let err = err.to_compile_error();
            quote!(#err #[allow(unused_variables)] #item)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &str, item: &str) -> String {
        idempotent(args.parse().unwrap(), item.parse().unwrap()).to_string()
    }

    fn errors(args: &str, item: &str) -> Vec<String> {
        let out: TokenStream = idempotent(args.parse().unwrap(), item.parse().unwrap());
        // Errors come out as `::core::compile_error! { "..." }`.
        let mut found = Vec::new();
        let mut tokens = out.into_iter().peekable();
        while let Some(tt) = tokens.next() {
            if let proc_macro2::TokenTree::Ident(i) = &tt {
                if i == "compile_error" {
                    tokens.next(); // `!`
                    if let Some(proc_macro2::TokenTree::Group(g)) = tokens.next() {
                        let lit: syn::LitStr = syn::parse2(g.stream()).unwrap();
                        found.push(lit.value());
                    }
                }
            }
        }
        found
    }

    #[test]
    fn signature_checks() {
        let e = errors("key = x", "fn f(x: u8) -> Result<(), E> { Ok(()) }");
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("`#[idempotent]` goes on an `async fn`"),
            "{e:?}"
        );
        let e = errors("key = x", "async fn f(x: u8) { }");
        assert!(
            e[0].contains("must return `Result<T, E>`: add `-> Result<T, E>`"),
            "{e:?}"
        );
        let e = errors("key = x", "async fn f(x: u8) -> (u8, u8) { (x, x) }");
        assert!(
            e[0].contains("must return `Result<T, E>`, not `(u8, u8)`"),
            "{e:?}"
        );
        let e = errors("key = x", "async fn f(x: u8) -> impl Sized { x }");
        assert!(e[0].contains("not `impl Sized`"), "{e:?}");
        for surely_not in [
            "String",
            "Option<u8>",
            "std::string::String",
            "u64",
            "Vec<u8>",
        ] {
            let e = errors(
                "key = x",
                &format!("async fn f(x: u8) -> {surely_not} {{ body() }}"),
            );
            assert_eq!(e.len(), 1, "{surely_not}: {e:?}");
            assert!(e[0].contains("must return `Result<T, E>`, not"), "{e:?}");
        }
        for maybe in [
            "io::Result<u8>",
            "Result<u8, E>",
            "anyhow::Result<u8>",
            "Res<u8>",
        ] {
            let e = errors(
                "key = x",
                &format!("async fn f(x: u8) -> {maybe} {{ body() }}"),
            );
            assert!(e.is_empty(), "{maybe}: {e:?}");
        }
        for recv in [
            "self",
            "mut self",
            "self: Box<Self>",
            "self: std::sync::Arc<Self>",
        ] {
            let e = errors(
                "key = x",
                &format!("async fn f({recv}, x: u8) -> Result<(), E> {{ Ok(()) }}"),
            );
            assert_eq!(e.len(), 1, "{recv}: {e:?}");
            assert!(
                e[0].contains("take `&self` or `&mut self`"),
                "{recv}: {e:?}"
            );
        }
        for recv in ["&self", "&mut self", "self: &Self", "self: Pin<&mut Self>"] {
            let e = errors(
                "key = x",
                &format!("async fn f({recv}, x: u8) -> Result<(), E> {{ Ok(()) }}"),
            );
            assert!(e.is_empty(), "{recv}: {e:?}");
        }
        let e = errors("key = x", "async fn f(x: u8) -> Result<(), E>;");
        assert!(e[0].contains("needs the function's body"), "{e:?}");
        let e = errors("key = x", "struct S;");
        assert!(e[0].contains("goes on an `async fn`"), "{e:?}");
    }

    #[test]
    fn missing_key_and_all_errors_at_once() {
        let e = errors("", "async fn f(x: u8) -> Result<(), E> { Ok(()) }");
        assert_eq!(e.len(), 1);
        assert!(
            e[0].starts_with("`#[idempotent(...)]` needs a key"),
            "{e:?}"
        );
        let e = errors(
            r#"key = y, retries = 11, foo = 1, verify = "rand::random()""#,
            "fn f(x: u8) -> Result<(), E> { Ok(()) }",
        );
        assert_eq!(e.len(), 5, "{e:?}");
    }

    #[test]
    fn errors_keep_the_original_function() {
        let out = run("", "async fn f(x: u8) -> Result<(), E> { Ok(()) }");
        assert!(out.contains("compile_error"), "{out}");
        assert!(
            out.ends_with(
                "# [allow (unused_variables)] async fn f (x : u8) -> Result < () , E > { Ok (()) }"
            ),
            "a parameter named only in the refused key is not reported unused: {out}"
        );
    }
}
