//! One read buffer per thread, lent to whatever reads a socket there without awaiting before
//! it has passed the bytes on: so 10,000 idle relays hold no buffer, and the runtime's few
//! threads one each.

use std::cell::RefCell;

/// The size lent: the largest read a relay makes.
pub const SIZE: usize = crate::config::budget::CHUNK;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's buffer of [`SIZE`] bytes (allocated on first use). `f` must not
/// await (it cannot: it is not async) and does not see what an earlier user left, beyond
/// that it is initialised.
pub fn with<R>(f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            if buf.len() < SIZE {
                buf.resize(SIZE, 0);
            }
            f(&mut buf[..SIZE])
        }
        // Only if `f` itself asked for the buffer again; a one-off allocation keeps it safe.
        Err(_) => f(&mut vec![0u8; SIZE]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lends_the_same_buffer_on_a_thread_and_a_fresh_one_when_nested() {
        let first = with(|b| {
            b[0] = 7;
            b.as_ptr() as usize
        });
        let (again, kept) = with(|b| (b.as_ptr() as usize, b[0]));
        assert_eq!((again, kept), (first, 7));
        let (outer, inner, len) = with(|outer| {
            let (inner, len) = with(|inner| (inner.as_ptr() as usize, inner.len()));
            (outer.as_ptr() as usize, inner, len)
        });
        assert_eq!(outer, first);
        assert_ne!(inner, first);
        assert_eq!(len, SIZE);
    }
}
