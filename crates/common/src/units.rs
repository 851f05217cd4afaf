//! Human-friendly sizes (`512MiB`, `16GiB`, `1.5GB`, `4096`) and durations
//! (`500ms`, `10s`, `2m`) as accepted by every flag, env var and config file.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// A size in bytes parsed from a human-friendly string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_size(s).map(ByteSize)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_size(self.0))
    }
}

impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// Parses `512MiB`, `16GiB`, `1.5GB`, `64k`, or plain bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty size; use e.g. 512MiB, 16GiB, 1.5GB or a byte count".into());
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "t" | "tb" => 1_000_000_000_000,
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        "ti" | "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "unknown size unit {unit:?} in {s:?}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
            ))
        }
    };
    let bad = || format!("invalid size {s:?}; use e.g. 512MiB, 16GiB, 1.5GB or a byte count");
    if num.is_empty() {
        return Err(bad());
    }
    if num.contains('.') {
        let f: f64 = num.parse().map_err(|_| bad())?;
        let v = f * mult as f64;
        if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
            return Err(format!("size {s:?} is out of range"));
        }
        Ok(v.round() as u64)
    } else {
        let n: u64 = num.parse().map_err(|_| bad())?;
        n.checked_mul(mult)
            .ok_or_else(|| format!("size {s:?} is out of range"))
    }
}

/// Formats bytes with binary units, e.g. `1.50 GiB`.
pub fn format_size(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

/// A duration parsed from `500ms`, `10s`, `2m`, `1h 30m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        parse_duration(s).map(HumanDuration)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl<'de> serde::Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("invalid duration {s:?} ({e}); use e.g. 500ms, 10s, 2m"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("16GiB"), Ok(16 << 30));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size(" 64 KiB "), Ok(64 << 10));
        assert!(parse_size("").is_err());
        assert!(parse_size("12XB")
            .unwrap_err()
            .contains("unknown size unit"));
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("99999999999999999999TiB").is_err());
        assert!(parse_size("1.2.3GB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("soon").is_err());
    }

    proptest::proptest! {
        #[test]
        fn size_parse_never_panics(s in ".{0,24}") {
            let _ = parse_size(&s);
        }
        #[test]
        fn size_round_trips_plain(n in 0u64..u64::MAX) {
            proptest::prop_assert_eq!(parse_size(&n.to_string()), Ok(n));
        }
    }
}
