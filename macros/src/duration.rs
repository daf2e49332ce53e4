//! Duration strings of `#[idempotent(...)]`: `"250ms"`, `"3s"`, `"5m"`, `"24h"`, `"7d"`, and sums of
//! them written together (`"1h30m"`). Everything is kept in whole milliseconds, which is what the
//! generated `Duration::from_millis` takes.

/// The accepted forms, quoted in every error about a duration.
pub(crate) const FORMS: &str =
    "a number and a unit: \"250ms\", \"3s\", \"5m\", \"24h\" or \"7d\" (units: ms, s, m, h, d)";

/// Parses a duration string into milliseconds. The error is a phrase that the caller puts after
/// the argument's name (it names no argument itself).
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err(format!("is empty; expected {FORMS}"));
    }
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut total: u64 = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if start == i {
            return Err(format!("is not a duration; expected {FORMS}"));
        }
        let number: u64 = s[start..i]
            .parse()
            .map_err(|_| "is too large".to_string())?;
        let unit_start = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let factor: u64 = match &s[unit_start..i] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" if i == bytes.len() => return Err(format!("has no unit; expected {FORMS}")),
            "" => return Err(format!("is not a duration; expected {FORMS}")),
            other => return Err(format!("has an unknown unit `{other}`; expected {FORMS}")),
        };
        total = number
            .checked_mul(factor)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| "is too large".to_string())?;
    }
    Ok(total)
}

/// Parses a backoff range `"base..cap"` into two millisecond values. Does not compare them: that is
/// a policy check with its own message.
pub(crate) fn parse_range(text: &str) -> Result<(u64, u64), String> {
    let Some((base, cap)) = text.split_once("..") else {
        return Err(format!(
            "is not a range; expected `base..cap`, e.g. \"100ms..10s\", each side {FORMS}"
        ));
    };
    let base = parse_millis(base).map_err(|e| format!("has a base that {e}"))?;
    let cap = parse_millis(cap.strip_prefix('=').unwrap_or(cap))
        .map_err(|e| format!("has a cap that {e}"))?;
    Ok((base, cap))
}

/// Formats milliseconds for a person: `150ms`, `3s`, `2.5s`, `1m 30s`, `24h`, `1d 2h`.
pub(crate) fn format_millis(ms: u64) -> String {
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        return if ms.is_multiple_of(1_000) {
            format!("{}s", ms / 1_000)
        } else {
            let s = format!("{:.3}", ms as f64 / 1_000.0);
            format!("{}s", s.trim_end_matches('0'))
        };
    }
    let units = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
        (1, "ms"),
    ];
    let mut rest = ms;
    let mut parts = Vec::new();
    for (size, unit) in units {
        if rest >= size {
            parts.push(format!("{}{unit}", rest / size));
            rest %= size;
        }
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_units() {
        assert_eq!(parse_millis("250ms"), Ok(250));
        assert_eq!(parse_millis("3s"), Ok(3_000));
        assert_eq!(parse_millis("1m"), Ok(60_000));
        assert_eq!(parse_millis("24h"), Ok(86_400_000));
        assert_eq!(parse_millis("7d"), Ok(7 * 86_400_000));
        assert_eq!(parse_millis("1d"), Ok(86_400_000));
        assert_eq!(parse_millis(" 0s "), Ok(0));
    }

    #[test]
    fn compound() {
        assert_eq!(parse_millis("1h30m"), Ok(5_400_000));
        assert_eq!(parse_millis("1s500ms"), Ok(1_500));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "", "  ", "3", "s", "3 s", "3sec", "1.5s", "-1s", "3S", "1h 30m",
        ] {
            let err = parse_millis(bad).unwrap_err();
            assert!(
                err.contains("\"250ms\"") || err.contains("unknown unit"),
                "{bad}: {err}"
            );
        }
        assert!(parse_millis("99999999999999999999d")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_millis("999999999999999d")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_range("100ms..10s"), Ok((100, 10_000)));
        assert_eq!(parse_range("1s..=1m"), Ok((1_000, 60_000)));
        assert_eq!(parse_range(" 5s .. 1s "), Ok((5_000, 1_000)));
        assert!(parse_range("100ms-10s").unwrap_err().contains("base..cap"));
        assert!(parse_range("100..10s")
            .unwrap_err()
            .starts_with("has a base"));
        assert!(parse_range("1s..").unwrap_err().starts_with("has a cap"));
    }

    #[test]
    fn formatting() {
        assert_eq!(format_millis(150), "150ms");
        assert_eq!(format_millis(3_000), "3s");
        assert_eq!(format_millis(2_500), "2.5s");
        assert_eq!(format_millis(90_000), "1m 30s");
        assert_eq!(format_millis(86_400_000), "1d");
        assert_eq!(format_millis(93_600_000), "1d 2h");
        assert_eq!(format_millis(3_600_001), "1h 1ms");
    }
}
