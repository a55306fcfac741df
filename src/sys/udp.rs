//! Batched datagram IO on a connected UDP socket: several datagrams per
//! system call (`sendmmsg`, `recvmmsg`), for the RADIUS accounting
//! sender, which has many requests outstanding at once.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Most datagrams one call sends or receives.
pub const BATCH: usize = 32;

/// An iovec a batched call fills in.
const NO_IOV: libc::iovec = libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
};

/// The message headers of one batched call: the i-th of the first `n`
/// (at most [`BATCH`]) points at `iov[i]`, one iovec a datagram; the
/// rest are empty. The headers hold pointers into `iov`, so they are
/// good while `iov` stays where it is, unmoved and not written.
fn headers(iov: &mut [libc::iovec; BATCH], n: usize) -> [libc::mmsghdr; BATCH] {
    // SAFETY: an all-zero mmsghdr is a valid value of this plain C
    // struct (null pointers, zero lengths).
    let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    for (m, v) in msgs.iter_mut().zip(iov.iter_mut()).take(n) {
        m.msg_hdr.msg_iov = v;
        m.msg_hdr.msg_iovlen = 1;
    }
    msgs
}

/// Make a batched system call (`call`, which returns what the C call
/// does) until it is not interrupted: Ok(its count), or the error.
fn retry(mut call: impl FnMut() -> libc::c_int) -> io::Result<usize> {
    loop {
        let r = call();
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Send each of `pkts` (at most [`BATCH`] are taken) as one datagram on
/// the connected socket `fd`, without waiting. Ok(how many went out, from
/// the first): fewer than given when the socket's buffer filled up.
pub fn send_batch(fd: BorrowedFd<'_>, pkts: &[&[u8]]) -> io::Result<usize> {
    let n = pkts.len().min(BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut iov = [NO_IOV; BATCH];
    for (v, p) in iov.iter_mut().zip(pkts) {
        v.iov_base = p.as_ptr() as *mut libc::c_void;
        v.iov_len = p.len();
    }
    let mut msgs = headers(&mut iov, n);
    retry(|| {
        // SAFETY: `msgs[..n]` each point at one iovec in `iov`, which
        // points at a live slice of `pkts` of its length; the kernel only
        // reads them (sendmmsg) during the call, and both arrays outlive
        // it. No address is given: the socket is connected.
        unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        }
    })
}

/// Receive waiting datagrams on `fd` into `bufs` (one each, at most
/// [`BATCH`]), without waiting; their lengths go into `lens`. Ok(how
/// many), 0 when none was waiting.
pub fn recv_batch(
    fd: BorrowedFd<'_>,
    bufs: &mut [Vec<u8>],
    lens: &mut [usize],
) -> io::Result<usize> {
    let n = bufs.len().min(lens.len()).min(BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut iov = [NO_IOV; BATCH];
    for (v, b) in iov.iter_mut().zip(bufs.iter_mut()) {
        v.iov_base = b.as_mut_ptr() as *mut libc::c_void;
        v.iov_len = b.len();
    }
    let mut msgs = headers(&mut iov, n);
    let got = retry(|| {
        // SAFETY: each of `msgs[..n]` points at one iovec describing the
        // initialized bytes of a distinct `bufs[i]`, which we borrow
        // mutably for the call, so the kernel's writes (at most iov_len
        // bytes each) land in memory we own; the arrays outlive the call.
        // A null timeout with MSG_DONTWAIT never blocks.
        unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        }
    });
    match got {
        Ok(r) => {
            for (len, m) in lens.iter_mut().zip(&msgs[..r]) {
                *len = m.msg_len as usize;
            }
            Ok(r)
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    #[test]
    fn a_batch_goes_and_comes_back_whole() {
        let a = UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = UdpSocket::bind("127.0.0.1:0").unwrap();
        a.connect(b.local_addr().unwrap()).unwrap();
        b.connect(a.local_addr().unwrap()).unwrap();
        let pkts: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 1 + usize::from(i)]).collect();
        let refs: Vec<&[u8]> = pkts.iter().map(Vec::as_slice).collect();
        // At most BATCH per call.
        assert_eq!(send_batch(a.as_fd(), &refs).unwrap(), BATCH);
        assert_eq!(send_batch(a.as_fd(), &refs[BATCH..]).unwrap(), 40 - BATCH);
        let mut bufs = vec![vec![0u8; 64]; BATCH];
        let mut lens = [0usize; BATCH];
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while got.len() < 40 && std::time::Instant::now() < deadline {
            let n = recv_batch(b.as_fd(), &mut bufs, &mut lens).unwrap();
            for i in 0..n {
                got.push(bufs[i][..lens[i]].to_vec());
            }
        }
        assert_eq!(got, pkts);
        // Nothing waiting: 0, not an error.
        assert_eq!(recv_batch(b.as_fd(), &mut bufs, &mut lens).unwrap(), 0);
    }
}
