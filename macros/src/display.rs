//! Tokens rendered the way a person writes them (`Utc::now()`, `order.id`, `a - b`,
//! `Vec<Option<f32>>`), not the way `TokenStream::to_string` spaces them (`Utc :: now ()`).
//!
//! Messages quote the user's code with it, and the generated code names each key part with it (the
//! name a missing or refused key part is reported under at run time), so its output is part of what
//! users read: a change here changes messages and `.stderr` files.

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

/// Renders tokens the way a person writes them (`Utc::now()`, `order.id`, `a - b`), for messages.
pub(crate) fn display(tokens: TokenStream) -> String {
    let mut out = String::new();
    write_tokens(tokens, &mut out);
    out
}

#[derive(Clone, Copy, PartialEq)]
enum Last {
    Start,
    Word,
    Group,
    /// A punctuation that wants a space after it (`,`, a binary operator).
    Spaced,
    /// Punctuation written against the next token (`.`, `::`, `&`, `!`).
    Tight,
}

fn write_tokens(tokens: TokenStream, out: &mut String) {
    let mut last = Last::Start;
    for tt in tokens {
        match tt {
            TokenTree::Ident(_) | TokenTree::Literal(_) => {
                if matches!(last, Last::Word | Last::Group | Last::Spaced) {
                    out.push(' ');
                }
                out.push_str(&tt.to_string());
                last = Last::Word;
            }
            TokenTree::Group(g) => {
                let (open, close) = match g.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Brace => ("{ ", " }"),
                    Delimiter::None => ("", ""),
                };
                if last == Last::Spaced
                    || (g.delimiter() == Delimiter::Brace && last != Last::Start)
                {
                    out.push(' ');
                }
                out.push_str(open);
                write_tokens(g.stream(), out);
                out.push_str(close);
                last = Last::Group;
            }
            TokenTree::Punct(p) => {
                let ch = p.as_char();
                // `<` and `>` are left tight: in key parts and types they are generics far more
                // often than comparisons.
                let binary = matches!(ch, '+' | '=' | '*' | '/' | '%' | '^')
                    || (ch == '-' && matches!(last, Last::Word | Last::Group))
                    || (matches!(ch, '&' | '|')
                        && matches!(last, Last::Word | Last::Group | Last::Tight)
                        && p.spacing() == Spacing::Joint)
                    || (matches!(ch, '&' | '|') && last == Last::Tight && out.ends_with(ch));
                if ch == ',' || ch == ';' {
                    out.push(ch);
                    last = Last::Spaced;
                } else if binary {
                    let continues = last == Last::Tight && out.ends_with(is_operator);
                    if !continues && last != Last::Start {
                        out.push(' ');
                    }
                    out.push(ch);
                    last = if p.spacing() == Spacing::Joint {
                        Last::Tight
                    } else {
                        Last::Spaced
                    };
                } else {
                    out.push(ch);
                    last = Last::Tight;
                }
            }
        }
    }
}

fn is_operator(c: char) -> bool {
    matches!(c, '+' | '=' | '*' | '/' | '%' | '^' | '-' | '&' | '|')
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    #[test]
    fn displays_like_source() {
        let d = |t: TokenStream| display(t);
        assert_eq!(d(quote!(Utc::now())), "Utc::now()");
        assert_eq!(
            d(quote!(self.a.fetch_add(1, Ordering::SeqCst))),
            "self.a.fetch_add(1, Ordering::SeqCst)"
        );
        assert_eq!(d(quote!(a - b)), "a - b");
        assert_eq!(d(quote!(-1)), "-1");
        assert_eq!(d(quote!(x as u64)), "x as u64");
        assert_eq!(d(quote!(items[0])), "items[0]");
        assert_eq!(d(quote!(&order)), "&order");
        assert_eq!(d(quote!(nanoid!())), "nanoid!()");
        assert_eq!(d(quote!(rand::random::<u64>())), "rand::random::<u64>()");
        assert_eq!(d(quote!(Vec<Option<f32>>)), "Vec<Option<f32>>");
        assert_eq!(d(quote!(HashMap<String, u32>)), "HashMap<String, u32>");
        assert_eq!(d(quote!(a == b)), "a == b");
        assert_eq!(d(quote!(a && b)), "a && b");
    }
}
