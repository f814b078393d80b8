//! Notification message ids, with Mach's numbers (`mach/notify.h`).
//!
//! A notification is an ordinary message sent to the port a task named when it asked
//! for it. Its in-line data is 8 bytes: the name it concerns (u32 LE) and, for
//! no-senders, the make-send count (u32 LE; zero otherwise). A port-destroyed
//! notification also carries the receive right as its one port descriptor.

/// The kinds of notification, as message ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum NotifyId {
    /// The receive right named by the request was destroyed; the notification carries
    /// it instead (`MACH_NOTIFY_PORT_DESTROYED`).
    PortDestroyed = 0o105,
    /// No send rights remain for the port (`MACH_NOTIFY_NO_SENDERS`).
    NoSenders = 0o106,
    /// A send-once right to the port was destroyed unused (`MACH_NOTIFY_SEND_ONCE`).
    SendOnce = 0o107,
    /// The port named by a send or send-once right died; the name is now a dead name
    /// (`MACH_NOTIFY_DEAD_NAME`).
    DeadName = 0o110,
    /// ictus's own, sent by the nucleus on the reply right of a request that the
    /// destination refused unread because it is larger than the port takes (Mach's
    /// receiver gets `MACH_RCV_TOO_LARGE`; here the caller hears of it too). The count
    /// in its body is the port's message limit, in bytes.
    TooLarge = 0o111,
}

impl NotifyId {
    /// The message id of this notification.
    pub const fn id(self) -> i32 {
        self as i32
    }

    /// Recognise a notification by its message id.
    pub const fn from_id(id: i32) -> Option<NotifyId> {
        match id {
            0o105 => Some(NotifyId::PortDestroyed),
            0o106 => Some(NotifyId::NoSenders),
            0o107 => Some(NotifyId::SendOnce),
            0o110 => Some(NotifyId::DeadName),
            0o111 => Some(NotifyId::TooLarge),
            _ => None,
        }
    }

    /// Encode the body of a notification.
    pub fn body(name: crate::Name, count: u32) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&name.0.to_le_bytes());
        b[4..].copy_from_slice(&count.to_le_bytes());
        b
    }

    /// Decode the body of a notification: the name and the count.
    pub fn parse_body(body: &[u8]) -> Option<(crate::Name, u32)> {
        if body.len() != 8 {
            return None;
        }
        let name = u32::from_le_bytes(body[..4].try_into().ok()?);
        let count = u32::from_le_bytes(body[4..].try_into().ok()?);
        Some((crate::Name(name), count))
    }
}
