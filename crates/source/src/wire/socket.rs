//! The session's byte stream: plain TCP, or TLS over it.
//!
//! # Invariants
//! - Reads and writes go straight to the underlying stream; nothing is buffered here.
//! - The only `unsafe` is one `setsockopt` call on the stream's own open descriptor.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// A connection to the server, encrypted or not.
pub(crate) enum Socket {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Socket {
    /// Sets the socket's receive low-water mark (`SO_RCVLOWAT`): the kernel reports it readable
    /// only once `bytes` are buffered (or the connection ends). Reads still return what is there.
    pub(crate) fn set_receive_low_water(&self, bytes: usize) -> io::Result<()> {
        let tcp = match self {
            Socket::Plain(tcp) => tcp,
            Socket::Tls(tls) => tls.get_ref().0,
        };
        let value = libc::c_int::try_from(bytes)
            .unwrap_or(libc::c_int::MAX)
            .max(1);
        // SAFETY: the descriptor belongs to `tcp`, which is borrowed (so open) for the call;
        // the option value is a live `c_int` and the length passed is its size.
        let result = unsafe {
            libc::setsockopt(
                tcp.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                std::ptr::from_ref(&value).cast::<libc::c_void>(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if result == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Socket::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Socket::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Socket::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Socket::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}
