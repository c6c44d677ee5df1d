pub const PROTOCOL_VERSION: u32 = 1;
