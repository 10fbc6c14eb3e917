//! Batch buffers reused across a stream's batches.
//!
//! A batch is tens of MB: a fresh allocation for each one comes from the
//! kernel as new pages, and the page faults that fill them cost a few
//! percent of the server's CPU. Buffers come back here when the last
//! `Bytes` view of a batch is dropped (after gRPC has encoded it).

use std::sync::{Arc, Mutex};

use bytes::Bytes;

#[derive(Debug, Clone)]
pub struct BufferPool {
    free: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Buffers kept for reuse; more are freed.
    capacity: usize,
}

impl BufferPool {
    pub fn new(capacity: usize) -> Self {
        Self {
            free: Arc::default(),
            capacity,
        }
    }

    /// A buffer of `len` bytes. A reused one holds an earlier batch's bytes:
    /// callers overwrite every byte.
    pub fn take(&self, len: usize) -> Vec<u8> {
        let reused = self.lock().pop();
        match reused {
            Some(buffer) if buffer.len() == len => buffer,
            _ => vec![0; len],
        }
    }

    /// Shares `buffer` as `Bytes` without a copy; it returns to the pool
    /// when the last view is dropped.
    pub fn share(&self, buffer: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled {
            buffer,
            pool: self.clone(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        // A panic elsewhere cannot leave the list of free buffers inconsistent.
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn free_buffers(&self) -> usize {
        self.lock().len()
    }
}

struct Pooled {
    buffer: Vec<u8>,
    pool: BufferPool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let mut free = self.pool.lock();
        if free.len() < self.pool.capacity {
            free.push(std::mem::take(&mut self.buffer));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_return_when_the_last_view_drops_and_stay_bounded() {
        let pool = BufferPool::new(2);
        let first = pool.take(16);
        let address = first.as_ptr();
        let bytes = pool.share(first);
        let view = bytes.slice(4..8);
        drop(bytes);
        assert_eq!(pool.free_buffers(), 0, "a view still holds the buffer");
        drop(view);
        assert_eq!(pool.free_buffers(), 1);
        let again = pool.take(16);
        assert_eq!(again.as_ptr(), address, "reused, not reallocated");
        drop(again);
        // A different size is not reused.
        let _ = pool.share(vec![1; 8]);
        assert_eq!(pool.take(16).len(), 16);
        let shared: Vec<Bytes> = (0..4).map(|_| pool.share(pool.take(16))).collect();
        drop(shared);
        assert_eq!(pool.free_buffers(), 2, "capacity bounds what is kept");
    }
}
