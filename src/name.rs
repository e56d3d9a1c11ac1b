//! Lock names and the file names they map to.
//!
//! Any string except the empty one and those containing NUL is a lock name.
//! On disk it becomes `<safeName>-<hash16>.lock`, exactly as the first seed
//! derives it: every character outside `[A-Za-z0-9._-]` is replaced by `_`
//! (once per UTF-16 code unit, as JavaScript's `String.replace` does), the
//! result is cut to 64 characters, and the first 16 hex digits of the
//! SHA-256 of the UTF-8 name follow. The file name therefore never contains a
//! separator, is never `.` or `..`, is at most 86 bytes, and two names that
//! differ only in unsafe characters do not collide.

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

const SAFE_NAME_MAX: usize = 64;

/// A validated lock name and its file name inside the lock directory.
#[derive(Debug, Clone)]
pub(crate) struct LockName {
    name: String,
    file_name: String,
}

impl LockName {
    /// Validates `name` and derives its hashed file name.
    pub(crate) fn new(name: &str) -> Result<Self> {
        if name.is_empty() {
            return Err(invalid(name, "name is empty"));
        }
        if name.contains('\0') {
            return Err(invalid(name, "name contains a NUL byte"));
        }
        Ok(Self {
            name: name.to_owned(),
            file_name: hashed_file_name(name),
        })
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.name
    }

    /// `<safeName>-<hash16>.lock`.
    pub(crate) fn file_name(&self) -> &str {
        &self.file_name
    }
}

fn invalid(name: &str, reason: &'static str) -> Error {
    Error::InvalidName {
        name: name.to_owned(),
        reason,
    }
}

fn hashed_file_name(name: &str) -> String {
    let mut out = String::with_capacity(SAFE_NAME_MAX + 22);
    let mut safe_len = 0;
    for c in name.chars() {
        let units = if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
            out.push(c);
            1
        } else {
            for _ in 0..c.len_utf16() {
                out.push('_');
            }
            c.len_utf16()
        };
        safe_len += units;
        if safe_len >= SAFE_NAME_MAX {
            break;
        }
    }
    out.truncate(SAFE_NAME_MAX);
    let digest = Sha256::digest(name.as_bytes());
    out.push('-');
    for byte in &digest[..8] {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    out.push_str(".lock");
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn matches_the_first_seed() {
        // sha256("reindex") starts 2ad945a5430f00fa, as node:crypto computes it.
        let n = LockName::new("reindex").unwrap();
        assert_eq!(n.file_name(), "reindex-2ad945a5430f00fa.lock");
        let n = LockName::new("a/b c").unwrap();
        assert!(n.file_name().starts_with("a_b_c-"));
        // An astral character is two UTF-16 code units, hence two underscores.
        let n = LockName::new("x😀y").unwrap();
        assert!(n.file_name().starts_with("x__y-"));
    }

    #[test]
    fn rejects_empty_and_nul() {
        assert!(matches!(LockName::new(""), Err(Error::InvalidName { .. })));
        assert!(matches!(LockName::new("a\0b"), Err(Error::InvalidName { .. })));
    }

    proptest! {
        #[test]
        fn any_name_maps_inside_the_directory(name in "\\PC{1,200}") {
            prop_assume!(!name.contains('\0'));
            let n = LockName::new(&name).unwrap();
            let f = n.file_name();
            prop_assert!(!f.contains('/'));
            prop_assert!(f != "." && f != "..");
            prop_assert!(f.len() <= SAFE_NAME_MAX + 22);
            prop_assert!(f.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)));
            prop_assert!(f.ends_with(".lock"));
        }

        #[test]
        fn distinct_names_get_distinct_files(a in "[a-z/ ]{1,10}", b in "[a-z/ ]{1,10}") {
            prop_assume!(a != b);
            prop_assert_ne!(LockName::new(&a).unwrap().file_name().to_owned(),
                            LockName::new(&b).unwrap().file_name().to_owned());
        }
    }
}
