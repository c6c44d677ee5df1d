//! The Internet checksum (RFC 1071), for the headers the emulator rewrites and the testbed's
//! ICMP echo.

/// The one's-complement sum of `b` as big-endian 16-bit words (an odd last byte is the high
/// half of a word), added onto `acc`; [`fold`] reduces it to 16 bits.
pub fn ones_sum(b: &[u8], mut acc: u32) -> u32 {
    let mut words = b.chunks_exact(2);
    for w in &mut words {
        acc += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        acc += u32::from(*last) << 8;
    }
    acc
}

/// `acc` with its carries folded back in, to 16 bits.
pub fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The checksum of `data`: what goes into a header's checksum field (computed with the field
/// zeroed), or 0 over data whose checksum is right.
pub fn internet_checksum(data: &[u8]) -> u16 {
    !fold(ones_sum(data, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_1071_example_and_an_odd_length() {
        // RFC 1071 section 3: the sum of these words is 0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(ones_sum(&data, 0)), 0xddf2);
        assert_eq!(internet_checksum(&data), !0xddf2);
        assert_eq!(ones_sum(&[0x12, 0x34, 0x56], 0), 0x1234 + 0x5600);
    }
}
