//! The retry policy of `#[idempotent(...)]` — defaults, durations and sanity checks (group 5 of the
//! compile-time checks, `docs/compile_errors.md`).
//!
//! Every check reports at the value the user wrote. The defaults come from `docs/rules.md` (*Field lessons*):
//! 3 retries, exponential backoff from 100 ms to 10 s, ±20 % jitter, a key kept 24 h.

use proc_macro2::Span;
use syn::{Ident, LitStr};

use crate::args::{Args, OnBusy, OnMissingKey, OnUnknown};
use crate::diagnostics::Errors;
use crate::duration::{format_millis, parse_millis, parse_range};

pub(crate) const MAX_RETRIES: u64 = 10;
const DEFAULT_RETRIES: u32 = 3;
const DEFAULT_BACKOFF: (u64, u64) = (100, 10_000);
const DEFAULT_JITTER: f64 = 0.2;
const DEFAULT_TTL: u64 = 24 * 3_600_000;
const MAX_PREFIX: usize = 16;

/// The checked policy, every duration in milliseconds.
#[derive(Debug)]
pub(crate) struct Policy {
    /// `None`: `module_path!()` + the function name.
    pub(crate) scope: Option<String>,
    pub(crate) prefix: String,
    pub(crate) retries: u32,
    /// The named dependency whose retry budget the calls draw from; `None`: the runtime's.
    pub(crate) budget: Option<String>,
    pub(crate) backoff: (u64, u64),
    pub(crate) jitter: f64,
    pub(crate) timeout: Option<u64>,
    pub(crate) ttl: u64,
    pub(crate) window: Option<u64>,
    pub(crate) on_busy: OnBusy,
    pub(crate) on_unknown: OnUnknown,
    pub(crate) has_lookup: bool,
    pub(crate) on_missing_key: OnMissingKey,
}

/// Checks every policy argument; all problems are reported together.
pub(crate) fn check(args: &Args, fn_name: &Ident) -> syn::Result<Policy> {
    let mut errors = Errors::default();
    // Whether every input of the worst-case retry span is valid (else that check is skipped).
    let mut span_inputs_ok = true;

    let scope = args.scope.as_ref().map(|lit| {
        let value = lit.value();
        if value.trim().is_empty() {
            errors.push(
                lit.span(),
                "`#[idempotent(scope = \"\")]` is empty: the scope is the name space of the keys; \
                 remove it to get the default (module path and function name), or name it, e.g. \
                 `scope = \"orders.charge\"`"
                    .into(),
            );
        }
        value
    });

    let prefix = match &args.prefix {
        Some(lit) => {
            let value = lit.value();
            if !valid_prefix(&value) {
                errors.push(
                    lit.span(),
                    format!(
                        "`#[idempotent(prefix = {value:?})]` is not a valid callId prefix: use 1 to {MAX_PREFIX} ASCII letters, digits or `_`, e.g. `prefix = \"ord\"`"
                    ),
                );
            }
            value
        }
        None => {
            let derived = default_prefix(fn_name);
            if derived.is_empty() {
                errors.push(
                    fn_name.span(),
                    format!(
                        "cannot derive a callId prefix from the name `{fn_name}`: add `prefix = \"...\"` to `#[idempotent(...)]` (1 to {MAX_PREFIX} ASCII letters, digits or `_`)"
                    ),
                );
            }
            derived
        }
    };

    let budget = args.budget.as_ref().map(|lit| {
        let value = lit.value();
        let valid = (1..=64).contains(&value.len())
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !valid {
            errors.push(
                lit.span(),
                format!(
                    "`#[idempotent(budget = {value:?})]` is not a dependency's name: use 1 to 64 ASCII letters, digits, `_`, `-` or `.`, e.g. `budget = \"payments\"`; every function naming it shares its retry budget"
                ),
            );
        }
        value
    });

    let retries = match &args.retries {
        Some(r) if r.value > MAX_RETRIES => {
            errors.push_spanned(
                &r.tokens,
                format!(
                    "`#[idempotent(retries = {})]` is too many: at most {MAX_RETRIES} retries; more attempts pile load on a remote that is already failing — give the remote more time with a longer `backoff` (e.g. `backoff = \"1s..1m\"`) instead",
                    r.value
                ),
            );
            span_inputs_ok = false;
            DEFAULT_RETRIES
        }
        Some(r) => r.value as u32,
        None => DEFAULT_RETRIES,
    };

    let backoff = match &args.backoff {
        Some(lit) => match parse_range(&lit.value()) {
            Ok((base, cap)) if base > cap => {
                errors.push(
                    lit.span(),
                    format!(
                        "`#[idempotent(backoff = {:?})]` starts above its cap ({} > {}): write `base..cap` with the base first, e.g. `backoff = \"{}..{}\"`",
                        lit.value(),
                        format_millis(base),
                        format_millis(cap),
                        format_millis(cap),
                        format_millis(base),
                    ),
                );
                span_inputs_ok = false;
                DEFAULT_BACKOFF
            }
            Ok(range) => range,
            Err(e) => {
                errors.push(
                    lit.span(),
                    format!("`#[idempotent(backoff = {:?})]` {e}", lit.value()),
                );
                span_inputs_ok = false;
                DEFAULT_BACKOFF
            }
        },
        None => DEFAULT_BACKOFF,
    };

    let jitter = match &args.jitter {
        Some(j) if !(0.0..1.0).contains(&j.value) => {
            errors.push_spanned(
                &j.tokens,
                format!(
                    "`#[idempotent(jitter = {:?})]` is out of range: it must be at least 0.0 and below 1.0 — it is the fraction by which every delay is varied (0.2 = ±20%)",
                    j.value
                ),
            );
            span_inputs_ok = false;
            DEFAULT_JITTER
        }
        Some(j) => j.value,
        None => DEFAULT_JITTER,
    };

    let mut duration = |name: &str, lit: &Option<LitStr>, consequence: &str| -> Option<u64> {
        let lit = lit.as_ref()?;
        match parse_millis(&lit.value()) {
            Ok(0) => {
                errors.push(
                    lit.span(),
                    format!(
                        "`#[idempotent({name} = {:?})]` must be longer than zero: {consequence}",
                        lit.value()
                    ),
                );
                None
            }
            Ok(ms) => Some(ms),
            Err(e) => {
                errors.push(
                    lit.span(),
                    format!("`#[idempotent({name} = {:?})]` {e}", lit.value()),
                );
                None
            }
        }
    };
    let timeout = duration(
        "timeout",
        &args.timeout,
        "every attempt would time out at once; remove `timeout` for no limit",
    );
    let ttl = duration(
        "ttl",
        &args.ttl,
        "the key would be released at once and a duplicate could run again",
    );
    let window = duration(
        "window",
        &args.window,
        "it is the length of the key's time bucket (e.g. `window = \"1d\"`); remove it for no bucket",
    );
    if args.timeout.is_some() && timeout.is_none() || args.ttl.is_some() && ttl.is_none() {
        span_inputs_ok = false;
    }
    // A window's record must live until its bucket ends: the ttl defaults to cover the window, and an
    // explicit one shorter than the window is refused.
    let ttl_value = match (ttl, window) {
        (Some(ttl), _) => ttl,
        (None, Some(window)) => DEFAULT_TTL.max(window),
        (None, None) => DEFAULT_TTL,
    };
    if let (Some(ttl), Some(window), Some(lit), Some(window_lit)) =
        (ttl, window, &args.ttl, &args.window)
    {
        if ttl < window {
            errors.push(
                lit.span(),
                format!(
                    "`#[idempotent(ttl = {:?})]` is shorter than `window = {:?}`: the record would expire inside its window, and a second call in the same window would run again; set `ttl` to at least {:?}, or leave `ttl` out (it then defaults to the window, when longer than 24h)",
                    lit.value(),
                    window_lit.value(),
                    window_lit.value(),
                ),
            );
        }
    }

    if span_inputs_ok {
        let worst = worst_case_span(retries, backoff, jitter, timeout);
        if (ttl_value as f64) < worst {
            // The epsilon keeps float noise (120840.00000001) from adding a millisecond.
            let worst = format_millis((worst - 1e-6).ceil() as u64);
            let (span, what) = match &args.ttl {
                Some(lit) => (
                    lit.span(),
                    format!("`#[idempotent(ttl = {:?})]`", lit.value()),
                ),
                None => (
                    [
                        args.timeout.as_ref().map(LitStr::span),
                        args.backoff.as_ref().map(LitStr::span),
                        args.retries.as_ref().map(|r| r.span),
                    ]
                    .into_iter()
                    .flatten()
                    .next()
                    .unwrap_or_else(Span::call_site),
                    "the default `ttl` of 24h".to_string(),
                ),
            };
            errors.push(
                span,
                format!(
                    "{what} is shorter than the worst-case retry span ({} < {worst}): the key would expire while the call is still retrying, and a duplicate could run again; set `ttl` to at least {worst}, or lower `retries`, `timeout` or `backoff`",
                    args.ttl.as_ref().map_or_else(|| "24h".to_string(), LitStr::value)
                ),
            );
        }
    }

    if let (Some(lit), None, None) = (&args.timeout, &args.lookup, &args.on_unknown) {
        errors.push(
            lit.span(),
            format!(
                "`#[idempotent(timeout = {:?})]` makes a timed-out attempt an unknown outcome (it may have taken effect), so say what to do then: add `lookup = ...` (ask the remote for the receipt by callId), `on_unknown = \"rerun\"` (the remote deduplicates by callId, so re-sending the same callId is safe) or `on_unknown = \"hold\"` (no retry: the call is left to compensation)",
                lit.value()
            ),
        );
    }
    if let (Some(on_unknown), Some(_)) = (&args.on_unknown, &args.lookup) {
        errors.push(
            on_unknown.span,
            "`on_unknown` has no effect together with `lookup` in `#[idempotent(...)]`: the lookup asks the remote and decides what an unknown outcome leads to; remove `on_unknown = ...`".into(),
        );
    }

    errors.finish(Policy {
        scope,
        prefix,
        retries,
        budget,
        backoff,
        jitter,
        timeout,
        ttl: ttl_value,
        window,
        on_busy: args.on_busy.as_ref().map_or(OnBusy::Wait, |b| b.value),
        on_unknown: match (&args.lookup, &args.on_unknown) {
            (Some(_), _) | (None, None) => OnUnknown::Hold,
            (None, Some(u)) => u.value,
        },
        has_lookup: args.lookup.is_some(),
        on_missing_key: args
            .on_missing_key
            .as_ref()
            .map_or(OnMissingKey::Error, |m| m.value),
    })
}

/// `(retries + 1) · timeout + Σ_{n < retries} min(cap, base · 2ⁿ) · (1 + jitter)`, in ms.
pub(crate) fn worst_case_span(
    retries: u32,
    (base, cap): (u64, u64),
    jitter: f64,
    timeout: Option<u64>,
) -> f64 {
    let attempts = f64::from(retries + 1) * timeout.unwrap_or(0) as f64;
    let waits: f64 = (0..retries)
        .map(|n| (base as f64 * 2f64.powi(n as i32)).min(cap as f64) * (1.0 + jitter))
        .sum();
    attempts + waits
}

fn valid_prefix(p: &str) -> bool {
    (1..=MAX_PREFIX).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The first three ASCII letters or digits of the function's name, lowercased: `charge` → `cha`.
pub(crate) fn default_prefix(fn_name: &Ident) -> String {
    use syn::ext::IdentExt;
    fn_name
        .unraw()
        .to_string()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(3)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::Span;

    fn policy(args: &str) -> Result<Policy, String> {
        policy_for(args, "charge")
    }

    fn policy_for(args: &str, name: &str) -> Result<Policy, String> {
        let args: Args = syn::parse_str(args).unwrap();
        assert!(args.errors.is_none());
        check(&args, &Ident::new(name, Span::call_site())).map_err(|e| {
            e.into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        })
    }

    #[test]
    fn defaults() {
        let p = policy("").unwrap();
        assert_eq!(p.prefix, "cha");
        assert_eq!(p.scope, None);
        assert_eq!(p.retries, 3);
        assert_eq!(p.backoff, (100, 10_000));
        assert_eq!(p.jitter, 0.2);
        assert_eq!(p.timeout, None);
        assert_eq!(p.ttl, 86_400_000);
        assert_eq!(p.window, None);
        assert_eq!(p.on_busy, OnBusy::Wait);
        assert_eq!(p.on_unknown, OnUnknown::Hold);
        assert!(!p.has_lookup);
    }

    #[test]
    fn everything_given() {
        let p = policy(
            r#"scope = "orders.charge", prefix = "Ord_1", retries = 10, backoff = "1s..1m",
               jitter = 0.0, timeout = "3s", ttl = "7d", window = "1d", lookup = Self::status,
               on_busy = "reject""#,
        )
        .unwrap();
        assert_eq!(p.scope.as_deref(), Some("orders.charge"));
        assert_eq!(p.prefix, "Ord_1");
        assert_eq!(p.retries, 10);
        assert_eq!(p.backoff, (1_000, 60_000));
        assert_eq!(p.timeout, Some(3_000));
        assert_eq!(p.ttl, 7 * 86_400_000);
        assert_eq!(p.window, Some(86_400_000));
        assert_eq!(p.on_busy, OnBusy::Reject);
        assert_eq!(p.on_unknown, OnUnknown::Hold);
        assert!(p.has_lookup);
        let p = policy(r#"timeout = "1s", on_unknown = "rerun""#).unwrap();
        assert_eq!(p.on_unknown, OnUnknown::Rerun);
    }

    #[test]
    fn default_prefixes() {
        let p = |n: &str| default_prefix(&syn::parse_str::<Ident>(n).unwrap());
        assert_eq!(p("charge"), "cha");
        assert_eq!(p("__do_it"), "doi");
        assert_eq!(p("GetX"), "get");
        assert_eq!(p("r#type"), "typ");
        assert_eq!(p("a"), "a");
        assert_eq!(p("__"), "");
        let e = policy_for("", "收费").unwrap_err();
        assert!(
            e.contains("cannot derive a callId prefix from the name `收费`"),
            "{e}"
        );
        assert!(policy_for(r#"prefix = "fee""#, "收费").is_ok());
    }

    #[test]
    fn bad_prefix_and_scope() {
        for bad in ["", "or-d", "a_very_long_prefix_x", "ö"] {
            let e = policy(&format!("prefix = {bad:?}")).unwrap_err();
            assert!(e.contains("is not a valid callId prefix"), "{bad}: {e}");
        }
        assert!(policy(r#"scope = " ""#).unwrap_err().contains("is empty"));
    }

    #[test]
    fn retries_jitter_backoff() {
        let e = policy("retries = 11").unwrap_err();
        assert!(
            e.starts_with("`#[idempotent(retries = 11)]` is too many: at most 10"),
            "{e}"
        );
        for j in ["1.0", "1", "-0.1", "2.5"] {
            let e = policy(&format!("jitter = {j}")).unwrap_err();
            assert!(e.contains("must be at least 0.0 and below 1.0"), "{j}: {e}");
        }
        assert!(policy("jitter = 0.99").is_ok());
        let e = policy(r#"backoff = "10s..1s""#).unwrap_err();
        assert!(e.contains("starts above its cap (10s > 1s)"), "{e}");
        assert!(e.contains("`backoff = \"1s..10s\"`"), "{e}");
        let e = policy(r#"backoff = "100ms-10s""#).unwrap_err();
        assert!(e.contains("is not a range; expected `base..cap`"), "{e}");
        assert!(policy(r#"backoff = "1s..1s""#).is_ok());
    }

    #[test]
    fn durations() {
        let e = policy(r#"ttl = "3 days""#).unwrap_err();
        assert!(
            e.starts_with(
                "`#[idempotent(ttl = \"3 days\")]` is not a duration; expected a number and a unit"
            ),
            "{e}"
        );
        let e = policy(r#"window = "1w""#).unwrap_err();
        assert!(e.contains("has an unknown unit `w`"), "{e}");
        let e = policy(r#"timeout = "0s", on_unknown = "hold""#).unwrap_err();
        assert!(e.contains("must be longer than zero"), "{e}");
        let e = policy(r#"ttl = "0s""#).unwrap_err();
        assert!(e.contains("must be longer than zero"), "{e}");
    }

    #[test]
    fn ttl_shorter_than_retry_span() {
        // 4 × 30s + (0.1 + 0.2 + 0.4) s × 1.2 = 120.84 s
        assert!((worst_case_span(3, (100, 10_000), 0.2, Some(30_000)) - 120_840.0).abs() < 1e-6);
        let e = policy(r#"ttl = "1m", timeout = "30s", on_unknown = "hold""#).unwrap_err();
        assert!(
            e.starts_with(
                "`#[idempotent(ttl = \"1m\")]` is shorter than the worst-case retry span (1m < 2m 840ms)"
            ),
            "{e}"
        );
        let e = policy(r#"retries = 10, backoff = "1h..1d""#).unwrap_err();
        assert!(
            e.starts_with("the default `ttl` of 24h is shorter than the worst-case retry span"),
            "{e}"
        );
        assert!(policy(r#"ttl = "2m1s", timeout = "30s", on_unknown = "hold""#).is_ok());
    }

    #[test]
    fn unknown_outcome_policy() {
        let e = policy(r#"timeout = "3s""#).unwrap_err();
        assert!(e.contains("add `lookup = ...`"), "{e}");
        assert!(e.contains("`on_unknown = \"rerun\"`"), "{e}");
        assert!(e.contains("`on_unknown = \"hold\"`"), "{e}");
        assert!(policy(r#"timeout = "3s", lookup = |c| self.status(c)"#).is_ok());
        let e = policy(r#"lookup = Self::status, on_unknown = "hold""#).unwrap_err();
        assert!(
            e.contains("`on_unknown` has no effect together with `lookup`"),
            "{e}"
        );
    }

    #[test]
    fn reports_everything_at_once() {
        let e = policy(r#"retries = 11, jitter = 2.0, ttl = "x", timeout = "1s""#).unwrap_err();
        assert_eq!(e.lines().count(), 4, "{e}");
    }
}
