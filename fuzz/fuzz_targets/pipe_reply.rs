//! Fuzz the reply-pipe decoder, `ictus_abi::PipeMessage::parse`: what one `read` took
//! from a call channel's reply pipe, written by a server the caller does not control.
//! Besides never panicking, an accepted message is exactly one message: a plain reply
//! that encodes back to the bytes it came from, or the on-socket word itself.
#![no_main]

use ictus_abi::{Header, PipeMessage, ReplyKind, HEADER_LEN, PIPE_MESSAGE_MAX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match PipeMessage::parse(data) {
        Err(_) => {}
        Ok(PipeMessage::OnSocket { kept }) => assert_eq!(data, PipeMessage::on_socket(kept)),
        Ok(PipeMessage::Reply { header, inline }) => {
            assert!(data.len() <= PIPE_MESSAGE_MAX);
            assert_eq!(data.len(), HEADER_LEN + inline.len());
            assert_eq!(header.inline_len as usize, inline.len());
            assert_eq!((header.reply, header.ndesc, header.nfds, header.big_len), (ReplyKind::None, 0, 0, 0));
            assert!(!header.on_socket);
            let mut head = [0u8; HEADER_LEN];
            header.encode(&mut head);
            assert_eq!(&head[..], &data[..HEADER_LEN], "re-encoding an accepted header changed its bytes");
            assert_eq!(Header::decode(&head), Ok(header));
        }
    }
});
