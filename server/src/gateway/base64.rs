//! Base64 `bytes` fields in gateway requests, read as etcd 3.4's gateway reads them: its
//! jsonpb decodes bytes with Go's `base64.StdEncoding`, which skips `\r` and `\n` anywhere
//! (what `base64` and `openssl base64` print wraps lines at 76 characters) and ignores the
//! bits of the last symbol beyond the data (`YR==` is `a`). The generated mapping (pbjson)
//! refuses both; this module rewrites such strings into the form it accepts, before it runs.
//!
//! Invariants:
//! - GW-B64-1: a string under one of its request's bytes field names decodes to the bytes
//!   Go's `StdEncoding.DecodeString` gives it, `\r` and `\n` skipped and the last symbol's
//!   extra bits ignored; what the generated mapping accepts besides (no `=` padding, the
//!   URL-safe alphabet) stays accepted, and what neither accepts is still refused by the
//!   mapping (code 3, HTTP 400).
//! - GW-B64-2: each request names its bytes fields ([`GatewayRequest::BYTES_FIELDS`]). For
//!   the KV, Watch and Auth requests kvd serves they are [`BYTES_FIELDS`]: `key` and
//!   `range_end` of Range, DeleteRange, Compare, WatchCreate, authpb's Permission
//!   (RoleGrantPermission's `perm`) and RoleRevokePermission, `value` of Put and Compare; the
//!   Auth requests' `name` is a string and is not read as base64. For the Lock and Election
//!   requests they are [`CONCURRENCY_BYTES_FIELDS`]: `name`, `key` (Unlock's, a LeaderKey's)
//!   and `value` (Campaign's, Proclaim's). No other field of a request has one of its names,
//!   so each name is a bytes field wherever it appears in that request (as GW-ENUM-2 does
//!   for enums).
//!
//! Contact points: `gateway::decode_value` (and so every route and stream) calls
//! [`as_go_reads_bytes`] with the request's fields before the generated decoding.

use serde_json::Value;

use super::GatewayRequest;
use crate::pb::{v3electionpb, v3lockpb};

/// The JSON names (proto and lowerCamelCase) of the KV, Watch and Auth requests' bytes
/// fields (GW-B64-2).
pub const BYTES_FIELDS: [&str; 4] = ["key", "range_end", "rangeEnd", "value"];

/// The JSON names of the Lock and Election requests' bytes fields (GW-B64-2).
pub const CONCURRENCY_BYTES_FIELDS: [&str; 3] = ["name", "key", "value"];

/// Declares the Lock and Election requests: no enum fields, [`CONCURRENCY_BYTES_FIELDS`].
macro_rules! concurrency_requests {
    ($($request:ty),* $(,)?) => {
        $(impl GatewayRequest for $request {
            const BYTES_FIELDS: &'static [&'static str] = &CONCURRENCY_BYTES_FIELDS;
        })*
    };
}

concurrency_requests!(
    v3lockpb::LockRequest,
    v3lockpb::UnlockRequest,
    v3electionpb::CampaignRequest,
    v3electionpb::ProclaimRequest,
    v3electionpb::LeaderRequest,
    v3electionpb::ResignRequest,
);

/// Rewrites, in place, every string under one of `fields` at any depth of `value` into
/// base64 the generated mapping decodes to what Go decodes it to (GW-B64-1).
pub fn as_go_reads_bytes(value: &mut Value, fields: &[&str]) {
    match value {
        Value::Object(map) => {
            for (key, field) in map.iter_mut() {
                match field {
                    Value::String(text) if fields.contains(&key.as_str()) => {
                        if let Some(rewritten) = as_go_reads(text) {
                            *text = rewritten;
                        }
                    }
                    other => as_go_reads_bytes(other, fields),
                }
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| as_go_reads_bytes(item, fields)),
        _ => {}
    }
}

/// Returns `text` without `\r` and `\n` and with the extra bits of its last symbol cleared,
/// or `None` when it needs neither. Anything else (invalid symbols, lengths, padding) is
/// left for the generated mapping to judge.
fn as_go_reads(text: &str) -> Option<String> {
    let mut out: Vec<u8> = text
        .bytes()
        .filter(|b| !matches!(b, b'\r' | b'\n'))
        .collect();
    let data = out.len() - out.iter().rev().take_while(|&&b| b == b'=').count();
    // A last group of 2 symbols carries 8 bits of 12, of 3 symbols 16 bits of 18.
    let kept = match data % 4 {
        2 => 0b11_0000,
        3 => 0b11_1100,
        _ => 0b11_1111,
    };
    if let Some(last) = data.checked_sub(1)
        && let Some(symbol) = symbol_value(out[last])
        && symbol & kept != symbol
    {
        // The cleared values (multiples of 4 up to 60) are letters or digits, the same
        // symbol in the standard and the URL-safe alphabet.
        out[last] = STANDARD[usize::from(symbol & kept)];
    } else if out.len() == text.len() {
        return None;
    }
    // Only ASCII bytes were removed or replaced, so `out` is still UTF-8.
    String::from_utf8(out).ok()
}

/// The standard base64 alphabet.
const STANDARD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Returns the value of a symbol of the standard or the URL-safe alphabet.
fn symbol_value(symbol: u8) -> Option<u8> {
    match symbol {
        b'A'..=b'Z' => Some(symbol - b'A'),
        b'a'..=b'z' => Some(symbol - b'a' + 26),
        b'0'..=b'9' => Some(symbol - b'0' + 52),
        b'+' | b'-' => Some(62),
        b'/' | b'_' => Some(63),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::decode;
    use crate::pb::authpb;
    use crate::pb::etcdserverpb as pb;
    use crate::pb::etcdserverpb::request_op::Request;
    use crate::pb::etcdserverpb::watch_request::RequestUnion;

    fn rewritten(text: &str) -> Option<String> {
        as_go_reads(text)
    }

    #[test]
    fn strings_are_rewritten_only_where_go_reads_them_differently() {
        assert_eq!(rewritten("YQ=="), None);
        assert_eq!(rewritten("YQ"), None);
        assert_eq!(rewritten(""), None);
        assert_eq!(rewritten("YR=="), Some("YQ==".into()));
        assert_eq!(rewritten("YR"), Some("YQ".into()));
        assert_eq!(rewritten("bGt="), Some("bGs=".into()));
        assert_eq!(rewritten("bG_"), Some("bG8".into()));
        assert_eq!(rewritten("bGs=\n"), Some("bGs=".into()));
        assert_eq!(rewritten("bG\r\ns="), Some("bGs=".into()));
        assert_eq!(rewritten("YQ=\n="), Some("YQ==".into()));
        assert_eq!(rewritten("Y\nR=="), Some("YQ==".into()));
        assert_eq!(rewritten("\n"), Some(String::new()));
        // Invalid base64 is left for the mapping to refuse.
        assert_eq!(rewritten("Y!=="), None);
        assert_eq!(rewritten("Y"), None);
        assert_eq!(rewritten("é"), None);
    }

    #[test]
    fn every_requests_bytes_fields_read_as_go_reads_them() {
        let range: pb::RangeRequest =
            decode(br#"{"key":"YR==","range_end":"bGt=\n","limit":"1"}"#).unwrap();
        assert_eq!(
            (&range.key[..], &range.range_end[..]),
            (&b"a"[..], &b"lk"[..])
        );
        let range: pb::RangeRequest = decode(br#"{"key":"bG\r\ns=","rangeEnd":"YR"}"#).unwrap();
        assert_eq!(
            (&range.key[..], &range.range_end[..]),
            (&b"lk"[..], &b"a"[..])
        );
        let value = [b'v'; 100];
        let wrapped = "dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2\\ndnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dg==\\n";
        let put: pb::PutRequest =
            decode(format!(r#"{{"key":"YR==","value":"{wrapped}"}}"#).as_bytes()).unwrap();
        assert_eq!((&put.key[..], &put.value[..]), (&b"a"[..], &value[..]));
        let delete: pb::DeleteRangeRequest =
            decode(br#"{"key":"YR==","range_end":"Yg==\r\n"}"#).unwrap();
        assert_eq!(
            (&delete.key[..], &delete.range_end[..]),
            (&b"a"[..], &b"b"[..])
        );
        let txn: pb::TxnRequest = decode(
            br#"{"compare":[{"key":"YR==","range_end":"Yh==","target":"VALUE","value":"Y\nh=="}],
                "success":[{"request_put":{"key":"YR==","value":"Yh=="}}],
                "failure":[{"request_txn":{"success":[{"request_delete_range":{"key":"YR=="}}]}}]}"#,
        )
        .unwrap();
        let compare = &txn.compare[0];
        assert_eq!(
            (&compare.key[..], &compare.range_end[..]),
            (&b"a"[..], &b"b"[..])
        );
        assert_eq!(
            compare.target_union,
            Some(pb::compare::TargetUnion::Value(bytes::Bytes::from_static(
                b"b"
            )))
        );
        let Some(Request::RequestPut(put)) = &txn.success[0].request else {
            panic!("{txn:?}")
        };
        assert_eq!((&put.key[..], &put.value[..]), (&b"a"[..], &b"b"[..]));
        let Some(Request::RequestTxn(nested)) = &txn.failure[0].request else {
            panic!("{txn:?}")
        };
        let Some(Request::RequestDeleteRange(delete)) = &nested.success[0].request else {
            panic!("{nested:?}")
        };
        assert_eq!(&delete.key[..], b"a");
        let watch: pb::WatchRequest =
            decode(br#"{"create_request":{"key":"YR==\n","range_end":"Yh=="}}"#).unwrap();
        let Some(RequestUnion::CreateRequest(create)) = &watch.request_union else {
            panic!("{watch:?}")
        };
        assert_eq!(
            (&create.key[..], &create.range_end[..]),
            (&b"a"[..], &b"b"[..])
        );
        let grant: pb::AuthRoleGrantPermissionRequest = decode(
            br#"{"name":"YR==","perm":{"permType":"READ","key":"YR==","range_end":"Yh=="}}"#,
        )
        .unwrap();
        assert_eq!(grant.name, "YR==", "a string field is not bytes");
        assert_eq!(
            grant.perm,
            Some(authpb::Permission {
                perm_type: 0,
                key: bytes::Bytes::from_static(b"a"),
                range_end: bytes::Bytes::from_static(b"b"),
            })
        );
        let revoke: pb::AuthRoleRevokePermissionRequest =
            decode(br#"{"role":"YR==\n","key":"YR==","range_end":"Yh=="}"#).unwrap();
        assert_eq!(revoke.role, "YR==\n", "a string field is not bytes");
        assert_eq!(
            (&revoke.key[..], &revoke.range_end[..]),
            (&b"a"[..], &b"b"[..])
        );
    }

    #[test]
    fn lock_and_election_names_read_as_go_reads_them() {
        let lock: v3lockpb::LockRequest = decode(br#"{"name":"YR==\n","lease":"7"}"#).unwrap();
        assert_eq!((&lock.name[..], lock.lease), (&b"a"[..], 7));
        let unlock: v3lockpb::UnlockRequest = decode(br#"{"key":"Yh=="}"#).unwrap();
        assert_eq!(&unlock.key[..], b"b");
        let campaign: v3electionpb::CampaignRequest =
            decode(br#"{"name":"YR","value":"Y\r\nh=="}"#).unwrap();
        assert_eq!(
            (&campaign.name[..], &campaign.value[..]),
            (&b"a"[..], &b"b"[..])
        );
        let leader: v3electionpb::LeaderRequest = decode(br#"{"name":"bGt="}"#).unwrap();
        assert_eq!(&leader.name[..], b"lk");
        let proclaim: v3electionpb::ProclaimRequest =
            decode(br#"{"leader":{"name":"YR==","key":"Yh==","rev":"3"},"value":"bGt="}"#).unwrap();
        let leader = proclaim.leader.expect("the leader key");
        assert_eq!(
            (&leader.name[..], &leader.key[..], leader.rev),
            (&b"a"[..], &b"b"[..], 3)
        );
        assert_eq!(&proclaim.value[..], b"lk");
        let resign: v3electionpb::ResignRequest =
            decode(br#"{"leader":{"name":"YR==\n","key":"Yh=="}}"#).unwrap();
        let leader = resign.leader.expect("the leader key");
        assert_eq!((&leader.name[..], &leader.key[..]), (&b"a"[..], &b"b"[..]));
        let error = decode::<v3lockpb::LockRequest>(br#"{"name":"Y!=="}"#).unwrap_err();
        assert_eq!(error.code(), tonic::Code::InvalidArgument, "{error:?}");
    }

    #[test]
    fn invalid_base64_is_still_refused() {
        for body in [
            r#"{"key":"Y!=="}"#,
            r#"{"key":"Y"}"#,
            r#"{"key":"YQ==YQ=="}"#,
            r#"{"key":"Y\tQ=="}"#,
            r#"{"key":"Y Q=="}"#,
        ] {
            let error = decode::<pb::RangeRequest>(body.as_bytes()).unwrap_err();
            assert_eq!(error.code(), tonic::Code::InvalidArgument, "{body}");
        }
    }
}
