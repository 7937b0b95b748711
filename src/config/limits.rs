//! Caps on the configuration text, checked before the YAML parser builds anything: a config is a few
//! KB, and without caps a 100 KB file can take seconds to reject (libyaml's scanner costs
//! O(tokens x flow depth)) or expand into gigabytes through aliases.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// Largest config file read (checked on the length before parsing, and while reading the file).
pub const MAX_FILE_BYTES: usize = 1 << 20;

/// Most `[` and `{` bytes in the text. libyaml rescans its stack of flow levels for every token,
/// and a plain byte scan cannot tell a real bracket from one inside a quoted string (which
/// could fake closing brackets), so the bound is on the count, which bounds the depth soundly.
/// The shipped config has 5.
pub const MAX_FLOW_BRACKETS: usize = 256;

/// Most YAML nodes, aliases counted at every use (the shipped config has about 200).
/// Depth needs no cap of ours: serde_norway stops at 128 levels ("recursion limit exceeded").
pub const MAX_NODES: usize = 100_000;

/// Rejects text over the size or bracket caps, before any YAML parsing.
pub fn check_text(text: &str) -> Result<(), String> {
    if text.len() > MAX_FILE_BYTES {
        return Err(format!(
            "{} bytes is more than the {MAX_FILE_BYTES}-byte limit of a config file",
            text.len()
        ));
    }
    let brackets = text.bytes().filter(|b| matches!(b, b'[' | b'{')).count();
    if brackets > MAX_FLOW_BRACKETS {
        return Err(format!(
            "{brackets} `[`/`{{` characters is more than the limit of {MAX_FLOW_BRACKETS} \
             (flow nesting is costly to parse)"
        ));
    }
    Ok(())
}

/// Walks the document without building it, counting nodes (each alias use replays its anchor)
/// and stopping past [`MAX_NODES`]. Syntax errors surface here too.
pub fn check_nodes(text: &str) -> Result<(), serde_norway::Error> {
    let mut left = MAX_NODES;
    Count(&mut left).deserialize(serde_norway::Deserializer::from_str(text))
}

struct Count<'a>(&'a mut usize);

impl Count<'_> {
    fn take<E: de::Error>(&mut self) -> Result<(), E> {
        match self.0.checked_sub(1) {
            Some(n) => {
                *self.0 = n;
                Ok(())
            }
            None => Err(E::custom(format!(
                "more than {MAX_NODES} YAML nodes (aliases count at each use)"
            ))),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_bool<E: de::Error>(mut self, _: bool) -> Result<(), E> {
        self.take()
    }
    fn visit_i64<E: de::Error>(mut self, _: i64) -> Result<(), E> {
        self.take()
    }
    fn visit_i128<E: de::Error>(mut self, _: i128) -> Result<(), E> {
        self.take()
    }
    fn visit_u64<E: de::Error>(mut self, _: u64) -> Result<(), E> {
        self.take()
    }
    fn visit_u128<E: de::Error>(mut self, _: u128) -> Result<(), E> {
        self.take()
    }
    fn visit_f64<E: de::Error>(mut self, _: f64) -> Result<(), E> {
        self.take()
    }
    fn visit_str<E: de::Error>(mut self, _: &str) -> Result<(), E> {
        self.take()
    }
    fn visit_unit<E: de::Error>(mut self) -> Result<(), E> {
        self.take()
    }
    fn visit_none<E: de::Error>(mut self) -> Result<(), E> {
        self.take()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.take()?;
        while seq.next_element_seed(Count(&mut *self.0))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        self.take()?;
        while map.next_key_seed(Count(&mut *self.0))?.is_some() {
            map.next_value_seed(Count(&mut *self.0))?;
        }
        Ok(())
    }

    /// A tagged node (`!tag value`).
    fn visit_enum<A: de::EnumAccess<'de>>(mut self, data: A) -> Result<(), A::Error> {
        use de::VariantAccess;
        self.take()?;
        let (de::IgnoredAny, variant) = data.variant()?;
        variant.newtype_variant_seed(Count(&mut *self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_config_is_far_below_every_cap() {
        let text = super::super::DEFAULT_YAML;
        check_text(text).unwrap();
        let mut left = MAX_NODES;
        Count(&mut left)
            .deserialize(serde_norway::Deserializer::from_str(text))
            .unwrap();
        assert!(MAX_NODES - left < 1_000, "{} nodes", MAX_NODES - left);
    }

    #[test]
    fn alias_expansion_is_cut_off() {
        // 400 uses of a 400-item anchor: 5 KB of block YAML, 160,000 nodes once expanded.
        let text = format!(
            "a: &a\n{}b:\n{}",
            "  - 1\n".repeat(400),
            "  - *a\n".repeat(400)
        );
        check_text(&text).unwrap();
        let e = check_nodes(&text).unwrap_err().to_string();
        assert!(e.contains("YAML nodes"), "{e}");
    }
}
