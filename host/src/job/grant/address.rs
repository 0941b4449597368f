//! Address ranges and the private addresses a granted name may not
//! resolve into unless a range or a literal rule grants them.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use super::GrantSyntaxError;

/// An address range in CIDR form (`10.0.0.0/8`, `fd00::/8`, or one
/// address).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressRange {
    network: IpAddr,
    prefix: u8,
}

impl AddressRange {
    /// Whether `addr` is in the range (an IPv4-mapped IPv6 address counts
    /// as its IPv4 address).
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.network, canonical(addr)) {
            (IpAddr::V4(net), IpAddr::V4(a)) => prefix_eq(&net.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(net), IpAddr::V6(a)) => prefix_eq(&net.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let (whole, rest) = (usize::from(bits / 8), bits % 8);
    a[..whole] == b[..whole] && (rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0)
}

impl FromStr for AddressRange {
    type Err = GrantSyntaxError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| GrantSyntaxError(format!("address range {text:?}: {why}"));
        let (addr, prefix) = match text.trim().split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text.trim(), None),
        };
        let network: IpAddr = addr.parse().map_err(|_| bad("expected an address or ADDRESS/PREFIX"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => {
                p.parse::<u8>().ok().filter(|p| *p <= max).ok_or_else(|| bad(&format!("prefix must be 0–{max}")))?
            }
            None => max,
        };
        let range = AddressRange { network, prefix };
        if !range.contains(network) || masked(network, prefix) != network {
            return Err(bad("the address has bits set past the prefix"));
        }
        Ok(range)
    }
}

fn masked(addr: IpAddr, prefix: u8) -> IpAddr {
    fn mask(bytes: &mut [u8], prefix: u8) {
        for (i, b) in bytes.iter_mut().enumerate() {
            let keep = u32::from(prefix).saturating_sub(i as u32 * 8).min(8);
            *b &= if keep == 0 { 0 } else { 0xffu8 << (8 - keep) };
        }
    }
    match addr {
        IpAddr::V4(a) => {
            let mut o = a.octets();
            mask(&mut o, prefix);
            IpAddr::V4(o.into())
        }
        IpAddr::V6(a) => {
            let mut o = a.octets();
            mask(&mut o, prefix);
            IpAddr::V6(o.into())
        }
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

crate::job::serde_as_text!(AddressRange);

/// An IPv4-mapped IPv6 address as its IPv4 address; any other unchanged.
pub(super) fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
        v4 => v4,
    }
}

/// Whether `addr` is outside the public internet: loopback, private,
/// link-local, shared (CGNAT), unspecified, broadcast, multicast,
/// documentation, unique-local IPv6, or an IPv4-mapped one of those. A
/// name that resolves to such an address needs the range granted.
pub fn is_private(addr: IpAddr) -> bool {
    match canonical(addr) {
        IpAddr::V4(a) => {
            let [o0, o1, ..] = a.octets();
            a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_broadcast()
                || a.is_multicast()
                || a.is_documentation()
                || o0 == 0
                || (o0 == 100 && (64..128).contains(&o1))
                || (o0 == 192 && o1 == 0)
                || o0 >= 240
        }
        IpAddr::V6(a) => {
            let s0 = a.segments()[0];
            a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || (s0 & 0xfe00) == 0xfc00
                || (s0 & 0xffc0) == 0xfe80
                || (s0 == 0x2001 && a.segments()[1] == 0x0db8)
                // NAT64 and 6to4 wrap IPv4 addresses a gateway may turn private.
                || s0 == 0x0064
                || s0 == 0x2002
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_strictly() {
        assert_eq!("10.0.0.0/8".parse::<AddressRange>().unwrap().to_string(), "10.0.0.0/8");
        assert_eq!("::1".parse::<AddressRange>().unwrap().to_string(), "::1/128");
        assert!("10.0.0.1/8".parse::<AddressRange>().is_err(), "host bits past the prefix");
        assert!("10.0.0.0/33".parse::<AddressRange>().is_err());
        assert!("ten/8".parse::<AddressRange>().is_err());
        let r: AddressRange = "172.16.0.0/12".parse().unwrap();
        assert!(r.contains("172.31.255.255".parse().unwrap()));
        assert!(!r.contains("172.32.0.0".parse().unwrap()));
    }
}
