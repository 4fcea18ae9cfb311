//! The row format of users and roles in their storage tables.
//!
//! A user row: version byte 1, a `no_password` byte (0 or 1), the password hash as a
//! length-prefixed string (empty for a password-less user), then the role count and each
//! role name length-prefixed. A role row: version byte 1, the permission count, then per
//! permission a type byte (0 READ, 1 WRITE, 2 READWRITE, etcd's enum numbers), the key and
//! the range end, each length-prefixed. Lengths are 4-byte big-endian.
//!
//! Invariants:
//! - AUTHCODEC-1: decoding is total: bad bytes give `Corrupted`, never a panic, and every
//!   encoded row decodes to what was encoded.
//!
//! Contact points: `auth` writes and loads rows with these.

use super::{Permission, PermissionType, Role, User};
use crate::error::StorageError;

const VERSION: u8 = 1;

/// Returns the row value of `user`.
pub fn encode_user(user: &User) -> Vec<u8> {
    let mut out = vec![VERSION, u8::from(user.no_password)];
    put_bytes(&mut out, user.password_hash.as_bytes());
    put_len(&mut out, user.roles.len());
    for role in &user.roles {
        put_bytes(&mut out, role.as_bytes());
    }
    out
}

/// Returns the row value of `role`.
pub fn encode_role(role: &Role) -> Vec<u8> {
    let mut out = vec![VERSION];
    put_len(&mut out, role.permissions.len());
    for perm in &role.permissions {
        out.push(perm.perm_type.number());
        put_bytes(&mut out, &perm.key);
        put_bytes(&mut out, &perm.range_end);
    }
    out
}

/// Decodes a user row (AUTHCODEC-1).
pub fn decode_user(name: &[u8], value: &[u8]) -> Result<User, StorageError> {
    let mut r = Reader::new(value, "user");
    r.version()?;
    let no_password = r.byte()? == 1;
    let password_hash = r.string()?;
    let count = r.len()?;
    let mut roles = Vec::new();
    for _ in 0..count {
        roles.push(r.string()?);
    }
    r.end()?;
    Ok(User {
        name: text(name, "user")?,
        password_hash,
        no_password,
        roles,
    })
}

/// Decodes a role row (AUTHCODEC-1).
pub fn decode_role(name: &[u8], value: &[u8]) -> Result<Role, StorageError> {
    let mut r = Reader::new(value, "role");
    r.version()?;
    let count = r.len()?;
    let mut permissions = Vec::new();
    for _ in 0..count {
        let perm_type = PermissionType::from_number(r.byte()?)
            .ok_or_else(|| corrupted("role", "permission type"))?;
        let key = r.bytes()?.to_vec();
        let range_end = r.bytes()?.to_vec();
        permissions.push(Permission {
            perm_type,
            key,
            range_end,
        });
    }
    r.end()?;
    Ok(Role {
        name: text(name, "role")?,
        permissions,
    })
}

fn put_len(out: &mut Vec<u8>, len: usize) {
    // Names, hashes and keys are bounded by the request size limit, far below 4 GiB.
    out.extend_from_slice(&u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

fn corrupted(what: &str, field: &str) -> StorageError {
    StorageError::Corrupted(format!("auth {what} row: bad {field}"))
}

fn text(bytes: &[u8], what: &str) -> Result<String, StorageError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| corrupted(what, "name"))
}

struct Reader<'a> {
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(rest: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader { rest, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], StorageError> {
        if self.rest.len() < n {
            return Err(corrupted(self.what, "length"));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn byte(&mut self) -> Result<u8, StorageError> {
        Ok(self.take(1)?[0])
    }

    fn version(&mut self) -> Result<(), StorageError> {
        match self.byte()? {
            VERSION => Ok(()),
            _ => Err(corrupted(self.what, "version")),
        }
    }

    fn len(&mut self) -> Result<usize, StorageError> {
        let mut array = [0u8; 4];
        array.copy_from_slice(self.take(4)?);
        usize::try_from(u32::from_be_bytes(array)).map_err(|_| corrupted(self.what, "length"))
    }

    fn bytes(&mut self) -> Result<&'a [u8], StorageError> {
        let n = self.len()?;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, StorageError> {
        let bytes = self.bytes()?;
        String::from_utf8(bytes.to_vec()).map_err(|_| corrupted(self.what, "text"))
    }

    fn end(&self) -> Result<(), StorageError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(corrupted(self.what, "trailing bytes"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_bad_bytes_are_corrupted() {
        let user = User {
            name: "alice".into(),
            password_hash: "$2b$10$abc".into(),
            no_password: false,
            roles: vec!["dev".into(), "ops".into()],
        };
        assert_eq!(decode_user(b"alice", &encode_user(&user)), Ok(user.clone()));
        let role = Role {
            name: "dev".into(),
            permissions: vec![Permission {
                perm_type: PermissionType::ReadWrite,
                key: b"/dev/".to_vec(),
                range_end: b"/dev0".to_vec(),
            }],
        };
        assert_eq!(decode_role(b"dev", &encode_role(&role)), Ok(role.clone()));
        let encoded = encode_user(&user);
        for cut in 0..encoded.len() {
            assert!(decode_user(b"alice", &encoded[..cut]).is_err(), "cut {cut}");
        }
        let encoded = encode_role(&role);
        for cut in 0..encoded.len() {
            assert!(decode_role(b"dev", &encoded[..cut]).is_err(), "cut {cut}");
        }
        assert!(decode_role(b"dev", &[1, 0, 0, 0, 1, 9, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    }
}
