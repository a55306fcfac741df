//! The buffers and pipes that session bytes move through, pooled for every
//! service: the TCP relay (`relay`) and the HTTP proxy's body copy
//! (`services::proxy`) borrow from the same pools.
//!
//! Memory only while data moves: a session borrows a buffer (or, with
//! `-s`, a pipe for splice()) when it has bytes to move, and gives it back
//! when it is idle or done, so an idle session holds none, and a burst of
//! sessions does not allocate and free 64 KiB per direction each. The
//! pools keep up to `POOL_MAX` buffers (4 MiB) and `POOL_MAX` pipes; a
//! buffer given back to a full pool is freed, and the main thread is told
//! (`sys::mem::freed_big`) to give the freed pages back to the system. A
//! pool of buffers nobody took or gave back for a second is freed the
//! same way ([`trim_idle`]): idle sessions hold no buffer, and neither
//! does the pool behind them.
//!
//! Invariants: only buffers of `SIZE` bytes are pooled (a relay with
//! another `-b` has buffers of its own); a pooled pipe is empty, of the
//! size the system gave it, and has blocking ends (see `new_pipe`); a pipe
//! with bytes still in it is closed, never pooled.
//!
//! This module sits below both users and uses nothing from `services`.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use nix::errno::Errno;
use nix::fcntl::{splice, OFlag, SpliceFFlags};

/// The size of a pooled buffer: the relay's default `-b`, and every HTTP
/// body buffer.
pub const SIZE: usize = 64 * 1024;
/// Most buffers (4 MiB), and most pipes, the pools keep.
pub const POOL_MAX: usize = 64;

/// Buffers of `SIZE` waiting for the next borrower.
static BUFS: Mutex<Vec<Box<[u8]>>> = Mutex::new(Vec::new());
/// A buffer was taken or given back since the last [`trim_idle`].
static USED: AtomicBool = AtomicBool::new(false);
/// Empty pipes waiting for the next borrower, (read end, write end).
static PIPES: Mutex<Vec<(OwnedFd, OwnedFd)>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A buffer of `size` bytes: a pooled one if `size` is `SIZE`.
pub fn take(size: usize) -> Box<[u8]> {
    let pooled = if size == SIZE {
        USED.store(true, Ordering::Relaxed);
        lock(&BUFS).pop()
    } else {
        None
    };
    pooled.unwrap_or_else(|| vec![0u8; size].into_boxed_slice())
}

/// Give back a buffer from [`take`]: kept for the next borrower if it is
/// of `SIZE` and the pool has room, else freed.
pub fn give(b: Box<[u8]>) {
    if b.len() != SIZE {
        return;
    }
    USED.store(true, Ordering::Relaxed);
    let mut pool = lock(&BUFS);
    if pool.len() < POOL_MAX {
        pool.push(b);
    } else {
        drop(pool);
        crate::sys::mem::freed_big();
    }
}

/// Free the pooled buffers if none was taken or given back since the
/// last call (the main thread calls this once a second, before
/// `sys::mem::trim`): the pool serves bursts of busy sessions, and once
/// every session is idle or gone its 4 MiB would stay resident for
/// nothing (2 KB per client of 2000 idle ones). A busy pool is touched
/// many times a second and is never emptied here.
pub fn trim_idle() {
    if USED.swap(false, Ordering::Relaxed) {
        return;
    }
    let freed = std::mem::take(&mut *lock(&BUFS));
    if !freed.is_empty() {
        drop(freed);
        crate::sys::mem::freed_big();
    }
}

/// A buffer of `SIZE` bytes borrowed from the pool for as long as it
/// lives (an HTTP body's copy); given back on drop.
pub struct Buf(Option<Box<[u8]>>);

impl Buf {
    pub fn get() -> Buf {
        Buf(Some(take(SIZE)))
    }

    pub fn bytes(&mut self) -> &mut [u8] {
        self.0.as_deref_mut().unwrap_or(&mut [])
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Some(b) = self.0.take() {
            give(b);
        }
    }
}

/// A pipe for splice(): bytes go socket -> pipe -> socket inside the
/// kernel, never copied to user space. Borrowed from the pool (or made);
/// on drop it goes back to the pool if it is empty, else it is closed.
pub struct Pipe {
    /// (read end, write end).
    fds: Option<(OwnedFd, OwnedFd)>,
    /// Bytes spliced in and not yet out.
    inflight: usize,
    /// A pipe resized for a bigger `-b` is the session's own: not pooled.
    pooled: bool,
}

impl Pipe {
    /// A pipe of the system's default size, from the pool if one waits.
    pub fn get() -> Result<Pipe, Errno> {
        let pooled = lock(&PIPES).pop();
        let fds = match pooled {
            Some(p) => p,
            None => new_pipe()?,
        };
        Ok(Pipe {
            fds: Some(fds),
            inflight: 0,
            pooled: true,
        })
    }

    /// A new pipe that is closed after use, never pooled: for one the
    /// caller resizes (F_SETPIPE_SZ).
    pub fn own() -> Result<Pipe, Errno> {
        Ok(Pipe {
            fds: Some(new_pipe()?),
            inflight: 0,
            pooled: false,
        })
    }

    /// The write end, for fcntl() on the pipe (its size).
    pub fn write_end(&self) -> BorrowedFd<'_> {
        let (_, w) = self
            .fds
            .as_ref()
            .expect("a pipe has its ends until dropped");
        w.as_fd()
    }

    fn read_end(&self) -> BorrowedFd<'_> {
        let (r, _) = self
            .fds
            .as_ref()
            .expect("a pipe has its ends until dropped");
        r.as_fd()
    }

    /// Bytes in the pipe.
    pub fn inflight(&self) -> usize {
        self.inflight
    }

    /// One splice() of up to `len` bytes from `src` into the pipe.
    pub fn fill(
        &mut self,
        src: BorrowedFd<'_>,
        len: usize,
        flags: SpliceFFlags,
    ) -> Result<usize, Errno> {
        let n = splice(src, None, self.write_end(), None, len, flags)?;
        self.inflight += n;
        Ok(n)
    }

    /// One splice() of what is in the pipe (as much as `dst` takes) to
    /// `dst`.
    pub fn drain(&mut self, dst: BorrowedFd<'_>, flags: SpliceFFlags) -> Result<usize, Errno> {
        let n = splice(self.read_end(), None, dst, None, self.inflight, flags)?;
        self.inflight -= n;
        Ok(n)
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        if let Some(p) = self
            .fds
            .take()
            .filter(|_| self.pooled && self.inflight == 0)
        {
            let mut pool = lock(&PIPES);
            if pool.len() < POOL_MAX {
                pool.push(p);
            }
        }
    }
}

/// A new pipe. Blocking ends: for the HTTP body copy (blocking sockets),
/// the sockets' own timeouts then govern each splice(), as they govern
/// read() and write(); a blocking pipe never makes one wait, as it is
/// empty before every fill and drained of what is in it only. The relay's
/// splices do not wait either: they pass SPLICE_F_NONBLOCK, which is all
/// a pipe's own O_NONBLOCK would do to a splice() (the kernel turns the
/// one into the other), and its sockets are non-blocking. So one kind of
/// pipe serves both.
fn new_pipe() -> Result<(OwnedFd, OwnedFd), Errno> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn only_buffers_of_the_pool_size_are_kept_and_at_most_pool_max() {
        let odd = take(1000);
        assert_eq!(odd.len(), 1000);
        give(odd);
        let many: Vec<Box<[u8]>> = (0..POOL_MAX + 5).map(|_| take(SIZE)).collect();
        assert!(many.iter().all(|b| b.len() == SIZE));
        for b in many {
            give(b);
        }
        // Other tests borrow and give back meanwhile; these hold anyway.
        let pool = lock(&BUFS);
        assert!(pool.len() <= POOL_MAX, "{}", pool.len());
        assert!(pool.iter().all(|b| b.len() == SIZE));
        drop(pool);
        let mut g = Buf::get();
        assert_eq!(g.bytes().len(), SIZE);
    }

    #[test]
    fn a_pool_unused_between_two_ticks_is_freed() {
        give(take(SIZE));
        assert!(USED.load(Ordering::Relaxed));
        // The first tick sees the use and keeps the pool; a tick with no
        // use since the one before frees it. Other tests borrow and give
        // back meanwhile, and each of their uses only puts the freeing
        // off by a tick: so try for a while.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            trim_idle();
            if lock(&BUFS).is_empty() && !USED.load(Ordering::Relaxed) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the idle pool was never freed"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn a_pipe_moves_bytes_between_sockets_and_only_an_empty_one_is_kept() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (c, mut d) = UnixStream::pair().unwrap();
        a.write_all(b"through the pipe").unwrap();
        let mut p = Pipe::get().unwrap();
        let n = p
            .fill(b.as_fd(), 1024, SpliceFFlags::SPLICE_F_MOVE)
            .unwrap();
        assert_eq!(n, 16);
        assert_eq!(p.inflight(), 16);
        while p.inflight() > 0 {
            p.drain(c.as_fd(), SpliceFFlags::SPLICE_F_MOVE).unwrap();
        }
        drop(c);
        let mut got = Vec::new();
        d.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"through the pipe");
        // A pipe with bytes in it is closed, not pooled: every pipe in
        // the pool is empty (nothing to read at once).
        a.write_all(b"left behind").unwrap();
        let mut full = Pipe::get().unwrap();
        full.fill(b.as_fd(), 1024, SpliceFFlags::SPLICE_F_MOVE)
            .unwrap();
        drop(full);
        drop(p);
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let pool = lock(&PIPES);
        for (r, _) in pool.iter() {
            let mut fds = [PollFd::new(r.as_fd(), PollFlags::POLLIN)];
            assert_eq!(
                poll(&mut fds, PollTimeout::ZERO),
                Ok(0),
                "a pooled pipe holds bytes"
            );
        }
    }
}
