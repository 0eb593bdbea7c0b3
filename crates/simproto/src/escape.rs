//! The RM escapes over the simulated driver's socket: what `ioctl(2)` on `/dev/nvidiactl` is on
//! a real node, byte for byte.
//!
//! A real caller issues `ioctl(fd, _IOWR('F', nr, size), arg)`: the kernel reads the escape
//! number and the size from the command, copies `size` bytes of `arg` in, and for RM_ALLOC and
//! RM_CONTROL follows the pointer in `arg` to a parameter block of `paramsSize` bytes, which it
//! copies in and back out. Over the socket the same bytes travel in one frame: the escape
//! number, the argument bytes and, where the argument points to one, the parameter block (the
//! pointer field itself is meaningless here and ignored). The answer carries both back, with the
//! ioctl's own return (0, or an errno for a malformed call, as `nvidia_ioctl` returns
//! `-EINVAL`); the RM status is inside the argument bytes, where the kernel writes it.
//!
//! Descriptors the kernel would resolve by number in the caller's table (the capability fd in
//! NV_IMEX_SESSION's `capDescriptor`, the OS event fd of NV_ESC_ALLOC_OS_EVENT, a GPU fd) ride
//! with the frame as SCM_RIGHTS, and the frame lists the number each had in the sender, so the
//! driver resolves a field holding such a number exactly as the kernel does.
//!
//! Frames share the socket with the JSON requests of the application library (the `proto`
//! module): both are a 4-byte big-endian length and a body (the `frame` module sends and reads
//! them), and an escape body starts with [`ESCAPE_MAGIC`], a byte no JSON text starts with.
//! This module is the codec alone, a leaf: no socket, no other module of the crate.
//!
//! ```text
//! request body:  magic u8 | nr u8 | fds u8 | 0 u8 | arg_len u32le | params_len u32le
//!                | fd numbers (i32le × fds) | arg | params
//! response body: magic u8 | nr u8 | 0 u8 | 0 u8 | ret i32le | arg_len u32le | params_len u32le
//!                | arg | params
//! ```

use std::os::fd::{OwnedFd, RawFd};

/// First byte of an escape frame's body (never the first byte of a JSON text).
pub const ESCAPE_MAGIC: u8 = 0xE5;

/// The largest argument the kernel takes in one ioctl (`NV_ABSOLUTE_MAX_IOCTL_SIZE`, 16 KiB;
/// bigger ones go through NV_ESC_IOCTL_XFER_CMD, which nothing here needs).
pub const MAX_ARG: usize = 16 << 10;

/// The largest parameter block a control or an allocation carries here (GET_FABRIC_EVENTS,
/// 11,272 bytes in 595, is the largest the daemon uses).
pub const MAX_PARAMS: usize = 64 << 10;

/// Most descriptors one escape passes (the kernel resolves at most two per call here).
pub const MAX_FDS: usize = 8;

/// One escape as the caller issued it.
#[derive(Debug, Default)]
pub struct EscapeCall {
    /// `_IOC_NR` of the command.
    pub nr: u8,
    /// The argument (`_IOC_SIZE` bytes).
    pub arg: Vec<u8>,
    /// The block the argument points to (RM_ALLOC's `pAllocParms`, RM_CONTROL's `params`), or
    /// empty.
    pub params: Vec<u8>,
    /// The passed descriptors, with the number each had in the caller's table.
    pub fds: Vec<(RawFd, OwnedFd)>,
}

impl EscapeCall {
    /// The passed descriptor the caller knew as `number`, as the kernel resolves an fd field.
    pub fn fd(&self, number: i64) -> Option<&OwnedFd> {
        self.fds
            .iter()
            .find(|(n, _)| i64::from(*n) == number)
            .map(|(_, fd)| fd)
    }
}

/// The driver's answer to an escape.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EscapeReply {
    /// The ioctl's return: 0, or a positive errno (EINVAL, EFAULT, …) the caller sees as -1.
    pub errno: i32,
    /// The argument as the kernel copies it back (with the RM status in it).
    pub arg: Vec<u8>,
    /// The parameter block as copied back.
    pub params: Vec<u8>,
}

/// A frame's body, told apart by its first byte.
#[derive(Debug)]
pub enum Body<'a> {
    /// An escape frame ([`decode_call`], [`decode_reply`]).
    Escape(&'a [u8]),
    /// A JSON message (the `proto` module's).
    Json(&'a [u8]),
}

/// Which kind of frame `body` is.
pub fn classify(body: &[u8]) -> Body<'_> {
    match body.first() {
        Some(&ESCAPE_MAGIC) => Body::Escape(body),
        _ => Body::Json(body),
    }
}

/// Errors decoding an escape frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// The body is shorter than its header says.
    #[error("escape frame truncated: {what} needs {need} bytes, {have} left")]
    Truncated {
        /// Which part.
        what: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// The body does not start with [`ESCAPE_MAGIC`].
    #[error("not an escape frame (first byte {0:#04x})")]
    NotEscape(u8),
    /// A part is larger than the driver takes.
    #[error("escape frame {what} of {len} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Which part.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The frame lists another number of descriptors than came with it.
    #[error("escape frame lists {listed} descriptors, {passed} came with it")]
    Descriptors {
        /// Listed in the frame.
        listed: usize,
        /// Received with SCM_RIGHTS.
        passed: usize,
    },
    /// Bytes left over after the parts the header names.
    #[error("escape frame has {0} trailing bytes")]
    Trailing(usize),
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, what: &'static str, n: usize) -> Result<&'a [u8], FrameError> {
        if self.0.len() < n {
            return Err(FrameError::Truncated {
                what,
                need: n,
                have: self.0.len(),
            });
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, FrameError> {
        Ok(self.take(what, 1)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, FrameError> {
        let b = self.take(what, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn len(&mut self, what: &'static str, limit: usize) -> Result<usize, FrameError> {
        let len = self.u32(what)? as usize;
        if len > limit {
            return Err(FrameError::TooLarge { what, len, limit });
        }
        Ok(len)
    }
}

fn check_magic(body: &[u8]) -> Result<(), FrameError> {
    match body.first() {
        Some(&ESCAPE_MAGIC) => Ok(()),
        Some(&b) => Err(FrameError::NotEscape(b)),
        None => Err(FrameError::Truncated {
            what: "header",
            need: 1,
            have: 0,
        }),
    }
}

/// Encodes a call's body (after the length) into `out`.
pub fn encode_call(out: &mut Vec<u8>, nr: u8, arg: &[u8], params: &[u8], fd_numbers: &[RawFd]) {
    out.extend_from_slice(&[ESCAPE_MAGIC, nr, fd_numbers.len() as u8, 0]);
    out.extend_from_slice(&(arg.len() as u32).to_le_bytes());
    out.extend_from_slice(&(params.len() as u32).to_le_bytes());
    for n in fd_numbers {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(arg);
    out.extend_from_slice(params);
}

/// Decodes a call's body, pairing the listed numbers with the descriptors that came with it
/// (in order).
pub fn decode_call(body: &[u8], passed: Vec<OwnedFd>) -> Result<EscapeCall, FrameError> {
    check_magic(body)?;
    let mut r = Reader(&body[1..]);
    let nr = r.u8("escape number")?;
    let listed = r.u8("descriptor count")? as usize;
    r.u8("padding")?;
    let arg_len = r.len("argument", MAX_ARG)?;
    let params_len = r.len("parameters", MAX_PARAMS)?;
    if listed != passed.len() || listed > MAX_FDS {
        return Err(FrameError::Descriptors {
            listed,
            passed: passed.len(),
        });
    }
    let mut numbers = Vec::with_capacity(listed);
    for _ in 0..listed {
        numbers.push(r.u32("descriptor number")? as i32);
    }
    let arg = r.take("argument", arg_len)?.to_vec();
    let params = r.take("parameters", params_len)?.to_vec();
    if !r.0.is_empty() {
        return Err(FrameError::Trailing(r.0.len()));
    }
    Ok(EscapeCall {
        nr,
        arg,
        params,
        fds: numbers.into_iter().zip(passed).collect(),
    })
}

/// Encodes a reply's body into `out`.
pub fn encode_reply(out: &mut Vec<u8>, nr: u8, reply: &EscapeReply) {
    out.extend_from_slice(&[ESCAPE_MAGIC, nr, 0, 0]);
    out.extend_from_slice(&reply.errno.to_le_bytes());
    out.extend_from_slice(&(reply.arg.len() as u32).to_le_bytes());
    out.extend_from_slice(&(reply.params.len() as u32).to_le_bytes());
    out.extend_from_slice(&reply.arg);
    out.extend_from_slice(&reply.params);
}

/// Decodes a reply's body: the errno, and the argument and parameter bytes copied into `arg`
/// and `params`, which must have the lengths sent (the kernel copies back what it copied in).
pub fn decode_reply(body: &[u8], arg: &mut [u8], params: &mut [u8]) -> Result<i32, FrameError> {
    check_magic(body)?;
    let mut r = Reader(&body[1..]);
    r.take("header", 3)?;
    let errno = r.u32("errno")? as i32;
    let arg_len = r.len("argument", MAX_ARG)?;
    let params_len = r.len("parameters", MAX_PARAMS)?;
    if arg_len != arg.len() {
        return Err(FrameError::Truncated {
            what: "argument copied back",
            need: arg.len(),
            have: arg_len,
        });
    }
    if params_len != params.len() {
        return Err(FrameError::Truncated {
            what: "parameters copied back",
            need: params.len(),
            have: params_len,
        });
    }
    arg.copy_from_slice(r.take("argument", arg_len)?);
    params.copy_from_slice(r.take("parameters", params_len)?);
    if !r.0.is_empty() {
        return Err(FrameError::Trailing(r.0.len()));
    }
    Ok(errno)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_round_trips_with_its_descriptor_numbers() {
        let mut body = Vec::new();
        encode_call(&mut body, 0x2B, &[1, 2, 3], &[9; 32], &[7, 12]);
        assert!(matches!(classify(&body), Body::Escape(_)));
        let a = std::fs::File::open("/dev/null").unwrap();
        let b = std::fs::File::open("/dev/null").unwrap();
        let call = decode_call(&body, vec![a.into(), b.into()]).unwrap();
        assert_eq!((call.nr, call.arg.as_slice()), (0x2B, &[1u8, 2, 3][..]));
        assert_eq!(call.params, vec![9; 32]);
        assert!(call.fd(12).is_some() && call.fd(7).is_some());
        assert!(call.fd(3).is_none(), "a number the caller did not pass");
    }

    #[test]
    fn a_reply_copies_back_into_the_callers_buffers() {
        let reply = EscapeReply {
            errno: 0,
            arg: vec![4; 48],
            params: vec![5; 32],
        };
        let mut body = Vec::new();
        encode_reply(&mut body, 0x2B, &reply);
        let (mut arg, mut params) = (vec![0; 48], vec![0; 32]);
        assert_eq!(decode_reply(&body, &mut arg, &mut params), Ok(0));
        assert_eq!((arg, params), (reply.arg, reply.params));
        let mut short = vec![0; 16];
        assert!(decode_reply(&body, &mut short, &mut [0; 32]).is_err());
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        let mut body = Vec::new();
        encode_call(&mut body, 1, &[0; 8], &[], &[3]);
        assert_eq!(
            decode_call(&body, Vec::new()).unwrap_err(),
            FrameError::Descriptors {
                listed: 1,
                passed: 0
            }
        );
        for cut in 0..body.len() {
            let _ = decode_call(&body[..cut], Vec::new());
            let _ = decode_reply(&body[..cut], &mut [], &mut []);
        }
        let mut huge = vec![ESCAPE_MAGIC, 1, 0, 0];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&0u32.to_le_bytes());
        assert!(matches!(
            decode_call(&huge, Vec::new()),
            Err(FrameError::TooLarge { .. })
        ));
        assert!(matches!(classify(b"{\"Stats\":null}"), Body::Json(_)));
    }
}
