//! [`ShortLabel`]: the short texts of a callId (its prefix, its node) and of a key (its scope), cheap to
//! clone: borrowed for the whole program when the macro's constants give them, shared otherwise.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A short text label (callId prefix, node name, key scope) that is cheap to clone.
#[derive(Clone)]
pub struct ShortLabel(LabelRepr);

#[derive(Clone)]
enum LabelRepr {
    Static(&'static str),
    Shared(Arc<str>),
}

impl ShortLabel {
    /// A label borrowed for the whole program, as the macro's constants are. No allocation.
    pub const fn from_static(s: &'static str) -> ShortLabel {
        ShortLabel(LabelRepr::Static(s))
    }

    /// The label's text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            LabelRepr::Static(s) => s,
            LabelRepr::Shared(s) => s,
        }
    }
}

impl From<&str> for ShortLabel {
    fn from(s: &str) -> ShortLabel {
        ShortLabel(LabelRepr::Shared(Arc::from(s)))
    }
}

impl From<String> for ShortLabel {
    fn from(s: String) -> ShortLabel {
        ShortLabel(LabelRepr::Shared(Arc::from(s)))
    }
}

impl PartialEq for ShortLabel {
    fn eq(&self, other: &ShortLabel) -> bool {
        self.as_str() == other.as_str()
    }
}
impl Eq for ShortLabel {}
impl Hash for ShortLabel {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}
impl fmt::Debug for ShortLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}
impl fmt::Display for ShortLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
