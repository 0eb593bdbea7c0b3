//! The protobuf codec of every generated service: prost's, with a smaller first buffer.
//!
//! tonic gives each stream's encoder and decoder an 8 KiB buffer up front, two at each end of a
//! daemon's session to each peer, where a session end cost about 64 KiB in all: memory touched
//! as every pair formed (first-touch page faults) and kept for the session's life. The
//! messages on a session are small (a heartbeat is a dozen bytes, a hello under 3 KiB at 144
//! nodes), and the buffers grow when a larger one comes (a status row of thousands of nodes,
//! the domain matrix). With this and the boxed frames of `session_tx`'s queue, a session end
//! measured about 11 KiB and 4 page faults less.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// First size of a stream's encode and decode buffer (tonic's default is 8 KiB).
pub const FIRST_BUFFER: usize = 1024;

/// Once this much is encoded, the encoder yields (tonic's default, 32 KiB).
const YIELD_THRESHOLD: usize = 32 * 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(FIRST_BUFFER, YIELD_THRESHOLD)
}

/// [`tonic_prost::ProstCodec`] with [`FIRST_BUFFER`]-byte first buffers.
#[derive(Debug, Clone, Copy)]
pub struct SmallBufferCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SmallBufferCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for SmallBufferCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(settings())
    }
}
