//! Enum numbers etcd does not define, in gateway requests: etcd's gateway passes any number
//! on to the gRPC service (protobuf enums are open), while the generated JSON mapping knows
//! only the defined values. This module carries the numbers past it.
//!
//! Invariants:
//! - GW-ENUM-1: a request's enum fields given as numbers that fit an `i32` reach the service
//!   as those numbers, defined or not, so the gRPC semantics of undefined values (CONV-2)
//!   apply to gateway requests too. Names are left to the generated mapping (an unknown
//!   name is refused, as etcd refuses it).
//! - GW-ENUM-2: only the enum fields of the requests kvd serves are carried ([`ENUM_FIELDS`]:
//!   Range's sort order and target, Compare's result and target, a watch's filters, Alarm's
//!   action and type, at any depth of a Txn); each name is an enum field wherever it appears
//!   in those requests.
//!
//! Contact points: `gateway::decode` (and so the streams) call [`without_enum_numbers`] before
//! the generated decoding and [`GatewayRequest::restore`] after it.

use serde_json::Value;

use super::GatewayRequest;
use crate::pb::etcdserverpb as pb;
use crate::pb::etcdserverpb::request_op::Request;
use crate::pb::etcdserverpb::watch_request::RequestUnion;

/// The JSON names (proto and lowerCamelCase) of the enum fields carried (GW-ENUM-2).
pub const ENUM_FIELDS: [&str; 9] = [
    "sort_order",
    "sortOrder",
    "sort_target",
    "sortTarget",
    "result",
    "target",
    "filters",
    "action",
    "alarm",
];

/// Returns `value` with every number that fits an `i32` under an enum field name replaced
/// by 0, which the generated mapping accepts (GW-ENUM-1).
pub fn without_enum_numbers(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, field)| {
                    let field = if ENUM_FIELDS.contains(&key.as_str()) {
                        zero_numbers(field)
                    } else {
                        without_enum_numbers(field)
                    };
                    (key.clone(), field)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_enum_numbers).collect()),
        other => other.clone(),
    }
}

fn zero_numbers(value: &Value) -> Value {
    match value {
        Value::Array(items) => Value::Array(items.iter().map(zero_numbers).collect()),
        v if as_i32(v).is_some() => Value::from(0),
        other => other.clone(),
    }
}

/// Returns a JSON number that fits an `i32` (a string is a name, left to the mapping).
fn as_i32(value: &Value) -> Option<i32> {
    value.as_i64().and_then(|n| i32::try_from(n).ok())
}

/// Returns the field of `json` under its proto name or its lowerCamelCase name.
fn field<'a>(json: &'a Value, proto: &str, camel: &str) -> Option<&'a Value> {
    json.get(proto).or_else(|| json.get(camel))
}

/// Sets `target` to the number under `proto`/`camel` in `json`, if there is one.
fn restore_number(target: &mut i32, json: &Value, proto: &str, camel: &str) {
    if let Some(n) = field(json, proto, camel).and_then(as_i32) {
        *target = n;
    }
}

impl GatewayRequest for pb::RangeRequest {
    fn restore(&mut self, json: &Value) {
        restore_number(&mut self.sort_order, json, "sort_order", "sortOrder");
        restore_number(&mut self.sort_target, json, "sort_target", "sortTarget");
    }
}

impl GatewayRequest for pb::TxnRequest {
    fn restore(&mut self, json: &Value) {
        if let Some(compares) = json.get("compare").and_then(Value::as_array) {
            for (compare, json) in self.compare.iter_mut().zip(compares) {
                restore_number(&mut compare.result, json, "result", "result");
                restore_number(&mut compare.target, json, "target", "target");
            }
        }
        for (ops, name) in [
            (&mut self.success, "success"),
            (&mut self.failure, "failure"),
        ] {
            let Some(items) = json.get(name).and_then(Value::as_array) else {
                continue;
            };
            for (op, json) in ops.iter_mut().zip(items) {
                match &mut op.request {
                    Some(Request::RequestRange(range)) => {
                        if let Some(json) = field(json, "request_range", "requestRange") {
                            range.restore(json);
                        }
                    }
                    Some(Request::RequestTxn(txn)) => {
                        if let Some(json) = field(json, "request_txn", "requestTxn") {
                            txn.restore(json);
                        }
                    }
                    Some(Request::RequestPut(_) | Request::RequestDeleteRange(_)) | None => {}
                }
            }
        }
    }
}

impl GatewayRequest for pb::WatchRequest {
    fn restore(&mut self, json: &Value) {
        let Some(RequestUnion::CreateRequest(create)) = &mut self.request_union else {
            return;
        };
        let Some(filters) = field(json, "create_request", "createRequest")
            .and_then(|c| c.get("filters"))
            .and_then(Value::as_array)
        else {
            return;
        };
        for (filter, json) in create.filters.iter_mut().zip(filters) {
            if let Some(n) = as_i32(json) {
                *filter = n;
            }
        }
    }
}

impl GatewayRequest for pb::AlarmRequest {
    fn restore(&mut self, json: &Value) {
        restore_number(&mut self.action, json, "action", "action");
        restore_number(&mut self.alarm, json, "alarm", "alarm");
    }
}

/// Declares requests without enum fields kvd serves (GW-ENUM-2) whose bytes fields are the
/// default ones, `base64::BYTES_FIELDS` (the Lock and Election requests are declared in
/// `base64`).
macro_rules! no_raw_enums {
    ($($request:ty),* $(,)?) => {
        $(impl GatewayRequest for $request {})*
    };
}

no_raw_enums!(
    pb::PutRequest,
    pb::DeleteRangeRequest,
    pb::CompactionRequest,
    pb::LeaseGrantRequest,
    pb::LeaseRevokeRequest,
    pb::LeaseKeepAliveRequest,
    pb::LeaseTimeToLiveRequest,
    pb::LeaseLeasesRequest,
    pb::MemberAddRequest,
    pb::MemberRemoveRequest,
    pb::MemberUpdateRequest,
    pb::MemberListRequest,
    pb::MemberPromoteRequest,
    pb::StatusRequest,
    pb::DefragmentRequest,
    pb::HashRequest,
    pb::HashKvRequest,
    pb::SnapshotRequest,
    pb::MoveLeaderRequest,
    pb::DowngradeRequest,
    pb::AuthEnableRequest,
    pb::AuthDisableRequest,
    pb::AuthStatusRequest,
    pb::AuthenticateRequest,
    pb::AuthUserAddRequest,
    pb::AuthUserGetRequest,
    pb::AuthUserListRequest,
    pb::AuthUserDeleteRequest,
    pb::AuthUserChangePasswordRequest,
    pb::AuthUserGrantRoleRequest,
    pb::AuthUserRevokeRoleRequest,
    pb::AuthRoleAddRequest,
    pb::AuthRoleGetRequest,
    pb::AuthRoleListRequest,
    pb::AuthRoleDeleteRequest,
    pb::AuthRoleGrantPermissionRequest,
    pb::AuthRoleRevokePermissionRequest,
);

#[cfg(test)]
mod tests {
    use super::*;

    fn decode<T: GatewayRequest + serde::de::DeserializeOwned>(json: &str) -> T {
        let value: Value = serde_json::from_str(json).unwrap();
        let mut request: T = serde_json::from_value(without_enum_numbers(&value)).unwrap();
        request.restore(&value);
        request
    }

    #[test]
    fn undefined_enum_numbers_reach_the_service() {
        let txn: pb::TxnRequest = decode(
            r#"{"compare":[{"key":"YQ==","target":8,"result":9}],
               "success":[{"request_txn":{"compare":[{"key":"YQ==","target":1,"result":"GREATER"}]}},
                          {"requestRange":{"key":"YQ==","sortOrder":7,"sort_target":"MOD"}}]}"#,
        );
        assert_eq!((txn.compare[0].target, txn.compare[0].result), (8, 9));
        let Some(Request::RequestTxn(nested)) = &txn.success[0].request else {
            panic!("{txn:?}")
        };
        assert_eq!((nested.compare[0].target, nested.compare[0].result), (1, 1));
        let Some(Request::RequestRange(range)) = &txn.success[1].request else {
            panic!("{txn:?}")
        };
        assert_eq!((range.sort_order, range.sort_target), (7, 3));
        let watch: pb::WatchRequest =
            decode(r#"{"create_request":{"key":"YQ==","filters":[5,"NODELETE"]}}"#);
        let Some(RequestUnion::CreateRequest(create)) = &watch.request_union else {
            panic!("{watch:?}")
        };
        assert_eq!(create.filters, [5, 1]);
        let alarm: pb::AlarmRequest = decode(r#"{"action":"ACTIVATE","alarm":7}"#);
        assert_eq!((alarm.action, alarm.alarm), (1, 7));
    }
}
