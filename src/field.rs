//! Extra owner fields: caller-supplied values published in every record
//! of a `Locker`, as velocious's `extraOwnerFields` are.

use std::sync::Arc;

use serde_json::Value;

/// Owner fields refused (too many bytes, a reserved key...); it becomes
/// [`Error::InvalidConfig`](crate::Error::InvalidConfig) (see `error.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidFields {
    pub(crate) reason: String,
}

type Result<T> = std::result::Result<T, InvalidFields>;

/// The most bytes the extra fields of one `Locker` may take in a record,
/// as JSON. Records stay far below what readers accept (64 KiB), and a
/// renewal rewrites them whole, so they are kept small.
pub(crate) const MAX_FIELDS_LEN: usize = 4096;

/// The top-level keys of a lock record that leasehold, velocious or
/// pi-research write or read (docs/format.md): an owner field may not take
/// one. Every key leasehold's records serialize and its reader reads is
/// here (a unit test in `record.rs` checks); the format's one list, which
/// the crate and its tests share. `host` and `port`, which velocious's
/// server lock publishes, are free.
///
/// # Examples
///
/// ```
/// use leasehold::format::RECORD_KEYS;
///
/// assert!(RECORD_KEYS.contains(&"leaseExpiresAt"));
/// // An owner field may take any other key.
/// assert!(!RECORD_KEYS.contains(&"port"));
/// ```
pub const RESERVED_KEYS: &[&str] = &[
    "uuid",
    "pid",
    "startTime",
    "holderId",
    "hostname",
    "acquiredAt",
    "leaseExpiresAt",
    "leaseMs",
    "leasehold",
    "bootId",
    "pidNs",
    "timeNs",
    "procStart",
    "renewedAtBoot",
    "machineId",
    "fencingToken",
    "name",
    "mode",
    "permits",
    "group",
];

/// A value of an owner field: a string, a number or a boolean, as it
/// appears in the lock record's JSON.
///
/// Made with `From` from `&str`, `String`, `bool`, every integer type up
/// to 64 bits (`i32` too, so that a bare literal such as `8080` works),
/// `usize`, and `f64`; read back with [`as_str`](Self::as_str),
/// [`as_i64`](Self::as_i64), [`as_u64`](Self::as_u64),
/// [`as_f64`](Self::as_f64) and [`as_bool`](Self::as_bool), whoever wrote
/// it (velocious writes numbers as JSON numbers, so a port it publishes
/// reads back with `as_i64`).
///
/// # Examples
///
/// ```
/// use leasehold::FieldValue;
///
/// let port = FieldValue::from(8080u16);
/// assert_eq!(port.as_i64(), Some(8080));
/// assert_eq!(port.as_f64(), Some(8080.0));
/// assert_eq!(port.as_str(), None);
///
/// assert_eq!(FieldValue::from(8080), port); // an unsuffixed literal
///
/// let host = FieldValue::from("127.0.0.1");
/// assert_eq!(host.as_str(), Some("127.0.0.1"));
/// assert_eq!(FieldValue::from(true).as_bool(), Some(true));
/// assert_eq!(host.to_string(), "\"127.0.0.1\""); // as JSON
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct FieldValue(Repr);

#[derive(Debug, Clone, PartialEq)]
enum Repr {
    Str(String),
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
}

impl FieldValue {
    /// The string, if the value is one.
    ///
    /// ```
    /// assert_eq!(leasehold::FieldValue::from("db-1").as_str(), Some("db-1"));
    /// assert_eq!(leasehold::FieldValue::from(1u32).as_str(), None);
    /// ```
    pub fn as_str(&self) -> Option<&str> {
        match &self.0 {
            Repr::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The number as an `i64`, if it is a whole number in its range
    /// (`8080`, also `8080.0` as a JavaScript writer may store it).
    ///
    /// ```
    /// use leasehold::FieldValue;
    /// assert_eq!(FieldValue::from(-3i64).as_i64(), Some(-3));
    /// assert_eq!(FieldValue::from(u64::MAX).as_i64(), None);
    /// assert_eq!(FieldValue::from(1.5).as_i64(), None);
    /// ```
    pub fn as_i64(&self) -> Option<i64> {
        match self.0 {
            Repr::Int(n) => Some(n),
            Repr::UInt(n) => i64::try_from(n).ok(),
            Repr::Float(f) => whole(f).filter(|f| f.abs() < 9.0e15).map(|f| f as i64),
            _ => None,
        }
    }

    /// The number as a `u64`, if it is a whole number in its range.
    ///
    /// ```
    /// use leasehold::FieldValue;
    /// assert_eq!(FieldValue::from(u64::MAX).as_u64(), Some(u64::MAX));
    /// assert_eq!(FieldValue::from(-1i64).as_u64(), None);
    /// ```
    pub fn as_u64(&self) -> Option<u64> {
        match self.0 {
            Repr::Int(n) => u64::try_from(n).ok(),
            Repr::UInt(n) => Some(n),
            Repr::Float(f) => whole(f).filter(|f| (0.0..9.0e15).contains(f)).map(|f| f as u64),
            _ => None,
        }
    }

    /// The number as an `f64`, whatever kind of number it is.
    ///
    /// ```
    /// use leasehold::FieldValue;
    /// assert_eq!(FieldValue::from(0.25).as_f64(), Some(0.25));
    /// assert_eq!(FieldValue::from(2u32).as_f64(), Some(2.0));
    /// assert_eq!(FieldValue::from("2").as_f64(), None);
    /// ```
    pub fn as_f64(&self) -> Option<f64> {
        match self.0 {
            Repr::Int(n) => Some(n as f64),
            Repr::UInt(n) => Some(n as f64),
            Repr::Float(f) => Some(f),
            _ => None,
        }
    }

    /// The boolean, if the value is one.
    ///
    /// ```
    /// assert_eq!(leasehold::FieldValue::from(false).as_bool(), Some(false));
    /// assert_eq!(leasehold::FieldValue::from("false").as_bool(), None);
    /// ```
    pub fn as_bool(&self) -> Option<bool> {
        match self.0 {
            Repr::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as found in a record; `None` for what a field cannot be
    /// (null, an array, an object).
    pub(crate) fn from_json(value: &Value) -> Option<Self> {
        Some(FieldValue(match value {
            Value::String(s) => Repr::Str(s.clone()),
            Value::Bool(b) => Repr::Bool(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => Repr::Int(i),
                (None, Some(u), _) => Repr::UInt(u),
                (None, None, Some(f)) => Repr::Float(f),
                _ => return None,
            },
            _ => return None,
        }))
    }

    fn to_json(&self) -> Option<Value> {
        Some(match &self.0 {
            Repr::Str(s) => Value::String(s.clone()),
            Repr::Int(n) => Value::from(*n),
            Repr::UInt(n) => Value::from(*n),
            Repr::Float(f) => Value::Number(serde_json::Number::from_f64(*f)?),
            Repr::Bool(b) => Value::Bool(*b),
        })
    }
}

fn whole(f: f64) -> Option<f64> {
    (f.is_finite() && f.fract() == 0.0).then_some(f)
}

/// The value as JSON: a quoted, escaped string, a number or `true`/`false`.
impl std::fmt::Display for FieldValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.to_json() {
            Some(json) => write!(f, "{json}"),
            None => f.write_str("null"),
        }
    }
}

impl From<&str> for FieldValue {
    fn from(s: &str) -> Self {
        FieldValue(Repr::Str(s.to_owned()))
    }
}

impl From<String> for FieldValue {
    fn from(s: String) -> Self {
        FieldValue(Repr::Str(s))
    }
}

impl From<bool> for FieldValue {
    fn from(b: bool) -> Self {
        FieldValue(Repr::Bool(b))
    }
}

impl From<i64> for FieldValue {
    fn from(n: i64) -> Self {
        FieldValue(Repr::Int(n))
    }
}

/// Integers that fit an `i64`; `i32` is what an unsuffixed literal is.
macro_rules! from_small_int {
    ($($ty:ty),*) => {$(
        impl From<$ty> for FieldValue {
            fn from(n: $ty) -> Self {
                FieldValue(Repr::Int(i64::from(n)))
            }
        }
    )*};
}

from_small_int!(i8, i16, i32, u8, u16, u32);

impl From<usize> for FieldValue {
    fn from(n: usize) -> Self {
        FieldValue::from(u64::try_from(n).unwrap_or(u64::MAX))
    }
}

impl From<u64> for FieldValue {
    fn from(n: u64) -> Self {
        match i64::try_from(n) {
            Ok(n) => FieldValue(Repr::Int(n)),
            Err(_) => FieldValue(Repr::UInt(n)),
        }
    }
}

impl From<f64> for FieldValue {
    fn from(f: f64) -> Self {
        FieldValue(Repr::Float(f))
    }
}

/// A `Locker`'s owner fields, checked, with their JSON made once: the
/// text a record gets before its closing brace.
#[derive(Debug, PartialEq)]
pub(crate) struct OwnerFields {
    list: Vec<(String, FieldValue)>,
    /// `,"key":value` for each field, in order.
    json: String,
    /// The fields as a reader of the record gets them back (sorted by key,
    /// numbers as JSON reads them), for this process's own `Owner`s.
    read_back: Vec<(String, FieldValue)>,
}

impl OwnerFields {
    /// Checks the fields a builder was given (a later value for a key
    /// replaces an earlier one); `None` for none.
    pub(crate) fn new(given: &[(String, FieldValue)]) -> Result<Option<Arc<Self>>> {
        let invalid = |reason: String| Err(InvalidFields { reason });
        let mut list: Vec<(String, FieldValue)> = Vec::new();
        for (key, value) in given {
            match list.iter_mut().find(|(k, _)| k == key) {
                Some(slot) => slot.1 = value.clone(),
                None => list.push((key.clone(), value.clone())),
            }
        }
        if list.is_empty() {
            return Ok(None);
        }
        let mut json = String::new();
        for (key, value) in &list {
            if key.is_empty() || key.len() > 64 || key.chars().any(char::is_control) {
                return invalid(format!(
                    "owner field {key:?}: a key must be 1 to 64 bytes long, without control characters"
                ));
            }
            if RESERVED_KEYS.contains(&key.as_str()) {
                return invalid(format!(
                    "owner field {key:?} would replace the record's own {key:?}: choose another key \
                     (reserved: {})",
                    RESERVED_KEYS.join(", ")
                ));
            }
            let Some(value_json) = value.to_json() else {
                return invalid(format!("owner field {key:?}: {value:?} is not a finite number"));
            };
            json.push(',');
            json.push_str(&Value::String(key.clone()).to_string());
            json.push(':');
            json.push_str(&value_json.to_string());
        }
        if json.len() > MAX_FIELDS_LEN {
            return invalid(format!(
                "the owner fields take {} bytes as JSON, above the limit of {MAX_FIELDS_LEN}",
                json.len()
            ));
        }
        let read_back = match serde_json::from_str::<Value>(&format!("{{{}}}", &json[1..])) {
            Ok(Value::Object(map)) => extra_fields(&map),
            _ => Vec::new(),
        };
        Ok(Some(Arc::new(OwnerFields {
            list,
            json,
            read_back,
        })))
    }

    /// The fields as a reader of a record with them gets them back.
    pub(crate) fn read_back(&self) -> &[(String, FieldValue)] {
        &self.read_back
    }

    /// `,"key":value...`, to go before a record's closing brace.
    pub(crate) fn json(&self) -> &str {
        &self.json
    }

    /// The fields as a JSON object, for a lock server's table.
    #[cfg(any(feature = "postgres", test))]
    pub(crate) fn object(&self) -> String {
        format!("{{{}}}", &self.json[1..])
    }
}

/// The fields of a record: its top-level keys that are not the record's
/// own, with string, number or boolean values.
pub(crate) fn extra_fields(map: &serde_json::Map<String, Value>) -> Vec<(String, FieldValue)> {
    map.iter()
        .filter(|(key, _)| !RESERVED_KEYS.contains(&key.as_str()))
        .filter_map(|(key, value)| Some((key.clone(), FieldValue::from_json(value)?)))
        .collect()
}

/// The fields of a JSON object stored by a lock server; none for anything
/// else.
#[cfg(any(feature = "postgres", test))]
pub(crate) fn parse_object(text: &str) -> Vec<(String, FieldValue)> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => extra_fields(&map),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(given: &[(&str, FieldValue)]) -> Result<Option<Arc<OwnerFields>>> {
        let given: Vec<_> = given.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
        OwnerFields::new(&given)
    }

    #[test]
    fn fields_become_json_in_order_and_later_values_win() {
        let made = fields(&[
            ("addr", FieldValue::from("a\"b")),
            ("port", FieldValue::from(1u16)),
            ("port", FieldValue::from(2u16)),
            ("up", FieldValue::from(true)),
            ("load", FieldValue::from(0.5)),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(made.json(), r#","addr":"a\"b","port":2,"up":true,"load":0.5"#);
        assert_eq!(made.object(), r#"{"addr":"a\"b","port":2,"up":true,"load":0.5}"#);
        assert_eq!(parse_object(&made.object()).len(), 4);
        assert_eq!(fields(&[]).unwrap(), None);
    }

    #[test]
    fn bad_fields_are_refused() {
        for key in ["", "pid", "holderId", "leaseExpiresAt", "a\nb", &"k".repeat(65)] {
            assert!(fields(&[(key, FieldValue::from(1u16))]).is_err(), "{key:?}");
        }
        assert!(fields(&[("x", FieldValue::from(f64::NAN))]).is_err());
        assert!(fields(&[("x", FieldValue::from(f64::INFINITY))]).is_err());
        let big = "v".repeat(MAX_FIELDS_LEN);
        assert!(fields(&[("x", FieldValue::from(big))]).is_err());
        assert!(fields(&[("x", FieldValue::from("v".repeat(4000)))]).is_ok());
    }

    #[test]
    fn values_read_back_whoever_wrote_them() {
        let json: Value = serde_json::from_str(
            r#"{"pid":1,"port":8080,"big":18446744073709551615,"f":8080.0,"s":"x","b":false,"n":null,"a":[1],"o":{}}"#,
        )
        .unwrap();
        let Value::Object(map) = json else { unreachable!() };
        let got = extra_fields(&map);
        let get = |k: &str| got.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        assert_eq!(get("pid"), None, "the record's own");
        assert_eq!(get("port").and_then(|v| v.as_i64()), Some(8080));
        assert_eq!(get("big").and_then(|v| v.as_u64()), Some(u64::MAX));
        assert_eq!(get("f").and_then(|v| v.as_i64()), Some(8080));
        assert_eq!(
            get("s").and_then(|v| v.as_str().map(str::to_owned)),
            Some("x".into())
        );
        assert_eq!(get("b").and_then(|v| v.as_bool()), Some(false));
        assert!(get("n").is_none() && get("a").is_none() && get("o").is_none());
    }
}
