//! Return codes, with Mach's numbers (`mach/kern_return.h`, `mach/message.h`,
//! `mach/mig_errors.h`).
//!
//! Inside ictus errors are typed enums named by their verb (`SendError`,
//! `ReceiveError`, …); these codes exist for the wire, where a server's answer must
//! be a number, and for people who know Mach.
//!
//! A [`ReturnCode`] is an *open* number: any `u32` is a return code, and the ones Mach
//! (and ictus) give a meaning are associated constants. A server's error type maps
//! each of its errors to a code — usually one of these, so that every ictus answer
//! reads in one numbering — and a client maps codes back, keeping the number of one it
//! does not know instead of losing it. The constants keep the names the enum had
//! (`ReturnCode::InvalidName`), which are Mach's names without their prefixes, so code
//! written against them reads the same.

use std::fmt;

/// A Mach-style return code: `0` is success, anything else says why not.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReturnCode(pub u32);

/// Mach's names, as the enum's variants were spelt (see the module documentation).
#[allow(non_upper_case_globals)]
impl ReturnCode {
    /// `KERN_SUCCESS`
    pub const Success: ReturnCode = ReturnCode(0);
    /// `KERN_INVALID_ADDRESS`
    pub const InvalidAddress: ReturnCode = ReturnCode(1);
    /// `KERN_NO_SPACE`
    pub const NoSpace: ReturnCode = ReturnCode(3);
    /// `KERN_INVALID_ARGUMENT`
    pub const InvalidArgument: ReturnCode = ReturnCode(4);
    /// `KERN_FAILURE`
    pub const Failure: ReturnCode = ReturnCode(5);
    /// `KERN_RESOURCE_SHORTAGE`
    pub const ResourceShortage: ReturnCode = ReturnCode(6);
    /// `KERN_NO_ACCESS`
    pub const NoAccess: ReturnCode = ReturnCode(8);
    /// `KERN_NOT_IN_SET`
    pub const NotInSet: ReturnCode = ReturnCode(12);
    /// `KERN_NAME_EXISTS`
    pub const NameExists: ReturnCode = ReturnCode(13);
    /// `KERN_INVALID_NAME`
    pub const InvalidName: ReturnCode = ReturnCode(15);
    /// `KERN_INVALID_RIGHT`
    pub const InvalidRight: ReturnCode = ReturnCode(17);
    /// `KERN_INVALID_VALUE`
    pub const InvalidValue: ReturnCode = ReturnCode(18);
    /// `KERN_UREFS_OVERFLOW`
    pub const UrefsOverflow: ReturnCode = ReturnCode(19);
    /// `KERN_INVALID_CAPABILITY`
    pub const InvalidCapability: ReturnCode = ReturnCode(20);
    /// ictus's own: a per-client quota was reached (the server's error says which).
    /// Mach has no such code; ictus's own codes live in `0x0001_0000..0x0002_0000`,
    /// above every `kern_return_t` and below the `MACH_SEND_…` range.
    pub const QuotaExceeded: ReturnCode = ReturnCode(0x0001_0001);
    /// `MACH_SEND_INVALID_DATA`
    pub const SendInvalidData: ReturnCode = ReturnCode(0x1000_0002);
    /// `MACH_SEND_INVALID_DEST`
    pub const SendInvalidDest: ReturnCode = ReturnCode(0x1000_0003);
    /// `MACH_SEND_TIMED_OUT`
    pub const SendTimedOut: ReturnCode = ReturnCode(0x1000_0004);
    /// `MACH_SEND_INVALID_RIGHT`
    pub const SendInvalidRight: ReturnCode = ReturnCode(0x1000_0007);
    /// `MACH_SEND_NO_BUFFER`
    pub const SendNoBuffer: ReturnCode = ReturnCode(0x1000_000d);
    /// `MACH_SEND_TOO_LARGE` (XNU's number): the message is larger than the destination
    /// port takes.
    pub const SendTooLarge: ReturnCode = ReturnCode(0x1000_000e);
    /// `MACH_RCV_INVALID_NAME`
    pub const RcvInvalidName: ReturnCode = ReturnCode(0x1000_4002);
    /// `MACH_RCV_TIMED_OUT`
    pub const RcvTimedOut: ReturnCode = ReturnCode(0x1000_4003);
    /// `MACH_RCV_TOO_LARGE`
    pub const RcvTooLarge: ReturnCode = ReturnCode(0x1000_4004);
    /// `MACH_RCV_PORT_CHANGED`: the receive right moved while a thread waited on it.
    pub const RcvPortChanged: ReturnCode = ReturnCode(0x1000_4006);
    /// `MACH_RCV_INVALID_DATA`
    pub const RcvInvalidData: ReturnCode = ReturnCode(0x1000_4008);
    /// `MACH_RCV_PORT_DIED`
    pub const RcvPortDied: ReturnCode = ReturnCode(0x1000_4009);
    /// `MIG_BAD_ARGUMENTS`: the request did not decode.
    pub const MigBadArguments: ReturnCode = ReturnCode(0xffff_fed0);
    /// `MIG_BAD_ID`: the server does not know the message id.
    pub const MigBadId: ReturnCode = ReturnCode(0xffff_fed1);
    /// `MIG_SERVER_DIED`: the server died before replying.
    pub const MigServerDied: ReturnCode = ReturnCode(0xffff_fed7);
}

/// Every known code and its name, in numeric order.
const KNOWN: [(ReturnCode, &str); 30] = [
    (ReturnCode::Success, "Success"),
    (ReturnCode::InvalidAddress, "InvalidAddress"),
    (ReturnCode::NoSpace, "NoSpace"),
    (ReturnCode::InvalidArgument, "InvalidArgument"),
    (ReturnCode::Failure, "Failure"),
    (ReturnCode::ResourceShortage, "ResourceShortage"),
    (ReturnCode::NoAccess, "NoAccess"),
    (ReturnCode::NotInSet, "NotInSet"),
    (ReturnCode::NameExists, "NameExists"),
    (ReturnCode::InvalidName, "InvalidName"),
    (ReturnCode::InvalidRight, "InvalidRight"),
    (ReturnCode::InvalidValue, "InvalidValue"),
    (ReturnCode::UrefsOverflow, "UrefsOverflow"),
    (ReturnCode::InvalidCapability, "InvalidCapability"),
    (ReturnCode::QuotaExceeded, "QuotaExceeded"),
    (ReturnCode::SendInvalidData, "SendInvalidData"),
    (ReturnCode::SendInvalidDest, "SendInvalidDest"),
    (ReturnCode::SendTimedOut, "SendTimedOut"),
    (ReturnCode::SendInvalidRight, "SendInvalidRight"),
    (ReturnCode::SendNoBuffer, "SendNoBuffer"),
    (ReturnCode::SendTooLarge, "SendTooLarge"),
    (ReturnCode::RcvInvalidName, "RcvInvalidName"),
    (ReturnCode::RcvTimedOut, "RcvTimedOut"),
    (ReturnCode::RcvTooLarge, "RcvTooLarge"),
    (ReturnCode::RcvPortChanged, "RcvPortChanged"),
    (ReturnCode::RcvInvalidData, "RcvInvalidData"),
    (ReturnCode::RcvPortDied, "RcvPortDied"),
    (ReturnCode::MigBadArguments, "MigBadArguments"),
    (ReturnCode::MigBadId, "MigBadId"),
    (ReturnCode::MigServerDied, "MigServerDied"),
];

impl ReturnCode {
    /// Every code with a name, for look-ups and tests.
    pub const ALL: [ReturnCode; KNOWN.len()] = {
        let mut all = [ReturnCode::Success; KNOWN.len()];
        let mut i = 0;
        while i < KNOWN.len() {
            all[i] = KNOWN[i].0;
            i += 1;
        }
        all
    };

    /// The code for a number (any number: the type is open).
    pub const fn new(code: u32) -> ReturnCode {
        ReturnCode(code)
    }

    /// The numeric code.
    pub const fn code(self) -> u32 {
        self.0
    }

    /// Whether this is [`ReturnCode::Success`].
    pub const fn is_success(self) -> bool {
        self.0 == 0
    }

    /// Recognise a numeric code: `Some` for a code with a name, `None` for a number
    /// ictus gives no meaning (still a valid `ReturnCode(code)`).
    pub fn from_code(code: u32) -> Option<ReturnCode> {
        let r = ReturnCode(code);
        r.name().map(|_| r)
    }

    /// Mach's name of the code (`"InvalidName"`), if it has one.
    pub fn name(self) -> Option<&'static str> {
        KNOWN.iter().find(|(r, _)| *r == self).map(|(_, n)| *n)
    }
}

impl From<u32> for ReturnCode {
    fn from(code: u32) -> ReturnCode {
        ReturnCode(code)
    }
}

impl From<ReturnCode> for u32 {
    fn from(r: ReturnCode) -> u32 {
        r.0
    }
}

impl fmt::Debug for ReturnCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "ReturnCode({:#x})", self.0),
        }
    }
}

impl fmt::Display for ReturnCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} ({:#x})", self.0),
            None => write!(f, "unknown code {:#x}", self.0),
        }
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

    #[test]
    fn the_wire_values_are_machs() {
        assert_eq!(ReturnCode::Success.code(), 0);
        assert_eq!(ReturnCode::NameExists.code(), 13);
        assert_eq!(ReturnCode::InvalidName.code(), 15);
        assert_eq!(ReturnCode::SendInvalidDest.code(), 0x1000_0003);
        assert_eq!(ReturnCode::MigBadId.code(), 0xffff_fed1);
        // Numeric order, no number twice, no name twice.
        for w in KNOWN.windows(2) {
            assert!(w[0].0 < w[1].0, "{:?} before {:?}", w[0].0, w[1].0);
        }
        let mut names: Vec<&str> = KNOWN.iter().map(|(_, n)| *n).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KNOWN.len());
    }

    #[test]
    fn unknown_codes_are_kept_and_said_as_numbers() {
        let r = ReturnCode(0x4242);
        assert_eq!(r.code(), 0x4242);
        assert_eq!(r.name(), None);
        assert_eq!(r.to_string(), "unknown code 0x4242");
        assert_eq!(format!("{r:?}"), "ReturnCode(0x4242)");
        assert_eq!(ReturnCode::InvalidName.to_string(), "InvalidName (0xf)");
        assert_eq!(format!("{:?}", ReturnCode::MigBadId), "MigBadId");
        // Constants work as patterns.
        assert!(matches!(ReturnCode::from(15), ReturnCode::InvalidName));
    }
}
