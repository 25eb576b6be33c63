//! What the ledger acknowledges for a durable decision: its seq and its chain [`Hash`]
//! (the daemon's `POST /v1/decisions` answers a list of them).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A 32-byte BLAKE3 entry hash.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Hash(pub [u8; 32]);

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}
impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({self})")
    }
}

/// What the ledger acknowledges for each durable decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The entry's position in the chain.
    pub seq: u64,
    /// The entry's chain hash, lowercase hex.
    #[serde(with = "hash_hex")]
    pub hash: Hash,
}

mod hash_hex {
    use super::*;

    pub fn serialize<S: Serializer>(h: &Hash, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&h.to_string())
    }

    /// Exactly 64 lowercase hex characters, as the ledger writes them.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Hash, D::Error> {
        let s = String::deserialize(d)?;
        if s.len() != 64 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(serde::de::Error::custom(
                "hash: expected 64 lowercase hex characters",
            ));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(&s, &mut out).map_err(serde::de::Error::custom)?;
        Ok(Hash(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipt_reads_back_only_from_lowercase_hex() {
        let r = Receipt {
            seq: 7,
            hash: Hash([0xab; 32]),
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(text, format!(r#"{{"seq":7,"hash":"{}"}}"#, "ab".repeat(32)));
        assert_eq!(serde_json::from_str::<Receipt>(&text).unwrap(), r);
        let upper = text.replace("ab", "AB");
        assert!(serde_json::from_str::<Receipt>(&upper).is_err());
        assert!(serde_json::from_str::<Receipt>(r#"{"seq":7,"hash":"ab"}"#).is_err());
    }
}
