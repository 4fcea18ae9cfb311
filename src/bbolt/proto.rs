//! The protobuf messages etcd stores in its buckets, encoded and decoded by hand (the engine
//! crate does not depend on a protobuf library): `mvccpb.KeyValue`, `leasepb.Lease`,
//! `etcdserverpb.AlarmMember`, `authpb.User` and `authpb.Role`.
//!
//! Encoding follows gogo's proto3 marshalling, which etcd's files hold: fields in number
//! order, zero and empty fields left out, int64 as the two's-complement varint. One
//! exception, as etcd 3.4.23 writes it: a User's `options` (field 4) is always present, as
//! `22 00` when it is empty.
//!
//! Invariants:
//! - PROTO-1: `decode_key_value(encode_key_value(kv)) == kv`.
//! - PROTO-2: the decoders are total: any bytes give a message or a [`BboltError`]; unknown
//!   fields of a known wire type are skipped, as protobuf readers do.
//!
//! Contact points: `bbolt::write` encodes, `bbolt::read` users decode.

use bytes::Bytes;

use super::{BboltError, invalid};
use crate::api::KeyValue;
use crate::auth::{Permission, PermissionType, Role, User};
use crate::codec::{put_bytes_field, put_int_field, put_varint};
use crate::mvcc::wire::KeyValueFields;

const WIRE_VARINT: u64 = 0;
const WIRE_FIXED64: u64 = 1;
const WIRE_BYTES: u64 = 2;
const WIRE_FIXED32: u64 = 5;

/// Appends the encoding of `kv`, etcd's `mvccpb.KeyValue` as its `key` bucket stores it, to
/// `out`.
pub fn encode_key_value(out: &mut Vec<u8>, kv: &KeyValue) {
    KeyValueFields::from(kv).put_message(out);
}

/// Returns the encoding of a `leasepb.Lease` {ID, TTL}.
pub fn encode_lease(id: i64, ttl: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(22);
    put_int_field(&mut out, 1, id);
    put_int_field(&mut out, 2, ttl);
    out
}

/// Returns the encoding of an `AlarmMember` {memberID, alarm}.
pub fn encode_alarm(member_id: u64, alarm: i32) -> Vec<u8> {
    let mut out = Vec::with_capacity(13);
    put_int_field(&mut out, 1, member_id as i64);
    put_int_field(&mut out, 2, i64::from(alarm));
    out
}

/// Returns the encoding of an `authpb.User` {name, password, roles, options{no_password}}.
pub fn encode_user(user: &User) -> Vec<u8> {
    let mut out = Vec::new();
    put_bytes_field(&mut out, 1, user.name.as_bytes());
    put_bytes_field(&mut out, 2, user.password_hash.as_bytes());
    for role in &user.roles {
        put_bytes_field(&mut out, 3, role.as_bytes());
    }
    let mut options = Vec::new();
    put_int_field(&mut options, 1, i64::from(user.no_password));
    put_varint(&mut out, (4 << 3) | WIRE_BYTES);
    put_varint(&mut out, options.len() as u64);
    out.extend_from_slice(&options);
    out
}

/// Returns the encoding of an `authpb.Role` {name, keyPermission{permType, key, range_end}}.
pub fn encode_role(role: &Role) -> Vec<u8> {
    let mut out = Vec::new();
    put_bytes_field(&mut out, 1, role.name.as_bytes());
    for perm in &role.permissions {
        let mut inner = Vec::new();
        put_int_field(&mut inner, 1, i64::from(perm.perm_type.number()));
        put_bytes_field(&mut inner, 2, &perm.key);
        put_bytes_field(&mut inner, 3, &perm.range_end);
        put_varint(&mut out, (2 << 3) | WIRE_BYTES);
        put_varint(&mut out, inner.len() as u64);
        out.extend_from_slice(&inner);
    }
    out
}

/// One field read from a message.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Other,
}

/// A cursor over a message's bytes (PROTO-2).
struct Fields<'a> {
    bytes: &'a [u8],
    what: &'static str,
}

impl<'a> Fields<'a> {
    fn varint(&mut self) -> Result<u64, BboltError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let (&b, rest) = self
                .bytes
                .split_first()
                .ok_or_else(|| invalid(format!("{}: truncated varint", self.what)))?;
            self.bytes = rest;
            v |= u64::from(b & 0x7F) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(invalid(format!(
            "{}: varint longer than 10 bytes",
            self.what
        )))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], BboltError> {
        let n = usize::try_from(n).map_err(|_| invalid("length"))?;
        let (head, rest) = self
            .bytes
            .split_at_checked(n)
            .ok_or_else(|| invalid(format!("{}: field past the end", self.what)))?;
        self.bytes = rest;
        Ok(head)
    }

    /// Returns the next field number and field, or None at the end.
    fn next(&mut self) -> Result<Option<(u64, Field<'a>)>, BboltError> {
        if self.bytes.is_empty() {
            return Ok(None);
        }
        let tag = self.varint()?;
        let number = tag >> 3;
        if number == 0 {
            return Err(invalid(format!("{}: field number 0", self.what)));
        }
        let field = match tag & 7 {
            WIRE_VARINT => Field::Varint(self.varint()?),
            WIRE_BYTES => {
                let len = self.varint()?;
                Field::Bytes(self.take(len)?)
            }
            WIRE_FIXED64 => {
                self.take(8)?;
                Field::Other
            }
            WIRE_FIXED32 => {
                self.take(4)?;
                Field::Other
            }
            other => {
                return Err(invalid(format!("{}: wire type {other}", self.what)));
            }
        };
        Ok(Some((number, field)))
    }
}

fn mismatch(what: &str, number: u64) -> BboltError {
    invalid(format!("{what}: field {number} has the wrong wire type"))
}

/// Decodes a KeyValue (PROTO-2).
pub fn decode_key_value(bytes: &[u8]) -> Result<KeyValue, BboltError> {
    let what = "KeyValue";
    let mut kv = KeyValue::default();
    let mut fields = Fields { bytes, what };
    while let Some((number, field)) = fields.next()? {
        match (number, field) {
            (1, Field::Bytes(b)) => kv.key = Bytes::copy_from_slice(b),
            (5, Field::Bytes(b)) => kv.value = Bytes::copy_from_slice(b),
            (2, Field::Varint(v)) => kv.create_revision = v as i64,
            (3, Field::Varint(v)) => kv.mod_revision = v as i64,
            (4, Field::Varint(v)) => kv.version = v as i64,
            (6, Field::Varint(v)) => kv.lease = v as i64,
            (1..=6, _) => return Err(mismatch(what, number)),
            _ => {}
        }
    }
    Ok(kv)
}

/// Decodes a `leasepb.Lease` into `(id, ttl)` (PROTO-2).
pub fn decode_lease(bytes: &[u8]) -> Result<(i64, i64), BboltError> {
    let what = "Lease";
    let (mut id, mut ttl) = (0, 0);
    let mut fields = Fields { bytes, what };
    while let Some((number, field)) = fields.next()? {
        match (number, field) {
            (1, Field::Varint(v)) => id = v as i64,
            (2, Field::Varint(v)) => ttl = v as i64,
            (3, Field::Varint(_)) => {}
            (1..=3, _) => return Err(mismatch(what, number)),
            _ => {}
        }
    }
    Ok((id, ttl))
}

/// Decodes an `AlarmMember` into `(member_id, alarm)` (PROTO-2).
pub fn decode_alarm(bytes: &[u8]) -> Result<(u64, i32), BboltError> {
    let what = "AlarmMember";
    let (mut member, mut alarm) = (0u64, 0i32);
    let mut fields = Fields { bytes, what };
    while let Some((number, field)) = fields.next()? {
        match (number, field) {
            (1, Field::Varint(v)) => member = v,
            (2, Field::Varint(v)) => {
                alarm = i32::try_from(v).map_err(|_| invalid("AlarmMember: alarm out of range"))?
            }
            (1..=2, _) => return Err(mismatch(what, number)),
            _ => {}
        }
    }
    Ok((member, alarm))
}

fn utf8(bytes: &[u8], what: &str) -> Result<String, BboltError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| invalid(format!("{what}: text not UTF-8")))
}

/// Decodes an `authpb.User` (PROTO-2); its roles come out sorted and unique, as kvd keeps
/// them (etcd keeps them sorted too).
pub fn decode_user(bytes: &[u8]) -> Result<User, BboltError> {
    let what = "User";
    let mut user = User {
        name: String::new(),
        password_hash: String::new(),
        no_password: false,
        roles: Vec::new(),
    };
    let mut fields = Fields { bytes, what };
    while let Some((number, field)) = fields.next()? {
        match (number, field) {
            (1, Field::Bytes(b)) => user.name = utf8(b, what)?,
            (2, Field::Bytes(b)) => user.password_hash = utf8(b, what)?,
            (3, Field::Bytes(b)) => user.roles.push(utf8(b, what)?),
            (4, Field::Bytes(b)) => {
                let what = "UserAddOptions";
                let mut options = Fields { bytes: b, what };
                while let Some((number, field)) = options.next()? {
                    match (number, field) {
                        (1, Field::Varint(v)) => user.no_password = v != 0,
                        (1, _) => return Err(mismatch(what, number)),
                        _ => {}
                    }
                }
            }
            (1..=4, _) => return Err(mismatch(what, number)),
            _ => {}
        }
    }
    user.roles.sort();
    user.roles.dedup();
    Ok(user)
}

/// Decodes an `authpb.Role` (PROTO-2); its permissions come out sorted by key and range
/// end, one per (key, range end) (the last one read wins), as kvd keeps them.
pub fn decode_role(bytes: &[u8]) -> Result<Role, BboltError> {
    let what = "Role";
    let mut role = Role {
        name: String::new(),
        permissions: Vec::new(),
    };
    let mut fields = Fields { bytes, what };
    while let Some((number, field)) = fields.next()? {
        match (number, field) {
            (1, Field::Bytes(b)) => role.name = utf8(b, what)?,
            (2, Field::Bytes(b)) => role.permissions.push(decode_permission(b)?),
            (1..=2, _) => return Err(mismatch(what, number)),
            _ => {}
        }
    }
    role.permissions.reverse();
    role.permissions
        .sort_by(|a, b| (&a.key, &a.range_end).cmp(&(&b.key, &b.range_end)));
    role.permissions
        .dedup_by(|a, b| a.key == b.key && a.range_end == b.range_end);
    Ok(role)
}

fn decode_permission(bytes: &[u8]) -> Result<Permission, BboltError> {
    let what = "Permission";
    let mut perm = Permission {
        perm_type: PermissionType::Read,
        key: Vec::new(),
        range_end: Vec::new(),
    };
    let mut fields = Fields { bytes, what };
    while let Some((number, field)) = fields.next()? {
        match (number, field) {
            (1, Field::Varint(v)) => {
                perm.perm_type = u8::try_from(v)
                    .ok()
                    .and_then(PermissionType::from_number)
                    .ok_or_else(|| invalid(format!("{what}: permType {v}")))?;
            }
            (2, Field::Bytes(b)) => perm.key = b.to_vec(),
            (3, Field::Bytes(b)) => perm.range_end = b.to_vec(),
            (1..=3, _) => return Err(mismatch(what, number)),
            _ => {}
        }
    }
    Ok(perm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_value_matches_etcd_bytes() {
        // etcd's bytes for put a=1 at revision 2.
        let kv = KeyValue {
            key: Bytes::from_static(b"a"),
            create_revision: 2,
            mod_revision: 2,
            version: 1,
            value: Bytes::from_static(b"1"),
            lease: 0,
        };
        let mut out = Vec::new();
        encode_key_value(&mut out, &kv);
        assert_eq!(
            out,
            [
                0x0a, 0x01, 0x61, 0x10, 0x02, 0x18, 0x02, 0x20, 0x01, 0x2a, 0x01, 0x31
            ]
        );
        assert_eq!(decode_key_value(&out), Ok(kv));
        let negative = KeyValue {
            key: Bytes::from_static(b"k"),
            lease: -5,
            ..KeyValue::default()
        };
        let mut out = Vec::new();
        encode_key_value(&mut out, &negative);
        assert_eq!(decode_key_value(&out), Ok(negative));
    }

    #[test]
    fn lease_and_alarm_match_etcd_bytes() {
        let lease = encode_lease(0x390d_a230_7ab6_cb09, 600);
        assert_eq!(
            lease,
            [
                0x08, 0x89, 0x96, 0xdb, 0xd5, 0x87, 0xc6, 0xe8, 0x86, 0x39, 0x10, 0xd8, 0x04
            ]
        );
        assert_eq!(decode_lease(&lease), Ok((0x390d_a230_7ab6_cb09, 600)));
        let alarm = encode_alarm(0, 1);
        assert_eq!(alarm, [0x10, 0x01]);
        // etcd's bytes for a NOSPACE alarm of member 0x9d0a1b7bc3ae8ae (obs).
        let nospace = [
            0x08, 0xae, 0x87, 0xd1, 0xd7, 0xc3, 0xbd, 0xa1, 0x8a, 0x9d, 0x01, 0x10, 0x01,
        ];
        let (member, kind) = decode_alarm(&nospace).unwrap();
        assert_eq!(kind, 1);
        assert_eq!(encode_alarm(member, kind), nospace);
    }

    #[test]
    fn user_and_role_match_etcd_bytes() {
        // etcd 3.4.23's bytes for role r1 with readwrite on [foo, fop), and for role root.
        let r1 = Role {
            name: "r1".into(),
            permissions: vec![Permission {
                perm_type: PermissionType::ReadWrite,
                key: b"foo".to_vec(),
                range_end: b"fop".to_vec(),
            }],
        };
        let bytes = [
            0x0a, 0x02, 0x72, 0x31, 0x12, 0x0c, 0x08, 0x02, 0x12, 0x03, 0x66, 0x6f, 0x6f, 0x1a,
            0x03, 0x66, 0x6f, 0x70,
        ];
        assert_eq!(encode_role(&r1), bytes);
        assert_eq!(decode_role(&bytes), Ok(r1));
        let root = Role {
            name: "root".into(),
            permissions: Vec::new(),
        };
        assert_eq!(encode_role(&root), [0x0a, 0x04, 0x72, 0x6f, 0x6f, 0x74]);
        // A READ permission (enum 0) leaves its type out.
        let read = Role {
            name: "r".into(),
            permissions: vec![Permission {
                perm_type: PermissionType::Read,
                key: b"a".to_vec(),
                range_end: Vec::new(),
            }],
        };
        assert_eq!(
            encode_role(&read),
            [0x0a, 0x01, 0x72, 0x12, 0x03, 0x12, 0x01, 0x61]
        );
        assert_eq!(decode_role(&encode_role(&read)), Ok(read));

        let user = User {
            name: "u".into(),
            password_hash: "$2a$10$h".into(),
            no_password: false,
            roles: vec!["a".into(), "b".into()],
        };
        let mut want = vec![0x0a, 0x01, b'u', 0x12, 0x08];
        want.extend_from_slice(b"$2a$10$h");
        want.extend_from_slice(&[0x1a, 0x01, b'a', 0x1a, 0x01, b'b', 0x22, 0x00]);
        assert_eq!(encode_user(&user), want);
        assert_eq!(decode_user(&want), Ok(user));
        let no_password = User {
            name: "n".into(),
            password_hash: String::new(),
            no_password: true,
            roles: Vec::new(),
        };
        assert_eq!(
            encode_user(&no_password),
            [0x0a, 0x01, b'n', 0x22, 0x02, 0x08, 0x01]
        );
        assert_eq!(decode_user(&encode_user(&no_password)), Ok(no_password));
    }

    #[test]
    fn role_permissions_come_out_sorted_and_unique() {
        let perm = |t: u8, key: &[u8]| {
            let mut inner = vec![0x08, t, 0x12, key.len() as u8];
            inner.extend_from_slice(key);
            let mut out = vec![0x12, inner.len() as u8];
            out.extend_from_slice(&inner);
            out
        };
        let mut bytes = vec![0x0a, 0x01, b'r'];
        bytes.extend(perm(1, b"b"));
        bytes.extend(perm(0, b"a"));
        bytes.extend(perm(2, b"b"));
        let role = decode_role(&bytes).unwrap();
        let got: Vec<_> = role
            .permissions
            .iter()
            .map(|p| (p.key.clone(), p.perm_type))
            .collect();
        assert_eq!(
            got,
            [
                (b"a".to_vec(), PermissionType::Read),
                (b"b".to_vec(), PermissionType::ReadWrite)
            ]
        );
        assert!(
            decode_role(&[0x12, 0x02, 0x08, 0x03]).is_err(),
            "permType 3"
        );
        assert!(decode_role(&[0x0a, 0x01, 0xff]).is_err(), "name not UTF-8");
        assert!(
            decode_user(&[0x22, 0x01, 0x0a]).is_err(),
            "options of the wrong type"
        );
        assert!(decode_user(&[0x1a, 0x05, 0x61]).is_err(), "truncated role");
    }

    #[test]
    fn decoders_refuse_bad_bytes() {
        for bytes in [
            &[0x0a, 0x05, 0x61][..],
            &[0x10],
            &[
                0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
            ],
            &[0x0b],
            &[0x00, 0x01],
            &[0x08, 0x01],
            &[0x12, 0x01],
        ] {
            assert!(decode_key_value(bytes).is_err(), "{bytes:?}");
        }
        assert!(decode_lease(&[0x0a, 0x00]).is_err());
    }
}
