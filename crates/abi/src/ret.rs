//! Return codes, with Mach's numbers (`mach/kern_return.h`, `mach/message.h`).
//!
//! Inside ictus errors are typed enums named by their verb (`SendError`,
//! `ReceiveError`, …); these codes exist for the wire, where a server's answer must
//! be a number, and for people who know Mach.

/// A Mach-style return code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ReturnCode {
    /// `KERN_SUCCESS`
    Success = 0,
    /// `KERN_INVALID_ADDRESS`
    InvalidAddress = 1,
    /// `KERN_NO_SPACE`
    NoSpace = 3,
    /// `KERN_INVALID_ARGUMENT`
    InvalidArgument = 4,
    /// `KERN_FAILURE`
    Failure = 5,
    /// `KERN_RESOURCE_SHORTAGE`
    ResourceShortage = 6,
    /// `KERN_NO_ACCESS`
    NoAccess = 8,
    /// `KERN_NAME_EXISTS`
    NameExists = 13,
    /// `KERN_INVALID_NAME`
    InvalidName = 15,
    /// `KERN_INVALID_RIGHT`
    InvalidRight = 17,
    /// `KERN_INVALID_VALUE`
    InvalidValue = 18,
    /// `KERN_UREFS_OVERFLOW`
    UrefsOverflow = 19,
    /// `KERN_INVALID_CAPABILITY`
    InvalidCapability = 20,
    /// `KERN_NOT_IN_SET`
    NotInSet = 12,
    /// `MACH_SEND_INVALID_DATA`
    SendInvalidData = 0x1000_0002,
    /// `MACH_SEND_INVALID_DEST`
    SendInvalidDest = 0x1000_0003,
    /// `MACH_SEND_TIMED_OUT`
    SendTimedOut = 0x1000_0004,
    /// `MACH_SEND_NO_BUFFER`
    SendNoBuffer = 0x1000_000d,
    /// `MACH_SEND_INVALID_RIGHT`
    SendInvalidRight = 0x1000_0007,
    /// `MACH_RCV_INVALID_NAME`
    RcvInvalidName = 0x1000_4002,
    /// `MACH_RCV_TIMED_OUT`
    RcvTimedOut = 0x1000_4003,
    /// `MACH_RCV_TOO_LARGE`
    RcvTooLarge = 0x1000_4004,
    /// `MACH_RCV_INVALID_DATA`
    RcvInvalidData = 0x1000_4008,
    /// `MACH_RCV_PORT_DIED`
    RcvPortDied = 0x1000_4009,
    /// `MIG_BAD_ID`: the server does not know the message id.
    MigBadId = 0xffff_fed1,
    /// `MIG_BAD_ARGUMENTS`: the request did not decode.
    MigBadArguments = 0xffff_fed0,
    /// `MIG_SERVER_DIED`: the server died before replying.
    MigServerDied = 0xffff_fed7,
}

impl ReturnCode {
    /// Every code, for look-ups and tests.
    pub const ALL: [ReturnCode; 27] = [
        ReturnCode::Success,
        ReturnCode::InvalidAddress,
        ReturnCode::NoSpace,
        ReturnCode::InvalidArgument,
        ReturnCode::Failure,
        ReturnCode::ResourceShortage,
        ReturnCode::NoAccess,
        ReturnCode::NameExists,
        ReturnCode::InvalidName,
        ReturnCode::InvalidRight,
        ReturnCode::InvalidValue,
        ReturnCode::UrefsOverflow,
        ReturnCode::InvalidCapability,
        ReturnCode::NotInSet,
        ReturnCode::SendInvalidData,
        ReturnCode::SendInvalidDest,
        ReturnCode::SendTimedOut,
        ReturnCode::SendNoBuffer,
        ReturnCode::SendInvalidRight,
        ReturnCode::RcvInvalidName,
        ReturnCode::RcvTimedOut,
        ReturnCode::RcvTooLarge,
        ReturnCode::RcvInvalidData,
        ReturnCode::RcvPortDied,
        ReturnCode::MigBadId,
        ReturnCode::MigBadArguments,
        ReturnCode::MigServerDied,
    ];

    /// The numeric code.
    pub const fn code(self) -> u32 {
        self as u32
    }

    /// Recognise a numeric code; `None` for a number ictus does not define.
    pub fn from_code(code: u32) -> Option<ReturnCode> {
        Self::ALL.iter().copied().find(|r| r.code() == code)
    }
}

impl std::fmt::Display for ReturnCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} ({:#x})", self, self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for r in ReturnCode::ALL {
            assert_eq!(ReturnCode::from_code(r.code()), Some(r));
        }
        assert_eq!(ReturnCode::from_code(0xdead_beef), None);
    }
}
