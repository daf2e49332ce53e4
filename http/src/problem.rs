//! Problem details (RFC 9457): the `application/problem+json` bodies of the layers' refusals.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde::Serialize;

/// An RFC 9457 problem: what went wrong, for the client, as `application/problem+json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// A URI naming the kind of problem: `urn:samekey:problem:<slug>`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What happened to this request, and what to do.
    pub detail: String,
    /// Extension members (RFC 9457 §3.2): more about this kind of problem, beside the standard ones.
    #[serde(flatten)]
    pub extensions: BTreeMap<String, serde_json::Value>,
}

impl Problem {
    /// A problem of `status` with a title and a detail; its type is `urn:samekey:problem:<slug>`.
    pub fn new(status: StatusCode, slug: &str, title: &str, detail: impl Into<String>) -> Problem {
        Problem {
            kind: format!("urn:samekey:problem:{slug}"),
            title: title.to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            extensions: BTreeMap::new(),
        }
    }

    /// With the extension member `name` (RFC 9457 §3.2), e.g. `.with("first_status", 200)`.
    pub fn with(mut self, name: &str, value: impl Into<serde_json::Value>) -> Problem {
        self.extensions.insert(name.to_owned(), value.into());
        self
    }

    /// The response carrying it.
    pub fn response<B: From<Bytes>>(&self) -> Response<B> {
        let body = serde_json::to_vec(self).unwrap_or_default();
        let mut response = Response::new(B::from(Bytes::from(body)));
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}
