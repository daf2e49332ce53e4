//! [`Label`]: the short texts of a callId (its prefix, its node) and of a key (its scope), cheap to
//! clone: borrowed for the whole program when the macro's constants give them, shared otherwise.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A short text label (callId prefix, node name, key scope) that is cheap to clone.
#[derive(Clone)]
pub struct Label(LabelRepr);

#[derive(Clone)]
enum LabelRepr {
    Static(&'static str),
    Shared(Arc<str>),
}

impl Label {
    /// A label borrowed for the whole program, as the macro's constants are. No allocation.
    pub const fn from_static(s: &'static str) -> Label {
        Label(LabelRepr::Static(s))
    }

    /// The label's text.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            LabelRepr::Static(s) => s,
            LabelRepr::Shared(s) => s,
        }
    }
}

impl From<&str> for Label {
    fn from(s: &str) -> Label {
        Label(LabelRepr::Shared(Arc::from(s)))
    }
}

impl From<String> for Label {
    fn from(s: String) -> Label {
        Label(LabelRepr::Shared(Arc::from(s)))
    }
}

impl PartialEq for Label {
    fn eq(&self, other: &Label) -> bool {
        self.as_str() == other.as_str()
    }
}
impl Eq for Label {}
impl Hash for Label {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}
impl fmt::Debug for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}
impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
