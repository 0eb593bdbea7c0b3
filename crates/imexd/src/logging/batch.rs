//! Log lines written together: the writer every line of the log goes through
//! ([`SharedWriter`]), and [`batch`], which holds the lines one thread formats while it runs a
//! piece of work and writes them in one call at its end.
//!
//! Why: a line is one `write(2)` to the log file, and a daemon's start writes about 60 of them
//! before it is READY (the configuration dump alone is over 30, NVIDIA's daemon prints the
//! same); one engine turn may write several (a peer leaving writes three). Held for the length
//! of a synchronous piece of work, never across an `.await`, a line reaches the file
//! microseconds later than it would have, in the same order, and nothing is held while the
//! thread waits. Lines of other threads are written at once, as before.

use std::cell::RefCell;
use std::io::Write;

use super::{Out, lock};

thread_local! {
    /// The lines held by this thread's [`batch`] and where they go (the writer of the first
    /// one); `None` outside a batch.
    static HELD: RefCell<Option<(Option<Out>, Vec<u8>)>> = const { RefCell::new(None) };
}

/// Runs `f`, holding the log lines this thread writes meanwhile and writing them in one call
/// when `f` returns or unwinds. A batch inside a batch is part of the outer one. `f` must not
/// wait (it runs on a thread other work shares, and its lines wait with it).
pub fn batch<R>(f: impl FnOnce() -> R) -> R {
    let opened = HELD
        .try_with(|held| {
            let mut held = held.borrow_mut();
            if held.is_some() {
                return false;
            }
            *held = Some((None, Vec::new()));
            true
        })
        .unwrap_or(false);
    if !opened {
        return f();
    }
    let _write_at_end = WriteHeld;
    f()
}

/// Writes what the batch held when the batch ends (also when its work panics).
struct WriteHeld;

impl Drop for WriteHeld {
    fn drop(&mut self) {
        let held = HELD.try_with(|h| h.borrow_mut().take()).ok().flatten();
        if let Some((Some(out), lines)) = held
            && !lines.is_empty()
        {
            let _ = lock(&out).write(&lines);
        }
    }
}

/// The log's writer: a formatted line goes to the log's destination, or into this thread's
/// batch while one is open.
pub(super) struct SharedWriter(pub(super) Out);

impl Write for SharedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let kept = HELD
            .try_with(|held| match held.borrow_mut().as_mut() {
                Some((out, lines)) => {
                    out.get_or_insert_with(|| self.0.clone());
                    lines.extend_from_slice(buf);
                    true
                }
                None => false,
            })
            .unwrap_or(false);
        if kept {
            return Ok(buf.len());
        }
        lock(&self.0).write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        lock(&self.0).flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::scratch::Dir;
    use crate::logging::sink::Sink;
    use std::sync::{Arc, Mutex};

    fn file_sink(path: &std::path::Path) -> Out {
        let spec = crate::logging::sink::FileSpec {
            path: Some(path.to_path_buf()),
            append: true,
            cap: 0,
            keep: 0,
        };
        let (sink, _) = spec.open();
        assert!(matches!(sink, Sink::File(_)), "the file opens");
        Arc::new(Mutex::new(sink))
    }

    #[test]
    fn a_batch_writes_its_lines_at_its_end_in_order_and_unbatched_lines_at_once() {
        let dir = Dir::new("batch-order");
        let path = dir.join("imex.log");
        let out = file_sink(&path);
        let read = || std::fs::read_to_string(&path).expect("read");
        let mut w = SharedWriter(out.clone());
        w.write_all(b"before\n").expect("write");
        assert_eq!(
            read(),
            "before\n",
            "outside a batch a line is written at once"
        );
        let seen_inside = batch(|| {
            w.write_all(b"one\n").expect("write");
            // A nested batch is part of the outer one.
            batch(|| w.write_all(b"two\n").expect("write"));
            read()
        });
        assert_eq!(seen_inside, "before\n", "held while the batch runs");
        assert_eq!(read(), "before\none\ntwo\n", "written at its end, in order");
        w.write_all(b"after\n").expect("write");
        assert_eq!(read(), "before\none\ntwo\nafter\n");
    }

    #[test]
    fn a_batch_whose_work_panics_still_writes_what_it_held() {
        let dir = Dir::new("batch-panic");
        let path = dir.join("imex.log");
        let mut w = SharedWriter(file_sink(&path));
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            batch(|| {
                w.write_all(b"the last words\n").expect("write");
                panic!("the work failed");
            })
        }));
        assert!(unwound.is_err());
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "the last words\n"
        );
        // The thread is out of the batch: the next line goes straight through.
        w.write_all(b"next\n").expect("write");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "the last words\nnext\n"
        );
    }
}
