//! etcd's `RangeResponse`, written by hand so that a Range's key-values can go out in the
//! wire form the engine wrote them in (`kvd::EncodedRange`, the engine's WIRE-1), with no
//! key-value structs in between. `build.rs` maps `.etcdserverpb.RangeResponse` here
//! (BUILD-6); `pb::etcdserverpb::RangeResponse` names this type.
//!
//! Why: a Range of 1,000 keys decoded every record into a key-value, converted it to the
//! generated protobuf type and encoded that (prost computes each key-value's length twice):
//! about a third of the server's samples per such Range in a profile. Written in one pass,
//! the server's CPU per Range of 1,000 keys fell by a fifth (`docs/benchmarks-server.md`).
//!
//! Invariants:
//! - RWIRE-1: the bytes on the wire are those of the generated message with the same
//!   key-values: `header` (1), every key-value of `kvs` (2) followed by those already in
//!   `encoded_kvs`, `more` (3), `count` (4), zero fields left out. A message read from the
//!   wire holds its key-values in `kvs`; `encoded_kvs` is never filled by decoding.
//! - RWIRE-2: the JSON gateway's form is the generated one (BUILD-3): the key-values of
//!   `encoded_kvs` are decoded and shown in `kvs` after the others.
//!
//! Contact points: `kv.rs` (Range answers with `encoded_kvs`), `convert.rs` (everything else
//! answers with `kvs`), the gateway (serde).

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use prost::encoding::{DecodeContext, WireType};

use crate::pb::etcdserverpb::ResponseHeader;
use crate::pb::mvccpb::KeyValue;

/// etcd's `RangeResponse`, with room for key-values already encoded (RWIRE-1).
#[derive(Clone, PartialEq, Default, Debug)]
pub struct RangeResponse {
    /// The response header.
    pub header: Option<ResponseHeader>,
    /// Key-values as messages; encoded before `encoded_kvs`.
    pub kvs: Vec<KeyValue>,
    /// More keys matched than the limit allowed.
    pub more: bool,
    /// Keys in the range at the read revision, before filters and limit.
    pub count: i64,
    /// Key-values in wire form: whole `kvs` (field 2) entries, as `kvd::EncodedRange::kvs`.
    pub encoded_kvs: Bytes,
}

const HEADER: u32 = 1;
const KVS: u32 = 2;
const MORE: u32 = 3;
const COUNT: u32 = 4;

impl RangeResponse {
    /// Returns every key-value, those of `encoded_kvs` decoded (RWIRE-2).
    pub fn all_kvs(&self) -> Result<Vec<KeyValue>, prost::DecodeError> {
        // The entries are `kvs` fields: read as a message, they are its key-values.
        let encoded = RangeResponse::decode(self.encoded_kvs.clone())?;
        let mut all = self.kvs.clone();
        all.extend(encoded.kvs);
        Ok(all)
    }
}

impl Message for RangeResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if let Some(header) = &self.header {
            prost::encoding::message::encode(HEADER, header, buf);
        }
        prost::encoding::message::encode_repeated(KVS, &self.kvs, buf);
        buf.put_slice(&self.encoded_kvs);
        if self.more {
            prost::encoding::bool::encode(MORE, &self.more, buf);
        }
        if self.count != 0 {
            prost::encoding::int64::encode(COUNT, &self.count, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match tag {
            HEADER => prost::encoding::message::merge(
                wire_type,
                self.header.get_or_insert_with(ResponseHeader::default),
                buf,
                ctx,
            ),
            KVS => prost::encoding::message::merge_repeated(wire_type, &mut self.kvs, buf, ctx),
            MORE => prost::encoding::bool::merge(wire_type, &mut self.more, buf, ctx),
            COUNT => prost::encoding::int64::merge(wire_type, &mut self.count, buf, ctx),
            _ => prost::encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let header = self
            .header
            .as_ref()
            .map_or(0, |h| prost::encoding::message::encoded_len(HEADER, h));
        let more = if self.more {
            prost::encoding::bool::encoded_len(MORE, &self.more)
        } else {
            0
        };
        let count = if self.count != 0 {
            prost::encoding::int64::encoded_len(COUNT, &self.count)
        } else {
            0
        };
        header
            + prost::encoding::message::encoded_len_repeated(KVS, &self.kvs)
            + self.encoded_kvs.len()
            + more
            + count
    }

    fn clear(&mut self) {
        *self = RangeResponse::default();
    }
}

/// The generated form, for serde (RWIRE-2): what the gateway's JSON shows, with the
/// key-values of `encoded_kvs` decoded into `kvs`.
impl serde::Serialize for RangeResponse {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeStruct};
        let kvs = self.all_kvs().map_err(S::Error::custom)?;
        let len = usize::from(self.header.is_some())
            + usize::from(!kvs.is_empty())
            + usize::from(self.more)
            + usize::from(self.count != 0);
        let mut out = serializer.serialize_struct("etcdserverpb.RangeResponse", len)?;
        if let Some(header) = &self.header {
            out.serialize_field("header", header)?;
        }
        if !kvs.is_empty() {
            out.serialize_field("kvs", &kvs)?;
        }
        if self.more {
            out.serialize_field("more", &self.more)?;
        }
        if self.count != 0 {
            // proto3's JSON mapping writes 64-bit integers as strings.
            out.serialize_field("count", self.count.to_string().as_str())?;
        }
        out.end()
    }
}

impl<'de> serde::Deserialize<'de> for RangeResponse {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct(
            "etcdserverpb.RangeResponse",
            &["header", "kvs", "more", "count"],
            Visitor,
        )
    }
}

struct Visitor;

impl<'de> serde::de::Visitor<'de> for Visitor {
    type Value = RangeResponse;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("struct etcdserverpb.RangeResponse")
    }

    fn visit_map<M: serde::de::MapAccess<'de>>(
        self,
        mut map: M,
    ) -> Result<RangeResponse, M::Error> {
        use serde::de::Error;
        let mut out = RangeResponse::default();
        let mut seen = [false; 4];
        while let Some(name) = map.next_key::<String>()? {
            let field = match name.as_str() {
                "header" => 0,
                "kvs" => 1,
                "more" => 2,
                "count" => 3,
                // BUILD-3: unknown fields are ignored.
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    continue;
                }
            };
            if std::mem::replace(&mut seen[field], true) {
                return Err(M::Error::custom(format!("duplicate field `{name}`")));
            }
            match field {
                0 => out.header = map.next_value()?,
                1 => {
                    out.kvs = map
                        .next_value::<Option<Vec<KeyValue>>>()?
                        .unwrap_or_default()
                }
                2 => out.more = map.next_value::<Option<bool>>()?.unwrap_or_default(),
                _ => {
                    out.count = map
                        .next_value::<Option<pbjson::private::NumberDeserialize<i64>>>()?
                        .map_or(0, |n| n.0);
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn key_value(i: i64) -> KeyValue {
        KeyValue {
            key: Bytes::from(format!("k{i}")),
            create_revision: i,
            mod_revision: i + 1,
            version: 1,
            value: Bytes::from(vec![b'v'; 200]),
            lease: 0,
        }
    }

    /// The engine's wire form of `kvs` (WIRE-1), from a store holding them.
    fn engine_encoded(kvs: &[KeyValue]) -> Bytes {
        let dir = tempfile::tempdir().unwrap();
        let engine = kvd::Engine::open(dir.path(), kvd::Config::default()).unwrap();
        for kv in kvs {
            engine
                .put(kvd::PutRequest::new(kv.key.clone(), kv.value.clone()))
                .unwrap();
        }
        let prepared = engine
            .prepare_range(&kvd::RangeRequest::prefix("k"))
            .unwrap();
        Bytes::from(prepared.finish_wire().unwrap().kvs)
    }

    #[test]
    fn encoded_key_values_go_out_as_the_same_messages_would() {
        // As the engine stores them: key k{i} written at revision i + 1, created there.
        let kvs: Vec<KeyValue> = (1..=3)
            .map(|i| KeyValue {
                create_revision: i + 1,
                ..key_value(i)
            })
            .collect();
        let header = Some(ResponseHeader {
            revision: 4,
            ..ResponseHeader::default()
        });
        let as_messages = RangeResponse {
            header,
            kvs: kvs.clone(),
            more: true,
            count: 3,
            encoded_kvs: Bytes::new(),
        };
        let as_wire = RangeResponse {
            header,
            kvs: Vec::new(),
            more: true,
            count: 3,
            encoded_kvs: engine_encoded(&kvs),
        };
        assert_eq!(as_wire.encoded_len(), as_wire.encode_to_vec().len());
        assert_eq!(as_wire.encode_to_vec(), as_messages.encode_to_vec());
        // Read back, the key-values are messages again (RWIRE-1).
        let decoded = RangeResponse::decode(&as_wire.encode_to_vec()[..]).unwrap();
        assert_eq!(decoded, as_messages);
        assert_eq!(as_wire.all_kvs().unwrap(), kvs);
    }

    #[test]
    fn json_shows_encoded_key_values_as_the_generated_form_does() {
        let kvs = vec![key_value(1)];
        let mut encoded = Vec::new();
        prost::encoding::message::encode_repeated(KVS, &kvs, &mut encoded);
        let as_wire = RangeResponse {
            count: 7,
            encoded_kvs: Bytes::from(encoded),
            ..RangeResponse::default()
        };
        let json = serde_json::to_value(&as_wire).unwrap();
        assert_eq!(json["count"], "7");
        assert_eq!(json["kvs"][0]["key"], "azE=");
        assert_eq!(json["kvs"][0]["create_revision"], "1");
        assert!(json.get("more").is_none(), "false is left out: {json}");
        let back: RangeResponse = serde_json::from_value(json).unwrap();
        assert_eq!(back.kvs, kvs);
        assert_eq!(back.count, 7);
        let empty: RangeResponse = serde_json::from_str(r#"{"other":1}"#).unwrap();
        assert_eq!(empty, RangeResponse::default());
        assert!(serde_json::from_str::<RangeResponse>(r#"{"count":"1","count":"2"}"#).is_err());
    }

    #[test]
    fn a_malformed_encoded_entry_is_an_error_not_a_panic() {
        let bad = RangeResponse {
            encoded_kvs: Bytes::from_static(&[0x1a, 0x01, 0x00]),
            ..RangeResponse::default()
        };
        assert!(bad.all_kvs().is_err());
        assert!(serde_json::to_value(&bad).is_err());
    }
}
