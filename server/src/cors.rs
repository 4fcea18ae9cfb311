//! etcd's `--cors`: the CORS headers of the client port's HTTP answers (the JSON gateway,
//! `/health`, `/version`, `/metrics`, the operator API), and the answer to a preflight.
//!
//! Owns: which origins are allowed and the headers sent.
//!
//! Invariants:
//! - CORS-1: as etcd 3.4's access controller: when `*` is allowed (the default, and an
//!   empty list), every HTTP answer carries `Access-Control-Allow-Origin: *`; otherwise an
//!   answer to a request whose `Origin` is in the list carries that origin. Either way it
//!   carries etcd's `Access-Control-Allow-Methods` and `Access-Control-Allow-Headers`.
//! - CORS-2: an `OPTIONS` request is answered 200 with an empty body, whatever its path, as
//!   etcd answers it; no route sees it.
//! - CORS-3: gRPC requests are left alone (etcd's gRPC server sends no CORS headers): they
//!   never reach this layer, because `server::http` sends a request with a gRPC content
//!   type straight to the gRPC services (HTTP-6).
//!
//! Contact points: `server::http` layers [`cors`] over the router; `ServerConfig::cors`.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use kvd::sync::Arc;

/// etcd's `Access-Control-Allow-Methods`.
pub const ALLOW_METHODS: &str = "POST, GET, OPTIONS, PUT, DELETE";
/// etcd's `Access-Control-Allow-Headers`.
pub const ALLOW_HEADERS: &str = "accept, content-type, authorization";
/// The `--cors` default: every origin.
pub const CORS_DEFAULT: &str = "*";

/// The origins allowed (CORS-1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cors {
    allow_all: bool,
    origins: Vec<String>,
}

impl Cors {
    /// Returns the policy for `--cors`'s list: empty or holding `*` allows every origin.
    pub fn new(origins: &[String]) -> Cors {
        let origins: Vec<String> = origins
            .iter()
            .map(|o| o.trim().to_owned())
            .filter(|o| !o.is_empty())
            .collect();
        Cors {
            allow_all: origins.is_empty() || origins.iter().any(|o| o == CORS_DEFAULT),
            origins,
        }
    }

    /// Returns the `Access-Control-Allow-Origin` for a request from `origin`, or `None` if
    /// the answer gets no CORS headers.
    fn allowed(&self, origin: Option<&str>) -> Option<String> {
        if self.allow_all {
            return Some(CORS_DEFAULT.to_owned());
        }
        let origin = origin?;
        self.origins
            .iter()
            .any(|o| o == origin)
            .then(|| origin.to_owned())
    }
}

/// The CORS layer (CORS-1..3).
pub async fn cors(State(policy): State<Arc<Cors>>, request: Request, next: Next) -> Response {
    let origin = request
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let allowed = policy.allowed(origin.as_deref());
    let mut response = if request.method() == Method::OPTIONS {
        StatusCode::OK.into_response()
    } else {
        next.run(request).await
    };
    if let Some(allowed) = allowed.and_then(|a| HeaderValue::from_str(&a).ok()) {
        let headers = response.headers_mut();
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(ALLOW_METHODS),
        );
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allowed);
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOW_HEADERS),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_and_an_empty_list_allow_every_origin() {
        for list in [vec!["*".to_owned()], vec![], vec![" ".to_owned()]] {
            assert_eq!(Cors::new(&list).allowed(None).as_deref(), Some("*"));
        }
    }

    #[test]
    fn a_list_allows_only_its_origins() {
        let cors = Cors::new(&["http://a.example".to_owned(), "http://b.example".to_owned()]);
        assert_eq!(
            cors.allowed(Some("http://b.example")).as_deref(),
            Some("http://b.example")
        );
        assert_eq!(cors.allowed(Some("http://c.example")), None);
        assert_eq!(cors.allowed(None), None);
    }
}
