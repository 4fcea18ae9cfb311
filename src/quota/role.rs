//! Role names: Mesos's validity rules, the role hierarchy, and the key namespace each role owns.
//!
//! Owns: [`validate_role`] (Mesos's `roles::validate`, spec §2.1), the hierarchy helpers
//! (`a/b/c` is a child of `a/b`, spec §2.2), and the namespace rule of product decision 6: role
//! `a/b` owns the keys under `/a/b/`, and a key is charged to the deepest role with a registry
//! entry whose namespace prefixes it, or to `*`.
//!
//! Invariants:
//! - QUOTA-5 (roles): [`validate_role`] runs Mesos's checks in Mesos's order and returns the
//!   first failure with Mesos's message. `*` is valid and top-level only.
//! - QUOTA-6: [`charged_role`] returns a role that has a registry entry, or `*`; no other role
//!   with an entry has a namespace that prefixes the key and is deeper. A valid role's
//!   namespace is unambiguous because valid names never start or end with `/` and never
//!   contain `//`.
//!
//! Contact points: `validate.rs` validates every configured role here; the engine calls
//! [`charged_role`] on each write to find whom to charge, then charges its [`ancestors`] too.

use std::collections::{BTreeMap, BTreeSet};

use super::messages;

/// The role `*`: valid, top-level only, and the role charged for keys no other role owns.
pub const STAR_ROLE: &str = "*";

/// The separator between the components of a nested role, `a/b/c`.
pub const ROLE_SEPARATOR: char = '/';

/// Bytes a role component may not contain: tab, line feed, vertical tab, form feed, carriage
/// return, space and DEL (Mesos's "backspace or whitespace").
const ROLE_FORBIDDEN_BYTES: [u8; 7] = [0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20, 0x7f];

/// Checks `role` against Mesos's rules, in Mesos's order, and returns the first failure with
/// Mesos's message (QUOTA-5). `*`, `foo`, `foo.bar`, `...` and `a/b/c` are valid; `""`, `.`,
/// `/foo`, `foo//bar`, `foo/*` and `-foo` are not.
pub fn validate_role(role: &str) -> Result<(), String> {
    if role == STAR_ROLE {
        return Ok(());
    }
    if role.starts_with(ROLE_SEPARATOR) {
        return Err(messages::role_starts_with_slash(role));
    }
    if role.ends_with(ROLE_SEPARATOR) {
        return Err(messages::role_ends_with_slash(role));
    }
    if role.contains("//") {
        return Err(messages::role_has_adjacent_slashes(role));
    }
    // After the checks above, only the empty string splits into no components.
    if role.is_empty() {
        return Err(messages::role_is_empty());
    }
    role.split(ROLE_SEPARATOR)
        .try_for_each(|component| validate_component(role, component))
}

/// Checks one component of `role`, in Mesos's order.
fn validate_component(role: &str, component: &str) -> Result<(), String> {
    if matches!(component, "." | ".." | STAR_ROLE) {
        return Err(messages::role_has_reserved_component(role, component));
    }
    if component.starts_with('-') {
        return Err(messages::role_component_starts_with_dash(component));
    }
    if component
        .bytes()
        .any(|byte| ROLE_FORBIDDEN_BYTES.contains(&byte))
    {
        return Err(messages::role_component_has_whitespace(component));
    }
    Ok(())
}

/// Returns the parent of a nested role (`a/b` for `a/b/c`), or `None` for a top-level role.
pub fn parent(role: &str) -> Option<&str> {
    role.rsplit_once(ROLE_SEPARATOR).map(|(parent, _)| parent)
}

/// Returns the ancestors of `role`, nearest first: `a/b/c`, `a/b`, `a` for `a/b/c/d`, and
/// nothing for a top-level role (Mesos's `roles::ancestors`).
pub fn ancestors(role: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(parent(role), |role| parent(role))
}

/// Returns `true` when `role` is a strict descendant of `ancestor` (Mesos's
/// `roles::isStrictSubroleOf(role, ancestor)`): `foo/bar` and `foo/bar/baz` are below `foo`;
/// `foo` is not below itself and `foobar` is not below `foo`.
pub fn is_strict_subrole(role: &str, ancestor: &str) -> bool {
    role.strip_prefix(ancestor)
        .is_some_and(|rest| rest.starts_with(ROLE_SEPARATOR))
}

/// Returns `true` when `ancestor` is a strict ancestor of `role`; the same relation as
/// [`is_strict_subrole`], read the other way.
pub fn is_ancestor(ancestor: &str, role: &str) -> bool {
    is_strict_subrole(role, ancestor)
}

/// Returns the key prefix `role` owns: `/a/b/` for `a/b`. `*` owns every key no other role
/// owns; its own prefix `/*/` changes nothing, since those keys fall back to `*` anyway.
pub fn namespace_prefix(role: &str) -> String {
    format!("{ROLE_SEPARATOR}{role}{ROLE_SEPARATOR}")
}

/// A set of roles that have a registry entry, as [`charged_role`] needs it.
pub trait RoleEntries {
    /// Returns `true` when `role` has a registry entry.
    fn has_entry(&self, role: &str) -> bool;
}

impl<V> RoleEntries for BTreeMap<String, V> {
    fn has_entry(&self, role: &str) -> bool {
        self.contains_key(role)
    }
}

impl RoleEntries for BTreeSet<String> {
    fn has_entry(&self, role: &str) -> bool {
        self.contains(role)
    }
}

/// Returns the role a write to `key` is charged to: the deepest role with an entry in
/// `roles_with_entries` whose namespace (`/role/`) is a prefix of `key`, or `*` (QUOTA-6).
///
/// With entries for `a` and `a/b/c`: `/a/b/c/x` goes to `a/b/c`, `/a/b/x` and `/a/b` go to
/// `a`, `/b/x` and `x` go to `*`. The work is one lookup per `/` in the key, whatever the
/// number of roles.
pub fn charged_role<'k>(key: &'k [u8], roles_with_entries: &impl RoleEntries) -> &'k str {
    let Some(path) = key.strip_prefix(b"/") else {
        return STAR_ROLE;
    };
    // Candidate roles are the key's path up to each later '/', tried longest first.
    let separators = path.iter().enumerate().filter(|(_, byte)| **byte == b'/');
    let mut ends: Vec<usize> = separators.map(|(index, _)| index).collect();
    ends.reverse();
    for end in ends {
        // A candidate that is not UTF-8 cannot be a role name, so it cannot have an entry.
        if let Ok(candidate) = std::str::from_utf8(&path[..end])
            && roles_with_entries.has_entry(candidate)
        {
            return candidate;
        }
    }
    STAR_ROLE
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Mesos's `RoleTest.Validate` valid names, plus a few more.
    #[test]
    fn valid_roles() {
        let valid = [
            "foo",
            "123",
            "foo_123",
            "*",
            "foo-bar",
            "foo.bar",
            "foo..bar",
            "...",
            "foo/bar",
            "foo/.bar",
            "foo/bar/baz",
            "a/b/c/d/e/f/g/h",
            "foo*",
            "*foo",
            "foo/bar-",
            "rôle/ünïcode",
            "foo\u{8}bar",
        ];
        for role in valid {
            assert_eq!(validate_role(role), Ok(()), "{role:?}");
        }
    }

    /// Mesos's `RoleTest.Validate` invalid names, each with the message of the first check it
    /// fails.
    #[test]
    fn invalid_roles_get_the_first_failing_message() {
        let cases: &[(&str, &str)] = &[
            ("", "Role names cannot be the empty string"),
            (".", "Role '.' cannot include '.' as a component"),
            ("..", "Role '..' cannot include '..' as a component"),
            (
                "-foo",
                "Role component '-foo' is invalid because it starts with a dash",
            ),
            ("/", "Role '/' cannot start with a slash"),
            ("/foo", "Role '/foo' cannot start with a slash"),
            ("foo/", "Role 'foo/' cannot end with a slash"),
            (
                "foo//bar",
                "Role 'foo//bar' cannot contain two adjacent slashes",
            ),
            ("foo/bar/", "Role 'foo/bar/' cannot end with a slash"),
            (
                "foo bar",
                "Role component 'foo bar' is invalid because it contains backspace or whitespace",
            ),
            (
                "foo\tbar",
                "Role component 'foo\tbar' is invalid because it contains backspace or whitespace",
            ),
            (
                "foo\nbar",
                "Role component 'foo\nbar' is invalid because it contains backspace or whitespace",
            ),
            ("./.", "Role './.' cannot include '.' as a component"),
            ("../..", "Role '../..' cannot include '..' as a component"),
            ("./foo", "Role './foo' cannot include '.' as a component"),
            ("../foo", "Role '../foo' cannot include '..' as a component"),
            ("foo/.", "Role 'foo/.' cannot include '.' as a component"),
            ("foo/..", "Role 'foo/..' cannot include '..' as a component"),
            (
                "foo/./bar",
                "Role 'foo/./bar' cannot include '.' as a component",
            ),
            (
                "foo/../bar",
                "Role 'foo/../bar' cannot include '..' as a component",
            ),
            (
                "foo/-bar",
                "Role component '-bar' is invalid because it starts with a dash",
            ),
            ("foo/*", "Role 'foo/*' cannot include '*' as a component"),
            (
                "foo/*/bar",
                "Role 'foo/*/bar' cannot include '*' as a component",
            ),
            ("*/foo", "Role '*/foo' cannot include '*' as a component"),
        ];
        for (role, message) in cases {
            assert_eq!(validate_role(role), Err(message.to_string()), "{role:?}");
        }
    }

    #[test]
    fn every_forbidden_byte_is_rejected_and_others_are_not() {
        for byte in 0u8..=0x7f {
            let role = format!("a{}b", char::from(byte));
            let forbidden = ROLE_FORBIDDEN_BYTES.contains(&byte);
            let result = validate_role(&role);
            if byte == b'/' {
                assert_eq!(result, Ok(()), "a/b is nested, not invalid");
            } else if forbidden {
                assert_eq!(
                    result,
                    Err(format!(
                        "Role component '{role}' is invalid because it contains backspace or \
                         whitespace"
                    )),
                    "byte {byte:#x}"
                );
            } else {
                assert_eq!(result, Ok(()), "byte {byte:#x}");
            }
        }
    }

    #[test]
    fn checks_run_in_mesos_order() {
        let cases: &[(&str, &str)] = &[
            // The slash checks come before the component checks.
            ("/-foo", "Role '/-foo' cannot start with a slash"),
            ("-foo/", "Role '-foo/' cannot end with a slash"),
            (
                ". .//x",
                "Role '. .//x' cannot contain two adjacent slashes",
            ),
            // Components are checked left to right, each through all its checks.
            (
                "-a/.",
                "Role component '-a' is invalid because it starts with a dash",
            ),
            (
                "a b/-c",
                "Role component 'a b' is invalid because it contains backspace or whitespace",
            ),
            (
                "a/-b c",
                "Role component '-b c' is invalid because it starts with a dash",
            ),
        ];
        for (role, message) in cases {
            assert_eq!(validate_role(role), Err(message.to_string()), "{role:?}");
        }
    }

    #[test]
    fn hierarchy_helpers() {
        assert_eq!(parent("a/b/c"), Some("a/b"));
        assert_eq!(parent("a"), None);
        assert_eq!(parent("*"), None);
        assert_eq!(
            ancestors("a/b/c/d").collect::<Vec<_>>(),
            ["a/b/c", "a/b", "a"]
        );
        assert_eq!(ancestors("role").count(), 0);
        let subroles: &[(&str, &str, bool)] = &[
            ("foo/bar", "foo", true),
            ("foo/bar/baz", "foo", true),
            ("foo/bar/baz", "foo/bar", true),
            ("foo", "foo", false),
            ("foobar", "foo", false),
            ("foo", "foo/bar", false),
            ("foo/barbaz", "foo/bar", false),
        ];
        for (role, ancestor, expected) in subroles {
            assert_eq!(
                is_strict_subrole(role, ancestor),
                *expected,
                "{role} < {ancestor}"
            );
            assert_eq!(
                is_ancestor(ancestor, role),
                *expected,
                "{ancestor} > {role}"
            );
        }
    }

    #[test]
    fn namespace_of_a_role() {
        assert_eq!(namespace_prefix("a"), "/a/");
        assert_eq!(namespace_prefix("a/b"), "/a/b/");
    }

    fn entries(roles: &[&str]) -> BTreeSet<String> {
        roles.iter().map(|role| role.to_string()).collect()
    }

    #[test]
    fn key_is_charged_to_the_deepest_role_with_an_entry() {
        let roles = entries(&["a", "a/b/c", "x/y", "*"]);
        let cases: &[(&[u8], &str)] = &[
            (b"/a/b/c/key", "a/b/c"),
            (b"/a/b/c/", "a/b/c"),
            (b"/a/b/c/d/e/key", "a/b/c"),
            (b"/a/b/cd/key", "a"),
            (b"/a/b/c", "a"),
            (b"/a/b/key", "a"),
            (b"/a/key", "a"),
            (b"/a/", "a"),
            (b"/a", "*"),
            (b"/ab/key", "*"),
            (b"/x/key", "*"),
            (b"/x/y/key", "x/y"),
            (b"/b/key", "*"),
            (b"a/key", "*"),
            (b"", "*"),
            (b"/", "*"),
            (b"//a/key", "*"),
            (b"/*/key", "*"),
            (b"/a/\xff/key", "a"),
        ];
        for (key, role) in cases {
            assert_eq!(
                charged_role(key, &roles),
                *role,
                "key {:?}",
                String::from_utf8_lossy(key)
            );
        }
    }

    #[test]
    fn charged_role_accepts_a_registry_map() {
        let mut registry: BTreeMap<String, u32> = BTreeMap::new();
        assert_eq!(charged_role(b"/a/key", &registry), "*");
        registry.insert("a".to_string(), 1);
        assert_eq!(charged_role(b"/a/key", &registry), "a");
    }
}
