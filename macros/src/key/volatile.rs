//! Inputs that change from one call (or attempt) to the next, found in a key or `verify` part: group 3
//! of the compile-time checks (`docs/compile_errors.md`), and the part of group 4 that a parameter's declared type
//! already answers.
//!
//! Guarantees:
//! - [`Volatile::find`] recognises clocks, randomness, ids generated per call, counters, process and
//!   thread ids, the attempt number and the callId by the words a part mentions (`Utc::now`,
//!   `fetch_add`, `samekey::current`), so such a part is refused with a message that says why its
//!   value would differ between two calls, even when it is a parameter or a field whose name says so
//!   (`attempt`, `order.call_id`); when several match, the declaration order of [`Volatile`] picks
//!   the most telling one.
//! - [`unstable_type`] refuses a part that is a whole parameter whose declared type cannot make a
//!   stable key (floats, hash-ordered collections, clock readings, a `CallId`), found anywhere in the
//!   type (`Vec<Option<f32>>`). Other types, and fields, are left to rustc and the
//!   `#[diagnostic::on_unimplemented]` of `KeyPart`.
//! - Every message starts with "key part" (or "verify part") and the part as written, so it names
//!   the part even in the string form, where all rustc can underline is the whole string.
//!
//! Tested through `key::parts`, in `key/mod.rs`.

use quote::ToTokens;
use syn::ext::IdentExt;
use syn::visit::Visit;
use syn::{Expr, GenericArgument, Member, PathArguments, Type};

use crate::display::display;

/// Known inputs that change from one call (or attempt) to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Volatile {
    // Declared in priority order: when several match, the first one names the problem best.
    Attempt,
    CallId,
    PerCallId,
    Clock,
    Random,
    Counter,
    ProcessThread,
}

impl Volatile {
    fn of_word(word: &str) -> Option<Volatile> {
        use Volatile::*;
        Some(match word {
            "attempt" | "attempts" | "attempt_number" | "retry_count" => Attempt,
            "call_id" | "callid" | "CallId" | "call_ids" => CallId,
            "new_v1" | "now_v1" | "new_v4" | "new_v6" | "now_v6" | "new_v7" | "now_v7" | "Ulid"
            | "ulid" | "nanoid" | "ObjectId" | "cuid" | "cuid2" | "Ksuid" | "ksuid" => PerCallId,
            "now" | "now_utc" | "now_local" | "Instant" | "SystemTime" | "UNIX_EPOCH" | "Utc"
            | "Local" | "chrono" | "elapsed" | "OffsetDateTime" => Clock,
            "rand" | "random" | "thread_rng" | "fastrand" | "rng" | "gen" | "gen_range"
            | "random_range" | "OsRng" | "StdRng" | "SmallRng" | "getrandom" => Random,
            "fetch_add" | "fetch_sub" | "fetch_update" | "fetch_max" | "fetch_min" | "incr"
            | "incr_by" | "incrby" | "next_id" | "nextval" => Counter,
            "ThreadId" | "getpid" | "gettid" => ProcessThread,
            _ => return None,
        })
    }

    /// Two-word paths whose words alone are too common to reject (`current`, `id`).
    fn of_pair(first: &str, second: &str) -> Option<Volatile> {
        match (first, second) {
            ("thread", "current") | ("process", "id") => Some(Volatile::ProcessThread),
            ("samekey", "current") => Some(Volatile::CallId),
            _ => None,
        }
    }

    /// The most telling volatile input mentioned anywhere in `expr`.
    pub(crate) fn find(expr: &Expr) -> Option<Volatile> {
        let mut words = Words(Vec::new());
        words.visit_expr(expr);
        let mut found: Option<Volatile> = None;
        for group in &words.0 {
            let mut hits: Vec<Volatile> = group.iter().filter_map(|w| Self::of_word(w)).collect();
            hits.extend(group.windows(2).filter_map(|w| Self::of_pair(&w[0], &w[1])));
            // A lone `current()` is `samekey::current()` imported.
            if group.len() == 1 && group[0] == "current" {
                hits.push(Volatile::CallId);
            }
            if let Some(best) = hits.into_iter().min() {
                found = Some(found.map_or(best, |f| f.min(best)));
            }
        }
        found
    }

    pub(crate) fn message(self, arg: &str, p: &str) -> String {
        let (consequence, build, time) = if arg == "key" {
            (
                "a duplicate call would get another key and run again",
                "build the key from business inputs, e.g. `order.id + op`",
                "build the key from business inputs (e.g. the order's date), and use the `window = \"1d\"` argument of `#[idempotent(...)]` for time buckets",
            )
        } else {
            (
                "every replay would be taken for a reuse of the key with another payload",
                "name the business fields of the payload, e.g. `verify = \"amount + currency\"`",
                "name the business fields of the payload, e.g. `verify = \"amount + currency\"`",
            )
        };
        match self {
            Volatile::Clock => format!(
                "{arg} part `{p}` reads the clock: it changes from one call to the next, so {consequence}; {time}"
            ),
            Volatile::Random => format!(
                "{arg} part `{p}` is random: {consequence}; {build}"
            ),
            Volatile::PerCallId => format!(
                "{arg} part `{p}` makes a new id on every call: {consequence}; take the id the business already has (e.g. the request id the client sent) as a parameter and name it"
            ),
            Volatile::Counter => format!(
                "{arg} part `{p}` reads a counter: it moves on every call, so {consequence}; {build}"
            ),
            Volatile::ProcessThread => format!(
                "{arg} part `{p}` is a process or thread id: it differs between instances, threads and restarts, so {consequence}; {build}"
            ),
            Volatile::Attempt => format!(
                "{arg} part `{p}` is the attempt number: the {arg} must be the same on every attempt (it is computed once, before the first one); remove this part"
            ),
            Volatile::CallId => callid_message(arg, p),
        }
    }
}

fn callid_message(arg: &str, p: &str) -> String {
    format!(
        "{arg} part `{p}` is the callId, and a key is not a copy of the callId: the callId names one call and its attempts, the key names the business operation across calls, processes and restarts; {}",
        if arg == "key" {
            "build the key from business inputs, e.g. `order.id + op`"
        } else {
            "name the business fields of the payload, e.g. `verify = \"amount + currency\"`"
        }
    )
}

/// Every identifier an expression mentions, grouped by path (`Utc::now` is one group).
struct Words(Vec<Vec<String>>);

impl<'ast> Visit<'ast> for Words {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        self.0.push(
            path.segments
                .iter()
                .map(|s| s.ident.unraw().to_string())
                .collect(),
        );
        syn::visit::visit_path(self, path);
    }

    fn visit_expr_method_call(&mut self, call: &'ast syn::ExprMethodCall) {
        self.0.push(vec![call.method.unraw().to_string()]);
        syn::visit::visit_expr_method_call(self, call);
    }

    fn visit_member(&mut self, member: &'ast Member) {
        if let Member::Named(ident) = member {
            self.0.push(vec![ident.unraw().to_string()]);
        }
    }
}

/// A dedicated message when a parameter's declared type cannot make a stable key.
pub(crate) fn unstable_type(arg: &str, p: &str, ty: &Type) -> Option<String> {
    let (kind, inner) = find_unstable(ty)?;
    let full = display(ty.to_token_stream());
    let mut bare = ty;
    while let Type::Reference(r) = bare {
        bare = &r.elem;
    }
    let has = if display(bare.to_token_stream()) == inner {
        format!("has type `{full}`")
    } else {
        format!("has type `{full}`, which holds a `{inner}`")
    };
    Some(match kind {
        Unstable::Float => format!(
            "{arg} part `{p}` {has}: floats are not stable key parts (rounding, `-0.0`, NaN); use integer minor units, e.g. cents as `u64`"
        ),
        Unstable::Hash => format!(
            "{arg} part `{p}` {has}: a hash collection iterates in a different order in every process, so the same value would give another key; use BTreeMap/BTreeSet"
        ),
        Unstable::Clock => format!(
            "{arg} part `{p}` {has}, a clock reading that changes on every call; use the `window = ...` argument of `#[idempotent(...)]` for time buckets (e.g. `window = \"1d\"`), or a business date"
        ),
        Unstable::CallId => callid_message(arg, p),
    })
}

enum Unstable {
    Float,
    Hash,
    Clock,
    CallId,
}

fn find_unstable(ty: &Type) -> Option<(Unstable, String)> {
    match ty {
        Type::Path(tp) => {
            let last = tp.path.segments.last()?;
            let name = last.ident.to_string();
            let kind = match name.as_str() {
                "f32" | "f64" => Some(Unstable::Float),
                "Instant" | "SystemTime" => Some(Unstable::Clock),
                "CallId" => Some(Unstable::CallId),
                n if n.ends_with("HashMap") || n.ends_with("HashSet") => Some(Unstable::Hash),
                _ => None,
            };
            if let Some(kind) = kind {
                return Some((kind, display(ty.to_token_stream())));
            }
            if let Some(q) = &tp.qself {
                if let Some(found) = find_unstable(&q.ty) {
                    return Some(found);
                }
            }
            tp.path
                .segments
                .iter()
                .find_map(|seg| match &seg.arguments {
                    PathArguments::AngleBracketed(a) => a.args.iter().find_map(|g| match g {
                        GenericArgument::Type(t) => find_unstable(t),
                        _ => None,
                    }),
                    _ => None,
                })
        }
        Type::Reference(r) => find_unstable(&r.elem),
        Type::Slice(s) => find_unstable(&s.elem),
        Type::Array(a) => find_unstable(&a.elem),
        Type::Paren(p) => find_unstable(&p.elem),
        Type::Group(g) => find_unstable(&g.elem),
        Type::Ptr(p) => find_unstable(&p.elem),
        Type::Tuple(t) => t.elems.iter().find_map(find_unstable),
        _ => None,
    }
}
