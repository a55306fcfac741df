//! Batched datagram IO on a connected UDP socket: several datagrams per
//! system call (`sendmmsg`, `recvmmsg`), for the RADIUS accounting
//! sender, which has many requests outstanding at once.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Most datagrams one call sends or receives.
pub const BATCH: usize = 32;

/// Send each of `pkts` (at most [`BATCH`] are taken) as one datagram on
/// the connected socket `fd`, without waiting. Ok(how many went out, from
/// the first): fewer than given when the socket's buffer filled up.
pub fn send_batch(fd: BorrowedFd<'_>, pkts: &[&[u8]]) -> io::Result<usize> {
    let n = pkts.len().min(BATCH);
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: all-zero iovec and mmsghdr are valid values of these plain
    // C structs (null pointers, zero lengths).
    let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    for i in 0..n {
        iov[i].iov_base = pkts[i].as_ptr() as *mut libc::c_void;
        iov[i].iov_len = pkts[i].len();
        msgs[i].msg_hdr.msg_iov = &mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    loop {
        // SAFETY: `msgs[..n]` each point at one iovec in `iov`, which
        // points at a live slice of `pkts` of its length; the kernel only
        // reads them (sendmmsg) during the call, and both arrays outlive
        // it. No address is given: the socket is connected.
        let r = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
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
    // SAFETY: all-zero iovec and mmsghdr are valid values (see above).
    let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
    for i in 0..n {
        iov[i].iov_base = bufs[i].as_mut_ptr() as *mut libc::c_void;
        iov[i].iov_len = bufs[i].len();
        msgs[i].msg_hdr.msg_iov = &mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    loop {
        // SAFETY: each of `msgs[..n]` points at one iovec describing the
        // initialized bytes of a distinct `bufs[i]`, which we borrow
        // mutably for the call, so the kernel's writes (at most iov_len
        // bytes each) land in memory we own; the arrays outlive the call.
        // A null timeout with MSG_DONTWAIT never blocks.
        let r = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r >= 0 {
            let r = r as usize;
            for i in 0..r {
                lens[i] = msgs[i].msg_len as usize;
            }
            return Ok(r);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(e),
        }
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
